//! OOM verdicts: what the allocator faced at each `oom` event.
//!
//! The state at an `oom` event is the one the allocator raised in: it has already released
//! every cached segment that held no live block (those `segment_free` events come just before),
//! so the free memory left is what live blocks pin. The verdict is `fragmentation` when the
//! memory reserved but unallocated could have held the request had it been one block, and
//! `capacity` when even that would not have sufficed.

use serde::{Deserialize, Serialize};

use super::gaps::{Gap, Pinner, pinned};
use crate::replay::{Observer, State, rules::Rules};
use crate::snapshot::sites::{CallSite, call_site};
use crate::snapshot::{Action, Event, PoolKind, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Fragmentation,
    Capacity,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Oom {
    pub event_index: u64,
    pub time_us: Option<i64>,
    /// The request, rounded as the allocator rounds it.
    pub requested_bytes: u64,
    /// The segment cudaMalloc was asked for ("Tried to allocate" in torch's message).
    pub allocation_bytes: u64,
    /// `small` (at most 1 MiB) or `large`.
    pub pool: String,
    pub stream: i64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// The largest free block of the request's stream and pool: the most it could have got.
    pub largest_usable_free_bytes: u64,
    pub pinned_free_bytes: u64,
    /// cudaMemGetInfo's free bytes when it failed (not the budget, under a memory fraction).
    pub device_free_bytes: u64,
    pub verdict: Verdict,
    pub call_site: Option<CallSite>,
    /// Who pinned the free memory, most first.
    pub pinners: Vec<Pinner>,
    /// The largest pinned gaps.
    pub gaps: Vec<Gap>,
}

pub fn verdict(requested: u64, reserved: u64, allocated: u64) -> Verdict {
    if reserved.saturating_sub(allocated) >= requested { Verdict::Fragmentation } else { Verdict::Capacity }
}

/// The OOMs recorded in full; later ones are only counted. Each costs a pass over every block
/// (who pins what), so a trace of 20,000 OOMs over 10,000 blocks must not cost 200 million.
pub const MAX_OOMS: usize = 64;

/// Records an [`Oom`] at every `oom` event of the forward pass (the first [`MAX_OOMS`]).
pub struct OomObserver<'a> {
    pub snapshot: &'a Snapshot,
    /// Index in [`Snapshot::events`] of the device's first event.
    pub first: usize,
    pub ooms: Vec<Oom>,
    /// Every `oom` event, the ones past [`MAX_OOMS`] included.
    pub count: u64,
    /// The state at the first OOM, where the job died.
    pub first_state: Option<State>,
}

impl Observer for OomObserver<'_> {
    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if e.action != Action::OOM {
            return;
        }
        self.count += 1;
        if self.ooms.len() >= MAX_OOMS {
            return;
        }
        let t = state.totals;
        let small = Rules::is_small(e.size);
        let kind = if small { PoolKind::Small } else { PoolKind::Large };
        let p = pinned(state, &self.snapshot.stacks);
        if self.first_state.is_none() {
            self.first_state = Some(state.clone());
        }
        self.ooms.push(Oom {
            event_index: index as u64,
            time_us: self.snapshot.time(self.first + index),
            requested_bytes: e.size,
            allocation_bytes: Rules::segment_size(e.size),
            pool: if small { "small" } else { "large" }.to_string(),
            stream: self.snapshot.stream(e.stream),
            reserved_bytes: t.reserved_bytes,
            allocated_bytes: t.allocated_bytes,
            largest_usable_free_bytes: state.largest_free_in(e.stream, kind, (0, 0)),
            pinned_free_bytes: t.pinned_free_bytes,
            device_free_bytes: e.addr,
            verdict: verdict(e.size, t.reserved_bytes, t.allocated_bytes),
            call_site: call_site(&self.snapshot.stacks, e.stack),
            pinners: p.pinners.into_iter().take(5).collect(),
            gaps: p.gaps.into_iter().take(5).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Depth, analyze};
    use crate::testkit::{MIB, SnapshotBuilder, USER};

    #[test]
    fn fragmentation_when_the_free_memory_could_have_held_the_request_as_one_block() {
        assert_eq!(verdict(10 * MIB, 20 * MIB, 4 * MIB), Verdict::Fragmentation);
        assert_eq!(verdict(16 * MIB, 20 * MIB, 4 * MIB), Verdict::Fragmentation);
    }

    #[test]
    fn capacity_when_even_all_the_free_memory_would_not_have_held_it() {
        assert_eq!(verdict(17 * MIB, 20 * MIB, 4 * MIB), Verdict::Capacity);
    }

    #[test]
    fn an_oom_event_is_judged_on_the_state_it_happened_in() {
        const A: u64 = 0x7f00_0000_0000;
        let b = |request: u64| {
            SnapshotBuilder::new()
                .segment(A, 20 * MIB, &[(4 * MIB, "active_allocated", &[USER]), (16 * MIB, "inactive", &[])])
                .alloc_in_new_segment(A, 20 * MIB, 4 * MIB, &[USER])
                .event("oom", 1 << 30, request, &[USER])
                .build()
        };
        let source = || crate::snapshot::Source {
            bytes: 0,
            sha256: None,
            encoding: "pickle".into(),
            compression: "none".into(),
            pickle_protocol: None,
        };
        let s = b(10 * MIB);
        let a = analyze(&s, source(), Depth::Report).analysis;
        let o = &a.devices[0].ooms[0];
        assert_eq!((o.verdict, o.reserved_bytes, o.allocated_bytes), (Verdict::Fragmentation, 20 * MIB, 4 * MIB));
        assert_eq!(o.largest_usable_free_bytes, 16 * MIB);
        let s = b(30 * MIB);
        assert_eq!(analyze(&s, source(), Depth::Report).analysis.devices[0].ooms[0].verdict, Verdict::Capacity);
    }
}
