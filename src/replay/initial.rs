//! The state before the first recorded event, derived backwards from the final `segments`.
//!
//! Undoing the trace from the end: a `segment_alloc` means the segment did not exist before,
//! a `segment_free` that it did; an `alloc` that its block was not live before, a
//! `free_completed` or `free_requested` that it was. What remains at the start is what the
//! process held before the trace began (recording started late, or the ring buffer dropped the
//! oldest events). Blocks freed during the trace whose alloc is missing get their rounded
//! request as size: the exact block size (which may include unsplit slack) is not recorded.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};

use super::apply::{SegmentHints, guess_pool};
use super::rules::Rules;
use super::state::{BlockRec, NIL, SegmentRec, State};
use crate::snapshot::{Action, BlockState, Device, EMPTY_STACK, Event, Pool, PoolKind, StackId};

struct Live {
    size: Option<u64>,
    requested: u64,
    state: BlockState,
    stack: StackId,
}

/// The derived initial state, whether it was empty, and what could not be placed.
pub struct Initial {
    pub state: State,
    pub empty: bool,
    pub warnings: Vec<String>,
}

pub fn derive(device: &Device, events: &[Event], rules: &Rules, hints: &dyn SegmentHints) -> Initial {
    let mut segs: BTreeMap<u64, SegmentRec> = BTreeMap::new();
    let mut mapped: Vec<(u64, u64, SegmentRec)> = Vec::new();
    let mut live: HashMap<u64, Live> = HashMap::new();
    for s in &device.segments {
        let rec = SegmentRec::from_segment(s);
        if s.is_expandable {
            interval_add(&mut mapped, s.address, s.address + s.total_size, rec);
        } else {
            segs.insert(s.address, rec);
        }
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            live.insert(
                b.address,
                Live { size: Some(b.size), requested: b.requested_size, state: b.state, stack: b.stack },
            );
        }
    }
    for e in events.iter().rev() {
        match e.action {
            Action::SEGMENT_ALLOC => {
                segs.remove(&e.addr);
            }
            Action::SEGMENT_FREE => {
                let (pool, _) = hints.hint(e.addr, e.size).unwrap_or((guess_pool(e.size), false));
                let rec = SegmentRec {
                    address: e.addr,
                    size: e.size,
                    stream: e.stream,
                    pool,
                    stack: e.stack,
                    ..SegmentRec::empty()
                };
                segs.insert(e.addr, rec);
            }
            Action::SEGMENT_MAP => interval_remove(&mut mapped, e.addr, e.addr + e.size),
            Action::SEGMENT_UNMAP => {
                let pool =
                    hints.hint(e.addr, e.size).map(|h| h.0).unwrap_or(Pool { kind: PoolKind::Large, id: (0, 0) });
                let rec = SegmentRec { stream: e.stream, pool, expandable: true, ..SegmentRec::empty() };
                interval_add(&mut mapped, e.addr, e.addr + e.size, rec);
            }
            Action::ALLOC => {
                live.remove(&e.addr);
            }
            Action::FREE_REQUESTED => {
                let entry = live.entry(e.addr).or_insert(Live {
                    size: None,
                    requested: e.size,
                    state: BlockState::ActiveAllocated,
                    stack: EMPTY_STACK,
                });
                entry.state = BlockState::ActiveAllocated;
            }
            Action::FREE_COMPLETED => {
                live.entry(e.addr).or_insert(Live {
                    size: None,
                    requested: e.size,
                    state: BlockState::ActivePendingFree,
                    stack: EMPTY_STACK,
                });
            }
            _ => {}
        }
    }
    let empty = segs.is_empty() && mapped.is_empty() && live.is_empty();
    let mut state = State::new();
    for (_, rec) in segs {
        state.add_segment(rec);
    }
    for (lo, hi, rec) in mapped {
        state.insert_segment(SegmentRec { address: lo, size: hi - lo, ..rec }, vec![BlockRec::free(lo, hi - lo)]);
    }
    let mut warnings = Vec::new();
    let mut blocks: Vec<(u64, Live)> = live.into_iter().collect();
    blocks.sort_by_key(|(a, _)| *a);
    for (address, b) in blocks {
        let size = b.size.unwrap_or_else(|| rules.round_size(b.requested));
        if !place(&mut state, address, size, &b) {
            warnings.push(format!("block {address:#x} live before the trace does not fit the segments there"));
        }
    }
    Initial { state, empty, warnings }
}

fn place(state: &mut State, address: u64, size: u64, b: &Live) -> bool {
    let Some(at) = state.cut_at(address) else { return false };
    let blk = state.block(at);
    if blk.state != BlockState::Inactive || blk.size < size {
        return false;
    }
    if blk.size > size {
        state.split(at, size);
    }
    state.make_live(at, b.requested, b.stack, NIL, b.state);
    true
}

/// Adds `[lo, hi)` to a set of disjoint mapped ranges, joining neighbours of the same stream.
fn interval_add(set: &mut Vec<(u64, u64, SegmentRec)>, lo: u64, hi: u64, rec: SegmentRec) {
    interval_remove(set, lo, hi);
    set.push((lo, hi, rec));
    set.sort_by_key(|r| r.0);
    let mut out: Vec<(u64, u64, SegmentRec)> = Vec::with_capacity(set.len());
    for r in set.drain(..) {
        match out.last_mut() {
            Some(last) if last.1 == r.0 && last.2.stream == r.2.stream => last.1 = r.1,
            _ => out.push(r),
        }
    }
    *set = out;
}

/// Removes `[lo, hi)` from a set of disjoint ranges.
fn interval_remove(set: &mut Vec<(u64, u64, SegmentRec)>, lo: u64, hi: u64) {
    let mut out = Vec::with_capacity(set.len() + 1);
    for (a, z, rec) in set.drain(..) {
        if z <= lo || a >= hi {
            out.push((a, z, rec));
            continue;
        }
        if a < lo {
            out.push((a, lo, rec.clone()));
        }
        if z > hi {
            out.push((hi, z, rec));
        }
    }
    *set = out;
}
