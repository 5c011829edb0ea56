//! From bytes to what is stored: parse within the memory budget, analyse (the analysis, the
//! timeline columns, the segment maps a page opens first), then write, and hand back the
//! verdict and summary recorded on the row. Analysing and writing are two steps so that an
//! upload parsed while it arrives (`early`) is analysed before its hash is known to be new,
//! and written only once it is.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::analysis::summary::Summary;
use crate::analysis::timeline::Timeline;
use crate::analysis::{self, Analysis, Depth, map};
use crate::ingest;
use crate::store::{Store, Written};

use super::budget::{Budget, Charged, Held};
use super::loaded::Entry;

/// Why an upload's analysis failed: the message recorded on its row, which the page and the
/// API show.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    /// The stored upload cannot be opened.
    #[error("the upload is missing: {0}")]
    Missing(std::io::Error),
    /// Not a snapshot we can read (the reader's or the model's message, with its offset).
    #[error("{0}")]
    Ingest(#[from] ingest::IngestError),
    /// The parsed snapshot needs more memory than the whole budget.
    #[error("{0}")]
    OverBudget(#[from] analysis::OverBudget),
    /// The upload was given up while it was parsed (refused, cut off, stored before).
    #[error("the upload was given up")]
    GivenUp,
    /// A segment map could not be encoded.
    #[error("cannot encode a segment map: {0}")]
    Encode(#[from] serde_json::Error),
    /// The results could not be written, or sent to the object store.
    #[error("cannot {doing} the results: {source}")]
    Write {
        /// `write` or `store`.
        doing: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The analysis's task panicked or was cancelled.
    #[error("the analysis crashed: {0}")]
    Crashed(#[from] tokio::task::JoinError),
}

/// OOMs whose segment maps are stored with the results.
const STORED_OOM_MAPS: usize = 8;

/// An analysis ready to be written under its content hash.
pub struct Prepared {
    sha256: String,
    analysis: Analysis,
    timelines: Vec<Timeline>,
    maps: Vec<(i64, Option<u64>, Vec<u8>)>,
    entry: Entry,
}

/// Analyses a parsed snapshot.
pub fn prepare(ingested: ingest::Ingested) -> Result<Prepared, AnalysisError> {
    // The service's reads always hash (`ingest_options`); an empty hash would match no upload.
    let sha256 = ingested.source.sha256.clone().unwrap_or_default();
    let snap = ingested.snapshot;
    let analyzed = analysis::analyze(&snap, ingested.source, Depth::Serve);
    let entry = Entry::new(snap, analyzed.replays, analyzed.indexes);
    // The maps a page opens first: the end of each device, and the first OOMs (any other
    // event's map is made on demand).
    let mut maps = Vec::new();
    let json = |m: &map::SegmentMap| serde_json::to_vec(m);
    for (i, d) in entry.snapshot.devices.iter().enumerate() {
        maps.push((d.device, None, json(&entry.segment_map(i, None))?));
        for oom in analyzed.analysis.devices[i].ooms.iter().take(STORED_OOM_MAPS) {
            maps.push((d.device, Some(oom.event_index), json(&entry.segment_map(i, Some(oom.event_index)))?));
        }
    }
    Ok(Prepared { sha256, analysis: analyzed.analysis, timelines: analyzed.timelines, maps, entry })
}

impl Prepared {
    /// The hash of the bytes it was parsed from.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Writes the results through the store; returns the verdict, the summary and the parsed
    /// snapshot for the loaded cache.
    pub fn write(self, store: &Store) -> Result<(String, Option<Summary>, Entry), AnalysisError> {
        let Prepared { sha256, analysis, timelines, maps, entry } = self;
        let verdict = analysis.devices.first().map(|d| d.diagnosis.verdict.as_str()).unwrap_or("no_oom");
        let devices = entry.snapshot.devices.iter().map(|d| d.device).zip(&timelines).collect();
        let written = Written { analysis: &analysis, maps, timelines: devices };
        store
            .results
            .write(&sha256, &written)
            .map_err(|e| AnalysisError::Write { doing: "write", source: e.into() })?;
        Ok((verdict.to_string(), Summary::of(&analysis), entry))
    }
}

/// What a parse is given: where it reports the bytes read, the memory it holds, and the flag
/// that gives it up (an upload refused while it arrived).
pub(super) struct Parse {
    pub(super) counter: Arc<AtomicU64>,
    pub(super) memory: Charged,
    pub(super) cancel: Option<Arc<AtomicBool>>,
}

/// Parses a stored blob and analyses it.
pub(super) async fn parse_blob(
    budget: &Budget,
    store: &Store,
    sha256: &str,
    parse: Parse,
) -> Result<(Prepared, Held), AnalysisError> {
    let file = store.blobs.open(sha256).await.map_err(AnalysisError::Missing)?;
    parse_and_prepare(budget, file, parse).await
}

/// Parses `raw` and analyses it, charging the budget for what the parsed model will really
/// need (not only the guess from the file's size it started with). Stops after the parse if
/// `cancel` is set by then.
pub(super) async fn parse_and_prepare<R: std::io::Read + Send + 'static>(
    budget: &Budget,
    raw: R,
    Parse { counter, memory, cancel }: Parse,
) -> Result<(Prepared, Held), AnalysisError> {
    let total = budget.total();
    let ingested = tokio::task::spawn_blocking(move || {
        let options = ingest::Options { progress: Some(counter), ..super::ingest_options(total) };
        ingest::ingest(raw, &options)
    })
    .await??;
    tracing::debug!(bytes = ingested.source.bytes, "parsed");
    if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Err(AnalysisError::GivenUp);
    }
    // Charged before the analysis takes it; past the whole budget it never could.
    let need = analysis::cost::within(&ingested.snapshot, total)?;
    let memory = budget.charge(memory, need).await;
    let started = std::time::Instant::now();
    let prepared = tokio::task::spawn_blocking(move || prepare(ingested)).await??;
    tracing::debug!(seconds = started.elapsed().as_secs_f64(), "analysed the parsed snapshot");
    Ok((prepared, memory))
}
