//! The "What fills memory" panel of a share page, shaped from the stored analysis: one stacked
//! bar per moment (peak, OOMs, end) drawn as server-side SVG (rects with classes: no inline
//! style, which the page's CSP forbids), the top call sites with their category, the steps and
//! any growth. Every string is escaped by askama like the rest of the page.

use crate::service::{Breakdown, Category, DeviceAnalysis, Moment, Phase};
use crate::units::bytes;

/// Width of a bar in SVG units.
const WIDTH: u64 = 1000;
/// Call sites listed per moment.
const SITES: usize = 8;

pub(crate) struct Fills {
    pub(crate) moments: Vec<MomentView>,
    pub(crate) steps: String,
    pub(crate) growth: Vec<String>,
    /// The categories present, for the legend: (class, name).
    pub(crate) legend: Vec<(&'static str, &'static str)>,
}

pub(crate) struct MomentView {
    pub(crate) title: String,
    pub(crate) bars: Vec<Bar>,
    /// (call site, category, bytes, blocks)
    pub(crate) sites: Vec<(String, &'static str, String, u64)>,
}

pub(crate) struct Bar {
    pub(crate) x: u64,
    pub(crate) width: u64,
    pub(crate) class: &'static str,
    pub(crate) label: String,
}

/// The CSS class of a category's colour.
fn class(c: Category) -> &'static str {
    match c {
        Category::Parameter => "c-parameter",
        Category::Gradient => "c-gradient",
        Category::OptimizerState => "c-optimizer",
        Category::Activation => "c-activation",
        Category::Temporary => "c-temporary",
        Category::Input => "c-input",
        Category::KvCache => "c-kv-cache",
        Category::Other => "c-other",
        Category::Unknown => "c-unknown",
    }
}

fn phase(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
        Phase::Other => "outside forward, backward and optimizer",
    }
}

fn moment(b: &Breakdown) -> MomentView {
    let when = match (b.moment, b.event_index) {
        (Moment::Peak, Some(e)) => format!("At the peak, event {e}"),
        (Moment::Peak, None) => "At the peak, before the trace".to_string(),
        (Moment::Oom, Some(e)) => format!("At the OOM, event {e}"),
        (Moment::Final, _) => "At the end".to_string(),
        (_, e) => format!("After event {}", e.unwrap_or(0)),
    };
    let title = format!("{when} ({}): {} allocated", phase(b.phase), bytes(b.allocated_bytes));
    let total = b.allocated_bytes.max(1);
    let mut x = 0;
    let mut bars = Vec::new();
    for (c, v) in b.categories.iter().filter(|(_, v)| **v > 0) {
        let width = (v * WIDTH).div_ceil(total).min(WIDTH - x.min(WIDTH));
        let share = 100.0 * *v as f64 / total as f64;
        let mut label = format!("{}: {} ({share:.1}%)", c.as_str(), bytes(*v));
        if *c == Category::Parameter && b.unsharded_parameter_bytes > 0 {
            label.push_str(&format!(
                ", of which {} unsharded copies FSDP gathered for the layers computing",
                bytes(b.unsharded_parameter_bytes)
            ));
        }
        bars.push(Bar { x, width, class: class(*c), label });
        x += width;
    }
    let sites = b
        .call_sites
        .iter()
        .take(SITES)
        .map(|s| {
            let site = s.call_site.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "(no frames)".into());
            (site, s.category.as_str(), bytes(s.bytes), s.blocks)
        })
        .collect();
    MomentView { title, bars, sites }
}

pub(crate) fn fills(d: &DeviceAnalysis) -> Fills {
    let m = &d.memory;
    // The end is left out where it is the OOM itself (a snapshot taken by an OOM observer).
    let same_as_oom = |b: &Breakdown| {
        b.moment == Moment::Final
            && m.breakdown.iter().any(|o| o.moment == Moment::Oom && o.event_index == b.event_index)
    };
    let moments: Vec<MomentView> = m.breakdown.iter().filter(|b| !same_as_oom(b)).map(moment).collect();
    let steps = match m.highest_step() {
        Some(w) => format!(
            "{} {} found; the highest peak, {} allocated, in {} {} during the {}.",
            m.step_count(),
            if m.forward_passes { "forward passes (steps without a backward)" } else { "training steps" },
            bytes(w.peak_allocated_bytes),
            if m.forward_passes { "pass" } else { "step" },
            w.index + 1,
            phase(w.peak_phase)
        ),
        None => "No training steps found (no optimizer step in the trace).".to_string(),
    };
    let growth = m
        .growth
        .iter()
        .map(|g| {
            let site = g.call_site.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "(no frames)".into());
            format!(
                "{site} keeps {} more every step ({} steps, {} in {} blocks never freed, {})",
                bytes(g.bytes_per_step),
                g.steps,
                bytes(g.live_bytes),
                g.blocks,
                g.category.as_str()
            )
        })
        .collect();
    let legend = Category::ALL
        .iter()
        .filter(|c| m.breakdown.iter().any(|b| b.categories.get(c).is_some_and(|v| *v > 0)))
        .map(|c| (class(*c), c.as_str()))
        .collect();
    Fills { moments, steps, growth, legend }
}
