//! A full disk, for real: the server's data folder on a 4 MiB tmpfs (mounting needs root, as
//! CI runs; elsewhere the test says why it skipped). Uploads answer 507 while it is full, links
//! keep opening, and once space is freed uploads work again. The command line's report to a
//! full disk (`/dev/full`) fails by name.

use std::process::Command;

use crate::util::*;

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A tmpfs of `size` on a temp folder, or None (said why) where mounting is not allowed.
fn small_disk(size: &str) -> Option<(tempfile::TempDir, Mount)> {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir.path())
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        assert!(std::env::var("CI").is_err(), "CI runs as root and must mount the small tmpfs");
        skipped("cannot mount a tmpfs here (needs root): the full-disk test did not run");
        return None;
    }
    let mount = Mount(dir.path().to_path_buf());
    Some((dir, mount))
}

/// Fills the disk of `dir`, then frees `leave` bytes of it.
fn fill(dir: &std::path::Path, leave: u64) -> std::path::PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let block = vec![7u8; 4 << 10];
    let mut f = std::fs::File::create(&filler).unwrap();
    while f.write_all(&block).is_ok() {}
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(leave)).unwrap();
    let _ = f.sync_all();
    filler
}

#[test]
fn a_full_disk_answers_507_keeps_links_working_and_recovers() {
    let Some((dir, _mount)) = small_disk("4m") else { return };
    let data = dir.path().join("data");
    let server = TestServer::start_in(&data, &[]);
    let first = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&first)["status"], "ready");
    // Fill what is left.
    let filler = dir.path().join("filler");
    let block = vec![7u8; 64 << 10];
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    let r = TestServer::client()
        .post(server.url("/api/v1/snapshots"))
        .body(std::fs::read(snapshot_path("capacity_oom")).unwrap())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 507, "{:?}", r.text());
    assert!(r.text().unwrap().contains("disk_full"));
    // Reads still work.
    assert_eq!(server.get(&format!("/api/v1/snapshots/{first}/analysis")).status().as_u16(), 200);
    assert_eq!(server.get(&format!("/s/{first}")).status().as_u16(), 200);
    // Space again: uploads work again, and no temp file was left behind.
    std::fs::remove_file(&filler).unwrap();
    let second = server.upload(&snapshot_path("capacity_oom"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&second)["status"], "ready");
    assert_eq!(std::fs::read_dir(data.join("tmp")).unwrap().count(), 0, "temp files left");
}

/// A disk that fills while the database writes (the upload's file fit, its row did not):
/// the failed write must not leave a pooled connection inside its transaction, holding the
/// write lock ("database is locked" for every later write until a restart) and swallowing
/// the uploads answered 202 after it. `/readyz` says the store cannot write while full.
#[test]
fn a_write_that_fills_the_disk_releases_the_database_and_a_202_means_stored() {
    let Some((dir, _mount)) = small_disk("40m") else { return };
    let data = dir.path().join("data");
    let mut server = TestServer::start_in(&data, &[]);
    let first = server.upload(&snapshot_path("ddp_rank0"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&first)["status"], "ready");
    let filler = fill(dir.path(), 24 << 10);
    let small = std::fs::read(snapshot_path("capacity_oom")).unwrap();
    let mut refused = 0;
    for i in 0..6u8 {
        let mut body = small.clone();
        body.extend(std::iter::repeat_n(0u8, i as usize + 1));
        let r = TestServer::client().post(server.url("/api/v1/snapshots")).body(body).send().unwrap();
        assert!([202, 507].contains(&r.status().as_u16()), "{}: {:?}", r.status(), r.text());
        refused += usize::from(r.status().as_u16() == 507);
    }
    assert!(refused > 0, "the disk never filled");
    let ready = server.get("/readyz");
    assert_eq!(ready.status().as_u16(), 503, "readyz with a full disk");
    let why = ready.text().unwrap();
    assert!(why.contains("full"), "{why}");
    std::fs::remove_file(&filler).unwrap();
    let mut answered = Vec::new();
    for name in ["multistream_default", "pending_free", "expandable_unmap", "cudagraph_pool"] {
        let started = std::time::Instant::now();
        let r = TestServer::client()
            .post(server.url("/api/v1/snapshots"))
            .body(std::fs::read(snapshot_path(name)).unwrap())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{name} after the space came back: {:?}", r.text());
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{name} waited on a lock");
        answered.push(r.json::<serde_json::Value>().unwrap()["id"].as_str().unwrap().to_string());
    }
    assert_eq!(server.get("/readyz").status().as_u16(), 200);
    for id in &answered {
        assert_eq!(server.wait_done(id)["status"], "ready");
    }
    // A 202 means stored: every one is there after a restart.
    server.kill();
    let server = TestServer::start_in(&data, &[]);
    for id in answered.iter().chain([&first]) {
        assert_eq!(server.get(&format!("/api/v1/snapshots/{id}")).status().as_u16(), 200, "{id} lost");
    }
}

/// The command line's report goes out through a buffer: a full disk under standard output
/// (`/dev/full`) still fails, exit 1, naming standard output rather than the input file (a
/// buffer flushed only as it is dropped would lose that error and exit 0), for every command
/// that prints (`state` panicked there before, `simulate` exited 0); a reader that closed the
/// pipe is not an error.
#[test]
fn a_report_written_to_a_full_disk_fails_by_name_and_a_closed_pipe_does_not() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        skipped("no /dev/full on this system");
        return;
    };
    let file = snapshot_path("seed_frag_default");
    let commands: [&[&str]; 7] = [
        &["analyze"],
        &["analyze", "--json"],
        &["compare"],
        &["compare", "--json"],
        &["state"],
        &["simulate"],
        &["simulate", "--json"],
    ];
    for args in commands {
        let mut cmd = Command::new(bin());
        cmd.args(args).arg(&file);
        if args[0] == "compare" {
            cmd.arg(&file);
        }
        let out = cmd.stdout(full.try_clone().unwrap()).stderr(std::process::Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot write the report to standard output"), "{args:?}: {stderr}");
        assert!(!stderr.contains("could not read"), "{args:?}: the input was read: {stderr}");
    }
    // A reader gone before the report is written (`| head` that has had its lines): the
    // write meets a closed pipe. The child reads and analyses first, for milliseconds; the pipe
    // is closed at once.
    let mut child = Command::new(bin())
        .args(["analyze", "--json"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "a closed pipe: {}", String::from_utf8_lossy(&out.stderr));
}
