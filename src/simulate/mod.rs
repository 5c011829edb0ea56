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

use foldhash::{HashMap, HashMapExt};

use serde::Serialize;

use crate::replay::{Observer, Rules, Start, State};
use crate::snapshot::sites;
use crate::snapshot::{Action, BlockState, Device, Event, Snapshot, StackId};
use allocator::Allocator;

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

/// A traced block in the model: a block of its own, or one of a reuse site's buffers.
#[derive(Clone, Copy)]
enum Tag {
    Block(u32),
    Buffer(usize),
}

struct Sim<'a> {
    trace: Option<Vec<u64>>,
    snapshot: &'a Snapshot,
    events: &'a [Event],
    alloc: Allocator,
    tags: HashMap<u64, Tag>,
    /// Private pool ids of the snapshot to the model's pool numbers (0 is the default pool).
    pools: HashMap<(i64, i64), u32>,
    mempool: Option<(String, HashMap<StackId, bool>)>,
    reuse: Option<Reuse>,
    oom: Option<SimOom>,
    replayed: u64,
    shrink: Option<std::sync::Arc<Shrink>>,
}

struct Reuse {
    site: String,
    matches: HashMap<StackId, bool>,
    size: u64,
    buffers: Vec<u32>,
    idle: Vec<usize>,
}

const MEMPOOL: u32 = u32::MAX;

impl Sim<'_> {
    /// The model's pool for a block the replayed `state` holds at `address`; without a state
    /// (no private pools in the trace), the default pool.
    fn pool_of(&mut self, state: Option<&State>, address: u64) -> u32 {
        let Some((state, b)) = state.and_then(|s| Some((s, s.block_at(address)?))) else { return 0 };
        let id = state.segment(state.block(b).segment).pool.id;
        if id == (0, 0) {
            return 0;
        }
        let next = self.pools.len() as u32 + 1;
        *self.pools.entry(id).or_insert(next)
    }

    fn matches(snapshot: &Snapshot, cache: &mut HashMap<StackId, bool>, site: &str, stack: StackId) -> bool {
        *cache.entry(stack).or_insert_with(|| site_matches(snapshot, stack, site))
    }

    fn request(&mut self, index: usize, address: Option<u64>, size: u64, stream: u16, stack: StackId, pool: u32) {
        let snapshot = self.snapshot;
        if let Some(r) = &mut self.reuse
            && Self::matches(snapshot, &mut r.matches, &r.site, stack)
        {
            let buffer = match r.idle.pop() {
                Some(i) => i,
                None => match self.alloc.malloc(r.size, stream, pool) {
                    Some(b) => {
                        r.buffers.push(b);
                        r.buffers.len() - 1
                    }
                    None => {
                        let size = r.size;
                        return self.fail(index, size);
                    }
                },
            };
            if let Some(a) = address {
                self.tags.insert(a, Tag::Buffer(buffer));
            }
            return;
        }
        let private = match &mut self.mempool {
            Some((site, cache)) => Self::matches(snapshot, cache, site, stack),
            None => false,
        };
        let pool = if private { MEMPOOL } else { pool };
        match self.alloc.malloc(size, stream, pool) {
            Some(b) => {
                if let Some(a) = address {
                    self.tags.insert(a, Tag::Block(b));
                }
            }
            None => {
                let rounded = self.alloc.round(size);
                self.fail(index, rounded)
            }
        }
    }

    fn fail(&mut self, index: usize, requested: u64) {
        self.oom = Some(SimOom {
            event_index: index as u64,
            requested_bytes: requested,
            reserved_bytes: self.alloc.reserved,
            allocated_bytes: self.alloc.allocated,
        });
    }

    /// Whether a release in the trace is the program's `torch.cuda.empty_cache()` (which the
    /// model must repeat) rather than the allocator's own (which the model makes by itself).
    /// Its stack says so (torch records `empty_cache` in `torch/cuda/memory.py`); without
    /// frames, a release that no new segment follows was not the allocator's retry.
    fn user_release(&self, index: usize, e: &Event) -> bool {
        let stacks = &self.snapshot.stacks;
        let mut frames = stacks.frames(e.stack).peekable();
        if frames.peek().is_some() {
            return stacks.frames(e.stack).any(|f| stacks.str(f.name) == "empty_cache");
        }
        let creates = |a: Action| {
            matches!(
                a,
                Action::SEGMENT_ALLOC
                    | Action::SEGMENT_MAP
                    | Action::SEGMENT_FREE
                    | Action::SEGMENT_UNMAP
                    | Action::OOM
            )
        };
        self.events.get(index + 1).is_none_or(|n| !creates(n.action))
    }

    fn release(&mut self, address: u64) {
        match self.tags.remove(&address) {
            Some(Tag::Block(b)) => self.alloc.free(b),
            Some(Tag::Buffer(i)) => {
                if let Some(r) = &mut self.reuse {
                    r.idle.push(i);
                }
            }
            None => {}
        }
    }
}

impl Observer for Sim<'_> {
    fn start(&mut self, initial: &State) {
        for s in initial.segment_ids() {
            for b in initial.block_ids(s) {
                let blk = initial.block(b);
                if blk.state != BlockState::Inactive {
                    let pool = self.pool_of(Some(initial), blk.address);
                    let keep = self.shrink.as_ref().and_then(|s| s.before.get(&blk.address).copied()).unwrap_or(100);
                    let size = Shrink::apply(blk.size, keep);
                    let stream = initial.segment(s).stream;
                    self.request(0, Some(blk.address), size, stream, blk.stack, pool);
                }
            }
        }
    }

    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if self.oom.is_none() {
            self.step(index, e, Some(state));
        }
    }
}

impl Sim<'_> {
    /// Feeds the model the trace. Only a request's pool needs the replay's state at each
    /// event; without private pools every request goes to the default one, and the state
    /// before the trace is all the model needs from the replay (a fifth of the time saved).
    fn run(&mut self, device: &Device) {
        let start = Start::derive(self.snapshot, device);
        if start.private_pools() {
            start.run(self.snapshot, device, self, false);
            return;
        }
        self.start(start.initial());
        for (i, e) in self.events.iter().enumerate() {
            if self.oom.is_some() {
                break;
            }
            self.step(i, e, None);
        }
    }

    fn shrunk(&self, index: usize, size: u64) -> u64 {
        let keep = self.shrink.as_ref().and_then(|s| s.events.get(index).copied()).unwrap_or(100);
        Shrink::apply(size, keep)
    }

    fn step(&mut self, index: usize, e: &Event, state: Option<&State>) {
        self.replayed = index as u64 + 1;
        self.event_inner(index, e, state);
        if let Some(t) = &mut self.trace {
            t.push(self.alloc.reserved);
        }
    }

    fn event_inner(&mut self, index: usize, e: &Event, state: Option<&State>) {
        match e.action {
            Action::ALLOC => {
                let pool = self.pool_of(state, e.addr);
                self.request(index, Some(e.addr), self.shrunk(index, e.size), e.stream, e.stack, pool);
            }
            Action::OOM => self.request(index, None, self.shrunk(index, e.size), e.stream, e.stack, 0),
            Action::FREE_COMPLETED => self.release(e.addr),
            Action::SEGMENT_FREE | Action::SEGMENT_UNMAP if self.user_release(index, e) => self.alloc.release_cached(),
            _ => {}
        }
    }
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
