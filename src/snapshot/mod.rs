//! The typed snapshot model: what `torch.cuda.memory._snapshot()` holds, per device.
//!
//! Built from reader values by [`build`]; read by replay and analysis. It holds the final
//! `segments` (with their blocks), the trace as compact [`Event`]s, interned frames and stacks,
//! streams, pools, allocator settings and annotations. It does not compute anything: every
//! number about the data is in `analysis`.

mod build;
mod error;
mod sink;
pub mod sites;
mod stacks;
mod trace;
mod validate;

pub use build::build;
pub use error::ModelError;
pub use sink::SnapshotSink;
pub use stacks::{EMPTY_STACK, Frame, FrameId, StackId, Stacks};
pub use trace::{Action, Event, Extra, NO_TIME};

use std::ops::Range;

#[derive(Debug)]
pub struct Snapshot {
    pub devices: Vec<Device>,
    /// Events of all devices, device after device; [`Device::events`] slices it.
    pub events: Vec<Event>,
    /// Compile context and user metadata of the events that carry them, by event index.
    pub extras: Vec<Extra>,
    pub stacks: Stacks,
    /// Raw `cudaStream_t` values; events and segments refer to them by index.
    pub streams: Vec<i64>,
    /// Names of actions this version does not know (codes from `Action::FIRST_UNKNOWN`).
    pub unknown_actions: Vec<String>,
    /// `allocator_settings` as written (torch >= 2.3), untouched.
    pub allocator_settings: Option<serde_json::Value>,
    pub annotations: Vec<Annotation>,
    /// The file was a bare list of segments (before torch added traces).
    pub legacy: bool,
    /// Contradictions found in the file and how they were repaired.
    pub warnings: Vec<String>,
}

impl Snapshot {
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

    pub fn device_events(&self, device: &Device) -> &[Event] {
        &self.events[device.events.clone()]
    }

    pub fn stream(&self, index: u16) -> i64 {
        self.streams.get(index as usize).copied().unwrap_or(0)
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    pub bytes: u64,
    pub sha256: String,
    /// `pickle` or `json`.
    pub encoding: String,
    /// `none`, `gzip` or `zstd`.
    pub compression: String,
    pub pickle_protocol: Option<u8>,
}

#[derive(Debug)]
pub struct Device {
    pub device: i64,
    /// Segments of this device in address order.
    pub segments: Vec<Segment>,
    /// This device's range of [`Snapshot::events`], oldest first.
    pub events: Range<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Blocks of at most 1 MiB, in 2 MiB segments.
    Small,
    Large,
}

/// Which free list a block belongs to: small or large, and the private pool id ((0, 0) is the
/// default pool; anything else a CUDA graph or `torch.cuda.MemPool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool {
    pub kind: PoolKind,
    pub id: (i64, i64),
}

impl Pool {
    pub fn is_private(&self) -> bool {
        self.id != (0, 0)
    }
}

#[derive(Debug, Clone)]
pub struct Segment {
    pub address: u64,
    pub total_size: u64,
    pub stream: u16,
    pub pool: Pool,
    pub is_expandable: bool,
    /// Stack of the cudaMalloc that made it (often empty).
    pub stack: StackId,
    pub blocks: Vec<Block>,
}

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
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// The last request served by this block (stale once it is inactive).
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: StackId,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Annotation {
    pub name: String,
    /// `START` or `END`.
    pub stage: String,
    pub device: i64,
    pub time_us: i64,
}
