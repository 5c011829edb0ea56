//! One trace event applied to a [`State`]: how each action changes segments and blocks.
//!
//! The trace records requested bytes; the block an `alloc` takes is sized by the allocator's
//! rules (round, then split or not). Events that contradict the state (a free of an unknown
//! address, an alloc inside a live block) are skipped and reported as warnings: a trace whose
//! beginning the ring buffer dropped, or a hostile file, must still replay.

use super::rules::Rules;
use super::state::{NIL, SegmentRec, State};
use crate::snapshot::{Action, BlockState, Event, Pool, PoolKind};

/// What the final snapshot says about segments the trace creates: their pool and stack are
/// not in the trace itself.
pub trait SegmentHints {
    fn hint(&self, address: u64, size: u64) -> Option<(Pool, bool)>;
}

/// Applies event `index`; returns a warning if the event did not fit the state.
pub fn apply(state: &mut State, e: &Event, index: u32, rules: &Rules, hints: &dyn SegmentHints) -> Option<String> {
    match e.action {
        Action::ALLOC => alloc(state, e, index, rules),
        Action::FREE_REQUESTED => match state.block_at(e.addr) {
            Some(b) if state.block(b).state == BlockState::ActiveAllocated => {
                state.set_state(b, BlockState::ActivePendingFree);
                None
            }
            Some(b) if state.block(b).state == BlockState::ActivePendingFree => None,
            _ => Some(format!("free_requested of {:#x}, which is not allocated", { e.addr })),
        },
        Action::FREE_COMPLETED => match state.block_at(e.addr) {
            Some(b) if state.block(b).state.is_active() => {
                state.release(b);
                None
            }
            _ => Some(format!("free_completed of {:#x}, which is not live", { e.addr })),
        },
        Action::SEGMENT_ALLOC => {
            if state.segment_containing(e.addr).is_some() {
                return Some(format!("segment_alloc at {:#x}, inside an existing segment", { e.addr }));
            }
            let (pool, expandable) = hints.hint(e.addr, e.size).unwrap_or((guess_pool(e.size), false));
            state.add_segment(segment(e, index, pool, expandable));
            None
        }
        Action::SEGMENT_FREE => match state.segment_containing(e.addr) {
            Some(s) if state.segment(s).address == e.addr => {
                let live = state.segment(s).live;
                state.remove_segment(s);
                (live > 0).then(|| format!("segment_free of {:#x}, which held {live} live blocks", { e.addr }))
            }
            _ => Some(format!("segment_free of {:#x}, which is no segment", { e.addr })),
        },
        Action::SEGMENT_MAP => {
            if state.segment_containing(e.addr).is_some() {
                return Some(format!("segment_map at {:#x}, which is already mapped", { e.addr }));
            }
            let pool = hints.hint(e.addr, e.size).map(|h| h.0).unwrap_or(Pool { kind: PoolKind::Large, id: (0, 0) });
            state.map(e.addr, e.size, segment(e, index, pool, true));
            None
        }
        Action::SEGMENT_UNMAP => (!state.unmap(e.addr, e.size))
            .then(|| format!("segment_unmap of {:#x}: live blocks or nothing mapped there", { e.addr })),
        // oom, snapshot and actions this version does not know change nothing.
        _ => None,
    }
}

fn segment(e: &Event, index: u32, pool: Pool, expandable: bool) -> SegmentRec {
    SegmentRec {
        address: e.addr,
        size: e.size,
        stream: e.stream,
        pool,
        expandable,
        created: index,
        stack: e.stack,
        ..SegmentRec::empty()
    }
}

/// Small-pool segments are exactly 2 MiB; no large-pool segment is (see `Rules::segment_size`).
pub fn guess_pool(size: u64) -> Pool {
    let kind = if size == super::rules::SMALL_BUFFER { PoolKind::Small } else { PoolKind::Large };
    Pool { kind, id: (0, 0) }
}

fn alloc(state: &mut State, e: &Event, index: u32, rules: &Rules) -> Option<String> {
    let Some(b) = state.cut_at(e.addr) else {
        return Some(format!("alloc at {:#x}, outside every segment", { e.addr }));
    };
    let blk = state.block(b);
    if blk.state != BlockState::Inactive {
        return Some(format!("alloc at {:#x}, which is already live", { e.addr }));
    }
    let rounded = rules.round_size(e.size);
    let seg = state.segment(blk.segment);
    let small = seg.pool.kind == PoolKind::Small;
    if blk.size > rounded && rules.should_split(blk.size, rounded, small, seg.expandable) {
        state.split(b, rounded);
    }
    let warning = (state.block(b).size < rounded).then(|| {
        format!("alloc of {} bytes at {:#x}, in a free block of only {}", { e.size }, { e.addr }, state.block(b).size)
    });
    state.make_live(b, e.size, e.stack, index, BlockState::ActiveAllocated);
    warning
}

impl SegmentRec {
    /// A segment record with no blocks, to be filled in.
    pub fn empty() -> SegmentRec {
        SegmentRec {
            address: 0,
            size: 0,
            stream: 0,
            pool: Pool { kind: PoolKind::Large, id: (0, 0) },
            expandable: false,
            created: NIL,
            stack: crate::snapshot::EMPTY_STACK,
            first: NIL,
            last: NIL,
            live: 0,
            inactive: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::Replay;
    use crate::snapshot::BlockState;
    use crate::testkit::{MIB, SnapshotBuilder, USER};

    const A: u64 = 0x7f00_0000_0000;

    fn end_blocks(b: &SnapshotBuilder) -> Vec<(u64, BlockState)> {
        let s = b.build();
        let d = &s.devices[0];
        let replay = Replay::run(&s, d, &mut ());
        assert!(replay.final_mismatches.is_empty(), "{:?}", replay.final_mismatches);
        let st = &replay.end;
        st.segment_ids()
            .flat_map(|g| st.block_ids(g).collect::<Vec<_>>())
            .map(|x| (st.block(x).size, st.block(x).state))
            .collect()
    }

    #[test]
    fn a_large_block_is_split_only_when_more_than_1_mib_would_remain() {
        // 19.5 MiB in a new 20 MiB segment: 0.5 MiB would remain, so the block is not split.
        let b = SnapshotBuilder::new()
            .segment(A, 20 * MIB, &[(20 * MIB, "active_allocated", &[USER])])
            .alloc_in_new_segment(A, 20 * MIB, 39 * MIB / 2, &[USER]);
        assert_eq!(end_blocks(&b), vec![(20 * MIB, BlockState::ActiveAllocated)]);
        // 4 MiB: 16 MiB remain, so it is split.
        let b = SnapshotBuilder::new()
            .segment(A, 20 * MIB, &[(4 * MIB, "active_allocated", &[USER]), (16 * MIB, "inactive", &[])])
            .alloc_in_new_segment(A, 20 * MIB, 4 * MIB, &[USER]);
        assert_eq!(end_blocks(&b), vec![(4 * MIB, BlockState::ActiveAllocated), (16 * MIB, BlockState::Inactive)]);
    }

    #[test]
    fn a_completed_free_merges_with_its_free_neighbours() {
        let b = SnapshotBuilder::new()
            .segment(A, 20 * MIB, &[(20 * MIB, "inactive", &[])])
            .alloc_in_new_segment(A, 20 * MIB, 4 * MIB, &[USER])
            .event("alloc", A + 4 * MIB, 4 * MIB, &[USER])
            .free(A, 4 * MIB, &[USER])
            .free(A + 4 * MIB, 4 * MIB, &[USER]);
        assert_eq!(end_blocks(&b), vec![(20 * MIB, BlockState::Inactive)]);
    }

    #[test]
    fn a_requested_free_waits_as_pending_until_it_completes() {
        let b = SnapshotBuilder::new()
            .segment(A, 20 * MIB, &[(4 * MIB, "active_pending_free", &[USER]), (16 * MIB, "inactive", &[])])
            .alloc_in_new_segment(A, 20 * MIB, 4 * MIB, &[USER])
            .event("free_requested", A, 4 * MIB, &[USER]);
        assert_eq!(end_blocks(&b), vec![(4 * MIB, BlockState::ActivePendingFree), (16 * MIB, BlockState::Inactive)]);
    }
}
