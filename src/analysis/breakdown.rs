//! What fills memory at a moment: allocated bytes by category and by call site, the training
//! steps with their peaks, and the call sites whose never-freed blocks grow step after step
//! (a leak). Category bytes always sum to the moment's allocated bytes: every live block has
//! exactly one category (see [`super::categories`]).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::categories::{Category, Labels};
use super::phases::{Phase, Phases};
use crate::replay::{Rules, State};
use crate::snapshot::sites::{CallSite, call_site};
use crate::snapshot::{Action, BlockState, Event, Snapshot, StackId};

/// Call sites listed per moment.
pub const TOP_SITES: usize = 20;

/// Which moment a breakdown is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// The peak of allocated bytes.
    Peak,
    /// The first OOM (the request that failed is not counted).
    Oom,
    /// The end of the trace (the snapshot's `segments`).
    Final,
    /// Any event, asked for through the API.
    Event,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Breakdown {
    pub moment: Moment,
    /// The event the state follows; None before the first event.
    pub event_index: Option<u64>,
    pub allocated_bytes: u64,
    pub phase: Phase,
    pub categories: BTreeMap<Category, u64>,
    /// The top call sites by bytes, each with one category.
    pub call_sites: Vec<SiteBytes>,
    /// Of `parameter`, the full copies FSDP gathered for the layers computing now (each layer's
    /// shards all-gathered for its forward or backward, and freed after it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unsharded_parameter_bytes: u64,
    /// The KV cache's numbers, where it holds memory now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<super::kv::KvCache>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteBytes {
    pub call_site: Option<CallSite>,
    pub category: Category,
    pub bytes: u64,
    pub blocks: u64,
}

/// One training step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub index: u32,
    pub first_event: u64,
    pub last_event: u64,
    pub peak_allocated_bytes: u64,
    pub peak_event: u64,
    pub peak_phase: Phase,
}

/// Why memory grows, where the trace tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakCause {
    /// Made in a forward of a training step and alive past its backward and optimizer step:
    /// saved activations held by an autograd graph something keeps.
    KeptGraph,
    /// Made in each forward of a loop without an optimizer and never freed: outputs kept
    /// across passes (with their graph, when the loop runs without `torch.no_grad()`).
    KeptOutputs,
}

impl LeakCause {
    /// What it is, in a sentence.
    pub fn says(self) -> &'static str {
        match self {
            LeakCause::KeptGraph => {
                "blocks made in the forward outlive their step's backward and optimizer step: saved activations held by an autograd graph that something keeps. The usual causes: a loss summed without .item() (total_loss += loss), outputs kept without .detach(), backward(retain_graph=True), an evaluation without torch.no_grad()"
            }
            LeakCause::KeptOutputs => {
                "blocks made in each forward pass are never freed: outputs kept from pass to pass, each holding its autograd graph when the loop runs without torch.no_grad(). The usual causes: outputs appended to a list without .detach() or .cpu(), a loop without torch.no_grad() or torch.inference_mode()"
            }
        }
    }

    /// The lines that stop it.
    pub fn code(self) -> &'static str {
        match self {
            LeakCause::KeptGraph => {
                "total_loss += loss.item()        # a number, not the graph
kept.append(out.detach().cpu())  # not `out`
loss.backward()                  # without retain_graph=True
with torch.no_grad(): evaluate(model)"
            }
            LeakCause::KeptOutputs => {
                "with torch.inference_mode():      # no graph kept
    out = model(x)
kept.append(out.cpu())            # or a number: out.item()"
            }
        }
    }
}

/// A call site whose never-freed blocks grow step after step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Growth {
    pub call_site: Option<CallSite>,
    pub category: Category,
    pub bytes_per_step: u64,
    /// Steps in which it made a block that was never freed.
    pub steps: u32,
    pub live_bytes: u64,
    pub blocks: u64,
    pub first_event: u64,
    /// Why, where the trace tells (absent from analyses stored before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<LeakCause>,
}

/// Call sites by stack, computed once per stack.
#[derive(Default)]
pub struct SiteCache(HashMap<StackId, Option<CallSite>>);

impl SiteCache {
    pub fn get(&mut self, snapshot: &Snapshot, stack: StackId) -> &Option<CallSite> {
        self.0.entry(stack).or_insert_with(|| call_site(&snapshot.stacks, stack))
    }
}

/// The breakdown of the allocated blocks of `state`.
pub fn breakdown(
    snapshot: &Snapshot,
    state: &State,
    labels: &Labels,
    moment: Moment,
    event_index: Option<u64>,
    phase: Phase,
) -> Breakdown {
    let mut categories: BTreeMap<Category, u64> = Category::ALL.iter().map(|c| (*c, 0)).collect();
    let mut by_site: HashMap<(StackId, Category), (u64, u64)> = HashMap::new();
    let (mut allocated, mut unsharded, mut kv) = (0, 0, Vec::new());
    for s in state.segment_ids() {
        for b in state.block_ids(s) {
            let blk = state.block(b);
            if blk.state != BlockState::ActiveAllocated {
                continue;
            }
            let c = labels.of(blk);
            allocated += blk.size;
            if c == Category::Parameter && labels.is_unsharded_copy(blk) {
                unsharded += blk.size;
            }
            if c == Category::KvCache {
                kv.push((blk.stack, blk.requested));
            }
            *categories.entry(c).or_default() += blk.size;
            let e = by_site.entry((blk.stack, c)).or_default();
            (e.0, e.1) = (e.0 + blk.size, e.1 + 1);
        }
    }
    // Stacks that share a call site are one row.
    let mut sites = SiteCache::default();
    let mut rows: HashMap<(Option<CallSite>, Category), (u64, u64)> = HashMap::new();
    for ((stack, c), (bytes, blocks)) in by_site {
        let e = rows.entry((sites.get(snapshot, stack).clone(), c)).or_default();
        (e.0, e.1) = (e.0 + bytes, e.1 + blocks);
    }
    let mut call_sites: Vec<SiteBytes> = rows
        .into_iter()
        .map(|((call_site, category), (bytes, blocks))| SiteBytes { call_site, category, bytes, blocks })
        .collect();
    call_sites.sort_by(|a, b| (b.bytes, &a.call_site, a.category).cmp(&(a.bytes, &b.call_site, b.category)));
    call_sites.truncate(TOP_SITES);
    Breakdown {
        moment,
        event_index,
        allocated_bytes: allocated,
        phase,
        categories,
        call_sites,
        unsharded_parameter_bytes: unsharded,
        kv_cache: super::kv::measure(&labels.kv, &kv),
    }
}

/// Tracks each step's peak of allocated bytes through the forward pass.
#[derive(Default)]
pub struct StepPeaks {
    pub steps: Vec<Step>,
}

impl StepPeaks {
    /// The same from a whole series of allocated bytes, one value per event.
    pub fn from_allocated(phases: &Phases, allocated: &[u64]) -> StepPeaks {
        let mut peaks = StepPeaks::default();
        for (index, &bytes) in allocated.iter().enumerate() {
            peaks.event(index, phases, bytes);
        }
        peaks
    }

    /// The steps, but for a few events after the last optimizer step (a loss summed, a sync):
    /// without a forward they are not a step. A step the trace stops inside (an OOM in its
    /// backward) has its forward and stays.
    pub fn finish(mut self, phases: &Phases) -> Vec<Step> {
        if let Some(last) = self.steps.last()
            && last.index >= phases.steps
            && !(last.first_event..=last.last_event).any(|i| phases.phase.get(i as usize) == Some(&Phase::Forward))
        {
            self.steps.pop();
        }
        self.steps
    }

    pub fn event(&mut self, index: usize, phases: &Phases, allocated: u64) {
        let (Some(&step), Some(&phase)) = (phases.step.get(index), phases.phase.get(index)) else { return };
        if phases.steps == 0 {
            return;
        }
        let i = index as u64;
        match self.steps.last_mut() {
            Some(s) if s.index == step => {
                s.last_event = i;
                if allocated > s.peak_allocated_bytes {
                    (s.peak_allocated_bytes, s.peak_event, s.peak_phase) = (allocated, i, phase);
                }
            }
            _ => self.steps.push(Step {
                index: step,
                first_event: i,
                last_event: i,
                peak_allocated_bytes: allocated,
                peak_event: i,
                peak_phase: phase,
            }),
        }
    }
}

/// The median of `v` (not empty): one step's odd extra (a workspace made once) does not move it.
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Call sites whose blocks that are never freed were made in at least three steps, and in at
/// least half of the steps: memory that grows every step and is never given back. Its bytes
/// per step are the median of what each of those steps left.
/// Parameters, gradients and optimizer state are made once and are left out.
pub fn growth(
    snapshot: &Snapshot,
    events: &[Event],
    phases: &Phases,
    labels: &Labels,
    freed: &[u32],
    rules: &Rules,
) -> Vec<Growth> {
    if phases.steps < 3 {
        return Vec::new();
    }
    let mut sites = SiteCache::default();
    // (call site, category) -> (bytes by step seen, bytes, blocks, first event, bytes made in
    // a forward)
    type Group = (Vec<(u32, u64)>, u64, u64, u64, u64);
    let mut groups: HashMap<(Option<CallSite>, Category), Group> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let c = labels.at(i);
        if e.action != Action::ALLOC
            || freed[i] != super::categories::NEVER
            || matches!(c, Category::Parameter | Category::Gradient | Category::OptimizerState)
        {
            continue;
        }
        let g = groups.entry((sites.get(snapshot, e.stack).clone(), c)).or_insert((Vec::new(), 0, 0, i as u64, 0));
        let (step, size) = (phases.step[i], rules.round_size(e.size));
        match g.0.last_mut() {
            Some(last) if last.0 == step => last.1 += size,
            _ => g.0.push((step, size)),
        }
        g.1 += size;
        g.2 += 1;
        if phases.phase[i] == Phase::Forward {
            g.4 += size;
        }
    }
    let cause = |forward: u64, bytes: u64| {
        (2 * forward > bytes).then_some(if phases.forward_steps {
            LeakCause::KeptOutputs
        } else {
            LeakCause::KeptGraph
        })
    };
    let mut out: Vec<Growth> = groups
        .into_iter()
        .filter(|(_, g)| g.0.len() >= 3 && 2 * g.0.len() as u32 >= phases.steps)
        .map(|((call_site, category), (steps, live_bytes, blocks, first_event, forward))| Growth {
            call_site,
            category,
            bytes_per_step: median(steps.iter().map(|s| s.1).collect()),
            steps: steps.len() as u32,
            live_bytes,
            blocks,
            first_event,
            cause: cause(forward, live_bytes),
        })
        .collect();
    out.sort_by(|a, b| (b.live_bytes, &a.call_site, a.category).cmp(&(a.live_bytes, &b.call_site, b.category)));
    out
}

/// The headline of a run that did not run out of memory but grows: how much a step and, with
/// a budget, at which step it would run out at this rate.
pub fn growth_headline(growth: &[Growth], steps: u32, reserved_now: u64, budget: Option<u64>) -> Option<String> {
    let per_step: u64 = growth.iter().map(|g| g.bytes_per_step).sum();
    if per_step == 0 {
        return None;
    }
    let unit = if growth.iter().any(|g| g.cause == Some(LeakCause::KeptOutputs)) { "forward pass" } else { "step" };
    let when = match budget {
        Some(b) if b > reserved_now => format!(
            ": at this rate the {} budget is reached at {unit} {}",
            crate::units::bytes(b),
            steps as u64 + (b - reserved_now).div_ceil(per_step)
        ),
        Some(_) => ": it is already past the budget".into(),
        None => ": at this rate it runs out of memory (pass --capacity to learn when)".into(),
    };
    Some(format!("No OOM yet, but memory grows {} a {unit}{when}.", crate::units::bytes(per_step)))
}
