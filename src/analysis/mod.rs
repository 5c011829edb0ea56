//! Analysis: every number fragscope reports about a snapshot, one file per family, named as
//! torch names them.
//!
//! - `counters`: the state of a set of segments (reserved, allocated, inactive split, ...).
//! - `actions`: what the trace holds.
//!
//! [`analyze`] assembles them into the document that `fragscope analyze --json` prints and
//! the API serves. Analysis never fails on a decoded model.

mod actions;
mod counters;

pub use actions::{TraceSummary, trace_summary};
pub use counters::{Counters, counters};

use serde::Serialize;

use crate::ingest::Source;
use crate::snapshot::Snapshot;

/// The analysis document. Later versions add keys; they never rename these.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub source: Source,
    pub allocator_settings: Option<serde_json::Value>,
    pub devices: Vec<DeviceAnalysis>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceAnalysis {
    pub device: i64,
    #[serde(rename = "final")]
    pub final_state: Counters,
    pub trace: TraceSummary,
}

pub fn analyze(snapshot: &Snapshot, source: Source) -> Analysis {
    let devices = snapshot
        .devices
        .iter()
        .map(|d| DeviceAnalysis {
            device: d.device,
            final_state: counters(&d.segments),
            trace: trace_summary(snapshot, d),
        })
        .collect();
    Analysis { source, allocator_settings: snapshot.allocator_settings.clone(), devices }
}
