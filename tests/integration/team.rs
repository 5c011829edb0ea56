//! fragscope for a team: the server tests again on PostgreSQL and an S3 server, and three
//! replicas sharing one database and one bucket (see `engines` for how both are started).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::engines::Team;
use super::util::{TestServer, on_team_engines, snapshot_path, synthetic_snapshot};
use super::{hardening, runs, server};

macro_rules! on_team {
    ($($module:ident :: $test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                on_team_engines(super::$module::$test);
            }
        )*
    };
}

/// The same server tests that run on SQLite and the data folder.
mod same_tests {
    use super::*;
    on_team!(
        server::every_upload_form_works_and_the_same_bytes_are_analysed_once_under_their_own_ids,
        server::big_uploads_answer_at_once_and_report_progress,
        server::a_restart_serves_every_link_without_parsing_again,
        server::bad_input_gets_a_4xx_naming_the_problem_and_the_server_keeps_serving,
        server::the_token_guards_uploads_lists_and_deletes_but_not_links,
        server::the_api_numbers_equal_the_cli_numbers,
        server::views_answer_with_hex_addresses_and_binary_timelines,
        runs::a_job_s_ranks_make_one_run_that_names_the_oom_rank,
        runs::form_fields_group_ranks_and_the_same_bytes_twice_are_two_ranks,
        runs::comparing_a_run_and_its_remedy_shows_the_oom_gone_and_the_peak_change,
        // Postgres: each restart is a new replica, which takes the job once the lease runs out.
        hardening::an_analysis_that_dies_twice_is_failed_not_resumed_into_a_crash_loop,
    );
}

fn replica(team: &Team, data: &std::path::Path) -> TestServer {
    let args = team.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestServer::start_with(data, &args, &team.s3.env())
}

/// Files under `dir` whose path names `sha` (a replica's cached blob and results).
fn copies_of(dir: &std::path::Path, sha: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.to_string_lossy().contains(sha) {
                out.push(p.display().to_string());
            } else if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A delete on one replica removes the copies another replica cached while serving the
/// snapshot: the replicas learn of deletes from the database, within seconds.
#[test]
fn a_delete_on_one_replica_removes_the_copies_on_every_other() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (replica(&team, &dir.path().join("a")), replica(&team, &dir.path().join("b")));
    let created = a.upload(&snapshot_path("seed_frag_default"));
    let id = created["id"].as_str().unwrap().to_string();
    let sha = a.wait_done(&id)["sha256"].as_str().unwrap().to_string();
    assert_eq!(b.get(&format!("/api/v1/snapshots/{id}/devices/0/state?event=final")).status().as_u16(), 200);
    assert!(!copies_of(&b.data, &sha).is_empty(), "replica b cached nothing to test with");
    assert_eq!(a.delete_with_key(&format!("/api/v1/snapshots/{id}"), created["delete_key"].as_str().unwrap()), 204);
    let started = std::time::Instant::now();
    while !copies_of(&b.data, &sha).is_empty() {
        assert!(started.elapsed().as_secs() < 20, "b still holds {:?}", copies_of(&b.data, &sha));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(b.get(&format!("/api/v1/snapshots/{id}")).status().as_u16(), 404);
}

#[test]
fn deleting_removes_the_blob_and_results_from_the_bucket() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = replica(&team, &dir.path().join("a"));
    let created = server.upload(&snapshot_path("seed_frag_default"));
    let id = created["id"].as_str().unwrap().to_string();
    let sha = server.wait_done(&id)["sha256"].as_str().unwrap().to_string();
    let blob = team.s3.files(&format!("team/blobs/{}", &sha[..2]));
    let results = team.s3.files(&format!("team/results/{sha}"));
    assert_eq!(blob.len(), 1, "one blob in the bucket: {blob:?}");
    assert!(results.iter().any(|p| p.ends_with("analysis.json")), "{results:?}");
    assert_eq!(
        server.delete_with_key(&format!("/api/v1/snapshots/{id}"), created["delete_key"].as_str().unwrap()),
        204
    );
    assert!(team.s3.files(&format!("team/blobs/{}", &sha[..2])).is_empty(), "blob left in the bucket");
    assert!(team.s3.files(&format!("team/results/{sha}")).is_empty(), "results left in the bucket");
    assert_eq!(server.get(&format!("/api/v1/snapshots/{id}")).status().as_u16(), 404);
}

#[test]
fn readyz_names_the_engine_that_does_not_answer_and_metrics_count_the_work() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = replica(&team, &dir.path().join("a"));
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
    assert_eq!(server.get("/readyz").status().as_u16(), 200);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    assert_eq!(server.metric("fragscope_uploads_total"), 1);
    assert_eq!(server.metric("fragscope_analyses_total{outcome=\"ready\"}"), 1);
    assert_eq!(server.metric("fragscope_snapshots{status=\"ready\"}"), 1);
    assert_eq!(server.metric("fragscope_analyses_queued"), 0);
    let size = std::fs::metadata(snapshot_path("seed_frag_default")).unwrap().len();
    assert_eq!(server.metric("fragscope_stored_bytes"), size);
    // The S3 server goes away: the replica is up but not ready, and says why.
    let Team { pg, s3 } = team;
    drop(s3);
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
    let r = server.get("/readyz");
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.text().unwrap().contains("blob store"), "names the store");
    drop(pg);
    let r = server.get("/readyz");
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.text().unwrap().contains("database"), "names the database");
}

/// Polls through `server` until the snapshot's status is one of `want`.
fn wait_status(server: &TestServer, id: &str, want: &[&str], limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let s = server.get_json(&format!("/api/v1/snapshots/{id}"));
        if want.iter().any(|w| s["status"] == *w) {
            return s;
        }
        assert!(start.elapsed() < limit, "{id} never reached {want:?}: {s}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn three_replicas_share_one_queue_one_bucket_and_every_link() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = |n: &str| dir.path().join(n);

    // The third replica alone takes a big upload and is killed while it analyses it.
    let big = dir.path().join("big.pickle");
    std::fs::write(&big, synthetic_snapshot(2_000_000)).unwrap();
    let mut c = replica(&team, &data("c"));
    let big_id = c.upload(&big)["id"].as_str().unwrap().to_string();
    let s = wait_status(&c, &big_id, &["analyzing", "ready"], Duration::from_secs(60));
    assert_eq!(s["status"], "analyzing", "the analysis finished before the kill: make the upload bigger");
    c.kill();

    // The other two start; once the dead replica's lease runs out one of them finishes the job.
    let a = replica(&team, &data("a"));
    let b = replica(&team, &data("b"));
    let done = wait_status(&a, &big_id, &["ready", "failed"], Duration::from_secs(120));
    assert_eq!(done["status"], "ready", "{done}");

    // Upload through the first, open the link through the second (which has no copy on disk).
    let id = a.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    wait_status(&b, &id, &["ready"], Duration::from_secs(60));
    let via_a = a.get_json(&format!("/api/v1/snapshots/{id}/analysis"));
    let via_b = b.get_json(&format!("/api/v1/snapshots/{id}/analysis"));
    assert_eq!(via_a, via_b);
    assert_eq!(b.get(&format!("/s/{id}")).status().as_u16(), 200);
    let t = b.get_json(&format!("/api/v1/snapshots/{id}/devices/0/timeline?points=10"));
    assert!(t["event"].as_array().unwrap().len() > 1);

    // The same new bytes through two replicas at once: two uploads, one blob, one analysis.
    let file = snapshot_path("two_devices");
    let bytes = std::fs::read(&file).unwrap();
    let ready_before = a.metric("fragscope_analyses_total{outcome=\"ready\"}")
        + b.metric("fragscope_analyses_total{outcome=\"ready\"}");
    let send = |server: &TestServer| {
        let (url, body) = (server.url("/api/v1/snapshots"), bytes.clone());
        std::thread::spawn(move || {
            let r = TestServer::client().post(url).body(body).send().unwrap();
            assert_eq!(r.status().as_u16(), 202);
            r.json::<Value>().unwrap()
        })
    };
    let (ta, tb) = (send(&a), send(&b));
    let (ua, ub) = (ta.join().unwrap(), tb.join().unwrap());
    assert_ne!(ua["id"], ub["id"]);
    let done: Vec<Value> = [(&a, &ua), (&b, &ub)]
        .iter()
        .map(|(server, u)| wait_status(server, u["id"].as_str().unwrap(), &["ready"], Duration::from_secs(60)))
        .collect();
    assert_eq!(done[0]["sha256"], done[1]["sha256"]);
    let sha = done[0]["sha256"].as_str().unwrap().to_string();
    assert_eq!(team.s3.files(&format!("team/blobs/{}", &sha[..2])).len(), 1, "one stored blob");
    let ready_after = a.metric("fragscope_analyses_total{outcome=\"ready\"}")
        + b.metric("fragscope_analyses_total{outcome=\"ready\"}");
    assert_eq!(ready_after - ready_before, 1, "the same bytes were analysed once");

    // All three restart, on fresh disks: every link opens through each.
    let ids = [big_id, id, ua["id"].as_str().unwrap().to_string(), ub["id"].as_str().unwrap().to_string()];
    drop((a, b));
    for name in ["a2", "b2", "c2"] {
        let r = replica(&team, &data(name));
        for id in &ids {
            assert_eq!(r.get_json(&format!("/api/v1/snapshots/{id}"))["status"], "ready", "{name} {id}");
            assert_eq!(r.get(&format!("/api/v1/snapshots/{id}/analysis")).status().as_u16(), 200, "{name} {id}");
            assert_eq!(r.get(&format!("/s/{id}")).status().as_u16(), 200);
        }
    }
}

/// An upload goes to the bucket in parts while it arrives: what lands is the same bytes under
/// their hash, and neither a kept nor a refused upload leaves a staged copy behind.
#[test]
fn uploads_stream_into_the_bucket_and_leave_no_staged_copies() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let args = team.args();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--max-upload", "60MB"]);
    let server = TestServer::start_with(&dir.path().join("a"), &args, &team.s3.env());
    let bytes = synthetic_snapshot(160_000);
    assert!(bytes.len() > 32 << 20 && bytes.len() < 60_000_000, "several 16 MiB parts: {}", bytes.len());
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(bytes.clone()).send().unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    let sha = server.wait_done(&id)["sha256"].as_str().unwrap().to_string();
    let blob: Vec<_> =
        team.s3.files(&format!("team/blobs/{}", &sha[..2])).into_iter().filter(|p| p.ends_with(&sha)).collect();
    assert_eq!(blob.len(), 1, "{blob:?}");
    assert!(std::fs::read(&blob[0]).unwrap() == bytes, "the blob differs from the upload");

    let too_big = synthetic_snapshot(300_000);
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(too_big).send().unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !team.s3.files("team/uploads").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(team.s3.files("team/uploads").is_empty(), "staged copies left: {:?}", team.s3.files("team/uploads"));
}

/// Uploads of bytes whose analysis is finishing at that moment all come ready: none keeps the
/// "analyzing" it copied from the first upload while the outcome was being recorded. Each
/// content is the same snapshot gzipped with its own header time (so its own hash), sent once
/// and then again and again from three threads through its analysis.
#[test]
fn copies_made_while_an_analysis_finishes_come_ready_with_it() {
    let Some(team) = Team::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = replica(&team, &dir.path().join("a"));
    let raw = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    let url = server.url("/api/v1/snapshots");
    let mut ids = Vec::new();
    for mtime in 1..=12u32 {
        let mut gz = flate2::GzBuilder::new().mtime(mtime).write(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        let body = gz.finish().unwrap();
        let first = TestServer::client().post(&url).body(body.clone()).send().unwrap();
        assert_eq!(first.status().as_u16(), 202);
        let first_id = first.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
        let copies: Vec<_> = (0..3)
            .map(|_| {
                let (url, body, server_url) =
                    (url.clone(), body.clone(), server.url(&format!("/api/v1/snapshots/{first_id}")));
                std::thread::spawn(move || {
                    let client = TestServer::client();
                    let mut ids = Vec::new();
                    // Until the first is ready, and a few after.
                    let mut after = 0;
                    while after < 3 && ids.len() < 200 {
                        let r = client.post(&url).body(body.clone()).send().unwrap();
                        assert_eq!(r.status().as_u16(), 202);
                        ids.push(r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string());
                        let s: Value = client.get(&server_url).send().unwrap().json().unwrap();
                        if s["status"] == "ready" {
                            after += 1;
                        }
                    }
                    ids
                })
            })
            .collect();
        ids.push(first_id);
        for t in copies {
            ids.extend(t.join().unwrap());
        }
    }
    for id in &ids {
        wait_status(&server, id, &["ready"], Duration::from_secs(30));
    }
}
