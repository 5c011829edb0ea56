//! `fragscope simulate`: the trace replayed under other allocator settings, and what the
//! step that died would still have needed.

use super::{options, pick_device};
use crate::analysis;
use crate::ingest::{self, IngestError};
use crate::units::bytes;

pub(super) fn simulate(
    file: &std::path::Path,
    device: Option<i64>,
    settings: &crate::simulate::Settings,
    json: bool,
) -> Result<Result<String, String>, IngestError> {
    let snap = ingest::ingest_path(file, &options())?.snapshot;
    let d = match pick_device(&snap, device) {
        Ok(d) => d,
        Err(usage) => return Ok(Err(usage)),
    };
    let outcome = match crate::simulate::simulate(&snap, d, settings) {
        Ok(o) => o,
        Err(e) => return Ok(Err(e.to_string())),
    };
    use std::fmt::Write as _;
    let mut text = String::new();
    if json {
        text = serde_json::to_string_pretty(&outcome).unwrap_or_default() + "\n";
    } else {
        let cap = match (outcome.capacity_bytes, outcome.capacity_source) {
            (Some(c), Some("implied")) => {
                format!(
                    " within {} (the budget the OOM implies: the most the process held reserved before it)",
                    bytes(c)
                )
            }
            (Some(c), _) => format!(" within {}", bytes(c)),
            (None, _) => " with no budget (none given, and no OOM in the trace implies one)".to_string(),
        };
        let mut with = String::new();
        if let Some(site) = &settings.mempool {
            with.push_str(&format!(", a MemPool around {site}"));
        }
        if let Some(site) = &settings.reuse {
            with.push_str(&format!(", one buffer reused at {site}"));
        }
        let _ = writeln!(
            text,
            "device {} under {}{with}{cap}: {} events replayed",
            outcome.device, outcome.conf, outcome.replayed_events
        );
        let _ = writeln!(text, "  peak reserved  {}", bytes(outcome.peak_reserved_bytes));
        let _ = writeln!(text, "  peak allocated {}", bytes(outcome.peak_allocated_bytes));
        match &outcome.oom {
            Some(o) => writeln!(
                text,
                "  OOM at event {}: {} requested with {} reserved, {} allocated",
                o.event_index,
                bytes(o.requested_bytes),
                bytes(o.reserved_bytes),
                bytes(o.allocated_bytes)
            ),
            None => writeln!(
                text,
                "  no OOM; {} reserved at the end, {} of it free but pinned",
                bytes(outcome.final_reserved_bytes),
                bytes(outcome.pinned_free_bytes_at_end)
            ),
        }
        .unwrap_or(());
        if let (None, Some(at)) = (&outcome.oom, outcome.trace_oom_event) {
            let _ = writeln!(text, "{}", step_still_needs(&snap, d, at, settings.capacity));
        }
    }
    Ok(Ok(text))
}

/// What a replay that got past the trace's OOM cannot show: the rest of the step, which the
/// trace never recorded. The analysis's projection of what the step needed says it.
fn step_still_needs(
    snap: &crate::snapshot::Snapshot,
    d: &crate::snapshot::Device,
    at: u64,
    capacity: Option<u64>,
) -> String {
    let options = analysis::Options { capacity, device_total: None };
    let a = analysis::analyze_with(snap, crate::snapshot::Source::default(), analysis::Depth::Report, options);
    let Some(need) = a.analysis.devices.iter().find(|x| x.device == d.device).map(|x| &x.diagnosis.need) else {
        return String::new();
    };
    let head = format!(
        "  the trace ends at its OOM (event {at}): this replay shows only that the failing request would have been served"
    );
    match (need.peak_allocated_bytes, need.peak_reserved_bytes, need.budget_bytes) {
        (Some(alloc), Some(res), Some(budget)) => format!(
            "{head}; the step still needed {} allocated ({} reserved), {} the {} budget. {}",
            bytes(alloc),
            bytes(res),
            match need.fits {
                Some(true) => "which fits",
                Some(false) => "more than",
                None => "about",
            },
            bytes(budget),
            need.basis
        ),
        _ => format!("{head}; what the rest of the step needed cannot be projected: {}", need.basis),
    }
}
