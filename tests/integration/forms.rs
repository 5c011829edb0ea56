//! Upload forms under abuse: bounded text fields, stalled fields cut off like stalled files,
//! names shown in display order, and a re-upload racing the delete of the same bytes.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use reqwest::blocking::multipart;
use serde_json::Value;

use crate::util::*;

/// A request written whole, then its answer: (status, body).
fn raw_post(server: &TestServer, content_type: &str, body: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    let head = format!(
        "POST /api/v1/snapshots HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[test]
fn text_fields_past_their_limit_get_413_and_nothing_is_kept() {
    let server = TestServer::start(&["--max-upload", "10MB"]);
    let client = TestServer::client();
    let snapshot = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    for (field, size) in [("note", 40 << 10), ("name", 4 << 10), ("run", 4 << 10)] {
        // Sent whole before the answer is read: the server answers as soon as the field passes
        // its limit and stops reading, which a client still writing would see as a reset.
        let mut body =
            format!("--B\r\nContent-Disposition: form-data; name=\"{field}\"\r\n\r\n{}\r\n", "x".repeat(size))
                .into_bytes();
        body.extend(b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.pickle\"\r\n\r\n");
        body.extend(&snapshot);
        body.extend(b"\r\n--B--\r\n");
        let (status, answer) = raw_post(&server, "multipart/form-data; boundary=B", &body);
        assert_eq!(status, 413, "{field}: {answer}");
        assert!(answer.contains(&format!("`{field}`")), "{answer}");
    }
    // A 600 MB note: refused while it arrives (the client may see the connection close before
    // it has sent it all), never held.
    let form = multipart::Form::new()
        .text("note", "x".repeat(600 << 20))
        .file("file", snapshot_path("seed_frag_default"))
        .unwrap();
    if let Ok(r) = client.post(server.url("/api/v1/snapshots")).multipart(form).send() {
        assert_eq!(r.status().as_u16(), 413);
    }
    assert_eq!(server.get_json("/api/v1/snapshots").as_array().unwrap().len(), 0);
    assert!(server.peak_rss_kib() < 300 << 10, "a 600 MB note was never held: {} KiB", server.peak_rss_kib());
}

#[test]
fn a_stalled_text_field_is_cut_off_like_a_stalled_file() {
    let server = TestServer::start(&["--request-timeout", "2"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let head = "POST /api/v1/snapshots HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    let part = "--B\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\n";
    s.write_all(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes()).unwrap();
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        // One byte every 3 s, past the 2 s stall limit.
        for _ in 0..20 {
            if s.write_all(b"1\r\na\r\n").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    });
    let answer = sender.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(start.elapsed() < Duration::from_secs(20), "held for {:?}", start.elapsed());
}

#[test]
fn names_lose_their_bidirectional_controls() {
    let server = TestServer::start(&[]);
    let form = multipart::Form::new()
        .text("name", "report\u{202E}gpj.exe")
        .file("file", snapshot_path("seed_frag_default"))
        .unwrap();
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).multipart(form).send().unwrap();
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(server.get_json(&format!("/api/v1/snapshots/{id}"))["name"], "reportgpj.exe");
}

/// The same bytes uploaded while their only upload is being deleted: every 202 is a link that
/// works, and its analysis completes.
#[test]
fn a_re_upload_racing_the_delete_of_the_same_bytes_never_answers_a_dead_id() {
    let server = TestServer::start(&[]);
    let bytes = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    let created = server.upload(&snapshot_path("seed_frag_default"));
    let mut current = created["id"].as_str().unwrap().to_string();
    let mut key = created["delete_key"].as_str().unwrap().to_string();
    server.wait_done(&current);
    for round in 0..40 {
        let delete_url = server.url(&format!("/api/v1/snapshots/{current}"));
        let deleter = std::thread::spawn(move || {
            TestServer::client().delete(delete_url).header("x-fragscope-key", key).send().unwrap().status()
        });
        let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(bytes.clone()).send().unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let created = r.json::<Value>().unwrap();
        let id = created["id"].as_str().unwrap().to_string();
        key = created["delete_key"].as_str().unwrap().to_string();
        assert_eq!(deleter.join().unwrap().as_u16(), 204);
        let s = server.wait_done(&id);
        assert_eq!(s["status"], "ready", "round {round}: {s}");
        assert_eq!(server.get(&format!("/api/v1/snapshots/{id}/analysis")).status().as_u16(), 200, "round {round}");
        current = id;
    }
}
