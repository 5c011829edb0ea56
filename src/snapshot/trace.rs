//! Trace events: one compact record per entry of `device_traces`.
//!
//! | action | addr | size |
//! |---|---|---|
//! | alloc | block address | the requested bytes, not the rounded block size |
//! | free_requested | block | requested bytes |
//! | free_completed | block | requested bytes (after `record_stream` waits, later than free_requested) |
//! | segment_alloc / segment_free | segment (cudaMalloc / cudaFree) | segment bytes |
//! | segment_map / segment_unmap | start of the range (expandable segments only) | bytes, whole pages |
//! | snapshot | 0 | total active bytes |
//! | oom | `device_free` (cudaMemGetInfo free bytes) | the rounded request |
//!
//! Unknown actions are kept with their name, so newer torch versions still load.

/// An action code: the known ones are constants; codes from `FIRST_UNKNOWN` on name actions
/// this version does not know, through [`super::Snapshot::action_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action(pub u8);

impl Action {
    /// A block was allocated.
    pub const ALLOC: Action = Action(0);
    /// A block was freed, to be reusable once its streams are done with it.
    pub const FREE_REQUESTED: Action = Action(1);
    /// A freed block became reusable.
    pub const FREE_COMPLETED: Action = Action(2);
    /// A segment was cudaMalloc'd.
    pub const SEGMENT_ALLOC: Action = Action(3);
    /// A segment was cudaFree'd.
    pub const SEGMENT_FREE: Action = Action(4);
    /// Pages were mapped into an expandable segment.
    pub const SEGMENT_MAP: Action = Action(5);
    /// Pages were unmapped from an expandable segment.
    pub const SEGMENT_UNMAP: Action = Action(6);
    /// The snapshot was taken.
    pub const SNAPSHOT: Action = Action(7);
    /// A request failed: out of memory.
    pub const OOM: Action = Action(8);
    /// The first code of an action this version does not know.
    pub const FIRST_UNKNOWN: u8 = 9;

    /// Names of the known actions, indexed by code.
    pub const KNOWN: [&'static str; 9] = [
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "snapshot",
        "oom",
    ];

    /// The code of a known action name.
    pub fn known(name: &str) -> Option<Action> {
        Self::KNOWN.iter().position(|n| *n == name).map(|i| Action(i as u8))
    }
}

/// Marks a time that was not recorded (an entry's `time_us` of this value reads as none).
pub const NO_TIME: i64 = i64::MIN;

/// One trace entry, 23 bytes: packed, since millions of them are most of what a read keeps
/// (aligned, the padding would be a byte an event; x86 and ARM read the unaligned fields at
/// no cost). Take a field by value (`{ e.addr }` where a reference is wanted). Its time is in
/// [`super::Snapshot::times`] (about 2 bytes more), and the strings that few entries carry
/// (compile context, user metadata) in [`super::Snapshot::extras`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(1))]
pub struct Event {
    /// Block or segment address; for `oom`, the `device_free` bytes.
    pub addr: u64,
    /// Block or segment size; for `oom`, the request.
    pub size: u64,
    /// Stack of the request.
    pub stack: super::StackId,
    /// Index into [`super::Snapshot::streams`].
    pub stream: u16,
    /// What happened.
    pub action: Action,
}

// A read keeps millions of events: their size is a memory figure the benches hold.
const _: () = assert!(std::mem::size_of::<Event>() == 23);

/// The rarely-set strings of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extra {
    /// Index of the event in [`super::Snapshot::events`].
    pub event: u32,
    /// The `torch.compile` context, if recorded.
    pub compile_context: Option<crate::reader::StrId>,
    /// The `user_metadata` tag, if set.
    pub user_metadata: Option<crate::reader::StrId>,
}
