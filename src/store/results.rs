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

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::analysis::Analysis;
use crate::analysis::timeline::{BLOCK, Blocks, Columns, Timeline, block_extremes};

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

fn write_timeline(path: &Path, t: &Timeline) -> io::Result<()> {
    let mut f = io::BufWriter::new(File::create(path)?);
    f.write_all(MAGIC)?;
    f.write_all(&2u32.to_le_bytes())?;
    f.write_all(&(t.len() as u64).to_le_bytes())?;
    for v in &t.time_us {
        f.write_all(&v.to_le_bytes())?;
    }
    for col in t.columns() {
        for v in col {
            f.write_all(&v.to_le_bytes())?;
        }
    }
    for col in t.columns() {
        let (min, max) = block_extremes(col);
        for v in min.iter().chain(&max) {
            f.write_all(&v.to_le_bytes())?;
        }
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// A timeline file, mapped into memory.
pub struct MappedTimeline {
    map: Mmap,
    n: usize,
    /// Version 2: the block extremes follow the columns.
    blocks: bool,
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
        let columns = n.checked_mul(8 * 6).ok_or_else(bad)?;
        let blocks = 5 * 2 * n.div_ceil(BLOCK) * 8;
        match version {
            1 if map.len() == HEADER + columns => Ok(MappedTimeline { map, n, blocks: false }),
            2 if map.len() == HEADER + columns + blocks => Ok(MappedTimeline { map, n, blocks: true }),
            _ => Err(bad()),
        }
    }

    pub fn len(&self) -> usize {
        self.n
    }

    fn column(&self, k: usize) -> &[u64] {
        let start = HEADER + k * self.n * 8;
        bytemuck::cast_slice(&self.map[start..start + self.n * 8])
    }

    /// Series `s`'s block minimums and maximums (version 2 files).
    fn blocks(&self, s: usize) -> Option<Blocks<'_>> {
        if !self.blocks {
            return None;
        }
        let nb = self.n.div_ceil(BLOCK);
        let start = HEADER + 6 * self.n * 8 + s * 2 * nb * 8;
        let min = bytemuck::cast_slice(&self.map[start..start + nb * 8]);
        let max = bytemuck::cast_slice(&self.map[start + nb * 8..start + 2 * nb * 8]);
        Some(Blocks { min, max })
    }

    /// The columns as stored, for [`Columns::downsample`].
    pub fn columns(&self) -> Columns<'_> {
        let time: &[i64] = bytemuck::cast_slice(self.column(0));
        let series = [self.column(1), self.column(2), self.column(3), self.column(4), self.column(5)];
        let blocks = (0..5).map(|s| self.blocks(s)).collect::<Option<Vec<_>>>();
        let blocks = blocks.and_then(|b| <[Blocks; 5]>::try_from(b).ok());
        Columns { time, series, blocks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_analysis() -> Analysis {
        let source = crate::snapshot::Source {
            bytes: 0,
            sha256: String::new(),
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

    /// Files of this version carry block extremes; files of version 1 (written before) still
    /// read, and both answer exactly as the in-memory timeline does.
    #[test]
    fn timeline_files_of_both_versions_read_back_the_same_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let results = Results::new(dir.path().to_path_buf()).unwrap();
        let t = timeline(10_007);
        let id = "a".repeat(64);
        results.write(&id, &written(&empty_analysis(), &t)).unwrap();
        let v2 = results.timeline(&id, 0).unwrap();
        assert!(v2.blocks(0).is_some());
        // A version 1 file: the same header and columns, without the blocks (under another
        // id: rewriting a mapped file in place is what results never do).
        let bytes = std::fs::read(dir.path().join(&id).join("timeline-0.bin")).unwrap();
        let old = "b".repeat(64);
        results.write(&old, &written(&empty_analysis(), &t)).unwrap();
        let path = dir.path().join(&old).join("timeline-0.bin");
        let mut v1 = bytes[..HEADER + 6 * 8 * t.len()].to_vec();
        v1[4..8].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(&path, &v1).unwrap();
        let v1 = results.timeline(&old, 0).unwrap();
        assert!(v1.blocks(0).is_none());
        for (range, points) in [(0..10_007, 1000), (0..10_007, 7), (63..9_000, 100), (5..6, 3), (129..4_000, 4_000)] {
            let want = t.downsample(range.clone(), points);
            assert_eq!(v2.columns().downsample(range.clone(), points), want, "{range:?}/{points}");
            assert_eq!(v1.columns().downsample(range.clone(), points), want, "{range:?}/{points}");
        }
        drop(v1);
        // A truncated file is refused, not misread.
        std::fs::write(&path, &bytes[..bytes.len() - 8]).unwrap();
        assert!(results.timeline(&old, 0).is_err());
    }
}
