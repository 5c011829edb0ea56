//! A full disk, for real: the server's data folder on a 4 MiB tmpfs (mounting needs root, as
//! CI runs; elsewhere the test says why it skipped). Uploads answer 507 while it is full, links
//! keep opening, and once space is freed uploads work again.

use std::process::Command;

use crate::util::*;

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_answers_507_keeps_links_working_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(dir.path())
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        assert!(std::env::var("CI").is_err(), "CI runs as root and must mount the small tmpfs");
        skipped("cannot mount a tmpfs here (needs root): the full-disk test did not run");
        return;
    }
    let _mount = Mount(dir.path().to_path_buf());
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
