//! What an analysis leaves on disk, per snapshot: the analysis document, each device's
//! timeline columns, and the segment maps a page opens first (the end, each OOM), so that after
//! a restart every link is served at once without parsing the upload again.
//!
//! A snapshot's results are written into a temp directory and renamed into place whole.
//! Timeline files are memory-mapped when read. Their format: `FSTL`, a u32 version, a u64
//! event count n, then n little-endian values per column: time_us (i64), then the series of
//! `analysis::timeline::SERIES` (u64).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::analysis::timeline::{Downsampled, Timeline, downsample};

#[cfg(target_endian = "big")]
compile_error!("timeline files are read in place as little-endian values");

const MAGIC: &[u8; 4] = b"FSTL";
const HEADER: usize = 16;

pub struct Results {
    dir: PathBuf,
}

/// Where a segment map is kept: the end, or right after an event.
pub fn map_name(device: i64, event: Option<u64>) -> String {
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

    fn path(&self, id: &str) -> PathBuf {
        debug_assert!(super::valid_id(id));
        self.dir.join(id)
    }

    /// Writes a snapshot's results: `files` are (name, bytes), `timelines` one per device.
    pub fn write(&self, id: &str, files: &[(String, Vec<u8>)], timelines: &[(i64, &Timeline)]) -> io::Result<()> {
        let temp = self.dir.join(format!(".{id}.partial-{}", super::random_id()));
        std::fs::create_dir_all(&temp)?;
        for (name, bytes) in files {
            std::fs::write(temp.join(name), bytes)?;
        }
        for (device, t) in timelines {
            write_timeline(&temp.join(format!("timeline-{device}.bin")), t)?;
        }
        File::open(&temp)?.sync_all()?;
        let dest = self.path(id);
        if dest.exists() {
            std::fs::remove_dir_all(&dest)?;
        }
        std::fs::rename(&temp, &dest)?;
        File::open(&self.dir)?.sync_all()
    }

    pub fn read(&self, id: &str, name: &str) -> io::Result<Vec<u8>> {
        std::fs::read(self.path(id).join(name))
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

    /// Ids that have results on disk.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            if let Some(name) = e?.file_name().to_str() {
                if super::valid_id(name) {
                    out.push(name.to_string());
                }
            }
        }
        Ok(out)
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

fn write_timeline(path: &Path, t: &Timeline) -> io::Result<()> {
    let mut f = io::BufWriter::new(File::create(path)?);
    f.write_all(MAGIC)?;
    f.write_all(&1u32.to_le_bytes())?;
    f.write_all(&(t.len() as u64).to_le_bytes())?;
    for v in &t.time_us {
        f.write_all(&v.to_le_bytes())?;
    }
    for col in t.columns() {
        for v in col {
            f.write_all(&v.to_le_bytes())?;
        }
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// A timeline file, mapped into memory.
pub struct MappedTimeline {
    map: Mmap,
    n: usize,
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
        let n = u64::from_le_bytes(map[8..16].try_into().map_err(|_| bad())?) as usize;
        if map.len() != HEADER + n * 8 * 6 {
            return Err(bad());
        }
        Ok(MappedTimeline { map, n })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn column(&self, k: usize) -> &[u64] {
        let start = HEADER + k * self.n * 8;
        bytemuck::cast_slice(&self.map[start..start + self.n * 8])
    }

    pub fn downsample(&self, range: std::ops::Range<usize>, points: usize) -> Downsampled {
        let time: &[i64] = bytemuck::cast_slice(self.column(0));
        let cols = [self.column(1), self.column(2), self.column(3), self.column(4), self.column(5)];
        downsample(time, cols, range, points)
    }
}
