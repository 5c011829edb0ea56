//! What an analysis leaves on disk, per uploaded content (keyed by its sha256: the same bytes
//! uploaded twice are analysed once): the analysis document, each device's
//! timeline columns, and the segment maps a page opens first (the end, each OOM), so that after
//! a restart every link is served at once without parsing the upload again.
//!
//! A snapshot's results are written into a temp directory, each file synced, and renamed into
//! place whole; a failed write leaves nothing behind.
//! Timeline files are memory-mapped when read; their format is in `timeline_file`.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::analysis::Analysis;
use crate::analysis::timeline::Timeline;

mod timeline_file;

pub use timeline_file::MappedTimeline;
use timeline_file::write_timeline;

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

#[cfg(test)]
mod tests {
    use super::timeline_file::*;
    use super::*;
    use crate::analysis::timeline::block_extremes;

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
