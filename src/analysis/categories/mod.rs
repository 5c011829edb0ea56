//! What each allocation holds: parameters, gradients, optimizer state, activations, temporaries,
//! inputs, KV cache, other, or unknown. Each allocation of the trace gets one category from its stack, its
//! phase (`phases`) and its lifetime (the whole trace is known, so "alive into the backward" is a
//! fact, not a guess). The rules, first match wins:
//!
//! 1. No frames anywhere in the recording: `unknown` (nothing to tell phases apart).
//!    Rules 2 to 6 do not depend on one framework's frames: a parameter is what the optimizer
//!    trains or a module holds, a gradient is made in a backward and lives to the optimizer,
//!    optimizer state outlives the step that made it.
//! 2. Parameter: made by `nn.Module`'s `_apply` (`.cuda()`, `.to()`, `.half()`), a module's
//!    `__init__` / `reset_parameters`, `torch/nn/parameter.py` or `torch/nn/init.py`, FSDP's
//!    sharding (`fully_shard`) or its all-gather of a layer's full parameters for compute (the
//!    breakdown counts those copies apart); or made before the first forward and never freed by
//!    library code alone (a checkpoint loaded straight to the GPU: transformers'
//!    `from_pretrained(device_map=...)` copies each weight on a thread pool whose frames name no
//!    user code), or by a library line (innermost frame) in the size of a trainable parameter (PEFT
//!    casting its adapters).
//!
//!    Trainable sizes: the sizes of the optimizer state made in `_init_group` (Adam keeps two
//!    moments the size of each parameter it trains, and nothing for a frozen one); without any
//!    state in the trace, every parameter's size.
//!
//!    KV cache: a stack [`super::kv`] finds growing as a decode loop's cache (after rule 2).
//! 3. Made in an optimizer phase: `temporary` if freed before that phase ends; else
//!    `optimizer_state` if the phase ended within the trace (it outlived the step), or if the trace
//!    ends inside it and the stack is the optimizer's `_init_group`; else `unknown`.
//! 4. Made in a backward (wherever it runs: inside the optimizer's closure under Lightning):
//!    `temporary` if freed before the backward ends; else `gradient` if its size is a trainable
//!    parameter's, it is freed in an optimizer phase (zero_grad), or its stack made gradients in
//!    the earlier steps (a block freed by the optimizer phase: FSDP reduce-scatters a layer's
//!    gradients into one flat buffer, not a parameter's size); else, alive where the trace stops
//!    inside that backward (an OOM in the backward), `activation`: the gradient of an activation,
//!    batch-sized like the activation it mirrors and shrunk by the same remedies; else `unknown`.
//! 5. Made in a forward: `temporary` if freed before the next backward starts; `activation` if
//!    alive into that backward and freed before the next forward (or alive at the end of a trace
//!    that stops before the step's optimizer phase); `other` if it outlives the step (kept across
//!    steps: a cached tensor, the loss, a leak). Alive at the end of a trace that stops inside the
//!    forward (an OOM in the first forward, the usual first try of a new batch size): `activation`
//!    when the trace shows training (it has a backward phase), or when what the forward keeps has
//!    the pattern of tensors saved for a backward: blocks of at least [`SAVED_SITES`] call sites,
//!    each alive several times over (once per layer), accumulating module after module, most of
//!    what the forward keeps. A forward under `torch.no_grad()` keeps only each layer's output and
//!    its cache. Else `unknown`; on a trace with no backward at all (inference), `other`.
//! 6. Made outside those phases: `gradient` from a stack that made gradients in earlier steps
//!    (FSDP's last reduce-scatter runs in a callback after the backward); by user code: `input` if
//!    alive into the next forward (a batch made or moved to the GPU before the model runs);
//!    `temporary` if freed before it; else `other`.
//! 7. Blocks alive before the trace began: rule 2 or the optimizer's frames (state that outlived
//!    the trace's start), a KV cache's stack, else `unknown`.

mod evidence;

pub use evidence::SAVED_SITES;
use evidence::{forward, gradient_stacks, saved_for_backward, trainable_sizes};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use serde::{Deserialize, Serialize};

use super::phases::{Phase, Phases};
use crate::replay::{BlockRec, NIL};
use crate::snapshot::{Action, Event, Snapshot, StackId};

/// What an allocated block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model weights: made by a module's init, `.to()` / `.cuda()` or `nn.init`.
    Parameter,
    /// Made in backward and kept: parameter-sized, or freed in the optimizer (zero_grad).
    Gradient,
    /// Made by the optimizer and kept past its step.
    OptimizerState,
    /// Made in forward and alive into the backward.
    Activation,
    /// Freed within the phase that made it.
    Temporary,
    /// The batch: made by user code before the model runs, alive into the forward.
    Input,
    /// An inference KV cache: the keys and values a decode loop keeps per layer per token
    /// (see [`super::kv`]).
    KvCache,
    /// Kept across steps: a cache, the loss, a leak.
    Other,
    /// No frame or phase to tell (a trace recorded without stacks, or before the trace).
    Unknown,
}

impl Category {
    /// Every category, in the order reports list them.
    pub const ALL: [Category; 9] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::KvCache,
        Category::Other,
        Category::Unknown,
    ];

    /// The name in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::KvCache => "kv_cache",
            Category::Other => "other",
            Category::Unknown => "unknown",
        }
    }
}

/// The category of every allocation of one device.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    /// By device event index: the category of the allocation made there (alloc events only).
    by_event: Vec<Category>,
    /// Blocks alive before the trace began, by stack.
    before: HashMap<StackId, Category>,
    /// Stacks of FSDP's unsharded parameter copies (labelled parameter).
    unsharded: HashSet<StackId>,
    /// The stacks of an inference KV cache, with how it grows.
    pub kv: super::kv::Stacks,
}

impl Labels {
    /// The category of a live block of a replayed state.
    pub fn of(&self, block: &BlockRec) -> Category {
        if block.event != NIL {
            return self.by_event.get(block.event as usize).copied().unwrap_or(Category::Unknown);
        }
        self.before.get(&block.stack).copied().unwrap_or(Category::Unknown)
    }

    /// Whether a parameter block is a full copy FSDP gathered for a layer's compute.
    pub fn is_unsharded_copy(&self, block: &BlockRec) -> bool {
        self.unsharded.contains(&block.stack)
    }

    /// The category of the allocation made at device event `i`.
    pub fn at(&self, i: usize) -> Category {
        self.by_event.get(i).copied().unwrap_or(Category::Unknown)
    }
}

/// True for stacks that make parameters (moving or creating a module's tensors, or FSDP
/// sharding them or gathering a full copy of them for a layer's compute).
pub fn makes_parameters(snapshot: &Snapshot, stack: StackId) -> bool {
    snapshot.stacks.frames(stack).any(|f| {
        let file = snapshot.stacks.str(f.filename).replace('\\', "/");
        let name = snapshot.stacks.str(f.name);
        (file.ends_with("nn/modules/module.py")
            && matches!(name, "_apply" | "cuda" | "to" | "to_empty" | "half" | "float" | "bfloat16" | "type"))
            || (file.contains("torch/nn/") && matches!(name, "__init__" | "reset_parameters"))
            || file.ends_with("nn/parameter.py")
            || file.ends_with("nn/init.py")
            || (file.contains("torch/distributed/fsdp/") && matches!(name, "_init_sharded_param" | "fully_shard"))
            || (file.contains("torch/distributed/tensor/") && name == "distribute_tensor")
    }) || unsharded_copy(snapshot, stack)
}

/// True for stacks where FSDP gathers a layer's full (unsharded) parameters for its forward
/// or backward: parameter memory, held while that layer computes.
pub fn unsharded_copy(snapshot: &Snapshot, stack: StackId) -> bool {
    snapshot.stacks.frames(stack).any(|f| {
        let file = snapshot.stacks.str(f.filename).replace('\\', "/");
        file.contains("torch/distributed/fsdp/")
            && matches!(
                snapshot.stacks.str(f.name),
                "alloc_storage" | "init_all_gather_outputs" | "foreach_all_gather" | "wait_for_unshard" | "unshard"
            )
    })
}

/// Whether the innermost frame is library code: the tensor was made by a library (PEFT casting
/// its adapters, FSDP sharding), not by the user's own line (a batch).
fn made_by_library(snapshot: &Snapshot, stack: StackId) -> bool {
    snapshot
        .stacks
        .frames(stack)
        .next()
        .is_some_and(|f| crate::snapshot::sites::is_library_frame(snapshot.stacks.str(f.filename)))
}

/// A library loading a model (`from_pretrained` with a `device_map`, which copies each weight
/// to the GPU on a thread pool): every frame is library code, none the user's.
fn loads(snapshot: &Snapshot, stack: StackId) -> bool {
    let mut frames = snapshot.stacks.frames(stack).peekable();
    frames.peek().is_some() && frames.all(|f| crate::snapshot::sites::is_library_frame(snapshot.stacks.str(f.filename)))
}

fn in_optimizer(snapshot: &Snapshot, stack: StackId) -> bool {
    snapshot.stacks.frames(stack).any(|f| snapshot.stacks.str(f.filename).replace('\\', "/").contains("torch/optim/"))
}

fn inits_optimizer_state(snapshot: &Snapshot, stack: StackId) -> bool {
    snapshot.stacks.frames(stack).any(|f| snapshot.stacks.str(f.name) == "_init_group")
}

/// In [`frees`]: never freed within the trace.
pub const NEVER: u32 = u32::MAX;

/// For each alloc event, the event that freed it (`free_requested`, else `free_completed`), or
/// [`NEVER`]. A plain `u32` per event, not an `Option`: half the memory on a long trace.
pub fn frees(events: &[Event]) -> Vec<u32> {
    // An address stays in the map once seen, its allocation marked freed (NEVER): taking
    // it out at each free left deleted slots that the table kept cleaning up (see
    // `replay::initial`). The allocator reuses addresses, so the map stays small.
    let mut open: HashMap<u64, u32> = HashMap::with_capacity(1 << 12);
    let mut out = vec![NEVER; events.len()];
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::ALLOC => {
                open.insert(e.addr, i as u32);
            }
            Action::FREE_REQUESTED | Action::FREE_COMPLETED => {
                if let Some(a) = open.get_mut(&{ e.addr })
                    && *a != NEVER
                {
                    out[*a as usize] = i as u32;
                    *a = NEVER;
                }
            }
            _ => {}
        }
    }
    out
}

/// Labels every allocation of a device. `before` are the blocks alive when the trace began.
pub fn label(snapshot: &Snapshot, events: &[Event], phases: &Phases, before: &[BlockRec], freed: &[u32]) -> Labels {
    let mut labels = Labels {
        by_event: vec![Category::Unknown; events.len()],
        before: HashMap::new(),
        unsharded: HashSet::new(),
        kv: super::kv::stacks(snapshot, events, phases),
    };
    let mut params = Params { snapshot, memo: vec![None; snapshot.stacks.stack_count()] };
    for b in before {
        let c = if params.made(b.stack) {
            Category::Parameter
        } else if labels.kv.contains(b.stack) {
            Category::KvCache
        } else if in_optimizer(snapshot, b.stack) {
            Category::OptimizerState
        } else {
            Category::Unknown
        };
        labels.before.insert(b.stack, c);
    }
    if !phases.has_frames {
        return labels;
    }
    let trainable = trainable_sizes(snapshot, events, phases, before, freed);
    // Without the optimizer's sizes, a trainable size is any parameter's of the whole trace,
    // known only after a pass over it. The rules read those sizes only in a backward or before
    // a forward: where the trace has neither, or the optimizer told them, one pass labels all.
    let one_pass = trainable.is_some() || !(phases.has(Phase::Backward) || phases.has(Phase::Forward));
    let mut param_sizes: HashSet<u64> = HashSet::new();
    if !one_pass {
        param_sizes.extend(before.iter().filter(|b| params.made(b.stack)).map(|b| b.requested));
    }
    let mut by_phase = ByPhase {
        snapshot,
        phases,
        freed,
        trainable: trainable.unwrap_or_default(),
        grad_stacks: gradient_stacks(events, phases, freed),
        last: events.len().saturating_sub(1),
        saved: saved_for_backward(events, phases, freed),
        first_forward: phases.runs.iter().find(|r| r.0 == Phase::Forward).map_or(usize::MAX, |r| r.1),
    };
    // Parameters first, then the KV cache among what is not one (each by its own stack alone),
    // then the rest by phase.
    let mut run = 0;
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::ALLOC {
            continue;
        }
        if params.made(e.stack) {
            labels.by_event[i] = Category::Parameter;
            if !one_pass {
                param_sizes.insert(e.size);
            }
            if unsharded_copy(snapshot, e.stack) {
                labels.unsharded.insert(e.stack);
            }
        } else if labels.kv.contains(e.stack) {
            labels.by_event[i] = Category::KvCache;
        } else if one_pass {
            labels.by_event[i] = by_phase.category(i, e, run_of(phases, &mut run, i));
        }
    }
    if !one_pass {
        by_phase.trainable = param_sizes;
        let mut run = 0;
        for (i, e) in events.iter().enumerate() {
            if e.action != Action::ALLOC || matches!(labels.by_event[i], Category::Parameter | Category::KvCache) {
                continue;
            }
            labels.by_event[i] = by_phase.category(i, e, run_of(phases, &mut run, i));
        }
    }
    labels
}

/// The run that holds event `i`, from `run`, the run of an earlier event: events go forward,
/// and so does the run that holds them.
fn run_of(phases: &Phases, run: &mut usize, i: usize) -> usize {
    while phases.runs[*run].2 < i {
        *run += 1;
    }
    *run
}

/// Whether a stack makes parameters, asked once per allocation: by stack id (ids are dense).
struct Params<'a> {
    snapshot: &'a Snapshot,
    memo: Vec<Option<bool>>,
}

impl Params<'_> {
    fn made(&mut self, stack: StackId) -> bool {
        match self.memo.get_mut(stack as usize) {
            Some(Some(p)) => *p,
            Some(slot) => *slot.insert(makes_parameters(self.snapshot, stack)),
            None => makes_parameters(self.snapshot, stack),
        }
    }
}

/// What an allocation's phase, and when it is freed, say it holds.
struct ByPhase<'a> {
    snapshot: &'a Snapshot,
    phases: &'a Phases,
    freed: &'a [u32],
    /// The sizes of the parameters the optimizer trains.
    trainable: HashSet<u64>,
    grad_stacks: HashSet<StackId>,
    last: usize,
    /// The last forward, where no backward follows it, keeps what a training forward keeps.
    saved: bool,
    first_forward: usize,
}

impl ByPhase<'_> {
    /// The category of allocation `i`, in phase run `run`.
    fn category(&self, i: usize, e: &Event, run: usize) -> Category {
        let (phases, snapshot) = (self.phases, self.snapshot);
        let free = (self.freed[i] != NEVER).then_some(self.freed[i] as usize);
        let (phase, _, run_end) = phases.runs[run];
        let freed_by = |end: usize| free.is_some_and(|f| f <= end);
        let freed_in_optimizer = free.is_some_and(|f| phases.phase[f] == Phase::Optimizer);
        match phase {
            Phase::Optimizer if freed_by(run_end) => Category::Temporary,
            Phase::Optimizer if run_end < self.last || inits_optimizer_state(snapshot, e.stack) => {
                Category::OptimizerState
            }
            Phase::Optimizer => Category::Unknown,
            Phase::Backward if freed_by(run_end) => Category::Temporary,
            Phase::Backward => {
                let kept_as_before = free.is_none() && self.grad_stacks.contains(&{ e.stack });
                if self.trainable.contains(&{ e.size }) || freed_in_optimizer || kept_as_before {
                    Category::Gradient
                } else if free.is_none() && run + 1 == phases.runs.len() {
                    Category::Activation
                } else {
                    Category::Unknown
                }
            }
            Phase::Forward => forward(phases, run, free, self.saved),
            Phase::Other => {
                let user = phases.tag_of(e.stack) == super::phases::Tag::User;
                let library_param = || {
                    loads(snapshot, e.stack)
                        || (made_by_library(snapshot, e.stack) && self.trainable.contains(&{ e.size }))
                };
                match phases.next_run(run, Phase::Forward).map(|r| phases.runs[r].1) {
                    _ if self.grad_stacks.contains(&{ e.stack }) && (free.is_none() || freed_in_optimizer) => {
                        Category::Gradient
                    }
                    _ if freed_by(run_end) => Category::Temporary,
                    Some(_) if i < self.first_forward && free.is_none() && library_param() => Category::Parameter,
                    Some(fwd) if user && free.is_none_or(|f| f >= fwd) => Category::Input,
                    Some(fwd) if free.is_some_and(|f| f < fwd) => Category::Temporary,
                    _ => Category::Other,
                }
            }
        }
    }
}
