//! What the state is made of: a block and a segment as the replay tracks them, and the running
//! totals.

use super::NIL;
use crate::snapshot::{BlockState, EMPTY_STACK, Pool, StackId};

/// One block as the replay tracks it.
#[derive(Debug, Clone)]
pub struct BlockRec {
    /// Its device address.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The request it serves (0 when inactive).
    pub requested: u64,
    /// Live, pending free or cached free.
    pub state: BlockState,
    /// Stack of the request.
    pub stack: StackId,
    /// Index of the `alloc` event that made it live (NIL: before the trace, or inactive).
    pub event: u32,
    /// The segment it belongs to.
    pub segment: u32,
    pub(in crate::replay) prev: u32,
    pub(in crate::replay) next: u32,
}

impl SegmentRec {
    /// A segment of the final `segments`, as replay keeps it (no blocks yet).
    pub fn from_segment(s: &crate::snapshot::Segment) -> SegmentRec {
        SegmentRec {
            address: s.address,
            size: s.total_size,
            stream: s.stream,
            pool: s.pool,
            expandable: s.is_expandable,
            stack: s.stack,
            ..SegmentRec::empty()
        }
    }
}

impl BlockRec {
    /// An inactive block (its segment and links are set when it is inserted).
    pub fn free(address: u64, size: u64) -> BlockRec {
        BlockRec {
            address,
            size,
            requested: 0,
            state: BlockState::Inactive,
            stack: EMPTY_STACK,
            event: NIL,
            segment: NIL,
            prev: NIL,
            next: NIL,
        }
    }
}

/// One segment as the replay tracks it.
#[derive(Debug, Clone)]
pub struct SegmentRec {
    /// Its device address.
    pub address: u64,
    /// Its size in bytes (mapped bytes, for expandable segments).
    pub size: u64,
    /// Index into the snapshot's streams.
    pub stream: u16,
    /// The free list it serves.
    pub pool: Pool,
    /// Made with `expandable_segments`.
    pub expandable: bool,
    /// Index of the event that created (or first mapped) it; NIL if before the trace.
    pub created: u32,
    /// Stack of the cudaMalloc that made it.
    pub stack: StackId,
    pub(in crate::replay) first: u32,
    pub(in crate::replay) last: u32,
    /// Active blocks (allocated or pending free) in it.
    pub live: u32,
    /// Bytes of inactive blocks in it.
    pub inactive: u64,
}

/// Running totals, named as torch's `memory_stats()` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Bytes in segments.
    pub reserved_bytes: u64,
    /// Bytes in allocated blocks.
    pub allocated_bytes: u64,
    /// Bytes in allocated or pending-free blocks.
    pub active_bytes: u64,
    /// Bytes the requests asked for (before rounding).
    pub requested_bytes: u64,
    /// Allocated blocks.
    pub allocations: u64,
    /// Inactive bytes in fixed (not expandable) segments that hold a live block: they can be
    /// neither released nor merged with free memory elsewhere.
    pub pinned_free_bytes: u64,
}
