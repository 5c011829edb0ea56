//! The need of a first step, which no earlier step shows: what was alive at the OOM and the
//! request itself, the activations of the layers the forward had not reached yet (the
//! repeated module's calls still to come, each keeping what the calls before it kept), the
//! gradient of the failing tensor that the backward makes (as large as the tensor), and, for a
//! training job, the gradients of the weights and the optimizer's state that the first
//! `step()` makes: two tensors per weight, as Adam and AdamW keep (the most common; the basis
//! says so). The loss's and the backward's other temporaries are not in the trace, so this is
//! a lower estimate.

use super::layers::Layers;
use super::mix::{Mix, Model};
use crate::analysis::categories::Category;
use crate::analysis::memory::{Index, live_blocks};
use crate::analysis::phases::Phase;
use crate::replay::{NIL, State};

/// What the first step's projection adds to the state at the OOM.
pub struct FirstStep {
    pub model: Model,
    /// The optimizer state was assumed (none existed yet).
    pub assumed_state: bool,
    /// Layers the forward had still to run.
    pub layers_left: u32,
}

/// Projects the first step from the state at its OOM.
pub fn project(
    index: &Index,
    state: &State,
    request: u64,
    phase: Phase,
    training: bool,
    layers: Option<&Layers>,
) -> FirstStep {
    let mut now = Mix::default();
    for b in live_blocks(state).filter(|b| b.state == crate::snapshot::BlockState::ActiveAllocated) {
        let c = index.labels.of(b);
        now.add(c, b.size, b.event != NIL && super::earlier::batch_sized(c), false);
    }
    let mut at_peak = now;
    let batched = matches!(phase, Phase::Forward | Phase::Backward);
    at_peak.add(Category::Temporary, request, batched, false);
    let mut layers_left = 0;
    if phase == Phase::Forward
        && let Some(l) = layers
    {
        layers_left = l.calls.saturating_sub(l.done);
        at_peak.activation += layers_left as u64 * l.saved_bytes_per_call;
    }
    let mut assumed_state = false;
    if training {
        if phase == Phase::Forward {
            // The backward begins with the gradient of the last tensor made.
            at_peak.add(Category::Temporary, request, true, false);
        }
        at_peak.gradient = at_peak.gradient.max(now.parameter);
        if now.optimizer_state == 0 {
            at_peak.optimizer_state = 2 * now.parameter;
            assumed_state = true;
        }
    }
    FirstStep { model: Model::of(vec![now, at_peak]), assumed_state, layers_left }
}
