//! What fills memory, for one device: the phases of the trace, a category for every
//! allocation, the breakdown at the peak, at each OOM and at the end, the steps and any
//! growth. [`Memory::index`] is what a server keeps to answer a breakdown at any event.

use serde::{Deserialize, Serialize};

use super::breakdown::{self, Breakdown, Growth, Moment, Step};
use super::categories::{self, Labels};
use super::phases::{self, Phase, Phases};
use super::timeline::Peak;
use crate::replay::{Replay, Rules, State};
use crate::snapshot::{BlockState, Device, Snapshot};

/// OOMs that get a breakdown of their own; the rest are counted in `ooms`.
pub const OOM_BREAKDOWNS: usize = 3;

/// The "what fills memory" keys of a device's analysis.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Memory {
    pub breakdown: Vec<Breakdown>,
    pub steps: Vec<Step>,
    pub growth: Vec<Growth>,
}

/// Phases and labels of one device: enough to break down the state at any event.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub phases: Phases,
    pub labels: Labels,
    /// For each alloc event, the event that freed it ([`categories::frees`]).
    pub freed: Vec<Option<u32>>,
}

impl Index {
    /// Phases first (they need only the events); labels once the replay knows the blocks alive
    /// before the trace.
    pub fn build(snapshot: &Snapshot, d: &Device, phases: Phases, replay: &Replay) -> Index {
        let events = snapshot.device_events(d);
        let initial = replay.state_at(snapshot, None);
        let before: Vec<_> = initial
            .segment_ids()
            .flat_map(|s| initial.block_ids(s).collect::<Vec<_>>())
            .map(|b| initial.block(b).clone())
            .filter(|b| b.state != BlockState::Inactive)
            .collect();
        let freed = categories::frees(events);
        let labels = categories::label(snapshot, events, &phases, &before, &freed);
        Index { phases, labels, freed }
    }

    pub fn phase_at(&self, event: Option<u64>) -> Phase {
        event.and_then(|e| self.phases.phase.get(e as usize).copied()).unwrap_or(Phase::Other)
    }

    /// The breakdown of `state`, the state right after `event`.
    pub fn breakdown(&self, snapshot: &Snapshot, state: &State, moment: Moment, event: Option<u64>) -> Breakdown {
        breakdown::breakdown(snapshot, state, &self.labels, moment, event, self.phase_at(event))
    }
}

/// The phases of a device's trace, before its replay.
pub fn phases(snapshot: &Snapshot, d: &Device) -> Phases {
    phases::phases(snapshot, d.device, snapshot.device_events(d), d.events.start)
}

/// Breakdowns at the peak, the first OOMs and the end; the steps (their peaks from the
/// forward pass) and growth.
pub fn memory(
    snapshot: &Snapshot,
    d: &Device,
    replay: &Replay,
    index: &Index,
    peak: &Peak,
    ooms: &[u64],
    steps: Vec<Step>,
) -> Memory {
    let events = snapshot.device_events(d);
    let rules = Rules::from_settings(snapshot.allocator_settings.as_ref());
    let mut at: Vec<(Moment, usize)> = ooms.iter().take(OOM_BREAKDOWNS).map(|&e| (Moment::Oom, e as usize)).collect();
    if let Some(e) = peak.allocated_event {
        at.push((Moment::Peak, e as usize));
    }
    at.sort_by_key(|m| m.1);
    let indices: Vec<usize> = at.iter().map(|m| m.1).collect();
    let states = replay.states_at(snapshot, &indices);
    let mut breakdown: Vec<Breakdown> =
        at.iter().zip(&states).map(|(m, s)| index.breakdown(snapshot, s, m.0, Some(m.1 as u64))).collect();
    if peak.allocated_event.is_none() {
        let initial = replay.state_at(snapshot, None);
        breakdown.push(index.breakdown(snapshot, &initial, Moment::Peak, None));
    }
    // The end as replayed (its blocks know the event that made them); the snapshot's own
    // segments where the replay does not reach them.
    let last = events.len().checked_sub(1).map(|e| e as u64);
    let end = if replay.final_mismatches.is_empty() { replay.end.clone() } else { crate::replay::final_state(d) };
    breakdown.push(index.breakdown(snapshot, &end, Moment::Final, last));
    breakdown.sort_by_key(|b| (b.moment != Moment::Peak, b.moment == Moment::Final, b.event_index));
    let growth = breakdown::growth(snapshot, events, &index.phases, &index.labels, &index.freed, &rules);
    Memory { breakdown, steps, growth }
}
