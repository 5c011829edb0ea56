//! One device's forward pass, and how it is scheduled: the replay with the observers that need
//! the state at each event (the series, the OOMs, the steps' peaks, the copies `memory` reads)
//! on this thread, and what needs only the events (the phases, each allocation's category and
//! the event that frees it, the series' times) on another, beside the series' pages faulted in
//! ahead of the replay. The assembly of the document (`device`) sees only the results.

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
    phases: Option<&'p phases::Phases>,
    steps: breakdown::StepPeaks,
    capture: Option<memory::Capture>,
    /// The replay keeps no checkpoints: the capture keeps copies of its own.
    copies: bool,
}

impl Observer for Pass<'_, '_> {
    fn start(&mut self, initial: &State) {
        self.capture = Some(memory::Capture::new(initial, self.copies));
    }

    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if let Some(phases) = self.phases {
            self.steps.event(index, phases, state.totals.allocated_bytes);
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
    // The phases: a report's replay reads them, a server's reads them after its series (the
    // backward pass takes a third of their time, and the replay need not wait).
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
            let ph = phases.get_or_init(|| memory::phases(snapshot, d));
            let _ = tx_ready.send(());
            EventsWork::new(snapshot, d, ph, serve, || rx_before.recv().ok())
        });
        let start = replay::Start::derive(snapshot, d);
        let _ = tx_before.send(memory::live_blocks(start.initial()).cloned().collect());
        // Where the other thread failed, this one works the phases out itself.
        let wait_phases = || {
            let _ = rx_ready.recv();
            phases.get_or_init(|| memory::phases(snapshot, d))
        };
        let mut pass = Pass {
            timeline: &mut timeline,
            series: serve,
            ooms: OomObserver { snapshot, first: d.events.start, ooms: Vec::new(), count: 0, first_state: None },
            // Without steps (no optimizer ranges, no step markers) there are no peaks to take.
            phases: if serve { None } else { Some(wait_phases()).filter(|p| p.steps > 0) },
            steps: breakdown::StepPeaks::default(),
            capture: None,
            copies: depth == Depth::Report,
        };
        let replay = start.run(snapshot, d, &mut pass, depth != Depth::Report);
        let Pass { ooms, mut steps, capture, .. } = pass;
        if serve {
            steps = breakdown::StepPeaks::from_allocated(wait_phases(), &timeline.allocated_bytes);
        }
        (replay, (ooms, steps, capture), side.join().ok().flatten())
    });
    let (ooms, steps, capture) = pass;
    // Set in the scope, by one thread or the other.
    let phases = phases.into_inner().unwrap_or_default();
    let initial_blocks = || Some(memory::live_blocks(&replay.state_at(snapshot, None)).cloned().collect());
    let EventsWork { labels, freed, times, actions } = match side {
        Some(done) => done,
        None => EventsWork::new(snapshot, d, &phases, serve, initial_blocks).unwrap_or_default(),
    };
    if let Some(times) = times {
        timeline.time_us = times;
    }
    Replayed { replay, timeline, ooms, steps, capture, phases, labels, freed, actions }
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
        let freed = categories::frees(events);
        let labels = categories::label(snapshot, events, phases, &before()?, &freed);
        let actions = super::actions::count_actions(events);
        Some(EventsWork { labels, freed, times, actions })
    }
}
