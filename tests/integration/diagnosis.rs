//! The diagnosis against the truth: OOM figures against the message PyTorch printed, verdicts
//! and the seed pattern against what the workloads did (truth `info`), call sites against
//! the pickle as python3 reads it.

use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// "3.05 GiB" -> bytes, as torch's format_size wrote it.
fn torch_bytes(number: &str, unit: &str) -> f64 {
    let n: f64 = number.parse().unwrap();
    n * match unit {
        "bytes" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        other => panic!("unit {other}"),
    }
}

/// The number and unit just before `marker` in an OOM message.
fn before<'a>(msg: &'a str, marker: &str) -> (&'a str, &'a str) {
    let head = &msg[..msg.find(marker).unwrap_or_else(|| panic!("{marker:?} not in {msg}"))];
    let words: Vec<&str> = head.split_whitespace().collect();
    (words[words.len() - 2], words[words.len() - 1])
}

/// True if `ours` prints as the message's number in the message's unit, to two decimals.
fn agrees(ours: u64, (number, unit): (&str, &str)) -> bool {
    let scale = torch_bytes("1", unit);
    let want = torch_bytes(number, unit) / scale;
    ((ours as f64 / scale) - want).abs() < 0.005 + 1e-9
}

#[test]
fn oom_figures_agree_with_the_message_pytorch_printed() {
    let mut checked = 0;
    for name in fixture_names() {
        let truth = truth(&name);
        let Some(msg) = truth["info"]["oom"].as_str() else { continue };
        let a = analyze_json(&snapshot_path(&name));
        let oom = &a["devices"][0]["ooms"][0];
        assert!(oom.is_object(), "{name}: the message says OOM, the analysis found none");
        let (alloc, reserved) = (oom["allocated_bytes"].as_u64().unwrap(), oom["reserved_bytes"].as_u64().unwrap());
        let tried = msg.split("Tried to allocate ").nth(1).unwrap();
        let tried: Vec<&str> = tried.split_whitespace().take(2).collect();
        let tried = (tried[0], tried[1].trim_end_matches('.'));
        assert!(
            agrees(oom["allocation_bytes"].as_u64().unwrap(), tried),
            "{name}: tried {tried:?}, ours {}",
            oom["allocation_bytes"]
        );
        assert!(agrees(alloc, before(msg, "is allocated by PyTorch")), "{name}: allocated {alloc} vs {msg}");
        let unalloc = before(msg, "is reserved by PyTorch but unallocated");
        assert!(agrees(reserved - alloc, unalloc), "{name}: unallocated {} vs {unalloc:?}", reserved - alloc);
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} fixtures with an OOM");
}

/// The top frame of the oom event, as python3's pickle reads it.
const PY_OOM_FRAME: &str = r#"
import json, pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
e = [e for e in s['device_traces'][0] if e['action'] == 'oom'][0]
print(json.dumps({'filename': e['frames'][0]['filename'], 'line': e['frames'][0]['line']}))
"#;

#[test]
fn seed_frag_default_is_fragmentation_with_six_pinned_segments_and_the_remedies() {
    let truth = truth("seed_frag_default");
    let path = snapshot_path("seed_frag_default");
    let d = analyze_json(&path)["devices"][0].clone();
    assert_eq!(d["diagnosis"]["verdict"], "fragmentation");
    assert_eq!(d["ooms"][0]["verdict"], "fragmentation");
    // One segment pinned per step survived (the workload's own count).
    let steps = truth["info"]["steps_survived"].as_u64().unwrap();
    assert_eq!(d["rhythm"]["detected"], true, "{}", d["rhythm"]);
    assert_eq!(d["rhythm"]["pinned_segments"], steps);
    let created: Vec<u64> = serde_json::from_value(d["rhythm"]["created_events"].clone()).unwrap();
    assert_eq!(created.len() as u64, steps);
    // The rest of each 1 GiB segment after the 520 MiB tensor is pinned.
    let (big, small) = (truth["info"]["big_bytes"].as_u64().unwrap(), truth["info"]["small_bytes"].as_u64().unwrap());
    assert_eq!(d["ooms"][0]["largest_usable_free_bytes"], big - small);
    assert_eq!(d["ooms"][0]["pinned_free_bytes"], (big - small) * steps);
    let frame = python_json(PY_OOM_FRAME, &[&path]);
    let site = format!("{}:{}", frame["filename"].as_str().unwrap(), frame["line"]);
    let remedies = d["diagnosis"]["remedies"].as_array().unwrap();
    let remedy = |kind: &str| remedies.iter().find(|r| r["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    assert_eq!(remedy("expandable_segments")["applies"], true);
    assert_eq!(remedy("mempool")["applies"], true);
    let code = remedy("mempool")["setting_or_code"].as_str().unwrap();
    assert!(code.contains("torch.cuda.MemPool()") && code.contains(&site), "{code} lacks {site}");
    let kinds: Vec<&str> = remedies.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["expandable_segments", "mempool", "max_split_size", "reuse_buffer"], "order of preference");
    let n: u64 =
        remedy("max_split_size")["setting_or_code"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        n * (1 << 20) > small && n * (1 << 20) <= big && n >= 20,
        "max_split_size_mb:{n} must sit above the small and at most the big blocks"
    );
}

#[test]
fn capacity_oom_is_capacity() {
    let d = analyze_json(&snapshot_path("capacity_oom"))["devices"][0].clone();
    assert_eq!(d["diagnosis"]["verdict"], "capacity");
    let remedies = d["diagnosis"]["remedies"].as_array().unwrap();
    assert!(remedies.iter().all(|r| r["applies"] == false), "no setting saves a capacity OOM: {remedies:?}");
}

#[test]
fn analysis_peaks_equal_torchs_where_the_trace_is_complete() {
    for name in fixture_names() {
        let truth = truth(&name);
        for d in analyze_json(&snapshot_path(&name))["devices"].as_array().unwrap() {
            if d["trace"]["complete"] != true {
                continue;
            }
            let stats = &truth["memory_stats"];
            let stats =
                if stats.get("reserved_bytes.all.peak").is_some() { stats } else { &stats[d["device"].to_string()] };
            assert_eq!(d["peak"]["reserved_bytes"], stats["reserved_bytes.all.peak"], "{name}");
        }
    }
    let ring = analyze_json(&snapshot_path("ring_truncated"));
    assert_eq!(ring["devices"][0]["trace"]["complete"], false);
}

#[test]
fn addresses_are_hex_strings_in_json() {
    let d = analyze_json(&snapshot_path("seed_frag_default"))["devices"][0].clone();
    let gap = &d["gaps"][0];
    for v in [&gap["address"], &gap["segment"], &d["pinners"][0]["largest_share_block"]] {
        let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
        assert!(s.starts_with("0x") && u64::from_str_radix(&s[2..], 16).is_ok(), "{s}");
    }
}

#[test]
fn state_command_marks_the_pinned_gaps_at_the_oom() {
    let truth = truth("seed_frag_default");
    let (big, small) = (truth["info"]["big_bytes"].as_u64().unwrap(), truth["info"]["small_bytes"].as_u64().unwrap());
    let mut cmd = Command::new(bin());
    cmd.args(["state", "--event", "oom"]).arg(snapshot_path("seed_frag_default"));
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let pinned = format!("pinned {:.2} MiB", (big - small) as f64 / 1048576.0);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("0x")).collect();
    assert_eq!(rows.len() as u64, truth["info"]["steps_survived"].as_u64().unwrap(), "{text}");
    for row in rows {
        assert!(row.ends_with(&pinned) && row.contains('#') && row.contains('x'), "{row}");
        // The strip is to scale: the live block's share of the 64 cells.
        let live = row.matches('#').count() as f64 / 64.0;
        assert!((live - small as f64 / big as f64).abs() < 2.0 / 64.0, "{row}");
    }
    let mut bad = Command::new(bin());
    bad.args(["state", "--event", "999999"]).arg(snapshot_path("seed_frag_default"));
    let out = run_bounded(bad, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2));
}
