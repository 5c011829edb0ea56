//! Expandable segments in the replayed state: a mapped range joins its neighbours of the same
//! stream into one segment (as the snapshot shows them), and an unmapped range cuts a segment
//! in two. Kept apart from the block arena: only `segment_map` and `segment_unmap` come here.

use super::{BlockRec, SegmentRec, State};
use crate::snapshot::BlockState;

impl State {
    /// Grows expandable memory by a newly mapped range, joining the adjacent ranges of the
    /// same stream into one segment, as the snapshot shows them.
    pub(in crate::replay) fn map(&mut self, address: u64, size: u64, template: SegmentRec) {
        let adjacent = |st: &State, s: u32| {
            let x = &st.segments[s as usize];
            x.expandable && x.stream == template.stream
        };
        let before = self.seg_by_addr.range(..address).next_back().map(|(_, &s)| s).filter(|&s| {
            let x = &self.segments[s as usize];
            adjacent(self, s) && x.address + x.size == address
        });
        let after = self.seg_by_addr.get(&(address + size)).copied().filter(|&s| adjacent(self, s));
        let mut seg = SegmentRec { address, size, ..template };
        let mut blocks = Vec::new();
        if let Some(b) = before {
            let (prev, prev_blocks) = self.take_segment(b);
            seg = SegmentRec { size: prev.size + size, ..prev };
            blocks = prev_blocks;
        }
        blocks.push(BlockRec::free(address, size));
        if let Some(a) = after {
            let (next, next_blocks) = self.take_segment(a);
            seg.size += next.size;
            blocks.extend(next_blocks);
        }
        self.insert_segment(seg, coalesce(blocks));
    }

    /// Unmaps `[address, address + size)` of expandable memory, splitting a segment in two
    /// where the hole falls inside it. Returns false if live blocks were in the way.
    pub(in crate::replay) fn unmap(&mut self, address: u64, size: u64) -> bool {
        let end = address + size;
        let hit: Vec<u32> = self
            .seg_by_addr
            .range(..end)
            .map(|(_, &s)| s)
            .filter(|&s| {
                let x = &self.segments[s as usize];
                x.address + x.size > address
            })
            .collect();
        let mut clean = !hit.is_empty();
        for s in hit {
            let (seg, blocks) = self.take_segment(s);
            let seg_end = seg.address + seg.size;
            let (head, hole, tail) = carve(blocks, address, end);
            clean &= hole.iter().all(|b| b.state == BlockState::Inactive);
            if address > seg.address {
                self.insert_segment(SegmentRec { size: address - seg.address, ..seg.clone() }, head);
            }
            if end < seg_end {
                self.insert_segment(SegmentRec { address: end, size: seg_end - end, ..seg }, tail);
            }
        }
        clean
    }
}

/// Merges adjacent inactive blocks of a list, as the allocator keeps them.
fn coalesce(blocks: Vec<BlockRec>) -> Vec<BlockRec> {
    let mut out: Vec<BlockRec> = Vec::with_capacity(blocks.len());
    for b in blocks {
        match out.last_mut() {
            Some(last) if last.state == BlockState::Inactive && b.state == BlockState::Inactive => last.size += b.size,
            _ => out.push(b),
        }
    }
    out
}

/// Cuts a segment's blocks into those before `lo`, those in `[lo, hi)` and those from `hi` on,
/// splitting the blocks that straddle a cut.
fn carve(blocks: Vec<BlockRec>, lo: u64, hi: u64) -> (Vec<BlockRec>, Vec<BlockRec>, Vec<BlockRec>) {
    let (mut head, mut hole, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    for b in blocks {
        let (start, end) = (b.address, b.address + b.size);
        for (part_lo, part_hi, out) in [(0, lo, &mut head), (lo, hi, &mut hole), (hi, u64::MAX, &mut tail)] {
            let (a, z) = (start.max(part_lo), end.min(part_hi));
            if a < z {
                out.push(BlockRec { address: a, size: z - a, ..b.clone() });
            }
        }
    }
    (head, hole, tail)
}
