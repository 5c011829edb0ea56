//! The notebook client (examples/notebook.py) against a real server, as a user runs it.

use std::process::Command;
use std::time::Duration;

use crate::util::*;

fn has_pandas() -> bool {
    Command::new("python3")
        .args(["-c", "import requests, pandas"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn the_notebook_uploads_waits_and_loads_dataframes() {
    if !has_pandas() {
        // CI installs them (.ci/run); elsewhere say why this did not run.
        assert!(std::env::var("CI").is_err(), "CI must have requests and pandas for the notebook test");
        skipped("python3 lacks requests or pandas (pip install requests pandas)");
        return;
    }
    let server = TestServer::start(&[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/notebook.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).args(["--url", &server.base, "--file"]).arg(snapshot_path("seed_frag_default"));
    let out = run_bounded(cmd, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("verdict: fragmentation"), "{text}");
    let id =
        text.lines().find_map(|l| l.strip_prefix("page: ")).and_then(|u| u.rsplit('/').next()).unwrap().to_string();
    let events =
        server.get_json(&format!("/api/v1/snapshots/{id}/analysis"))["devices"][0]["trace"]["events"].as_u64().unwrap();
    assert!(text.contains(&format!("timeline: {events} rows")), "{text}");
    assert!(text.contains("pinners: 1 rows"), "{text}");
    // Each remedy with its effect (#30: "fixes" only where the step fits).
    assert!(text.contains("mempool (fixes)"), "{text}");
}

#[test]
fn the_ipynb_holds_the_same_cells_as_the_script() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let script = std::fs::read_to_string(root.join("notebook.py")).unwrap();
    let nb: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("notebook.ipynb")).unwrap()).unwrap();
    let cells: Vec<String> = nb["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cell_type"] == "code")
        .map(|c| c["source"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect())
        .collect();
    let want: Vec<String> = script.split("# %%\n").skip(1).map(|c| c.trim_end_matches('\n').to_string()).collect();
    assert_eq!(cells, want, "regenerate notebook.ipynb from notebook.py");
}
