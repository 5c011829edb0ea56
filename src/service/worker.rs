//! The analysis workers: uploads are analysed in the background, a few at a time (parsing is
//! CPU- and memory-heavy), and each reports its progress in bytes read.
//!
//! The queue itself is in the database (`store::meta::queue`), so that any replica may take
//! any job: a worker claims the oldest job under a lease, renews the lease while it works, and
//! takes the job off the queue with its outcome. A replica that dies mid-analysis stops
//! renewing; once the lease runs out another replica claims the job. A job claimed more than
//! twice killed its analyser each time and is failed instead; a graceful stop gives its jobs
//! back uncounted, and a failed job is queued again when its bytes are uploaded again (or
//! through the retry route).
//!
//! A job reads the blob, analyses it fully, and writes the results through the store; the
//! parsed snapshot then stays in the loaded cache so the first queries need no parse. A
//! failure is recorded with the reader's one-line message (which names the byte offset).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::budget::{Budget, Charged, trim};
use super::early::{self, Early};
use super::loaded::Loaded;
use super::prepare::{AnalysisError, Parse, parse_blob};
use crate::analysis::summary::Summary;
use crate::ingest;
use crate::store::{Status, Store, unix_now};

/// Analyses claimed this many times without finishing are failed, not started again.
const MAX_ATTEMPTS: u64 = 2;
const DIED: &str = "the analysis was killed twice before it finished (its server crashed or was killed, most \
    likely out of memory, while analysing this file); it is not tried again on its own: upload the file again, or \
    POST /api/v1/snapshots/ID/retry, to try once more";

/// How workers hold jobs.
#[derive(Clone, Debug)]
pub struct Leases {
    /// This process's name on the jobs it holds.
    pub owner: String,
    /// How long a claim holds without renewal; renewed every third of it.
    pub lease: std::time::Duration,
    /// How often an idle worker looks for jobs other replicas queued (its own uploads wake it
    /// at once).
    pub poll: std::time::Duration,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases {
            owner: crate::store::random_id(),
            lease: std::time::Duration::from_secs(60),
            poll: std::time::Duration::from_secs(2),
        }
    }
}

#[derive(Clone)]
pub struct Worker {
    /// Wakes idle workers when this replica queues a job.
    wake: Arc<tokio::sync::Notify>,
    progress: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    /// One permit per analysis allowed to run at once.
    slots: Arc<tokio::sync::Semaphore>,
    /// Checks of small uploads before the answer have their own two slots, so an upload never
    /// waits behind background analyses; see `Service::check`.
    pub(super) checks: Arc<tokio::sync::Semaphore>,
    /// Simulations anyone holding a link may start: at most two at once, the rest told to retry.
    pub(super) simulations: Arc<tokio::sync::Semaphore>,
    /// The memory budget for analyses.
    pub(super) budget: Budget,
    counters: Arc<super::metrics::Counters>,
    leases: Leases,
    /// The jobs this replica holds now, to give back at a graceful stop.
    held: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Set at a graceful stop: no new job is claimed.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl Worker {
    /// Starts `workers` analysis tasks sharing `budget`.
    pub fn start(
        store: Arc<Store>,
        loaded: Arc<Loaded>,
        counters: Arc<super::metrics::Counters>,
        workers: usize,
        budget: Budget,
        leases: Leases,
    ) -> Worker {
        let slots = Arc::new(tokio::sync::Semaphore::new(workers.max(1)));
        let worker = Worker {
            wake: Arc::new(tokio::sync::Notify::new()),
            progress: Arc::new(Mutex::new(HashMap::new())),
            slots,
            checks: Arc::new(tokio::sync::Semaphore::new(2)),
            simulations: Arc::new(tokio::sync::Semaphore::new(2)),
            budget,
            counters,
            leases: leases.clone(),
            held: Arc::default(),
            stopping: Arc::default(),
        };
        for _ in 0..workers.max(1) {
            let (store, loaded, w) = (store.clone(), loaded.clone(), worker.clone());
            tokio::spawn(async move {
                let leases = w.leases.clone();
                loop {
                    let Ok(slot) = w.slots.clone().acquire_owned().await else { break };
                    if w.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    let now = unix_now();
                    match store.meta.claim(&leases.owner, now, now + leases.lease.as_secs() as i64).await {
                        Ok(Some(claim)) => w.run(store.clone(), &loaded, claim, None).await,
                        Ok(None) => {
                            drop(slot);
                            tokio::select! {
                                _ = w.wake.notified() => {}
                                _ = tokio::time::sleep(leases.poll) => {}
                            }
                        }
                        Err(e) => {
                            drop(slot);
                            tracing::error!(error = %e, "cannot claim a job; trying again");
                            tokio::time::sleep(leases.poll.max(std::time::Duration::from_secs(1))).await;
                        }
                    }
                }
            });
        }
        worker
    }

    /// Starts parsing an upload of `bytes` (announced) as it arrives, if an analysis slot and
    /// the memory it needs are free now; see `early`.
    pub fn start_early(&self, bytes: u64) -> Option<Early> {
        early::start(&self.slots, &self.budget, bytes)
    }

    /// Takes the analysis of new bytes whose upload was parsed while it arrived: claims their
    /// job and writes the prepared analysis (or analyses them afresh if it cannot be used).
    /// If another worker claimed the job first, the early work is dropped.
    pub async fn adopt(&self, store: Arc<Store>, loaded: Arc<Loaded>, sha256: &str, early: Early) {
        let now = unix_now();
        let until = now + self.leases.lease.as_secs() as i64;
        match store.meta.claim_for(sha256, &self.leases.owner, now, until).await {
            Ok(Some(claim)) => {
                let w = self.clone();
                tokio::spawn(async move { w.run(store, &loaded, claim, Some(early)).await });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(sha256, error = %e, "cannot claim the job of an upload parsed while arriving");
                self.wake();
            }
        }
    }

    /// Tells idle workers that a job was queued (the job itself is a row of the database).
    pub fn wake(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    /// Bytes of the upload `sha256` read so far, while it is being analysed.
    pub fn progress(&self, sha256: &str) -> Option<u64> {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        p.get(sha256).map(|c| c.load(Ordering::Relaxed))
    }

    /// Analyses the bytes of a claimed job once for every upload of them, renewing the lease
    /// until the outcome is recorded.
    async fn run(&self, store: Arc<Store>, loaded: &Loaded, claim: crate::store::Claim, early: Option<Early>) {
        let leases = &self.leases;
        let id = claim.sha256.as_str();
        if self.stopping.load(Ordering::Acquire) {
            self.give_back(&store, id).await;
            return;
        }
        if claim.attempts > MAX_ATTEMPTS {
            tracing::warn!(id, attempts = claim.attempts, "analysis died twice: failed, not resumed");
            super::metrics::Counters::add(&self.counters.analyses_failed, 1);
            self.record(&store, id, Outcome::failed(DIED.to_string())).await;
            return;
        }
        let renewal = {
            let (store, id, leases) = (store.clone(), id.to_string(), leases.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(leases.lease / 3).await;
                    let until = unix_now() + leases.lease.as_secs() as i64;
                    match store.meta.renew(&id, &leases.owner, until).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(id, "lost the lease (it ran out, or the upload was deleted)");
                            break;
                        }
                        Err(e) => tracing::error!(id, error = %e, "cannot renew the lease"),
                    }
                }
            })
        };
        self.holding(id, true);
        self.analyse_claimed(store, loaded, id, early).await;
        self.holding(id, false);
        renewal.abort();
    }

    fn holding(&self, sha256: &str, held: bool) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held {
            h.insert(sha256.to_string())
        } else {
            h.remove(sha256)
        };
    }

    /// A graceful stop (SIGTERM, Ctrl-C): claims no more jobs and gives back those running,
    /// uncounted, so that a stop is never taken for an analysis that crashed its server
    /// (two of those fail the upload for good).
    pub async fn stop(&self, store: &Store) {
        self.stopping.store(true, Ordering::Release);
        let held: Vec<String> = self.held.lock().unwrap_or_else(|e| e.into_inner()).drain().collect();
        for sha256 in held {
            if let Err(e) = store.meta.release(&sha256, &self.leases.owner).await {
                tracing::warn!(sha256, error = %e, "cannot give the job back at stop; its lease runs out");
            } else {
                tracing::info!(sha256, "analysis given back at stop: the next start runs it again");
            }
        }
    }

    async fn analyse_claimed(&self, store: Arc<Store>, loaded: &Loaded, id: &str, early: Option<Early>) {
        let Ok(Some(row)) = store.meta.by_sha256(id).await else { return };
        let counter = early.as_ref().map(|e| e.progress.clone()).unwrap_or_default();
        self.track(id, Some(counter.clone()));
        let started = std::time::Instant::now();
        let parsed = match early {
            Some(early) => match early.result(id).await {
                Some(prepared) => {
                    super::metrics::Counters::add(&self.counters.analyses_early, 1);
                    Ok(prepared)
                }
                None => {
                    self.track(id, None);
                    self.give_back(&store, id).await;
                    return;
                }
            },
            None => {
                // The first bytes tell a compressed upload (which unpacks to far more) from a
                // plain one.
                let mut head = [0u8; 4];
                if let Ok(mut f) = store.blobs.open(&row.sha256).await {
                    let _ = std::io::Read::read(&mut f, &mut head);
                }
                let estimate = ingest::memory_estimate(row.bytes, &head);
                let held = self.budget.reserve(estimate).await;
                let parse = Parse { counter, memory: Charged { held, bytes: estimate }, cancel: None };
                parse_blob(&self.budget, &store, &row.sha256, parse).await
            }
        };
        let mut outcome = match parsed {
            Ok((prepared, _memory)) => {
                let (store, writing) = (store.clone(), std::time::Instant::now());
                let written = tokio::task::spawn_blocking(move || prepared.write(&store)).await;
                tracing::debug!(id, seconds = writing.elapsed().as_secs_f64(), "wrote the results");
                written.map_err(AnalysisError::from).and_then(|r| r)
            }
            Err(message) => Err(message),
        };
        if outcome.is_ok()
            && let Err(e) = store.publish_results(id).await
        {
            outcome = Err(AnalysisError::Write { doing: "store", source: e.into() });
        }
        self.track(id, None);
        let counter = if outcome.is_ok() { &self.counters.analyses_ready } else { &self.counters.analyses_failed };
        super::metrics::Counters::add(counter, 1);
        super::metrics::Counters::add(&self.counters.analysis_micros, started.elapsed().as_micros() as u64);
        let recorded = match outcome {
            Ok((verdict, summary, entry)) => {
                tracing::info!(id, bytes = row.bytes, seconds = started.elapsed().as_secs_f64(), verdict, "analysed");
                loaded.put(id, Arc::new(entry));
                Outcome { status: Status::Ready, error: None, verdict: Some(verdict), summary }
            }
            Err(e) => {
                tracing::info!(id, error = %e, "analysis failed");
                Outcome::failed(e.to_string())
            }
        };
        self.record(&store, id, recorded).await;
        trim();
        // Deleted while it ran: drop what it wrote.
        if matches!(store.meta.by_sha256(id).await, Ok(None)) {
            let _ = store.results.delete(id);
            let _ = store.blobs.delete(id).await;
            loaded.remove(id);
        }
    }

    /// Shows the progress of the analysis of `sha256` on its uploads' status (None: done).
    fn track(&self, sha256: &str, counter: Option<Arc<AtomicU64>>) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        match counter {
            Some(c) => p.insert(sha256.to_string(), c),
            None => p.remove(sha256),
        };
    }

    /// Puts a claimed job back in the queue untried, for a worker with a slot.
    async fn give_back(&self, store: &Store, sha256: &str) {
        if let Err(e) = store.meta.release(sha256, &self.leases.owner).await {
            tracing::warn!(sha256, error = %e, "cannot give the job back; it is taken once its lease runs out");
        }
        self.wake();
    }

    /// Records an outcome and takes the job off the queue. Recording can fail (a full disk
    /// fails the database's writes): then it is logged and tried again every few seconds until
    /// it holds, never dropped.
    async fn record(&self, store: &Store, id: &str, o: Outcome) {
        let mut wait = std::time::Duration::from_secs(1);
        let (error, verdict) = (o.error.as_deref(), o.verdict.as_deref());
        while let Err(e) = store.meta.finish(id, o.status, error, verdict, o.summary.as_ref()).await {
            tracing::error!(id, error = %e, "cannot record the analysis; trying again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_secs(30));
        }
    }
}

/// How an analysis ended, as its row records it.
struct Outcome {
    status: Status,
    error: Option<String>,
    verdict: Option<String>,
    summary: Option<Summary>,
}

impl Outcome {
    fn failed(error: String) -> Outcome {
        Outcome { status: Status::Failed, error: Some(error), verdict: None, summary: None }
    }
}
