//! The memory timeline: per event, the totals torch would report at that moment, and the
//! peaks. Recorded as plain columns in one replay pass; served downsampled with each bucket's
//! minimum and maximum so that no spike disappears.

use serde::{Deserialize, Serialize};

use crate::replay::{Observer, State};
use crate::snapshot::{Action, Event};

/// The series, one value per event (the state right after it).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub reserved_bytes: Vec<u64>,
    pub allocated_bytes: Vec<u64>,
    pub active_bytes: Vec<u64>,
    pub pinned_free_bytes: Vec<u64>,
    /// The largest inactive block anywhere.
    pub largest_free_block_bytes: Vec<u64>,
    pub time_us: Vec<i64>,
    /// Events that created segments (segment_alloc, segment_map).
    pub segment_events: Vec<u32>,
    pub oom_events: Vec<u32>,
    pub peak: Peak,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Peak {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// The first event after which the peak held (None: it held before the trace began).
    pub reserved_event: Option<u64>,
    pub allocated_event: Option<u64>,
}

impl Timeline {
    pub fn new(events: usize) -> Timeline {
        let with = |n| Vec::with_capacity(n);
        Timeline {
            reserved_bytes: with(events),
            allocated_bytes: with(events),
            active_bytes: with(events),
            pinned_free_bytes: with(events),
            largest_free_block_bytes: with(events),
            ..Timeline::default()
        }
    }

    /// Where the series' values will go, so that another thread can fault those pages in
    /// ([`Unwritten::prefault`]) while the replay fills them: addresses, meaningful while this
    /// timeline lives and its series stay within their capacity.
    pub fn unwritten(&self) -> Unwritten {
        Unwritten(self.series().map(|c| {
            let start = c.as_ptr_range().end as usize;
            start..start + (c.capacity() - c.len()) * std::mem::size_of::<u64>()
        }))
    }

    /// Only the peaks, for reports that need no series.
    pub fn track_peak(&mut self, index: usize, state: &State) {
        let t = state.totals;
        if t.reserved_bytes > self.peak.reserved_bytes {
            self.peak.reserved_bytes = t.reserved_bytes;
            self.peak.reserved_event = Some(index as u64);
        }
        if t.allocated_bytes > self.peak.allocated_bytes {
            self.peak.allocated_bytes = t.allocated_bytes;
            self.peak.allocated_event = Some(index as u64);
        }
    }

    pub fn len(&self) -> usize {
        self.reserved_bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reserved_bytes.is_empty()
    }

    /// The columns, in the order [`SERIES`] names them.
    pub fn columns(&self) -> [&[u64]; 5] {
        self.series().map(|c| c.as_slice())
    }

    fn series(&self) -> [&Vec<u64>; 5] {
        [
            &self.reserved_bytes,
            &self.allocated_bytes,
            &self.active_bytes,
            &self.pinned_free_bytes,
            &self.largest_free_block_bytes,
        ]
    }

    /// Events `range` in `points` buckets, each with its first event and the min and max of
    /// every series.
    pub fn downsample(&self, range: std::ops::Range<usize>, points: usize) -> Downsampled {
        let columns = Columns {
            time: Col::plain(bytemuck::cast_slice(&self.time_us)),
            series: self.columns().map(Col::plain),
            blocks: None,
        };
        columns.downsample(range, points)
    }
}

/// The memory the series of a [`Timeline`] will fill, as addresses.
pub struct Unwritten([std::ops::Range<usize>; 5]);

impl Unwritten {
    /// Faults in the pages the series will fill, a few MiB of each column in turn, ahead of
    /// the replay that writes them ([`crate::machine::pages::populate_write`]): the first write to each
    /// page costs a fault and a page of zeros (a tenth of the serving replay's time on
    /// big_trace), which this pays on the other core instead.
    pub fn prefault(&self) {
        const STEP: usize = 4 << 20;
        let longest = self.0.iter().map(|r| r.len()).max().unwrap_or(0);
        for at in (0..longest).step_by(STEP) {
            for r in &self.0 {
                // The caller keeps the timeline until this returns: the ranges stay its columns'.
                crate::machine::pages::populate_write((r.start + at).min(r.end)..(r.start + at + STEP).min(r.end));
            }
        }
    }
}

/// The times of `events` (`NO_TIME` where none), from their column: the series' time column.
pub fn times(snapshot: &crate::snapshot::Snapshot, events: std::ops::Range<usize>) -> Vec<i64> {
    snapshot.times.decode(events, crate::snapshot::NO_TIME)
}

/// Events per block of [`Blocks`].
pub const BLOCK: usize = 64;

/// The block minimums and maximums of `col`.
pub fn block_extremes(col: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let blocks = col.len().div_ceil(BLOCK);
    let (mut min, mut max) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
    // Both in one pass over the column.
    for c in col.chunks(BLOCK) {
        let (lo, hi) = c.iter().fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        min.push(lo);
        max.push(hi);
    }
    (min, max)
}

/// Stored values of one column, each 1, 2, 4 or 8 bytes wide.
#[derive(Debug, Clone, Copy)]
pub enum Packed<'a> {
    W1(&'a [u8]),
    W2(&'a [u16]),
    W4(&'a [u32]),
    W8(&'a [u64]),
}

/// One column of values, in memory or as a timeline file stores it: value `i` is
/// `base + (stored[i] << shift)` (wrapping, so a time column's i64 values round-trip). The
/// decoding only grows with the stored value, so the extremes of stored values are the
/// extremes of the values.
#[derive(Debug, Clone, Copy)]
pub struct Col<'a> {
    pub packed: Packed<'a>,
    pub base: u64,
    pub shift: u32,
}

impl<'a> Col<'a> {
    /// Values as they are.
    pub fn plain(values: &'a [u64]) -> Col<'a> {
        Col { packed: Packed::W8(values), base: 0, shift: 0 }
    }

    pub fn len(&self) -> usize {
        match self.packed {
            Packed::W1(v) => v.len(),
            Packed::W2(v) => v.len(),
            Packed::W4(v) => v.len(),
            Packed::W8(v) => v.len(),
        }
    }

    #[inline]
    fn decode(&self, stored: u64) -> u64 {
        self.base.wrapping_add(stored << self.shift)
    }

    /// Value `i`.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        let stored = match self.packed {
            Packed::W1(v) => v[i] as u64,
            Packed::W2(v) => v[i] as u64,
            Packed::W4(v) => v[i] as u64,
            Packed::W8(v) => v[i],
        };
        self.decode(stored)
    }

    /// Min and max of values `r` (`(u64::MAX, 0)` when empty).
    fn extremes(&self, r: std::ops::Range<usize>) -> (u64, u64) {
        fn scan<T: Copy + Ord + Into<u64>>(v: &[T]) -> Option<(u64, u64)> {
            Some(((*v.iter().min()?).into(), (*v.iter().max()?).into()))
        }
        let found = match self.packed {
            Packed::W1(v) => scan(&v[r]),
            Packed::W2(v) => scan(&v[r]),
            Packed::W4(v) => scan(&v[r]),
            Packed::W8(v) => scan(&v[r]),
        };
        found.map_or((u64::MAX, 0), |(lo, hi)| (self.decode(lo), self.decode(hi)))
    }
}

/// The minimum and maximum of each run of [`BLOCK`] events of one column (the last block may
/// be shorter), in the column's own encoding: a wide bucket then reads one value per block
/// instead of one per event.
#[derive(Debug, Clone, Copy)]
pub struct Blocks<'a> {
    pub min: Col<'a>,
    pub max: Col<'a>,
}

/// Min and max of `col[lo..hi]` (not empty), from whole blocks where they fit inside.
fn extremes(col: Col, blocks: Option<Blocks>, lo: usize, hi: usize) -> (u64, u64) {
    let (first, last) = (lo.div_ceil(BLOCK), hi / BLOCK);
    match blocks {
        Some(b) if first < last && b.min.len() >= last && b.max.len() >= last => {
            let (a, z) = (col.extremes(lo..first * BLOCK), col.extremes(last * BLOCK..hi));
            let mid_min = b.min.extremes(first..last).0;
            let mid_max = b.max.extremes(first..last).1;
            (a.0.min(z.0).min(mid_min), a.1.max(z.1).max(mid_max))
        }
        _ => col.extremes(lo..hi),
    }
}

/// A timeline's columns wherever they live (in memory, or a mapped file), with their block
/// extremes where stored. The time column holds i64 values as u64.
pub struct Columns<'a> {
    pub time: Col<'a>,
    pub series: [Col<'a>; 5],
    pub blocks: Option<[Blocks<'a>; 5]>,
}

impl Columns<'_> {
    /// Events `range` in `points` buckets, each with its first event and the min and max of
    /// every series; `blocks`, where present, give the same answer with fewer reads.
    pub fn downsample(&self, range: std::ops::Range<usize>, points: usize) -> Downsampled {
        downsample_columns(self, range, points)
    }
}

fn downsample_columns(c: &Columns, range: std::ops::Range<usize>, points: usize) -> Downsampled {
    let len = c.time.len();
    let range = range.start.min(len)..range.end.min(len);
    let n = range.len();
    let points = points.clamp(1, n.max(1));
    let mut out = Downsampled { start: range.start as u64, end: range.end as u64, ..Downsampled::default() };
    if n == 0 {
        return out;
    }
    for k in 0..points {
        let lo = range.start + k * n / points;
        let hi = (range.start + (k + 1) * n / points).max(lo + 1).min(range.end);
        out.event.push(lo as u64);
        out.time_us.push(c.time.get(lo) as i64);
        for (s, &col) in c.series.iter().enumerate() {
            let (min, max) = extremes(col, c.blocks.map(|b| b[s]), lo, hi);
            out.min[s].push(min);
            out.max[s].push(max);
        }
    }
    out
}

impl Downsampled {
    /// The compact binary form the page reads with one `Float64Array`: `[points, start, end]`,
    /// then `points` values each of: event, time_us, and min and max of every series in
    /// [`SERIES`] order. Little-endian f64: exact for every byte count under 8 PiB.
    pub fn to_f64_bytes(&self) -> Vec<u8> {
        let n = self.event.len();
        let mut v: Vec<f64> = Vec::with_capacity(3 + n * 12);
        v.extend([n as f64, self.start as f64, self.end as f64]);
        v.extend(self.event.iter().map(|&x| x as f64));
        v.extend(self.time_us.iter().map(|&x| x as f64));
        for s in 0..SERIES.len() {
            v.extend(self.min[s].iter().map(|&x| x as f64));
            v.extend(self.max[s].iter().map(|&x| x as f64));
        }
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}

/// Names of the series, in column order.
pub const SERIES: [&str; 5] =
    ["reserved_bytes", "allocated_bytes", "active_bytes", "pinned_free_bytes", "largest_free_block_bytes"];

/// A downsampled stretch of the timeline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Downsampled {
    pub start: u64,
    pub end: u64,
    /// First event of each bucket.
    pub event: Vec<u64>,
    pub time_us: Vec<i64>,
    /// Per series (in [`SERIES`] order), the bucket minimums and maximums.
    pub min: [Vec<u64>; 5],
    pub max: [Vec<u64>; 5],
}

impl Observer for Timeline {
    fn event(&mut self, index: usize, e: &Event, state: &State) {
        let t = state.totals;
        self.reserved_bytes.push(t.reserved_bytes);
        self.allocated_bytes.push(t.allocated_bytes);
        self.active_bytes.push(t.active_bytes);
        self.pinned_free_bytes.push(t.pinned_free_bytes);
        self.largest_free_block_bytes.push(state.largest_free());
        self.track_peak(index, state);
        match e.action {
            Action::SEGMENT_ALLOC | Action::SEGMENT_MAP => self.segment_events.push(index as u32),
            Action::OOM => self.oom_events.push(index as u32),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Faulting the series' pages in on another thread while they are filled, as the serving
    /// analysis does, changes no value: neither those written before nor those written during.
    #[test]
    fn prefaulting_the_series_changes_no_value() {
        let n = 3 << 20;
        let mut t = Timeline::new(n);
        t.allocated_bytes.extend((0..n as u64 / 3).map(|i| i * 512));
        let unwritten = t.unwritten();
        assert!(unwritten.0[1].len() == (n - n / 3) * 8 && unwritten.0[0].len() == n * 8);
        std::thread::scope(|scope| {
            scope.spawn(|| unwritten.prefault());
            for i in 0..n as u64 {
                t.reserved_bytes.push(i ^ 0x5555);
                if i >= n as u64 / 3 {
                    t.allocated_bytes.push(i * 512);
                }
            }
        });
        assert!(t.reserved_bytes.iter().enumerate().all(|(i, &v)| v == i as u64 ^ 0x5555));
        assert!(t.allocated_bytes.iter().enumerate().all(|(i, &v)| v == i as u64 * 512));
        assert_eq!(t.reserved_bytes.capacity(), n, "filled in place, never moved");
    }

    #[test]
    fn downsampling_keeps_spikes() {
        let mut t = Timeline {
            reserved_bytes: (0..1000).map(|i| if i == 500 { 10_000 } else { i }).collect(),
            ..Timeline::default()
        };
        for c in
            [&mut t.allocated_bytes, &mut t.active_bytes, &mut t.pinned_free_bytes, &mut t.largest_free_block_bytes]
        {
            *c = vec![0; 1000];
        }
        t.time_us = vec![0; 1000];
        let d = t.downsample(0..1000, 10);
        assert_eq!(d.event.len(), 10);
        assert_eq!(d.max[0][5], 10_000, "the spike survives in its bucket's max");
        assert_eq!(d.min[0][0], 0);
        assert_eq!(d.max[0][9], 999);
    }

    /// Blocks change how many values a bucket reads, never its answer: any range, any number
    /// of points, columns of any length (partial last block included).
    #[test]
    fn block_extremes_give_the_same_buckets_as_a_full_scan() {
        let mut next = crate::testkit::xorshift(0x9e3779b97f4a7c15u64);
        for case in 0..300 {
            let n = (next() % 5000) as usize + 1;
            let cols: Vec<Vec<u64>> = (0..5).map(|_| (0..n).map(|_| next() % 1_000_000).collect()).collect();
            let time: Vec<i64> = (0..n as i64).collect();
            let ext: Vec<(Vec<u64>, Vec<u64>)> = cols.iter().map(|c| block_extremes(c)).collect();
            let columns: [&[u64]; 5] = std::array::from_fn(|s| cols[s].as_slice());
            let blocks: [Blocks; 5] =
                std::array::from_fn(|s| Blocks { min: Col::plain(&ext[s].0), max: Col::plain(&ext[s].1) });
            let (a, b) = ((next() as usize) % (n + 1), (next() as usize) % (n + 1));
            let range = a.min(b)..a.max(b);
            let points = (next() % 300) as usize + 1;
            let read = |blocks| {
                let series = columns.map(Col::plain);
                Columns { time: Col::plain(bytemuck::cast_slice(&time)), series, blocks }
                    .downsample(range.clone(), points)
            };
            let (full, fast) = (read(None), read(Some(blocks)));
            assert_eq!(
                (full.min, full.max, full.event),
                (fast.min, fast.max, fast.event),
                "case {case}: {range:?}/{points}"
            );
        }
    }
}
