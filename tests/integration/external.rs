//! The 33 snapshots other people committed to public repositories (`../shared/fixtures/external`,
//! zstd-compressed, never copied here): each is read, its final counters equal the counts made
//! independently in its `expected.json`, and on every real one the replay of the trace ends
//! at the final `segments`. Skipped, with the reason printed, where `../shared` is absent.

use std::path::{Path, PathBuf};

use fragscope::analysis::{self, Depth};
use fragscope::ingest;
use fragscope::snapshot::BlockState;

fn corpus() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/external");
    dir.join("expected.json").exists().then_some(dir)
}

#[test]
fn every_external_snapshot_reads_and_replays_to_its_final_state() {
    let Some(dir) = corpus() else {
        crate::util::skipped("../shared/fixtures/external is not beside this checkout");
        return;
    };
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let files = expected.as_object().unwrap();
    assert!(files.len() >= 33, "expected.json lists {} files", files.len());
    let mut failures = Vec::new();
    for (file, want) in files {
        let ingested = match ingest::ingest_path(&dir.join(file), &ingest::Options::default()) {
            Ok(i) => i,
            Err(e) => {
                failures.push(format!("{file}: not read: {e}"));
                continue;
            }
        };
        let snap = &ingested.snapshot;
        let analyzed = analysis::analyze(snap, ingested.source.clone(), Depth::Report);
        let synthetic = want["synthetic"].as_bool().unwrap_or(false);
        for (device, w) in want["devices"].as_object().unwrap() {
            let device: i64 = device.parse().unwrap();
            let Some(d) = snap.devices.iter().find(|d| d.device == device) else {
                failures.push(format!("{file}: device {device} missing"));
                continue;
            };
            let a = analyzed.analysis.devices.iter().find(|a| a.device == device).unwrap();
            let largest_free = d
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state == BlockState::Inactive)
                .map(|b| b.size)
                .max()
                .unwrap_or(0);
            let got = [
                ("reserved", a.final_state.reserved_bytes),
                ("allocated", a.final_state.allocated_bytes),
                ("active", a.final_state.active_bytes),
                ("requested", a.final_state.requested_bytes),
                ("segments", d.segments.len() as u64),
                ("largest_free", largest_free),
                ("events", a.trace.events),
            ];
            for (key, ours) in got {
                if w[key].as_u64() != Some(ours) {
                    failures.push(format!("{file} device {device}: {key} = {ours}, expected {}", w[key]));
                }
            }
            for (action, n) in w["actions"].as_object().unwrap() {
                let ours = a.trace.actions.get(action).copied().unwrap_or(0);
                if n.as_u64() != Some(ours) {
                    failures.push(format!("{file} device {device}: {action} events = {ours}, expected {n}"));
                }
            }
            if !synthetic && !a.replay.matches_final {
                failures.push(format!("{file} device {device}: replay ends elsewhere: {:?}", a.replay.mismatches));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
