//! Blobs and results in an object store (S3 and S3-compatible servers, GCS, Azure) through the
//! `object_store` crate, with a bounded local cache: what several replicas share.
//!
//! Layout under the URL's prefix: `blobs/ab/SHA256` (the upload as sent) and
//! `results/SHA256/FILE` (what `Results` writes locally, uploaded file by file once whole).
//! Readers need local files (the reader takes a `File`; timelines are memory-mapped), so a
//! replica fetches what it reads into `DATA/cache/` and drops the least recently used files
//! once the cache passes its size.
//!
//! Configured the standard way: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT` (an S3-compatible server) and `AWS_ALLOW_HTTP`; `GOOGLE_*` and `AZURE_*` alike.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod cache;

pub use cache::Cache;
use futures_util::StreamExt;
use object_store::path::Path as Key;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

/// Uploads larger than this go up in parts.
const SINGLE_PUT: u64 = 16 << 20;
const PART: usize = 16 << 20;

pub struct Remote {
    store: Arc<dyn ObjectStore>,
    pub cache: Cache,
}

fn err(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
        e => io::Error::other(e.to_string()),
    }
}

pub fn blob_key(sha256: &str) -> Key {
    Key::from(format!("blobs/{}/{sha256}", &sha256[..2]))
}

fn results_prefix(sha256: &str) -> Key {
    Key::from(format!("results/{sha256}"))
}

/// An upload on its way into the store while it is received (and hashed): written in parts
/// under a temporary key, made the blob by a copy once its hash is known.
pub struct Staging {
    key: Key,
    writer: WriteMultipart,
}

/// A received upload, whole in the store under its temporary key.
pub struct Staged {
    key: Key,
}

impl Staging {
    /// Sends a chunk (buffered into 16 MiB parts; waits while two parts are in flight).
    pub async fn write(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.writer.wait_for_capacity(2).await.map_err(err)?;
        self.writer.write(chunk);
        Ok(())
    }

    pub async fn finish(self) -> io::Result<Staged> {
        self.writer.finish().await.map_err(err)?;
        Ok(Staged { key: self.key })
    }

    /// Gives up an unfinished upload (its parts are dropped by the store).
    pub async fn abort(self) {
        let _ = self.writer.abort().await;
    }
}

impl Remote {
    /// Starts sending an upload as it arrives.
    pub async fn stage(&self) -> io::Result<Staging> {
        let key = Key::from(format!("uploads/{}", crate::store::random_id()));
        let upload = self.store.put_multipart(&key).await.map_err(err)?;
        Ok(Staging { key, writer: WriteMultipart::new_with_chunk_size(upload, PART) })
    }

    /// Removes a staged upload that will not be kept.
    pub async fn discard(&self, staged: Staged) {
        let _ = self.store.delete(&staged.key).await;
    }

    /// Makes a staged upload the blob `sha256` (a copy inside the store; none when those bytes
    /// are stored already), and keeps `temp` as the cached copy.
    pub async fn commit_staged(&self, staged: Staged, temp: &Path, sha256: &str) -> io::Result<()> {
        let key = blob_key(sha256);
        let copied = match self.store.head(&key).await {
            Ok(_) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => self.store.copy(&staged.key, &key).await.map_err(err),
            Err(e) => Err(err(e)),
        };
        let _ = self.store.delete(&staged.key).await;
        copied?;
        self.keep_cached(temp, sha256).await
    }

    /// Staged uploads older than `before` (a replica died before it committed them).
    pub async fn staged_before(&self, before: std::time::SystemTime) -> io::Result<Vec<Staged>> {
        Ok(self.keys_before("uploads", before).await?.into_iter().map(|key| Staged { key }).collect())
    }

    /// Keys under `prefix` last written before `before`.
    async fn keys_before(&self, prefix: &str, before: std::time::SystemTime) -> io::Result<Vec<Key>> {
        let before = before.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let mut out = Vec::new();
        let mut list = self.store.list(Some(&Key::from(prefix)));
        while let Some(m) = list.next().await {
            let m = m.map_err(err)?;
            if m.last_modified.timestamp() < before {
                out.push(m.location);
            }
        }
        Ok(out)
    }

    /// The store a URL names: `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`
    /// (and the other forms `object_store` knows), its credentials from the environment.
    pub fn from_url(url: &str, cache_dir: PathBuf, cache_bytes: u64) -> io::Result<Remote> {
        let parsed =
            url::Url::parse(url).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
        let bad = |e: object_store::Error| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}"));
        let bucket_url = format!("{}://{}", parsed.scheme(), parsed.host_str().unwrap_or(""));
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" | "s3a" => {
                Arc::new(object_store::aws::AmazonS3Builder::from_env().with_url(&bucket_url).build().map_err(bad)?)
            }
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(&bucket_url).build().map_err(bad)?,
            ),
            "az" | "azure" | "abfs" | "abfss" => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env().with_url(&bucket_url).build().map_err(bad)?,
            ),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a blob store is a folder or an s3://, gs:// or az:// URL, not {other}://"),
                ));
            }
        };
        let prefix = parsed.path().trim_matches('/');
        let store: Arc<dyn ObjectStore> =
            if prefix.is_empty() { store } else { Arc::new(PrefixStore::new(store, prefix.to_string())) };
        Ok(Remote { store, cache: Cache::new(cache_dir, cache_bytes)? })
    }

    /// Puts the finished upload at `temp` under its sha256 (bytes stored before are not sent
    /// again), then keeps `temp` as the cached copy.
    pub async fn commit(&self, temp: &Path, sha256: &str) -> io::Result<()> {
        let key = blob_key(sha256);
        match self.store.head(&key).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => self.put_file(temp, &key, PutMode::Create).await?,
            Err(e) => return Err(err(e)),
        }
        self.keep_cached(temp, sha256).await
    }

    async fn keep_cached(&self, temp: &Path, sha256: &str) -> io::Result<()> {
        let cached = self.cache.blob(sha256);
        if let Some(dir) = cached.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::rename(temp, &cached)?;
        self.cache.trim(&cached).await;
        Ok(())
    }

    /// Sends a local file: one request when small, else in parts. `Create` fails when the key
    /// exists: the same content (its key is its hash) arrived from another replica, which is
    /// success.
    async fn put_file(&self, file: &Path, key: &Key, mode: PutMode) -> io::Result<()> {
        let size = std::fs::metadata(file)?.len();
        if size <= SINGLE_PUT {
            let bytes = tokio::fs::read(file).await?;
            let options = PutOptions { mode, ..Default::default() };
            return match self.store.put_opts(key, PutPayload::from(bytes), options).await {
                Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(err(e)),
            };
        }
        let upload = self.store.put_multipart(key).await.map_err(err)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
        let mut f = tokio::fs::File::open(file).await?;
        let mut buf = vec![0u8; PART];
        loop {
            let n = tokio::io::AsyncReadExt::read(&mut f, &mut buf).await?;
            if n == 0 {
                break;
            }
            writer.wait_for_capacity(2).await.map_err(err)?;
            writer.write(&buf[..n]);
        }
        writer.finish().await.map_err(err)?;
        Ok(())
    }

    /// The cached copy of a blob, fetched first if this replica has none.
    pub async fn blob(&self, sha256: &str) -> io::Result<PathBuf> {
        let path = self.cache.blob(sha256);
        if path.exists() {
            self.cache.touch(&path);
            return Ok(path);
        }
        self.fetch(&blob_key(sha256), &path).await?;
        self.cache.trim(&path).await;
        Ok(path)
    }

    /// Downloads one object into a temp file beside `dest`, then renames it into place.
    async fn fetch(&self, key: &Key, dest: &Path) -> io::Result<()> {
        let dir = dest.parent().ok_or_else(|| io::Error::other("no parent"))?;
        std::fs::create_dir_all(dir)?;
        let temp = dir.join(format!(".{}.partial", crate::store::random_id()));
        let got = async {
            let mut stream = self.store.get(key).await.map_err(err)?.into_stream();
            let mut out = std::fs::File::create(&temp)?;
            while let Some(chunk) = stream.next().await {
                out.write_all(&chunk.map_err(err)?)?;
            }
            out.sync_all()?;
            std::fs::rename(&temp, dest)
        }
        .await;
        if got.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        got
    }

    /// Uploads the result folder written locally at `dir` (the analysis document last, so a
    /// folder with one is whole).
    pub async fn put_results(&self, sha256: &str, dir: &Path) -> io::Result<()> {
        let mut names: Vec<String> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort_by_key(|n| n == super::results::ANALYSIS);
        let prefix = results_prefix(sha256);
        for name in names {
            self.put_file(&dir.join(&name), &prefix.clone().join(name.as_str()), PutMode::Overwrite).await?;
        }
        Ok(())
    }

    /// Fetches a result folder into `dir` (whole, or not at all); NotFound when the store has
    /// no analysis document for it.
    pub async fn get_results(&self, sha256: &str, dir: &Path) -> io::Result<()> {
        let prefix = results_prefix(sha256);
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let names: Vec<String> = metas.iter().filter_map(|m| m.location.filename().map(str::to_string)).collect();
        if !names.iter().any(|n| n == super::results::ANALYSIS) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no stored results for {sha256}")));
        }
        let parent = dir.parent().ok_or_else(|| io::Error::other("no parent"))?;
        let temp = parent.join(format!(".{sha256}.partial-{}", crate::store::random_id()));
        let got = async {
            std::fs::create_dir_all(&temp)?;
            for name in &names {
                if super::results::safe_name(name) {
                    self.fetch(&prefix.clone().join(name.as_str()), &temp.join(name)).await?;
                }
            }
            match std::fs::rename(&temp, dir) {
                // Another request fetched the same folder meanwhile.
                Err(_) if dir.exists() => std::fs::remove_dir_all(&temp),
                other => other,
            }
        }
        .await;
        if got.is_err() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        got?;
        self.cache.trim(dir).await;
        Ok(())
    }

    /// Deletes a blob and its results, in the store and in the cache.
    pub async fn delete(&self, sha256: &str) -> io::Result<()> {
        let prefix = results_prefix(sha256);
        let keys: Vec<Key> =
            self.store.list(Some(&prefix)).filter_map(|m| async move { m.ok().map(|m| m.location) }).collect().await;
        for key in keys.iter().chain(std::iter::once(&blob_key(sha256))) {
            match self.store.delete(key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(err(e)),
            }
        }
        match std::fs::remove_file(self.cache.blob(sha256)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Blobs in the store last written before `before` (older ones only: a blob written just
    /// now may belong to an upload another replica is about to record).
    pub async fn blobs_before(&self, before: std::time::SystemTime) -> io::Result<Vec<String>> {
        let keys = self.keys_before("blobs", before).await?;
        Ok(keys
            .iter()
            .filter_map(|k| k.filename())
            .filter(|name| crate::store::valid_sha256(name))
            .map(str::to_string)
            .collect())
    }

    /// The store answers (a list of one key).
    pub async fn ping(&self) -> io::Result<()> {
        let mut list = self.store.list(Some(&Key::from("blobs")));
        match list.next().await {
            Some(Err(e)) => Err(err(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cache::trim;
    use super::*;

    #[test]
    fn the_cache_drops_the_least_recently_used_first_and_keeps_the_one_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().to_path_buf(), 250).unwrap();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let p = cache.blob(name);
            std::fs::write(&p, [0u8; 100]).unwrap();
            std::fs::File::open(&p).unwrap().set_modified(t0 + std::time::Duration::from_secs(i as u64)).unwrap();
        }
        // "a" is the oldest but in use: "b" goes instead.
        trim(dir.path(), 250, &cache.blob("a"));
        assert!(cache.blob("a").exists() && !cache.blob("b").exists() && cache.blob("c").exists());
    }
}
