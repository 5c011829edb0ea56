//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), precise
//! enough to say whether a setting would have saved a run.
//!
//! What it follows, as the source does:
//! - requests rounded by `Rules::round_size`; at most 1 MiB goes to the small pool;
//! - one free-block order per pool, `(stream, size, address)`: a request takes the first block
//!   of its stream at least its size (best fit, lowest address among equals), and only that
//!   one: with `max_split_size`, a request under it refuses an oversize best fit, and a request
//!   at or over it refuses a best fit 20 MiB or more larger than itself;
//! - a new segment is `get_allocation_size` (2 MiB, 20 MiB, or rounded to 2 MiB);
//! - splitting by `should_split`; frees merge with free neighbours of the same segment;
//! - when cudaMalloc would pass the budget: free cached oversize blocks (with
//!   `max_split_size`), then every cached block that is a whole segment, then give up (OOM);
//! - `garbage_collection_threshold`: above that share of the budget, free whole cached large
//!   blocks whose age (allocations since they were freed) is at least the average;
//! - expandable segments: one virtual range per pool and stream, its address space split into
//!   mapped blocks and unmapped ones (which never merge). A request takes the best fit among
//!   mapped free blocks, preferring those that cannot grow into unmapped space behind them;
//!   failing that, it maps pages (2 MiB small, 20 MiB large) at the lowest-address unmapped
//!   region with room, counting a free mapped block just before it (`find_expandable_block`).
//!   Releasing unmaps the whole pages inside free mapped blocks.
//!
//! Addresses are its own: only sizes and order matter.

use std::collections::BTreeSet;

use foldhash::{HashMap, HashMapExt};

use crate::replay::rules::{LARGE_BUFFER, Rules, SMALL_BUFFER};
use crate::replay::slots;
use free_set::FreeSet;

const NIL: u32 = u32::MAX;
/// Virtual size of an expandable segment: more than any GPU holds.
const EXPANDABLE_SPAN: u64 = 1 << 44;

/// A pool: the default one (0), a private one (a CUDA graph's or a MemPool's), small or large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub private: u32,
    pub small: bool,
}

#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    allocated: bool,
    seg: u32,
    prev: u32,
    next: u32,
    /// Allocation rounds this block has waited while free (for garbage collection).
    age: u32,
    /// Backed by memory; only expandable segments have unmapped blocks.
    mapped: bool,
}

#[derive(Debug, Clone)]
struct Segment {
    size: u64,
    key: PoolKey,
    stream: u16,
    expandable: bool,
    live: u32,
    /// Mapping granularity of an expandable segment.
    page: u64,
    /// First address: pages are counted from it.
    base: u64,
}

type FreeKey = (PoolKey, u16, u64, u64, u32);

pub struct Allocator {
    rules: Rules,
    capacity: Option<u64>,
    blocks: Vec<Block>,
    spare_blocks: Vec<u32>,
    segments: Vec<Segment>,
    /// Free mapped blocks ordered as torch orders them: pool, stream, size, address.
    free: FreeSet,
    /// Unmapped blocks of expandable segments: pool, stream, address.
    unmapped: BTreeSet<(PoolKey, u16, u64, u32)>,
    expandable: HashMap<(PoolKey, u16), u32>,
    next_addr: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
}

impl Allocator {
    pub fn new(rules: Rules, capacity: Option<u64>) -> Allocator {
        Allocator {
            rules,
            capacity,
            blocks: Vec::new(),
            spare_blocks: Vec::new(),
            segments: Vec::new(),
            free: FreeSet::default(),
            unmapped: BTreeSet::new(),
            expandable: HashMap::new(),
            next_addr: 0x7f00_0000_0000,
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_allocated: 0,
        }
    }

    pub fn round(&self, size: u64) -> u64 {
        self.rules.round_size(size)
    }

    fn fits_budget(&self, more: u64) -> bool {
        self.capacity.is_none_or(|cap| self.reserved + more <= cap)
    }

    fn free_key(&self, b: u32) -> FreeKey {
        let x = &self.blocks[b as usize];
        let s = &self.segments[x.seg as usize];
        (s.key, s.stream, x.size, x.addr, b)
    }

    fn new_block(&mut self, block: Block) -> u32 {
        slots::put(&mut self.blocks, &mut self.spare_blocks, block)
    }

    /// Serves `size` bytes on `stream` from pool `private`; None when the budget is exhausted.
    pub fn malloc(&mut self, size: u64, stream: u16, private: u32) -> Option<u32> {
        let rounded = self.round(size);
        let key = PoolKey { private, small: Rules::is_small(rounded) };
        let gc = self.rules.gc_threshold > 0.0 && self.capacity.is_some();
        if gc {
            self.age_free_blocks(key);
        }
        let expandable = self.rules.expandable_segments;
        let found = self.free_block(key, stream, rounded);
        let block = match found {
            Some(b) => b,
            None => {
                if gc {
                    self.garbage_collect();
                }
                let first = if expandable {
                    self.expandable_block(key, stream, rounded)
                } else {
                    self.new_segment(key, stream, rounded)
                };
                match first {
                    Some(b) => b,
                    None => {
                        let retry = !expandable && self.release_oversize(key, stream, rounded);
                        let second = if retry { self.new_segment(key, stream, rounded) } else { None };
                        match second {
                            Some(b) => b,
                            None => {
                                self.release_cached();
                                if expandable {
                                    self.expandable_block(key, stream, rounded)?
                                } else {
                                    self.new_segment(key, stream, rounded)?
                                }
                            }
                        }
                    }
                }
            }
        };
        Some(self.take(block, rounded))
    }

    /// The best fit of the pool and stream, under the `max_split_size` rules (torch looks at
    /// the best fit only).
    fn free_block(&mut self, key: PoolKey, stream: u16, rounded: u64) -> Option<u32> {
        let mut fits = self.free.at_least(key, stream, rounded);
        let mut cand = fits.next()?;
        if self.rules.expandable_segments {
            // A block that could grow into unmapped space counts as that much bigger, so the
            // search moves on while the next fit would be tighter.
            let grown = |a: &Allocator, b: u32| {
                let x = &a.blocks[b as usize];
                x.size
                    + if x.next != NIL && !a.blocks[x.next as usize].mapped {
                        a.blocks[x.next as usize].size
                    } else {
                        0
                    }
            };
            for next in fits {
                if grown(self, next.4) < grown(self, cand.4) {
                    cand = next;
                } else {
                    break;
                }
            }
        } else {
            drop(fits);
        }
        let max_split = self.rules.max_split_size;
        if rounded < max_split && cand.2 >= max_split {
            return None;
        }
        if rounded >= max_split && cand.2 >= rounded + LARGE_BUFFER {
            return None;
        }
        self.free.remove(&cand);
        Some(cand.4)
    }

    /// A new segment for a request (`get_allocation_size`), if the budget allows.
    fn new_segment(&mut self, key: PoolKey, stream: u16, rounded: u64) -> Option<u32> {
        let size = Rules::segment_size(rounded);
        if !self.fits_budget(size) {
            return None;
        }
        let addr = self.next_addr;
        self.next_addr += size.div_ceil(SMALL_BUFFER) * SMALL_BUFFER + SMALL_BUFFER;
        let seg = self.segments.len() as u32;
        self.segments.push(Segment { size, key, stream, expandable: false, live: 0, page: 0, base: addr });
        self.reserved += size;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        Some(self.new_block(Block { addr, size, allocated: false, seg, prev: NIL, next: NIL, age: 0, mapped: true }))
    }

    /// Hands out `b` for `rounded` bytes, splitting off the rest when torch would.
    fn take(&mut self, b: u32, rounded: u64) -> u32 {
        let (size, seg) = (self.blocks[b as usize].size, self.blocks[b as usize].seg);
        let s = &self.segments[seg as usize];
        if size > rounded && self.rules.should_split(size, rounded, s.key.small, s.expandable) {
            let rest = self.split_at(b, rounded);
            let k = self.free_key(rest);
            self.free.insert(k);
        }
        let blk = &mut self.blocks[b as usize];
        blk.allocated = true;
        self.allocated += blk.size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.segments[seg as usize].live += 1;
        b
    }

    /// Returns a block to its pool, merged with free neighbours.
    pub fn free(&mut self, b: u32) {
        if !self.blocks[b as usize].allocated {
            return;
        }
        let seg = self.blocks[b as usize].seg;
        self.allocated -= self.blocks[b as usize].size;
        self.segments[seg as usize].live -= 1;
        self.blocks[b as usize].allocated = false;
        self.blocks[b as usize].age = 0;
        let mut b = b;
        let joins = |a: &Allocator, n: u32| n != NIL && !a.blocks[n as usize].allocated && a.blocks[n as usize].mapped;
        let prev = self.blocks[b as usize].prev;
        if joins(self, prev) {
            b = self.merge(prev, b);
        }
        let next = self.blocks[b as usize].next;
        if joins(self, next) {
            b = self.merge(b, next);
        }
        let k = self.free_key(b);
        self.free.insert(k);
    }

    /// Merges free mapped block `b` (just after `a`) into `a`, taking both out of the free set.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        let ka = self.free_key(a);
        self.free.remove(&ka);
        let kb = self.free_key(b);
        self.free.remove(&kb);
        self.absorb(a, b)
    }

    /// cudaFree of a cached block that is a whole fixed segment.
    fn release_segment(&mut self, b: u32) {
        let k = self.free_key(b);
        self.free.remove(&k);
        let seg = self.blocks[b as usize].seg;
        self.reserved -= self.segments[seg as usize].size;
        self.spare_blocks.push(b);
    }

    fn whole_fixed(&self, b: u32) -> bool {
        let x = &self.blocks[b as usize];
        !x.allocated && x.prev == NIL && x.next == NIL && !self.segments[x.seg as usize].expandable
    }

    /// `release_available_cached_blocks`: with `max_split_size`, free one cached oversize
    /// block big enough, or the largest ones until enough is freed.
    fn release_oversize(&mut self, key: PoolKey, stream: u16, rounded: u64) -> bool {
        let max_split = self.rules.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let want = rounded.max(max_split);
        let best = self.free.at_least(key, stream, want).next();
        if let Some(c) = best
            && self.whole_fixed(c.4)
        {
            self.release_segment(c.4);
            return true;
        }
        let mut released = 0;
        let candidates: Vec<FreeKey> = self.free.below_largest_first(key, stream, want).collect();
        for c in candidates {
            if released >= want || c.2 < max_split {
                break;
            }
            if self.whole_fixed(c.4) {
                released += c.2;
                self.release_segment(c.4);
            }
        }
        released >= want
    }

    /// `release_cached_blocks` (also `torch.cuda.empty_cache()`): free every cached block that is
    /// a whole fixed segment, and unmap the whole free pages of expandable segments.
    pub fn release_cached(&mut self) {
        let all: Vec<FreeKey> = self.free.iter().collect();
        for c in all {
            if self.whole_fixed(c.4) {
                self.release_segment(c.4);
            } else if self.segments[self.blocks[c.4 as usize].seg as usize].expandable {
                self.unmap_free(c.4);
            }
        }
    }

    /// Splits block `b` after `at` bytes; the new block after it has `b`'s state (allocated,
    /// mapped) and a fresh age. Returns it.
    fn split_at(&mut self, b: u32, at: u64) -> u32 {
        let x = self.blocks[b as usize].clone();
        let rest =
            self.new_block(Block { addr: x.addr + at, size: x.size - at, prev: b, next: x.next, age: 0, ..x.clone() });
        if x.next != NIL {
            self.blocks[x.next as usize].prev = rest;
        }
        self.blocks[b as usize].next = rest;
        self.blocks[b as usize].size = at;
        rest
    }

    fn age_free_blocks(&mut self, key: PoolKey) {
        let ids: Vec<u32> = self.free.iter().filter(|c| c.0 == key).map(|c| c.4).collect();
        for b in ids {
            self.blocks[b as usize].age += 1;
        }
    }

    /// `garbage_collect_cached_blocks`: above the threshold, free whole cached large blocks of
    /// the default pool whose age is at least the average, until under it.
    fn garbage_collect(&mut self) {
        let Some(cap) = self.capacity else { return };
        let threshold = (self.rules.gc_threshold * cap as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let mut freeable: Vec<FreeKey> =
            self.free.iter().filter(|c| !c.0.small && c.0.private == 0 && self.whole_fixed(c.4)).collect();
        let mut reclaimed = 0;
        while reclaimed < target && !freeable.is_empty() {
            let avg =
                freeable.iter().map(|c| self.blocks[c.4 as usize].age as f64).sum::<f64>() / freeable.len() as f64;
            let (old, young): (Vec<FreeKey>, Vec<FreeKey>) =
                freeable.into_iter().partition(|c| self.blocks[c.4 as usize].age as f64 >= avg);
            if old.is_empty() {
                break;
            }
            for c in old {
                reclaimed += c.2;
                self.release_segment(c.4);
            }
            freeable = young;
        }
    }

    /// Free bytes in fixed segments that still hold a live block.
    pub fn pinned_free_bytes(&self) -> u64 {
        self.free
            .iter()
            .filter(|c| {
                !self.segments[self.blocks[c.4 as usize].seg as usize].expandable
                    && self.segments[self.blocks[c.4 as usize].seg as usize].live > 0
            })
            .map(|c| c.2)
            .sum()
    }
}

mod expandable;
mod free_set;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_seed_pattern_fragments_under_the_default_rules() {
        let mut a = Allocator::new(Rules::default(), Some(6 << 30));
        let mut died = None;
        for step in 0..8 {
            let Some(big) = a.malloc(1024 * MIB, 0, 0) else {
                died = Some(step);
                break;
            };
            a.free(big);
            a.malloc(520 * MIB, 0, 0).expect("small fits");
        }
        assert_eq!(died, Some(6), "the real run died at step 6");
        assert_eq!(a.pinned_free_bytes(), 6 * 504 * MIB);
    }

    #[test]
    fn expandable_segments_reuse_freed_pages() {
        let rules = Rules { expandable_segments: true, ..Rules::default() };
        let mut a = Allocator::new(rules, Some(6 << 30));
        for _ in 0..8 {
            let big = a.malloc(1024 * MIB, 0, 0).expect("no OOM with expandable segments");
            a.free(big);
            a.malloc(520 * MIB, 0, 0).unwrap();
        }
        assert!(a.peak_reserved < 5 << 30, "peak {}", a.peak_reserved);
    }

    #[test]
    fn oversize_blocks_are_not_split_and_cached_segments_are_freed_before_oom() {
        let rules = Rules { max_split_size: 256 * MIB, ..Rules::default() };
        let mut a = Allocator::new(rules, Some(2048 * MIB));
        let big = a.malloc(1024 * MIB, 0, 0).unwrap();
        a.free(big);
        // 520 MiB is oversize too: it may only take a block less than 20 MiB larger.
        let small = a.malloc(520 * MIB, 0, 0).unwrap();
        assert_eq!(a.reserved, 1544 * MIB, "a new segment, the 1 GiB block left whole");
        // Now 1 GiB does not fit the budget beside both: the cached 1 GiB segment is reused.
        assert!(a.malloc(1024 * MIB, 0, 0).is_some());
        a.free(small);
        assert_eq!(a.pinned_free_bytes(), 0);
    }
}
