//! Replay: the allocator's segments and blocks right after any event of a device's trace.
//!
//! The state before the first event is derived backwards from the final `segments`
//! (`initial`); events are then applied forwards (`apply`) with the allocator's rules
//! (`rules`), and a copy of the state is kept every [`CHECKPOINT_EVERY`] events so any event
//! is reached by replaying at most that many. Analyses observe the one forward pass through
//! [`Observer`]. Replaying the whole trace must end at the final `segments`; where it does not,
//! [`Replay::final_mismatches`] says how. Replay never fails: contradictions become warnings.

mod apply;
mod initial;
pub(crate) mod rules;
pub(crate) mod slots;
mod state;

pub use rules::Rules;
pub use state::{BlockRec, NIL, SegmentRec, State, Totals};

use foldhash::{HashMap, HashMapExt};

use crate::snapshot::{Block, Device, Event, Pool, Snapshot};

/// Events between two stored states.
pub const CHECKPOINT_EVERY: usize = 8192;
const MAX_WARNINGS: usize = 20;

/// Watches the forward pass; `state` is the state right after event `index`.
pub trait Observer {
    /// The state before the first event (what the process held when the trace began).
    fn start(&mut self, _initial: &State) {}
    /// Called after each event with the state it left.
    fn event(&mut self, _index: usize, _event: &Event, _state: &State) {}
}

impl Observer for () {}

/// Warnings, counted, with the first few kept word for word.
#[derive(Debug, Clone, Default)]
pub struct Warnings {
    /// How many there were.
    pub count: u64,
    /// The first few.
    pub first: Vec<String>,
}

impl Warnings {
    /// Counts a warning and keeps it if it is among the first.
    pub fn push(&mut self, w: String) {
        self.count += 1;
        if self.first.len() < MAX_WARNINGS {
            self.first.push(w);
        }
    }
}

/// Pools of the segments the final snapshot shows, by address: the trace does not say which
/// pool a new segment belongs to.
struct FinalHints(HashMap<u64, (u64, Pool, bool)>);

impl apply::SegmentHints for FinalHints {
    fn hint(&self, address: u64, size: u64) -> Option<(Pool, bool)> {
        self.0.get(&address).filter(|h| h.0 == size || h.2).map(|h| (h.1, h.2))
    }
}

/// One device's trace, replayable to any event from its nearest checkpoint.
pub struct Replay {
    /// The CUDA device index.
    pub device: i64,
    /// The allocator settings the replay follows.
    pub rules: Rules,
    hints: FinalHints,
    initial: State,
    /// `checkpoints[k]` is the state after event `(k + 1) * CHECKPOINT_EVERY - 1`.
    checkpoints: Vec<State>,
    events: std::ops::Range<usize>,
    /// The derived initial state was empty: the trace covers the process's whole history.
    pub complete: bool,
    /// Contradictions between the trace and the allocator's rules, repaired on the way.
    pub warnings: Warnings,
    /// How the replayed end differs from the final `segments` (empty when it matches).
    pub final_mismatches: Vec<String>,
    /// The state after the last event. Unlike the final `segments`, its segments know the
    /// event and stack that created them.
    pub end: State,
}

/// A device's trace ready to replay forwards: its rules, the final segments' pools, and the
/// state before the first event derived backwards (`initial`). Apart from [`Start::run`] so
/// that a caller can do other work beside the backward pass.
pub struct Start {
    rules: Rules,
    hints: FinalHints,
    init: initial::Initial,
}

impl Start {
    /// The backward pass over a device's trace.
    pub fn derive(snapshot: &Snapshot, device: &Device) -> Start {
        let rules = Rules::from_settings(snapshot.allocator_settings.as_ref());
        let mut hints = HashMap::new();
        for s in &device.segments {
            hints.insert(s.address, (s.total_size, s.pool, s.is_expandable));
        }
        let hints = FinalHints(hints);
        let init = initial::derive(device, snapshot.device_events(device), &rules, &hints);
        Start { rules, hints, init }
    }

    /// The state before the first event.
    pub fn initial(&self) -> &State {
        &self.init.state
    }

    /// Whether any segment of the replay can be in a private pool (a CUDA graph's or a
    /// MemPool's). A segment's pool comes from the final segments or is a default one, so
    /// where no final segment is private, no state of the replay holds a private segment.
    pub fn private_pools(&self) -> bool {
        self.hints.0.values().any(|h| h.1.id != (0, 0))
    }

    /// Replays the trace forwards once, showing every step to `observer`; with `checkpoints`,
    /// keeps them for [`Replay::state_at`].
    /// Generic over the observer, so that the analysis's is inlined into the loop (three
    /// million events on big_trace; a call each was a tenth of the replay's instructions).
    pub fn run<O: Observer + ?Sized>(
        self,
        snapshot: &Snapshot,
        device: &Device,
        observer: &mut O,
        checkpoints: bool,
    ) -> Replay {
        let Start { rules, hints, init } = self;
        let every = if checkpoints { CHECKPOINT_EVERY } else { usize::MAX };
        let events = snapshot.device_events(device);
        let mut warnings = Warnings::default();
        for w in init.warnings {
            warnings.push(w);
        }
        observer.start(&init.state);
        let mut state = init.state.clone();
        // Without checkpoints nobody asks for the largest free block at each event.
        state.track_largest_free = checkpoints;
        let mut checkpoints = Vec::with_capacity(events.len() / every.min(events.len().max(1)));
        // A countdown rather than `(i + 1) % every`: a division per event cost more than the
        // observer's work on most events.
        let mut until_checkpoint = every;
        for (i, e) in events.iter().enumerate() {
            if let Some(w) = apply::apply(&mut state, e, i as u32, &rules, &hints) {
                warnings.push(format!("event {i}: {w}"));
            }
            observer.event(i, e, &state);
            until_checkpoint -= 1;
            if until_checkpoint == 0 {
                checkpoints.push(state.clone());
                until_checkpoint = every;
            }
        }
        let final_mismatches = compare(&state, device);
        Replay {
            end: state,
            device: device.device,
            rules,
            hints,
            initial: init.state,
            checkpoints,
            events: device.events.clone(),
            complete: init.empty,
            warnings,
            final_mismatches,
        }
    }
}

impl Replay {
    /// Replays a device's whole trace once, showing every step to `observer`, and keeps
    /// checkpoints for [`Replay::state_at`].
    pub fn run(snapshot: &Snapshot, device: &Device, observer: &mut dyn Observer) -> Replay {
        Self::run_with(snapshot, device, observer, true)
    }

    /// The same; without checkpoints `state_at` replays from the start (for one-shot reports).
    pub fn run_with(snapshot: &Snapshot, device: &Device, observer: &mut dyn Observer, checkpoints: bool) -> Replay {
        Start::derive(snapshot, device).run(snapshot, device, observer, checkpoints)
    }

    /// Number of events on this device.
    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// The state right after event `index` (`None`: before the first event).
    pub fn state_at(&self, snapshot: &Snapshot, index: Option<usize>) -> State {
        let Some(index) = index else { return self.initial.clone() };
        let index = index.min(self.event_count().saturating_sub(1));
        let k = ((index + 1) / CHECKPOINT_EVERY).min(self.checkpoints.len());
        let (mut state, from) = match k {
            0 => (self.initial.clone(), 0),
            k => (self.checkpoints[k - 1].clone(), k * CHECKPOINT_EVERY),
        };
        self.advance(snapshot, &mut state, from, index);
        state
    }
}

impl Replay {
    /// The state at the end: as replayed, whose blocks know the event that made them, when the
    /// replay reaches the final `segments`; else the snapshot's own segments.
    pub fn end_state(&self, device: &Device) -> State {
        if self.final_mismatches.is_empty() { self.end.clone() } else { final_state(device) }
    }

    /// Applies events `from..=to` of this device's trace to `state` (the state right after
    /// event `from - 1`).
    pub fn advance(&self, snapshot: &Snapshot, state: &mut State, from: usize, to: usize) {
        let events = &snapshot.events[self.events.clone()];
        for (i, e) in events.iter().enumerate().take(to + 1).skip(from) {
            apply::apply(state, e, i as u32, &self.rules, &self.hints);
        }
    }
}

/// The state the final `segments` describe, as a [`State`] the analyses can read.
pub fn final_state(device: &Device) -> State {
    let mut state = State::new();
    for s in &device.segments {
        let rec = SegmentRec::from_segment(s);
        let blocks = s
            .blocks
            .iter()
            .map(|b| BlockRec {
                requested: b.requested_size,
                state: b.state,
                stack: b.stack,
                ..BlockRec::free(b.address, b.size)
            })
            .collect();
        state.insert_segment(rec, blocks);
    }
    state
}

/// Differences between a replayed state and the final `segments` of a device.
fn compare(state: &State, device: &Device) -> Vec<String> {
    let mut out = Vec::new();
    let ours: Vec<u32> = state.segment_ids().collect();
    if ours.len() != device.segments.len() {
        out.push(format!("{} segments replayed, {} in the snapshot", ours.len(), device.segments.len()));
    }
    for (&s, seg) in ours.iter().zip(&device.segments) {
        let r = state.segment(s);
        if (r.address, r.size) != (seg.address, seg.total_size) {
            out.push(format!(
                "segment {:#x} ({} bytes) replayed as {:#x} ({} bytes)",
                seg.address, seg.total_size, r.address, r.size
            ));
            continue;
        }
        let blocks: Vec<&BlockRec> = state.block_ids(s).map(|b| state.block(b)).collect();
        let same = |b: &BlockRec, f: &Block| (b.address, b.size, b.state) == (f.address, f.size, f.state);
        if blocks.len() != seg.blocks.len() || !blocks.iter().zip(&seg.blocks).all(|(b, f)| same(b, f)) {
            let show = |v: Vec<String>| v.join(" ");
            out.push(format!(
                "segment {:#x}: blocks replayed [{}], snapshot [{}]",
                seg.address,
                show(blocks.iter().map(|b| format!("{}:{}", b.size, b.state.name())).collect()),
                show(seg.blocks.iter().map(|b| format!("{}:{}", b.size, b.state.name())).collect()),
            ));
        }
        if out.len() >= MAX_WARNINGS {
            break;
        }
    }
    out
}
