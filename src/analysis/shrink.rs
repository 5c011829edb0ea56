//! The capacity remedies replayed: the trace through the allocator model with each remedy's
//! blocks made smaller (a smaller batch's activations, a lighter optimizer's state), under the
//! limit the remedies are judged by. The model sees where the smaller blocks land and what the
//! allocator's caching then holds.
//!
//! After a near miss the trace is the whole run, so the replay's word is final. At an OOM the
//! trace ends at the failing request: a replay that gets past it shows only that, and the
//! effect stays the one the step's projected need gives; a replay that still dies is believed
//! (the remedy helps when it dies later than the real run did, and does not help otherwise).
//! Only where the model, replaying the run unchanged, runs out of memory where the real run did
//! (at an OOM), or stays under the limit (at a near miss): else its word is no better.

use super::advice::{Effect, Remedy, RemedyKind};
use super::capacity::{Facts, Replaying};
use super::categories::Category;
use super::phases::Phase;
use crate::units::bytes;

/// Percent of a category's requests a remedy keeps.
type Keep = Box<dyn Fn(Category) -> u8>;

fn percent(share: f64) -> u8 {
    (share * 100.0).round().clamp(1.0, 100.0) as u8
}

/// How much of a category's requests a remedy keeps (percent), and of an OOM's request.
fn keeps(r: &Remedy, checkpoint: f64, request_phase: Option<Phase>) -> Option<(Keep, u8)> {
    let batch = matches!(request_phase, Some(Phase::Forward | Phase::Backward));
    Some(match r.kind {
        RemedyKind::SmallerBatch => {
            let k = percent(r.fit.batch_fraction.unwrap_or(0.5));
            let keep: Keep = Box::new(move |c| {
                if matches!(c, Category::Activation | Category::Temporary | Category::Input) { k } else { 100 }
            });
            (keep, if batch { k } else { 100 })
        }
        RemedyKind::ActivationCheckpointing => {
            let k = percent(checkpoint);
            (Box::new(move |c| if c == Category::Activation { k } else { 100 }), 100)
        }
        RemedyKind::ShardOptimizerState => (Box::new(|c| if c == Category::OptimizerState { 13 } else { 100 }), 100),
        RemedyKind::LighterOptimizer => (Box::new(|c| if c == Category::OptimizerState { 25 } else { 100 }), 100),
        _ => return None,
    })
}

/// Replays each remedy that shrinks blocks and weighs what the model says (see the module doc).
pub fn refine(r: &Replaying, f: &Facts, remedies: &mut [Remedy]) {
    use crate::simulate::{Settings, Shrink, simulate};
    use std::sync::Arc;
    let baseline = Settings { capacity: Some(f.limit), ..Default::default() };
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
    let checkpoint = f.need.checkpoint_factor().unwrap_or(0.5);
    for remedy in remedies.iter_mut() {
        let Some((keep, keep_request)) = keeps(remedy, checkpoint, f.request.as_ref().map(|q| q.phase)) else {
            continue;
        };
        let mut shrink = Shrink { events: vec![100; events.len()], ..Default::default() };
        for (i, e) in events.iter().enumerate() {
            match e.action {
                crate::snapshot::Action::ALLOC => shrink.events[i] = keep(r.index.labels.at(i)),
                crate::snapshot::Action::OOM => shrink.events[i] = keep_request,
                _ => {}
            }
        }
        shrink.before = r.before.iter().map(|(a, c)| (*a, keep(*c))).filter(|(_, k)| *k < 100).collect();
        let settings = Settings { capacity: Some(f.limit), shrink: Some(Arc::new(shrink)), ..Default::default() };
        let Ok(o) = simulate(r.snapshot, r.device, &settings) else { continue };
        remedy.fit.simulated = Some(true);
        let within = bytes(f.limit);
        match (&o.oom, f.request.is_some()) {
            (None, false) => {
                remedy.fit.predicted_peak_bytes = Some(o.peak_reserved_bytes);
                remedy.fit.effect = Some(Effect::Fixes);
                remedy.predicted = Some(format!(
                    "no OOM within {within} through the trace's end, peak {} reserved (replayed through the allocator model)",
                    bytes(o.peak_reserved_bytes)
                ));
            }
            // The real run did not die: a replay that does, dies earlier than it.
            (Some(x), false) => {
                remedy.fit.predicted_peak_bytes = Some(o.peak_reserved_bytes);
                remedy.fit.effect = Some(Effect::DoesNotHelp);
                remedy.predicted = Some(format!(
                    "still out of memory within {within}, at event {} (replayed through the allocator model)",
                    x.event_index
                ));
            }
            (None, true) => {
                if let Some(p) = remedy.predicted.as_mut() {
                    p.push_str("; replayed through the allocator model, the trace gets past its OOM with it");
                }
            }
            (Some(x), true) => {
                let later = oom_at.is_some_and(|real| x.event_index as usize > real);
                remedy.fit.effect = Some(if later { Effect::Helps } else { Effect::DoesNotHelp });
                remedy.predicted = Some(format!(
                    "still out of memory within {within}, at event {}{} (replayed through the allocator model)",
                    x.event_index,
                    if later { ", later than the real run" } else { ", no later than the real run" }
                ));
            }
        }
    }
}
