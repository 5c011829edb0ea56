//! Shared helpers: fixture paths, running the real binary, and python3 as an independent oracle.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn hostile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile")
}

/// Names of the real fixtures that have a truth file, sorted.
pub fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.strip_suffix(".truth.json").map(String::from))
        .collect();
    names.sort();
    assert!(names.len() >= 17, "fixtures missing: {names:?}");
    names
}

/// The snapshot file of a fixture (some are committed zstd-compressed to keep the repo lean).
pub fn snapshot_path(name: &str) -> PathBuf {
    let plain = fixtures().join(format!("{name}.pickle"));
    if plain.exists() { plain } else { fixtures().join(format!("{name}.pickle.zst")) }
}

/// The fixture as a plain pickle on disk (decompressed into `dir` if need be), for python3.
pub fn plain_pickle(name: &str, dir: &Path) -> PathBuf {
    let path = snapshot_path(name);
    if path.extension().is_some_and(|e| e == "pickle") {
        return path;
    }
    let out = dir.join(format!("{name}.pickle"));
    let data = zstd::decode_all(std::fs::File::open(&path).unwrap()).unwrap();
    std::fs::write(&out, data).unwrap();
    out
}

pub fn truth(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.truth.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fragscope")
}

/// Runs a command to its end, or kills it after `limit` and says so: a hang guard, not a timing.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("{cmd:?} still running after {limit:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fragscope analyze --json FILE`, parsed.
pub fn analyze_json(path: &Path) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.args(["analyze", "--json"]).arg(path);
    let out = run_bounded(cmd, Duration::from_secs(120));
    assert!(out.status.success(), "analyze {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("analyze --json prints JSON")
}

/// Runs a python3 script with arguments and returns its stdout as JSON.
pub fn python_json(script: &str, args: &[&Path]) -> serde_json::Value {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script).args(args);
    let out = run_bounded(cmd, Duration::from_secs(300));
    assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Field-by-field differences between two JSON values, as readable lines.
pub fn json_diff(path: &str, want: &serde_json::Value, got: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value::Object;
    match (want, got) {
        (Object(w), Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => json_diff(&format!("{path}.{k}"), wv, gv, out),
                    None => out.push(format!("{path}.{k}: missing, want {wv}")),
                }
            }
        }
        _ if want != got => out.push(format!("{path}: want {want}, got {got}")),
        _ => {}
    }
}
