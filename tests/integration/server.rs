//! The real server over HTTP on loopback, with a temp data dir: uploads in every form,
//! progress, dedupe, a 250 MiB upload in bounded memory, restarts, bad input, tokens, delete.

use std::io::Read;

use reqwest::blocking::{Body, multipart};
use serde_json::Value;

use crate::util::*;

#[test]
pub fn every_upload_form_works_and_the_same_bytes_are_analysed_once_under_their_own_ids() {
    let server = TestServer::start(&[]);
    let client = TestServer::client();
    // curl --data-binary @f
    let raw = server.upload(&snapshot_path("seed_frag_default"));
    assert_eq!(raw["duplicate"], false);
    // curl -F file=@f (with a name and a note)
    let form = multipart::Form::new()
        .file("file", snapshot_path("capacity_oom"))
        .unwrap()
        .text("name", "capacity run")
        .text("note", "bs=64");
    let r = client.post(server.url("/api/v1/snapshots")).multipart(form).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let formed: Value = r.json().unwrap();
    // requests.post(url, data=f): a streamed body of unknown length (chunked)
    let file = std::fs::File::open(snapshot_path("two_devices")).unwrap();
    let r = client.post(server.url("/api/v1/snapshots?name=two")).body(Body::new(file)).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let streamed: Value = r.json().unwrap();
    // The same bytes again: stored and analysed once, but under a new id (knowing a file
    // must not reveal someone else's link).
    let again = server.upload(&snapshot_path("seed_frag_default"));
    assert_ne!(again["id"], raw["id"]);
    assert_eq!(again["duplicate"], true);
    for (created, name) in [(&raw, "snapshot"), (&formed, "capacity run"), (&streamed, "two")] {
        let id = created["id"].as_str().unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(created["page_url"], format!("/s/{id}"));
        let status = server.wait_done(id);
        assert_eq!(status["status"], "ready", "{status}");
        assert_eq!(status["name"], name);
        assert_eq!(status["progress"], 1.0);
    }
    assert_eq!(server.get_json(&format!("/api/v1/snapshots/{}", formed["id"].as_str().unwrap()))["note"], "bs=64");
    let list = server.get_json("/api/v1/snapshots");
    assert_eq!(list.as_array().unwrap().len(), 4);
    // Each upload is deleted on its own: the other keeps its analysis and its file.
    let (first, second) = (raw["id"].as_str().unwrap(), again["id"].as_str().unwrap());
    assert_eq!(server.wait_done(second)["status"], "ready");
    let path = format!("/api/v1/snapshots/{first}");
    assert_eq!(client.delete(server.url(&path)).send().unwrap().status().as_u16(), 403, "no key, no token");
    assert_eq!(server.delete_with_key(&path, again["delete_key"].as_str().unwrap()), 403, "another upload's key");
    assert_eq!(server.delete_with_key(&path, raw["delete_key"].as_str().unwrap()), 204);
    assert_eq!(client.get(server.url(&format!("/api/v1/snapshots/{first}"))).send().unwrap().status().as_u16(), 404);
    let diagnosis = server.get_json(&format!("/api/v1/snapshots/{second}/diagnosis"));
    assert!(diagnosis.to_string().contains("fragmentation"), "{diagnosis}");
    let blob = client.get(server.url(&format!("/api/v1/snapshots/{second}/blob"))).send().unwrap();
    assert_eq!(
        blob.bytes().unwrap().len() as u64,
        std::fs::metadata(snapshot_path("seed_frag_default")).unwrap().len()
    );
}

#[test]
pub fn big_uploads_answer_at_once_and_report_progress() {
    let server = TestServer::start(&["--analysis-workers", "1"]);
    // ~58 MB: over the size checked before answering, so it is analysed in the background.
    let bytes = synthetic_snapshot(600_000);
    assert!(bytes.len() as u64 > 32 << 20);
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(bytes).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    let mut seen = Vec::new();
    loop {
        let s = server.get_json(&format!("/api/v1/snapshots/{id}"));
        let p = s["progress"].as_f64().unwrap();
        seen.push((s["status"].as_str().unwrap().to_string(), p));
        if s["status"] == "ready" {
            break;
        }
        assert_ne!(s["status"], "failed", "{s}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(seen.iter().all(|(_, p)| (0.0..=1.0).contains(p)), "{seen:?}");
    assert!(
        seen.iter().any(|(s, p)| s == "analyzing" && *p > 0.0 && *p < 1.0),
        "progress never seen between 0 and 1: {seen:?}"
    );
    let a = server.get_json(&format!("/api/v1/snapshots/{id}/analysis"));
    assert_eq!(a["devices"][0]["trace"]["events"], 1 + 3 * 600_000);
}

/// A body of `len` bytes made on the fly: a pickle header, then NONE/POP pairs.
struct Synthetic {
    left: u64,
    first: bool,
}

impl Read for Synthetic {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize & !1;
        if n == 0 {
            return Ok(0);
        }
        for pair in buf[..n].chunks_mut(2) {
            pair.copy_from_slice(b"N0");
        }
        if self.first {
            buf[..2].copy_from_slice(b"\x80\x04");
            self.first = false;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[test]
fn a_250_mib_upload_is_streamed_in_bounded_memory() {
    let server = TestServer::start(&[]);
    let len = 250u64 << 20;
    let body = Body::sized(Synthetic { left: len, first: true }, len);
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(body).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    let status = server.wait_done(&id);
    assert_eq!(status["bytes"], len);
    // It is no snapshot (no STOP): it fails, with the reader's offset.
    assert_eq!(status["status"], "failed");
    assert!(status["error"].as_str().unwrap().contains("byte"), "{status}");
    let peak = server.peak_rss_kib();
    eprintln!("peak RSS of the server for a 250 MiB upload: {peak} KiB");
    assert!(peak < 120 * 1024, "server peak RSS {peak} KiB for a 250 MiB upload");
}

#[test]
fn uploads_over_the_limit_get_413_and_nothing_is_kept() {
    let server = TestServer::start(&["--max-upload", "100KB"]);
    let r = TestServer::client()
        .post(server.url("/api/v1/snapshots"))
        .body(std::fs::read(snapshot_path("ddp_rank0")).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let e: Value = r.json().unwrap();
    assert_eq!(e["error"], "too_large");
    assert!(std::fs::read_dir(server.data.join("tmp")).unwrap().next().is_none(), "temp file left");
    assert!(server.get_json("/api/v1/snapshots").as_array().unwrap().is_empty());
}

/// An upload far over the limit still gets its 413 naming the limit, never a reset
/// connection: the server reads the rest and throws it away before it answers, whether the
/// size was announced (Content-Length) or only found on the way (chunked, and a form). A
/// client that waits for "100 Continue" is answered before it sends anything.
#[test]
fn uploads_far_over_the_limit_get_their_413_and_not_a_reset() {
    let server = TestServer::start(&["--max-upload", "100KB", "--request-timeout", "120"]);
    let client = TestServer::client();
    let big = vec![b'x'; 24 << 20];
    let url = server.url("/api/v1/snapshots");
    let check = |r: reqwest::Result<reqwest::blocking::Response>, how: &str| {
        let r = r.unwrap_or_else(|e| panic!("{how}: no answer but {e:?}"));
        assert_eq!(r.status().as_u16(), 413, "{how}");
        // Its body may be partly unread: the connection is not offered for the next request.
        assert_eq!(r.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]), "{how}");
        let e: Value = r.json().unwrap();
        assert!(e["detail"].as_str().unwrap_or_default().contains("limit"), "{how}: {e}");
    };
    for round in 0..3 {
        check(client.post(&url).body(big.clone()).send(), &format!("announced, round {round}"));
        let chunked = Body::new(std::io::Cursor::new(big.clone()));
        check(client.post(&url).body(chunked).send(), &format!("chunked, round {round}"));
        let form = multipart::Form::new()
            .text("note", "n")
            .part("file", multipart::Part::reader(std::io::Cursor::new(big.clone())).file_name("big.pickle"));
        check(client.post(&url).multipart(form).send(), &format!("form, round {round}"));
    }
    // Headers only, announcing a gigabyte and waiting to be told to go on.
    use std::io::Write;
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    write!(
        conn,
        "POST /api/v1/snapshots HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut answer = [0u8; 12];
    conn.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&answer));
    // Announcing a gigabyte, sending a little and then nothing: the drain ends at its own
    // 10 s deadline, not after the (here far longer) stall timeout.
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    write!(conn, "POST /api/v1/snapshots HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000000000\r\n\r\n").unwrap();
    conn.write_all(&[b'x'; 4096]).unwrap();
    let asked = std::time::Instant::now();
    conn.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&answer));
    let waited = asked.elapsed().as_secs_f64();
    assert!((8.0..30.0).contains(&waited), "answered after {waited:.1} s");
    assert!(std::fs::read_dir(server.data.join("tmp")).unwrap().next().is_none(), "temp file left");
    assert!(server.get_json("/api/v1/snapshots").as_array().unwrap().is_empty());
}

#[test]
pub fn a_restart_serves_every_link_without_parsing_again() {
    let mut server = TestServer::start(&[]);
    let mut ids = Vec::new();
    for name in ["seed_frag_default", "two_devices"] {
        let id = server.upload(&snapshot_path(name))["id"].as_str().unwrap().to_string();
        assert_eq!(server.wait_done(&id)["status"], "ready");
        ids.push(id);
    }
    let before: Vec<Value> =
        ids.iter().map(|id| server.get_json(&format!("/api/v1/snapshots/{id}/analysis"))).collect();
    server.kill();
    let data = server.data.clone();
    let again = TestServer::start_in(&data, &[]);
    for (id, want) in ids.iter().zip(&before) {
        assert_eq!(&again.get_json(&format!("/api/v1/snapshots/{id}/analysis")), want);
        assert_eq!(again.get_json(&format!("/api/v1/snapshots/{id}"))["status"], "ready");
        let t = again.get_json(&format!("/api/v1/snapshots/{id}/devices/0/timeline?points=10"));
        assert!(t["event"].as_array().unwrap().len() > 1);
        let m = again.get_json(&format!("/api/v1/snapshots/{id}/devices/0/state"));
        assert!(!m["segments"].as_array().unwrap().is_empty());
    }
    // An event no result file holds: parsed again on demand, and it works.
    let m = again.get_json(&format!("/api/v1/snapshots/{}/devices/0/state?event=3", ids[0]));
    assert_eq!(m["event"], 3);
}

#[test]
pub fn bad_input_gets_a_4xx_naming_the_problem_and_the_server_keeps_serving() {
    let server = TestServer::start(&[]);
    let cases = [
        ("global_reduce.pickle", 400, "GLOBAL"),
        ("stack_global.pickle", 400, "STACK_GLOBAL"),
        ("huge_length.pickle", 413, "string length"),
        ("deep_nesting.pickle", 413, "nesting depth"),
        ("memo_missing.pickle", 400, "memo index 7"),
        ("gzip_bomb.pickle.gz", 400, "bomb"),
        ("json_wrong_types.json", 422, "segments[0].address"),
        ("json_deep.json", 400, "recursion"),
        ("empty.pickle", 400, "empty"),
        ("random.bin", 415, "byte 0"),
        ("not_a_snapshot.pickle", 422, "segments"),
        ("truncated.pickle", 400, "byte"),
        ("zstd_claims_100gb.pickle.zst", 400, "zstd"),
        ("gigabyte_string.pickle", 413, "string length"),
    ];
    for (file, status, words) in cases {
        let r = TestServer::client()
            .post(server.url("/api/v1/snapshots"))
            .body(std::fs::read(hostile().join(file)).unwrap())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{file}");
        let e: Value = r.json().unwrap();
        assert!(e["error"].is_string() && e["detail"].as_str().unwrap().contains(words), "{file}: {e}");
        assert_eq!(server.get("/api/v1/snapshots").status().as_u16(), 200, "server down after {file}");
    }
    assert!(server.get_json("/api/v1/snapshots").as_array().unwrap().is_empty(), "a refused upload was kept");
    for (path, status) in [
        ("/api/v1/snapshots/nothere", 404),
        ("/api/v1/nothing", 404),
        ("/api/v1/snapshots/0123456789abcdef0123456789abcdef/devices/x/state", 400),
    ] {
        let r = server.get(path);
        assert_eq!(r.status().as_u16(), status, "{path}");
        assert!(r.json::<Value>().unwrap()["detail"].is_string(), "{path}");
    }
}

#[test]
pub fn the_token_guards_uploads_lists_and_deletes_but_not_links() {
    let server = TestServer::start(&["--token", "s3cret"]);
    let c = TestServer::client();
    let body = || std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    let r = c.post(server.url("/api/v1/snapshots")).body(body()).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c.post(server.url("/api/v1/snapshots")).bearer_auth("wrong").body(body()).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c.post(server.url("/api/v1/snapshots")).bearer_auth("s3cret").body(body()).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready", "a link needs no token");
    assert_eq!(server.get(&format!("/api/v1/snapshots/{id}/analysis")).status().as_u16(), 200);
    assert_eq!(server.get("/api/v1/snapshots").status().as_u16(), 401);
    assert_eq!(c.get(server.url("/api/v1/snapshots")).bearer_auth("s3cret").send().unwrap().status().as_u16(), 200);
    let path = server.url(&format!("/api/v1/snapshots/{id}"));
    assert_eq!(c.delete(&path).send().unwrap().status().as_u16(), 401);
    assert_eq!(c.delete(&path).bearer_auth("s3cret").send().unwrap().status().as_u16(), 204);
    assert_eq!(server.get(&format!("/api/v1/snapshots/{id}")).status().as_u16(), 404);
}

#[test]
fn delete_removes_the_blob_the_results_and_the_link() {
    let server = TestServer::start(&[]);
    let created = server.upload(&snapshot_path("seed_frag_default"));
    let id = created["id"].as_str().unwrap();
    let sha = server.wait_done(id)["sha256"].as_str().unwrap().to_string();
    let blob = server.data.join("blobs").join(&sha[..2]).join(&sha);
    let results = server.data.join("results").join(&sha);
    assert!(blob.exists() && results.exists());
    assert_eq!(
        server.delete_with_key(&format!("/api/v1/snapshots/{id}"), created["delete_key"].as_str().unwrap()),
        204
    );
    assert!(!blob.exists() && !results.exists());
    for path in [
        format!("/api/v1/snapshots/{id}"),
        format!("/api/v1/snapshots/{id}/analysis"),
        format!("/api/v1/snapshots/{id}/blob"),
    ] {
        assert_eq!(server.get(&path).status().as_u16(), 404, "{path}");
    }
}

#[test]
pub fn the_api_numbers_equal_the_cli_numbers() {
    let server = TestServer::start(&[]);
    for name in ["seed_frag_default", "two_devices", "ring_truncated", "train_gpt_default"] {
        let path = snapshot_path(name);
        let id = server.upload(&path)["id"].as_str().unwrap().to_string();
        assert_eq!(server.wait_done(&id)["status"], "ready");
        let api = server.get_json(&format!("/api/v1/snapshots/{id}/analysis"));
        assert_eq!(api, analyze_json_with(&path, &["--sha256"]), "{name}: the same document, hash and all");
        let blob = server.get(&format!("/api/v1/snapshots/{id}/blob"));
        assert!(blob.headers()["content-disposition"].to_str().unwrap().starts_with("attachment"));
        assert_eq!(blob.bytes().unwrap().as_ref(), std::fs::read(&path).unwrap().as_slice());
    }
}

#[test]
pub fn views_answer_with_hex_addresses_and_binary_timelines() {
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let base = format!("/api/v1/snapshots/{id}");
    let events = server.get_json(&format!("{base}/devices/0/events?start=1&limit=2"));
    assert_eq!(events["events"].as_array().unwrap().len(), 2);
    assert_eq!(events["events"][0]["index"], 1);
    assert!(events["events"][0]["address"].as_str().unwrap().starts_with("0x"));
    // The map after an event says what that event was.
    let after = server.get_json(&format!("{base}/devices/0/state?event=1"));
    for key in ["action", "address", "size", "call_site"] {
        assert_eq!(after["event_info"][key], events["events"][0][key], "{key}");
    }
    assert!(server.get_json(&format!("{base}/devices/0/state"))["event_info"].is_null());
    let bin =
        TestServer::client().get(server.url(&format!("{base}/devices/0/timeline?points=4&format=bin"))).send().unwrap();
    assert_eq!(bin.headers()["content-type"], "application/octet-stream");
    let bytes = bin.bytes().unwrap();
    let f: Vec<f64> = bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(f.len(), 3 + 4 * 12);
    let json = server.get_json(&format!("{base}/devices/0/timeline?points=4"));
    assert_eq!(f[0] as usize, json["event"].as_array().unwrap().len());
    let reserved_max_json: Vec<f64> =
        json["series"]["reserved_bytes"]["max"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    // Layout: [n, start, end], events, times, then min and max of each series in order.
    assert_eq!(&f[3 + 4 * 3..3 + 4 * 4], reserved_max_json.as_slice());
    let pinners = server.get_json(&format!("{base}/devices/0/pinners?event=30"));
    assert_eq!(pinners["event"], 30);
    assert!(pinners["pinned"]["bytes"].as_u64().unwrap() > 0);
    let stack = server.get_json(&format!("{base}/stacks/{}", events["events"][0]["stack"]));
    assert!(stack["frames"].is_array());
    let ooms = server.get_json(&format!("{base}/ooms"));
    assert_eq!(ooms[0]["ooms"][0]["verdict"], "fragmentation");
    let settings = server.get_json(&format!("{base}/settings"));
    assert!(settings["allocator_settings"].is_object());
    // The chart of active memory is kept by the browser like the timeline: its ETag names the
    // query, and asking again with it gets 304 and no body; another query is another chart.
    let client = TestServer::client();
    let ask = |points: u32, etag: &str| {
        let url = server.url(&format!("{base}/devices/0/active?points={points}&by=site"));
        client.get(url).header("if-none-match", etag).send().unwrap()
    };
    let chart = ask(20, "");
    assert_eq!(chart.status().as_u16(), 200);
    assert!(chart.headers()["cache-control"].to_str().unwrap().contains("max-age"));
    let etag = chart.headers()["etag"].to_str().unwrap().to_string();
    let first: Value = chart.json().unwrap();
    assert!(!first["event"].as_array().unwrap().is_empty(), "{first}");
    let again = ask(20, &etag);
    assert_eq!(again.status().as_u16(), 304);
    assert!(again.bytes().unwrap().is_empty());
    let other = ask(21, &etag);
    assert_eq!(other.status().as_u16(), 200);
    assert_ne!(other.headers()["etag"].to_str().unwrap(), etag);
    let bad = client.get(server.url(&format!("{base}/devices/0/active?start=9&end=3"))).send().unwrap();
    assert_eq!(bad.status().as_u16(), 400);
}

#[test]
fn every_route_is_in_the_openapi_document() {
    let server = TestServer::start(&[]);
    let doc = server.get_json("/api/v1/openapi.json");
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    for route in fragscope::web::api::PATHS {
        assert!(paths.iter().any(|p| p == route), "{route} is not documented");
    }
    for p in paths {
        assert!(fragscope::web::api::PATHS.contains(&p.as_str()), "{p} is documented but not routed");
    }
}

#[test]
fn retention_deletes_snapshots_older_than_the_period() {
    let mut server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    server.kill();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let data = server.data.clone();
    // With a period of 0 days, everything created before now is past it; the first check runs at start.
    let again = TestServer::start_in(&data, &["--retain-days", "0"]);
    let start = std::time::Instant::now();
    while again.get(&format!("/api/v1/snapshots/{id}")).status().as_u16() != 404 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "not deleted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The files go right after the row (the link stops working first).
    while std::fs::read_dir(data.join("results")).unwrap().next().is_some() {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "results not deleted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Each event's compile context and user metadata as python3's pickle reads them ('' and
/// 'N/A' mean unset).
const PY_EXTRAS: &str = r#"
import json, pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
text = lambda v: v if v not in (None, '', 'N/A') else None
print(json.dumps([[text(e.get('compile_context')), text(e.get('user_metadata'))] for e in s['device_traces'][0]]))
"#;

#[test]
fn events_carry_their_compile_context_and_user_metadata() {
    let path = snapshot_path("compiled_train");
    let want = python_json(PY_EXTRAS, &[&path]);
    let want = want.as_array().unwrap();
    assert!(want.iter().any(|x| !x[1].is_null()), "the fixture sets user metadata");
    let server = TestServer::start(&[]);
    let id = server.upload(&path)["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let mut got = Vec::new();
    let mut start = Some(0);
    while let Some(s) = start {
        let page = server.get_json(&format!("/api/v1/snapshots/{id}/devices/0/events?start={s}&limit=1000"));
        for e in page["events"].as_array().unwrap() {
            got.push(serde_json::json!([e["compile_context"], e["user_metadata"]]));
        }
        start = page["next_start"].as_u64();
    }
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "event {i}");
    }
}

/// The modules `path` (under static/js) imports, directly or not, read from the files.
fn imported_modules(path: &str, out: &mut Vec<String>) {
    if out.iter().any(|m| m == path) {
        return;
    }
    out.push(path.to_string());
    let dir = std::path::Path::new(path).parent().unwrap().to_path_buf();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static/js").join(path);
    let text = std::fs::read_to_string(&file).unwrap();
    for line in text.lines().filter(|l| l.starts_with("import ")) {
        let Some(spec) = line.split(" from \"").nth(1).and_then(|s| s.split('"').next()) else { continue };
        let mut parts: Vec<String> = dir.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        for part in spec.split('/') {
            match part {
                "." => {}
                ".." => {
                    parts.pop();
                }
                p => parts.push(p.to_string()),
            }
        }
        imported_modules(&parts.join("/"), out);
    }
}

/// The snapshot page loads its scripts as one file that holds every module snapshot.js imports
/// (one request, not a round of them), and asks for its analysis in its head.
#[test]
fn the_snapshot_page_loads_one_script_with_every_module_and_preloads_its_analysis() {
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let page = server.get(&format!("/s/{id}")).text().unwrap();
    let scripts: Vec<&str> =
        page.split("<script type=\"module\" src=\"").skip(1).map(|s| s.split('"').next().unwrap()).collect();
    assert_eq!(scripts, ["/static/js/snapshot.bundle.js"]);
    let r = server.get(scripts[0]);
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/javascript; charset=utf-8");
    let bundle = r.text().unwrap();
    let mut imported = Vec::new();
    imported_modules("snapshot.js", &mut imported);
    assert!(imported.len() > 5, "{imported:?}");
    for m in &imported {
        assert!(bundle.contains(&format!("// static/js/{m}\n")), "{m} is not in the bundle");
        // Each module is still served on its own, for pages and tests that import it.
        assert_eq!(server.get(&format!("/static/js/{m}")).status().as_u16(), 200, "{m}");
    }
    let head = page.split("</head>").next().unwrap();
    let analysis = format!("<link rel=\"preload\" href=\"/api/v1/snapshots/{id}/analysis\" as=\"fetch\"");
    assert!(head.contains(&analysis), "{head}");
}
