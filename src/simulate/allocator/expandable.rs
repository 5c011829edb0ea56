//! Expandable segments in the model: one virtual range per pool and stream, mapped a page at a
//! time. A request takes the best fit among mapped free blocks, preferring those that cannot
//! grow into unmapped space behind them; failing that, pages are mapped at the lowest unmapped
//! region with room (`find_expandable_block`). Releasing unmaps whole free pages.

use super::*;

impl Allocator {
    /// Expandable segments when no mapped block fits: map pages at the lowest-address unmapped
    /// region with room for the request, joined with the free mapped block before it; None if
    /// mapping them would pass the budget.
    pub(super) fn expandable_block(&mut self, key: PoolKey, stream: u16, rounded: u64) -> Option<u32> {
        // `alloc_block` checks the budget against the request's whole allocation size before
        // it maps anything, however few pages the request then needs (learned from the real
        // dynamic_expandable run, whose allocator released cached pages at this check).
        if !self.fits_budget(Rules::segment_size(rounded)) {
            return None;
        }
        if !self.expandable.contains_key(&(key, stream)) {
            let addr = self.next_addr;
            self.next_addr += EXPANDABLE_SPAN;
            let page = if key.small { SMALL_BUFFER } else { LARGE_BUFFER };
            let s = self.segments.len() as u32;
            self.segments.push(Segment {
                size: EXPANDABLE_SPAN,
                key,
                stream,
                expandable: true,
                live: 0,
                page,
                base: addr,
            });
            let b = self.new_block(Block {
                addr,
                size: EXPANDABLE_SPAN,
                allocated: false,
                seg: s,
                prev: NIL,
                next: NIL,
                age: 0,
                mapped: false,
            });
            self.unmapped.insert((key, stream, addr, b));
            self.expandable.insert((key, stream), s);
        }
        let free = |a: &Allocator, b: u32| b != NIL && !a.blocks[b as usize].allocated;
        let start =
            self.unmapped.range((key, stream, 0, 0)..).take_while(|u| (u.0, u.1) == (key, stream)).find_map(|u| {
                let prev = self.blocks[u.3 as usize].prev;
                let first = if free(self, prev) && self.blocks[prev as usize].mapped { prev } else { u.3 };
                let (mut room, mut b) = (0, first);
                while room < rounded && free(self, b) {
                    room += self.blocks[b as usize].size;
                    b = self.blocks[b as usize].next;
                }
                (room >= rounded).then_some(first)
            })?;
        // Pages to map: the unmapped blocks the request reaches into, in whole pages.
        let page = self.segments[self.blocks[start as usize].seg as usize].page;
        let (mut covered, mut b, mut to_map) = (0, start, Vec::new());
        while covered < rounded {
            let x = &self.blocks[b as usize];
            if !x.mapped {
                let want = (rounded - covered).div_ceil(page) * page;
                to_map.push((b, want.min(x.size)));
            }
            covered += x.size;
            b = x.next;
        }
        let need: u64 = to_map.iter().map(|m| m.1).sum();
        if !self.fits_budget(need) {
            return None;
        }
        for (u, bytes) in to_map {
            self.map(u, bytes);
        }
        // The mapped free blocks from `start` now form one run: merge it into one block.
        let mut first = start;
        let k = self.free_key(first);
        self.free.remove(&k);
        while self.blocks[first as usize].size < rounded {
            let next = self.blocks[first as usize].next;
            let k = self.free_key(next);
            self.free.remove(&k);
            first = self.absorb(first, next);
        }
        Some(first)
    }

    /// Maps the first `bytes` of unmapped block `u` (a whole number of pages): that part
    /// becomes a free mapped block.
    pub(super) fn map(&mut self, u: u32, bytes: u64) {
        let x = self.blocks[u as usize].clone();
        let (key, stream) = (self.segments[x.seg as usize].key, self.segments[x.seg as usize].stream);
        self.unmapped.remove(&(key, stream, x.addr, u));
        if bytes < x.size {
            let rest = self.split_at(u, bytes);
            self.unmapped.insert((key, stream, x.addr + bytes, rest));
        }
        self.blocks[u as usize].mapped = true;
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        let k = self.free_key(u);
        self.free.insert(k);
    }

    /// Joins block `b` (just after `a`, in neither free set) into `a`.
    pub(super) fn absorb(&mut self, a: u32, b: u32) -> u32 {
        let (size, next) = (self.blocks[b as usize].size, self.blocks[b as usize].next);
        self.blocks[a as usize].size += size;
        self.blocks[a as usize].next = next;
        if next != NIL {
            self.blocks[next as usize].prev = a;
        }
        self.spare_blocks.push(b);
        a
    }

    /// Unmaps the whole pages inside free mapped block `b`, merging them with unmapped
    /// neighbours; the partial pages at either end stay mapped and free.
    pub(super) fn unmap_free(&mut self, b: u32) {
        let x = self.blocks[b as usize].clone();
        let s = self.segments[x.seg as usize].clone();
        let base = s.base;
        let lo = base + (x.addr - base).div_ceil(s.page) * s.page;
        let hi = base + (x.addr + x.size - base) / s.page * s.page;
        if lo >= hi {
            return;
        }
        let k = self.free_key(b);
        self.free.remove(&k);
        // Split into [x.addr, lo) mapped, [lo, hi) unmapped, [hi, end) mapped.
        let mut mid = b;
        if lo > x.addr {
            mid = self.split_at(b, lo - x.addr);
            let k = self.free_key(b);
            self.free.insert(k);
        }
        if hi < x.addr + x.size {
            let tail = self.split_at(mid, hi - lo);
            let k = self.free_key(tail);
            self.free.insert(k);
        }
        self.blocks[mid as usize].mapped = false;
        self.reserved -= hi - lo;
        let mut u = mid;
        let prev = self.blocks[u as usize].prev;
        if prev != NIL && !self.blocks[prev as usize].mapped {
            self.unmapped.remove(&(s.key, s.stream, self.blocks[prev as usize].addr, prev));
            u = self.absorb(prev, u);
        }
        let next = self.blocks[u as usize].next;
        if next != NIL && !self.blocks[next as usize].mapped {
            self.unmapped.remove(&(s.key, s.stream, self.blocks[next as usize].addr, next));
            u = self.absorb(u, next);
        }
        self.unmapped.insert((s.key, s.stream, self.blocks[u as usize].addr, u));
    }
}
