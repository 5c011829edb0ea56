//! What the events say beyond a block's own phase: the sizes the optimizer trains, the stacks
//! that make gradients, whether the last forward keeps what a training forward keeps, and a
//! forward block's category by when it is freed (the rules in the parent module's doc).

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::*;

/// The sizes of the parameters the optimizer trains: those it keeps state for (Adam's moments
/// are each the size of their parameter), made at the first step in `_init_group`. None when
/// the trace shows no optimizer state (SGD without momentum, a trace without a step): then
/// every parameter counts. Frozen weights (PEFT LoRA's base model) get no state, so a tensor of
/// a frozen weight's size made in a backward is not taken for its gradient.
pub(super) fn trainable_sizes(
    snapshot: &Snapshot,
    events: &[Event],
    phases: &Phases,
    before: &[BlockRec],
    freed: &[u32],
) -> Option<HashSet<u64>> {
    let mut sizes: HashSet<u64> =
        before.iter().filter(|b| inits_optimizer_state(snapshot, b.stack)).map(|b| b.requested).collect();
    for i in phases.events_in(Phase::Optimizer) {
        let e = &events[i];
        if e.action == Action::ALLOC && freed[i] == NEVER && inits_optimizer_state(snapshot, e.stack) {
            sizes.insert(e.size);
        }
    }
    // Scalars (Adam's `step` when it lives on the GPU) are not a parameter's size.
    sizes.retain(|s| *s > 512);
    (!sizes.is_empty()).then_some(sizes)
}

/// Stacks that made gradients in earlier steps: blocks made after a forward, outside the
/// optimizer, and freed by the optimizer phase (`zero_grad`). A framework whose gradients are
/// not a parameter's size (FSDP reduce-scatters each layer's gradients into one flat buffer)
/// makes them from the same stack every step, so the last step's, alive where the trace
/// stops, are gradients too. Blocks without frames (the autograd engine's) say nothing.
pub(super) fn gradient_stacks(events: &[Event], phases: &Phases, freed: &[u32]) -> HashSet<StackId> {
    let mut out = HashSet::new();
    // Nothing is freed by an optimizer phase where there is none.
    if !phases.has(Phase::Optimizer) {
        return out;
    }
    for i in phases.events_in(Phase::Backward).chain(phases.events_in(Phase::Other)) {
        let e = &events[i];
        if e.action != Action::ALLOC || e.stack == crate::snapshot::EMPTY_STACK || freed[i] == NEVER {
            continue;
        }
        if phases.phase[freed[i] as usize] == Phase::Optimizer {
            out.insert(e.stack);
        }
    }
    out
}

/// Call sites whose blocks a forward keeps several times over, at least, for what it keeps to
/// read as tensors saved for a backward.
pub const SAVED_SITES: usize = 4;

/// Whether the last forward run, where no backward follows it, keeps what a training forward
/// keeps (see rule 5).
pub(super) fn saved_for_backward(events: &[Event], phases: &Phases, freed: &[u32]) -> bool {
    let Some(&(Phase::Forward, start, end)) = phases.runs.last() else { return false };
    let mut by_site: HashMap<StackId, (u32, u64)> = HashMap::new();
    let mut kept = 0u64;
    for i in start..=end {
        if events[i].action == Action::ALLOC && freed[i] == NEVER {
            let e = by_site.entry(events[i].stack).or_default();
            (e.0, e.1) = (e.0 + 1, e.1 + events[i].size);
            kept += events[i].size;
        }
    }
    let repeated: Vec<u64> = by_site.values().filter(|(n, _)| *n >= 2).map(|(_, b)| *b).collect();
    repeated.len() >= SAVED_SITES && 2 * repeated.iter().sum::<u64>() >= kept
}

/// Rule 5: an allocation made in the forward run `run`, freed at `free`; `saved`: the last
/// forward keeps what a training forward keeps.
pub(super) fn forward(phases: &Phases, run: usize, free: Option<usize>, saved: bool) -> Category {
    let Some(bwd) = phases.next_run(run, Phase::Backward) else {
        // No backward follows: the trace stops inside this forward, or this is inference.
        return match free {
            Some(_) => Category::Temporary,
            None if phases.next_run(run, Phase::Forward).is_some() => Category::Other,
            None if phases.training || saved => Category::Activation,
            None => Category::Unknown,
        };
    };
    let bwd_start = phases.runs[bwd].1;
    if free.is_some_and(|f| f < bwd_start) {
        return Category::Temporary;
    }
    match (phases.next_run(bwd, Phase::Forward).map(|r| phases.runs[r].1), free) {
        (Some(next), Some(f)) if f < next => Category::Activation,
        (Some(_), _) => Category::Other,
        // The last step: alive through a whole optimizer phase after its backward is kept
        // across steps; otherwise the trace stops inside the backward, where it is still used.
        (None, Some(_)) => Category::Activation,
        (None, None) if phases.next_run(bwd, Phase::Optimizer).is_some() => Category::Other,
        (None, None) => Category::Activation,
    }
}
