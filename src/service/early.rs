//! Parsing an upload while it arrives, so that its analysis is ready moments after the last
//! byte instead of a whole parse later.
//!
//! The upload handler feeds each chunk it writes to the temp file into a channel as well; a
//! blocking task reads the channel as the reader's input (the same `ingest` as for a file, so
//! the same limits and messages) and analyses the result. Nothing is written or recorded from
//! here: once the upload is admitted as new bytes, the worker adopts the prepared analysis,
//! checks that it was made from the same bytes (the hash), and writes it like its own. If
//! anything differs (the parse failed, the upload was refused, a duplicate, another replica
//! claimed the job), the early work is dropped and the normal path decides, so the outcome
//! never depends on this shortcut.
//!
//! It runs only when the budget allows it now: a free analysis slot and the memory a plain
//! pickle of the announced size needs (`Content-Length`). Compressed uploads are not fed (they
//! unpack to many times their size), nor uploads arriving slower than 8 MiB/s (they would
//! hold the slot idle); those are analysed after arriving, as before, by a worker with a slot.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::{Buf, Bytes};
use tokio::sync::{Semaphore, mpsc};

use super::budget::{Budget, Charged, Held};
use super::prepare::{Parse, Prepared, parse_and_prepare};

/// What a parse while arriving gives: the analysis, and the memory it holds until written.
type Done = Result<(Prepared, Held), super::prepare::AnalysisError>;

/// Chunks waiting for the parser; when it falls behind, the upload waits (bounded memory).
const QUEUED_CHUNKS: usize = 64;

/// An upload being parsed as it arrives.
pub struct Early {
    feed: Option<Feed>,
    cancel: Arc<AtomicBool>,
    done: Option<tokio::task::JoinHandle<Done>>,
    /// Raw bytes the parse has consumed (the status's progress).
    pub(super) progress: Arc<AtomicU64>,
}

/// The upload handler's end: where each received chunk goes.
pub struct Feed {
    tx: mpsc::Sender<Bytes>,
    cancel: Arc<AtomicBool>,
    started: std::time::Instant,
    bytes: u64,
}

/// Slowest average arrival a parse waits for, after [`GRACE`]: a slower upload would hold an
/// analysis slot and its memory idle for long (a 4 GiB upload at 64 KiB/s: 17 hours).
const MIN_BYTES_PER_SEC: u64 = 8 << 20;
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl Feed {
    /// Passes a chunk on; false once the parse wants no more (it ended, the upload is
    /// compressed, or it arrives too slowly to be worth a slot): the caller then drops the
    /// feed, and the parse stops, giving its slot and memory back.
    pub async fn send(&mut self, chunk: Bytes, head: &[u8]) -> bool {
        self.bytes += chunk.len() as u64;
        let elapsed = self.started.elapsed();
        let slow = elapsed > GRACE && self.bytes < MIN_BYTES_PER_SEC * elapsed.as_secs();
        if slow || crate::ingest::is_compressed(head) {
            self.cancel.store(true, Ordering::Relaxed);
            return false;
        }
        self.tx.send(chunk).await.is_ok()
    }
}

impl Early {
    /// Starts `parse` on the reader end (it holds the slot and memory it took).
    fn start(parse: impl FnOnce(Fed, Arc<AtomicU64>, Arc<AtomicBool>) -> tokio::task::JoinHandle<Done>) -> Early {
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        let cancel = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicU64::new(0));
        let fed = Fed { rx, current: Bytes::new(), cancel: cancel.clone() };
        let done = parse(fed, progress.clone(), cancel.clone());
        let feed = Feed { tx, cancel: cancel.clone(), started: std::time::Instant::now(), bytes: 0 };
        Early { feed: Some(feed), cancel, done: Some(done), progress }
    }

    /// The feed for the upload handler (once).
    pub fn feed(&mut self) -> Option<Feed> {
        self.feed.take()
    }

    /// The prepared analysis, if the parse succeeded on the bytes `sha256` names.
    pub(super) async fn result(mut self, sha256: &str) -> Option<(Prepared, Held)> {
        self.feed = None;
        let done = self.done.take()?;
        let waited = std::time::Instant::now();
        let prepared = match done.await {
            Ok(Ok(p)) if p.0.sha256() == sha256 => Some(p),
            Ok(Ok(_)) => {
                tracing::warn!(sha256, "the bytes parsed while arriving differ from those stored: analysed again");
                None
            }
            Ok(Err(e)) => {
                tracing::debug!(sha256, error = %e, "the parse while arriving failed: analysed again");
                None
            }
            Err(e) => {
                tracing::warn!(sha256, error = %e, "the parse while arriving crashed: analysed again");
                None
            }
        };
        let used = prepared.is_some();
        tracing::debug!(sha256, used, waited = waited.elapsed().as_secs_f64(), "parse while arriving");
        prepared
    }
}

/// Starts parsing an upload of `bytes` (announced) as it arrives, if an analysis slot and the
/// memory it needs are free now.
pub(super) fn start(slots: &Arc<Semaphore>, budget: &Budget, bytes: u64) -> Option<Early> {
    let slot = slots.clone().try_acquire_owned().ok()?;
    let estimate = crate::ingest::memory_estimate(bytes, b"");
    let held = Some(budget.try_reserve(estimate)?);
    let budget = budget.clone();
    Some(Early::start(move |fed, counter, cancel| {
        tokio::spawn(async move {
            let _slot = slot;
            let parse = Parse { counter, memory: Charged { held, bytes: estimate }, cancel: Some(cancel) };
            parse_and_prepare(&budget, fed, parse).await
        })
    }))
}

impl Drop for Early {
    /// An upload refused, cut off or stored before: the parse stops at its next read.
    fn drop(&mut self) {
        if self.done.is_some() {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

/// The parser's end: the received chunks as a reader. It ends when the upload does (the
/// handler drops the feed) and fails once the upload is given up.
pub struct Fed {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
    cancel: Arc<AtomicBool>,
}

impl Read for Fed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while !self.current.has_remaining() {
            // Checked after each wait too: the feed is dropped both when the upload ends and
            // when it is given up, and only the flag tells which.
            let next = if self.cancel.load(Ordering::Relaxed) { None } else { self.rx.blocking_recv() };
            match next {
                Some(chunk) => self.current = chunk,
                None if self.cancel.load(Ordering::Relaxed) => {
                    return Err(std::io::Error::other("the upload was given up"));
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader sees the chunks in order and then the end; a given-up upload reads as an
    /// error, never as a clean end (which could parse a truncated but well-formed prefix).
    #[tokio::test]
    async fn the_fed_reader_ends_with_the_upload_and_fails_when_it_is_given_up() {
        let (tx, rx) = mpsc::channel(4);
        let cancel = Arc::new(AtomicBool::new(false));
        let mut fed = Fed { rx, current: Bytes::new(), cancel: cancel.clone() };
        let reading = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            fed.read_to_end(&mut all).map(|_| all)
        });
        for chunk in [&b"ab"[..], b"", b"cde"] {
            tx.send(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
        drop(tx);
        assert_eq!(reading.await.unwrap().unwrap(), b"abcde");

        let (tx, rx) = mpsc::channel(4);
        let mut fed = Fed { rx, current: Bytes::new(), cancel: cancel.clone() };
        tx.send(Bytes::from_static(b"ab")).await.unwrap();
        cancel.store(true, Ordering::Relaxed);
        drop(tx);
        let got = tokio::task::spawn_blocking(move || {
            let mut all = Vec::new();
            fed.read_to_end(&mut all)
        });
        assert!(got.await.unwrap().is_err(), "a given-up upload must not read as complete");
    }
}
