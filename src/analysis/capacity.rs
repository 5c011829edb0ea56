//! Remedies for a capacity OOM, with numbers: what would make the run fit, computed from what
//! filled memory at the OOM ([`super::breakdown`]) and any growth. The same for a run that did
//! not run out of memory but peaked close to a budget the user names (`--capacity`).
//!
//! Both are reckoned in reserved bytes, as the budget is: at an OOM the need is what was
//! reserved plus the segment the allocator then asked for, and the budget `--capacity` or else
//! the most the process ever held reserved (the limit the job had is at least that); at a peak the need is the peak of reserved bytes. A remedy saves bytes
//! of the categories it acts on; its predicted peak is the need less those savings, which
//! assumes the allocator's cached slack stays as it was (pessimistic). It fixes an OOM when that
//! fits the budget, and a near miss when it is back under [`HEADROOM`] of it. The factors are
//! stated in each `why`:
//! - `fix_leak`: all bytes the growing call sites keep.
//! - `activation_checkpointing`: half the activations (each checkpointed segment keeps its
//!   input and recomputes the rest; per-layer checkpointing of a transformer saves more).
//! - `smaller_batch`: half the activations, temporaries and inputs, and half the request when
//!   it was made in the forward or backward (they scale with the micro-batch).
//! - `shard_optimizer_state`: 7/8 of the optimizer state (ZeRO-1 / FSDP over 8 ranks).
//! - `lighter_optimizer`: 3/4 of the optimizer state (8-bit states instead of 32-bit).
//! - `grads_set_to_none`: the gradients alive during a forward.
//! - `chunked_loss`: 7/8 of the failing request when that request is the loss's (its stack runs through `cross_entropy`, `nll_loss` or `log_softmax`, or it is made
//!   in user code after the model's forward): computing the loss in 8 chunks of the logits.

use super::advice::{Effect, Fit, Remedy, RemedyKind};
use super::breakdown::{Breakdown, Growth};
use super::categories::Category;
use super::phases::Phase;
use crate::units::bytes;

/// A peak this close to the budget (90%) gets remedies too, and a remedy that brings an OOM
/// or a near miss back under it restores the headroom a run needs (other processes, the
/// allocator's own slack).
pub const HEADROOM: f64 = 0.9;

/// What the capacity remedies weigh.
pub struct Facts<'a> {
    /// What filled memory at the moment judged: the OOM, or the peak.
    pub at: &'a Breakdown,
    pub growth: &'a [Growth],
    /// What the run needed reserved: at an OOM, what was reserved plus the segment it asked
    /// for; at a peak, the peak of reserved bytes.
    pub need: u64,
    pub budget: u64,
    /// The failing request, at an OOM.
    pub request: Option<Request>,
}

/// The request an OOM failed on.
pub struct Request {
    pub bytes: u64,
    /// The phase it was made in.
    pub phase: Phase,
    /// It is the size of the loss's logits (see [`loss_sized`]).
    pub is_loss: bool,
}

/// True when some allocation of the failing request's size (within 1%) is the loss's: its
/// stack runs through `cross_entropy`, `nll_loss` or `log_softmax`, or it was made in user code
/// during a forward (the logits upcast inline, `model(x).float()`).
pub fn loss_sized(
    snapshot: &crate::snapshot::Snapshot,
    events: &[crate::snapshot::Event],
    phases: &super::phases::Phases,
    request: u64,
) -> bool {
    use super::phases::{Tag, tag};
    let near = |size: u64| size.abs_diff(request) * 100 <= request;
    events.iter().enumerate().filter(|(_, e)| e.action == crate::snapshot::Action::ALLOC && near(e.size)).any(
        |(i, e)| {
            let loss = snapshot
                .stacks
                .frames(e.stack)
                .any(|f| matches!(snapshot.stacks.str(f.name), "cross_entropy" | "nll_loss" | "log_softmax"));
            loss || (phases.phase[i] == Phase::Forward && tag(snapshot, e.stack) == Tag::User)
        },
    )
}

/// The remedies, most saving first, each with its numbers, and a sentence when none alone
/// would make the run fit.
pub fn remedies(f: &Facts) -> (Vec<Remedy>, Option<String>) {
    let cat = |c: Category| f.at.categories.get(&c).copied().unwrap_or(0);
    let (need, budget) = (f.need, f.budget);
    // At an OOM the run must fit the budget; after a near miss, get back under the headroom.
    let limit = if f.request.is_some() { budget } else { (budget as f64 * HEADROOM) as u64 };
    let moment = if f.request.is_some() { "at the OOM" } else { "at the peak" };
    let (act, tmp, input) = (cat(Category::Activation), cat(Category::Temporary), cat(Category::Input));
    let (state, grads) = (cat(Category::OptimizerState), cat(Category::Gradient));
    let mut out = Vec::new();
    let mut add = |kind: RemedyKind, saves: u64, code: String, why: String| {
        if saves == 0 {
            return;
        }
        let peak = need.saturating_sub(saves);
        let effect = if peak <= limit { Effect::Fixes } else { Effect::Helps };
        out.push(Remedy {
            predicted: Some(format!("peak {} reserved against the {} budget", bytes(peak), bytes(budget))),
            fit: Fit {
                effect: Some(effect),
                saves_bytes: Some(saves),
                predicted_peak_bytes: Some(peak),
                budget_bytes: Some(budget),
                simulated: None,
            },
            ..Remedy::new(kind, true, code, why)
        });
    };
    for g in f.growth {
        let site = g.call_site.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "an unknown call site".into());
        add(
            RemedyKind::FixLeak,
            g.live_bytes,
            format!("# at {site}: keep what you need as a Python number or on the CPU (.item(), .cpu()), or drop it"),
            format!(
                "{site} keeps {} more every step ({} steps so far, {} blocks never freed): memory grows until it runs out.",
                bytes(g.bytes_per_step),
                g.steps,
                g.blocks
            ),
        );
    }
    let sites: Vec<String> =
        f.at.call_sites
            .iter()
            .filter(|s| s.category == Category::Activation)
            .filter_map(|s| s.call_site.as_ref().map(|c| c.to_string()))
            .take(3)
            .collect();
    add(
        RemedyKind::ActivationCheckpointing,
        act / 2,
        "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)  # around each layer"
            .into(),
        format!(
            "{} of activations were alive {moment}{}. Checkpointing keeps each segment's input and recomputes the rest in the backward; counted here as half of them.",
            bytes(act),
            if sites.is_empty() { String::new() } else { format!(", most made at {}", sites.join(", ")) }
        ),
    );
    let batch_request = match &f.request {
        Some(r) if matches!(r.phase, Phase::Forward | Phase::Backward) => r.bytes,
        _ => 0,
    };
    add(
        RemedyKind::SmallerBatch,
        (act + tmp + input + batch_request) / 2,
        "# half the micro-batch, the same effective batch:\nfor half in batch.chunk(2):\n    (loss_fn(model(half)) / 2).backward()\noptimizer.step()".into(),
        format!(
            "Activations, temporaries and inputs scale with the micro-batch ({} {moment}): halving it with 2 steps of gradient accumulation saves about half.",
            bytes(act + tmp + input)
        ),
    );
    add(
        RemedyKind::ShardOptimizerState,
        state / 8 * 7,
        "# FSDP (torch.distributed.fsdp.fully_shard) or\nfrom torch.distributed.optim import ZeroRedundancyOptimizer"
            .into(),
        format!("{} of optimizer state; sharded over 8 ranks each keeps an eighth.", bytes(state)),
    );
    add(
        RemedyKind::LighterOptimizer,
        state / 4 * 3,
        "import bitsandbytes as bnb\noptimizer = bnb.optim.AdamW8bit(model.parameters())".into(),
        format!(
            "{} of optimizer state; 8-bit states take a quarter of 32-bit ones (factored states, as Adafactor's, less still).",
            bytes(state)
        ),
    );
    if f.at.phase == Phase::Forward {
        add(
            RemedyKind::GradsSetToNone,
            grads,
            "optimizer.zero_grad(set_to_none=True)".into(),
            format!(
                "{} of gradients were alive during the forward: freed after each step, they are not there when activations peak.",
                bytes(grads)
            ),
        );
    }
    if let Some(r) = f.request.as_ref().filter(|r| r.is_loss) {
        add(
            RemedyKind::ChunkedLoss,
            r.bytes / 8 * 7,
            "# the loss over 8 chunks of the sequence, never the whole upcast logits at once:\nloss = sum(F.cross_entropy(head(h).float(), t, reduction=\"sum\") for h, t in zip(hidden.chunk(8, 1), targets.chunk(8, 1))) / targets.numel()".into(),
            format!("The failing request ({}) is the loss's: the logits upcast whole. In 8 chunks only an eighth is alive at once.", bytes(r.bytes)),
        );
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.fit.saves_bytes));
    let none = !out.iter().any(|r| r.fit.effect == Some(Effect::Fixes));
    let note = none.then(|| {
        format!(
            "No single change here is enough: the run needs {} and {} {}; combine the largest savings.",
            bytes(need),
            if f.request.is_some() { "had" } else { "should stay under" },
            bytes(limit)
        )
    });
    (out, note)
}

/// What the allocator model needs to replay the trace with a remedy's blocks made smaller.
pub struct Replaying<'a> {
    pub snapshot: &'a crate::snapshot::Snapshot,
    pub device: &'a crate::snapshot::Device,
    pub index: &'a super::memory::Index,
    /// Blocks alive before the trace, with their categories.
    pub before: Vec<(u64, Category)>,
}

/// Percent of a category's requests a remedy keeps.
type Keep = fn(Category) -> u8;

/// How much of a category's requests a remedy keeps (percent), and of an OOM's request.
fn keeps(kind: RemedyKind, request_phase: Option<Phase>) -> Option<(Keep, u8)> {
    let batch = matches!(request_phase, Some(Phase::Forward | Phase::Backward));
    Some(match kind {
        RemedyKind::SmallerBatch => (
            |c| if matches!(c, Category::Activation | Category::Temporary | Category::Input) { 50 } else { 100 },
            if batch { 50 } else { 100 },
        ),
        RemedyKind::ActivationCheckpointing => (|c| if c == Category::Activation { 50 } else { 100 }, 100),
        RemedyKind::ShardOptimizerState => (|c| if c == Category::OptimizerState { 13 } else { 100 }, 100),
        RemedyKind::LighterOptimizer => (|c| if c == Category::OptimizerState { 25 } else { 100 }, 100),
        _ => return None,
    })
}

/// Replays the trace through the allocator model with each remedy's blocks made smaller, under
/// the limit the remedies are judged by, and puts what it predicts in place of the arithmetic:
/// the model sees where the smaller blocks land and what the allocator's caching then holds.
/// Only where the model, replaying the run unchanged, runs out of memory where the real run
/// did (at an OOM), or stays under the limit (at a near miss): else its word is not better
/// than the arithmetic, which stays.
pub fn refine(r: &Replaying, f: &Facts, remedies: &mut [Remedy]) {
    use crate::simulate::{Settings, Shrink, simulate};
    use std::sync::Arc;
    let limit = if f.request.is_some() { f.budget } else { (f.budget as f64 * HEADROOM) as u64 };
    let baseline = Settings { capacity: Some(limit), ..Default::default() };
    let Ok(unchanged) = simulate(r.snapshot, r.device, &baseline) else { return };
    let events = r.snapshot.device_events(r.device);
    let oom_at = events.iter().rposition(|e| e.action == crate::snapshot::Action::OOM);
    let faithful = match (f.request.is_some(), &unchanged.oom) {
        (true, Some(o)) => Some(o.event_index as usize) == oom_at,
        (false, None) => true,
        _ => false,
    };
    if !faithful {
        return;
    }
    for remedy in remedies.iter_mut() {
        let Some((keep, keep_request)) = keeps(remedy.kind, f.request.as_ref().map(|q| q.phase)) else { continue };
        let mut shrink = Shrink { events: vec![100; events.len()], ..Default::default() };
        for (i, e) in events.iter().enumerate() {
            match e.action {
                crate::snapshot::Action::ALLOC => shrink.events[i] = keep(r.index.labels.at(i)),
                crate::snapshot::Action::OOM => shrink.events[i] = keep_request,
                _ => {}
            }
        }
        shrink.before = r.before.iter().map(|(a, c)| (*a, keep(*c))).filter(|(_, k)| *k < 100).collect();
        let settings = Settings { capacity: Some(limit), shrink: Some(Arc::new(shrink)), ..Default::default() };
        let Ok(o) = simulate(r.snapshot, r.device, &settings) else { continue };
        remedy.fit.predicted_peak_bytes = Some(o.peak_reserved_bytes);
        remedy.fit.simulated = Some(true);
        remedy.fit.effect = Some(if o.oom.is_none() { Effect::Fixes } else { Effect::Helps });
        remedy.predicted = Some(match &o.oom {
            None => format!(
                "no OOM within {} through the trace's end, peak {} reserved (replayed through the allocator model)",
                bytes(limit),
                bytes(o.peak_reserved_bytes)
            ),
            Some(x) => format!(
                "still out of memory within {}, at event {} (replayed through the allocator model)",
                bytes(limit),
                x.event_index
            ),
        });
    }
}

/// For a capacity OOM, or a peak close to `capacity`: what filled memory, in the summary, and
/// the remedies that would make the run fit, with their numbers.
pub fn explain(
    replaying: &Replaying,
    ooms: &[super::oom::Oom],
    memory: &super::memory::Memory,
    capacity: Option<u64>,
    peak_reserved: u64,
    diagnosis: &mut super::advice::Diagnosis,
) {
    use super::breakdown::Moment;
    let (snapshot, index) = (replaying.snapshot, replaying.index);
    let events = snapshot.device_events(replaying.device);
    let find = |m: Moment, e: Option<u64>| memory.breakdown.iter().find(|b| b.moment == m && b.event_index == e);
    let (at, facts) = match ooms.first() {
        Some(oom) if oom.verdict == super::oom::Verdict::Capacity => {
            let Some(at) = find(Moment::Oom, Some(oom.event_index)) else { return };
            let request = Request {
                bytes: oom.requested_bytes,
                phase: index.phase_at(Some(oom.event_index)),
                is_loss: loss_sized(snapshot, events, &index.phases, oom.requested_bytes),
            };
            let need = oom.reserved_bytes + oom.allocation_bytes;
            // The limit is at least the most the process ever held reserved.
            let budget = capacity.unwrap_or(oom.reserved_bytes.max(peak_reserved));
            (at, Facts { at, growth: &memory.growth, need, budget, request: Some(request) })
        }
        Some(_) => return,
        None => {
            let Some(budget) = capacity else { return };
            let Some(at) = memory.breakdown.iter().find(|b| b.moment == Moment::Peak) else { return };
            if (peak_reserved as f64) < budget as f64 * HEADROOM {
                return;
            }
            let share = 100.0 * peak_reserved as f64 / budget.max(1) as f64;
            let verdict = if peak_reserved > budget {
                "more than the budget: under it, this run would run out of memory"
            } else {
                "too close for comfort"
            };
            diagnosis.summary.push_str(&format!(
                " The peak, {} reserved, is {share:.0}% of the {} budget: {verdict}.",
                crate::units::bytes(peak_reserved),
                crate::units::bytes(budget)
            ));
            (at, Facts { at, growth: &memory.growth, need: peak_reserved, budget, request: None })
        }
    };
    let mut top: Vec<_> = at.categories.iter().filter(|(_, b)| **b > 0).collect();
    top.sort_by(|a, b| b.1.cmp(a.1));
    let parts: Vec<String> = top
        .iter()
        .take(3)
        .map(|(c, b)| format!("{} {}", crate::units::bytes(**b), c.as_str().replace('_', " ")))
        .collect();
    diagnosis.summary.push_str(&format!(
        " At the {} ({} phase) the {} allocated was mostly {}.",
        if facts.request.is_some() { "OOM" } else { "peak" },
        serde_json::to_value(at.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        crate::units::bytes(at.allocated_bytes),
        parts.join(", ")
    ));
    let (mut remedies, note) = remedies(&facts);
    refine(replaying, &facts, &mut remedies);
    diagnosis.remedies.extend(remedies);
    if let Some(note) = note {
        diagnosis.summary.push(' ');
        diagnosis.summary.push_str(&note);
    }
}
