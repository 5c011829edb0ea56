//! One device's analysis, assembled from its forward pass (`pass`): the peaks, the pinned
//! gaps and the pattern they make, what fills memory, what the step that died needed, and the
//! diagnosis with its remedies weighed by replaying them.

use std::borrow::Cow;

use foldhash::{HashMap, HashMapExt};

use super::advice::Diagnosis;
use super::gaps::Pinned;
use super::oom::Oom;
use super::pass::{Replayed, replay_device};
use super::rhythm::Rhythm;
use super::timeline::{Peak, Timeline};
use super::{
    Depth, DeviceAnalysis, Moment, Options, ReplayReport, actions, advice, breakdown, capacity, categories, counters,
    gaps, judge, memory, need, predict, rhythm,
};
use crate::replay::{self, Replay, State};
use crate::snapshot::sites::{self, call_site};
use crate::snapshot::{Action, Device, Event, Snapshot, StackId};

/// What every step of the assembly reads.
struct Ctx<'a> {
    snapshot: &'a Snapshot,
    d: &'a Device,
    events: &'a [Event],
    rules: replay::Rules,
    replay: &'a Replay,
    ooms: &'a [Oom],
    /// The state at the first OOM, where the job died.
    oom_state: Option<&'a State>,
    options: Options,
}

/// Analyses device `d`: the document's part for it, and what serving it keeps.
pub(super) fn analyze_device(
    snapshot: &Snapshot,
    d: &Device,
    depth: Depth,
    options: Options,
) -> (DeviceAnalysis, Replay, Timeline, memory::Index) {
    let Replayed { replay, timeline, mut ooms, steps, capture, phases, labels, freed, actions } =
        replay_device(snapshot, d, depth);
    let oom_state = ooms.first_state.take();
    let c = Ctx {
        snapshot,
        d,
        events: snapshot.device_events(d),
        rules: replay::Rules::from_settings(snapshot.allocator_settings.as_ref()),
        replay: &replay,
        ooms: &ooms.ooms,
        oom_state: oom_state.as_ref(),
        options,
    };
    let initial = replay.state_at(snapshot, None);
    let peak = with_initial(timeline.peak, &initial);
    let final_state = counters(&d.segments);
    let pinned = gaps::pinned(&replay::final_state(d), &snapshot.stacks);
    let (rhythm, mut diagnosis) = pattern(&c, &pinned, final_state.reserved_bytes);
    let steps = steps.finish(&phases);
    let index = memory::Index { phases, labels, freed };
    let capture = capture.unwrap_or_else(|| memory::Capture::new(&initial, false));
    let memory = memory::memory(snapshot, d, &replay, &index, &capture, &peak, steps);
    drop(capture);
    weigh(&c, &index, &memory, &peak, &initial, &mut diagnosis);
    notes(&c, &memory, final_state.reserved_bytes, &mut diagnosis);
    let analysis = DeviceAnalysis {
        device: d.device,
        final_state,
        trace: actions::summary(snapshot, d, &actions, replay.complete),
        peak,
        ooms: ooms.ooms,
        oom_count: ooms.count,
        pinned: pinned.summary.clone(),
        pinners: pinned.pinners.iter().take(20).cloned().collect(),
        gaps: pinned.gaps.iter().take(20).cloned().collect(),
        rhythm,
        diagnosis,
        memory,
        replay: ReplayReport {
            matches_final: replay.final_mismatches.is_empty(),
            mismatches: replay.final_mismatches.clone(),
            warnings: replay.warnings.count,
            first_warnings: replay.warnings.first.clone(),
        },
    };
    (analysis, replay, timeline, index)
}

/// The trace's peaks, or the state before the trace where that held more.
fn with_initial(mut peak: Peak, initial: &State) -> Peak {
    if initial.totals.reserved_bytes >= peak.reserved_bytes {
        (peak.reserved_bytes, peak.reserved_event) = (initial.totals.reserved_bytes, None);
    }
    if initial.totals.allocated_bytes >= peak.allocated_bytes {
        (peak.allocated_bytes, peak.allocated_event) = (initial.totals.allocated_bytes, None);
    }
    peak
}

/// The pattern the segments make, and the diagnosis the rules give it. At an OOM, the pattern
/// is judged where the job died; otherwise at the end, as replayed (its segments know their
/// creating event and stack; the snapshot's do not).
fn pattern(c: &Ctx, pinned: &Pinned, reserved_bytes: u64) -> (Rhythm, Diagnosis) {
    let judged = match c.oom_state {
        Some(s) => Cow::Borrowed(s),
        None if c.replay.final_mismatches.is_empty() => Cow::Borrowed(&c.replay.end),
        None => Cow::Owned(replay::final_state(c.d)),
    };
    let rhythm = rhythm::rhythm(&judged, &c.snapshot.stacks);
    let big = big_allocation(c.snapshot, c.events, c.ooms, &judged);
    let big_repeats = match &big {
        Some((Some(site), size)) => repeats(c, site, *size),
        _ => 0,
    };
    let diagnosis = advice::diagnose(&advice::Facts {
        ooms: c.ooms,
        pinned,
        reserved_bytes,
        rhythm: &rhythm,
        rules: &c.rules,
        big,
        big_repeats,
    });
    (rhythm, diagnosis)
}

/// What the step needed, the memory held outside the allocator, and each remedy weighed by
/// replaying it; the remedies then in their order.
fn weigh(
    c: &Ctx,
    index: &memory::Index,
    memory: &memory::Memory,
    peak: &Peak,
    initial: &State,
    diagnosis: &mut Diagnosis,
) {
    diagnosis.kv_cache = memory
        .breakdown
        .iter()
        .find(|b| b.moment == Moment::Oom)
        .or_else(|| memory.breakdown.iter().find(|b| b.moment == Moment::Final))
        .and_then(|b| b.kv_cache.clone());
    let recorded = c.snapshot.recorded.iter().find(|r| r.device == c.d.device);
    let known = need::Known {
        capacity: c.options.capacity,
        recorded_budget: recorded.and_then(|r| r.budget_bytes),
        device_total: c.options.device_total.or(recorded.and_then(|r| r.total_bytes)),
    };
    let peak_mix = memory.breakdown.iter().find(|b| b.moment == Moment::Peak).map(need::Mix::of_breakdown);
    diagnosis.need = need::project(&need::Inputs {
        snapshot: c.snapshot,
        events: c.events,
        index,
        replay: c.replay,
        rules: &c.rules,
        ooms: c.ooms,
        oom_state: c.oom_state,
        peak: (peak.allocated_bytes, peak.reserved_bytes),
        peak_mix: peak_mix.unwrap_or_default(),
        known,
    });
    if let Some(o) = c.ooms.first() {
        diagnosis.outside = Some(need::budget::outside(o, &known));
        let need = diagnosis.need.clone();
        judge::judge(diagnosis, &need);
    }
    predict::predict(c.snapshot, c.d, c.ooms, peak.reserved_bytes, diagnosis);
    let before: Vec<(u64, categories::Category)> =
        memory::live_blocks(initial).map(|b| (b.address, index.labels.of(b))).collect();
    let replaying = capacity::Replaying { snapshot: c.snapshot, device: c.d, index, before };
    capacity::explain(&replaying, c.ooms, memory, c.options.capacity, peak.reserved_bytes, diagnosis);
    capacity::unweighed_leaks(&memory.growth, diagnosis);
    diagnosis.order_remedies();
}

/// The summary's words on growth without an OOM, and on a trace that lost its start.
fn notes(c: &Ctx, memory: &memory::Memory, reserved_bytes: u64, diagnosis: &mut Diagnosis) {
    if c.ooms.is_empty() {
        let recorded = c.snapshot.recorded.iter().find(|r| r.device == c.d.device);
        let budget = c.options.capacity.or(recorded.and_then(|r| r.budget_bytes)).or(c.options.device_total);
        let steps = memory.step_count() as u32;
        if let Some(h) = breakdown::growth_headline(&memory.growth, steps, reserved_bytes, budget) {
            let rest = diagnosis.summary.trim_start_matches("No OOM in this trace.").trim_start();
            diagnosis.summary = format!("{h} {rest}");
        }
    }
    if !c.replay.complete {
        diagnosis.summary.push_str(&format!(
            " The trace lost its start: it holds the last {} events (the ring buffer of `max_entries` filled, or recording began late), so what was allocated before them is counted by its blocks, with no history, and the steps before them are not seen.",
            c.events.len()
        ));
    }
}

/// How many times `site` allocated `size` bytes (rounded) in the trace.
fn repeats(c: &Ctx, site: &sites::CallSite, size: u64) -> u64 {
    let mut at_site: HashMap<StackId, bool> = HashMap::new();
    c.events
        .iter()
        .filter(|e| e.action == Action::ALLOC && c.rules.round_size(e.size) == size)
        .filter(|e| {
            *at_site.entry(e.stack).or_insert_with(|| call_site(&c.snapshot.stacks, e.stack).as_ref() == Some(site))
        })
        .count() as u64
}

/// The big allocations to act on: the failing request if the job ran out of memory, else the
/// creation of the largest pinned segment.
fn big_allocation(
    snapshot: &Snapshot,
    events: &[Event],
    ooms: &[Oom],
    state: &State,
) -> Option<(Option<sites::CallSite>, u64)> {
    if let Some(o) = ooms.first() {
        let stack = events[o.event_index as usize].stack;
        return Some((call_site(&snapshot.stacks, stack), o.requested_bytes));
    }
    let seg = state
        .segment_ids()
        .map(|s| state.segment(s))
        .filter(|s| s.live > 0 && s.inactive > 0 && !s.expandable)
        .max_by_key(|s| s.inactive)?;
    // A segment is made to fit the request that created it: its size is that request's, rounded.
    Some((call_site(&snapshot.stacks, seg.stack), seg.size))
}
