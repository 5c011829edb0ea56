//! The pipeline's direction, held by a cheap check of the sources: every `crate::X` a top-level
//! module names must be in its row of [`ALLOWED`], and every allowed edge points to an earlier
//! stage, so no cycle can form. Adding an edge means adding it here, where a reviewer sees it.

use std::collections::BTreeSet;

/// The stages in data-flow order, each with the modules it may use (all earlier in the list).
const ALLOWED: &[(&str, &[&str])] = &[
    ("units", &[]),
    ("machine", &[]),
    ("config", &[]),
    ("reader", &[]),
    ("snapshot", &["machine", "reader"]),
    ("ingest", &["units", "machine", "reader", "snapshot"]),
    ("replay", &["snapshot"]),
    ("simulate", &["snapshot", "replay"]),
    ("analysis", &["units", "machine", "snapshot", "replay", "simulate"]),
    ("store", &["units", "snapshot", "analysis"]),
    ("service", &["units", "config", "ingest", "snapshot", "replay", "simulate", "analysis", "store"]),
    // The service is web's one door: it re-exports the types web names. `units` and `config`
    // are stage 0, which any stage may use.
    ("web", &["units", "config", "service"]),
    ("cli", &["units", "config", "ingest", "snapshot", "replay", "simulate", "analysis", "web"]),
];

fn sources(module: &str) -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let file = root.join(format!("{module}.rs"));
    let mut out = Vec::new();
    let mut stack = vec![root.join(module)];
    if file.exists() {
        out.push((file.display().to_string(), std::fs::read_to_string(&file).unwrap()));
    }
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && p.file_name().is_some_and(|n| n != "testing.rs") {
                out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    assert!(!out.is_empty(), "no sources for {module}");
    out
}

/// The top-level modules a source names as `crate::X`, outside its tests: unit tests at the
/// bottom of a file (`#[cfg(test)]`) may use the test kit and build what they check with it.
fn uses(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.match_indices("crate::")
        .map(|(i, m)| code[i + m.len()..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect())
        .filter(|s: &String| !s.is_empty())
        .collect()
}

#[test]
fn every_module_uses_only_the_stages_before_it() {
    let mut failures = Vec::new();
    for (module, allowed) in ALLOWED {
        for (path, text) in sources(module) {
            for used in uses(&text) {
                if used != *module && !allowed.contains(&used.as_str()) {
                    failures.push(format!("{path}: {module} uses crate::{used}, not in its row of ALLOWED"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_names_every_module_and_points_only_upstream() {
    let order: Vec<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    for (i, (module, allowed)) in ALLOWED.iter().enumerate() {
        for a in *allowed {
            let j = order.iter().position(|m| m == a).unwrap_or_else(|| panic!("{module}: unknown module {a}"));
            assert!(j < i, "{module} may use {a}, which comes after it in the pipeline");
        }
    }
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let modules = lib.lines().filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("pub(crate) mod ")));
    for line in modules.filter(|m| *m != "testkit;") {
        let name = line.trim_end_matches(';');
        assert!(order.contains(&name), "src/lib.rs declares {name}, which ALLOWED does not list");
    }
}

#[test]
fn the_web_layer_never_reaches_into_the_reader() {
    for (path, text) in sources("web") {
        assert!(!text.contains("reader::"), "{path} uses the reader");
    }
}
