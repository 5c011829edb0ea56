//! The Python client (clients/python) against the real server: its own unittest suite, run
//! with the server's URL and the fixtures. Needs only python3 (pandas is optional).

use std::process::Command;
use std::time::Duration;

use crate::util::*;

#[test]
fn the_python_client_passes_its_tests_against_the_real_server() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "CI must have python3");
        skipped("python3 is not installed");
        return;
    }
    let server = TestServer::start(&[]);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.current_dir(root.join("clients/python"))
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .env("PYTHONPATH", root.join("clients/python"))
        .env("FRAGSCOPE_TEST_URL", &server.base)
        .env("FRAGSCOPE_FIXTURES", fixtures());
    let out = run_bounded(cmd, Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stdout));
    assert!(text.contains("Ran 13 tests") && text.contains("\nOK"), "{text}");
    assert!(!text.contains("skipped 'FRAGSCOPE_TEST_URL"), "{text}");
}
