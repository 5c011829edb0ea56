//! Runs of many ranks and comparisons, through the real server: a job's ranks grouped by
//! their run key, the OOM rank named, a run deleted whole; two snapshots compared.

use std::path::PathBuf;

use reqwest::blocking::multipart;
use serde_json::Value;

use crate::util::*;

fn ranks3(rank: u32) -> (PathBuf, Value) {
    let dir = fixtures().join("categories");
    let truth = std::fs::read_to_string(dir.join(format!("ranks3_rank{rank}.truth.json"))).unwrap();
    (dir.join(format!("ranks3_rank{rank}.pickle.zst")), serde_json::from_str(&truth).unwrap())
}

fn upload_to(server: &TestServer, file: &std::path::Path, query: &str) -> Value {
    let r = TestServer::client()
        .post(server.url(&format!("/api/v1/snapshots?{query}")))
        .body(std::fs::read(file).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.text());
    r.json().unwrap()
}

fn wait_run(server: &TestServer, id: &str, ranks: u64) -> Value {
    let start = std::time::Instant::now();
    loop {
        let run = server.get_json(&format!("/api/v1/runs/{id}"));
        if run["summary"]["ready"] == ranks {
            return run;
        }
        assert!(start.elapsed().as_secs() < 120, "run never ready: {run}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
pub fn a_job_s_ranks_make_one_run_that_names_the_oom_rank() {
    let server = TestServer::start(&[]);
    let mut run_id = None;
    let mut truths = Vec::new();
    let mut keys = Vec::new();
    for rank in [2, 0, 1] {
        let (path, truth) = ranks3(rank);
        let created = upload_to(&server, &path, &format!("run=job-4711&rank={rank}"));
        assert_eq!(created["run"]["started"], rank == 2, "the first upload starts the run");
        keys.push(created["delete_key"].as_str().unwrap().to_string());
        let id = created["run"]["id"].as_str().unwrap().to_string();
        assert_eq!(created["run"]["page_url"], format!("/r/{id}"));
        assert_eq!(run_id.get_or_insert(id.clone()), &id, "every rank joins the same run");
        truths.push((rank, truth));
    }
    let run_id = run_id.unwrap();
    assert_ne!(run_id, "job-4711", "the run key never opens anything: the run has its own id");
    let run = wait_run(&server, &run_id, 3);
    assert_eq!(run["name"], "job-4711");
    let ranks = run["ranks"].as_array().unwrap();
    assert_eq!(ranks.iter().map(|r| r["rank"].as_i64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    // Truth: which ranks ran out of memory, and which peaked highest.
    truths.sort_by_key(|(r, _)| *r);
    let ooms: Vec<i64> = truths
        .iter()
        .filter(|(_, t)| t["memory_stats"]["num_ooms"].as_i64().unwrap() > 0)
        .map(|(r, _)| *r as i64)
        .collect();
    assert_eq!(run["summary"]["oom_ranks"], serde_json::json!(ooms));
    assert_eq!(ooms, vec![1]);
    let peaks: Vec<u64> =
        truths.iter().map(|(_, t)| t["memory_stats"]["reserved_bytes.all.peak"].as_u64().unwrap()).collect();
    let max_rank = peaks.iter().enumerate().max_by_key(|(_, p)| **p).unwrap().0 as i64;
    assert_eq!(run["summary"]["peak_reserved_bytes"]["rank_of_max"], max_rank);
    for (r, peak) in ranks.iter().zip(&peaks) {
        assert_eq!(r["peak_reserved_bytes"].as_u64().unwrap(), *peak, "rank {}", r["rank"]);
        assert_eq!(r["status"], "ready");
        assert_eq!(r["page_url"], format!("/s/{}", r["snapshot_id"].as_str().unwrap()));
    }
    assert_eq!(ranks[1]["oom"], true);
    assert!(ranks[1]["verdict"].is_string() && ranks[1]["verdict"] != "no_oom", "{}", ranks[1]);
    assert_eq!(ranks[1]["largest_category"], "activation");
    let imbalance = run["summary"]["imbalance"].as_f64().unwrap();
    let want = *peaks.iter().max().unwrap() as f64 / *peaks.iter().min().unwrap() as f64;
    assert!((imbalance - want).abs() < 1e-9, "{imbalance} vs {want}");

    // Why rank 1: its generator fed it batches twice the others' (tests/fixtures/README.md).
    let why = &run["summary"]["divergence"];
    assert_eq!((why["rank"].as_i64(), why["picked"].as_str()), (Some(1), Some("oom")), "{why}");
    assert_ne!(why["median_rank"], 1);
    let ratio = why["size_ratio"].as_f64().unwrap();
    assert!((1.8..=2.2).contains(&ratio), "a batch twice as large: {ratio}");
    assert_eq!(why["categories"][0]["category"], "activation", "{why}");
    assert!(why["categories"][0]["delta"].as_i64().unwrap() > 1 << 30, "{why}");
    let sentence = why["sentence"].as_str().unwrap();
    assert!(
        sentence.starts_with("Rank 1 held ") && sentence.contains("activation") && sentence.contains("2.0x"),
        "{sentence}"
    );
    let site = why["call_sites"][0]["call_site"].as_str().unwrap();
    assert!(site.contains("gen_category_snapshots.py:"), "{site}");
    let compare = why["compare_url"].as_str().unwrap();
    assert_eq!(server.get(compare).status().as_u16(), 200, "{compare}");
    let list = server.get_json("/api/v1/runs");
    assert!(list[0]["summary"].get("divergence").is_none(), "a list of runs reads no analysis");

    // The run's page and the curves its overlay draws: one request for all ranks.
    let page = server.get(&format!("/r/{run_id}"));
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().unwrap().contains("job-4711"));
    let ids: Vec<&str> = ranks.iter().map(|r| r["snapshot_id"].as_str().unwrap()).collect();
    let curves = server.get(&format!("/api/v1/curves?ids={}&points=100", ids.join(","))).bytes().unwrap();
    assert_eq!(curves.len(), 8 + 3 * 100 * 2 * 4);
    let max_of = |c: usize| {
        (0..100)
            .map(|i| f32::from_le_bytes(curves[8 + (c * 200 + i) * 4..][..4].try_into().unwrap()))
            .fold(0f32, f32::max)
    };
    for (c, peak) in peaks.iter().enumerate() {
        assert!((max_of(c) as f64 - *peak as f64).abs() / (*peak as f64) < 1e-6, "curve {c} peaks at its peak");
    }

    // Listed, then deleted whole: its snapshots go with it.
    let list = server.get_json("/api/v1/runs");
    assert!(list.as_array().unwrap().iter().any(|r| r["id"] == run_id.as_str()));
    // Only the key of the upload that started the run deletes it (no token on this server).
    let path = format!("/api/v1/runs/{run_id}");
    assert_eq!(TestServer::client().delete(server.url(&path)).send().unwrap().status().as_u16(), 403);
    assert_eq!(server.delete_with_key(&path, &keys[1]), 403, "another rank's key");
    assert_eq!(server.delete_with_key(&path, &keys[0]), 204);
    assert_eq!(server.get(&format!("/api/v1/runs/{run_id}")).status().as_u16(), 404);
    for id in ids {
        assert_eq!(server.get(&format!("/api/v1/snapshots/{id}")).status().as_u16(), 404);
    }
}

#[test]
pub fn form_fields_group_ranks_and_the_same_bytes_twice_are_two_ranks() {
    let server = TestServer::start(&[]);
    let client = TestServer::client();
    let mut ids = Vec::new();
    let mut run = String::new();
    // The same file as two ranks: each upload has its own id, the bytes are analysed once.
    for (rank, name) in [(0, "ddp_rank0"), (1, "ddp_rank1"), (2, "ddp_rank1")] {
        let form = multipart::Form::new()
            .text("run", "ddp-job")
            .text("rank", rank.to_string())
            .file("file", snapshot_path(name))
            .unwrap();
        let r = client.post(server.url("/api/v1/snapshots")).multipart(form).send().unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let created: Value = r.json().unwrap();
        run = created["run"]["id"].as_str().unwrap().to_string();
        ids.push(created["id"].as_str().unwrap().to_string());
    }
    assert_ne!(ids[1], ids[2]);
    let view = wait_run(&server, &run, 3);
    let peaks: Vec<u64> =
        view["ranks"].as_array().unwrap().iter().map(|r| r["peak_reserved_bytes"].as_u64().unwrap()).collect();
    let truth1 = truth("ddp_rank1")["memory_stats"]["reserved_bytes.all.peak"].as_u64().unwrap();
    assert_eq!(peaks[1], truth1);
    assert_eq!(peaks[2], truth1);
    assert_eq!(view["summary"]["oom_ranks"], serde_json::json!([]));
    // A rank that is not a number is refused, naming it.
    let r = client
        .post(server.url("/api/v1/snapshots?run=x&rank=first"))
        .body(std::fs::read(snapshot_path("ddp_rank0")).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().unwrap().contains("rank"));
}

#[test]
pub fn comparing_a_run_and_its_remedy_shows_the_oom_gone_and_the_peak_change() {
    let server = TestServer::start(&[]);
    let a = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    let b = server.upload(&snapshot_path("seed_frag_expandable"))["id"].as_str().unwrap().to_string();
    server.wait_done(&a);
    server.wait_done(&b);
    let c = server.get_json(&format!("/api/v1/compare?a={a}&b={b}"));
    let d = &c["devices"][0];
    let (ta, tb) = (truth("seed_frag_default"), truth("seed_frag_expandable"));
    let peak = |t: &Value| t["memory_stats"]["reserved_bytes.all.peak"].as_i64().unwrap();
    assert_eq!(d["peak_reserved_bytes"]["a"].as_i64().unwrap(), peak(&ta));
    assert_eq!(d["peak_reserved_bytes"]["b"].as_i64().unwrap(), peak(&tb));
    assert_eq!(d["peak_reserved_bytes"]["delta"].as_i64().unwrap(), peak(&tb) - peak(&ta));
    assert_eq!(d["oom"]["a"], ta["memory_stats"]["num_ooms"].as_i64().unwrap() > 0);
    assert_eq!(d["oom"]["b"], false);
    assert_eq!(d["verdict"]["b"], "no_oom");
    let changed: Vec<&str> = c["settings"]["changed"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(changed.contains(&"expandable_segments"), "{changed:?}");
    // The CLI gives the same document from the files.
    let out = std::process::Command::new(bin())
        .args(["compare", "--json"])
        .arg(snapshot_path("seed_frag_default"))
        .arg(snapshot_path("seed_frag_expandable"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli, c);
    // The page.
    let page = server.get(&format!("/compare/{a}/{b}"));
    assert_eq!(page.status().as_u16(), 200);
    assert_eq!(server.get(&format!("/api/v1/compare?a={a}&b=0123")).status().as_u16(), 404);
}

/// By step, a run that died in step 4 is drawn over the first 4 of the 12 steps the other ran,
/// not stretched over the whole axis (truth: `info.steps_survived`).
#[test]
fn curves_by_step_end_where_the_shorter_run_stopped() {
    let server = TestServer::start(&[]);
    let mut ids = Vec::new();
    let mut truths = Vec::new();
    for rank in [0, 1] {
        let (path, truth) = ranks3(rank);
        let id = upload_to(&server, &path, "")["id"].as_str().unwrap().to_string();
        server.wait_done(&id);
        ids.push(id);
        truths.push(truth);
    }
    let steps = |t: &Value| t["info"]["steps_survived"].as_u64().unwrap() + t["info"]["oom"].is_string() as u64;
    let (full, short) = (steps(&truths[0]), steps(&truths[1]));
    assert_eq!((full, short), (12, 4), "rank 1 died in its fourth step");
    let r = server.get(&format!("/api/v1/curves?ids={}&points=120&x=step", ids.join(",")));
    assert_eq!(r.headers()["x-fragscope-axis"], format!("steps={full}").as_str());
    let b = r.bytes().unwrap();
    let value = |c: usize, i: usize| f32::from_le_bytes(b[8 + (c * 240 + i) * 4..][..4].try_into().unwrap());
    let drawn = |c: usize| (0..120).filter(|i| !value(c, *i).is_nan()).count();
    assert_eq!(drawn(0), 120, "the longer run spans the axis");
    let want = 120 * short as usize / full as usize;
    assert!(
        drawn(1).abs_diff(want) <= 2,
        "rank 1 stops at step {short} of {full}: {} of 120 points, want {want}",
        drawn(1)
    );
    let peak = truths[1]["memory_stats"]["reserved_bytes.all.peak"].as_f64().unwrap();
    let max = (0..120).map(|i| value(1, i)).filter(|v| !v.is_nan()).fold(0f32, f32::max) as f64;
    assert!((max - peak).abs() / peak < 1e-6, "{max} vs {peak}");
    // The default axis stays the share of events, and an unknown one is refused by name.
    let r = server.get(&format!("/api/v1/curves?ids={}&points=120", ids.join(",")));
    assert_eq!(r.headers()["x-fragscope-axis"], "share");
    let r = server.get(&format!("/api/v1/curves?ids={}&x=time", ids.join(",")));
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().unwrap().contains("x: `step` or `share`"));
}

/// Knowing a job id is not a capability (an open server, no token): a stranger's upload for a
/// rank already present does not replace it, and neither the stranger's key nor none deletes
/// the run or another uploader's snapshot.
#[test]
fn a_stranger_who_knows_the_job_id_cannot_replace_a_rank_or_delete_the_run() {
    let server = TestServer::start(&[]);
    let owner = upload_to(&server, &ranks3(0).0, "run=12345&rank=0");
    let honest = upload_to(&server, &ranks3(1).0, "run=12345&rank=1");
    let run_id = owner["run"]["id"].as_str().unwrap().to_string();
    let forged = upload_to(&server, &snapshot_path("seed_frag_default"), "run=12345&rank=1");
    assert_eq!(forged["run"]["id"], run_id.as_str());
    assert_eq!(forged["run"]["started"], false);
    let run = wait_run(&server, &run_id, 2);
    let ranks = run["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{run}");
    assert_eq!(ranks[1]["snapshot_id"], honest["id"], "rank 1 keeps its first upload");
    let later = run["later_uploads"].as_array().unwrap();
    assert_eq!(later.len(), 1);
    assert_eq!((later[0]["rank"].as_i64(), &later[0]["snapshot_id"]), (Some(1), &forged["id"]));
    let stranger = forged["delete_key"].as_str().unwrap();
    assert_eq!(server.delete_with_key(&format!("/api/v1/runs/{run_id}"), stranger), 403);
    assert_eq!(server.delete_with_key(&format!("/api/v1/snapshots/{}", honest["id"].as_str().unwrap()), stranger), 403);
    assert_eq!(server.get(&format!("/api/v1/runs/{run_id}")).status().as_u16(), 200);
    // The stranger may delete what the stranger uploaded; the run's page says nothing was hidden.
    assert_eq!(server.delete_with_key(&format!("/api/v1/snapshots/{}", forged["id"].as_str().unwrap()), stranger), 204);
    assert!(server.get_json(&format!("/api/v1/runs/{run_id}"))["later_uploads"].as_array().unwrap().is_empty());
}

/// An upload without a rank takes the lowest rank no upload named, not the one after the
/// highest; a rank past any job is refused by name.
#[test]
fn an_upload_without_a_rank_takes_the_lowest_free_rank() {
    let server = TestServer::start(&[]);
    let created = upload_to(&server, &ranks3(0).0, "run=job-9&rank=65535");
    let run_id = created["run"]["id"].as_str().unwrap().to_string();
    upload_to(&server, &ranks3(1).0, "run=job-9");
    let run = wait_run(&server, &run_id, 2);
    let ranks: Vec<i64> = run["ranks"].as_array().unwrap().iter().map(|r| r["rank"].as_i64().unwrap()).collect();
    assert_eq!(ranks, vec![0, 65535]);
    let r = TestServer::client()
        .post(server.url("/api/v1/snapshots?run=job-9&rank=1000000"))
        .body(std::fs::read(ranks3(2).0).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().unwrap().contains("from 0 to 65535"));
}

/// An upload into a run while the run is being deleted either lands before the delete (and
/// goes with the run) or starts a new run under the same key: never an upload whose run is gone.
#[test]
fn an_upload_racing_the_delete_of_its_run_is_never_left_in_a_deleted_run() {
    let server = TestServer::start(&[]);
    let bytes = std::fs::read(snapshot_path("capacity_oom")).unwrap();
    for round in 0..20 {
        let key = format!("race-{round}");
        let first = upload_to(&server, &snapshot_path("seed_frag_default"), &format!("run={key}&rank=0"));
        let run_id = first["run"]["id"].as_str().unwrap().to_string();
        let delete_key = first["delete_key"].as_str().unwrap().to_string();
        let url = server.url(&format!("/api/v1/runs/{run_id}"));
        let deleter = std::thread::spawn(move || {
            TestServer::client().delete(url).header("x-fragscope-key", delete_key).send().unwrap().status().as_u16()
        });
        let mut body = bytes.clone();
        body.extend(format!("{round:>8}").bytes().map(|_| 0u8));
        let r = TestServer::client()
            .post(server.url(&format!("/api/v1/snapshots?run={key}&rank=1")))
            .body(body)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let created: Value = r.json().unwrap();
        assert_eq!(deleter.join().unwrap(), 204);
        let id = created["id"].as_str().unwrap();
        let its_run = created["run"]["id"].as_str().unwrap();
        let snapshot = server.get(&format!("/api/v1/snapshots/{id}")).status().as_u16();
        let run = server.get(&format!("/api/v1/runs/{its_run}"));
        if snapshot == 200 {
            assert_eq!(run.status().as_u16(), 200, "round {round}: the upload's run {its_run} is gone");
            let run: Value = run.json().unwrap();
            assert!(run.to_string().contains(id), "round {round}: the run does not list the upload");
        } else {
            assert_eq!((snapshot, its_run), (404, run_id.as_str()), "round {round}: only a deleted run takes it");
        }
    }
}
