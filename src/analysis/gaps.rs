//! Pinned gaps and who pins them.
//!
//! A pinned gap is an inactive block in a segment that also holds a live block (allocated or
//! pending free): the allocator can neither return it to CUDA nor merge it with free memory
//! elsewhere, so only requests that fit inside it can use it. Expandable segments do not pin:
//! their free pages can be unmapped and mapped again wherever they are needed.
//!
//! Attribution: a segment's pinned bytes are shared equally among the live blocks in it (the
//! remainder of the division goes to the first). Each live block alone would keep the whole
//! segment reserved, so no block is more to blame than another; shares add up to the pinned
//! total exactly. Blocks are grouped by call site (see `sites`), ranked by pinned bytes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::replay::State;
use crate::snapshot::sites::{CallSite, call_site};
use crate::snapshot::{BlockState, Stacks};
use crate::units::Addr;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinnedSummary {
    pub bytes: u64,
    pub gaps: u64,
    pub segments: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Gap {
    pub segment: Addr,
    pub address: Addr,
    pub size: u64,
}

/// The live blocks of one call site that pin free memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pinner {
    pub call_site: Option<CallSite>,
    pub blocks: u64,
    /// Bytes of the live blocks themselves.
    pub live_bytes: u64,
    pub pinned_free_bytes: u64,
    /// The block of this call site that pins the most, to find it on the map.
    pub largest_share_block: Addr,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pinned {
    pub summary: PinnedSummary,
    /// Largest first.
    pub gaps: Vec<Gap>,
    pub pinners: Vec<Pinner>,
    /// Each pinning block's share, by block address (for the page's highlighting).
    #[serde(skip)]
    pub shares: Vec<(u64, u64)>,
}

/// Pinned gaps and pinners of a state.
pub fn pinned(state: &State, stacks: &Stacks) -> Pinned {
    let mut out = Pinned::default();
    // Each site's pinner, with the largest single share seen so far.
    let mut by_site: HashMap<Option<CallSite>, (Pinner, u64)> = HashMap::new();
    for s in state.segment_ids() {
        let seg = state.segment(s);
        if seg.live == 0 || seg.inactive == 0 || seg.expandable {
            continue;
        }
        out.summary.segments += 1;
        out.summary.bytes += seg.inactive;
        let (share, mut extra) = (seg.inactive / seg.live as u64, seg.inactive % seg.live as u64);
        for b in state.block_ids(s) {
            let blk = state.block(b);
            if blk.state == BlockState::Inactive {
                out.summary.gaps += 1;
                out.gaps.push(Gap { segment: Addr(seg.address), address: Addr(blk.address), size: blk.size });
                continue;
            }
            let mine = share + std::mem::take(&mut extra);
            out.shares.push((blk.address, mine));
            let site = call_site(stacks, blk.stack);
            let (p, best) = by_site.entry(site.clone()).or_insert_with(|| {
                let p = Pinner {
                    call_site: site,
                    blocks: 0,
                    live_bytes: 0,
                    pinned_free_bytes: 0,
                    largest_share_block: Addr(blk.address),
                };
                (p, 0)
            });
            if mine > *best {
                *best = mine;
                p.largest_share_block = Addr(blk.address);
            }
            p.blocks += 1;
            p.live_bytes += blk.size;
            p.pinned_free_bytes += mine;
        }
    }
    out.gaps.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    out.pinners = by_site.into_values().map(|(p, _)| p).collect();
    out.pinners.sort_by(|a, b| b.pinned_free_bytes.cmp(&a.pinned_free_bytes).then(a.call_site.cmp(&b.call_site)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{MIB, SnapshotBuilder};

    #[test]
    fn free_blocks_beside_live_ones_are_pinned_and_shared_equally_among_the_live() {
        let a = ("a.py", 1, "make_a");
        let b = ("b.py", 2, "make_b");
        let s = SnapshotBuilder::new()
            .segment(
                0x7f00_0000_0000,
                20 * MIB,
                &[
                    (2 * MIB, "active_allocated", &[a]),
                    (6 * MIB, "inactive", &[]),
                    (2 * MIB, "active_allocated", &[b]),
                    (10 * MIB, "inactive", &[]),
                ],
            )
            .segment(0x7f00_1000_0000, 20 * MIB, &[(20 * MIB, "inactive", &[])])
            .build();
        let p = pinned(&crate::replay::final_state(&s.devices[0]), &s.stacks);
        // The wholly free segment pins nothing: it can be returned to CUDA.
        assert_eq!((p.summary.bytes, p.summary.segments, p.summary.gaps), (16 * MIB, 1, 2));
        assert_eq!(p.gaps[0].size, 10 * MIB, "largest gap first");
        let shares: Vec<(String, u64)> =
            p.pinners.iter().map(|x| (x.call_site.as_ref().unwrap().name.clone(), x.pinned_free_bytes)).collect();
        assert_eq!(shares.iter().map(|s| s.1).sum::<u64>(), 16 * MIB);
        assert!(shares.iter().all(|s| s.1 == 8 * MIB), "{shares:?}");
    }
}
