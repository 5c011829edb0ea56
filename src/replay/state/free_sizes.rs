//! The sizes of the inactive blocks, a multiset whose largest member is asked for after every
//! event of a serving replay (the timeline's largest-free column).
//!
//! Counts live in a hash map and the distinct sizes in a max-heap; a size whose count falls to
//! zero leaves the heap lazily, once it reaches the top, so the top is always a size still
//! counted. An ordered map did the same in a third of the replay's time on big_trace.
//!
//! The last few sizes added wait in a small array before they are counted: an event's steps
//! add sizes that its next steps remove again (a split block's front, taken at once; a freed
//! block, merged at once with its neighbour), and such a pair then never reaches the map.
//! Only additions wait, so the largest is the larger of the heap's top and theirs.

use std::collections::BinaryHeap;

use foldhash::HashMap;

/// Sizes added that wait before they are counted.
const WAITING: usize = 4;

#[derive(Debug, Clone, Default)]
pub(super) struct FreeSizes {
    counts: HashMap<u64, u32>,
    /// Every counted size, and perhaps sizes no longer counted (never at the top) or a size
    /// twice.
    heap: BinaryHeap<u64>,
    /// Added, not yet counted: `waiting[..waits]`.
    waiting: [u64; WAITING],
    waits: usize,
}

impl FreeSizes {
    pub(super) fn add(&mut self, size: u64) {
        if self.waits == WAITING {
            let oldest = self.waiting[0];
            self.waiting.copy_within(1.., 0);
            self.waits -= 1;
            self.count(oldest);
        }
        self.waiting[self.waits] = size;
        self.waits += 1;
    }

    fn count(&mut self, size: u64) {
        let count = self.counts.entry(size).or_insert(0);
        if *count == 0 {
            self.heap.push(size);
        }
        *count += 1;
    }

    /// Removes one block of `size` (which must be counted).
    pub(super) fn remove(&mut self, size: u64) {
        let waiting = &mut self.waiting[..self.waits];
        if let Some(i) = waiting.iter().position(|&w| w == size) {
            waiting.copy_within(i + 1.., i);
            self.waits -= 1;
            return;
        }
        let Some(count) = self.counts.get_mut(&size) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.counts.remove(&size);
        while let Some(top) = self.heap.peek()
            && !self.counts.contains_key(top)
        {
            self.heap.pop();
        }
        // Stale sizes below the top are dropped in one rebuild once they outnumber the live.
        if self.heap.len() > 2 * self.counts.len() + 64 {
            self.heap = self.counts.keys().copied().collect();
        }
    }

    /// The largest size counted, or 0.
    pub(super) fn largest(&self) -> u64 {
        let waiting = self.waiting[..self.waits].iter().copied().max().unwrap_or(0);
        self.heap.peek().copied().unwrap_or(0).max(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a sorted list, through adds and removes in a pseudo-random order that makes
    /// stale heap entries, duplicates and rebuilds.
    #[test]
    fn the_largest_is_always_the_largest_counted() {
        let mut sizes = FreeSizes::default();
        let mut truth: Vec<u64> = Vec::new();
        let mut next = crate::testkit::xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..50_000 {
            let x = next();
            let size = (x % 97) * 512;
            if x.is_multiple_of(3) && !truth.is_empty() {
                let victim = truth.remove((x >> 20) as usize % truth.len());
                sizes.remove(victim);
            } else {
                truth.push(size);
                sizes.add(size);
            }
            assert_eq!(sizes.largest(), truth.iter().copied().max().unwrap_or(0));
        }
        while let Some(v) = truth.pop() {
            sizes.remove(v);
            assert_eq!(sizes.largest(), truth.iter().copied().max().unwrap_or(0));
        }
        assert!(sizes.heap.is_empty() && sizes.counts.is_empty() && sizes.waits == 0);
    }
}
