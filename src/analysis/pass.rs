//! One device's forward pass, and how it is scheduled: the replay with the observers that need
//! the state at each event (the series, the OOMs, the steps' peaks, the copies `memory` reads)
//! on this thread, and what needs only the events (the phases, each allocation's category and
//! the event that frees it, the series' times) on another, beside the series' pages faulted in
//! ahead of the replay. The assembly of the document (`device`) sees only the results.

use std::time::{Duration, Instant};

use super::oom::OomObserver;
use super::timeline::Timeline;
use super::{Depth, breakdown, categories, memory, phases, timeline};
use crate::replay::{self, Observer, Replay, State};
use crate::snapshot::{Device, Event, Snapshot};

/// What the pass leaves for the assembly.
pub(super) struct Replayed<'a> {
    pub replay: Replay,
    pub timeline: Timeline,
    pub ooms: OomObserver<'a>,
    /// The steps' peaks, not yet finished.
    pub steps: breakdown::StepPeaks,
    pub capture: Option<memory::Capture>,
    pub phases: phases::Phases,
    pub labels: categories::Labels,
    pub freed: Vec<u32>,
    /// Events per action code (`actions::count_actions`).
    pub actions: Vec<u64>,
}

/// The observers of one forward pass.
struct Pass<'a, 'p> {
    timeline: &'p mut Timeline,
    series: bool,
    ooms: OomObserver<'a>,
    /// None: the steps' peaks are read from the series afterwards.
    peaks: Option<Peaks<'p>>,
    capture: Option<memory::Capture>,
    /// The replay keeps no checkpoints: the capture keeps copies of its own.
    copies: bool,
}

impl Observer for Pass<'_, '_> {
    fn start(&mut self, initial: &State) {
        self.capture = Some(memory::Capture::new(initial, self.copies));
    }

    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if let Some(peaks) = &mut self.peaks {
            peaks.event(index, state.totals.allocated_bytes);
        }
        if let Some(c) = &mut self.capture {
            c.event(index, e, state);
        }
        if self.series {
            self.timeline.event(index, e, state);
        } else {
            self.timeline.track_peak(index, state);
        }
        self.ooms.event(index, e, state);
    }
}

/// Replays device `d` once, with what needs only its events worked out on the other core.
pub(super) fn replay_device<'a>(snapshot: &'a Snapshot, d: &Device, depth: Depth) -> Replayed<'a> {
    let serve = depth == Depth::Serve;
    // The phases: a report's replay reads them as soon as they are known (`Peaks`), a
    // server's after its series (the backward pass takes a third of their time, and the
    // replay need not wait for them).
    let phases = std::sync::OnceLock::new();
    // Outside the scope, so that its memory outlives the thread that faults it in.
    let mut timeline = Timeline::new(if serve { snapshot.device_events(d).len() } else { 0 });
    let unwritten = timeline.unwritten();
    if serve {
        // While the other thread faults the series in, each time this one grows the heap (the
        // replay's checkpoints: about 240 times on big_trace, by 128 KiB) it waits for that
        // thread's hold on the memory map: 0.17 s for the serving analysis instead of 0.14.
        // 16 MiB at a time makes those waits few; a process that serves keeps that much more
        // memory. The command line's report depth faults nothing in and keeps the default.
        crate::machine::pages::grow_heap_by(16 << 20);
    }
    let (replay, pass, side) = std::thread::scope(|scope| {
        let (tx_before, rx_before) = std::sync::mpsc::channel();
        let (tx_ready, rx_ready) = std::sync::mpsc::channel();
        let phases = &phases;
        let side = scope.spawn(move || {
            // Serving, the replay begins to write the series before the phases are known.
            unwritten.prefault();
            let began = Instant::now();
            let ph = phases.get_or_init(|| memory::phases(snapshot, d));
            let phases_took = began.elapsed();
            let _ = tx_ready.send(());
            EventsWork::new(snapshot, d, ph, serve, || rx_before.recv().ok()).map(|w| (w, phases_took))
        });
        let began = Instant::now();
        let start = replay::Start::derive(snapshot, d);
        let derived = began.elapsed();
        let _ = tx_before.send(memory::live_blocks(start.initial()).cloned().collect());
        // Where the other thread failed, this one works the phases out itself.
        let wait_phases = || {
            if let Some(p) = phases.get() {
                return p;
            }
            let _ = rx_ready.recv();
            phases.get_or_init(|| memory::phases(snapshot, d))
        };
        let mut pass = Pass {
            timeline: &mut timeline,
            series: serve,
            ooms: OomObserver { snapshot, first: d.events.start, ooms: Vec::new(), count: 0, first_state: None },
            peaks: (!serve).then(|| Peaks::new(phases, &wait_phases)),
            capture: None,
            copies: depth == Depth::Report,
        };
        let replay = start.run(snapshot, d, &mut pass, depth != Depth::Report);
        let replayed = began.elapsed();
        let Pass { timeline, ooms, peaks, capture, .. } = pass;
        let steps = match peaks {
            Some(peaks) => peaks.finish(),
            None => breakdown::StepPeaks::from_allocated(wait_phases(), &timeline.allocated_bytes),
        };
        let side = side.join().ok().flatten();
        if let Some((work, phases_took)) = &side {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            tracing::debug!(
                derive_ms = ms(derived),
                replay_ms = ms(replayed - derived),
                joined_ms = ms(began.elapsed()),
                phases_ms = ms(*phases_took),
                frees_ms = ms(work.took[0]),
                labels_ms = ms(work.took[1]),
                peak_mib = crate::machine::pages::peak_resident_mib(),
                "a device's pass: the replay on this thread, what needs only the events on the other"
            );
        }
        (replay, (ooms, steps, capture), side.map(|s| s.0))
    });
    let (ooms, steps, capture) = pass;
    // Set in the scope, by one thread or the other.
    let phases = phases.into_inner().unwrap_or_default();
    let initial_blocks = || Some(memory::live_blocks(&replay.state_at(snapshot, None)).cloned().collect());
    let EventsWork { labels, freed, times, actions, .. } = match side {
        Some(done) => done,
        None => EventsWork::new(snapshot, d, &phases, serve, initial_blocks).unwrap_or_default(),
    };
    if let Some(times) = times {
        timeline.time_us = times;
    }
    Replayed { replay, timeline, ooms, steps, capture, phases, labels, freed, actions }
}

/// The steps' peaks of allocated bytes, taken as the replay goes where there is no series to
/// read them from after. The phases say which event is in which step; until the other thread
/// has them, the bytes after each event are kept aside, so the replay need not wait for them
/// (it waited a tenth of a report's analysis on big_trace). At most [`EARLY_MAX`] are:
/// past that, it waits.
struct Peaks<'p> {
    phases: &'p std::sync::OnceLock<phases::Phases>,
    wait: &'p dyn Fn() -> &'p phases::Phases,
    /// Once known.
    ready: Option<&'p phases::Phases>,
    /// The allocated bytes after each event from `first`, while the phases are not known.
    early: Vec<u64>,
    first: usize,
    steps: breakdown::StepPeaks,
}

/// Events whose bytes are kept aside while the phases are worked out: 8 MiB, a third of a
/// 3-million-event trace; on a machine whose other core is busy, the replay waits there.
const EARLY_MAX: usize = 1 << 20;

impl<'p> Peaks<'p> {
    fn new(phases: &'p std::sync::OnceLock<phases::Phases>, wait: &'p dyn Fn() -> &'p phases::Phases) -> Self {
        Peaks { phases, wait, ready: phases.get(), early: Vec::new(), first: 0, steps: Default::default() }
    }

    fn event(&mut self, index: usize, allocated: u64) {
        if let Some(p) = self.ready {
            // Without steps (no optimizer ranges, no step markers) there are no peaks to take.
            if p.steps > 0 {
                self.steps.event(index, p, allocated);
            }
            return;
        }
        if self.early.is_empty() {
            self.first = index;
        }
        self.early.push(allocated);
        if self.early.len().is_multiple_of(4096) {
            let known = if self.early.len() >= EARLY_MAX { Some((self.wait)()) } else { self.phases.get() };
            if let Some(p) = known {
                self.catch_up(p);
            }
        }
    }

    fn catch_up(&mut self, p: &'p phases::Phases) {
        if p.steps > 0 {
            for (k, &bytes) in self.early.iter().enumerate() {
                self.steps.event(self.first + k, p, bytes);
            }
        }
        self.early = Vec::new();
        self.ready = Some(p);
    }

    fn finish(mut self) -> breakdown::StepPeaks {
        if self.ready.is_none() {
            let p = self.phases.get().unwrap_or_else(|| (self.wait)());
            self.catch_up(p);
        }
        self.steps
    }
}

/// What a device's analysis needs besides the replay: every allocation's category, the event
/// that frees each, the events per action, and (serving) the series' time column. From the
/// events alone, but for the blocks alive before the trace, which `before` waits for (None:
/// they never came).
#[derive(Default)]
struct EventsWork {
    labels: categories::Labels,
    freed: Vec<u32>,
    times: Option<Vec<i64>>,
    actions: Vec<u64>,
    /// How long the frees and the labels took (the debug log's).
    took: [Duration; 2],
}

impl EventsWork {
    fn new(
        snapshot: &Snapshot,
        d: &Device,
        phases: &phases::Phases,
        serve: bool,
        before: impl FnOnce() -> Option<Vec<replay::BlockRec>>,
    ) -> Option<EventsWork> {
        let events = snapshot.device_events(d);
        let times = serve.then(|| timeline::times(snapshot, d.events.clone()));
        let began = Instant::now();
        let freed = categories::frees(events);
        let frees_took = began.elapsed();
        let before = before()?;
        let began = Instant::now();
        let labels = categories::label(snapshot, events, phases, &before, &freed);
        let actions = super::actions::count_actions(events);
        Some(EventsWork { labels, freed, times, actions, took: [frees_took, began.elapsed()] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wherever in the trace the phases become known (before the first event, on a check,
    /// between checks, only at the end), the steps' peaks are those of the whole series.
    #[test]
    fn peaks_taken_before_the_phases_are_known_are_those_of_the_series() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ddp_rank0.pickle");
        let s = crate::ingest::ingest_path(std::path::Path::new(path), &Default::default()).unwrap().snapshot;
        let d = &s.devices[0];
        let served = super::super::analyze(&s, Default::default(), Depth::Serve);
        let allocated = &served.timelines[0].allocated_bytes;
        let phases = memory::phases(&s, d);
        assert!(phases.steps > 1 && allocated.len() > 4096, "a trace of steps, past a check");
        let json = |steps: breakdown::StepPeaks| serde_json::to_string(&steps.finish(&phases)).unwrap();
        let want = json(breakdown::StepPeaks::from_allocated(&phases, allocated));
        for known in [0, 1, 4095, 4096, 4097, allocated.len()] {
            let cell = std::sync::OnceLock::new();
            let waited = std::cell::Cell::new(false);
            let wait = || {
                waited.set(true);
                cell.get_or_init(|| phases.clone())
            };
            if known == 0 {
                cell.get_or_init(|| phases.clone());
            }
            let mut peaks = Peaks::new(&cell, &wait);
            for (i, &bytes) in allocated.iter().enumerate() {
                if i == known && known > 0 {
                    cell.get_or_init(|| phases.clone());
                }
                peaks.event(i, bytes);
            }
            assert_eq!(json(peaks.finish()), want, "phases known at event {known}");
            assert_eq!(waited.get(), known == allocated.len(), "waited only when never known");
        }
    }
}
