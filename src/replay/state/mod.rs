//! The allocator's state at one moment: segments, their blocks in address order, and running
//! totals, changed one trace event at a time.
//!
//! Blocks live in an arena with prev/next links inside their segment, as in torch's allocator,
//! so a free merges with its neighbours in O(1). Every total is kept exact by `account`, which
//! removes a block's contribution before it changes and adds it back after.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};

use super::slots;
use crate::snapshot::{BlockState, EMPTY_STACK, PoolKind, StackId};

/// No block, segment or event.
pub const NIL: u32 = u32::MAX;

mod free_sizes;
mod mapping;
mod records;

pub use records::{BlockRec, SegmentRec, Totals};

use free_sizes::FreeSizes;

/// The allocator's memory right after one event: segments, blocks and totals.
#[derive(Debug, Clone, Default)]
pub struct State {
    blocks: Vec<BlockRec>,
    free_blocks: Vec<u32>,
    by_addr: HashMap<u64, u32>,
    segments: Vec<SegmentRec>,
    free_segments: Vec<u32>,
    seg_by_addr: BTreeMap<u64, u32>,
    /// Multiset of inactive block sizes, for the largest free block at every event.
    free_sizes: FreeSizes,
    /// Whether `free_sizes` is kept (a replay for a one-shot report does without).
    pub track_largest_free: bool,
    /// The running totals.
    pub totals: Totals,
}

impl State {
    /// An empty allocator.
    pub fn new() -> State {
        State { by_addr: HashMap::new(), track_largest_free: true, ..State::default() }
    }

    /// The largest inactive block anywhere.
    pub fn largest_free(&self) -> u64 {
        if self.track_largest_free {
            return self.free_sizes.largest();
        }
        // Spare arena slots marked first: a `contains` per block would be quadratic.
        let mut spare = vec![false; self.blocks.len()];
        for &i in &self.free_blocks {
            if let Some(s) = spare.get_mut(i as usize) {
                *s = true;
            }
        }
        let free = self.blocks.iter().zip(&spare).filter(|(b, spare)| b.state == BlockState::Inactive && !**spare);
        free.map(|(b, _)| b.size).max().unwrap_or(0)
    }

    /// A segment by index.
    pub fn segment(&self, seg: u32) -> &SegmentRec {
        &self.segments[seg as usize]
    }

    /// A block by index.
    pub fn block(&self, b: u32) -> &BlockRec {
        &self.blocks[b as usize]
    }

    /// The block starting at `address`, if any.
    pub fn block_at(&self, address: u64) -> Option<u32> {
        self.by_addr.get(&address).copied()
    }

    /// Segment indexes in address order.
    pub fn segment_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.seg_by_addr.values().copied()
    }

    /// Block indexes of a segment in address order.
    pub fn block_ids(&self, seg: u32) -> impl Iterator<Item = u32> + '_ {
        let mut b = self.segments[seg as usize].first;
        std::iter::from_fn(move || {
            (b != NIL).then(|| {
                let cur = b;
                b = self.blocks[b as usize].next;
                cur
            })
        })
    }

    /// The segment whose range holds `address`, if any.
    pub fn segment_containing(&self, address: u64) -> Option<u32> {
        let (_, &seg) = self.seg_by_addr.range(..=address).next_back()?;
        let s = &self.segments[seg as usize];
        (address < s.address + s.size).then_some(seg)
    }

    /// Adds or removes one block's share of every total. Inlined, so that each call site's
    /// constant `add` removes the branches on it (it runs twice for every change of a block).
    #[inline(always)]
    fn account(&mut self, b: u32, add: bool) {
        let blk = &self.blocks[b as usize];
        let (size, requested, state) = (blk.size, blk.requested, blk.state);
        let s = &mut self.segments[blk.segment as usize];
        let t = &mut self.totals;
        // Free pages of an expandable segment can be unmapped and mapped again wherever they
        // are needed: only fixed segments pin.
        let pins = !s.expandable;
        let pinned_before = if s.live > 0 && pins { s.inactive } else { 0 };
        let sign = |v: &mut u64, by: u64| if add { *v += by } else { *v -= by };
        match state {
            BlockState::Inactive if !self.track_largest_free => sign(&mut s.inactive, size),
            BlockState::Inactive => {
                sign(&mut s.inactive, size);
                if add {
                    self.free_sizes.add(size);
                } else {
                    self.free_sizes.remove(size);
                }
            }
            BlockState::ActiveAllocated | BlockState::ActivePendingFree => {
                if add {
                    s.live += 1
                } else {
                    s.live -= 1
                }
                sign(&mut t.active_bytes, size);
                sign(&mut t.requested_bytes, requested);
                if state == BlockState::ActiveAllocated {
                    sign(&mut t.allocated_bytes, size);
                    sign(&mut t.allocations, 1);
                }
            }
        }
        let pinned_after = if s.live > 0 && pins { s.inactive } else { 0 };
        t.pinned_free_bytes = t.pinned_free_bytes + pinned_after - pinned_before;
    }

    fn new_block(&mut self, rec: BlockRec) -> u32 {
        let address = rec.address;
        let b = slots::put(&mut self.blocks, &mut self.free_blocks, rec);
        self.by_addr.insert(address, b);
        self.account(b, true);
        b
    }

    fn drop_block(&mut self, b: u32) {
        self.account(b, false);
        let blk = &self.blocks[b as usize];
        let (prev, next, seg, address) = (blk.prev, blk.next, blk.segment, blk.address);
        self.link(prev, next, seg);
        if self.by_addr.get(&address) == Some(&b) {
            self.by_addr.remove(&address);
        }
        self.free_blocks.push(b);
    }

    /// Links `prev` to `next` inside segment `seg` (either may be NIL).
    fn link(&mut self, prev: u32, next: u32, seg: u32) {
        if prev == NIL {
            self.segments[seg as usize].first = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.segments[seg as usize].last = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
    }

    /// Changes a block through `f`, keeping the totals exact.
    fn update(&mut self, b: u32, f: impl FnOnce(&mut BlockRec)) {
        self.account(b, false);
        f(&mut self.blocks[b as usize]);
        self.account(b, true);
    }

    /// Splits block `b` so that it ends `at` bytes in; returns the new block after it.
    pub(super) fn split(&mut self, b: u32, at: u64) -> u32 {
        let blk = self.blocks[b as usize].clone();
        debug_assert!(at > 0 && at < blk.size);
        self.update(b, |x| x.size = at);
        let rest = BlockRec {
            address: blk.address + at,
            size: blk.size - at,
            requested: 0,
            state: BlockState::Inactive,
            stack: EMPTY_STACK,
            event: NIL,
            segment: blk.segment,
            prev: b,
            next: blk.next,
        };
        let n = self.new_block(rest);
        self.blocks[b as usize].next = n;
        if blk.next == NIL {
            self.segments[blk.segment as usize].last = n;
        } else {
            self.blocks[blk.next as usize].prev = n;
        }
        n
    }

    /// Merges inactive block `b` with inactive neighbours, as a free does.
    fn merge_free(&mut self, b: u32) -> u32 {
        let mut b = b;
        let prev = self.blocks[b as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == BlockState::Inactive {
            let size = self.blocks[b as usize].size;
            self.drop_block(b);
            self.update(prev, |x| x.size += size);
            b = prev;
        }
        let next = self.blocks[b as usize].next;
        if next != NIL && self.blocks[next as usize].state == BlockState::Inactive {
            let size = self.blocks[next as usize].size;
            self.drop_block(next);
            self.update(b, |x| x.size += size);
        }
        b
    }

    /// A new segment holding one inactive block.
    pub fn add_segment(&mut self, seg: SegmentRec) -> u32 {
        let block = BlockRec::free(seg.address, seg.size);
        self.insert_segment(seg, vec![block])
    }

    /// Inserts a segment with its blocks (in address order, covering it exactly).
    pub fn insert_segment(&mut self, seg: SegmentRec, blocks: Vec<BlockRec>) -> u32 {
        let (address, size) = (seg.address, seg.size);
        let rec = SegmentRec { first: NIL, last: NIL, live: 0, inactive: 0, ..seg };
        let s = slots::put(&mut self.segments, &mut self.free_segments, rec);
        self.seg_by_addr.insert(address, s);
        self.totals.reserved_bytes += size;
        let mut prev = NIL;
        for blk in blocks {
            let b = self.new_block(BlockRec { segment: s, prev, next: NIL, ..blk });
            self.link(prev, b, s);
            prev = b;
        }
        self.segments[s as usize].last = prev;
        s
    }

    /// Removes a segment and returns its blocks, in address order.
    pub fn take_segment(&mut self, s: u32) -> (SegmentRec, Vec<BlockRec>) {
        let ids: Vec<u32> = self.block_ids(s).collect();
        let blocks = ids.iter().map(|&b| self.blocks[b as usize].clone()).collect();
        for b in ids {
            self.drop_block(b);
        }
        let seg = self.segments[s as usize].clone();
        self.totals.reserved_bytes -= seg.size;
        self.seg_by_addr.remove(&seg.address);
        self.free_segments.push(s);
        (seg, blocks)
    }

    /// Drops a segment and its blocks.
    pub fn remove_segment(&mut self, s: u32) {
        self.take_segment(s);
    }

    /// Makes `b` live, as an `alloc` of `requested` bytes at its address.
    pub(super) fn make_live(&mut self, b: u32, requested: u64, stack: StackId, event: u32, state: BlockState) {
        self.update(b, |x| {
            x.state = state;
            x.requested = requested;
            x.stack = stack;
            x.event = event;
        });
    }

    pub(super) fn set_state(&mut self, b: u32, state: BlockState) {
        self.update(b, |x| x.state = state);
    }

    /// Frees block `b` and merges it with free neighbours.
    pub(super) fn release(&mut self, b: u32) {
        self.update(b, |x| {
            x.state = BlockState::Inactive;
            x.stack = EMPTY_STACK;
            x.event = NIL;
        });
        self.merge_free(b);
    }

    /// The block holding `address`.
    pub(super) fn block_containing(&self, address: u64) -> Option<u32> {
        if let Some(b) = self.block_at(address) {
            return Some(b);
        }
        let seg = self.segment_containing(address)?;
        self.block_ids(seg).find(|&b| {
            let x = &self.blocks[b as usize];
            x.address <= address && address < x.address + x.size
        })
    }

    /// Makes `address` the start of a block, splitting the block around it.
    pub(super) fn cut_at(&mut self, address: u64) -> Option<u32> {
        let b = self.block_containing(address)?;
        let start = self.blocks[b as usize].address;
        if start == address { Some(b) } else { Some(self.split(b, address - start)) }
    }

    /// Largest inactive block among segments of one stream and pool.
    pub fn largest_free_in(&self, stream: u16, kind: PoolKind, private: (i64, i64)) -> u64 {
        self.segment_ids()
            .filter(|&s| {
                let x = &self.segments[s as usize];
                x.stream == stream && x.pool.kind == kind && x.pool.id == private
            })
            .flat_map(|s| self.block_ids(s))
            .map(|b| &self.blocks[b as usize])
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }
}
