//! What a new user meets first: the CLI's arguments and messages, the page's small parts
//! (an icon, verdict styles, the download's file name).

use std::process::Command;

use crate::util::*;

#[test]
fn devices_are_named_as_people_write_them_and_event_ranges_are_stated_right() {
    let path = snapshot_path("two_devices");
    let out = Command::new(bin()).args(["simulate", "--device", "cuda:1"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(bin()).args(["state", "--device", "1"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(bin()).args(["simulate", "--device", "gpu1"]).arg(&path).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("`cuda:N` or `N`"));
    // seed_frag_default has 31 events: 0 to 30.
    let seed = snapshot_path("seed_frag_default");
    let out = Command::new(bin()).args(["state", "--event", "31"]).arg(&seed).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("0 to 30"), "{err}");
}

#[test]
fn the_icon_exists_verdicts_have_classes_and_downloads_keep_their_format() {
    let server = TestServer::start(&[]);
    let icon = server.get("/favicon.ico");
    assert_eq!(icon.status(), 200);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    let client = TestServer::client();
    let bytes = std::fs::read(snapshot_path("seed_frag_default")).unwrap();
    let r: serde_json::Value =
        client.post(server.url("/api/v1/snapshots?name=run-42")).body(bytes).send().unwrap().json().unwrap();
    let id = r["id"].as_str().unwrap();
    server.wait_done(id);
    let home = server.get("/").text().unwrap();
    assert!(home.contains(r#"class="verdict-fragmentation""#), "one class, no space");
    let blob = server.get(&format!("/api/v1/snapshots/{id}/blob"));
    assert_eq!(blob.headers()["content-disposition"], r#"attachment; filename="run-42.pickle""#);
}

#[test]
fn a_wrong_token_is_told_apart_from_a_missing_one() {
    let server = TestServer::start(&["--token", "s3cret"]);
    let client = TestServer::client();
    let missing: serde_json::Value = client.get(server.url("/api/v1/snapshots")).send().unwrap().json().unwrap();
    assert!(missing["detail"].as_str().unwrap().contains("needs"), "{missing}");
    let wrong = client.get(server.url("/api/v1/snapshots")).bearer_auth("s3creT").send().unwrap();
    assert_eq!(wrong.status(), 401);
    let wrong: serde_json::Value = wrong.json().unwrap();
    assert!(wrong["detail"].as_str().unwrap().contains("not this server's"), "{wrong}");
    let right = client.get(server.url("/api/v1/snapshots")).bearer_auth("s3cret").send().unwrap();
    assert_eq!(right.status(), 200);
}

#[test]
fn a_simulation_names_the_pool_or_buffer_it_tried() {
    let seed = snapshot_path("seed_frag_default");
    for (flag, words) in [
        ("--mempool", "a MemPool around repro/gen_real_snapshots.py:51"),
        ("--reuse", "one buffer reused at repro/gen_real_snapshots.py:51"),
    ] {
        let out =
            Command::new(bin()).args(["simulate", flag, "repro/gen_real_snapshots.py:51"]).arg(&seed).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.lines().next().unwrap_or("").contains(words), "{text}");
    }
}

#[test]
fn a_port_in_use_is_named_with_what_to_do() {
    let server = TestServer::start(&[]);
    let addr = server.url("").trim_start_matches("http://").trim_end_matches('/').to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        {
            let mut c = Command::new(bin());
            c.args(["serve", "--addr", &addr, "--data-dir"]).arg(dir.path());
            c
        },
        std::time::Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second server on {addr} must not start");
    assert!(err.contains(&addr) && err.contains("already in use") && err.contains("--addr"), "{err}");
}

#[test]
fn a_simulation_without_a_budget_takes_the_one_the_oom_implies_and_says_so() {
    // The seed run died under a 6 GiB budget (its truth's cap_bytes) at its trace's OOM.
    let seed = snapshot_path("seed_frag_default");
    let cap = truth("seed_frag_default")["info"]["cap_bytes"].as_u64().unwrap();
    let real_oom = analyze_json(&seed)["devices"][0]["ooms"][0]["event_index"].clone();
    let out = Command::new(bin()).args(["simulate", "--json", "--conf", ""]).arg(&seed).output().unwrap();
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["capacity_source"], "implied");
    assert!(o["capacity_bytes"].as_u64().unwrap() <= cap, "{o}");
    assert_eq!(o["oom"]["event_index"], real_oom, "the default allocator dies where the real run did");
    // A run without an OOM implies no budget, and the text says so.
    let out = Command::new(bin()).arg("simulate").arg(snapshot_path("compiled_train")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("no budget"));
}
