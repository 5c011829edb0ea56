//! Analysis: every number fragscope reports about a snapshot, one file per family, named as
//! torch names them.
//!
//! - `counters`: the state of a set of segments (reserved, allocated, inactive split, ...).
//! - `actions`: what the trace holds.
//! - `timeline`: the series over events, and the peaks.
//! - `gaps`: pinned gaps and the call sites that pin them.
//! - `oom`: a verdict for each OOM.
//! - `rhythm`: pinned segments created at a regular rhythm (the seed pattern).
//! - `advice`, `verdict`: the diagnosis and its remedies; the verdict's name, words and tone.
//! - `map`: the segment map at one moment, as the API and the page show it.
//! - `active`: live bytes by call site over events (the active-memory timeline).
//! - `cost`: the memory an analysis takes, and the budget it is held to.
//! - `phases`, `categories`, `breakdown`, `memory`: what fills memory (each block's phase of
//!   the step and category), the steps, growth; `kv`: an inference KV cache.
//! - `need`, `judge`, `predict`, `capacity`, `shrink`, `inference`: what the step that died
//!   needed, and the remedies with their replayed effects.
//! - `summary`, `compare`, `divergence`: a snapshot at a glance, two side by side, why one
//!   rank of a run differs from the median rank.
//! - `flame`: live memory at an event by the stacks that made it.
//!
//! - `pass`, `device`: one device's forward pass and how it is scheduled on two threads, and
//!   the plain assembly of its part of the document from what the pass leaves.
//!
//! [`analyze`] replays each device once, with the observers that need the forward pass, and
//! assembles the document that `fragscope analyze --json` prints and the API serves. Analysis
//! never fails on a decoded model.

mod actions;
pub(crate) mod active;
pub(crate) mod advice;
pub(crate) mod breakdown;
pub(crate) mod capacity;
pub mod categories;
pub mod compare;
pub mod cost;
mod counters;
mod device;
pub mod divergence;
pub mod flame;
pub(crate) mod gaps;
pub mod inference;
mod judge;
pub mod kv;
pub(crate) mod map;
pub(crate) mod memory;
pub(crate) mod need;
pub(crate) mod oom;
mod pass;
pub(crate) mod phases;
mod predict;
pub(crate) mod rhythm;
mod shrink;
pub mod summary;
pub(crate) mod timeline;
pub mod verdict;

pub use actions::{TraceSummary, trace_summary};
pub use breakdown::Moment;
pub use cost::{OverBudget, memory_needed};
pub use counters::{Counters, counters};

use serde::{Deserialize, Serialize};

use crate::replay::Replay;
use crate::snapshot::{Snapshot, Source};
use advice::Diagnosis;
use gaps::{Gap, PinnedSummary, Pinner};
use oom::Oom;
use rhythm::Rhythm;
use timeline::{Peak, Timeline};

/// The analysis document. Later versions add keys; they never rename these.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Analysis {
    /// What the file was.
    pub source: Source,
    /// `allocator_settings` as the snapshot recorded them (torch >= 2.3).
    pub allocator_settings: Option<serde_json::Value>,
    /// `external_annotations` (torch >= 2.5): named ranges such as optimizer steps.
    pub annotations: Vec<crate::snapshot::Annotation>,
    /// Contradictions in the file, and how they were repaired before analysis.
    pub warnings: Vec<String>,
    /// One analysis per device.
    pub devices: Vec<DeviceAnalysis>,
}

/// Everything reported about one device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceAnalysis {
    /// The CUDA device index.
    pub device: i64,
    /// The counters of the final `segments`.
    #[serde(rename = "final")]
    pub final_state: Counters,
    /// What the trace holds.
    pub trace: TraceSummary,
    /// The peaks over the trace.
    pub peak: Peak,
    /// The OOMs, with their verdicts: the first `oom::MAX_OOMS` of them.
    pub ooms: Vec<Oom>,
    /// How many OOMs the trace holds (more than `ooms` lists when past `oom::MAX_OOMS`).
    #[serde(default)]
    pub oom_count: u64,
    /// Pinned free memory at the end.
    pub pinned: PinnedSummary,
    /// Who pins it at the end, most first.
    pub pinners: Vec<Pinner>,
    /// The largest pinned gaps at the end.
    pub gaps: Vec<Gap>,
    /// The step-like rhythm of reserved memory, where the trace repeats.
    pub rhythm: Rhythm,
    /// The verdict and the remedies.
    pub diagnosis: Diagnosis,
    /// What fills memory: `breakdown`, `steps`, `growth` (absent from analyses stored before).
    #[serde(flatten, default)]
    pub memory: memory::Memory,
    /// How faithfully the replay reproduces the final state.
    pub replay: ReplayReport,
}

/// How faithful the replay is: it must end at the final `segments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The replay ends at the final `segments`.
    pub matches_final: bool,
    /// How it differs where it does not.
    pub mismatches: Vec<String>,
    /// Contradictions the replay met and repaired.
    pub warnings: u64,
    /// The first of them, word for word.
    pub first_warnings: Vec<String>,
}

/// The analysis with what serving it needs beyond the JSON: each device's replay (for the
/// state at any event) and timeline (for the series).
pub struct Analyzed {
    /// The JSON document.
    pub analysis: Analysis,
    /// Each device's replay.
    pub replays: Vec<Replay>,
    /// Each device's timeline.
    pub timelines: Vec<Timeline>,
    /// Per device: phases and a category for every allocation, for breakdowns at any event.
    pub indexes: Vec<memory::Index>,
}

/// What to build beyond the JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The document only (the CLI): no per-event series, no checkpoints.
    Report,
    /// Checkpoints for the state at any event, but no series (reloading a stored snapshot).
    Index,
    /// Everything a server stores after an upload: series and checkpoints.
    Serve,
}

/// What the user tells the analysis beyond the file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The memory budget the job has (`--capacity`): remedies are weighed against it, at an
    /// OOM and at a peak that comes close to it.
    pub capacity: Option<u64>,
    /// The device's total memory (`--device-total`): with it, the memory held outside
    /// PyTorch's allocator at an OOM.
    pub device_total: Option<u64>,
}

/// Analyses a snapshot with the default options.
pub fn analyze(snapshot: &Snapshot, source: Source, depth: Depth) -> Analyzed {
    analyze_with(snapshot, source, depth, Options::default())
}

/// Analyses a snapshot; `depth` says how much to keep for serving.
pub fn analyze_with(snapshot: &Snapshot, source: Source, depth: Depth, options: Options) -> Analyzed {
    let mut devices = Vec::new();
    let (mut replays, mut timelines, mut indexes) = (Vec::new(), Vec::new(), Vec::new());
    for d in &snapshot.devices {
        let (analysis, replay, timeline, index) = device::analyze_device(snapshot, d, depth, options);
        devices.push(analysis);
        replays.push(replay);
        timelines.push(timeline);
        indexes.push(index);
    }
    let analysis = Analysis {
        source,
        allocator_settings: snapshot.allocator_settings.clone(),
        annotations: snapshot.annotations.clone(),
        warnings: snapshot.warnings.clone(),
        devices,
    };
    Analyzed { analysis, replays, timelines, indexes }
}
