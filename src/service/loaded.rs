//! Snapshots held parsed in memory (by sha256: uploads of the same bytes share one), for what needs the trace itself: the segment map at any
//! event, the events in a range, frames. The few most recently used are kept; others are
//! parsed again from their blob on demand, one at a time, and only once the caller's memory
//! budget (the analyses' own, see [`super::budget::Budget::reserve`]) has room for the
//! parse: after a restart, opening many big snapshots at once must not pass it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::analysis::breakdown::Breakdown;
use crate::analysis::{self, Depth, active, map};
use crate::ingest;
use crate::replay::Replay;
use crate::snapshot::Snapshot;
use crate::store::Store;

use super::ServiceError;
use super::views::{ActiveBy, ActiveQuery};

pub struct Entry {
    pub snapshot: Snapshot,
    /// One per device, in the order of `snapshot.devices`.
    pub replays: Vec<Replay>,
    /// Per device: phases and a category for every allocation (breakdowns at any event).
    pub indexes: Vec<crate::analysis::memory::Index>,
    /// Per device, the charts of active memory a page opens first, once made
    /// ([`Entry::make_first_charts`]).
    first_charts: std::sync::OnceLock<Vec<FirstCharts>>,
}

/// Columns of the chart of active memory the page asks for (`ACTIVE_POINTS` in
/// static/js/data/requests.js), at any width of its canvas.
pub const PAGE_ACTIVE_POINTS: usize = 500;
/// The groups it shows by name.
const PAGE_ACTIVE_TOP: usize = 8;

/// A device's whole trace as the page's chart of active memory shows it, by call site and by
/// category, as JSON: made once the entry is kept (not on its way to `ready`), since it walks
/// every event (30-50 ms on three million, three times that while a browser shares the cores:
/// the slowest of a page's first requests) and a shared link opens it on each first load.
struct FirstCharts {
    site: Vec<u8>,
    category: Vec<u8>,
}

impl Entry {
    /// The entry of an analysed snapshot.
    pub fn new(snapshot: Snapshot, replays: Vec<Replay>, indexes: Vec<crate::analysis::memory::Index>) -> Entry {
        Entry { snapshot, replays, indexes, first_charts: std::sync::OnceLock::new() }
    }

    /// Makes the charts a page opens first (blocking: off the async threads). [`Loaded::put`]
    /// calls it once the entry is kept, not before: an upload's `ready` does not wait for it.
    pub fn make_first_charts(&self) {
        self.first_charts.get_or_init(|| {
            (0..self.snapshot.devices.len())
                .map(|i| {
                    let whole = |by| {
                        let (points, top) = (PAGE_ACTIVE_POINTS, PAGE_ACTIVE_TOP);
                        self.chart(i, ActiveQuery { start: None, end: None, points, top, by }).unwrap_or_default()
                    };
                    FirstCharts { site: whole(ActiveBy::Site), category: whole(ActiveBy::Category) }
                })
                .collect()
        });
    }

    /// About what it holds in memory: the events, the replays' checkpoints, the indexes, the
    /// first charts.
    pub fn bytes(&self) -> u64 {
        let charts = self.first_charts.get().map_or(0, |c| c.iter().map(|c| c.site.len() + c.category.len()).sum());
        self.snapshot.event_bytes()
            + self.indexes.iter().map(|i| i.bytes()).sum::<u64>()
            + charts as u64
            + self
                .replays
                .iter()
                .map(|r| (r.event_count() as u64 / crate::replay::CHECKPOINT_EVERY as u64 + 2) * (256 << 10))
                .sum::<u64>()
    }

    pub fn device(&self, device: i64) -> Option<(usize, &crate::snapshot::Device)> {
        self.snapshot.devices.iter().enumerate().find(|(_, d)| d.device == device)
    }

    /// Device `i`'s live bytes over events, grouped, as JSON: the page's first chart as made
    /// once the entry was kept, any other (or that one, not made yet) now.
    pub fn active(&self, i: usize, q: ActiveQuery) -> Result<Vec<u8>, ServiceError> {
        let n = self.snapshot.device_events(&self.snapshot.devices[i]).len();
        let whole = q.start.unwrap_or(0) == 0 && q.end.is_none_or(|e| e >= n);
        if whole && q.points == PAGE_ACTIVE_POINTS && q.top == PAGE_ACTIVE_TOP {
            let made = self.first_charts.get().and_then(|c| c.get(i));
            let made = made.map(|c| if q.by == ActiveBy::Site { &c.site } else { &c.category });
            if let Some(made) = made.filter(|m| !m.is_empty()) {
                return Ok(made.clone());
            }
        }
        self.chart(i, q)
    }

    fn chart(&self, i: usize, q: ActiveQuery) -> Result<Vec<u8>, ServiceError> {
        let d = &self.snapshot.devices[i];
        let n = self.snapshot.device_events(d).len();
        let (start, end) = (q.start.unwrap_or(0), q.end.unwrap_or(n).min(n));
        if start > end {
            return Err(ServiceError::Invalid(format!("start {start} is after end {end}")));
        }
        let group = match q.by {
            ActiveBy::Site => active::Group::Site,
            ActiveBy::Category => active::Group::Category(&self.indexes[i].labels),
        };
        let shown = active::active_by(&self.snapshot, d, &self.replays[i], start..end, q.points, q.top, group);
        serde_json::to_vec(&shown).map_err(|e| ServiceError::internal("writing live bytes")(e.into()))
    }

    /// Device `i`'s segment map right after `event` (None: the final `segments`), each live
    /// block with what it holds.
    pub fn segment_map(&self, i: usize, event: Option<u64>) -> map::SegmentMap {
        let d = &self.snapshot.devices[i];
        self.indexes[i].segment_map_at(&self.snapshot, d, &self.replays[i], event)
    }

    /// What fills device `i`'s memory right after `event` (None: at the end).
    pub fn breakdown(&self, i: usize, event: Option<u64>) -> Breakdown {
        let d = &self.snapshot.devices[i];
        self.indexes[i].breakdown_at(&self.snapshot, d, &self.replays[i], event)
    }

    /// Device `i`'s live memory right after `event` (None: at the end) by the stacks that made it.
    pub fn flame(&self, i: usize, event: Option<u64>) -> crate::analysis::flame::Flame {
        let (d, replay) = (&self.snapshot.devices[i], &self.replays[i]);
        let state = match event {
            Some(e) => replay.state_at(&self.snapshot, Some(e as usize)),
            None => replay.end_state(d),
        };
        let last = self.snapshot.device_events(d).len().checked_sub(1).map(|e| e as u64);
        crate::analysis::flame::flame(&self.snapshot, &state, &self.indexes[i].labels, event.or(last))
    }
}

pub struct Loaded {
    capacity: usize,
    /// Bytes the held snapshots may take together (the newest is always kept).
    max_bytes: u64,
    entries: Mutex<VecDeque<(String, Arc<Entry>)>>,
    /// One parse at a time: parsing is CPU- and memory-heavy.
    loading: tokio::sync::Mutex<()>,
    counters: Arc<super::metrics::Counters>,
    /// The analysis memory budget a parse is held to (0: none).
    budget: u64,
}

impl Loaded {
    /// The same cache, its parses held to `budget` bytes of read, model and analysis.
    pub fn within(mut self, budget: u64) -> Loaded {
        self.budget = budget;
        self
    }

    pub fn new(capacity: usize, max_bytes: u64, counters: Arc<super::metrics::Counters>) -> Loaded {
        Loaded {
            capacity: capacity.max(1),
            max_bytes,
            entries: Mutex::new(VecDeque::new()),
            loading: tokio::sync::Mutex::new(()),
            counters,
            budget: 0,
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

    /// Keeps `entry`, and makes the charts a page opens first on a blocking thread (where a
    /// runtime runs this): whoever put it has its answer already; a page that asks sooner has
    /// its chart made on demand.
    pub fn put(&self, id: &str, entry: Arc<Entry>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let making = entry.clone();
            runtime.spawn_blocking(move || making.make_first_charts());
        }
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

    /// The parsed snapshot, parsing its blob if it is not held. `reserve` is asked for the bytes
    /// the parse needs at its peak and held until it is done (None: go ahead unreserved).
    pub async fn load<R, P>(&self, store: &Store, sha256: &str, reserve: R) -> Result<Arc<Entry>, super::ServiceError>
    where
        R: FnOnce(u64) -> P,
        P: std::future::Future<Output = Option<tokio::sync::OwnedSemaphorePermit>>,
    {
        if let Some(e) = self.get(sha256) {
            super::metrics::Counters::add(&self.counters.cache_hits, 1);
            return Ok(e);
        }
        super::metrics::Counters::add(&self.counters.cache_misses, 1);
        let _one = self.loading.lock().await;
        if let Some(e) = self.get(sha256) {
            return Ok(e);
        }
        let gone = |e: std::io::Error| super::ServiceError::Store(e.into());
        let mut file = store.blobs.open(sha256).await.map_err(gone)?;
        let mut head = [0u8; 4];
        let bytes = file.metadata().map_err(gone)?.len();
        let _ = std::io::Read::read(&mut file, &mut head);
        std::io::Seek::rewind(&mut file).map_err(gone)?;
        let _memory = reserve(crate::ingest::memory_estimate(bytes, &head)).await;
        let options = super::ingest_options(self.budget);
        let entry = tokio::task::spawn_blocking(move || {
            let ingested = ingest::ingest(file, &options)?;
            let analyzed = analysis::analyze(&ingested.snapshot, ingested.source, Depth::Index);
            Ok::<_, super::ServiceError>(Entry::new(ingested.snapshot, analyzed.replays, analyzed.indexes))
        })
        .await
        .map_err(|e| super::ServiceError::internal("parsing a snapshot again")(e.into()))??;
        let entry = Arc::new(entry);
        self.put(sha256, entry.clone());
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// A parse after a restart waits while the budget is taken, and runs once it is freed.
    #[tokio::test]
    async fn a_parse_waits_for_the_memory_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/capacity_oom.pickle")).unwrap();
        let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        let temp = dir.path().join("upload.tmp");
        std::fs::write(&temp, &bytes).unwrap();
        store.blobs.commit(temp, None, &sha).await.unwrap();

        let budget = Arc::new(tokio::sync::Semaphore::new(64));
        let held = budget.clone().acquire_many_owned(64).await.unwrap();
        let loaded = Loaded::new(2, u64::MAX, Default::default());
        let asked = std::sync::Mutex::new(None);
        let reserve = |bytes: u64| {
            *asked.lock().unwrap() = Some(bytes);
            let budget = budget.clone();
            async move { budget.acquire_many_owned(1).await.ok() }
        };
        let load = loaded.load(&store, &sha, reserve);
        tokio::pin!(load);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut load).await;
        assert!(waited.is_err(), "parsed while the whole budget was held");
        assert_eq!(*asked.lock().unwrap(), Some(crate::ingest::memory_estimate(bytes.len() as u64, &bytes[..4])));
        drop(held);
        let entry = tokio::time::timeout(std::time::Duration::from_secs(30), load).await.unwrap().unwrap();
        assert!(!entry.snapshot.devices.is_empty());
        assert!(loaded.get(&sha).is_some(), "kept for the next query");
        // Kept, it has the charts a page opens first made beside.
        let made = std::time::Instant::now();
        while entry.first_charts.get().is_none() {
            assert!(made.elapsed() < std::time::Duration::from_secs(30), "the first charts were never made");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The page's first chart, once made, is the chart made on demand; any other
    /// query (a part of the trace, another resolution) is made on demand. The page asks for
    /// the resolution the entry makes.
    #[test]
    fn the_first_chart_once_made_is_the_chart_made_on_demand() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/seed_frag_buffer.pickle");
        let s = ingest::ingest_path(std::path::Path::new(path), &Default::default()).unwrap().snapshot;
        let analyzed = analysis::analyze(&s, Default::default(), Depth::Index);
        let entry = Entry::new(s, analyzed.replays, analyzed.indexes);
        let n = entry.snapshot.device_events(&entry.snapshot.devices[0]).len();
        let q = |start, end, points, by| ActiveQuery { start, end, points, top: PAGE_ACTIVE_TOP, by };
        let before = entry.active(0, q(None, None, PAGE_ACTIVE_POINTS, ActiveBy::Site)).unwrap();
        let held = entry.bytes();
        entry.make_first_charts();
        assert!(entry.bytes() > held, "the charts are counted in the entry's memory");
        let made = &entry.first_charts.get().unwrap()[0];
        let (site, category) = (&made.site, &made.category);
        assert_eq!(&before, site, "asked before they are made, the same chart");
        assert_ne!(site, category, "by site and by category differ on this trace");
        for (by, made) in [(ActiveBy::Site, site), (ActiveBy::Category, category)] {
            let now = entry.chart(0, q(None, None, PAGE_ACTIVE_POINTS, by)).unwrap();
            assert_eq!(made, &now);
            for asked in [q(None, None, PAGE_ACTIVE_POINTS, by), q(Some(0), Some(n), PAGE_ACTIVE_POINTS, by)] {
                assert_eq!(&entry.active(0, asked).unwrap(), made, "{asked:?}");
            }
            for other in [q(Some(1), None, PAGE_ACTIVE_POINTS, by), q(None, None, 5, by)] {
                assert_eq!(entry.active(0, other).unwrap(), entry.chart(0, other).unwrap());
                assert_ne!(&entry.active(0, other).unwrap(), made, "{other:?}");
            }
        }
        let js = include_str!("../../static/js/data/requests.js");
        assert!(
            js.contains(&format!("export const ACTIVE_POINTS = {PAGE_ACTIVE_POINTS};")),
            "the page asks for another resolution"
        );
    }
}
