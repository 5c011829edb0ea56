//! Hardening: crash safety (SIGKILL mid-upload, mid-analysis, mid-delete), slow clients,
//! contradictory snapshots, unguessable ids, and no path out of the data directory.

use std::io::Read;
use std::time::{Duration, Instant};

use reqwest::blocking::Body;
use serde_json::Value;

use crate::util::*;

/// A body that sends `chunk` bytes every `every`, `total` in all (a slow or stalled client).
struct Trickle {
    left: u64,
    chunk: usize,
    every: Duration,
    first: bool,
}

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        if !self.first {
            std::thread::sleep(self.every);
        }
        let n = buf.len().min(self.chunk).min(self.left as usize);
        for b in &mut buf[..n] {
            *b = b'N';
        }
        if self.first {
            buf[..2].copy_from_slice(b"\x80\x04");
            self.first = false;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(files_in(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}

/// Uploads a snapshot big enough (about 90 MB) to be caught while it is analysed; its id.
fn upload_big(server: &TestServer) -> String {
    let r =
        TestServer::client().post(server.url("/api/v1/snapshots")).body(synthetic_snapshot(900_000)).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string()
}

/// Waits until this server is parsing the upload (its progress has moved: a status of
/// `analyzing` alone may be left from a server killed before).
fn wait_analyzing(server: &TestServer, id: &str) {
    let start = Instant::now();
    loop {
        let s = server.get_json(&format!("/api/v1/snapshots/{id}"));
        if s["status"] == "analyzing" && s["progress"].as_f64().unwrap_or(0.0) > 0.0 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never analysing: {s}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Every blob and results directory (both by sha256) belongs to a snapshot the server lists.
fn assert_no_orphans(server: &TestServer) {
    let rows: Vec<Value> = serde_json::from_value(server.get_json("/api/v1/snapshots?limit=500")).unwrap();
    let shas: Vec<&str> = rows.iter().map(|r| r["sha256"].as_str().unwrap()).collect();
    for blob in files_in(&server.data.join("blobs")) {
        assert!(shas.iter().any(|s| blob.ends_with(s)), "orphan blob {blob}");
    }
    for entry in std::fs::read_dir(server.data.join("results")).unwrap().flatten() {
        let name = entry.file_name().into_string().unwrap();
        assert!(shas.contains(&name.as_str()), "orphan results {name}");
    }
    assert!(files_in(&server.data.join("tmp")).is_empty(), "temp files left");
}

#[test]
fn a_kill_in_the_middle_of_an_upload_leaves_nothing_half_written() {
    let mut server = TestServer::start(&[]);
    let kept = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&kept);
    let url = server.url("/api/v1/snapshots");
    let sender = std::thread::spawn(move || {
        let body =
            Body::new(Trickle { left: 100 << 20, chunk: 1 << 20, every: Duration::from_millis(50), first: true });
        let _ = TestServer::client().post(url).body(body).send();
    });
    let tmp = server.data.join("tmp");
    let start = Instant::now();
    while files_in(&tmp).is_empty() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!files_in(&tmp).is_empty(), "the upload never started");
    server.kill();
    sender.join().unwrap();
    let data = server.data.clone();
    let again = TestServer::start_in(&data, &[]);
    assert_eq!(again.get_json(&format!("/api/v1/snapshots/{kept}"))["status"], "ready");
    assert_eq!(again.get_json("/api/v1/snapshots").as_array().unwrap().len(), 1);
    assert_no_orphans(&again);
}

#[test]
fn a_kill_in_the_middle_of_an_analysis_runs_it_again() {
    let mut server = TestServer::start(&["--analysis-workers", "1"]);
    let id = upload_big(&server);
    wait_analyzing(&server, &id);
    server.kill();
    let data = server.data.clone();
    let again = TestServer::start_in(&data, &[]);
    let s = again.wait_done(&id);
    assert_eq!(s["status"], "ready", "the interrupted analysis ran again: {s}");
    assert_eq!(
        again.get_json(&format!("/api/v1/snapshots/{id}/analysis"))["devices"][0]["trace"]["events"],
        1 + 3 * 900_000
    );
    assert_no_orphans(&again);
}

/// A server killed twice while analysing the same file (as the kernel's OOM killer would) does
/// not try a third time: the snapshot is failed with a message, and the server keeps serving.
#[test]
pub fn an_analysis_that_dies_twice_is_failed_not_resumed_into_a_crash_loop() {
    let mut server = TestServer::start(&["--analysis-workers", "1"]);
    let id = upload_big(&server);
    let mut killed = Vec::new();
    for _ in 0..2 {
        wait_analyzing(&server, &id);
        server.kill();
        let data = server.data.clone();
        // The killed server keeps the temp data folder alive.
        let next = TestServer::start_in(&data, &["--analysis-workers", "1"]);
        killed.push(std::mem::replace(&mut server, next));
    }
    let s = server.wait_done(&id);
    assert_eq!(s["status"], "failed", "{s}");
    assert!(s["error"].as_str().unwrap().contains("killed twice"), "{s}");
    let other = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&other)["status"], "ready");
    // Failed is not for good: the same bytes uploaded again are analysed again.
    let r =
        TestServer::client().post(server.url("/api/v1/snapshots")).body(synthetic_snapshot(900_000)).send().unwrap();
    let created: Value = r.json().unwrap();
    assert_eq!((created["duplicate"].as_bool(), created["retried"].as_bool()), (Some(true), Some(true)), "{created}");
    assert_eq!(server.wait_done(created["id"].as_str().unwrap())["status"], "ready");
    assert_eq!(server.get_json(&format!("/api/v1/snapshots/{id}"))["status"], "ready", "every upload of the bytes");
}

/// A graceful stop (SIGTERM, as systemd and Kubernetes stop a server) in the middle of an
/// analysis is not a crash: two of them do not fail a valid snapshot, the next start finishes it.
#[test]
fn two_graceful_stops_mid_analysis_do_not_fail_the_snapshot() {
    let mut server = TestServer::start(&["--analysis-workers", "1"]);
    let id = upload_big(&server);
    let mut stopped = Vec::new();
    for _ in 0..2 {
        wait_analyzing(&server, &id);
        let term = std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
        assert!(term.success());
        let exit = server.child.wait().unwrap();
        assert!(exit.success(), "a graceful stop exits 0: {exit:?}");
        let data = server.data.clone();
        let next = TestServer::start_in(&data, &["--analysis-workers", "1"]);
        stopped.push(std::mem::replace(&mut server, next));
    }
    let s = server.wait_done(&id);
    assert_eq!(s["status"], "ready", "{s}");
    // And a ready snapshot is not retried.
    let r = TestServer::client().post(server.url(&format!("/api/v1/snapshots/{id}/retry"))).send().unwrap();
    assert_eq!(r.status().as_u16(), 409);
}

#[test]
fn a_kill_during_a_delete_leaves_it_done_or_undone_never_half() {
    for round in 0..3 {
        let mut server = TestServer::start(&[]);
        let created = server.upload(&snapshot_path("seed_frag_default"));
        let (a, key) =
            (created["id"].as_str().unwrap().to_string(), created["delete_key"].as_str().unwrap().to_string());
        let b = server.upload(&snapshot_path("two_devices"))["id"].as_str().unwrap().to_string();
        server.wait_done(&a);
        server.wait_done(&b);
        let url = server.url(&format!("/api/v1/snapshots/{a}"));
        let deleter = std::thread::spawn(move || {
            let _ = TestServer::client().delete(url).header("x-fragscope-key", key).send();
        });
        std::thread::sleep(Duration::from_millis(round * 3));
        server.kill();
        deleter.join().unwrap();
        let data = server.data.clone();
        let again = TestServer::start_in(&data, &[]);
        let status = again.get(&format!("/api/v1/snapshots/{a}")).status().as_u16();
        if status == 200 {
            assert_eq!(again.get(&format!("/api/v1/snapshots/{a}/analysis")).status().as_u16(), 200, "half deleted");
        } else {
            assert_eq!(status, 404);
        }
        assert_eq!(again.get_json(&format!("/api/v1/snapshots/{b}"))["status"], "ready");
        assert_no_orphans(&again);
    }
}

#[test]
fn a_client_sending_a_byte_a_second_is_cut_off_and_holds_no_analysis_slot() {
    let server = TestServer::start(&["--request-timeout", "2", "--analysis-workers", "1"]);
    let url = server.url("/api/v1/snapshots");
    let slow = std::thread::spawn(move || {
        let started = Instant::now();
        let body = Body::new(Trickle { left: 1000, chunk: 1, every: Duration::from_secs(1), first: true });
        let r = TestServer::client().post(url).body(body).send();
        (started.elapsed(), r.map(|r| r.status().as_u16()).ok())
    });
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile others upload and get analysed.
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    let (took, status) = slow.join().unwrap();
    assert!(took < Duration::from_secs(20), "the slow client held on for {took:?}");
    assert!(matches!(status, None | Some(408)), "slow client got {status:?}");
    assert!(files_in(&server.data.join("tmp")).is_empty());
}

#[test]
fn contradictory_snapshots_are_analysed_with_warnings() {
    let path = hostile().join("contradictory.pickle");
    let a = analyze_json(&path);
    assert!(a["warnings"].as_array().unwrap().len() >= 2, "{}", a["warnings"]);
    assert!(a["devices"][0]["replay"]["warnings"].as_u64().unwrap() > 0);
    let server = TestServer::start(&[]);
    let id = server.upload(&path)["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    let page = server.get(&format!("/s/{id}")).text().unwrap();
    assert!(page.contains("The file contradicts itself"), "the page shows the warnings");
    assert_eq!(server.get(&format!("/api/v1/snapshots/{id}/devices/0/state?event=1")).status().as_u16(), 200);
}

#[test]
fn ids_are_random_and_wrong_ids_and_paths_reach_nothing() {
    let server = TestServer::start(&[]);
    let ids: Vec<u128> = (1..=12)
        .map(|k| {
            let r =
                TestServer::client().post(server.url("/api/v1/snapshots")).body(synthetic_snapshot(k)).send().unwrap();
            u128::from_str_radix(r.json::<Value>().unwrap()["id"].as_str().unwrap(), 16).unwrap()
        })
        .collect();
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            let differ = (a ^ b).count_ones();
            assert!((30..=98).contains(&differ), "ids {a:x} and {b:x} differ in only {differ} bits");
        }
    }
    let unknown = server.get("/api/v1/snapshots/0123456789abcdef0123456789abcdef");
    let malformed = server.get("/api/v1/snapshots/..%2F..%2Fetc%2Fpasswd");
    assert_eq!(unknown.status().as_u16(), 404);
    assert_eq!(malformed.status().as_u16(), 404);
    assert_eq!(unknown.text().unwrap(), malformed.text().unwrap(), "a wrong id tells nothing");
    for path in [
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/s/..%2F..%2Ffragscope.db",
        "/api/v1/snapshots/..%2Ffragscope.db/blob",
    ] {
        let r = server.get(path);
        assert_eq!(r.status().as_u16(), 404, "{path}");
        assert!(!r.text().unwrap().contains("root:"), "{path}");
    }
    let r = server.get("/");
    for (h, want) in [("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer")] {
        assert_eq!(r.headers()[h], want);
    }
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
}

/// One sniffing rule for the server and the command line: JSON after more whitespace than the
/// server's 64-byte head, and gzip with trailing garbage (which gzip(1) reads), are read by both.
#[test]
fn the_server_and_the_cli_read_the_same_odd_but_valid_files() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let spaced = dir.path().join("spaced.json");
    std::fs::write(&spaced, format!("{}{}", " ".repeat(100), r#"{"segments": [], "device_traces": [[]]}"#)).unwrap();
    let trailing = dir.path().join("trailing.pickle.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&std::fs::read(snapshot_path("seed_frag_default")).unwrap()).unwrap();
    let mut bytes = gz.finish().unwrap();
    bytes.extend_from_slice(b"trailing garbage\n");
    std::fs::write(&trailing, bytes).unwrap();
    let server = TestServer::start(&[]);
    for file in [&spaced, &trailing] {
        let out = std::process::Command::new(bin()).arg("analyze").arg(file).output().unwrap();
        assert!(out.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
        let id = server.upload(file)["id"].as_str().unwrap().to_string();
        assert_eq!(server.wait_done(&id)["status"], "ready", "{}", file.display());
    }
}

/// Starts a form upload on a raw connection whose `note` field then arrives one byte every
/// `every`, on its own thread; the answer's status line (empty if none) and how long it took.
fn slow_note(base: &str, every: Duration, bytes: usize) -> std::thread::JoinHandle<(String, Duration)> {
    use std::io::Write;
    let addr = base.trim_start_matches("http://").to_string();
    std::thread::spawn(move || {
        let started = Instant::now();
        let Ok(mut s) = std::net::TcpStream::connect(&addr) else { return (String::new(), started.elapsed()) };
        let head = "--b\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\n";
        let _ = write!(
            s,
            "POST /api/v1/snapshots HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n{head}"
        );
        // Listen before each byte, not after: a byte sent after the server answered and closed
        // makes its kernel reset the connection, and the reset throws away an answer not yet
        // read (CI saw a 503 lost that way).
        s.set_read_timeout(Some(every)).unwrap();
        let mut answer = Vec::new();
        for _ in 0..bytes {
            let mut buf = [0u8; 512];
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    break;
                }
                Err(_) => {}
            }
            if s.write_all(b"n").is_err() {
                break;
            }
        }
        let line = String::from_utf8_lossy(&answer).lines().next().unwrap_or("").to_string();
        (line, started.elapsed())
    })
}

/// A text field trickling one byte at a time (each read under the stall timeout) is cut off
/// once the form's fields besides the file have taken the whole timeout.
#[test]
fn a_form_field_sent_a_byte_at_a_time_is_cut_off() {
    let server = TestServer::start(&["--request-timeout", "2"]);
    let (line, took) = slow_note(&server.base, Duration::from_millis(500), 60).join().unwrap();
    assert!(line.contains(" 408 "), "no 408 for a trickling note: {line:?} after {took:?}");
    assert!(took < Duration::from_secs(10), "held on for {took:?}");
}

/// A flood of slow uploads takes at most half the connections: health checks and links are
/// still answered at once, and the uploads past that half are told to retry (503).
#[test]
fn slow_uploads_never_take_every_connection_from_health_checks() {
    let server = TestServer::start(&["--request-timeout", "30", "--max-connections", "8"]);
    let slow: Vec<_> = (0..8).map(|_| slow_note(&server.base, Duration::from_millis(500), 30)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..3 {
        let started = Instant::now();
        let r = TestServer::client().get(server.url("/healthz")).timeout(Duration::from_secs(5)).send();
        assert!(r.is_ok_and(|r| r.status().is_success()), "healthz starved");
        assert!(started.elapsed() < Duration::from_secs(2), "healthz took {:?}", started.elapsed());
    }
    let busy = slow.into_iter().map(|t| t.join().unwrap().0).filter(|l| l.contains(" 503 ")).count();
    assert_eq!(busy, 4, "the uploads past half the connections are refused at once");
}
