//! The hostile corpus (tests/hostile, made by make_corpus.py): each file gets a one-line error
//! naming what is wrong, exit code 2, within bounded time and memory, and nothing is executed.

use std::process::Command;
use std::time::Duration;

use crate::util::*;

/// File, and words its error message must contain.
const CASES: [(&str, &[&str]); 24] = [
    ("global_reduce.pickle", &["GLOBAL", "byte"]),
    ("stack_global.pickle", &["STACK_GLOBAL", "byte"]),
    ("huge_length.pickle", &["string length", "limit", "byte 2"]),
    ("gigabyte_string.pickle", &["string length", "limit"]),
    ("deep_nesting.pickle", &["nesting depth", "byte"]),
    ("memo_missing.pickle", &["memo index 7", "byte"]),
    ("gzip_bomb.pickle.gz", &["decompression bomb", "gzip"]),
    ("json_wrong_types.json", &["segments[0].address", "int", "str"]),
    ("json_deep.json", &["JSON", "recursion"]),
    ("empty.pickle", &["empty"]),
    ("random.bin", &["byte"]),
    ("not_a_snapshot.pickle", &["not a valid memory snapshot", "segments", "weights"]),
    ("trace_wrong_type.pickle", &["size", "non-negative int", "str"]),
    ("truncated.pickle", &["byte"]),
    ("deep_nesting.pickle", &["limit of 64"]),
    ("zstd_claims_100gb.pickle.zst", &["zstd"]),
    ("shared_segments.pickle", &["segments[0].blocks[1]", "same block object", "not expanded"]),
    ("shared_trace.pickle", &["device_traces[0][1]", "same trace entry object"]),
    ("many_segments.pickle.gz", &["at most 131072 segments", "segments[131072]"]),
    ("crowded_segment.pickle", &["segments[0].blocks", "at most 4097 blocks", "5000 blocks"]),
    ("huge_total_size.pickle", &["segments[0].total_size", "below 2^63", "9223372036854775808"]),
    ("trace_many_keys.pickle", &["device_traces[0][0]", "5004 keys"]),
    ("many_blocks.pickle.zst", &["memory budget of", "MiB", "byte"]),
    ("many_devices.pickle.gz", &["segments[64].device", "at most 64 devices"]),
];

/// A valid snapshot of 20,000 OOMs over 10,000 blocks: analysed within the cap (1 GiB of
/// address space, 60 s), the first OOMs in full and all of them counted.
#[test]
fn an_oom_storm_is_analysed_with_its_per_oom_work_capped() {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 1048576; exec \"$0\" analyze --json \"$1\"")
        .arg(bin())
        .arg(hostile().join("oom_storm.pickle"));
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &a["devices"][0];
    // make_corpus.py writes 20,000 oom events.
    assert_eq!(d["oom_count"], 20_000);
    assert_eq!(d["ooms"].as_array().unwrap().len(), 64);
}

/// Runs the CLI on a file under a 1 GiB address-space cap; returns (exit code, stderr).
fn analyze_capped(path: &std::path::Path) -> (Option<i32>, String) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg("ulimit -v 1048576; exec \"$0\" analyze \"$1\"").arg(bin()).arg(path);
    let out = run_bounded(cmd, Duration::from_secs(60));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_hostile_file_gets_a_clear_error_and_exit_code_2() {
    let _ = std::fs::remove_file("/tmp/fragscope-pwned");
    let mut failures = Vec::new();
    for (file, words) in CASES {
        let (code, stderr) = analyze_capped(&hostile().join(file));
        if code != Some(2) {
            failures.push(format!("{file}: exit {code:?}, stderr {stderr}"));
        }
        if stderr.trim().lines().count() != 1 {
            failures.push(format!("{file}: error is not one line: {stderr}"));
        }
        for w in words {
            if !stderr.contains(w) {
                failures.push(format!("{file}: error lacks {w:?}: {stderr}"));
            }
        }
    }
    assert!(!std::path::Path::new("/tmp/fragscope-pwned").exists(), "a pickle ran code");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn truncation_at_every_offset_is_an_error_within_the_input() {
    let bytes = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    for cut in 0..bytes.len() {
        match fragscope::ingest::ingest(std::io::Cursor::new(bytes[..cut].to_vec()), &Default::default()) {
            Ok(_) => panic!("cut at {cut} was accepted"),
            Err(fragscope::ingest::IngestError::Read { error, .. }) => {
                assert!(error.offset <= cut as u64, "cut {cut}: offset {}", error.offset)
            }
            Err(fragscope::ingest::IngestError::Empty) => assert_eq!(cut, 0),
            Err(other) => panic!("cut {cut}: unexpected {other}"),
        }
    }
}

#[test]
fn truncated_compressed_files_are_errors() {
    let raw = std::fs::read(snapshot_path("train_gpt_default")).unwrap();
    for cut in [1, 5, 100, raw.len() / 3, raw.len() - 1] {
        let r = fragscope::ingest::ingest(std::io::Cursor::new(raw[..cut].to_vec()), &Default::default());
        assert!(r.is_err(), "zstd cut at {cut} accepted");
    }
}

/// Ten million trace entries of one key each (`{'action': 'snapshot'}`, key and value
/// memoized), about 80 MB: a valid snapshot, analysed within bounded time and memory.
#[test]
fn ten_million_tiny_events_are_analysed_in_bounded_time_and_memory() {
    let mut p = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]".to_vec();
    // The first event memoizes the key (memo 0) and the value (memo 1); the rest refer to them.
    p.extend_from_slice(b"}\x8c\x06action\x94\x8c\x08snapshot\x94sa");
    let (key, value) = (0u8, 1u8);
    for _ in 1..10_000_000 {
        p.extend_from_slice(&[b'}', b'h', key, b'h', value, b's', b'a']);
    }
    p.extend_from_slice(b"eu.");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.pickle");
    std::fs::write(&path, &p).unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg("ulimit -v 3145728; exec \"$0\" analyze --json \"$1\"").arg(bin()).arg(&path);
    let out = run_bounded(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a["devices"][0]["trace"]["events"], 10_000_000);
    assert_eq!(a["devices"][0]["trace"]["actions"]["snapshot"], 10_000_000);
}

/// The expansion cases through the server, under a small analysis budget: each gets its 4xx
/// naming the repeat or the limit, the server's memory stays small, and it keeps answering;
/// the OOM storm is analysed.
#[test]
fn the_server_refuses_expansion_bombs_within_a_small_budget() {
    let server = TestServer::start(&["--analysis-memory", "256MiB"]);
    let client = TestServer::client();
    for (file, words) in CASES.iter().filter(|(f, _)| {
        ["shared_segments", "shared_trace", "many_segments", "crowded_segment", "many_blocks", "many_devices"]
            .iter()
            .any(|k| f.starts_with(k))
    }) {
        let r = client
            .post(server.url("/api/v1/snapshots"))
            .body(std::fs::read(hostile().join(file)).unwrap())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 422, "{file}");
        let detail = r.json::<serde_json::Value>().unwrap()["detail"].as_str().unwrap().to_string();
        // Under this budget 140,000 segments pass the memory budget before the segment count.
        let budget: &[&str] = &["memory budget of 128 MiB"];
        let words = if file.starts_with("many_segments") { budget } else { words };
        assert!(words.iter().all(|w| detail.contains(w)), "{file}: {detail}");
    }
    let storm = server.upload(&hostile().join("oom_storm.pickle"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&storm)["status"], "ready");
    let maps = std::fs::read_dir(server.data.join("results")).unwrap().flatten().map(|d| {
        std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().starts_with("map-"))
            .count()
    });
    assert_eq!(maps.sum::<usize>(), 1 + 8, "the end's map and the first 8 OOMs' maps");
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
    assert!(server.peak_rss_kib() < 256 << 10, "peak RSS {} KiB", server.peak_rss_kib());
}

/// Without a hash or a progress count (the command line's read), the decoder reads the input
/// itself instead of through a reading thread: on every fixture and hostile file, as they are
/// and gzip- and zstd-compressed, and cut short, the two end with the same model, source and
/// error (but for the hash only the thread computes).
#[test]
fn a_read_without_a_hash_ends_as_the_read_through_the_reading_thread() {
    use std::io::Write;
    let read = |bytes: &[u8], hash: bool| {
        let options = fragscope::ingest::Options { hash, two_parts: None, ..Default::default() };
        match fragscope::ingest::ingest(std::io::Cursor::new(bytes.to_vec()), &options) {
            Ok(i) => {
                assert_eq!(i.source.sha256.is_some(), hash);
                let source = fragscope::snapshot::Source { sha256: None, ..i.source };
                format!("{}\n{source:?}", i.snapshot.canonical_text())
            }
            Err(e) => format!("error: {e}"),
        }
    };
    let dirs = [crate::util::fixtures(), crate::util::hostile()];
    let mut files: Vec<_> =
        dirs.iter().flat_map(|d| std::fs::read_dir(d).unwrap()).map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.is_file() && !p.to_string_lossy().ends_with(".json") && !p.to_string_lossy().ends_with(".md"));
    files.sort();
    let (mut models, mut errors) = (0, 0);
    for path in &files {
        let raw = std::fs::read(path).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let forms =
            [raw.clone(), gz.finish().unwrap(), zstd::encode_all(&raw[..], 1).unwrap(), raw[..raw.len() / 2].to_vec()];
        for (form, bytes) in ["as is", "gzip", "zstd", "cut in half"].iter().zip(forms) {
            let (direct, threaded) = (read(&bytes, false), read(&bytes, true));
            assert_eq!(direct, threaded, "{} {form}", path.display());
            if direct.starts_with("error: ") { errors += 1 } else { models += 1 }
        }
    }
    assert!(models >= 40 && errors >= 20, "{models} models, {errors} errors");
}
