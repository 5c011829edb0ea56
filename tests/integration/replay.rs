//! Replay against the truth: the whole trace must end at the final `segments` on every real
//! fixture, and where the trace is complete the peak must be torch's `reserved_bytes.all.peak`.

use fragscope::ingest::{Options, ingest_path};
use fragscope::replay::{Observer, Replay, State};
use fragscope::snapshot::Event;

use crate::util::*;

#[derive(Default)]
struct Peak(u64);

impl Observer for Peak {
    fn event(&mut self, _: usize, _: &Event, state: &State) {
        self.0 = self.0.max(state.totals.reserved_bytes);
    }
}

#[test]
fn full_replay_ends_at_the_final_segments_on_every_fixture() {
    let mut failures = Vec::new();
    for name in fixture_names() {
        let snap = ingest_path(&snapshot_path(&name), &Options::default()).unwrap().snapshot;
        for d in &snap.devices {
            let replay = Replay::run(&snap, d, &mut ());
            for m in &replay.final_mismatches {
                failures.push(format!("{name} device {}: {m}", d.device));
            }
            if replay.warnings.count > 0 && replay.complete {
                failures.push(format!(
                    "{name}: {} warnings on a complete trace: {:?}",
                    replay.warnings.count, replay.warnings.first
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn complete_traces_reach_torchs_peak_reserved() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in fixture_names() {
        let truth = truth(&name);
        let snap = ingest_path(&snapshot_path(&name), &Options::default()).unwrap().snapshot;
        for d in &snap.devices {
            let mut peak = Peak::default();
            let replay = Replay::run(&snap, d, &mut peak);
            let stats = &truth["memory_stats"];
            let stats =
                if stats.get("reserved_bytes.all.peak").is_some() { stats } else { &stats[d.device.to_string()] };
            let want = stats["reserved_bytes.all.peak"].as_u64().unwrap();
            if !replay.complete {
                continue;
            }
            checked += 1;
            if peak.0 != want {
                failures.push(format!("{name} device {}: peak reserved {} replayed, torch {want}", d.device, peak.0));
            }
        }
    }
    assert!(checked >= 15, "only {checked} complete traces");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn ring_truncated_is_reported_incomplete() {
    let snap = ingest_path(&snapshot_path("ring_truncated"), &Options::default()).unwrap().snapshot;
    let replay = Replay::run(&snap, &snap.devices[0], &mut ());
    assert!(!replay.complete);
    assert!(replay.final_mismatches.is_empty(), "{:?}", replay.final_mismatches);
}

/// Watches that every state of a replay that keeps no size index (the command line's) finds
/// the same largest free block by scanning as one that keeps it (the server's).
struct Largest(Vec<u64>);

impl Observer for Largest {
    fn event(&mut self, _: usize, _: &Event, state: &State) {
        self.0.push(state.largest_free());
    }
}

#[test]
fn the_largest_free_block_is_the_same_scanned_or_indexed_on_every_fixture() {
    let mut compared = 0;
    for name in fixture_names() {
        let snap = ingest_path(&snapshot_path(&name), &Options::default()).unwrap().snapshot;
        for d in &snap.devices {
            let (mut indexed, mut scanned) = (Largest(Vec::new()), Largest(Vec::new()));
            Replay::run_with(&snap, d, &mut indexed, true);
            Replay::run_with(&snap, d, &mut scanned, false);
            assert_eq!(indexed.0, scanned.0, "{name} device {}", d.device);
            compared += indexed.0.iter().filter(|&&b| b > 0).count();
        }
    }
    assert!(compared > 1000, "only {compared} events had a free block");
}
