//! What analysing a snapshot costs in memory, and the budget it is held to.
//!
//! Two checks, both before the memory is taken: while a file is read, `ingest` charges the
//! reader's values, each event and each segment's blocks at the per-part costs below
//! ([`costs`]); once it is parsed, [`memory_needed`] counts what the analysis will hold from
//! the model itself, and [`within`] refuses a snapshot whose analysis cannot fit the budget at
//! all. The costs were measured (massif and peak RSS) on snapshots of a million small blocks
//! and of ten million events: a block costs about 600 bytes through a report and 1,000
//! through the serving analysis (the replay's state holds it, and the states kept at the end,
//! at the peak and at each checkpoint each copy it); an event under 130.

use std::fmt;

use crate::replay;
use crate::snapshot::{Budget, Snapshot};

/// Bytes a block costs through the serving analysis (the most any depth takes).
pub const PER_BLOCK: u64 = 1024;
/// Bytes a segment costs beside its blocks.
pub const PER_SEGMENT: u64 = 512;
/// Bytes a trace event costs: the model, the series and index, the checkpoints' share.
pub const PER_EVENT: u64 = 128;

/// The per-part costs with `bytes` of budget, for `ingest::Options::memory`.
pub fn costs(bytes: u64) -> Budget {
    Budget { bytes, per_block: PER_BLOCK, per_segment: PER_SEGMENT, per_event: PER_EVENT }
}

/// About the most memory analysing a parsed `snapshot` holds at once, in bytes, from what it
/// really holds rather than its file's size: the model and the states the replay keeps for
/// each block, the timeline's columns and the per-allocation index (64 bytes an event
/// together), and the checkpoints (each a copy of the state). The server charges its
/// analysis budget for this once a file is parsed.
pub fn memory_needed(snapshot: &Snapshot) -> u64 {
    let c = counts(snapshot);
    let state = (c.blocks * 64).max(256 << 10);
    let checkpoints = (c.events / replay::CHECKPOINT_EVERY as u64 + 2 * snapshot.devices.len() as u64) * state;
    snapshot.event_bytes() + c.events * 64 + c.blocks * PER_BLOCK + c.segments * PER_SEGMENT + checkpoints + (16 << 20)
}

/// A snapshot whose analysis needs more than the whole budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    /// Bytes the analysis would need.
    pub need: u64,
    /// Bytes of the budget.
    pub budget: u64,
    /// The counts that make the need, for the message.
    pub blocks: u64,
    /// Segments in all.
    pub segments: u64,
    /// Trace events in all.
    pub events: u64,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "analysing {} blocks in {} segments and {} events needs about {} MiB, past the memory budget of {} MiB",
            self.blocks,
            self.segments,
            self.events,
            self.need >> 20,
            self.budget >> 20
        )
    }
}

impl std::error::Error for OverBudget {}

/// What the analysis of `snapshot` needs, or the refusal when that is more than `budget`.
pub fn within(snapshot: &Snapshot, budget: u64) -> Result<u64, OverBudget> {
    let need = memory_needed(snapshot);
    if need <= budget {
        return Ok(need);
    }
    let c = counts(snapshot);
    Err(OverBudget { need, budget, blocks: c.blocks, segments: c.segments, events: c.events })
}

struct Counts {
    events: u64,
    segments: u64,
    blocks: u64,
}

fn counts(snapshot: &Snapshot) -> Counts {
    Counts {
        events: snapshot.events.len() as u64,
        segments: snapshot.devices.iter().map(|d| d.segments.len() as u64).sum(),
        blocks: snapshot.devices.iter().flat_map(|d| &d.segments).map(|s| s.blocks.len() as u64).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_past_the_budget_is_refused_with_its_counts() {
        use crate::testkit::{SnapshotBuilder, USER};
        let snapshot = SnapshotBuilder::new()
            .alloc_in_new_segment(1 << 40, 2 << 20, 1 << 20, &[USER])
            .free(1 << 40, 1 << 20, &[USER])
            .build();
        let need = within(&snapshot, u64::MAX).unwrap();
        assert_eq!(need, memory_needed(&snapshot));
        let e = within(&snapshot, need - 1).unwrap_err();
        let events = snapshot.events.len() as u64;
        assert_eq!((e.need, e.budget, e.events), (need, need - 1, events));
        assert!(e.to_string().contains(&format!("{events} events needs about")), "{e}");
    }
}
