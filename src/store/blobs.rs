//! Uploaded files, content-addressed by sha256, behind [`BlobStore`] so that an object store
//! (S3, GCS, Azure through the `object_store` crate) can replace the local directory.
//!
//! A blob appears whole or not at all: uploads are written to a temp file, synced, and then
//! renamed into place, so a crash mid-write leaves only a temp file, removed at the next start.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub trait BlobStore: Send + Sync {
    /// Makes the finished file at `temp` the blob `sha256` (consuming `temp`).
    fn commit(&self, temp: &Path, sha256: &str) -> io::Result<()>;
    fn open(&self, sha256: &str) -> io::Result<File>;
    fn delete(&self, sha256: &str) -> io::Result<()>;
    /// Every stored blob, for removing those no snapshot refers to.
    fn list(&self) -> io::Result<Vec<String>>;
}

/// Blobs under `DIR/ab/abcdef...` (the first two hex digits spread the files).
pub struct LocalBlobs {
    dir: PathBuf,
}

impl LocalBlobs {
    pub fn new(dir: PathBuf) -> io::Result<LocalBlobs> {
        std::fs::create_dir_all(&dir)?;
        Ok(LocalBlobs { dir })
    }

    /// The path of a blob; `None` unless `sha256` is 64 hex digits, so no request can name a
    /// path outside the directory.
    fn path(&self, sha256: &str) -> Option<PathBuf> {
        let ok = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        ok.then(|| self.dir.join(&sha256[..2]).join(sha256))
    }

    fn bad_key() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, "not a sha256")
    }
}

impl BlobStore for LocalBlobs {
    fn commit(&self, temp: &Path, sha256: &str) -> io::Result<()> {
        let path = self.path(sha256).ok_or_else(Self::bad_key)?;
        let parent = path.parent().ok_or_else(Self::bad_key)?;
        std::fs::create_dir_all(parent)?;
        File::open(temp)?.sync_all()?;
        std::fs::rename(temp, &path)?;
        File::open(parent)?.sync_all()
    }

    fn open(&self, sha256: &str) -> io::Result<File> {
        File::open(self.path(sha256).ok_or_else(Self::bad_key)?)
    }

    fn delete(&self, sha256: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(sha256).ok_or_else(Self::bad_key)?) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for shard in std::fs::read_dir(&self.dir)? {
            let shard = shard?;
            if !shard.file_type()?.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(shard.path())? {
                if let Some(name) = f?.file_name().to_str()
                    && self.path(name).is_some() {
                        out.push(name.to_string());
                    }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_are_not_hashes_reach_no_path() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::new(dir.path().to_path_buf()).unwrap();
        assert!(blobs.open("../../etc/passwd").is_err());
        assert!(blobs.path(&"A".repeat(64)).is_none());
        let sha = "ab".repeat(32);
        let temp = dir.path().join("t.part");
        std::fs::write(&temp, b"data").unwrap();
        blobs.commit(&temp, &sha).unwrap();
        assert!(!temp.exists());
        assert_eq!(blobs.list().unwrap(), vec![sha.clone()]);
        blobs.delete(&sha).unwrap();
        assert!(blobs.list().unwrap().is_empty());
    }
}
