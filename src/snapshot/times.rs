//! Event times, a column of their own at 4 bytes an event rather than 8 inside [`Event`]:
//! with it an event is 24 bytes, and three million of them fit in 72 MB instead of 96.
//!
//! Times are microseconds since the epoch, close together and mostly rising, so each block
//! of `BLOCK` events keeps one base and each event the offset from it. A time more than
//! about 35 minutes from its block's base (or none at all) is marked in the offset and kept
//! whole in a side list, so every time reads back exactly.
//!
//! [`Event`]: super::Event

/// Events per base.
const BLOCK_BITS: u32 = 16;
/// The offset of an event that had no `time_us`.
const NONE: u32 = u32::MAX;
/// The offset of a time kept whole in `far`.
const FAR: u32 = u32::MAX - 1;
/// A block's base sits this far below its first time, so times a little earlier fit too.
const HALF: i64 = 1 << 31;

/// The times of a snapshot's events, by event index.
#[derive(Debug, Default, Clone)]
pub struct Times {
    /// One per block, set by its first event with a time.
    bases: Vec<Option<i64>>,
    offsets: Vec<u32>,
    /// Times too far from their base, by event index, in index order.
    far: Vec<(u32, i64)>,
}

impl Times {
    /// The column of offsets, one per event (for `sink::ahead`).
    pub(super) fn offsets(&self) -> &Vec<u32> {
        &self.offsets
    }

    /// Appends the next event's time.
    #[inline]
    pub fn push(&mut self, time: Option<i64>) {
        let i = self.offsets.len();
        // The common case first: a time near the base of a block already started.
        if let (Some(t), Some(Some(base))) = (time, self.bases.last())
            && i >> BLOCK_BITS == self.bases.len() - 1
            && let Some(d) = t.checked_sub(*base)
            && (0..FAR as i64).contains(&d)
        {
            self.offsets.push(d as u32);
            return;
        }
        self.push_slow(i, time);
    }

    fn push_slow(&mut self, i: usize, time: Option<i64>) {
        let block = i >> BLOCK_BITS;
        if block == self.bases.len() {
            self.bases.push(None);
        }
        let Some(t) = time else {
            self.offsets.push(NONE);
            return;
        };
        let base = *self.bases[block].get_or_insert(t.saturating_sub(HALF));
        match t.checked_sub(base).filter(|d| (0..FAR as i64).contains(d)) {
            Some(d) => self.offsets.push(d as u32),
            None => {
                self.offsets.push(FAR);
                self.far.push((i as u32, t));
            }
        }
    }

    /// Appends the times of `other`'s events, in order.
    pub fn extend_from(&mut self, other: &Times) {
        self.offsets.reserve(other.len());
        let mut far = other.far.iter();
        for (i, &offset) in other.offsets.iter().enumerate() {
            let time = match offset {
                NONE => None,
                FAR => far.next().map(|f| f.1),
                d => other.bases[i >> BLOCK_BITS].map(|b| b + d as i64),
            };
            self.push(time);
        }
    }

    /// The time of event `index`, None when it had none (or is past the end).
    pub fn get(&self, index: usize) -> Option<i64> {
        match *self.offsets.get(index)? {
            NONE => None,
            FAR => {
                let at = self.far.binary_search_by_key(&(index as u32), |f| f.0).ok()?;
                Some(self.far[at].1)
            }
            d => Some(self.bases[index >> BLOCK_BITS]? + d as i64),
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Bytes it holds in memory: 4 an event, and the bases and far times besides.
    pub fn bytes(&self) -> u64 {
        (self.offsets.len() * 4 + self.bases.len() * 16 + self.far.len() * 16) as u64
    }

    /// True when there are no events.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
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
        let mut column = Times::default();
        for &t in &times {
            column.push(t);
        }
        assert_eq!(column.len(), times.len());
        for (i, &t) in times.iter().enumerate() {
            assert_eq!(column.get(i), t, "event {i}");
        }
        assert_eq!(column.get(times.len()), None);
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
