//! What the step that died needed: the peak of allocated and reserved bytes it would have
//! reached. A snapshot taken at an OOM ends at the OOM, so the failing request is not the step's
//! peak: the rest of its forward, its backward and its optimizer step are missing. Judged
//! against the instant alone, a batch too big for the budget can look like fragmentation. The
//! projection, most trusted first:
//!
//! - `observed`: no OOM; the run's own peak.
//! - `earlier_step`: an earlier step ran whole ([`earlier`]): what was alive when the dying step
//!   began, plus the earlier step's own allocations scaled to the dying step's sizes.
//! - `first_step`: the first step died ([`first`]): the state at the OOM, the forward's
//!   remaining layers ([`layers`]), and for training the gradients and the optimizer's state.
//! - `lower_bound`: no step structure: at least what was allocated plus the request, and the
//!   highest the run had been before.
//!
//! Reserved bytes are allocated ones plus the allocator's cache at a peak, 4.5% with its
//! defaults (what the reruns of the ladder jobs held) and 1% with expandable segments. The
//! budget comes from [`budget`]. [`Need::peak_with`] gives the peak under a remedy's
//! [`Change`], which is how every remedy is weighed.

pub(crate) mod budget;
mod earlier;
mod first;
pub(crate) mod layers;
pub(crate) mod mix;
pub(crate) mod steps;

use serde::{Deserialize, Serialize};

pub use budget::{Known, Outside};
pub use layers::Layers;
pub use mix::{Change, Mix, Model};

use super::memory::Index;
use super::oom::Oom;
use super::phases::Phase;
use crate::replay::{Replay, Rules, State};
use crate::snapshot::{Action, Event, Snapshot};
use crate::units::bytes;

/// Reserved over allocated at a peak under the tightest allocator (expandable segments map
/// pages of 2 MiB and 20 MiB): a need past the budget by this is past it whatever the
/// allocator does.
pub const TIGHTEST: f64 = 1.01;

/// How the need was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    Observed,
    EarlierStep,
    FirstStep,
    LowerBound,
    #[default]
    Unknown,
}

/// `diagnosis.need`: the projected peak of the step that died (or the run's real peak).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Need {
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// The budget, or the most that surely fits where only a range is known.
    pub budget_bytes: Option<u64>,
    /// Where only a range is known, its top: a need above it surely does not fit.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub budget_upper_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub budget_basis: Option<String>,
    /// How it was projected, in a sentence.
    pub basis: String,
    pub method: Method,
    /// True: the need fits the budget; false: it does not, whatever the allocator does; absent:
    /// it cannot be told (no budget, or the need sits inside the budget's range).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fits: Option<bool>,
    /// The step that died, and the one it was projected from.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub step: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reference_step: Option<u32>,
    /// The dying step's batch-sized allocations over the reference step's.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub batch_ratio: Option<f64>,
    /// The repeated module of the forward (what checkpointing would wrap).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layers: Option<Layers>,
    /// The moments of the projected step, for the remedies.
    #[serde(skip)]
    pub model: Model,
    /// Reserved over allocated at a peak.
    #[serde(skip)]
    pub slack: f64,
    /// Reserved less allocated at the peak, where the run's own peak is known: kept as it was.
    #[serde(skip)]
    pub slack_bytes: Option<u64>,
}

impl Need {
    /// The projected peak under a remedy's change: (allocated, reserved).
    pub fn peak_with(&self, change: &Change) -> Option<(u64, u64)> {
        self.peak_allocated_bytes?;
        let alloc = self.model.peak(change);
        Some((alloc, self.reserved(alloc)))
    }

    fn reserved(&self, allocated: u64) -> u64 {
        match self.slack_bytes {
            Some(b) => allocated + b,
            None => (allocated as f64 * self.slack).round() as u64,
        }
    }

    /// The same need against another budget (one the user names).
    pub fn with_budget(&self, budget: u64) -> Need {
        let mut n = self.clone();
        n.budget_bytes = Some(budget);
        n.budget_upper_bytes = None;
        n.budget_basis = Some(format!("{} as given", bytes(budget)));
        n.fits = n.peak_allocated_bytes.and_then(|a| n.fits_between(a, budget, budget));
        n
    }

    /// Whether a peak of `alloc` allocated bytes fits a budget known to lie in `lower..=upper`:
    /// no when even its tightest packing is above the top, yes when its reserved bytes are
    /// within the bottom, else it cannot be told.
    fn fits_between(&self, alloc: u64, lower: u64, upper: u64) -> Option<bool> {
        if alloc as f64 * TIGHTEST > upper as f64 {
            Some(false)
        } else if self.reserved(alloc) <= lower {
            Some(true)
        } else {
            None
        }
    }

    /// Whether a peak of `reserved` bytes surely fits the budget.
    pub fn surely_fits(&self, reserved: u64) -> Option<bool> {
        self.budget_bytes.map(|b| reserved <= b)
    }

    /// The checkpointing factor on activations: each layer keeps only its input, and one
    /// layer's activations are made again at a time.
    pub fn checkpoint_factor(&self) -> Option<f64> {
        let l = self.layers.as_ref()?;
        let act = self.model.at_peak().activation;
        if act == 0 || l.calls < 2 || l.saved_bytes_per_call <= l.input_bytes {
            return None;
        }
        let calls = l.calls as u64;
        let kept = act.saturating_sub(calls * (l.saved_bytes_per_call - l.input_bytes)) + l.saved_bytes_per_call;
        Some((kept as f64 / act as f64).clamp(0.02, 1.0))
    }
}

/// What the projection reads.
pub struct Inputs<'a> {
    pub snapshot: &'a Snapshot,
    pub events: &'a [Event],
    pub index: &'a Index,
    pub replay: &'a Replay,
    pub rules: &'a Rules,
    pub ooms: &'a [Oom],
    /// The state at the first OOM.
    pub oom_state: Option<&'a State>,
    /// The run's peaks: (allocated, reserved), and what filled memory at the allocated one.
    pub peak: (u64, u64),
    pub peak_mix: Mix,
    pub known: Known,
}

/// The need, with the budget it is weighed against.
pub fn project(x: &Inputs) -> Need {
    let slack = if x.rules.expandable_segments { TIGHTEST } else { 1.045 };
    let Some(oom) = x.ooms.first() else {
        let mut need = Need {
            peak_allocated_bytes: Some(x.peak.0),
            peak_reserved_bytes: Some(x.peak.1),
            budget_bytes: x.known.capacity.or(x.known.recorded_budget),
            basis: if x.replay.complete {
                "The run's own peak: the trace has no OOM.".into()
            } else {
                "The highest the trace saw (no OOM; the ring buffer lost the start, so the run may have been higher before).".into()
            },
            method: Method::Observed,
            model: Model::of(vec![x.peak_mix]),
            slack,
            slack_bytes: Some(x.peak.1.saturating_sub(x.peak.0)),
            ..Need::default()
        };
        need.fits = need.budget_bytes.map(|b| x.peak.1 <= b);
        return need;
    };
    let budget = budget::of_oom(oom, x.peak.1, &x.known);
    let mut need = match x.oom_state {
        Some(state) => projection(x, oom, state),
        None => Need { basis: "The state at the OOM could not be replayed.".into(), ..Need::default() },
    };
    need.slack = slack;
    if need.method != Method::Unknown {
        let alloc = need.model.peak(&Change::NONE);
        need.peak_allocated_bytes = Some(alloc);
        need.peak_reserved_bytes = Some(need.reserved(alloc));
        need.fits = need.fits_between(alloc, budget.bytes, budget.upper);
    }
    need.budget_bytes = Some(budget.bytes);
    need.budget_upper_bytes = (budget.upper != budget.bytes).then_some(budget.upper);
    need.budget_basis = Some(budget.basis);
    need
}

fn projection(x: &Inputs, oom: &Oom, state: &State) -> Need {
    let at = oom.event_index as usize;
    let phases = &x.index.phases;
    let request = x.rules.round_size(oom.requested_bytes);
    let phase = phases.phase.get(at).copied().unwrap_or(Phase::Other);
    let floor = floor(x, state, request, phase);
    let steps = steps::steps(x.snapshot, x.events, phases);
    let k = steps.as_ref().and_then(|s| s.of(at));
    let died = Died { at, request, phase, step: k, floor };
    if let (Some(steps), Some(k)) = (&steps, k)
        && k >= 1
        && (x.replay.complete || k >= 2)
        && let Some(need) = from_earlier_step(x, steps, &died)
    {
        return need;
    }
    if phases.has_frames {
        return for_first_step(x, state, &died);
    }
    let peak_before = x.peak.0.max(floor.total());
    let high = Mix { fixed: peak_before, ..Mix::default() };
    Need {
        basis: format!(
            "The trace shows no step structure (no frames, or no repeated sequence): the step needs at least what was allocated plus the request ({}), and the run had been as high as {} before.",
            bytes(floor.total()),
            bytes(peak_before)
        ),
        method: Method::LowerBound,
        model: Model::of(vec![floor, high]),
        ..Need::default()
    }
}

/// Where the job died: the OOM's event, its request (rounded), its phase and step, and the
/// floor under every projection.
struct Died {
    at: usize,
    request: u64,
    phase: Phase,
    step: Option<usize>,
    floor: Mix,
}

impl Died {
    fn with_floor(&self, mut model: Model) -> Model {
        model.moments.push(self.floor);
        model
    }
}

/// At least what was alive and the request: a floor under every projection.
fn floor(x: &Inputs, state: &State, request: u64, phase: Phase) -> Mix {
    let mut m = Mix::default();
    for b in super::memory::live_blocks(state).filter(|b| b.state == crate::snapshot::BlockState::ActiveAllocated) {
        let c = x.index.labels.of(b);
        m.add(c, b.size, b.event != crate::replay::NIL && earlier::batch_sized(c), false);
    }
    let batched = matches!(phase, Phase::Forward | Phase::Backward);
    m.add(super::categories::Category::Temporary, request, batched, false);
    m
}

/// The dying step projected from the step before it, where that ran whole.
fn from_earlier_step(x: &Inputs, steps: &steps::Steps, died: &Died) -> Option<Need> {
    let k = died.step?;
    let (earlier, dying) = (steps.range(k - 1, x.events.len()), steps.range(k, x.events.len()));
    let dying = dying.start..died.at + 1;
    let p = earlier::project(x.snapshot, x.events, x.index, x.replay, x.rules, earlier.clone(), dying)?;
    let mut layers = forward_of(&x.index.phases, earlier)
        .and_then(|(fwd, end)| layers::find(x.snapshot, x.events, fwd, end, &x.index.freed, x.rules));
    if let Some(l) = layers.as_mut() {
        // Measured in the earlier step: at the dying step's sizes.
        l.saved_bytes_per_call = (l.saved_bytes_per_call as f64 * p.ratio) as u64;
        l.input_bytes = (l.input_bytes as f64 * p.ratio) as u64;
    }
    let (what, of) = if steps.from_phases { ("step", "") } else { ("repetition", " of the loop") };
    let scaled = if (p.ratio - 1.0).abs() < 0.02 {
        "at the same sizes".to_string()
    } else {
        format!("its batch-sized allocations {:.2}x as large in the step that died", p.ratio)
    };
    Some(Need {
        basis: format!(
            "Projected from {what} {}{of} ({:.0}% of the dying {what}'s requests matched it by call site, {scaled}): what was alive when {what} {k} began, plus what {what} {} made and freed within itself, scaled to the dying {what}'s sizes.",
            k - 1,
            100.0 * p.matched,
            k - 1
        ),
        method: Method::EarlierStep,
        step: Some(k as u32),
        reference_step: Some(k as u32 - 1),
        batch_ratio: Some(p.ratio),
        layers,
        model: died.with_floor(p.model),
        ..Need::default()
    })
}

/// The step projected from its own start, where no earlier step ran whole.
fn for_first_step(x: &Inputs, state: &State, died: &Died) -> Need {
    let (at, phases) = (died.at, &x.index.phases);
    let run = phases.runs.iter().rev().find(|r| r.1 <= at && r.0 == Phase::Forward).map(|r| r.1..at + 1);
    let mut layers = run.and_then(|fwd| layers::find(x.snapshot, x.events, fwd, at, &x.index.freed, x.rules));
    if let Some(l) = layers.as_mut()
        && let Some(n) = layers::from_parameters(&parameter_sizes(x))
        && n > l.calls
    {
        l.calls = n;
    }
    let has = |c| super::memory::live_blocks(state).any(|b| x.index.labels.of(b) == c);
    let training = phases.training
        || has(super::categories::Category::Activation)
        || has(super::categories::Category::OptimizerState);
    let f = first::project(x.index, state, died.request, died.phase, training, layers.as_ref());
    let mut basis = format!(
        "Projected for a first step (no earlier step ran whole): what was alive at the OOM and the request{}",
        if f.layers_left > 0 {
            format!(
                ", the activations of the {} calls of the repeated layer the forward had not reached",
                f.layers_left
            )
        } else {
            String::new()
        }
    );
    if training {
        basis.push_str(", the gradient of the failing tensor, and the weights' gradients");
        if f.assumed_state {
            basis.push_str(
                " and the state the optimizer's first step() makes, taken as Adam's or AdamW's (two tensors per weight)",
            );
        }
    }
    basis.push_str(
        ". The loss's and the backward's other temporaries are not in the trace: the step needs at least this.",
    );
    Need {
        basis,
        method: Method::FirstStep,
        step: died.step.map(|k| k as u32),
        layers,
        model: died.with_floor(f.model),
        ..Need::default()
    }
}

/// The first forward of a step's events, and the event it ends at.
fn forward_of(
    phases: &super::phases::Phases,
    range: std::ops::Range<usize>,
) -> Option<(std::ops::Range<usize>, usize)> {
    let r = phases.runs.iter().find(|r| r.0 == Phase::Forward && range.contains(&r.1))?;

    Some((r.1..r.2 + 1, r.2))
}

/// Sizes of the parameters in the order they were made.
fn parameter_sizes(x: &Inputs) -> Vec<u64> {
    x.events
        .iter()
        .enumerate()
        .filter(|(i, e)| e.action == Action::ALLOC && x.index.labels.at(*i) == super::categories::Category::Parameter)
        .map(|(_, e)| e.size)
        .collect()
}
