//! The bounded local cache of remote blobs and results: readers need local files, and the
//! least recently used go once the cache passes its size.

use std::io;
use std::path::{Path, PathBuf};

/// Local copies of remote blobs and results, at most `max_bytes` together; the least recently
/// used go first (a file's modification time is set when it is used).
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    trimming: tokio::sync::Mutex<()>,
}

impl Cache {
    pub(super) fn new(dir: PathBuf, max_bytes: u64) -> io::Result<Cache> {
        std::fs::create_dir_all(dir.join("blobs"))?;
        std::fs::create_dir_all(dir.join("results"))?;
        Ok(Cache { dir, max_bytes, trimming: tokio::sync::Mutex::new(()) })
    }

    pub fn results_dir(&self) -> PathBuf {
        self.dir.join("results")
    }

    pub(super) fn blob(&self, sha256: &str) -> PathBuf {
        self.dir.join("blobs").join(sha256)
    }

    /// The blobs cached here, by sha256.
    pub fn blob_keys(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join("blobs"))? {
            if let Some(name) = e?.file_name().to_str()
                && crate::store::valid_sha256(name)
            {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Removes a cached blob.
    pub fn remove_blob(&self, sha256: &str) -> io::Result<()> {
        match std::fs::remove_file(self.blob(sha256)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Marks a file or folder used now.
    pub fn touch(&self, path: &Path) {
        if let Ok(f) = std::fs::File::open(path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }

    /// Drops the least recently used entries until the cache fits, never `keep` (just used).
    pub async fn trim(&self, keep: &Path) {
        let _one = self.trimming.lock().await;
        let (dir, max, keep) = (self.dir.clone(), self.max_bytes, keep.to_path_buf());
        let _ = tokio::task::spawn_blocking(move || trim(&dir, max, &keep)).await;
    }
}

pub(super) fn size(path: &Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(path).map(|rd| rd.filter_map(|e| e.ok()).map(|e| size(&e.path())).sum()).unwrap_or(0)
        }
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

pub(super) fn trim(dir: &Path, max: u64, keep: &Path) {
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = ["blobs", "results"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(dir.join(sub)).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let p = e.path();
            let t = std::fs::metadata(&p).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
            (t, size(&p), p)
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, bytes, path) in entries {
        if total <= max {
            break;
        }
        if path == keep {
            continue;
        }
        let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        if gone.is_ok() {
            total -= bytes;
        }
    }
}
