//! Uploads parsed while they arrive (`service/early.rs`): the analysis is the same as the
//! command line's, every case it does not cover falls back to the analysis after arrival, and
//! an upload given up mid-way frees what its parse held.

use std::io::Write;

use super::util::{TestServer, analyze_json_with, snapshot_path, synthetic_snapshot};

const EARLY: &str = "fragscope_analyses_parsed_while_arriving_total";

#[test]
fn an_upload_parsed_while_it_arrives_gives_the_command_line_s_analysis() {
    let server = TestServer::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // Larger than the size checked before the answer, so nothing else parses it first.
    let path = dir.path().join("big.pickle");
    std::fs::write(&path, synthetic_snapshot(150_000)).unwrap();
    let id = server.upload(&path)["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    assert_eq!(server.metric(EARLY), 1, "the parse made while arriving was used");
    assert_eq!(server.get_json(&format!("/api/v1/snapshots/{id}/analysis")), analyze_json_with(&path, &["--sha256"]));
    // A small one too (checked before the answer, and still analysed from the early parse).
    let small = snapshot_path("seed_frag_default");
    let id = server.upload(&small)["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    assert_eq!(server.metric(EARLY), 2);
    assert_eq!(server.get_json(&format!("/api/v1/snapshots/{id}/analysis")), analyze_json_with(&small, &["--sha256"]));
}

#[test]
fn compressed_and_unannounced_uploads_are_analysed_after_they_arrive() {
    let server = TestServer::start(&[]);
    let zst = snapshot_path("train_gpt_default");
    assert!(zst.to_string_lossy().ends_with(".zst"), "{}", zst.display());
    let id = server.upload(&zst)["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    // Chunked, without a Content-Length: its size is unknown, so its memory cannot be held.
    let bytes = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    let body = reqwest::blocking::Body::new(std::io::Cursor::new(bytes));
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(body).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<serde_json::Value>().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    assert_eq!(server.metric(EARLY), 0, "neither could be parsed while arriving");
    assert_eq!(server.metric("fragscope_analyses_total{outcome=\"ready\"}"), 2);
}

/// With one analysis slot, an upload cut off mid-way must give its slot back: else the next
/// upload would wait forever.
#[test]
fn an_upload_cut_off_mid_way_frees_the_slot_its_parse_held() {
    let server = TestServer::start(&["--analysis-workers", "1"]);
    let bytes = synthetic_snapshot(150_000);
    let addr = server.url("").trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(conn, "POST /api/v1/snapshots HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n", bytes.len()).unwrap();
    conn.write_all(&bytes[..bytes.len() / 2]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(conn);
    std::thread::sleep(std::time::Duration::from_millis(300));

    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    assert_eq!(server.metric(EARLY), 1, "the second upload was parsed while arriving");
    assert_eq!(server.metric("fragscope_uploads_total"), 1, "the cut-off upload was not kept");
}

/// A truncated pickle parsed while arriving fails with the command line's message.
#[test]
fn a_broken_upload_fails_with_the_reader_s_message() {
    let server = TestServer::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // Cut, and still past the size read through before the answer (which would refuse it).
    let mut bytes = synthetic_snapshot(200_000);
    bytes.truncate(bytes.len() * 2 / 3);
    assert!(bytes.len() > 32 << 20);
    let path = dir.path().join("cut.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let id = server.upload(&path)["id"].as_str().unwrap().to_string();
    let status = server.wait_done(&id);
    assert_eq!(status["status"], "failed");
    let error = status["error"].as_str().unwrap();
    let cli = std::process::Command::new(super::util::bin()).arg("analyze").arg(&path).output().unwrap();
    let cli = String::from_utf8_lossy(&cli.stderr);
    assert!(error.contains(&format!("at byte {}", bytes.len())), "{error}");
    assert!(cli.contains(error), "the server says {error:?}, the command line {cli:?}");
}

/// An upload arriving slowly gives its parse up (its slot would sit idle), so a fast upload
/// behind it with one analysis slot is still parsed while it arrives; the slow one is
/// analysed after it arrives.
#[test]
fn a_slow_upload_gives_its_slot_to_a_fast_one() {
    let server = TestServer::start(&["--analysis-workers", "1"]);
    let bytes = synthetic_snapshot(15_000);
    let addr = server.url("").trim_start_matches("http://").trim_end_matches('/').to_string();
    let slow = {
        let (addr, bytes) = (addr.clone(), bytes.clone());
        std::thread::spawn(move || {
            let mut conn = std::net::TcpStream::connect(&addr).unwrap();
            let head = format!(
                "POST /api/v1/snapshots HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            );
            conn.write_all(head.as_bytes()).unwrap();
            for chunk in bytes.chunks(70_000) {
                conn.write_all(chunk).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let mut answer = String::new();
            std::io::Read::read_to_string(&mut conn, &mut answer).ok();
            answer
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(2600));
    let fast = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&fast)["status"], "ready");
    assert!(!slow.is_finished(), "the fast upload waited for the slow one to arrive");
    assert_eq!(server.metric(EARLY), 1, "the fast upload was parsed while arriving");
    let answer = slow.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let id = answer.split("\"id\":\"").nth(1).unwrap().split('"').next().unwrap();
    assert_eq!(server.wait_done(id)["status"], "ready");
    assert_eq!(server.metric(EARLY), 1, "the slow one was analysed after it arrived");
}
