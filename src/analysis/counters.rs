//! Counters of one moment's segments, named and defined as torch's `memory_stats()` names them,
//! so one grep joins a truth file, this code and the API.

use serde::{Deserialize, Serialize};

use crate::snapshot::{BlockState, Segment};

/// The `final` block of the analysis: the state in `segments`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counters {
    /// `reserved_bytes.all.current`: bytes of all segments.
    pub reserved_bytes: u64,
    /// `allocated_bytes.all.current`: bytes of `active_allocated` blocks.
    pub allocated_bytes: u64,
    /// `active_bytes.all.current`: allocated plus `active_pending_free` blocks.
    pub active_bytes: u64,
    /// `requested_bytes.all.current`: requested sizes of active blocks, pending-free included.
    pub requested_bytes: u64,
    /// `segment.all.current`: cudaMalloc'd segments. Like torch, this skips expandable segments,
    /// whose mapped ranges are counted in `expandable_ranges`.
    pub segments: u64,
    /// Mapped ranges of expandable segments (each is one entry of the snapshot's `segments`).
    pub expandable_ranges: u64,
    /// `allocation.all.current`: `active_allocated` blocks.
    pub allocations: u64,
    /// `inactive_split.all.current`: inactive blocks in a non-expandable segment of more than one
    /// block: free memory that cannot be returned to CUDA.
    pub inactive_split_blocks: u64,
    /// `inactive_split_bytes.all.current`.
    pub inactive_split_bytes: u64,
    /// The largest inactive block in any one segment: the biggest request that could be served
    /// without a new cudaMalloc (in the right pool and stream).
    pub largest_free_block_bytes: u64,
}

/// The counters of a list of segments, named as `memory_stats()` names them.
pub fn counters(segments: &[Segment]) -> Counters {
    let mut c = Counters::default();
    for s in segments {
        c.reserved_bytes += s.total_size;
        if s.is_expandable {
            c.expandable_ranges += 1;
        } else {
            c.segments += 1;
        }
        let split = !s.is_expandable && s.blocks.len() > 1;
        for b in &s.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    c.allocated_bytes += b.size;
                    c.allocations += 1;
                }
                BlockState::ActivePendingFree => {}
                BlockState::Inactive => {
                    c.largest_free_block_bytes = c.largest_free_block_bytes.max(b.size);
                    if split {
                        c.inactive_split_blocks += 1;
                        c.inactive_split_bytes += b.size;
                    }
                }
            }
            if b.state.is_active() {
                c.active_bytes += b.size;
                c.requested_bytes += b.requested_size;
            }
        }
    }
    c
}
