//! The typed snapshot model: what `torch.cuda.memory._snapshot()` holds, per device.
//!
//! Built from reader values by [`build`]; read by replay and analysis. It holds the final
//! `segments` (with their blocks), the trace as compact [`Event`]s, interned frames and stacks,
//! streams, pools, allocator settings and annotations. It does not compute anything: every
//! number about the data is in `analysis`.

mod build;
mod error;
mod expansion;
mod sink;
pub(crate) mod sites;
mod stacks;
mod times;
mod trace;
mod validate;
mod walker;

pub use build::{build, build_within};
pub use error::ModelError;
pub use expansion::{Budget, MAX_DEVICES};
pub use sink::SnapshotSink;
pub use stacks::{EMPTY_STACK, Frame, FrameId, StackId, Stacks};
pub use times::Times;
pub use trace::{Action, Event, Extra, NO_TIME};

use std::ops::Range;

/// A whole snapshot file, all devices.
#[derive(Debug)]
pub struct Snapshot {
    /// Each device's segments and its range of the trace.
    pub devices: Vec<Device>,
    /// Events of all devices, device after device; [`Device::events`] slices it.
    pub events: Vec<Event>,
    /// The time of each event, by the same index: see [`Snapshot::time`].
    pub times: Times,
    /// Compile context and user metadata of the events that carry them, by event index.
    pub extras: Vec<Extra>,
    /// Interned frames and stacks that events, segments and blocks point into.
    pub stacks: Stacks,
    /// Raw `cudaStream_t` values; events and segments refer to them by index.
    pub streams: Vec<i64>,
    /// Names of actions this version does not know (codes from `Action::FIRST_UNKNOWN`).
    pub unknown_actions: Vec<String>,
    /// `allocator_settings` as written (torch >= 2.3), untouched.
    pub allocator_settings: Option<serde_json::Value>,
    /// `external_annotations` (torch >= 2.5): named ranges such as optimizer steps.
    pub annotations: Vec<Annotation>,
    /// What fragscope's capture client recorded about each device (`fragscope_context`).
    pub recorded: Vec<Recorded>,
    /// The file was a bare list of segments (before torch added traces).
    pub legacy: bool,
    /// Contradictions found in the file and how they were repaired.
    pub warnings: Vec<String>,
}

impl Snapshot {
    /// The name of an action code, unknown ones included.
    pub fn action_name(&self, action: Action) -> &str {
        match Action::KNOWN.get(action.0 as usize) {
            Some(name) => name,
            None => self
                .unknown_actions
                .get((action.0 - Action::FIRST_UNKNOWN) as usize)
                .map(|s| s.as_str())
                .unwrap_or("unknown"),
        }
    }

    /// The events of one device, oldest first.
    pub fn device_events(&self, device: &Device) -> &[Event] {
        &self.events[device.events.clone()]
    }

    /// The time of event `index` (of [`Snapshot::events`]) in microseconds since the epoch,
    /// when its entry had one.
    pub fn time(&self, index: usize) -> Option<i64> {
        self.times.get(index)
    }

    /// Bytes the events and their times hold in memory (about 25 an event).
    pub fn event_bytes(&self) -> u64 {
        (self.events.len() * std::mem::size_of::<Event>()) as u64 + self.times.bytes()
    }

    /// The raw `cudaStream_t` of a stream index (0 when out of range).
    pub fn stream(&self, index: u16) -> i64 {
        self.streams.get(index as usize).copied().unwrap_or(0)
    }

    /// The whole model as text in a fixed order (strings and stacks listed by id; the hash
    /// maps that index them, whose order varies between processes, left out): two reads of
    /// the same file by different paths of the reader must give the same text.
    pub fn canonical_text(&self) -> String {
        let mut out = format!(
            "{:#?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{} {:?}\n",
            self.devices,
            self.events,
            (0..self.times.len()).map(|i| self.times.get(i)).collect::<Vec<_>>(),
            self.extras,
            self.streams,
            self.unknown_actions,
            self.allocator_settings,
            self.annotations,
            self.legacy,
            self.warnings
        );
        for id in 0..self.stacks.strings.len() {
            out.push_str(&format!("str {id} {:?}\n", self.stacks.strings.get(id as u32)));
        }
        for id in 0..self.stacks.stack_count() {
            out.push_str(&format!("stack {id} {:?}\n", self.stacks.frames(id as u32).collect::<Vec<_>>()));
        }
        out
    }

    /// The compile context and user metadata of event `index` (of [`Snapshot::events`]), for
    /// the few events that carry them.
    pub fn extra(&self, index: usize) -> (Option<&str>, Option<&str>) {
        let Ok(i) = self.extras.binary_search_by_key(&index, |x| x.event as usize) else { return (None, None) };
        let x = &self.extras[i];
        (x.compile_context.map(|s| self.stacks.str(s)), x.user_metadata.map(|s| self.stacks.str(s)))
    }
}

/// What the file was, as reported under `source` in the analysis.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    /// Size of the upload as received (before decompression).
    pub bytes: u64,
    /// SHA-256 of those bytes, lower-case hex: always on the server (its content address);
    /// the command line computes it only when asked (`analyze --sha256`), since on a machine
    /// without SHA instructions it costs more CPU than the analysis it would delay.
    pub sha256: Option<String>,
    /// `pickle` or `json`.
    pub encoding: String,
    /// `none`, `gzip` or `zstd`.
    pub compression: String,
    /// The pickle protocol, for pickles.
    pub pickle_protocol: Option<u8>,
}

/// One device's part of the snapshot.
#[derive(Debug)]
pub struct Device {
    /// The CUDA device index.
    pub device: i64,
    /// Segments of this device in address order.
    pub segments: Vec<Segment>,
    /// This device's range of [`Snapshot::events`], oldest first.
    pub events: Range<usize>,
}

/// The allocator's two size classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Blocks of at most 1 MiB, in 2 MiB segments.
    Small,
    /// Blocks over 1 MiB, in 20 MiB segments (requests over 10 MiB get their own size).
    Large,
}

/// Which free list a block belongs to: small or large, and the private pool id ((0, 0) is the
/// default pool; anything else a CUDA graph or `torch.cuda.MemPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool {
    /// Small or large.
    pub kind: PoolKind,
    /// The private pool's id; (0, 0) for the default pool.
    pub id: (i64, i64),
}

impl Pool {
    /// Whether the pool is a private one (CUDA graph or `MemPool`).
    pub fn is_private(&self) -> bool {
        self.id != (0, 0)
    }
}

/// One cudaMalloc'd segment (or expandable mapping) as the snapshot lists it.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Its device address.
    pub address: u64,
    /// Its size in bytes.
    pub total_size: u64,
    /// Index into [`Snapshot::streams`].
    pub stream: u16,
    /// The free list it serves.
    pub pool: Pool,
    /// Made with `expandable_segments`: it grows and shrinks by pages.
    pub is_expandable: bool,
    /// Stack of the cudaMalloc that made it (often empty).
    pub stack: StackId,
    /// Its blocks in address order, covering it without gaps.
    pub blocks: Vec<Block>,
}

/// A block's state, as the snapshot names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// A live tensor.
    ActiveAllocated,
    /// Freed, but another stream may still use it (`record_stream`).
    ActivePendingFree,
    /// Cached free memory.
    Inactive,
}

impl BlockState {
    /// The name the snapshot uses.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    /// Allocated, or freed but still in use by another stream.
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

/// One block of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Its device address.
    pub address: u64,
    /// Its size in bytes (the request rounded up).
    pub size: u64,
    /// The last request served by this block (stale once it is inactive).
    pub requested_size: u64,
    /// Live, pending free or cached free.
    pub state: BlockState,
    /// Stack of the request that made it live.
    pub stack: StackId,
}

/// A device's memory as the capture client read it when it took the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The CUDA device index.
    pub device: i64,
    /// `torch.cuda.get_device_properties(d).total_memory`.
    pub total_bytes: Option<u64>,
    /// The total times `torch.cuda.get_per_process_memory_fraction()`, where set below 1.
    pub budget_bytes: Option<u64>,
}

/// One `record_function` range boundary from `external_annotations`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Annotation {
    /// The range's name.
    pub name: String,
    /// `START` or `END`.
    pub stage: String,
    /// The CUDA device it was recorded on.
    pub device: i64,
    /// When, in microseconds since the epoch.
    pub time_us: i64,
}
