//! The page's pure data modules (static/js/data), tested with node's own test runner.

use std::process::Command;
use std::time::Duration;

use crate::util::run_bounded;

#[test]
fn the_page_data_modules_pass_their_node_tests() {
    if Command::new("node").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "CI must have node");
        crate::util::skipped("node is not installed");
        return;
    }
    let mut cmd = Command::new("node");
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(["--test", "tests/js/"]);
    let out = run_bounded(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("# fail 0") && !text.contains("# pass 0"), "{text}");
}
