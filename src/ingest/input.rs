//! The raw bytes on their way to the decoder: read, hashed and counted a chunk ahead on a
//! thread of their own ([`Prefetch`]), and a decompressor's output held to a ratio of its
//! input ([`RatioCap`]).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::IngestError;

/// Reads, hashes and counts the raw bytes on a thread of its own, one chunk ahead of the
/// decoder, so hashing and I/O overlap parsing (sha256 alone is a tenth of a big ingest).
pub(super) struct Prefetch {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    /// Spent buffers go back to the reading thread, so the same few pages are reused.
    spent: std::sync::mpsc::Sender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    done: Option<std::thread::JoinHandle<(Option<String>, u64)>>,
}

/// Bytes a chunk: small enough that the chunks in flight (the channel holds four) stay a
/// small part of the memory a read takes, big enough that the channel costs nothing.
pub(super) const CHUNK: usize = 256 << 10;

impl Prefetch {
    pub(super) fn start<R: Read + Send + 'static>(mut raw: R, progress: Option<Arc<AtomicU64>>, hash: bool) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let (spent_tx, spent_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let done = std::thread::spawn(move || {
            let (mut hasher, mut count) = (Sha256::new(), 0u64);
            loop {
                let mut buf = spent_rx.try_recv().unwrap_or_default();
                buf.resize(CHUNK, 0);
                let n = match read_full(&mut raw, &mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                };
                buf.truncate(n);
                if hash {
                    hasher.update(&buf);
                }
                count += n as u64;
                if let Some(p) = &progress {
                    p.store(count, Ordering::Relaxed);
                }
                // The decoder may stop early (STOP, an error): keep hashing to the end anyway.
                if n == 0 || tx.send(Ok(buf)).is_err() && n < CHUNK {
                    break;
                }
            }
            (hash.then(|| crate::units::hex(&hasher.finalize())), count)
        });
        Prefetch { chunks: rx, spent: spent_tx, current: Vec::new(), pos: 0, done: Some(done) }
    }

    /// Takes the next chunk from the reading thread (handing the spent one back); false at the
    /// end of the input.
    pub(super) fn next_chunk(&mut self) -> std::io::Result<bool> {
        match self.chunks.recv() {
            Ok(Ok(chunk)) => {
                let spent = std::mem::replace(&mut self.current, chunk);
                let _ = self.spent.send(spent);
                self.pos = 0;
                Ok(true)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// Drops the decoder's side and waits for the hash of the whole input.
    pub(super) fn finish(mut self) -> Result<(Option<String>, u64), IngestError> {
        let done = self.done.take().expect("finish once");
        drop(self);
        done.join().map_err(|_| IngestError::Io(std::io::Error::other("hashing thread failed")))
    }
}

pub(super) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// An input whose next bytes can be seen before they are read: the format is sniffed from them.
pub(super) trait Peek: Read {
    /// The next bytes, without consuming them (empty at the end of the input).
    fn peek(&mut self) -> std::io::Result<&[u8]>;
}

impl Peek for Prefetch {
    fn peek(&mut self) -> std::io::Result<&[u8]> {
        if self.pos == self.current.len() {
            self.next_chunk()?;
        }
        Ok(&self.current[self.pos..])
    }
}

impl<R: Read> Peek for std::io::BufReader<R> {
    fn peek(&mut self) -> std::io::Result<&[u8]> {
        std::io::BufRead::fill_buf(self)
    }
}

impl Read for Prefetch {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.current.len() && !self.next_chunk()? {
            return Ok(0);
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Stops a decompressor whose output outgrows its input by more than `max_ratio`.
pub(super) struct RatioCap<'a, R, H> {
    pub(super) inner: R,
    pub(super) raw: &'a H,
    pub(super) out: u64,
    pub(super) max_ratio: u64,
}

pub(super) trait RawCount {
    fn raw_bytes(&self) -> u64;
}

impl<'a, R: Read, H: RawCount> Read for RatioCap<'a, R, H> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out += n as u64;
        let allowed = self.raw.raw_bytes().saturating_mul(self.max_ratio).saturating_add(64 << 20);
        if self.out > allowed {
            return Err(std::io::Error::other(format!(
                "decompressed data grows past {}x its compressed size (a decompression bomb?)",
                self.max_ratio
            )));
        }
        Ok(n)
    }
}

/// The compressed side's count, shared with the ratio check through a cell.
pub(super) struct SharedCount(pub(super) std::cell::Cell<u64>);
impl RawCount for SharedCount {
    fn raw_bytes(&self) -> u64 {
        self.0.get()
    }
}

pub(super) struct Counted<'a, R> {
    pub(super) inner: R,
    pub(super) count: &'a SharedCount,
}
impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.0.set(self.count.0.get() + n as u64);
        Ok(n)
    }
}
