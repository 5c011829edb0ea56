//! Remedies that make a run use less memory, each weighed against what the step needed
//! ([`super::need`]), not against the trace's end: a snapshot taken at an OOM ends there. The
//! same for a run that did not run out of memory but peaked close to a budget the user names
//! (`--capacity`). They appear whenever the step needs more than the budget, whatever the
//! verdict at the failing request.
//!
//! Each remedy is a [`Change`] to the projected step's moments; its predicted peak is the
//! largest moment after the change, in reserved bytes as the budget is (allocated plus the
//! allocator's usual cache). It fixes the run when that fits the budget (after a near miss:
//! gets back under [`HEADROOM`] of it), helps when it saves memory but not enough:
//! - `fix_leak`: all bytes the growing call sites keep, one remedy for all of them.
//! - `activation_checkpointing`: each call of the repeated layer keeps only its input, and one
//!   layer's activations are made again at a time; without a repeated layer found, half.
//! - `smaller_batch`: activations and the other batch-sized memory shrink with the micro-batch:
//!   the largest of 1/2, 1/4, 1/8 of it that fits, with as many steps of accumulation.
//! - `shard_optimizer_state`: 7/8 of the optimizer state (ZeRO-1 / FSDP over 8 ranks).
//! - `lighter_optimizer`: 3/4 of the optimizer state (8-bit states instead of 32-bit).
//! - `grads_set_to_none`: the gradients kept from the last step.
//! - `chunked_loss`: 7/8 of the failing request when that request is the loss's (its stack runs
//!   through `cross_entropy`, `nll_loss` or `log_softmax`, or it is made in user code after the
//!   model's forward): computing the loss in 8 chunks of the logits.

use super::advice::{Effect, Fit, Remedy, RemedyKind};
use super::breakdown::Growth;
use super::need::{Change, Need};
use super::phases::Phase;
use crate::units::bytes;

/// A peak this close to the budget (90%) gets remedies too, and a remedy that brings a near
/// miss back under it restores the headroom a run needs (other processes, the allocator's own
/// slack).
pub const HEADROOM: f64 = 0.9;

/// What the capacity remedies weigh.
pub struct Facts<'a> {
    pub need: &'a Need,
    pub growth: &'a [Growth],
    /// What must fit: the budget at an OOM, 90% of it after a near miss.
    pub limit: u64,
    pub budget: u64,
    /// The failing request, at an OOM.
    pub request: Option<Request>,
    /// No backward and nothing saved for one (inference): no training remedy applies.
    pub inference: bool,
    /// The KV cache at the OOM or the end.
    pub kv: Option<&'a super::kv::KvCache>,
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
            let loss = snapshot.stacks.frames(e.stack).any(|f| {
                matches!(snapshot.stacks.str(f.name), "cross_entropy" | "nll_loss" | "log_softmax" | "ForCausalLMLoss")
            });
            loss || (phases.phase[i] == Phase::Forward && tag(snapshot, e.stack) == Tag::User)
        },
    )
}

impl Facts<'_> {
    /// A remedy with the numbers of `change`; None when it saves nothing.
    pub(super) fn weigh(&self, kind: RemedyKind, change: Change, code: String, why: String) -> Option<Remedy> {
        let (base, _) = self.need.peak_with(&Change::NONE)?;
        let (alloc, reserved) = self.need.peak_with(&change)?;
        let saves = base.saturating_sub(alloc);
        // Less than a hundredth of the step is no remedy worth a card.
        if saves == 0 || saves * 100 < base {
            return None;
        }
        let effect = if reserved <= self.limit { Effect::Fixes } else { Effect::Helps };
        Some(Remedy {
            predicted: Some(format!(
                "the step's peak {} allocated, {} reserved, against the {} budget",
                bytes(alloc),
                bytes(reserved),
                bytes(self.budget)
            )),
            fit: Fit {
                effect: Some(effect),
                saves_bytes: Some(saves),
                predicted_peak_bytes: Some(reserved),
                budget_bytes: Some(self.budget),
                simulated: None,
                batch_fraction: None,
            },
            ..Remedy::new(kind, true, code, why)
        })
    }

    pub(super) fn fits(&self, change: &Change) -> bool {
        self.need.peak_with(change).is_some_and(|(_, reserved)| reserved <= self.limit)
    }

    /// For a batch cut into `n` parts: the smallest `n` of 2, 4, 8 that fits (else 2), and the
    /// largest share of the batch, in percent, that fits (None: not even 1%).
    pub(super) fn batch_shares(&self) -> (u32, Option<u64>) {
        let at = |share: f64| Change { batch: share, ..Change::NONE };
        let n = [2u32, 4, 8].into_iter().find(|n| self.fits(&at(1.0 / *n as f64))).unwrap_or(2);
        (n, (1..=99u64).rev().find(|p| self.fits(&at(*p as f64 / 100.0))))
    }
}

/// The remedies, most saving first, each with its numbers, and a sentence when none alone
/// would make the run fit.
pub fn remedies(f: &Facts) -> (Vec<Remedy>, Option<String>) {
    let at = f.need.model.at_peak();
    let moment = if f.request.is_some() { "at the step's projected peak" } else { "at the peak" };
    let mut out = Vec::new();
    // One remedy for every call site that grows: they are one loop's leak, stopped together.
    if let Some((code, why, live)) = leak_words(f.growth) {
        out.extend(f.weigh(RemedyKind::FixLeak, Change { less: live, ..Change::NONE }, code, why));
    }
    if f.inference {
        out.extend(super::inference::remedies(f, &at, moment));
    } else {
        out.extend(training(f, &at, moment));
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.fit.saves_bytes));
    let none = !out.iter().any(|r| r.fit.effect == Some(Effect::Fixes));
    let note = none.then(|| {
        format!(
            "No single change here is enough: the step needs {} reserved and {} {}; combine the largest savings.",
            bytes(f.need.peak_reserved_bytes.unwrap_or(0)),
            if f.request.is_some() { "had" } else { "should stay under" },
            bytes(f.limit)
        )
    });
    (out, note)
}

/// A leak's remedy in words: the code that stops it and why, with its cause where known.
fn leak_words(growth: &[Growth]) -> Option<(String, String, u64)> {
    // Sorted by live bytes: the first is the leak; the others grow with it (the same loop).
    let first = growth.first()?;
    let site =
        |g: &Growth| g.call_site.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "an unknown call site".into());
    let code = match first.cause {
        Some(c) => format!("# at {}:\n{}", site(first), c.code()),
        None => format!(
            "# at {}: keep what you need as a Python number or on the CPU (.item(), .cpu()), or drop it",
            site(first)
        ),
    };
    let sites: Vec<String> = growth
        .iter()
        .map(|g| {
            format!(
                "{} keeps {} more every step ({} steps so far, {} blocks never freed)",
                site(g),
                bytes(g.bytes_per_step),
                g.steps,
                g.blocks
            )
        })
        .collect();
    let cause = first.cause.map(|c| format!(" Why: {}.", c.says())).unwrap_or_default();
    let why = format!("{}: memory grows until it runs out.{cause}", sites.join("; "));
    Some((code, why, growth.iter().map(|g| g.live_bytes).sum()))
}

/// The leak's remedy where no budget weighed it (no OOM yet, no `--capacity`): it still says
/// what keeps the memory and how to stop it.
pub fn unweighed_leaks(growth: &[Growth], diagnosis: &mut super::advice::Diagnosis) {
    if diagnosis.remedies.iter().any(|r| r.kind == RemedyKind::FixLeak) {
        return;
    }
    if let Some((code, why, live)) = leak_words(growth) {
        let mut r = Remedy::new(RemedyKind::FixLeak, true, code, why);
        r.fit.saves_bytes = Some(live);
        diagnosis.remedies.push(r);
    }
}

/// Remedies for a training step: fewer activations, optimizer state or kept gradients, or a
/// smaller failing loss.
fn training(f: &Facts, at: &super::need::Mix, moment: &str) -> Vec<Remedy> {
    let mut out = Vec::new();
    out.extend(checkpointing(f, at.activation, moment));
    out.extend(smaller_batch(f, at.activation + at.batch, moment));
    let state = at.optimizer_state;
    out.extend(f.weigh(
        RemedyKind::ShardOptimizerState,
        Change { optimizer_state: 0.125, ..Change::NONE },
        "# FSDP (torch.distributed.fsdp.fully_shard) or\nfrom torch.distributed.optim import ZeroRedundancyOptimizer"
            .into(),
        format!("{} of optimizer state; sharded over 8 ranks each keeps an eighth.", bytes(state)),
    ));
    out.extend(f.weigh(
        RemedyKind::LighterOptimizer,
        Change { optimizer_state: 0.25, ..Change::NONE },
        "import bitsandbytes as bnb\noptimizer = bnb.optim.AdamW8bit(model.parameters())\n# or torch.optim.Adafactor(model.parameters()): factored, smaller still".into(),
        format!(
            "{} of optimizer state; 8-bit states take a quarter of 32-bit ones (counted so here; Adafactor's factored states, less still).",
            bytes(state)
        ),
    ));
    if at.kept_gradient > 0 {
        out.extend(f.weigh(
            RemedyKind::GradsSetToNone,
            Change { kept_gradient: 0.0, ..Change::NONE },
            "optimizer.zero_grad(set_to_none=True)".into(),
            format!(
                "{} of gradients from the last step were still alive in this one: freed after each step, they are not there when activations peak.",
                bytes(at.kept_gradient)
            ),
        ));
    }
    if let Some(r) = f.request.as_ref().filter(|r| r.is_loss) {
        out.extend(f.weigh(
            RemedyKind::ChunkedLoss,
            Change { less: r.bytes / 8 * 7, ..Change::NONE },
            "# the loss over 8 chunks of the sequence, never the whole upcast logits at once:\nloss = sum(F.cross_entropy(head(h).float(), t, reduction=\"sum\") for h, t in zip(hidden.chunk(8, 1), targets.chunk(8, 1))) / targets.numel()".into(),
            format!("The failing request ({}) is the loss's: the logits upcast whole. In 8 chunks only an eighth is alive at once.", bytes(r.bytes)),
        ));
    }
    out
}

fn checkpointing(f: &Facts, act: u64, moment: &str) -> Option<Remedy> {
    let layers = f.need.layers.as_ref();
    let (factor, what) = match (f.need.checkpoint_factor(), layers) {
        (Some(c), Some(l)) => (
            c,
            format!(
                " The layer called at {} ({} calls a forward) keeps {} each for the backward; checkpointed, each keeps only its {} input, and one layer's activations are made again at a time.",
                l.call_site,
                l.calls,
                bytes(l.saved_bytes_per_call),
                bytes(l.input_bytes)
            ),
        ),
        _ => (0.5, " No repeated layer was found in the frames: counted here as half of them.".to_string()),
    };
    let code = match layers {
        Some(l) if l.module_file.as_deref().is_some_and(|m| m.contains("transformers")) => format!(
            "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{\"use_reentrant\": False}})\n# checkpoints each layer that {}:{} calls",
            l.call_site.filename, l.call_site.line
        ),
        Some(l) => format!(
            "from torch.utils.checkpoint import checkpoint\n# at {}:{}, around each call of the layer:\nx = checkpoint(layer, x, use_reentrant=False)",
            l.call_site.filename, l.call_site.line
        ),
        None => "from torch.utils.checkpoint import checkpoint\ny = checkpoint(block, x, use_reentrant=False)  # around each layer".into(),
    };
    let why = format!("{} of activations were alive {moment}.{what}", bytes(act));
    let mut r =
        f.weigh(RemedyKind::ActivationCheckpointing, Change { activation: factor, ..Change::NONE }, code, why)?;
    r.site = layers.map(|l| format!("{}:{}", l.call_site.filename, l.call_site.line));
    Some(r)
}

fn smaller_batch(f: &Facts, batched: u64, moment: &str) -> Option<Remedy> {
    let at = |share: f64| Change { batch: share, ..Change::NONE };
    let (n, largest) = f.batch_shares();
    let fits = match largest {
        Some(p) => format!(" Up to {p}% of today's micro-batch fits the budget."),
        None => " Even a hundredth of the micro-batch would not fit: the rest of the memory is too much.".into(),
    };
    let code = format!(
        "# 1/{n} of the micro-batch, the same effective batch:\nfor part in batch.chunk({n}):\n    (loss_fn(model(part)) / {n}).backward()\noptimizer.step()"
    );
    let why = format!(
        "Activations and the other batch-sized memory ({} {moment}) shrink with the micro-batch: 1/{n} of it with {n} steps of gradient accumulation keeps the same effective batch.{fits}",
        bytes(batched)
    );
    let mut r = f.weigh(RemedyKind::SmallerBatch, at(1.0 / n as f64), code, why)?;
    r.fit.batch_fraction = Some(1.0 / n as f64);
    Some(r)
}

/// What the allocator model needs to replay the trace with a remedy's blocks made smaller.
pub struct Replaying<'a> {
    pub snapshot: &'a crate::snapshot::Snapshot,
    pub device: &'a crate::snapshot::Device,
    pub index: &'a super::memory::Index,
    /// Blocks alive before the trace, with their categories.
    pub before: Vec<(u64, super::categories::Category)>,
}

/// For a step that needs more than its budget, or a peak close to `capacity`: what filled
/// memory, in the summary, and the remedies that would make the run fit, with their numbers.
pub fn explain(
    replaying: &Replaying,
    ooms: &[super::oom::Oom],
    memory: &super::memory::Memory,
    capacity: Option<u64>,
    peak_reserved: u64,
    diagnosis: &mut super::advice::Diagnosis,
) {
    let (snapshot, index) = (replaying.snapshot, replaying.index);
    let events = snapshot.device_events(replaying.device);
    let need = diagnosis.need.clone();
    let request = match ooms.first() {
        Some(oom) => {
            let capacity_verdict = diagnosis.verdict == super::advice::DiagnosisVerdict::Capacity;
            if need.fits != Some(false) && !capacity_verdict {
                return;
            }
            Some(Request {
                bytes: oom.requested_bytes,
                phase: index.phase_at(Some(oom.event_index)),
                is_loss: loss_sized(snapshot, events, &index.phases, oom.requested_bytes),
            })
        }
        None => {
            let Some(budget) = capacity else { return };
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
                bytes(peak_reserved),
                bytes(budget)
            ));
            None
        }
    };
    let Some(budget) = need.budget_bytes.or(capacity) else { return };
    let limit = if request.is_some() { budget } else { (budget as f64 * HEADROOM) as u64 };
    describe(&need, request.is_some(), diagnosis);
    let at = need.model.at_peak();
    let inference = !index.phases.training && (diagnosis.kv_cache.is_some() || at.activation == 0);
    let kv = diagnosis.kv_cache.clone();
    let facts = Facts { need: &need, growth: &memory.growth, limit, budget, request, inference, kv: kv.as_ref() };
    let (mut remedies, note) = remedies(&facts);
    super::shrink::refine(replaying, &facts, &mut remedies);
    diagnosis.remedies.extend(remedies);
    if let Some(note) = note {
        diagnosis.summary.push(' ');
        diagnosis.summary.push_str(&note);
    }
}

/// What filled memory at the projected peak, in the summary.
fn describe(need: &Need, oom: bool, diagnosis: &mut super::advice::Diagnosis) {
    let m = need.model.at_peak();
    let mut parts = [
        (m.activation, "activation"),
        (m.batch, "other batch-sized memory"),
        (m.kv_cache, "KV cache"),
        (m.optimizer_state, "optimizer state"),
        (m.gradient + m.kept_gradient, "gradients"),
        (m.parameter, "parameters"),
        (m.fixed, "other"),
    ];
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    let top: Vec<String> =
        parts.iter().filter(|p| p.0 > 0).take(3).map(|(b, c)| format!("{} {c}", bytes(*b))).collect();
    diagnosis.summary.push_str(&format!(
        " At the {} it is mostly {}.",
        if oom { "step's projected peak" } else { "peak" },
        top.join(", ")
    ));
}
