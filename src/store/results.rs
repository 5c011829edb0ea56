//! What an analysis leaves on disk, per uploaded content (keyed by its sha256: the same bytes
//! uploaded twice are analysed once): the analysis document, each device's
//! timeline columns, and the segment maps a page opens first (the end, each OOM), so that after
//! a restart every link is served at once without parsing the upload again.
//!
//! A snapshot's results are written into a temp directory, each file synced, and renamed into
//! place whole; a failed write leaves nothing behind.
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
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::analysis::Analysis;
use crate::analysis::timeline::{BLOCK, Blocks, Col, Columns, Packed, Timeline, block_extremes};

#[cfg(target_endian = "big")]
compile_error!("timeline files are read in place as little-endian values");

const MAGIC: &[u8; 4] = b"FSTL";
const HEADER: usize = 16;

pub struct Results {
    dir: PathBuf,
}

/// The analysis document's file name.
pub(super) const ANALYSIS: &str = "analysis.json";

/// A file name a result folder may hold (what arrives from an object store is checked).
pub(super) fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 100
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.starts_with('.')
}

/// What one analysis leaves: the document, the segment maps a page opens first (device, the
/// event they follow or None for the end, JSON bytes), one timeline per device.
pub struct Written<'a> {
    pub analysis: &'a Analysis,
    pub maps: Vec<(i64, Option<u64>, Vec<u8>)>,
    pub timelines: Vec<(i64, &'a Timeline)>,
}

/// Where a segment map is kept: the end, or right after an event.
fn map_name(device: i64, event: Option<u64>) -> String {
    match event {
        Some(e) => format!("map-{device}-{e}.json"),
        None => format!("map-{device}-final.json"),
    }
}

impl Results {
    pub fn new(dir: PathBuf) -> io::Result<Results> {
        std::fs::create_dir_all(&dir)?;
        Ok(Results { dir })
    }

    /// The folder of one content's results (it may not exist).
    pub fn path(&self, key: &str) -> PathBuf {
        debug_assert!(super::valid_sha256(key));
        self.dir.join(key)
    }

    /// Writes the results of the content `key` whole: into a temp directory, renamed into place.
    pub fn write(&self, key: &str, w: &Written) -> io::Result<()> {
        let temp = self.dir.join(format!(".{key}.partial-{}", super::random_id()));
        let written = write_all(&temp, w).and_then(|()| {
            let dest = self.path(key);
            if dest.exists() {
                std::fs::remove_dir_all(&dest)?;
            }
            std::fs::rename(&temp, &dest)?;
            File::open(&self.dir)?.sync_all()
        });
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        written
    }

    /// True when the results of `key` are on this machine.
    pub fn has(&self, key: &str) -> bool {
        self.path(key).join(ANALYSIS).exists()
    }

    /// The analysis document as stored (the API serves these bytes as they are).
    pub fn analysis_bytes(&self, id: &str) -> io::Result<Vec<u8>> {
        std::fs::read(self.path(id).join(ANALYSIS))
    }

    /// The analysis document, typed.
    pub fn analysis(&self, id: &str) -> Result<Analysis, super::StoreError> {
        let bytes = self.analysis_bytes(id)?;
        serde_json::from_slice(&bytes).map_err(|e| super::StoreError::Corrupt(format!("{ANALYSIS} of {id}: {e}")))
    }

    /// A segment map stored at analysis time (the end, or right after an OOM), if there is one.
    pub fn map(&self, id: &str, device: i64, event: Option<u64>) -> io::Result<Vec<u8>> {
        std::fs::read(self.path(id).join(map_name(device, event)))
    }

    pub fn timeline(&self, id: &str, device: i64) -> io::Result<MappedTimeline> {
        MappedTimeline::open(&self.path(id).join(format!("timeline-{device}.bin")))
    }

    pub fn delete(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_dir_all(self.path(id)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Names of the result folders on disk: sha256 keys, and the snapshot ids that keyed them
    /// before (see [`Results::rekey`]).
    pub fn keys(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            if let Some(name) = e?.file_name().to_str()
                && (super::valid_sha256(name) || super::valid_id(name))
            {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Moves results kept under a snapshot id (before uploads had their own ids) to their
    /// content's key; drops them when that key has results already.
    pub fn rekey(&self, id: &str, key: &str) -> io::Result<()> {
        debug_assert!(super::valid_id(id));
        let (from, to) = (self.dir.join(id), self.path(key));
        if to.exists() { std::fs::remove_dir_all(from) } else { std::fs::rename(from, to) }
    }

    /// Removes a folder [`Results::keys`] listed.
    pub fn delete_folder(&self, name: &str) -> io::Result<()> {
        if super::valid_sha256(name) || super::valid_id(name) {
            std::fs::remove_dir_all(self.dir.join(name))?;
        }
        Ok(())
    }

    /// Removes half-written results (a crash during a write).
    pub fn clean_partial(&self) -> io::Result<()> {
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().contains(".partial-") {
                std::fs::remove_dir_all(e.path())?;
            }
        }
        Ok(())
    }
}

/// Writes every file of a result folder and syncs each, then the folder.
fn write_all(temp: &Path, w: &Written) -> io::Result<()> {
    std::fs::create_dir_all(temp)?;
    let doc = serde_json::to_vec(w.analysis).map_err(io::Error::other)?;
    write_synced(&temp.join(ANALYSIS), &doc)?;
    for (device, event, bytes) in &w.maps {
        write_synced(&temp.join(map_name(*device, *event)), bytes)?;
    }
    for (device, t) in &w.timelines {
        write_timeline(&temp.join(format!("timeline-{device}.bin")), t)?;
    }
    File::open(temp)?.sync_all()
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// How a version 3 file stores one column: value `base + (stored << shift)`, `width` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    base: u64,
    shift: u32,
    width: usize,
}

/// Columns in a file: time, then the five series.
const COLUMNS: usize = 6;
/// Bytes of one column's entry in a version 3 file's directory.
const ENTRY: usize = 16;

impl Layout {
    /// The narrowest layout that holds `values` exactly; `signed`: they are i64s (times).
    ///
    /// One pass: the base is the least value (in i64 order for times, by flipping the sign
    /// bit), the width fits the greatest less the base, and the shift is how many low bits
    /// every value shares with the first (the same as with the base, which is one of them).
    fn of(values: &[u64], signed: bool) -> Layout {
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
    fn write(&self, f: &mut impl Write, values: &[u64]) -> io::Result<()> {
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
    fn col<'a>(&self, bytes: &'a [u8], n: usize) -> Option<Col<'a>> {
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

fn padded(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8
}

fn write_timeline(path: &Path, t: &Timeline) -> io::Result<()> {
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
fn on_two_threads<T: Sync, R: Send>(items: &[T], job: impl Fn(&T) -> io::Result<R> + Sync) -> io::Result<Vec<R>> {
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
struct At<'a> {
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
const WRITEBACK: u64 = 4 << 20;

impl Write for At<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::write_at(self.file, buf, self.pos)?;
        self.pos += n as u64;
        if self.pos - self.unsent >= WRITEBACK {
            super::start_writeback(self.file, self.unsent, self.pos - self.unsent);
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
    fn open(path: &Path) -> io::Result<MappedTimeline> {
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
fn read_layouts(map: &[u8]) -> Option<Vec<Layout>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_analysis() -> Analysis {
        let source = crate::snapshot::Source {
            bytes: 0,
            sha256: None,
            encoding: "pickle".into(),
            compression: "none".into(),
            pickle_protocol: None,
        };
        Analysis { source, allocator_settings: None, annotations: vec![], warnings: vec![], devices: vec![] }
    }

    fn written<'a>(analysis: &'a Analysis, t: &'a Timeline) -> Written<'a> {
        Written { analysis, maps: vec![], timelines: vec![(0, t)] }
    }

    fn timeline(n: usize) -> Timeline {
        let mut t = Timeline::default();
        let v = |k: u64| (0..n as u64).map(|i| (i * 7919 + k * 104729) % 100_003).collect::<Vec<u64>>();
        (t.reserved_bytes, t.allocated_bytes, t.active_bytes) = (v(1), v(2), v(3));
        (t.pinned_free_bytes, t.largest_free_block_bytes) = (v(4), v(5));
        t.time_us = (0..n as i64).collect();
        t
    }

    /// A file of version 1 or 2 (written before), as those versions wrote it.
    fn plain_file(t: &Timeline, version: u32) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(version.to_le_bytes());
        out.extend((t.len() as u64).to_le_bytes());
        out.extend(t.time_us.iter().flat_map(|v| v.to_le_bytes()));
        for col in t.columns() {
            out.extend(col.iter().flat_map(|v| v.to_le_bytes()));
        }
        if version == 2 {
            for col in t.columns() {
                let (min, max) = block_extremes(col);
                out.extend(min.iter().chain(&max).flat_map(|v| v.to_le_bytes()));
            }
        }
        out
    }

    /// Writes `t` under `id` as this version writes it, then replaces its file with `bytes`
    /// when given; the mapped file (or why it was refused).
    fn stored(results: &Results, id: &str, t: &Timeline, bytes: Option<&[u8]>) -> io::Result<MappedTimeline> {
        results.write(id, &written(&empty_analysis(), t)).unwrap();
        if let Some(bytes) = bytes {
            std::fs::write(results.path(id).join("timeline-0.bin"), bytes).unwrap();
        }
        results.timeline(id, 0)
    }

    /// Files of every version answer exactly as the in-memory timeline does: version 3
    /// (written now, packed, with block extremes), and versions 2 and 1 (written before).
    #[test]
    fn timeline_files_of_every_version_read_back_the_same_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let results = Results::new(dir.path().to_path_buf()).unwrap();
        let t = timeline(10_007);
        let v3 = stored(&results, &"a".repeat(64), &t, None).unwrap();
        assert!(v3.columns().blocks.is_some());
        let v2 = stored(&results, &"b".repeat(64), &t, Some(&plain_file(&t, 2))).unwrap();
        assert!(v2.columns().blocks.is_some());
        let v1 = stored(&results, &"c".repeat(64), &t, Some(&plain_file(&t, 1))).unwrap();
        assert!(v1.columns().blocks.is_none());
        for (range, points) in [(0..10_007, 1000), (0..10_007, 7), (63..9_000, 100), (5..6, 3), (129..4_000, 4_000)] {
            let want = t.downsample(range.clone(), points);
            for (version, file) in [(3, &v3), (2, &v2), (1, &v1)] {
                assert_eq!(file.columns().downsample(range.clone(), points), want, "v{version} {range:?}/{points}");
            }
        }
        // A truncated file of any version is refused, not misread.
        for (id, bytes) in [("d", plain_file(&t, 2)), ("e", plain_file(&t, 1))] {
            assert!(stored(&results, &id.repeat(64), &t, Some(&bytes[..bytes.len() - 8])).is_err(), "{id}");
        }
        let packed = std::fs::read(results.path(&"a".repeat(64)).join("timeline-0.bin")).unwrap();
        assert!(stored(&results, &"f".repeat(64), &t, Some(&packed[..packed.len() - 8])).is_err());
    }

    /// Byte counts torch reports (multiples of 512) and times a few minutes apart take 4 bytes
    /// a value or fewer, so the file is at most 60% of the plain one; values that need all 64
    /// bits, odd values, negative times and `NO_TIME` round-trip exactly.
    #[test]
    fn packed_columns_are_narrow_and_exact() {
        let dir = tempfile::tempdir().unwrap();
        let results = Results::new(dir.path().to_path_buf()).unwrap();
        let n = 5_000usize;
        let mut torch_like = Timeline::default();
        let step = |k: u64| (0..n as u64).map(|i| ((i * 7919 + k * 104_729) % 60_000) * 512).collect::<Vec<u64>>();
        (torch_like.reserved_bytes, torch_like.allocated_bytes, torch_like.active_bytes) = (step(1), step(2), step(3));
        (torch_like.pinned_free_bytes, torch_like.largest_free_block_bytes) = (vec![0; n], step(5));
        torch_like.time_us = (0..n as i64).map(|i| 1_700_000_000_000_000 + i * 40_000).collect();
        let mut wild = Timeline::default();
        let odd = |k: u64| (0..n as u64).map(|i| (i * 0x9e37_79b9_7f4a_7c15).rotate_left(k as u32) | 1).collect();
        (wild.reserved_bytes, wild.allocated_bytes, wild.active_bytes) = (odd(1), odd(2), vec![u64::MAX; n]);
        (wild.pinned_free_bytes, wild.largest_free_block_bytes) = ((0..n as u64).map(|i| i % 3).collect(), odd(5));
        wild.time_us = (0..n as i64).map(|i| if i % 7 == 0 { crate::snapshot::NO_TIME } else { -i * 1_000 }).collect();
        for (name, t) in [("torch-like", &torch_like), ("wild", &wild), ("empty", &Timeline::default())] {
            let id = format!("{:0>64}", name.len());
            let file = stored(&results, &id, t, None).unwrap();
            let size = std::fs::metadata(results.path(&id).join("timeline-0.bin")).unwrap().len() as usize;
            let plain = plain_file(t, 2).len();
            if name == "torch-like" {
                assert!(size * 10 <= plain * 6, "{name}: {size} bytes against {plain} plain");
            }
            let c = file.columns();
            assert_eq!(c.time.len(), t.len(), "{name}");
            for i in 0..t.len() {
                assert_eq!(c.time.get(i) as i64, t.time_us[i], "{name}: time {i}");
                for (s, col) in t.columns().iter().enumerate() {
                    assert_eq!(c.series[s].get(i), col[i], "{name}: series {s} at {i}");
                }
            }
            for points in [1, 13, 700] {
                assert_eq!(c.downsample(0..t.len(), points), t.downsample(0..t.len(), points), "{name}/{points}");
            }
        }
    }

    /// The one-pass layout is the one its definition gives: the least value as base, the
    /// shift of the bits any value sets above it, the width of the largest shifted.
    #[test]
    fn layouts_are_the_narrowest_by_definition() {
        let defined = |values: &[u64], signed: bool| {
            let base = if signed {
                values.iter().map(|&v| v as i64).min().map_or(0, |m| m as u64)
            } else {
                values.iter().copied().min().unwrap_or(0)
            };
            let bits = values.iter().fold(0, |b, &v| b | v.wrapping_sub(base));
            let shift = if bits == 0 { 0 } else { bits.trailing_zeros() };
            let top = values.iter().map(|&v| v.wrapping_sub(base) >> shift).max().unwrap_or(0);
            let width = [1usize, 2, 4, 8].into_iter().find(|&w| w == 8 || top < 1 << (8 * w)).unwrap();
            Layout { base, shift, width }
        };
        let mut next = crate::testkit::xorshift(0x2545_f491_4f6c_dd1du64);
        let mut cases: Vec<Vec<u64>> =
            vec![vec![], vec![7], vec![u64::MAX, 0], vec![(-5i64) as u64, 3, i64::MIN as u64]];
        for _ in 0..400 {
            let (n, shift, span) = (next() % 50 + 1, next() % 20, 1u64 << (next() % 64));
            let offset = next();
            cases.push((0..n).map(|_| offset.wrapping_add((next() % span) << shift)).collect());
        }
        for values in &cases {
            for signed in [false, true] {
                assert_eq!(Layout::of(values, signed), defined(values, signed), "{values:?} signed {signed}");
            }
        }
    }

    /// A directory entry version 3 never writes (a width of 3, a shift past 63, stray bytes)
    /// is refused when the file is opened.
    #[test]
    fn packed_files_with_a_bad_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let results = Results::new(dir.path().to_path_buf()).unwrap();
        let t = timeline(300);
        stored(&results, &"a".repeat(64), &t, None).unwrap();
        let bytes = std::fs::read(results.path(&"a".repeat(64)).join("timeline-0.bin")).unwrap();
        let cases = [(HEADER + 9, 3u8), (HEADER + ENTRY + 8, 64), (HEADER + 2 * ENTRY + 12, 1)];
        for (k, &(at, value)) in cases.iter().enumerate() {
            let mut b = bytes.clone();
            b[at] = value;
            assert!(stored(&results, &format!("{k:0>64}"), &t, Some(&b)).is_err(), "case {k}");
        }
    }
}
