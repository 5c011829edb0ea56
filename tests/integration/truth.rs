//! The final state of every real fixture against PyTorch's own counters (the truth files), and
//! the trace against a count made by python3's standard pickle module.

use serde_json::{Value, json};

use crate::torch_counters::COUNTERS;
use crate::util::*;

/// torch's memory_stats for one device: two_devices keeps one per device.
fn stats_for(truth: &Value, device: i64) -> &Value {
    let stats = &truth["memory_stats"];
    if stats.get("reserved_bytes.all.current").is_some() { stats } else { &stats[device.to_string()] }
}

#[test]
fn final_counters_equal_torch_counters_on_every_fixture() {
    let mut failures = Vec::new();
    for name in fixture_names() {
        let truth = truth(&name);
        let analysis = analyze_json(&snapshot_path(&name));
        let devices = analysis["devices"].as_array().unwrap();
        assert!(!devices.is_empty(), "{name}: no devices");
        for d in devices {
            let device = d["device"].as_i64().unwrap();
            let stats = stats_for(&truth, device);
            for (ours, theirs) in COUNTERS {
                let want = &stats[theirs];
                assert!(want.is_u64(), "{name}: truth lacks {theirs}");
                if &d["final"][ours] != want {
                    failures.push(format!(
                        "{name} device {device}: final.{ours} = {}, torch {theirs} = {want}",
                        d["final"][ours]
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Counts made with python3's pickle module, independent of our reader.
const PY_COUNT: &str = r#"
import collections, json, pickle, sys
out = {}
for path in sys.argv[1:]:
    s = pickle.load(open(path, 'rb'))
    devs = {}
    for d, trace in enumerate(s.get('device_traces', [])):
        times = [e['time_us'] for e in trace if 'time_us' in e]
        devs[d] = {'events': len(trace), 'actions': dict(collections.Counter(e['action'] for e in trace)),
                   'first_time_us': times[0] if times else None, 'last_time_us': times[-1] if times else None}
    for seg in s['segments']:
        d = devs.setdefault(seg['device'], {'events': 0, 'actions': {}, 'first_time_us': None, 'last_time_us': None})
        free = [b['size'] for b in seg['blocks'] if b['state'] == 'inactive']
        d['largest_free_block_bytes'] = max([d.get('largest_free_block_bytes', 0)] + free)
    out[path] = devs
print(json.dumps(out))
"#;

#[test]
fn trace_counts_equal_python_pickle_counts() {
    let dir = tempfile::tempdir().unwrap();
    let names = fixture_names();
    let paths: Vec<_> = names.iter().map(|n| plain_pickle(n, dir.path())).collect();
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    let python = python_json(PY_COUNT, &refs);
    let mut failures = Vec::new();
    for (name, path) in names.iter().zip(&paths) {
        let analysis = analyze_json(path);
        let want_devices = &python[path.to_str().unwrap()];
        for d in analysis["devices"].as_array().unwrap() {
            let want = &want_devices[d["device"].as_i64().unwrap().to_string()];
            let want_trace = json!({
                "events": want["events"], "actions": want["actions"],
                "first_time_us": want["first_time_us"], "last_time_us": want["last_time_us"],
            });
            json_diff(&format!("{name} device {}.trace", d["device"]), &want_trace, &d["trace"], &mut failures);
            let largest = want.get("largest_free_block_bytes").cloned().unwrap_or(json!(0));
            json_diff(
                &format!("{name}.final.largest_free_block_bytes"),
                &largest,
                &d["final"]["largest_free_block_bytes"],
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn source_reports_encoding_and_hash() {
    let path = snapshot_path("seed_frag_default");
    let a = analyze_json(&path);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(a["source"]["bytes"], bytes.len());
    assert_eq!(a["source"]["encoding"], "pickle");
    assert_eq!(a["source"]["compression"], "none");
    assert_eq!(a["source"]["pickle_protocol"], 4);
    // sha256 by python's hashlib, not ours
    let sha = python_json(
        "import hashlib,json,sys; print(json.dumps(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest()))",
        &[&path],
    );
    assert_eq!(a["source"]["sha256"], serde_json::Value::Null, "hashed only when asked");
    let hashed = analyze_json_with(&path, &["--sha256"]);
    assert_eq!(hashed["source"]["sha256"], sha);
    assert_eq!(hashed["source"]["bytes"], bytes.len());
    let zst = analyze_json(&snapshot_path("train_gpt_default"));
    assert_eq!(zst["source"]["compression"], "zstd");
}
