//! What the trace holds: events per action and the time it spans.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::snapshot::{Device, Event, Snapshot};

/// How many events of each kind the trace holds, and the time it spans.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraceSummary {
    /// Events of this device.
    pub events: u64,
    /// Events per action name, unknown actions included.
    pub actions: BTreeMap<String, u64>,
    /// Time of the first timed event, microseconds.
    pub first_time_us: Option<i64>,
    /// Time of the last timed event, microseconds.
    pub last_time_us: Option<i64>,
    /// False when the trace does not reach back to an empty allocator: the ring buffer
    /// dropped its oldest events (or recording started after memory was allocated).
    pub complete: bool,
}

/// Counts one device's events; `complete` comes from the replay.
pub fn trace_summary(snapshot: &Snapshot, device: &Device, complete: bool) -> TraceSummary {
    summary(snapshot, device, &count_actions(snapshot.device_events(device)), complete)
}

/// Events per action code (256 counts): the analysis counts them on its side thread
/// (`pass.rs`), beside the replay, rather than in a pass of its own after it.
pub(super) fn count_actions(events: &[Event]) -> Vec<u64> {
    let mut counts = vec![0u64; 256];
    for e in events {
        counts[e.action.0 as usize] += 1;
    }
    counts
}

/// The summary from the counts [`count_actions`] made of the device's events.
pub(super) fn summary(snapshot: &Snapshot, device: &Device, counts: &[u64], complete: bool) -> TraceSummary {
    let actions = counts
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(code, n)| (snapshot.action_name(crate::snapshot::Action(code as u8)).to_string(), *n))
        .collect();
    TraceSummary {
        events: device.events.len() as u64,
        actions,
        first_time_us: device.events.clone().find_map(|i| snapshot.time(i)),
        last_time_us: device.events.clone().rev().find_map(|i| snapshot.time(i)),
        complete,
    }
}
