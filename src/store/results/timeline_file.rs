//! Timeline files are memory-mapped when read. Their format: `FSTL`, a u32 version, a u64
//! event count n, then n little-endian values per column: time_us (i64), then the series of
//! `analysis::timeline::SERIES` (u64). Version 2 adds, per series, the minimum then the maximum
//! of each block of `analysis::timeline::BLOCK` events, so a read of the whole trace touches a
//! 64th of the values; version 1 files (written before) are still read, by full scans.
//!
//! Version 3 (written now) stores each column packed: after the header, six 16-byte entries
//! (base u64, shift u8, width u8, 6 zero bytes), then the six columns and the block extremes in
//! the same order as version 2, each value `width` bytes holding `(value - base) >> shift`,
//! each section padded to 8 bytes. Byte counts are multiples of 512 and times span minutes,
//! so most columns take 4 bytes a value instead of 8: a 3,000,000-event timeline is about
//! half the size, which is half the time to write it (what an upload waits for) and to store.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use memmap2::Mmap;

use crate::analysis::timeline::{BLOCK, Blocks, Col, Columns, Packed, Timeline, block_extremes};

#[cfg(target_endian = "big")]
compile_error!("timeline files are read in place as little-endian values");

pub(super) const MAGIC: &[u8; 4] = b"FSTL";
pub(super) const HEADER: usize = 16;

/// How a version 3 file stores one column: value `base + (stored << shift)`, `width` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) base: u64,
    pub(super) shift: u32,
    pub(super) width: usize,
}

/// Columns in a file: time, then the five series.
pub(super) const COLUMNS: usize = 6;
/// Bytes of one column's entry in a version 3 file's directory.
pub(super) const ENTRY: usize = 16;

impl Layout {
    /// The narrowest layout that holds `values` exactly; `signed`: they are i64s (times).
    ///
    /// One pass: the base is the least value (in i64 order for times, by flipping the sign
    /// bit), the width fits the greatest less the base, and the shift is how many low bits
    /// every value shares with the first (the same as with the base, which is one of them).
    pub(super) fn of(values: &[u64], signed: bool) -> Layout {
        let Some(&first) = values.first() else { return Layout { base: 0, shift: 0, width: 1 } };
        let flip = if signed { 1u64 << 63 } else { 0 };
        let (lo, hi, differ) = values.iter().fold((u64::MAX, 0u64, 0u64), |(lo, hi, differ), &v| {
            let k = v ^ flip;
            (lo.min(k), hi.max(k), differ | (v ^ first))
        });
        let shift = if differ == 0 { 0 } else { differ.trailing_zeros() };
        let width = match (hi - lo) >> shift {
            0..=0xff => 1,
            0x100..=0xffff => 2,
            0x1_0000..=0xffff_ffff => 4,
            _ => 8,
        };
        Layout { base: lo ^ flip, shift, width }
    }

    /// Writes `values` packed, then zeros up to a multiple of 8 bytes.
    pub(super) fn write(&self, f: &mut impl Write, values: &[u64]) -> io::Result<()> {
        // Converted a chunk at a time into a typed buffer the compiler vectorizes, and written
        // as its bytes (the files are little-endian, as this target is).
        fn packed<T: bytemuck::Pod>(f: &mut impl Write, values: &[u64], stored: impl Fn(u64) -> T) -> io::Result<()> {
            let mut buf: Vec<T> = Vec::with_capacity(16 << 10);
            for chunk in values.chunks(16 << 10) {
                buf.clear();
                buf.extend(chunk.iter().map(|&v| stored(v)));
                f.write_all(bytemuck::cast_slice(&buf))?;
            }
            Ok(())
        }
        let (base, shift) = (self.base, self.shift);
        let stored = move |v: u64| v.wrapping_sub(base) >> shift;
        match self.width {
            1 => packed(f, values, |v| stored(v) as u8)?,
            2 => packed(f, values, |v| stored(v) as u16)?,
            4 => packed(f, values, |v| stored(v) as u32)?,
            _ => packed(f, values, stored)?,
        }
        let pad = padded(values.len() * self.width) - values.len() * self.width;
        f.write_all(&[0; 8][..pad])
    }

    /// The column of `n` values at `bytes` (8-aligned in the mapping), if they fit.
    pub(super) fn col<'a>(&self, bytes: &'a [u8], n: usize) -> Option<Col<'a>> {
        let raw = bytes.get(..n.checked_mul(self.width)?)?;
        let packed = match self.width {
            1 => Packed::W1(raw),
            2 => Packed::W2(bytemuck::try_cast_slice(raw).ok()?),
            4 => Packed::W4(bytemuck::try_cast_slice(raw).ok()?),
            _ => Packed::W8(bytemuck::try_cast_slice(raw).ok()?),
        };
        Some(Col { packed, base: self.base, shift: self.shift })
    }
}

pub(super) fn padded(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8
}

pub(super) fn write_timeline(path: &Path, t: &Timeline) -> io::Result<()> {
    let time: &[u64] = bytemuck::cast_slice(&t.time_us);
    let series = t.columns();
    let columns: Vec<(&[u64], bool)> = std::iter::once((time, true)).chain(series.map(|c| (c, false))).collect();
    // Each column is a pass of its own, so the columns are shared between two threads: first
    // their layouts, then (every place in the file known from the layouts) their values.
    let layouts = on_two_threads(&columns, |&(values, signed)| Ok(Layout::of(values, signed)))?;
    let (n, blocks) = (t.len(), t.len().div_ceil(BLOCK));
    let mut at = (HEADER + COLUMNS * ENTRY) as u64;
    let mut places = Vec::with_capacity(COLUMNS);
    for l in &layouts {
        places.push(at);
        at += padded(n * l.width) as u64;
    }
    // Then each series' block minimums and maximums.
    let extremes: Vec<u64> = layouts[1..]
        .iter()
        .map(|l| {
            let place = at;
            at += 2 * padded(blocks * l.width) as u64;
            place
        })
        .collect();
    let file = File::create(path)?;
    let mut head = Vec::with_capacity(HEADER + COLUMNS * ENTRY);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(n as u64).to_le_bytes());
    for l in &layouts {
        let mut entry = [0u8; ENTRY];
        entry[..8].copy_from_slice(&l.base.to_le_bytes());
        (entry[8], entry[9]) = (l.shift as u8, l.width as u8);
        head.extend_from_slice(&entry);
    }
    At::new(&file, 0).write_all(&head)?;
    let jobs: Vec<usize> = (0..COLUMNS).collect();
    on_two_threads(&jobs, |&i| {
        let (l, values) = (layouts[i], columns[i].0);
        let mut f = io::BufWriter::with_capacity(256 << 10, At::new(&file, places[i]));
        l.write(&mut f, values)?;
        if i > 0 {
            let (min, max) = block_extremes(values);
            f.flush()?;
            *f.get_mut() = At::new(&file, extremes[i - 1]);
            l.write(&mut f, &min)?;
            l.write(&mut f, &max)?;
        }
        f.flush()
    })?;
    file.sync_all()
}

/// `job` of each of `items`, the odd ones on a second thread.
pub(super) fn on_two_threads<T: Sync, R: Send>(
    items: &[T],
    job: impl Fn(&T) -> io::Result<R> + Sync,
) -> io::Result<Vec<R>> {
    let (job, mut out) = (&job, Vec::with_capacity(items.len()));
    let (even, odd) = std::thread::scope(|scope| {
        let odd = scope.spawn(move || items.iter().skip(1).step_by(2).map(job).collect::<io::Result<Vec<R>>>());
        let even = items.iter().step_by(2).map(job).collect::<io::Result<Vec<R>>>();
        (even, odd.join().unwrap_or_else(|_| Err(io::Error::other("a thread writing the timeline failed"))))
    });
    let (mut even, mut odd) = (even?.into_iter(), odd?.into_iter());
    for i in 0..items.len() {
        out.extend(if i % 2 == 0 { even.next() } else { odd.next() });
    }
    Ok(out)
}

/// Writes at a place of a file that several threads write at once (`pwrite`), and starts
/// the writeback of every few MiB written, so that the sync at the end waits for little.
pub(super) struct At<'a> {
    file: &'a File,
    pos: u64,
    unsent: u64,
}

impl<'a> At<'a> {
    fn new(file: &'a File, pos: u64) -> At<'a> {
        At { file, pos, unsent: pos }
    }
}

/// Bytes between starts of writeback.
pub(super) const WRITEBACK: u64 = 4 << 20;

impl Write for At<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::write_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        if self.pos - self.unsent >= WRITEBACK {
            super::super::start_writeback(self.file, self.unsent, self.pos - self.unsent);
            self.unsent = self.pos;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a mapped file holds its columns.
enum Format {
    /// Versions 1 and 2: plain 8-byte values; version 2 with block extremes.
    Plain { blocks: bool },
    /// Version 3: packed columns and block extremes.
    Packed(Vec<Layout>),
}

/// A timeline file, mapped into memory.
pub struct MappedTimeline {
    map: Mmap,
    n: usize,
    format: Format,
}

impl MappedTimeline {
    pub(super) fn open(path: &Path) -> io::Result<MappedTimeline> {
        let file = File::open(path)?;
        // SAFETY: results files are written once, whole, before being renamed into place, and
        // never modified; deleting one leaves the mapping valid.
        let map = unsafe { Mmap::map(&file)? };
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "corrupt timeline file");
        if map.len() < HEADER || &map[..4] != MAGIC {
            return Err(bad());
        }
        let version = u32::from_le_bytes(map[4..8].try_into().map_err(|_| bad())?);
        let n = usize::try_from(u64::from_le_bytes(map[8..16].try_into().map_err(|_| bad())?)).map_err(|_| bad())?;
        let nb = n.div_ceil(BLOCK);
        let format = match version {
            1 | 2 => {
                let columns = n.checked_mul(8 * COLUMNS).ok_or_else(bad)?;
                let blocks = 5 * 2 * nb * 8;
                match version {
                    1 if map.len() == HEADER + columns => Format::Plain { blocks: false },
                    2 if Some(map.len()) == columns.checked_add(HEADER + blocks) => Format::Plain { blocks: true },
                    _ => return Err(bad()),
                }
            }
            3 => {
                let layouts = read_layouts(&map).ok_or_else(bad)?;
                let size = |width: usize, count: usize| count.checked_mul(width).map(padded);
                let mut total = Some(HEADER + COLUMNS * ENTRY);
                for (k, l) in layouts.iter().enumerate() {
                    let blocks = if k == 0 { Some(0) } else { size(l.width, nb).and_then(|b| b.checked_mul(2)) };
                    total = total.and_then(|t| t.checked_add(size(l.width, n)?)?.checked_add(blocks?));
                }
                if total != Some(map.len()) {
                    return Err(bad());
                }
                Format::Packed(layouts)
            }
            _ => return Err(bad()),
        };
        let mapped = MappedTimeline { map, n, format };
        // Every column and block view must exist, so that reads never fail.
        if let Format::Packed(_) = mapped.format {
            mapped.packed_columns().ok_or_else(bad)?;
        }
        Ok(mapped)
    }

    pub fn len(&self) -> usize {
        self.n
    }

    /// Column `k` of a version 1 or 2 file.
    fn plain_column(&self, k: usize) -> &[u64] {
        let start = HEADER + k * self.n * 8;
        bytemuck::cast_slice(&self.map[start..start + self.n * 8])
    }

    /// Series `s`'s block minimums and maximums in a version 2 file.
    fn plain_blocks(&self, s: usize) -> Blocks<'_> {
        let nb = self.n.div_ceil(BLOCK);
        let start = HEADER + COLUMNS * self.n * 8 + s * 2 * nb * 8;
        let min = bytemuck::cast_slice(&self.map[start..start + nb * 8]);
        let max = bytemuck::cast_slice(&self.map[start + nb * 8..start + 2 * nb * 8]);
        Blocks { min: Col::plain(min), max: Col::plain(max) }
    }

    /// The columns of a version 3 file (None if the file is shorter than its directory says).
    fn packed_columns(&self) -> Option<Columns<'_>> {
        let Format::Packed(layouts) = &self.format else { return None };
        let (n, nb) = (self.n, self.n.div_ceil(BLOCK));
        let mut at = HEADER + COLUMNS * ENTRY;
        let mut take = |l: &Layout, count: usize| {
            let col = l.col(self.map.get(at..)?, count)?;
            at += padded(count * l.width);
            Some(col)
        };
        let time = take(&layouts[0], n)?;
        let mut series = Vec::with_capacity(5);
        for l in &layouts[1..] {
            series.push(take(l, n)?);
        }
        let mut blocks = Vec::with_capacity(5);
        for l in &layouts[1..] {
            blocks.push(Blocks { min: take(l, nb)?, max: take(l, nb)? });
        }
        Some(Columns { time, series: series.try_into().ok()?, blocks: Some(blocks.try_into().ok()?) })
    }

    /// The columns as stored, for [`Columns::downsample`].
    pub fn columns(&self) -> Columns<'_> {
        match self.format {
            Format::Plain { blocks } => Columns {
                time: Col::plain(self.plain_column(0)),
                series: std::array::from_fn(|s| Col::plain(self.plain_column(s + 1))),
                blocks: blocks.then(|| std::array::from_fn(|s| self.plain_blocks(s))),
            },
            // `open` checked that they exist.
            Format::Packed(_) => self.packed_columns().expect("checked when opened"),
        }
    }
}

/// A version 3 file's directory; None if an entry is not one it writes.
pub(super) fn read_layouts(map: &[u8]) -> Option<Vec<Layout>> {
    let dir = map.get(HEADER..HEADER + COLUMNS * ENTRY)?;
    dir.chunks_exact(ENTRY)
        .map(|e| {
            let base = u64::from_le_bytes(e[..8].try_into().ok()?);
            let (shift, width) = (e[8] as u32, e[9] as usize);
            let ok = shift < 64 && matches!(width, 1 | 2 | 4 | 8) && e[10..].iter().all(|&b| b == 0);
            ok.then_some(Layout { base, shift, width })
        })
        .collect()
}
