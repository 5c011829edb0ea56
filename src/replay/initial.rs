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
use crate::snapshot::{Action, Block, BlockState, Device, EMPTY_STACK, Event, Pool, PoolKind, StackId};

struct Live {
    size: Option<u64>,
    requested: u64,
    state: BlockState,
    stack: StackId,
}

/// A block the backward pass holds live, packed in one word: the index of the final block
/// ([`FINAL`]) or of the free event it was met at, and whether a `free_requested` was met
/// ([`REQUESTED`]: the block was still allocated). [`GONE`]: its `alloc` was met, so it was
/// not live before. An address stays in the map once seen: taking it out at each `alloc` and
/// putting it back at the next free left a trail of deleted slots that the table kept
/// cleaning up, and the pass took four times as long.
type Found = u64;
const FINAL: Found = 1 << 32;
const REQUESTED: Found = 1 << 33;
const GONE: Found = u64::MAX;

/// The derived initial state, whether it was empty, and what could not be placed.
pub struct Initial {
    pub state: State,
    pub empty: bool,
    pub warnings: Vec<String>,
}

pub fn derive(device: &Device, events: &[Event], rules: &Rules, hints: &dyn SegmentHints) -> Initial {
    let mut segs: BTreeMap<u64, SegmentRec> = BTreeMap::new();
    let mut mapped: Vec<(u64, u64, SegmentRec)> = Vec::new();
    let mut live: HashMap<u64, Found> = HashMap::new();
    let mut finals = Vec::new();
    for s in &device.segments {
        let rec = SegmentRec::from_segment(s);
        if s.is_expandable {
            interval_add(&mut mapped, s.address, s.address + s.total_size, rec);
        } else {
            segs.insert(s.address, rec);
        }
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            live.insert(b.address, FINAL | finals.len() as Found);
            finals.push(b);
        }
    }
    for (i, e) in events.iter().enumerate().rev() {
        match e.action {
            Action::SEGMENT_ALLOC => {
                segs.remove(&{ e.addr });
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
                if let Some(found) = live.get_mut(&{ e.addr }) {
                    *found = GONE;
                }
            }
            Action::FREE_REQUESTED => {
                let found = live.entry(e.addr).or_insert(GONE);
                if *found == GONE {
                    *found = i as Found;
                }
                *found |= REQUESTED;
            }
            Action::FREE_COMPLETED => {
                let found = live.entry(e.addr).or_insert(GONE);
                if *found == GONE {
                    *found = i as Found;
                }
            }
            _ => {}
        }
    }
    assemble(segs, mapped, live, &finals, events, rules)
}

/// The state before the trace from what the backward pass left: the segments there, and the
/// blocks live then placed in them.
fn assemble(
    segs: BTreeMap<u64, SegmentRec>,
    mapped: Vec<(u64, u64, SegmentRec)>,
    mut live: HashMap<u64, Found>,
    finals: &[&Block],
    events: &[Event],
    rules: &Rules,
) -> Initial {
    live.retain(|_, found| *found != GONE);
    let empty = segs.is_empty() && mapped.is_empty() && live.is_empty();
    let mut state = State::new();
    for (_, rec) in segs {
        state.add_segment(rec);
    }
    for (lo, hi, rec) in mapped {
        state.insert_segment(SegmentRec { address: lo, size: hi - lo, ..rec }, vec![BlockRec::free(lo, hi - lo)]);
    }
    let mut warnings = Vec::new();
    let mut blocks: Vec<(u64, Found)> = live.into_iter().collect();
    blocks.sort_by_key(|(a, _)| *a);
    for (address, found) in blocks {
        let b = unpack(found, finals, events);
        let size = b.size.unwrap_or_else(|| rules.round_size(b.requested));
        if !place(&mut state, address, size, &b) {
            warnings.push(format!("block {address:#x} live before the trace does not fit the segments there"));
        }
    }
    Initial { state, empty, warnings }
}

/// A block's facts from where the backward pass found it: a final block's are whole; a free
/// event tells only the request, and that the block was pending until freed.
fn unpack(found: Found, finals: &[&Block], events: &[Event]) -> Live {
    let index = found as u32 as usize;
    let mut live = if found & FINAL != 0 {
        let b = finals[index];
        Live { size: Some(b.size), requested: b.requested_size, state: b.state, stack: b.stack }
    } else {
        Live { size: None, requested: events[index].size, state: BlockState::ActivePendingFree, stack: EMPTY_STACK }
    };
    if found & REQUESTED != 0 {
        live.state = BlockState::ActiveAllocated;
    }
    live
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
