//! The reader's fast path for trace entries (`src/reader/pickle/entry.rs`) against its general
//! machine: on every fixture, on the same snapshots pickled at every protocol, on mutated
//! bytes and under tight limits, both read the same model or fail with the same message.
//! The fast path must also really run: it reads nearly every entry of a real snapshot.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use fragscope::ingest::{Options, ingest};

use crate::reader_props::{mutated, seed, tight_limits};

/// The model (or the error) a read ends with, as text, and the dicts the fast path read.
fn read(bytes: &[u8], fast: bool, tighten: &dyn Fn(&mut Options)) -> (String, u64, usize) {
    let mut options = Options::default();
    tighten(&mut options);
    options.limits.entry_fast_path = fast;
    match ingest(Cursor::new(bytes.to_vec()), &options) {
        Ok(i) => (format!("{}\n{:?}", i.snapshot.canonical_text(), i.source), i.fast_dicts, i.snapshot.events.len()),
        Err(e) => (format!("error: {e}"), 0, 0),
    }
}

/// Reads `bytes` both ways and fails, naming the first line that differs, unless they agree.
/// Returns the dicts the fast path read and the events read.
fn same(what: &str, bytes: &[u8], tighten: &dyn Fn(&mut Options)) -> (u64, usize) {
    let (fast, dicts, events) = read(bytes, true, tighten);
    let (general, none, _) = read(bytes, false, tighten);
    assert_eq!(none, 0, "{what}: the fast path ran while switched off");
    if fast != general {
        let line = fast.lines().zip(general.lines()).position(|(a, b)| a != b).unwrap_or(0);
        let at = |s: &str| s.lines().skip(line.saturating_sub(2)).take(5).collect::<Vec<_>>().join("\n");
        panic!("{what}: the paths differ at line {line}\nfast:\n{}\ngeneral:\n{}", at(&fast), at(&general));
    }
    (dicts, events)
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| !p.to_string_lossy().ends_with(".json") && !p.to_string_lossy().ends_with(".py") && p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn every_fixture_reads_the_same_through_both_paths_and_mostly_fast() {
    let root = crate::util::fixtures();
    let mut checked = 0;
    for path in files(&root).into_iter().chain(files(&root.join("categories"))) {
        let bytes = std::fs::read(&path).unwrap();
        let (dicts, events) = same(&path.display().to_string(), &bytes, &|_| {});
        // Nearly every entry takes the fast path: not those whose frames are new (torch.compile
        // and first steps make many), nor the first few (whose keys are new).
        if events > 100 {
            assert!(dicts as f64 >= 0.85 * events as f64, "{}: {dicts} fast of {events} events", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 25, "{checked} fixtures");
}

#[test]
fn hostile_files_fail_the_same_through_both_paths() {
    for path in files(&crate::util::hostile()) {
        same(&path.display().to_string(), &std::fs::read(&path).unwrap(), &|_| {});
    }
}

/// A frames list the fast path folded, got from the memo and nested in tuples by the general
/// machine (a fuzzed file): its depth counts as a fold's on both paths, so the nesting limit
/// is met at the same opcode. The `fast_path` fuzz target found them two opcodes apart.
#[test]
fn a_folded_value_nested_again_meets_the_depth_limit_at_the_same_opcode() {
    let bytes = std::fs::read(crate::util::fixtures().join("fast_path/folded_nested.pickle")).unwrap();
    same("a folded value nested again", &bytes, &|o| o.limits.max_depth = 12);
}

/// Dicts with a key twice (the last pair wins, as in Python) and with a key no entry has
/// (ignored): the fast path sorts values into the sink's fields as it reads them, and must
/// end as the general machine does and as Python's loader does
/// (`fast_path/make_repeated_keys.py` made them, with Python's reading as the truth).
#[test]
fn a_repeated_key_reads_as_python_reads_it_through_both_paths() {
    let dir = crate::util::fixtures().join("fast_path");
    let bytes = std::fs::read(dir.join("repeated_keys.pickle")).unwrap();
    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("repeated_keys.truth.json")).unwrap()).unwrap();
    let (dicts, events) = same("repeated keys", &bytes, &|_| {});
    assert_eq!(events as u64, truth["events"].as_u64().unwrap());
    assert!(dicts as f64 >= 0.9 * events as f64, "{dicts} fast of {events} events");
    for fast in [true, false] {
        let mut options = Options::default();
        options.limits.entry_fast_path = fast;
        let read = ingest(Cursor::new(bytes.clone()), &options).unwrap();
        for (i, size) in truth["sizes"].as_object().unwrap() {
            let event = &read.snapshot.events[i.parse::<usize>().unwrap()];
            let got = event.size;
            assert_eq!(got, size.as_u64().unwrap(), "entry {i}, fast path {fast}");
        }
    }
}

#[test]
fn external_snapshots_read_the_same_through_both_paths() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/external");
    if !dir.is_dir() {
        crate::util::skipped("../shared/fixtures/external is not beside this checkout");
        return;
    }
    let all = files(&dir);
    assert!(all.len() >= 33, "{} external files", all.len());
    for path in all {
        same(&path.display().to_string(), &std::fs::read(&path).unwrap(), &|_| {});
    }
}

/// Python's pickler at protocols 2 and 3 memoizes with BINPUT / LONG_BINPUT and writes
/// strings as BINUNICODE, at 4 and 5 with MEMOIZE and SHORT_BINUNICODE, and frames at 4 and up:
/// the fast path takes all of them, and agrees with the general machine on each.
#[test]
fn every_pickle_protocol_reads_the_same_and_fast() {
    let dir = tempfile::tempdir().unwrap();
    let source = crate::util::snapshot_path("ddp_rank0");
    let script = "import pickle,sys\nd=pickle.load(open(sys.argv[1],'rb'))\nfor p in (2,3,4,5):\n    pickle.dump(d, open(f'{sys.argv[2]}/p{p}.pickle','wb'), protocol=p)\n";
    let ok = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&source)
        .arg(dir.path())
        .status()
        .expect("python3 runs");
    assert!(ok.success());
    for p in 2..=5 {
        let bytes = std::fs::read(dir.path().join(format!("p{p}.pickle"))).unwrap();
        let (dicts, events) = same(&format!("protocol {p}"), &bytes, &|_| {});
        assert!(events > 1000 && dicts as f64 >= 0.98 * events as f64, "protocol {p}: {dicts} fast of {events}");
    }
}

/// Python pickles a list of one item as `EMPTY_LIST put get APPEND`, not with MARK and
/// APPENDS: an allocation with a one-frame python stack (most of a real training trace's
/// frees). The fast path reads those entries too, folding the list where the general machine
/// does, at the dict's SETITEMS; a dict with a second list, before or after, agrees as well.
/// Python's own reading of each entry's innermost line is the truth.
#[test]
fn a_one_frame_stack_reads_fast_and_as_python_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import json, pickle, pickletools, sys
frames = [{"filename": "train.py", "line": i, "name": f"f{i % 7}"} for i in range(40)]
entries = []
for i in range(3000):
    k = i % 5
    fs = [] if k == 0 else [frames[i % 40]] if k < 3 else [frames[i % 40], frames[(i + 1) % 40]]
    if i % 97 == 0:
        fs = [{"filename": "new.py", "line": 1000 + i, "name": "fresh"}]
    e = {"action": "alloc" if i % 2 == 0 else "free_completed", "addr": 0x7F0000000000 + 512 * (i // 2),
         "size": 512, "stream": 0, "time_us": i, "frames": list(fs)}
    if i % 250 == 3:
        e["extra"] = [frames[2]]
    if i % 250 == 4:
        e = dict([("extra", [frames[3]])] + list(e.items()))
    entries.append(e)
data = {"segments": [], "device_traces": [entries]}
for p in (2, 4):
    blob = pickle.dumps(data, protocol=p)
    assert sum(op.name == "APPEND" for op, _, _ in pickletools.genops(blob)) > 1000, "APPEND not written"
    open(f"{sys.argv[1]}/p{p}.pickle", "wb").write(blob)
print(json.dumps([e["frames"][0]["line"] if e["frames"] else None for e in entries]))
"#;
    let truth: Vec<Option<i64>> = serde_json::from_value(crate::util::python_json(script, &[dir.path()])).unwrap();
    for p in [2, 4] {
        let bytes = std::fs::read(dir.path().join(format!("p{p}.pickle"))).unwrap();
        let (dicts, events) = same(&format!("one-frame stacks, protocol {p}"), &bytes, &|_| {});
        assert_eq!(events, truth.len());
        // All but the first few (keys learnt), the fresh frames and the dicts with two lists.
        assert!(dicts as f64 >= 0.94 * events as f64, "protocol {p}: {dicts} fast of {events}");
        let read = ingest(Cursor::new(bytes), &Options::default()).unwrap();
        let snap = &read.snapshot;
        for (i, line) in truth.iter().enumerate() {
            let top = snap.stacks.frames(snap.events[i].stack).next().map(|f| f.line);
            assert_eq!(top, *line, "protocol {p}, entry {i}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A few bytes changed anywhere, most often inside the trace: either path may refuse the
    /// file, but both say the same.
    #[test]
    fn mutated_snapshots_read_the_same_through_both_paths(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)
    ) {
        same("mutated", &mutated(edits), &|_| {});
    }

    /// Limits within reach of a real snapshot: the fast path leaves each to the general
    /// machine, which names it at the same offset.
    #[test]
    fn tight_limits_are_met_the_same_through_both_paths(
        memo in 1000u64..40_000,
        values in 1000u64..60_000,
        containers in 1000u64..30_000,
        depth in 2u32..8,
        strings in 200u64..20_000,
    ) {
        let bytes = seed();
        for (what, tighten) in tight_limits(memo, values, containers, depth, strings) {
            same(what, &bytes, &*tighten);
        }
    }
}
