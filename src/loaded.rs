//! Snapshots held parsed in memory, for what needs the trace itself: the segment map at any
//! event, the events in a range, frames. The few most recently used are kept; others are
//! parsed again from their blob on demand (one at a time).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::analysis::{self, Depth};
use crate::ingest;
use crate::replay::Replay;
use crate::snapshot::Snapshot;
use crate::store::Store;

pub struct Entry {
    pub snapshot: Snapshot,
    /// One per device, in the order of `snapshot.devices`.
    pub replays: Vec<Replay>,
}

impl Entry {
    /// About what it holds in memory: the events, and the replays' checkpoints.
    pub fn bytes(&self) -> u64 {
        let events = self.snapshot.events.len() as u64;
        events * 32
            + self
                .replays
                .iter()
                .map(|r| (r.event_count() as u64 / crate::replay::CHECKPOINT_EVERY as u64 + 2) * (256 << 10))
                .sum::<u64>()
    }

    pub fn device(&self, device: i64) -> Option<(usize, &crate::snapshot::Device)> {
        self.snapshot.devices.iter().enumerate().find(|(_, d)| d.device == device)
    }
}

pub struct Loaded {
    capacity: usize,
    /// Bytes the held snapshots may take together (the newest is always kept).
    max_bytes: u64,
    entries: Mutex<VecDeque<(String, Arc<Entry>)>>,
    /// One parse at a time: parsing is CPU- and memory-heavy.
    loading: tokio::sync::Mutex<()>,
}

impl Loaded {
    pub fn new(capacity: usize, max_bytes: u64) -> Loaded {
        Loaded {
            capacity: capacity.max(1),
            max_bytes,
            entries: Mutex::new(VecDeque::new()),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let i = entries.iter().position(|(k, _)| k == id)?;
        let hit = entries.remove(i)?;
        let entry = hit.1.clone();
        entries.push_front(hit);
        Some(entry)
    }

    pub fn put(&self, id: &str, entry: Arc<Entry>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(k, _)| k != id);
        entries.push_front((id.to_string(), entry));
        entries.truncate(self.capacity);
        while entries.len() > 1 && entries.iter().map(|(_, e)| e.bytes()).sum::<u64>() > self.max_bytes {
            entries.pop_back();
        }
    }

    pub fn remove(&self, id: &str) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).retain(|(k, _)| k != id);
    }

    /// The parsed snapshot, parsing its blob if it is not held.
    pub async fn load(&self, store: &Store, id: &str, sha256: &str) -> Result<Arc<Entry>, String> {
        if let Some(e) = self.get(id) {
            return Ok(e);
        }
        let _one = self.loading.lock().await;
        if let Some(e) = self.get(id) {
            return Ok(e);
        }
        let file = store.blobs.open(sha256).map_err(|e| format!("the upload is gone: {e}"))?;
        let entry = tokio::task::spawn_blocking(move || {
            let ingested = ingest::ingest(file, &ingest::Options::default()).map_err(|e| e.to_string())?;
            let analyzed = analysis::analyze(&ingested.snapshot, ingested.source, Depth::Index);
            Ok::<_, String>(Entry { snapshot: ingested.snapshot, replays: analyzed.replays })
        })
        .await
        .map_err(|e| e.to_string())??;
        let entry = Arc::new(entry);
        self.put(id, entry.clone());
        Ok(entry)
    }
}
