//! The text diagnosis `fragscope analyze FILE` prints after the counters: the first thing
//! people read on a GPU box over SSH. The verdict sentence, what fills memory at the OOM (or
//! the peak), any growth, the steps, and the remedies that would help, with their numbers.

use std::io::Write;

use crate::analysis::DeviceAnalysis;
use crate::analysis::advice::Effect;
use crate::analysis::breakdown::Moment;
use crate::units::bytes;

/// Call sites listed under "what fills memory".
const SITES: usize = 5;

pub fn write_diagnosis(out: &mut impl Write, d: &DeviceAnalysis) -> std::io::Result<()> {
    writeln!(out, "  verdict: {}", d.diagnosis.verdict.words())?;
    writeln!(out, "  {}", d.diagnosis.summary)?;
    write_need(out, d)?;
    let at = d
        .memory
        .breakdown
        .iter()
        .find(|b| b.moment == Moment::Oom)
        .or_else(|| d.memory.breakdown.iter().find(|b| b.moment == Moment::Peak));
    if let Some(b) = at {
        write_fills(out, b)?;
    }
    write_steps(out, d)?;
    write_remedies(out, d)
}

/// What the step needed, against the budget, and what is held outside PyTorch.
fn write_need(out: &mut impl Write, d: &DeviceAnalysis) -> std::io::Result<()> {
    let need = &d.diagnosis.need;
    if let (Some(a), Some(r), false) = (need.peak_allocated_bytes, need.peak_reserved_bytes, d.ooms.is_empty()) {
        let budget = match (need.budget_bytes, need.budget_upper_bytes) {
            (Some(b), Some(u)) => format!("; budget {} to {}", bytes(b), bytes(u)),
            (Some(b), None) => format!("; budget {}", bytes(b)),
            _ => String::new(),
        };
        let fits = match need.fits {
            Some(true) => ": fits",
            Some(false) => ": does not fit",
            None => ": cannot tell",
        };
        writeln!(out, "  the step needs {} allocated, {} reserved{budget}{fits}", bytes(a), bytes(r))?;
    }
    if let Some(o) = &d.diagnosis.outside {
        writeln!(out, "  outside PyTorch: {}", o.basis)?;
    }
    Ok(())
}

/// What fills memory at the OOM or the peak, by category and call site.
fn write_fills(out: &mut impl Write, b: &crate::analysis::breakdown::Breakdown) -> std::io::Result<()> {
    let when = match (b.moment, b.event_index) {
        (Moment::Oom, Some(e)) => format!("at the OOM (event {e})"),
        (_, Some(e)) => format!("at the peak (event {e})"),
        _ => "at the peak (before the trace)".to_string(),
    };
    let phase = serde_json::to_value(b.phase).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    writeln!(out, "  what fills memory {when}, {phase} phase: {} allocated", bytes(b.allocated_bytes))?;
    let mut cats: Vec<_> = b.categories.iter().filter(|(_, v)| **v > 0).collect();
    cats.sort_by(|a, b| b.1.cmp(a.1));
    for (c, v) in cats {
        let share = 100.0 * *v as f64 / b.allocated_bytes.max(1) as f64;
        writeln!(out, "    {:<16} {:>12}  {share:>5.1}%", c.as_str(), bytes(*v))?;
        if *c == crate::analysis::categories::Category::Parameter && b.unsharded_parameter_bytes > 0 {
            writeln!(
                out,
                "      of which {} are unsharded copies FSDP gathered for the layers computing",
                bytes(b.unsharded_parameter_bytes)
            )?;
        }
    }
    for s in b.call_sites.iter().take(SITES) {
        let site = s.call_site.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "(no frames)".into());
        writeln!(out, "    {:>12}  {:<16} {site} ({} blocks)", bytes(s.bytes), s.category.as_str(), s.blocks)?;
    }
    Ok(())
}

/// The steps, the highest, and what grows from step to step.
fn write_steps(out: &mut impl Write, d: &DeviceAnalysis) -> std::io::Result<()> {
    if !d.memory.steps.is_empty() {
        let worst = d.memory.highest_step();
        if let Some(w) = worst {
            writeln!(
                out,
                "  steps: {}{}; the highest peak, {} allocated, in step {} at event {}",
                d.memory.step_count(),
                if d.memory.forward_passes { " (forward passes: no backward in the trace)" } else { "" },
                bytes(w.peak_allocated_bytes),
                w.index + 1,
                w.peak_event
            )?;
        }
    }
    for g in &d.memory.growth {
        let site = g.call_site.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "(no frames)".into());
        writeln!(
            out,
            "  growth: {site} keeps {} more every step ({} steps, {} never freed, {})",
            bytes(g.bytes_per_step),
            g.steps,
            bytes(g.live_bytes),
            g.category.as_str()
        )?;
        if let Some(c) = g.cause {
            writeln!(out, "    why: {}", c.says())?;
        }
    }
    Ok(())
}

/// The remedies that apply, with what replaying each predicts.
fn write_remedies(out: &mut impl Write, d: &DeviceAnalysis) -> std::io::Result<()> {
    for r in d.diagnosis.remedies.iter().filter(|r| r.applies) {
        let effect = r.fit.effect.map(|e| e.label()).unwrap_or("applies");
        writeln!(out, "  remedy: {} [{effect}]", r.kind.title())?;
        if let Some(p) = &r.predicted {
            writeln!(out, "    predicted: {p}")?;
        }
        for line in r.setting_or_code.lines() {
            writeln!(out, "    | {line}")?;
        }
    }
    let useful = |r: &&crate::analysis::advice::Remedy| {
        r.applies && !matches!(r.fit.effect, Some(Effect::DoesNotApply | Effect::DoesNotHelp))
    };
    if !d.diagnosis.remedies.iter().any(|r| useful(&r)) {
        writeln!(out, "  remedy: none applies")?;
    }
    Ok(())
}
