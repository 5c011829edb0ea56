//! Phases and steps: where in a training step each event of a trace happened.
//!
//! Each event's stack is tagged by its frames (innermost first, as torch records them):
//! - optimizer: a frame under `torch/optim/` with only torch's own code inside it (a closure
//!   the optimizer calls back, as Lightning's `optimizer.step(closure)` runs the forward, the
//!   loss and the backward, is not the optimizer), or an event inside an `Optimizer.step#` or
//!   `Optimizer.zero_grad#` annotation (torch >= 2.5 records those while history is on) after
//!   the last forward or backward event inside it; `zero_grad` is an optimizer phase but not
//!   a step;
//! - backward: a frame named `backward`, `_backward_impl` or `_engine_run_backward` (the
//!   autograd entry points, compiled backward included), a frame under `torch/autograd/` other
//!   than `function.py` (which also runs compiled forwards), a C++ frame of the autograd
//!   engine (`stacks="all"`), or no frame at all in a recording that has frames elsewhere: the
//!   autograd engine's threads run no Python, so with `stacks="python"` its allocations come
//!   without frames;
//! - forward: a frame named `forward`, or `nn.Module`'s `_call_impl`;
//! - user: frames, none of the above (data loading, the loss written inline, logging).
//!
//! The phase follows the tags: an optimizer tag starts (or continues) the optimizer phase, a
//! backward tag the backward, a forward tag the forward; a user tag after the optimizer or the
//! backward starts an `other` phase, and inside a forward stays in it (the loss is computed in
//! user code between the model's call and `backward()`). A step ends where an optimizer phase
//! that stepped ends; without any optimizer phase, `user_metadata` tags that change (`step=3`)
//! mark steps.
//! Events without a stack (frees, mostly) keep the phase they fall in.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::snapshot::{EMPTY_STACK, Event, Snapshot, StackId};

/// Where in a training step something happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
    Other,
}

/// What a stack says about its phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Optimizer,
    /// The optimizer's `zero_grad`: an optimizer phase, but not a step (Lightning calls it
    /// inside the step's closure, before the backward).
    ZeroGrad,
    Backward,
    Forward,
    User,
    /// No frames.
    None,
}

/// The phase and step of every event of one device, and the phases as runs.
#[derive(Debug, Clone, Default)]
pub struct Phases {
    pub phase: Vec<Phase>,
    pub step: Vec<u32>,
    /// Maximal runs of one phase: (phase, first event, last event).
    pub runs: Vec<(Phase, usize, usize)>,
    /// For each run, the next run of each phase (by `Phase as usize`; `NONE`: there is none),
    /// so finding "the next backward" is one read, not a scan: a trace of many short runs
    /// (inference, or a hostile file) must not make labelling quadratic.
    next: Vec<[u32; 4]>,
    /// What each stack's frames say ([`tag`]), by stack id (ids are dense), computed once per
    /// stack that an event has.
    tags: Vec<Option<Tag>>,
    /// Steps found (from optimizer phases or `user_metadata`); 0 when none.
    pub steps: u32,
    /// The steps are forward passes (no optimizer step or step tag in the trace).
    pub forward_steps: bool,
    /// Some stack in the trace has frames: without any, phases cannot be told.
    pub has_frames: bool,
    /// The trace has a backward phase: it records training.
    pub training: bool,
}

impl Phases {
    /// The first run after `run` of phase `p`.
    pub fn next_run(&self, run: usize, p: Phase) -> Option<usize> {
        let r = self.next.get(run)?[p as usize];
        (r != NONE).then_some(r as usize)
    }

    /// The indexes of the events that fall in runs of phase `p`, in order: a piece of
    /// evidence about one phase reads only its events (most of a trace that has no optimizer
    /// phase is not read at all for the optimizer's).
    pub fn events_in(&self, p: Phase) -> impl Iterator<Item = usize> + '_ {
        self.runs.iter().filter(move |r| r.0 == p).flat_map(|r| r.1..=r.2)
    }

    /// Whether any event falls in phase `p`.
    pub fn has(&self, p: Phase) -> bool {
        self.runs.iter().any(|r| r.0 == p)
    }

    /// What `stack`'s frames say, as the phases were told ([`Tag::None`] for a stack no event
    /// of the trace has).
    pub fn tag_of(&self, stack: StackId) -> Tag {
        self.tags.get(stack as usize).copied().flatten().unwrap_or(Tag::None)
    }
}

const NONE: u32 = u32::MAX;

/// What `stack`'s frames say about its phase.
pub fn tag(snapshot: &Snapshot, stack: StackId) -> Tag {
    if stack == EMPTY_STACK {
        return Tag::None;
    }
    let (mut forward, mut backward, mut any, mut called_back) = (false, false, false, false);
    for f in snapshot.stacks.frames(stack) {
        any = true;
        let file = snapshot.stacks.str(f.filename);
        let name = snapshot.stacks.str(f.name);
        let file = file.replace('\\', "/");
        // The optimizer's own code, unless it is only the caller: Lightning runs the forward,
        // the loss and the backward inside `optimizer.step(closure)`, so their frames (Python
        // outside torch) sit inside the optimizer's.
        if file.contains("torch/optim/") && !forward && !backward && !called_back {
            return if name == "zero_grad" { Tag::ZeroGrad } else { Tag::Optimizer };
        }
        called_back |= file.ends_with(".py") && !is_torch_file(&file);
        backward |= matches!(name, "backward" | "_backward_impl" | "_engine_run_backward")
            || (file.contains("torch/autograd/") && !file.ends_with("function.py"))
            || name.contains("autograd::Engine")
            || name.contains("autograd::engine");
        forward |= name == "forward" || (name == "_call_impl" && file.ends_with("nn/modules/module.py"));
    }
    if backward {
        Tag::Backward
    } else if forward {
        Tag::Forward
    } else if any {
        Tag::User
    } else {
        Tag::None
    }
}

/// Whether a Python file is torch's own: its path inside the packages folder starts with
/// `torch/` (a virtualenv at `/opt/torch/.venv` holds every library under a `/torch/`), or,
/// for a source checkout, it sits under a `torch/` folder.
fn is_torch_file(file: &str) -> bool {
    let packages = ["site-packages/", "dist-packages/"].iter().filter_map(|p| file.rfind(p).map(|i| i + p.len())).max();
    match packages {
        Some(i) => file[i..].starts_with("torch/"),
        None => file.starts_with("torch/") || file.contains("/torch/"),
    }
}

/// An optimizer annotation's time range; `closure_until`: the time of the last event inside it
/// whose frames say forward or backward (a step's closure, as Lightning runs it), before which
/// the frames decide, not the annotation.
#[derive(Debug, Clone, Copy)]
struct Range {
    start: i64,
    end: i64,
    zero_grad: bool,
    closure_until: i64,
}

/// Time ranges of the optimizer's annotations on `device`, sorted.
fn optimizer_ranges(snapshot: &Snapshot, device: i64) -> Vec<Range> {
    let mut open: HashMap<&str, i64> = HashMap::new();
    let mut out = Vec::new();
    for a in snapshot.annotations.iter().filter(|a| a.device == device) {
        let zero_grad = a.name.starts_with("Optimizer.zero_grad#");
        if !(a.name.starts_with("Optimizer.step#") || zero_grad) {
            continue;
        }
        match a.stage.as_str() {
            "START" => {
                open.insert(&a.name, a.time_us);
            }
            "END" => {
                if let Some(start) = open.remove(a.name.as_str()) {
                    out.push(Range { start, end: a.time_us, zero_grad, closure_until: i64::MIN });
                }
            }
            _ => {}
        }
    }
    out.sort_unstable_by_key(|r| (r.start, r.end));
    out
}

/// Walks event times through sorted ranges (nested ones included: a `zero_grad` inside a
/// step's closure) and says which range holds each time, the outermost first.
struct RangeCursor {
    next: usize,
    open: Vec<usize>,
}

impl RangeCursor {
    fn new() -> Self {
        RangeCursor { next: 0, open: Vec::new() }
    }

    /// The outermost range holding `time`; times must not go back. Asked at every event of a
    /// training trace: a range seldom ends between two, so the open ones are looked over
    /// before they are rewritten (a `retain` each time was 2% of a report of train_big).
    #[inline]
    fn at(&mut self, ranges: &[Range], time: i64) -> Option<usize> {
        while self.next < ranges.len() && ranges[self.next].start <= time {
            self.open.push(self.next);
            self.next += 1;
        }
        let ended = |r: &usize| ranges.get(*r).is_none_or(|range| range.end < time);
        if self.open.iter().any(ended) {
            self.open.retain(|r| !ended(r));
        }
        self.open.first().copied()
    }
}

/// The tag of every stack an event has, computed once per stack.
fn tag_cached(snapshot: &Snapshot, tags: &mut [Option<Tag>], stack: StackId) -> Tag {
    if stack == EMPTY_STACK {
        return Tag::None;
    }
    match tags.get_mut(stack as usize) {
        Some(Some(t)) => *t,
        Some(slot) => *slot.insert(tag(snapshot, stack)),
        None => tag(snapshot, stack),
    }
}

/// The phases of a device's events (`first` is the index of `events[0]` in the snapshot).
pub fn phases(snapshot: &Snapshot, device: i64, events: &[Event], first: usize) -> Phases {
    let mut tags: Vec<Option<Tag>> = vec![None; snapshot.stacks.stack_count()];
    let ranges = optimizer_ranges_with_closures(snapshot, device, events, first, &mut tags);
    let has_frames = events.iter().any(|e| e.stack != EMPTY_STACK);
    let mut out = Phases { has_frames, ..Phases::default() };
    out.phase.reserve(events.len());
    out.step.reserve(events.len());
    let (mut phase, mut step, mut cursor) = (Phase::Other, 0u32, RangeCursor::new());
    let (mut saw_optimizer, mut stepped) = (false, false);
    let (mut passes, mut in_pass) = (Vec::new(), false);
    // Most traces have no optimizer range: then no event's time is read.
    let mut times = (!ranges.is_empty()).then(|| snapshot.times.iter(first..first + events.len()));
    for (i, e) in events.iter().enumerate() {
        let mut t = tag_cached(snapshot, &mut tags, e.stack);
        let mut in_closure = false;
        if let Some(Some(time)) = times.as_mut().and_then(Iterator::next)
            && let Some(r) = cursor.at(&ranges, time)
        {
            in_closure = time <= ranges[r].closure_until;
            if !in_closure {
                t = if ranges[r].zero_grad { Tag::ZeroGrad } else { Tag::Optimizer };
            }
        }
        let is_alloc = e.action == crate::snapshot::Action::ALLOC;
        // A forward pass starts at a forward's event after code outside any module ran.
        match t {
            Tag::Forward if !in_pass => {
                passes.push(i);
                in_pass = true;
            }
            Tag::User | Tag::Optimizer | Tag::ZeroGrad | Tag::Backward => in_pass = false,
            _ => {}
        }
        let next = match t {
            Tag::Optimizer | Tag::ZeroGrad => Phase::Optimizer,
            Tag::Backward => Phase::Backward,
            Tag::Forward => Phase::Forward,
            Tag::User => match phase {
                Phase::Forward => Phase::Forward,
                _ => Phase::Other,
            },
            // Only an allocation without frames says "autograd engine" (also inside a step's
            // closure); a free without frames says nothing.
            Tag::None if has_frames && is_alloc && (phase != Phase::Optimizer || in_closure) => Phase::Backward,
            Tag::None => phase,
        };
        // A step ends where an optimizer phase that stepped ends; a `zero_grad` alone is not one.
        if phase == Phase::Optimizer && next != Phase::Optimizer {
            step += u32::from(stepped);
            stepped = false;
        }
        stepped |= next == Phase::Optimizer && t == Tag::Optimizer;
        saw_optimizer |= next == Phase::Optimizer;
        out.training |= next == Phase::Backward && has_frames;
        phase = next;
        out.phase.push(phase);
        out.step.push(step);
    }
    out.steps = if saw_optimizer { step + u32::from(stepped) } else { 0 };
    if !saw_optimizer {
        metadata_steps(snapshot, events, first, &mut out);
    }
    index_runs(&mut out);
    out.tags = tags;
    if out.steps == 0 && has_frames {
        forward_steps(&mut out, &passes);
    }
    out
}

/// The optimizer's ranges, each with the last event of a forward or backward inside it (a
/// step's closure, as Lightning's `optimizer_step` runs the training step inside it).
fn optimizer_ranges_with_closures(
    snapshot: &Snapshot,
    device: i64,
    events: &[Event],
    first: usize,
    tags: &mut [Option<Tag>],
) -> Vec<Range> {
    let mut ranges = optimizer_ranges(snapshot, device);
    if ranges.is_empty() {
        return ranges;
    }
    let mut cursor = RangeCursor::new();
    for (e, time) in events.iter().zip(snapshot.times.iter(first..first + events.len())) {
        let Some(time) = time else { continue };
        if let Some(r) = cursor.at(&ranges, time)
            && matches!(tag_cached(snapshot, tags, e.stack), Tag::Forward | Tag::Backward)
        {
            ranges[r].closure_until = time;
        }
    }
    ranges
}

/// The runs of one phase, and for each run the next run of every phase.
fn index_runs(out: &mut Phases) {
    let mut runs: Vec<(Phase, usize, usize)> = Vec::new();
    for (i, p) in out.phase.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.0 == *p => r.2 = i,
            _ => runs.push((*p, i, i)),
        }
    }
    let mut next = vec![[NONE; 4]; runs.len()];
    for r in (0..runs.len().saturating_sub(1)).rev() {
        next[r] = next[r + 1];
        next[r][runs[r + 1].0 as usize] = (r + 1) as u32;
    }
    out.runs = runs;
    out.next = next;
}

/// Forward passes needed to count them as steps.
const MIN_FORWARD_STEPS: usize = 3;

/// Without an optimizer or step tags (an evaluation loop, inference): each forward pass (a
/// module's forward entered after code outside any module ran: the loop's own lines), and
/// what follows it up to the next one, is a step, so that what each pass leaves behind is
/// seen growing.
fn forward_steps(out: &mut Phases, starts: &[usize]) {
    if starts.len() < MIN_FORWARD_STEPS {
        return;
    }
    let mut k = 0;
    for (i, s) in out.step.iter_mut().enumerate() {
        while k + 1 < starts.len() && starts[k + 1] <= i {
            k += 1;
        }
        *s = k as u32;
    }
    out.steps = starts.len() as u32;
    out.forward_steps = true;
}

/// Steps from `user_metadata` tags that change (`step=3`, `{"step": 3}`): each distinct tag
/// value starts a step; events before the first tag are in no step.
fn metadata_steps(snapshot: &Snapshot, events: &[Event], first: usize, out: &mut Phases) {
    // From the few events that carry strings (sorted by event), not a lookup per event.
    let extras = &snapshot.extras;
    let (lo, hi) = (
        extras.partition_point(|x| (x.event as usize) < first),
        extras.partition_point(|x| (x.event as usize) < first + events.len()),
    );
    let tagged: Vec<(usize, &str)> = extras[lo..hi]
        .iter()
        .filter_map(|x| Some((x.event as usize - first, snapshot.stacks.str(x.user_metadata?))))
        .filter(|(_, m)| m.contains("step"))
        .collect();
    if tagged.len() < 2 {
        return;
    }
    let (mut step, mut last, mut k) = (0u32, tagged[0].1, 0usize);
    for (i, s) in out.step.iter_mut().enumerate() {
        while k < tagged.len() && tagged[k].0 <= i {
            if tagged[k].1 != last {
                step += 1;
                last = tagged[k].1;
            }
            k += 1;
        }
        *s = step;
    }
    out.steps = step + 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The evidence read by phase (`events_in`) sees exactly the events of that phase, in order.
    #[test]
    fn the_events_of_a_phase_are_those_of_its_runs() {
        use Phase::*;
        let mut p =
            Phases { phase: vec![Other, Forward, Forward, Backward, Forward, Optimizer, Other], ..Phases::default() };
        index_runs(&mut p);
        for ph in [Forward, Backward, Optimizer, Other] {
            let want: Vec<usize> = p.phase.iter().enumerate().filter(|(_, x)| **x == ph).map(|(i, _)| i).collect();
            assert_eq!(p.events_in(ph).collect::<Vec<_>>(), want, "{ph:?}");
            assert_eq!(p.has(ph), !want.is_empty(), "{ph:?}");
        }
        let mut other = Phases { phase: vec![Other; 3], ..Phases::default() };
        index_runs(&mut other);
        assert!(!other.has(Forward) && other.events_in(Forward).next().is_none());
    }
}
