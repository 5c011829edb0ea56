//! What fills memory, for one device: the phases of the trace, a category for every
//! allocation, the breakdown at the peak, at each OOM and at the end, the steps and any
//! growth. [`Index`] is what a server keeps to answer a breakdown at any event.

use serde::{Deserialize, Serialize};

use super::breakdown::{self, Breakdown, Growth, Moment, Step};
use super::categories::{Category, Labels};
use super::phases::{self, Phase, Phases};
use super::timeline::Peak;
use std::rc::Rc;

use crate::replay::{BlockRec, CHECKPOINT_EVERY, Replay, Rules, State};
use crate::snapshot::{Action, BlockState, Device, Event, Snapshot};

/// OOMs that get a breakdown of their own; the rest are counted in `ooms`.
pub const OOM_BREAKDOWNS: usize = 3;

/// The "what fills memory" keys of a device's analysis.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Memory {
    pub breakdown: Vec<Breakdown>,
    pub steps: Vec<Step>,
    pub growth: Vec<Growth>,
    /// The steps are forward passes: the trace has no backward (inference, an evaluation
    /// loop). False in analyses stored before this was kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_passes: bool,
    /// Steps the trace holds, where that is more than `steps` lists (see [`MAX_STEPS`]); 0
    /// when `steps` lists them all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steps_total: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The most steps an analysis lists: a trace of many tiny steps (or a hostile one) must not
/// make the document the page loads grow with it. Past it, the first steps are listed, and
/// the highest and the last.
pub const MAX_STEPS: usize = 10_000;

/// `steps` within [`MAX_STEPS`], and how many there were when more.
fn cap_steps(mut steps: Vec<Step>) -> (Vec<Step>, u64) {
    let total = steps.len();
    if total <= MAX_STEPS {
        return (steps, 0);
    }
    let last = steps.pop().expect("more than MAX_STEPS");
    let highest = steps[MAX_STEPS - 2..]
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| (s.peak_allocated_bytes, std::cmp::Reverse(s.index)))
        .map(|(i, _)| i + MAX_STEPS - 2);
    let mut kept: Vec<Step> = steps.drain(..MAX_STEPS - 2).collect();
    if let Some(h) = highest.and_then(|h| steps.get(h - (MAX_STEPS - 2)).cloned()) {
        kept.push(h);
    }
    kept.push(last);
    (kept, total as u64)
}

impl Memory {
    /// How many steps the trace holds (more than `steps` lists past [`MAX_STEPS`]).
    pub fn step_count(&self) -> u64 {
        self.steps_total.max(self.steps.len() as u64)
    }

    /// The step whose peak of allocated bytes is highest (the first of equals).
    pub fn highest_step(&self) -> Option<&Step> {
        self.steps.iter().rev().max_by_key(|s| s.peak_allocated_bytes)
    }
}

/// Phases and labels of one device: enough to break down the state at any event.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub phases: Phases,
    pub labels: Labels,
    /// For each alloc event, the event that freed it ([`super::categories::frees`]).
    pub freed: Vec<u32>,
}

/// The blocks alive in `state` (in the state before the first event, those allocated before
/// the trace began).
pub fn live_blocks(state: &State) -> impl Iterator<Item = &BlockRec> {
    state
        .segment_ids()
        .flat_map(|s| state.block_ids(s))
        .map(|b| state.block(b))
        .filter(|b| b.state != BlockState::Inactive)
}

impl Index {
    /// About what it holds in memory: per event a phase, a step, a category and a free.
    pub fn bytes(&self) -> u64 {
        self.phases.phase.len() as u64 * (1 + 4 + 1 + 4)
    }

    pub fn phase_at(&self, event: Option<u64>) -> Phase {
        event.and_then(|e| self.phases.phase.get(e as usize).copied()).unwrap_or(Phase::Other)
    }

    /// The category of the live block at `address` in the final `segments` (whose blocks do
    /// not know the event that made them: the replay's end does, where it matches them).
    pub fn category_at_end(&self, replay: &Replay, address: u64) -> Option<Category> {
        if !replay.final_mismatches.is_empty() {
            return None;
        }
        replay.end.block_at(address).map(|b| self.labels.of(replay.end.block(b)))
    }

    /// The breakdown of `state`, the state right after `event`.
    pub fn breakdown(&self, snapshot: &Snapshot, state: &State, moment: Moment, event: Option<u64>) -> Breakdown {
        breakdown::breakdown(snapshot, state, &self.labels, moment, event, self.phase_at(event))
    }

    /// Device `d`'s segment map right after `event` (None: the final `segments`), each live
    /// block with what it holds: the server's and `fragscope mcp`'s `state`.
    pub fn segment_map_at(
        &self,
        snapshot: &Snapshot,
        d: &Device,
        replay: &Replay,
        event: Option<u64>,
    ) -> super::map::SegmentMap {
        match event {
            Some(e) => {
                let state = replay.state_at(snapshot, Some(e as usize));
                super::map::segment_map(snapshot, d.device, event, &state, |b| Some(self.labels.of(b)))
            }
            None => {
                let state = crate::replay::final_state(d);
                super::map::segment_map(snapshot, d.device, None, &state, |b| self.category_at_end(replay, b.address))
            }
        }
    }

    /// What fills device `d`'s memory right after `event` (None: at the end).
    pub fn breakdown_at(&self, snapshot: &Snapshot, d: &Device, replay: &Replay, event: Option<u64>) -> Breakdown {
        match event {
            Some(e) => self.breakdown(snapshot, &replay.state_at(snapshot, Some(e as usize)), Moment::Event, event),
            None => {
                let last = snapshot.device_events(d).len().checked_sub(1).map(|e| e as u64);
                self.breakdown(snapshot, &replay.end_state(d), Moment::Final, last)
            }
        }
    }
}

/// The states the breakdowns need, caught during the forward pass rather than replayed again:
/// each of the first OOMs is copied where it happens; for the peak of allocated bytes (known
/// only at the end) a copy of the state every [`CHECKPOINT_EVERY`] events is kept while it
/// precedes the highest point so far, and the end replays at most that many events from it.
/// Where the replay keeps checkpoints of its own (a server's analysis), those serve instead.
pub struct Capture {
    /// Keep copies of our own: the replay keeps no checkpoints.
    copies: bool,
    rolling: (Rc<State>, Option<usize>),
    best: u64,
    /// The copy that precedes the highest point so far, and the event it follows.
    base: (Rc<State>, Option<usize>),
    ooms: Vec<(usize, State)>,
}

impl Capture {
    pub fn new(initial: &State, copies: bool) -> Capture {
        let rolling = (Rc::new(initial.clone()), None);
        Capture { copies, best: initial.totals.allocated_bytes, base: rolling.clone(), rolling, ooms: Vec::new() }
    }

    pub fn event(&mut self, index: usize, e: &Event, state: &State) {
        if e.action == Action::OOM && self.ooms.len() < OOM_BREAKDOWNS {
            self.ooms.push((index, state.clone()));
        }
        if !self.copies {
            return;
        }
        if state.totals.allocated_bytes > self.best {
            self.best = state.totals.allocated_bytes;
            self.base = self.rolling.clone();
        }
        if (index + 1).is_multiple_of(CHECKPOINT_EVERY) {
            self.rolling = (Rc::new(state.clone()), Some(index));
        }
    }

    /// The state right after the peak `event` (None: the peak is the state before the trace).
    fn at_peak(&self, snapshot: &Snapshot, replay: &Replay, event: Option<usize>) -> State {
        match event {
            Some(e) if self.copies && self.base.1.is_none_or(|b| b <= e) => {
                let mut state = (*self.base.0).clone();
                replay.advance(snapshot, &mut state, self.base.1.map_or(0, |b| b + 1), e);
                state
            }
            // From the replay's own checkpoints; or before the copy the pass kept (it cannot
            // be: the peak is found the same way); or the state before the trace.
            _ => replay.state_at(snapshot, event),
        }
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
    capture: &Capture,
    peak: &Peak,
    steps: Vec<Step>,
) -> Memory {
    let events = snapshot.device_events(d);
    let rules = Rules::from_settings(snapshot.allocator_settings.as_ref());
    let mut breakdown: Vec<Breakdown> =
        capture.ooms.iter().map(|(e, s)| index.breakdown(snapshot, s, Moment::Oom, Some(*e as u64))).collect();
    let at_peak = capture.at_peak(snapshot, replay, peak.allocated_event.map(|e| e as usize));
    breakdown.push(index.breakdown(snapshot, &at_peak, Moment::Peak, peak.allocated_event));
    let last = events.len().checked_sub(1).map(|e| e as u64);
    breakdown.push(index.breakdown(snapshot, &replay.end_state(d), Moment::Final, last));
    breakdown.sort_by_key(|b| (b.moment != Moment::Peak, b.moment == Moment::Final, b.event_index));
    let growth = breakdown::growth(snapshot, events, &index.phases, &index.labels, &index.freed, &rules);
    let forward_passes = !steps.is_empty() && index.phases.forward_steps;
    let (steps, steps_total) = cap_steps(steps);
    Memory { breakdown, forward_passes, steps, growth, steps_total }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(index: u32, peak: u64) -> Step {
        Step {
            index,
            first_event: index as u64 * 10,
            last_event: index as u64 * 10 + 9,
            peak_allocated_bytes: peak,
            peak_event: index as u64 * 10 + 5,
            peak_phase: Phase::Forward,
        }
    }

    #[test]
    fn past_the_cap_the_first_steps_the_highest_and_the_last_are_kept() {
        let few: Vec<Step> = (0..5).map(|i| step(i, 1)).collect();
        assert_eq!(cap_steps(few).1, 0, "under the cap: all of them, no total");
        let n = MAX_STEPS as u32 + 500;
        let many: Vec<Step> = (0..n).map(|i| step(i, if i == MAX_STEPS as u32 + 100 { 99 } else { 1 })).collect();
        let (kept, total) = cap_steps(many);
        assert_eq!((kept.len(), total), (MAX_STEPS, n as u64));
        let indexes: Vec<u32> = kept.iter().map(|s| s.index).collect();
        assert_eq!(indexes[MAX_STEPS - 3], MAX_STEPS as u32 - 3);
        assert_eq!(&indexes[MAX_STEPS - 2..], &[MAX_STEPS as u32 + 100, n - 1], "the highest, then the last");
        let m = Memory { steps: kept, steps_total: total, ..Default::default() };
        assert_eq!(m.step_count(), n as u64);
        assert_eq!(m.highest_step().unwrap().peak_allocated_bytes, 99);
    }
}
