//! What-if: the trace's allocation requests replayed through a model of the caching allocator
//! (`allocator`) under other settings, to predict what the same program would have done.
//!
//! The requests are the trace's `alloc` and `free_completed` events in order (and each `oom`
//! event's request, which the program made and the real allocator refused), each in the pool
//! the replay shows it used (so CUDA graph and MemPool allocations stay private). Blocks live
//! before the trace began are allocated first. A run of `segment_free`/`segment_unmap` events
//! that no new segment follows is the program calling `torch.cuda.empty_cache()`, which the
//! model does too; releases that a new segment follows are the allocator's own, which the model
//! makes by itself. Code remedies are modelled: `mempool` sends a call site's allocations to a
//! private pool, `reuse` serves them from preallocated buffers of the site's largest size.

pub(crate) mod allocator;
mod sim;

use foldhash::{HashMap, HashMapExt};

use serde::Serialize;

use crate::replay::{Observer, Rules, Start, State};
use crate::snapshot::sites;
use crate::snapshot::{Action, BlockState, Device, Event, Snapshot, StackId};
use allocator::Allocator;
use sim::{Reuse, Sim};

/// What to simulate.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as a user writes it (`expandable_segments:True,...`); None
    /// keeps the snapshot's own settings, `Some("")` is the default allocator.
    pub conf: Option<String>,
    /// The per-process memory budget; None predicts no OOM.
    pub capacity: Option<u64>,
    /// Call site (`file:line` or a function name) whose allocations go to a private MemPool.
    pub mempool: Option<String>,
    /// Call site whose allocations reuse preallocated buffers.
    pub reuse: Option<String>,
    /// Requests made smaller, as a remedy for capacity would make them (see [`Shrink`]).
    pub shrink: Option<std::sync::Arc<Shrink>>,
}

/// How much of each request to keep, in percent: by device event (its `alloc`, or the request
/// of an `oom`), and for blocks alive before the trace, by address. 100 where not listed.
#[derive(Debug, Clone, Default)]
pub struct Shrink {
    /// Percent kept by device event index.
    pub events: Vec<u8>,
    /// Percent kept by address, for blocks alive before the trace.
    pub before: HashMap<u64, u8>,
}

impl Shrink {
    fn apply(size: u64, keep: u8) -> u64 {
        if keep >= 100 { size } else { (size * keep as u64 / 100).max(1) }
    }
}

/// Where the model ran out of memory.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SimOom {
    /// The event whose request failed.
    pub event_index: u64,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes reserved when it failed.
    pub reserved_bytes: u64,
    /// Bytes allocated when it failed.
    pub allocated_bytes: u64,
}

/// What the model did with the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The CUDA device index.
    pub device: i64,
    /// The `PYTORCH_CUDA_ALLOC_CONF` tried.
    pub conf: String,
    /// The budget, if any.
    pub capacity_bytes: Option<u64>,
    /// Where the budget came from: `given`, or `implied` (by the trace's OOM: the most the
    /// process held reserved before it); absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_source: Option<&'static str>,
    /// Events replayed (all, or up to the OOM).
    pub replayed_events: u64,
    /// Most bytes reserved.
    pub peak_reserved_bytes: u64,
    /// Most bytes allocated.
    pub peak_allocated_bytes: u64,
    /// The first OOM, if the budget was exceeded.
    pub oom: Option<SimOom>,
    /// Reserved bytes after the last replayed event.
    pub final_reserved_bytes: u64,
    /// Free bytes pinned by live blocks after the last replayed event.
    pub pinned_free_bytes_at_end: u64,
    /// The event of the trace's own OOM, where it has one: a snapshot taken at an OOM ends
    /// there, so a replay that gets past it shows only that this request was served, not that
    /// the rest of the step fits (the analysis's `diagnosis.need` says what the step needed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_oom_event: Option<u64>,
}

/// Why a simulation could not run: what the user asked is not something it can replay.
/// Every variant is the asker's to fix (the API answers 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimulateError {
    /// A part of `PYTORCH_CUDA_ALLOC_CONF` that is not `key:value`.
    #[error("{0:?} is not key:value")]
    NotKeyValue(String),
    /// A value that does not parse for its key.
    #[error("{key}: cannot read {value:?}")]
    BadValue {
        /// The setting.
        key: String,
        /// What was given.
        value: String,
    },
    /// A value outside what torch accepts.
    #[error("{0}")]
    OutOfRange(String),
    /// A setting torch's allocator does not have.
    #[error("unknown allocator setting {0:?}")]
    UnknownSetting(String),
    /// A MemPool or reused buffer around a call site no allocation comes from.
    #[error("no allocation in the trace comes from {0:?}")]
    NoSuchSite(String),
}

/// Torch's defaults with `conf` applied; an error names the key or value it cannot read.
pub fn parse_conf(conf: &str) -> Result<Rules, SimulateError> {
    let mut rules = Rules::default();
    for part in conf.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once(':').ok_or_else(|| SimulateError::NotKeyValue(part.to_string()))?;
        let bad = || SimulateError::BadValue { key: key.to_string(), value: value.to_string() };
        match key.trim() {
            "expandable_segments" => rules.expandable_segments = matches!(value.trim(), "True" | "true" | "1"),
            "max_split_size_mb" => {
                let mb: u64 = value.trim().parse().map_err(|_| bad())?;
                if mb < 20 {
                    return Err(SimulateError::OutOfRange(format!("max_split_size_mb must be at least 20, got {mb}")));
                }
                rules.max_split_size = mb << 20;
            }
            "garbage_collection_threshold" => {
                let t: f64 = value.trim().parse().map_err(|_| bad())?;
                if !(0.0..1.0).contains(&t) {
                    return Err(SimulateError::OutOfRange(format!(
                        "garbage_collection_threshold must be in (0, 1), got {t}"
                    )));
                }
                rules.gc_threshold = t;
            }
            "roundup_power2_divisions" => {
                let n: u64 = value.trim().parse().map_err(|_| bad())?;
                rules.divisions = [n; 16];
            }
            // Settings that do not change where blocks land.
            "backend"
            | "release_lock_on_cudamalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_num_register_threads" => {}
            other => return Err(SimulateError::UnknownSetting(other.to_string())),
        }
    }
    Ok(rules)
}

/// Whether a stack has a frame that `site` names: `file:line` (the file's end) or a function.
pub fn site_matches(snapshot: &Snapshot, stack: StackId, site: &str) -> bool {
    let (file, line) = match site.rsplit_once(':') {
        Some((f, l)) if l.parse::<i64>().is_ok() => (Some(f), l.parse::<i64>().ok()),
        _ => (None, None),
    };
    snapshot.stacks.frames(stack).any(|f| match (file, line) {
        (Some(file), Some(line)) => f.line == line && snapshot.stacks.str(f.filename).ends_with(file),
        _ => snapshot.stacks.str(f.name) == site,
    })
}

/// Simulates one device's trace under `settings`.
pub fn simulate(snapshot: &Snapshot, device: &Device, settings: &Settings) -> Result<Outcome, SimulateError> {
    let (rules, conf) = match &settings.conf {
        Some(c) if c.trim().is_empty() => (parse_conf(c)?, "(the default allocator)".to_string()),
        Some(c) => (parse_conf(c)?, c.clone()),
        None => {
            (Rules::from_settings(snapshot.allocator_settings.as_ref()), "(the snapshot's own settings)".to_string())
        }
    };
    let events = snapshot.device_events(device);
    let reuse = settings.reuse.as_ref().map(|site| {
        let mut matches = HashMap::new();
        let size = events
            .iter()
            .filter(|e| e.action == Action::ALLOC && Sim::matches(snapshot, &mut matches, site, e.stack))
            .map(|e| e.size)
            .max()
            .unwrap_or(0);
        Reuse { site: site.clone(), matches, size, buffers: Vec::new(), idle: Vec::new() }
    });
    if let Some(r) = &reuse
        && r.size == 0
    {
        return Err(SimulateError::NoSuchSite(r.site.clone()));
    }
    if let Some(site) = &settings.mempool
        && !events.iter().any(|e| e.action == Action::ALLOC && site_matches(snapshot, e.stack, site))
    {
        return Err(SimulateError::NoSuchSite(site.clone()));
    }
    let capacity = settings.capacity.or_else(|| implied_budget(device, events));
    let mut sim = Sim {
        trace: None,
        snapshot,
        events,
        alloc: Allocator::new(rules, capacity),
        tags: HashMap::new(),
        pools: HashMap::new(),
        mempool: settings.mempool.clone().map(|s| (s, HashMap::new())),
        reuse,
        oom: None,
        replayed: 0,
        shrink: settings.shrink.clone(),
    };
    sim.run(device);
    Ok(Outcome {
        device: device.device,
        conf,
        capacity_bytes: capacity,
        capacity_source: match (settings.capacity, capacity) {
            (Some(_), _) => Some("given"),
            (None, Some(_)) => Some("implied"),
            (None, None) => None,
        },
        replayed_events: sim.replayed,
        peak_reserved_bytes: sim.alloc.peak_reserved,
        peak_allocated_bytes: sim.alloc.peak_allocated,
        oom: sim.oom,
        final_reserved_bytes: sim.alloc.reserved,
        pinned_free_bytes_at_end: sim.alloc.pinned_free_bytes(),
        trace_oom_event: snapshot.device_events(device).iter().position(|e| e.action == Action::OOM).map(|i| i as u64),
    })
}

/// The budget a trace that ran out of memory implies: the most the process held reserved
/// before its first OOM (the limit was at least that). Reserved bytes over the trace follow
/// from the final segments and the segment events; None without an OOM.
fn implied_budget(device: &Device, events: &[Event]) -> Option<u64> {
    let first_oom = events.iter().position(|e| e.action == Action::OOM)?;
    let grows = |e: &Event| match e.action {
        Action::SEGMENT_ALLOC | Action::SEGMENT_MAP => e.size as i128,
        Action::SEGMENT_FREE | Action::SEGMENT_UNMAP => -(e.size as i128),
        _ => 0,
    };
    let end: i128 = device.segments.iter().map(|s| s.total_size as i128).sum();
    let mut reserved = end - events.iter().map(grows).sum::<i128>();
    let mut most = reserved;
    for e in &events[..first_oom] {
        reserved += grows(e);
        most = most.max(reserved);
    }
    u64::try_from(most).ok().filter(|b| *b > 0)
}

/// A call site as `--mempool` and `--reuse` take it.
pub fn site_arg(site: &sites::CallSite) -> String {
    format!("{}:{}", site.filename, site.line)
}

/// The model's reserved bytes after each event (for finding where it departs from a trace).
#[doc(hidden)]
pub fn simulate_traced(snapshot: &Snapshot, device: &Device, settings: &Settings) -> Vec<u64> {
    let rules = match &settings.conf {
        Some(c) => parse_conf(c).unwrap_or_default(),
        None => Rules::from_settings(snapshot.allocator_settings.as_ref()),
    };
    let mut sim = Sim {
        trace: Some(Vec::new()),
        snapshot,
        events: snapshot.device_events(device),
        alloc: Allocator::new(rules, settings.capacity),
        tags: HashMap::new(),
        pools: HashMap::new(),
        mempool: None,
        reuse: None,
        oom: None,
        replayed: 0,
        shrink: settings.shrink.clone(),
    };
    sim.run(device);
    sim.trace.unwrap_or_default()
}
