//! Uploaded files, content-addressed by sha256: in a local folder (the default) or in an
//! object store ([`Remote`]: S3, GCS, Azure), which replicas share.
//!
//! A blob appears whole or not at all: uploads are written to a temp file, synced, and then
//! renamed into place (or sent to the object store, which makes an object visible only once
//! complete), so a crash mid-write leaves only a temp file, removed at the next start.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::remote::{Remote, Staged};

/// Where blobs live.
pub enum Blobs {
    Local(LocalBlobs),
    Remote(Remote),
}

impl Blobs {
    /// Makes the finished file at `temp` the blob `sha256` (consuming `temp`, and the copy
    /// staged in the object store while it arrived, if any).
    pub async fn commit(&self, temp: PathBuf, staged: Option<Staged>, sha256: &str) -> io::Result<()> {
        match self {
            Blobs::Local(l) => {
                let (dir, sha) = (l.dir.clone(), sha256.to_string());
                tokio::task::spawn_blocking(move || LocalBlobs { dir }.commit(&temp, &sha)).await?
            }
            Blobs::Remote(r) => match staged {
                Some(staged) => r.commit_staged(staged, &temp, sha256).await,
                None => r.commit(&temp, sha256).await,
            },
        }
    }

    /// The blob, open at its start (fetched into the cache first when remote).
    pub async fn open(&self, sha256: &str) -> io::Result<File> {
        match self {
            Blobs::Local(l) => l.open(sha256),
            Blobs::Remote(r) => File::open(r.blob(sha256).await?),
        }
    }

    /// Deletes a blob (and, when remote, its results in the store).
    pub async fn delete(&self, sha256: &str) -> io::Result<()> {
        match self {
            Blobs::Local(l) => l.delete(sha256),
            Blobs::Remote(r) => r.delete(sha256).await,
        }
    }

    /// Stored blobs that may be removed when no snapshot refers to them: every local one (one
    /// server writes the folder); remote ones older than an hour (another replica may have
    /// stored one just now and not yet recorded its upload).
    pub async fn sweepable(&self) -> io::Result<Vec<String>> {
        match self {
            Blobs::Local(l) => l.list(),
            Blobs::Remote(r) => {
                r.blobs_before(std::time::SystemTime::now() - std::time::Duration::from_secs(3600)).await
            }
        }
    }

    /// The store answers (for `/readyz`).
    pub async fn ping(&self) -> io::Result<()> {
        match self {
            Blobs::Local(l) => {
                let m = std::fs::metadata(&l.dir)?;
                if m.is_dir() && !m.permissions().readonly() {
                    Ok(())
                } else {
                    Err(io::Error::other("not a writable folder"))
                }
            }
            Blobs::Remote(r) => r.ping().await,
        }
    }

    pub fn remote(&self) -> Option<&Remote> {
        match self {
            Blobs::Local(_) => None,
            Blobs::Remote(r) => Some(r),
        }
    }
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
        super::valid_sha256(sha256).then(|| self.dir.join(&sha256[..2]).join(sha256))
    }

    fn bad_key() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, "not a sha256")
    }

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
                    && self.path(name).is_some()
                {
                    out.push(name.to_string());
                }
            }
        }
        Ok(out)
    }
}
