//! What the benchmarks share: the real big snapshot they measure on, and small helpers.
//! Each bench includes this file and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The unpacked big_trace snapshot (243 MiB, 3,000,000 events), from `$FRAGSCOPE_BIG_TRACE` or
/// unpacked once from `../shared/fixtures/real/big_trace.pickle.xz`; None if neither exists.
pub fn big_trace() -> Option<PathBuf> {
    unpacked("big_trace", "FRAGSCOPE_BIG_TRACE")
}

/// The real snapshot twice big_trace's size (495 MiB, 6,000,000 events; made by
/// `gen_real_snapshots.py OUT big_trace_xl` on a GPU), from `$FRAGSCOPE_BIG_TRACE_XL`, or
/// unpacked once from `big_trace_xl.pickle.xz` in `../shared/fixtures/real` or
/// `target/bench-data`; None if there is none.
pub fn big_trace_xl() -> Option<PathBuf> {
    unpacked("big_trace_xl", "FRAGSCOPE_BIG_TRACE_XL")
}

fn unpacked(name: &str, var: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var) {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/bench-data");
    let out = dir.join(format!("{name}.pickle"));
    if out.exists() {
        return Some(out);
    }
    let xz = [root.join("../shared/fixtures/real"), dir.clone()]
        .into_iter()
        .map(|d| d.join(format!("{name}.pickle.xz")))
        .find(|p| p.exists())?;
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!("{name}.pickle.part"));
    let file = std::fs::File::create(&tmp).unwrap();
    let ok = Command::new("xz").args(["-dc"]).arg(&xz).stdout(file).status().expect("xz").success();
    assert!(ok, "xz failed");
    std::fs::rename(&tmp, &out).unwrap();
    Some(out)
}

/// How a target reads in the tables the benches print.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "not met" }
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

/// The machine a bench ran on, printed above its figures (#33: a figure is the machine's as
/// much as the code's): the CPU model, the cores this process may use, and how busy the
/// machine was over the last minute before the bench (a second core taken by something else
/// halves what the parse and the hash can share), and its memory's two figures (`memory`).
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    let busy = if load >= 0.5 {
        format!("busy: load {load:.2} over the last minute")
    } else {
        format!("idle (load {load:.2})")
    };
    let probe = fragscope::machine::cores::probe();
    // As the reader decides: up to two more probes where this one finds the core busy.
    let second = if fragscope::machine::cores::free_after(&probe) { "free" } else { "not free" };
    let memory = memory();
    format!(
        "machine: {model}, {cores} cores available, {busy}; second core {second} (a thread beside this one kept {}% of \
         its lone pace, this one {}%); memory: {memory}",
        probe.second_share, probe.first_share
    )
}

/// Bytes each memory measure writes.
const MEASURE_BYTES: usize = 64 << 20;

/// What a page of fresh memory costs, and how fast memory already mapped is written: the two
/// machine figures that moved `analyze` most between machines and hours (a 2-core VM's first
/// write to a page took 1.9-2.4 us, ten times the write of a mapped page; the machine the
/// issue was measured on ran fragscope 2x slower and Python 1.2x). Best of three each.
fn memory() -> String {
    let (mut fresh_us, mut gbs) = (f64::MAX, 0f64);
    for _ in 0..3 {
        // Zeroed this large, the allocator maps fresh pages and writes none of them.
        let mut v = vec![0u8; MEASURE_BYTES];
        let start = std::time::Instant::now();
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        fresh_us = fresh_us.min(start.elapsed().as_secs_f64() * 1e6 / (MEASURE_BYTES / 4096) as f64);
        let start = std::time::Instant::now();
        v.fill(2);
        std::hint::black_box(&v);
        gbs = gbs.max(MEASURE_BYTES as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    format!("a fresh page's first write {fresh_us:.2} us, writes to mapped pages {gbs:.1} GB/s")
}
