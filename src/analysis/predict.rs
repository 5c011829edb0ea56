//! The allocator remedies (expandable segments, max_split_size, a MemPool, a reused buffer),
//! each replayed through the model of the allocator, and judged against what the step needed:
//! a replay that gets past the OOM only shows that the failing request would have been served,
//! since the trace ends there. A setting fixes the run only when its replay passes the OOM and
//! the step's projected need fits the budget under it; when it passes but the step needs more,
//! it helps (the run gets further, then dies in the same step); when its replay dies as early
//! as the real run, or earlier, it does not help.

use super::advice::{Diagnosis, Effect, RemedyKind};
use super::need::Need;
use super::oom::Oom;
use crate::snapshot::{Device, Snapshot};
use crate::units::bytes;

use super::need::TIGHTEST as EXPANDABLE_SLACK;

/// Runs each applicable allocator remedy through the allocator model and says what it
/// predicts. For a run that ran out of memory, within the budget the job had (the need's
/// budget: the real limit is at least that); otherwise without a budget, as a peak to compare
/// with the real one.
pub fn predict(snapshot: &Snapshot, d: &Device, ooms: &[Oom], real_peak: u64, diagnosis: &mut Diagnosis) {
    let budget = ooms.first().map(|o| diagnosis.need.budget_bytes.unwrap_or(o.reserved_bytes));
    let real_oom = ooms.first().map(|o| o.event_index);
    let need = diagnosis.need.clone();
    for r in diagnosis.remedies.iter_mut() {
        if !r.applies {
            r.fit.effect.get_or_insert(Effect::DoesNotApply);
            continue;
        }
        let settings = match r.kind {
            RemedyKind::ExpandableSegments | RemedyKind::MaxSplitSize => {
                let conf = r.setting_or_code.trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=").to_string();
                crate::simulate::Settings { conf: Some(conf), capacity: budget, ..Default::default() }
            }
            RemedyKind::Mempool => {
                crate::simulate::Settings { capacity: budget, mempool: r.site.clone(), ..Default::default() }
            }
            RemedyKind::ReuseBuffer => {
                crate::simulate::Settings { capacity: budget, reuse: r.site.clone(), ..Default::default() }
            }
            // Capacity remedies carry their own numbers (see `capacity`).
            _ => continue,
        };
        let Ok(o) = crate::simulate::simulate(snapshot, d, &settings) else { continue };
        let peak = bytes(o.peak_reserved_bytes);
        r.fit.predicted_peak_bytes = Some(o.peak_reserved_bytes);
        r.fit.budget_bytes = budget;
        r.fit.simulated = Some(true);
        let (effect, predicted) = match (budget, &o.oom) {
            (Some(b), None) => {
                let slack = if r.kind == RemedyKind::ExpandableSegments { EXPANDABLE_SLACK } else { need.slack };
                past_the_oom(&need, b, slack, &peak)
            }
            (Some(_), Some(x)) if real_oom.is_some_and(|real| x.event_index > real) => (
                Effect::Helps,
                format!("gets past the real OOM, then runs out of memory too, at event {}", x.event_index),
            ),
            (Some(_), Some(x)) if real_oom == Some(x.event_index) => {
                (Effect::DoesNotHelp, format!("still out of memory at the same request (event {})", x.event_index))
            }
            (Some(_), Some(x)) => (
                Effect::DoesNotHelp,
                format!(
                    "runs out of memory earlier than the real run did: at event {}, before event {}",
                    x.event_index,
                    real_oom.unwrap_or(0)
                ),
            ),
            (None, _) if o.peak_reserved_bytes > real_peak => (
                Effect::DoesNotApply,
                format!(
                    "peak {peak} reserved, more than the real {}: it would cost more than it saves here",
                    bytes(real_peak)
                ),
            ),
            (None, _) => (Effect::Fixes, format!("peak {peak} reserved (really {})", bytes(real_peak))),
        };
        r.fit.effect = Some(effect);
        r.predicted = Some(predicted);
    }
}

/// The effect of a setting whose replay served the failing request, from what the step needed.
fn past_the_oom(need: &Need, budget: u64, slack: f64, peak: &str) -> (Effect, String) {
    let Some(alloc) = need.peak_allocated_bytes else {
        return (
            Effect::Helps,
            format!(
                "gets past the failing request within {} (peak {peak} as far as the trace goes); what the rest of the step needs cannot be told",
                bytes(budget)
            ),
        );
    };
    let reserved = (alloc as f64 * slack).round() as u64;
    if need.fits != Some(false) && reserved <= budget {
        (
            Effect::Fixes,
            format!(
                "no OOM within the same {} through the trace's end (peak {peak}), and the step's projected need, {} allocated, {} reserved under this setting, fits",
                bytes(budget),
                bytes(alloc),
                bytes(reserved)
            ),
        )
    } else {
        (
            Effect::Helps,
            format!(
                "gets past this request within {}; the step still needs {} allocated ({} reserved) of {}",
                bytes(budget),
                bytes(alloc),
                bytes(reserved),
                bytes(budget)
            ),
        )
    }
}
