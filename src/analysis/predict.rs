//! The allocator remedies (expandable segments, max_split_size, a MemPool, a reused buffer),
//! each replayed through the model of the allocator: what it predicts goes beside the remedy,
//! and the page's badge follows it.

use super::advice::{Diagnosis, Effect, RemedyKind};
use super::oom::Oom;
use crate::snapshot::{Device, Snapshot};

/// Runs each applicable remedy through the allocator model and says what it predicts. For a
/// run that ran out of memory, within the budget the job had (the memory reserved at its first
/// OOM: the real limit is at least that); otherwise without a budget, as a peak to compare
/// with the real one.
pub fn predict(snapshot: &Snapshot, d: &Device, ooms: &[Oom], real_peak: u64, diagnosis: &mut Diagnosis) {
    let budget = ooms.first().map(|o| o.reserved_bytes);
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
        let peak = crate::units::bytes(o.peak_reserved_bytes);
        r.fit.predicted_peak_bytes = Some(o.peak_reserved_bytes);
        r.fit.budget_bytes = budget;
        r.fit.effect = Some(match (budget, &o.oom) {
            (Some(_), None) => Effect::Fixes,
            (Some(_), Some(_)) => Effect::Helps,
            (None, _) if o.peak_reserved_bytes > real_peak => Effect::DoesNotApply,
            (None, _) => Effect::Fixes,
        });
        r.predicted = Some(match (budget, o.oom) {
            (Some(b), None) => format!("no OOM within the same {}, peak {peak}", crate::units::bytes(b)),
            (Some(_), Some(x)) => format!("still out of memory, at event {}", x.event_index),
            (None, _) if o.peak_reserved_bytes > real_peak => {
                format!(
                    "peak {peak} reserved, more than the real {}: it would cost more than it saves here",
                    crate::units::bytes(real_peak)
                )
            }
            (None, _) => format!("peak {peak} reserved (really {})", crate::units::bytes(real_peak)),
        });
    }
}
