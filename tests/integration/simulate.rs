//! What-if simulation against real GPU runs: the fixtures ran the same workloads under
//! different settings, so simulating one run's trace under another's settings must reproduce
//! what the GPU did.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::util::*;

fn simulate(path: &std::path::Path, args: &[&str]) -> Value {
    let mut cmd = Command::new(bin());
    cmd.args(["simulate", "--json"]).arg(path).args(args);
    let out = run_bounded(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "simulate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn pct(got: u64, want: u64) -> f64 {
    100.0 * (got as f64 - want as f64).abs() / want as f64
}

#[test]
fn each_run_under_its_own_settings_reaches_its_real_peak() {
    let mut checked = 0;
    for name in fixture_names() {
        let truth = truth(&name);
        let stats = &truth["memory_stats"];
        if stats.get("reserved_bytes.all.peak").is_none() {
            continue; // two_devices: one set of stats per device, checked below per device
        }
        let analysis = analyze_json(&snapshot_path(&name));
        if analysis["devices"][0]["trace"]["complete"] != true {
            continue;
        }
        // A run held to a budget that it reached was shaped by it: simulate within it.
        let retried = stats["num_alloc_retries"].as_u64().unwrap_or(0) > 0;
        let cap = truth["info"]["cap_bytes"].as_u64().filter(|_| retried).map(|c| c.to_string());
        let args: Vec<&str> = cap.as_deref().map(|c| vec!["--capacity", c]).unwrap_or_default();
        let got = simulate(&snapshot_path(&name), &args)["peak_reserved_bytes"].as_u64().unwrap();
        let want = stats["reserved_bytes.all.peak"].as_u64().unwrap();
        assert!(pct(got, want) <= 1.0, "{name}: simulated peak {got}, real {want} ({:.2}% off)", pct(got, want));
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} runs checked");
}

/// Index of the first `oom` event, and the real run's peak reserved bytes over its events
/// before its (N+1)th 520 MiB allocation (the same requests as the default run's N steps and
/// its failed big request), from segment events alone.
const PY_PREFIX: &str = r#"
import json, pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
n = int(sys.argv[2])
# Sampled at allocs: torch records a new segment just before the alloc it serves.
reserved = peak = smalls = 0
for e in s['device_traces'][0]:
    a = e['action']
    if a in ('segment_alloc', 'segment_map'): reserved += e['size']
    if a in ('segment_free', 'segment_unmap'): reserved -= e['size']
    if a == 'alloc':
        if e['size'] == 520 << 20:
            smalls += 1
            if smalls > n: break
        peak = max(peak, reserved)
oom = [i for i, e in enumerate(s['device_traces'][0]) if e['action'] == 'oom']
print(json.dumps({'peak': peak, 'oom': oom[0] if oom else None}))
"#;

#[test]
fn the_seed_run_dies_under_the_default_allocator_and_each_remedy_saves_it() {
    let seed = snapshot_path("seed_frag_default");
    let truth = truth("seed_frag_default");
    let cap = truth["info"]["cap_bytes"].as_u64().unwrap().to_string();
    let died_at = python_json(PY_PREFIX, &[&seed, std::path::Path::new("1")])["oom"].as_u64().unwrap();
    let default = simulate(&seed, &["--conf", "", "--capacity", &cap]);
    assert_eq!(default["oom"]["event_index"], died_at, "the default allocator dies at the real OOM event");
    // The default run died asking for its 7th big block, after 6 steps: compare each remedy
    // with the real run of that remedy over the same requests.
    assert_eq!(truth["info"]["small_bytes"], 520 << 20);
    let steps = truth["info"]["steps_survived"].as_u64().unwrap().to_string();
    let frame = python_json(
        "import json,pickle,sys; s=pickle.load(open(sys.argv[1],'rb')); e=[e for e in s['device_traces'][0] if e['action']=='oom'][0]; print(json.dumps('%s:%d' % (e['frames'][0]['filename'], e['frames'][0]['line'])))",
        &[&seed],
    );
    let site = frame.as_str().unwrap();
    for (args, real) in [
        (vec!["--conf", "expandable_segments:True"], "seed_frag_expandable"),
        (vec!["--conf", "max_split_size_mb:256"], "seed_frag_maxsplit256"),
        (vec!["--mempool", site], "seed_frag_mempool"),
        (vec!["--reuse", site], "seed_frag_buffer"),
    ] {
        let mut a = args.clone();
        a.extend(["--capacity", &cap]);
        let o = simulate(&seed, &a);
        assert!(o["oom"].is_null(), "{args:?}: {o}");
        let want =
            python_json(PY_PREFIX, &[&snapshot_path(real), std::path::Path::new(&steps)])["peak"].as_u64().unwrap();
        let got = o["peak_reserved_bytes"].as_u64().unwrap();
        assert!(pct(got, want) <= 5.0, "{args:?}: simulated peak {got}, real {real} {want}");
    }
}

#[test]
fn runs_that_died_die_at_their_real_event() {
    for name in ["capacity_oom", "dynamic_default", "seed_frag_default"] {
        let path = snapshot_path(name);
        let cap = truth(name)["info"]["cap_bytes"].as_u64().unwrap().to_string();
        let died_at = python_json(PY_PREFIX, &[&path, std::path::Path::new("1")])["oom"].as_u64().unwrap();
        let o = simulate(&path, &["--capacity", &cap]);
        assert_eq!(o["oom"]["event_index"], died_at, "{name}");
    }
    // Capacity: no setting saves it.
    let path = snapshot_path("capacity_oom");
    let cap = truth("capacity_oom")["info"]["cap_bytes"].as_u64().unwrap().to_string();
    let o = simulate(&path, &["--capacity", &cap, "--conf", "expandable_segments:True"]);
    assert!(o["oom"].is_object(), "{o}");
}

#[test]
fn the_json_has_the_documented_shape_and_bad_settings_are_refused() {
    let o = simulate(&snapshot_path("seed_frag_default"), &["--conf", "max_split_size_mb:256"]);
    for key in [
        "device",
        "conf",
        "capacity_bytes",
        "replayed_events",
        "peak_reserved_bytes",
        "peak_allocated_bytes",
        "oom",
        "final_reserved_bytes",
        "pinned_free_bytes_at_end",
    ] {
        assert!(o.get(key).is_some(), "{key} missing from {o}");
    }
    for bad in [vec!["--conf", "max_split_size_mb:5"], vec!["--conf", "nonsense:1"], vec!["--mempool", "nowhere.py:1"]]
    {
        let mut cmd = Command::new(bin());
        cmd.arg("simulate").arg(snapshot_path("seed_frag_default")).args(&bad);
        let out = run_bounded(cmd, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    let d = analyze_json(&snapshot_path("seed_frag_default"))["devices"][0].clone();
    for r in d["diagnosis"]["remedies"].as_array().unwrap() {
        assert!(r["predicted"].as_str().unwrap().starts_with("no OOM"), "{r}");
    }
}

#[test]
fn the_api_simulates_too() {
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let o = server.get_json(&format!("/api/v1/snapshots/{id}/devices/0/simulate?conf=&capacity=6GiB"));
    assert!(o["oom"].is_object());
    let o = server
        .get_json(&format!("/api/v1/snapshots/{id}/devices/0/simulate?conf=expandable_segments:True&capacity=6GiB"));
    assert!(o["oom"].is_null());
    let r = server.get(&format!("/api/v1/snapshots/{id}/devices/0/simulate?conf=bogus:1"));
    assert_eq!(r.status().as_u16(), 400);
}

/// "2.42 GiB is allocated by PyTorch" -> bytes, from torch's OOM message.
fn message_bytes(msg: &str, marker: &str) -> f64 {
    let head = &msg[..msg.find(marker).unwrap()];
    let w: Vec<&str> = head.split_whitespace().collect();
    let unit = match w[w.len() - 1] {
        "GiB" => 1073741824.0,
        "MiB" => 1048576.0,
        other => panic!("unit {other}"),
    };
    w[w.len() - 2].parse::<f64>().unwrap() * unit
}

#[test]
fn the_dynamic_workload_dies_under_the_default_allocator_as_the_real_run_did() {
    // dynamic_maxsplit128 ran the same seeded workload as the real default run, which died.
    let real = truth("dynamic_default");
    let msg = real["info"]["oom"].as_str().unwrap();
    let cap = real["info"]["cap_bytes"].as_u64().unwrap().to_string();
    let o = simulate(&snapshot_path("dynamic_maxsplit128"), &["--conf", "", "--capacity", &cap]);
    let oom = &o["oom"];
    assert!(oom.is_object(), "the default allocator must run out of memory: {o}");
    let gib = |v: f64| v / 1073741824.0;
    let (alloc, reserved) = (oom["allocated_bytes"].as_f64().unwrap(), oom["reserved_bytes"].as_f64().unwrap());
    assert!(
        (gib(alloc) - gib(message_bytes(msg, "is allocated by PyTorch"))).abs() < 0.005,
        "allocated {alloc} vs {msg}"
    );
    let unallocated = message_bytes(msg, "is reserved by PyTorch but unallocated");
    assert!((gib(reserved - alloc) - gib(unallocated)).abs() < 0.005, "reserved {reserved} vs {msg}");
    let tried = msg.split("Tried to allocate ").nth(1).unwrap().split(". GPU").next().unwrap();
    assert!(
        (gib(oom["requested_bytes"].as_f64().unwrap()) - gib(message_bytes(&format!("{tried} x"), " x"))).abs() < 0.005,
        "{tried}"
    );
}

#[test]
fn the_gpt_run_under_expandable_segments_peaks_where_the_real_one_did() {
    let want = truth("train_gpt_expandable")["memory_stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    let got =
        simulate(&snapshot_path("train_gpt_default"), &["--conf", "expandable_segments:True"])["peak_reserved_bytes"]
            .as_u64()
            .unwrap();
    assert!(pct(got, want) <= 1.0, "predicted {got}, real {want}");
}

#[test]
fn the_dynamic_workload_under_expandable_segments_peaks_where_the_real_one_did() {
    let real = truth("dynamic_expandable");
    let want = real["memory_stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    let cap = real["info"]["cap_bytes"].as_u64().unwrap().to_string();
    let o =
        simulate(&snapshot_path("dynamic_maxsplit128"), &["--conf", "expandable_segments:True", "--capacity", &cap]);
    assert!(o["oom"].is_null(), "{o}");
    let got = o["peak_reserved_bytes"].as_u64().unwrap();
    assert!(pct(got, want) <= 5.0, "predicted {got}, real {want}");
}
