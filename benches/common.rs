//! What the benchmarks share: the real big snapshot they measure on.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The unpacked big_trace snapshot (243 MiB, 3,000,000 events), from `$FRAGSCOPE_BIG_TRACE` or
/// unpacked once from `../shared/fixtures/real/big_trace.pickle.xz`; None if neither exists.
pub fn big_trace() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("FRAGSCOPE_BIG_TRACE") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let xz = root.join("../shared/fixtures/real/big_trace.pickle.xz");
    if !xz.exists() {
        return None;
    }
    let dir = root.join("target/bench-data");
    let out = dir.join("big_trace.pickle");
    if !out.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join("big_trace.pickle.part");
        let file = std::fs::File::create(&tmp).unwrap();
        let ok = Command::new("xz").args(["-dc"]).arg(&xz).stdout(file).status().expect("xz").success();
        assert!(ok, "xz failed");
        std::fs::rename(&tmp, &out).unwrap();
    }
    Some(out)
}
