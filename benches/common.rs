//! What the benchmarks share: the real big snapshot they measure on, and small helpers.
//! Each bench includes this file and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The unpacked big_trace snapshot (243 MiB, 3,000,000 events), from `$FRAGSCOPE_BIG_TRACE` or
/// unpacked once from `../shared/fixtures/real/big_trace.pickle.xz`; None if neither exists.
pub fn big_trace() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("FRAGSCOPE_BIG_TRACE") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let xz = root.join("../shared/fixtures/real/big_trace.pickle.xz");
    if !xz.exists() {
        return None;
    }
    let dir = root.join("target/bench-data");
    let out = dir.join("big_trace.pickle");
    if !out.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join("big_trace.pickle.part");
        let file = std::fs::File::create(&tmp).unwrap();
        let ok = Command::new("xz").args(["-dc"]).arg(&xz).stdout(file).status().expect("xz").success();
        assert!(ok, "xz failed");
        std::fs::rename(&tmp, &out).unwrap();
    }
    Some(out)
}

/// The middle of `v` once sorted (the upper one for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Polls the snapshot's status until the worker has stored its analysis; panics if it failed.
pub fn wait_ready(http: &reqwest::blocking::Client, base: &str, id: &str, poll: std::time::Duration) {
    loop {
        let s: serde_json::Value = http.get(format!("{base}/api/v1/snapshots/{id}")).send().unwrap().json().unwrap();
        if s["status"] == "ready" {
            return;
        }
        assert_ne!(s["status"], "failed", "{s}");
        std::thread::sleep(poll);
    }
}
