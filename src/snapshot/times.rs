//! Event times, a column of their own at about 2 bytes an event rather than 8 inside
//! [`Event`]: with it an event is 23 bytes, and three million of them with their times fit in
//! 75 MB instead of 96.
//!
//! Times are microseconds since the epoch, close together and mostly rising, so each block
//! of `BLOCK` events keeps one base and each event the offset from it, in 2 bytes while every
//! time of the block is within about 65 ms of its base; the first time that is not widens the
//! block (always the last one) to 4 bytes an event. A time more than about 35 minutes from its
//! block's base (or none at all) is marked in the offset and kept whole in a side list, so
//! every time reads back exactly.
//!
//! [`Event`]: super::Event

/// Events per block: 2^BLOCK_BITS.
const BLOCK_BITS: u32 = 8;
const BLOCK_MASK: usize = (1 << BLOCK_BITS) - 1;
/// The offset of an event that had no `time_us`, in a narrow block and in a wide one.
const NONE16: u16 = u16::MAX;
const NONE: u32 = u32::MAX;
/// The offset of a time kept whole in `far`, in a narrow block and in a wide one.
const FAR16: u16 = u16::MAX - 1;
const FAR: u32 = u32::MAX - 1;
/// A block's base sits this far below its first time, so times a little earlier fit too.
const HALF: i64 = 1 << 14;
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Set by the block's first event with a time (`based`); any value may be a base.
    base: i64,
    /// Where the block's offsets start in `narrow`, or in `wide` when `wide` is set.
    start: u32,
    based: bool,
    wide: bool,
}

/// The times of a snapshot's events, by event index.
#[derive(Debug, Default, Clone)]
pub struct Times {
    blocks: Vec<Block>,
    narrow: Vec<u16>,
    wide: Vec<u32>,
    len: usize,
    /// Times too far from their base, by event index, in index order.
    far: Vec<(u32, i64)>,
}

impl Times {
    /// The column of narrow offsets, nearly one per event (for `sink::ahead`).
    pub(super) fn offsets(&self) -> &Vec<u16> {
        &self.narrow
    }

    /// Appends the next event's time (inlined into the sink's fold: a call per event showed).
    #[inline(always)]
    pub fn push(&mut self, time: Option<i64>) {
        // The common case first: a time near the base of a narrow block already started.
        if let (Some(t), Some(b)) = (time, self.blocks.last())
            && self.len & BLOCK_MASK != 0
            && b.based
            && !b.wide
            && let Some(d) = t.checked_sub(b.base)
            && (0..FAR16 as i64).contains(&d)
        {
            self.narrow.push(d as u16);
            self.len += 1;
            return;
        }
        self.push_slow(time);
    }

    #[inline(never)]
    fn push_slow(&mut self, time: Option<i64>) {
        let i = self.len;
        self.len += 1;
        if i & BLOCK_MASK == 0 {
            self.blocks.push(Block { base: 0, start: self.narrow.len() as u32, based: false, wide: false });
        }
        let Some(t) = time else {
            return self.push_offset(None);
        };
        let block = self.blocks.last_mut().expect("a block was started");
        if !block.based {
            (block.base, block.based) = (t.saturating_sub(HALF), true);
        }
        match t.checked_sub(block.base).filter(|d| (0..FAR as i64).contains(d)) {
            Some(d) => self.push_offset(Some(d as u32)),
            None => {
                self.push_offset(Some(FAR));
                self.far.push((i as u32, t));
            }
        }
    }

    /// Appends an offset to the last block (None: no time), widening it where it must.
    fn push_offset(&mut self, offset: Option<u32>) {
        let block = self.blocks.last_mut().expect("a block was started");
        let narrow = match offset {
            None => Some(NONE16),
            Some(FAR) => Some(FAR16),
            Some(d) => u16::try_from(d).ok().filter(|&d| d < FAR16),
        };
        match (block.wide, narrow) {
            (false, Some(d)) => self.narrow.push(d),
            (true, _) => self.wide.push(offset.unwrap_or(NONE)),
            (false, None) => {
                // The block's own offsets are the last of `narrow`: move them over, widened.
                let start = block.start as usize;
                block.start = self.wide.len() as u32;
                block.wide = true;
                self.wide.extend(self.narrow[start..].iter().map(|&d| match d {
                    NONE16 => NONE,
                    FAR16 => FAR,
                    d => d as u32,
                }));
                self.narrow.truncate(start);
                self.wide.push(offset.unwrap_or(NONE));
            }
        }
    }

    /// Appends the times of `other`'s events, in order.
    pub fn extend_from(&mut self, other: &Times) {
        self.narrow.reserve(other.narrow.len());
        let mut far = other.far.iter();
        for i in 0..other.len {
            let time = match other.offset(i) {
                NONE => None,
                FAR => far.next().map(|f| f.1),
                d => Some(other.blocks[i >> BLOCK_BITS].base + d as i64),
            };
            self.push(time);
        }
    }

    /// The offset of event `index` (< len), widened.
    #[inline]
    fn offset(&self, index: usize) -> u32 {
        let b = self.blocks[index >> BLOCK_BITS];
        let at = b.start as usize + (index & BLOCK_MASK);
        if b.wide {
            return self.wide[at];
        }
        widen(self.narrow[at])
    }

    /// The time of event `index`, None when it had none (or is past the end).
    pub fn get(&self, index: usize) -> Option<i64> {
        if index >= self.len {
            return None;
        }
        match self.offset(index) {
            NONE => None,
            FAR => self.far_time(index),
            d => Some(self.blocks[index >> BLOCK_BITS].base + d as i64),
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes it holds in memory: 2 or 4 an event, and the blocks and far times besides.
    pub fn bytes(&self) -> u64 {
        let (block, far) = (std::mem::size_of::<Block>(), std::mem::size_of::<(u32, i64)>());
        (self.narrow.len() * 2 + self.wide.len() * 4 + self.blocks.len() * block + self.far.len() * far) as u64
    }

    /// True when there are no events.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The times of the events in `range` (`none` where an event had none), a block at a
    /// time: what [`Times::get`] gives for each, without finding each one's block again.
    pub fn decode(&self, range: std::ops::Range<usize>, none: i64) -> Vec<i64> {
        let range = range.start.min(self.len)..range.end.min(self.len);
        let mut out = Vec::with_capacity(range.len());
        let mut i = range.start;
        while i < range.end {
            let b = self.blocks[i >> BLOCK_BITS];
            let end = range.end.min((i | BLOCK_MASK) + 1);
            let at = b.start as usize + (i & BLOCK_MASK);
            let n = end - i;
            let time = |k: usize, d: u32| match d {
                NONE => none,
                FAR => self.far_time(i + k).unwrap_or(none),
                d => b.base + d as i64,
            };
            if b.wide {
                out.extend(self.wide[at..at + n].iter().enumerate().map(|(k, &d)| time(k, d)));
            } else {
                out.extend(self.narrow[at..at + n].iter().enumerate().map(|(k, &d)| time(k, widen(d))));
            }
            i = end;
        }
        out
    }

    /// The times of the events in `range`, in order: what [`Times::get`] gives for each,
    /// reading on through each block rather than finding each event's block again (a pass
    /// over every event's time asked `get` six million times on train_big). 1.4 ns an event
    /// against 1.7 for `get` inlined (3M events summed), whatever the inliner chooses.
    pub fn iter(&self, range: std::ops::Range<usize>) -> Iter<'_> {
        let (i, end) = (range.start.min(self.len), range.end.min(self.len));
        Iter { times: self, i, end: end.max(i), block_end: i, block: None, at: 0 }
    }

    fn far_time(&self, index: usize) -> Option<i64> {
        let at = self.far.binary_search_by_key(&(index as u32), |f| f.0).ok()?;
        Some(self.far[at].1)
    }

    /// The times of the events `order` lists, in that order.
    pub fn reordered(&self, order: impl Iterator<Item = usize>) -> Times {
        let mut out = Times::default();
        for i in order {
            out.push(self.get(i));
        }
        out
    }
}

/// The times of a range of events, in order ([`Times::iter`]).
pub struct Iter<'a> {
    times: &'a Times,
    i: usize,
    end: usize,
    /// Where the block read now ends, and where its offsets are (in `narrow` or `wide`).
    block_end: usize,
    block: Option<Block>,
    at: usize,
}

impl Iterator for Iter<'_> {
    type Item = Option<i64>;

    #[inline]
    fn next(&mut self) -> Option<Option<i64>> {
        if self.i >= self.end {
            return None;
        }
        // The first call loads the first block too (`block_end` starts at the range's start).
        if self.i == self.block_end {
            let b = self.times.blocks[self.i >> BLOCK_BITS];
            self.block = Some(b);
            self.at = b.start as usize + (self.i & BLOCK_MASK);
            self.block_end = ((self.i | BLOCK_MASK) + 1).min(self.end);
        }
        let b = self.block?;
        let d = if b.wide { self.times.wide[self.at] } else { widen(self.times.narrow[self.at]) };
        let i = self.i;
        (self.i, self.at) = (i + 1, self.at + 1);
        Some(match d {
            NONE => None,
            FAR => self.times.far_time(i),
            d => Some(b.base + d as i64),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.i;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// A narrow block's offset as a wide block's, its markers included.
fn widen(d: u16) -> u32 {
    match d {
        NONE16 => NONE,
        FAR16 => FAR,
        d => d as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_reads_back_exactly() {
        let t0 = 1_795_942_324_475_767i64;
        let mut times: Vec<Option<i64>> = (0..200_000i64).map(|i| Some(t0 + 3 * i)).collect();
        // None, far ahead, far behind, the extremes, and a block that starts without a time.
        times[5] = None;
        times[6] = Some(t0 + (1 << 40));
        times[7] = Some(t0 - (1 << 33));
        times[8] = Some(i64::MIN + 1);
        times[9] = Some(i64::MAX);
        times[1 << 16] = None;
        times[(1 << 16) + 1] = Some(0);
        // A block that widens halfway (a gap of 100 ms, then times 3 us apart again), one
        // that widens at its last event, and one that starts with none and a time behind.
        for (i, t) in times.iter_mut().enumerate().take(1128).skip(1000) {
            *t = Some(t0 + 100_000 + 3 * i as i64);
        }
        times[1535] = Some(t0 + 70_000_000);
        times[2048] = None;
        times[2049] = Some(t0 - 40_000);
        // A block whose first time is the least there is, then an ordinary one: the base set
        // by the first stays the base.
        times[2304] = Some(i64::MIN);
        times[2305] = Some(t0);
        let mut column = Times::default();
        for &t in &times {
            column.push(t);
        }
        assert_eq!(column.len(), times.len());
        for (i, &t) in times.iter().enumerate() {
            assert_eq!(column.get(i), t, "event {i}");
        }
        assert_eq!(column.get(times.len()), None);
        // Decoded a block at a time, from anywhere to anywhere, the same as one by one.
        for range in [0..times.len(), 5..10, 250..2400, 1000..1128, 70_001..70_002, 199_990..200_010, 7..7] {
            let one_by_one: Vec<i64> =
                range.clone().filter(|&i| i < times.len()).map(|i| column.get(i).unwrap_or(-1)).collect();
            assert_eq!(column.decode(range.clone(), -1), one_by_one, "{range:?}");
            let read_on: Vec<Option<i64>> = column.iter(range.clone()).collect();
            let got: Vec<Option<i64>> = range.clone().filter(|&i| i < times.len()).map(|i| times[i]).collect();
            assert_eq!(read_on, got, "{range:?} read on");
        }
        // Every start and end around a block's edges.
        for (a, b) in [(255, 257), (256, 512), (0, 256), (511, 1025), (1535, 1537), (2047, 2050)] {
            assert!(column.iter(a..b).eq((a..b).map(|i| times[i])), "{a}..{b}");
        }
        // Two bytes an event where the times are close, four in the blocks that widened.
        assert!(column.bytes() < 3 * times.len() as u64, "{} bytes", column.bytes());
        assert_eq!(column.wide.len(), 2 * 256);
        // The same times appended from two columns split at an odd place read back the same.
        let (mut front, mut back_part) = (Times::default(), Times::default());
        for (i, &t) in times.iter().enumerate() {
            if i < 70_001 { front.push(t) } else { back_part.push(t) }
        }
        front.extend_from(&back_part);
        assert!((0..times.len()).all(|i| front.get(i) == times[i]));
        let back: Vec<usize> = (0..times.len()).rev().collect();
        let reversed = column.reordered(back.iter().copied());
        assert_eq!(reversed.get(0), times[times.len() - 1]);
        assert_eq!(reversed.get(times.len() - 10), times[9]);
    }
}
