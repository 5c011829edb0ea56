//! Analysis: every number fragscope reports about a snapshot, one file per family, named as
//! torch names them.
//!
//! - `counters`: the state of a set of segments (reserved, allocated, inactive split, ...).
//! - `actions`: what the trace holds.
//! - `timeline`: the series over events, and the peaks.
//! - `gaps`: pinned gaps and the call sites that pin them.
//! - `oom`: a verdict for each OOM.
//! - `rhythm`: pinned segments created at a regular rhythm (the seed pattern).
//! - `advice`: the diagnosis and its remedies.
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

use foldhash::{HashMap, HashMapExt};

use serde::{Deserialize, Serialize};

use crate::replay::{self, Observer, Replay, State};
use crate::snapshot::sites::{self, call_site};
use crate::snapshot::{Action, Device, Event, Snapshot, Source, StackId};
use advice::Diagnosis;
use gaps::{Gap, PinnedSummary, Pinner};
use oom::{Oom, OomObserver};
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
        let (analysis, replay, timeline, index) = analyze_device(snapshot, d, depth, options);
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

/// The observers of one forward pass.
struct Pass<'a, 'p> {
    timeline: &'p mut Timeline,
    series: bool,
    ooms: OomObserver<'a>,
    /// None: the steps' peaks are read from the series afterwards.
    phases: Option<&'p phases::Phases>,
    steps: breakdown::StepPeaks,
    capture: Option<memory::Capture>,
    /// The replay keeps no checkpoints: the capture keeps copies of its own.
    copies: bool,
}

impl Observer for Pass<'_, '_> {
    fn start(&mut self, initial: &State) {
        self.capture = Some(memory::Capture::new(initial, self.copies));
    }

    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if let Some(phases) = self.phases {
            self.steps.event(index, phases, state.totals.allocated_bytes);
        }
        if let Some(c) = &mut self.capture {
            c.event(index, e, state);
        }
        if self.series {
            self.timeline.event(index, e, state);
        } else {
            self.timeline.track_peak(index, state);
        }
        self.ooms.event(index, e, state);
    }
}

fn analyze_device(
    snapshot: &Snapshot,
    d: &Device,
    depth: Depth,
    options: Options,
) -> (DeviceAnalysis, Replay, Timeline, memory::Index) {
    let events = snapshot.device_events(d);
    let rules = replay::Rules::from_settings(snapshot.allocator_settings.as_ref());
    let serve = depth == Depth::Serve;
    // What needs only the events is worked out on the other core while this one derives the
    // state before the trace and replays: the phases (which a report's replay reads too, and
    // which a server's reads after its series: the backward pass takes a third of their
    // time, and the replay need not wait), the series' pages faulted in ahead of the replay,
    // and the rest of `EventsWork`.
    let phases = std::sync::OnceLock::new();
    // Outside the scope, so that its memory outlives the thread that faults it in.
    let mut timeline = Timeline::new(if serve { events.len() } else { 0 });
    let unwritten = timeline.unwritten();
    if serve {
        // While the other thread faults the series in, each time this one grows the heap (the
        // replay's checkpoints: about 240 times on big_trace, by 128 KiB) it waits for that
        // thread's hold on the memory map: 0.17 s for the serving analysis instead of 0.14.
        // 16 MiB at a time makes those waits few; a process that serves keeps that much more
        // memory. The command line's report depth faults nothing in and keeps the default.
        crate::machine::pages::grow_heap_by(16 << 20);
    }
    let (replay, pass_rest, side) = std::thread::scope(|scope| {
        let (tx_before, rx_before) = std::sync::mpsc::channel();
        let (tx_ready, rx_ready) = std::sync::mpsc::channel();
        let phases = &phases;
        let side = scope.spawn(move || {
            // Serving, the replay begins to write the series before the phases are known.
            unwritten.prefault();
            let ph = phases.get_or_init(|| memory::phases(snapshot, d));
            let _ = tx_ready.send(());
            EventsWork::new(snapshot, d, ph, serve, || rx_before.recv().ok())
        });
        let start = replay::Start::derive(snapshot, d);
        let _ = tx_before.send(memory::live_blocks(start.initial()).cloned().collect());
        // Where the other thread failed, this one works the phases out itself.
        let wait_phases = || {
            let _ = rx_ready.recv();
            phases.get_or_init(|| memory::phases(snapshot, d))
        };
        let mut pass = Pass {
            timeline: &mut timeline,
            series: serve,
            ooms: OomObserver { snapshot, first: d.events.start, ooms: Vec::new(), count: 0, first_state: None },
            phases: if serve { None } else { Some(wait_phases()) },
            steps: breakdown::StepPeaks::default(),
            capture: None,
            copies: depth == Depth::Report,
        };
        let replay = start.run(snapshot, d, &mut pass, depth != Depth::Report);
        let Pass { ooms, mut steps, capture, .. } = pass;
        if serve {
            steps = breakdown::StepPeaks::from_allocated(wait_phases(), &timeline.allocated_bytes);
        }
        (replay, (ooms, steps, capture), side.join().ok().flatten())
    });
    let (mut ooms, mut steps, mut capture) = pass_rest;
    // Set in the scope, by one thread or the other.
    let phases = phases.into_inner().unwrap_or_default();
    let initial_blocks = || Some(memory::live_blocks(&replay.state_at(snapshot, None)).cloned().collect());
    let EventsWork { labels, freed, times } = match side {
        Some(done) => done,
        None => EventsWork::new(snapshot, d, &phases, serve, initial_blocks).unwrap_or_default(),
    };
    if let Some(times) = times {
        timeline.time_us = times;
    }
    let initial = replay.state_at(snapshot, None);
    let mut peak = timeline.peak;
    if initial.totals.reserved_bytes >= peak.reserved_bytes {
        (peak.reserved_bytes, peak.reserved_event) = (initial.totals.reserved_bytes, None);
    }
    if initial.totals.allocated_bytes >= peak.allocated_bytes {
        (peak.allocated_bytes, peak.allocated_event) = (initial.totals.allocated_bytes, None);
    }
    let end = replay::final_state(d);
    let pinned = gaps::pinned(&end, &snapshot.stacks);
    // At an OOM, the pattern is judged where the job died; otherwise at the end, as replayed
    // (its segments know their creating event and stack; the snapshot's do not).
    let oom_state = ooms.first_state.take();
    let judged = match &oom_state {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None if replay.final_mismatches.is_empty() => std::borrow::Cow::Borrowed(&replay.end),
        None => std::borrow::Cow::Owned(end),
    };
    let rhythm = rhythm::rhythm(&judged, &snapshot.stacks);
    let big = big_allocation(snapshot, events, &ooms.ooms, &judged);
    let big_repeats = match &big {
        Some((Some(site), size)) => repeats(snapshot, events, &rules, site, *size),
        _ => 0,
    };
    let final_state = counters(&d.segments);
    let mut diagnosis = advice::diagnose(&advice::Facts {
        ooms: &ooms.ooms,
        pinned: &pinned,
        reserved_bytes: final_state.reserved_bytes,
        rhythm: &rhythm,
        rules: &rules,
        big: big.clone(),
        big_repeats,
    });
    let steps = std::mem::take(&mut steps).finish(&phases);
    let index = memory::Index { phases, labels, freed };
    let capture = capture.take().unwrap_or_else(|| memory::Capture::new(&initial, false));
    let memory = memory::memory(snapshot, d, &replay, &index, &capture, &peak, steps);
    drop(capture);
    diagnosis.kv_cache = memory
        .breakdown
        .iter()
        .find(|b| b.moment == Moment::Oom)
        .or_else(|| memory.breakdown.iter().find(|b| b.moment == Moment::Final))
        .and_then(|b| b.kv_cache.clone());
    let recorded = snapshot.recorded.iter().find(|r| r.device == d.device);
    let known = need::Known {
        capacity: options.capacity,
        recorded_budget: recorded.and_then(|r| r.budget_bytes),
        device_total: options.device_total.or(recorded.and_then(|r| r.total_bytes)),
    };
    let peak_mix = memory.breakdown.iter().find(|b| b.moment == Moment::Peak).map(need::Mix::of_breakdown);
    diagnosis.need = need::project(&need::Inputs {
        snapshot,
        events,
        index: &index,
        replay: &replay,
        rules: &rules,
        ooms: &ooms.ooms,
        oom_state: oom_state.as_ref(),
        peak: (peak.allocated_bytes, peak.reserved_bytes),
        peak_mix: peak_mix.unwrap_or_default(),
        known,
    });
    if let Some(o) = ooms.ooms.first() {
        diagnosis.outside = Some(need::budget::outside(o, &known));
        let need = diagnosis.need.clone();
        judge::judge(&mut diagnosis, &need);
    }
    predict::predict(snapshot, d, &ooms.ooms, peak.reserved_bytes, &mut diagnosis);
    let before: Vec<(u64, categories::Category)> =
        memory::live_blocks(&initial).map(|b| (b.address, index.labels.of(b))).collect();
    let replaying = capacity::Replaying { snapshot, device: d, index: &index, before };
    let reserved = peak.reserved_bytes;
    capacity::explain(&replaying, &ooms.ooms, &memory, options.capacity, reserved, &mut diagnosis);
    capacity::unweighed_leaks(&memory.growth, &mut diagnosis);
    diagnosis.order_remedies();
    if ooms.ooms.is_empty() {
        let budget = options.capacity.or(recorded.and_then(|r| r.budget_bytes)).or(options.device_total);
        let steps = memory.step_count() as u32;
        if let Some(h) = breakdown::growth_headline(&memory.growth, steps, final_state.reserved_bytes, budget) {
            let rest = diagnosis.summary.trim_start_matches("No OOM in this trace.").trim_start();
            diagnosis.summary = format!("{h} {rest}");
        }
    }
    if !replay.complete {
        diagnosis.summary.push_str(&format!(
            " The trace lost its start: it holds the last {} events (the ring buffer of `max_entries` filled, or recording began late), so what was allocated before them is counted by its blocks, with no history, and the steps before them are not seen.",
            events.len()
        ));
    }
    let analysis = DeviceAnalysis {
        device: d.device,
        final_state,
        trace: trace_summary(snapshot, d, replay.complete),
        peak,
        ooms: ooms.ooms,
        oom_count: ooms.count,
        pinned: pinned.summary.clone(),
        pinners: pinned.pinners.iter().take(20).cloned().collect(),
        gaps: pinned.gaps.iter().take(20).cloned().collect(),
        rhythm,
        diagnosis,
        memory,
        replay: ReplayReport {
            matches_final: replay.final_mismatches.is_empty(),
            mismatches: replay.final_mismatches.clone(),
            warnings: replay.warnings.count,
            first_warnings: replay.warnings.first.clone(),
        },
    };
    (analysis, replay, timeline, index)
}

/// What a device's analysis needs besides the replay: every allocation's category, the event
/// that frees each, and (serving) the series' time column. From the events alone, but for the
/// blocks alive before the trace, which `before` waits for (None: they never came).
#[derive(Default)]
struct EventsWork {
    labels: categories::Labels,
    freed: Vec<u32>,
    times: Option<Vec<i64>>,
}

impl EventsWork {
    fn new(
        snapshot: &Snapshot,
        d: &Device,
        phases: &phases::Phases,
        serve: bool,
        before: impl FnOnce() -> Option<Vec<replay::BlockRec>>,
    ) -> Option<EventsWork> {
        let events = snapshot.device_events(d);
        let times = serve.then(|| timeline::times(snapshot, d.events.clone()));
        let freed = categories::frees(events);
        let labels = categories::label(snapshot, events, phases, &before()?, &freed);
        Some(EventsWork { labels, freed, times })
    }
}

/// How many times `site` allocated `size` bytes (rounded) in the trace.
fn repeats(snapshot: &Snapshot, events: &[Event], rules: &replay::Rules, site: &sites::CallSite, size: u64) -> u64 {
    let mut at_site: HashMap<StackId, bool> = HashMap::new();
    events
        .iter()
        .filter(|e| e.action == Action::ALLOC && rules.round_size(e.size) == size)
        .filter(|e| {
            *at_site.entry(e.stack).or_insert_with(|| call_site(&snapshot.stacks, e.stack).as_ref() == Some(site))
        })
        .count() as u64
}

/// The big allocations to act on: the failing request if the job ran out of memory, else the
/// creation of the largest pinned segment.
fn big_allocation(
    snapshot: &Snapshot,
    events: &[Event],
    ooms: &[Oom],
    state: &State,
) -> Option<(Option<sites::CallSite>, u64)> {
    if let Some(o) = ooms.first() {
        let stack = events[o.event_index as usize].stack;
        return Some((call_site(&snapshot.stacks, stack), o.requested_bytes));
    }
    let seg = state
        .segment_ids()
        .map(|s| state.segment(s))
        .filter(|s| s.live > 0 && s.inactive > 0 && !s.expandable)
        .max_by_key(|s| s.inactive)?;
    // A segment is made to fit the request that created it: its size is that request's, rounded.
    Some((call_site(&snapshot.stacks, seg.stack), seg.size))
}
