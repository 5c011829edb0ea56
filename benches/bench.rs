//! `cargo bench`: fragscope against the reference on real snapshots, printed as a table.
//!
//! Reads `big_trace.pickle.xz` (243 MiB unpacked, 3,000,000 events) from `../shared/fixtures/real`
//! or `$FRAGSCOPE_BIG_TRACE`, and `big_trace_xl` (495 MiB, 6,000,000 events) where there is one
//! (see `common::big_trace_xl`), unpacks them once into `target/bench-data`, and runs each
//! command a few times, reporting the median wall time and the peak RSS the kernel measured for the
//! child (`wait4`'s `ru_maxrss`). Not a test: machines are noisy, so it asserts nothing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const RUNS: usize = 3;

struct Measure {
    wall_s: f64,
    rss_mib: f64,
}

/// Runs `cmd` to its end; wall time and the child's peak RSS.
fn measure(cmd: &mut Command) -> Measure {
    let start = Instant::now();
    // Reaped by wait4 below, which gives its peak RSS too.
    #[expect(clippy::zombie_processes)]
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().expect("spawn");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child's pid, with valid pointers to locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall_s = start.elapsed().as_secs_f64();
    assert!(pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{cmd:?} failed");
    Measure { wall_s, rss_mib: usage.ru_maxrss as f64 / 1024.0 }
}

fn median_run(mut runs: Vec<Measure>) -> Measure {
    runs.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    runs.swap_remove(runs.len() / 2)
}

/// The two commands' medians, their runs alternated, so that a machine that slows down or
/// speeds up during the bench moves both alike and the ratio stays the same run's.
fn medians(a: impl Fn() -> Command, b: impl Fn() -> Command) -> (Measure, Measure) {
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        ra.push(measure(&mut a()));
        rb.push(measure(&mut b()));
    }
    (median_run(ra), median_run(rb))
}

#[path = "common.rs"]
mod common;
use common::{big_trace, big_trace_xl, machine, verdict};

/// #17's targets for `analyze --json` on big_trace, in seconds; on a snapshot of another size
/// the wall-time target scales with it.
const WALL_TARGET_S: f64 = 0.45;
const BIG_TRACE_MIB: f64 = 243.5;
const TIMES_PICKLE_TARGET: f64 = 20.0;

fn main() {
    // `cargo bench -- --list` and the like: nothing to list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(snapshot) = big_trace() else {
        println!("big_trace.pickle.xz not found beside the checkout; set FRAGSCOPE_BIG_TRACE to a snapshot");
        return;
    };
    println!("{}", machine());
    against_pickle(&snapshot);
    match big_trace_xl() {
        Some(xl) => against_pickle(&xl),
        None => println!(
            "\nbig_trace_xl (6,000,000 events) not found: set FRAGSCOPE_BIG_TRACE_XL, or make it on a GPU with \
             `gen_real_snapshots.py OUT big_trace_xl` and put big_trace_xl.pickle.xz in target/bench-data"
        ),
    }
    replay_table(&snapshot);
}

/// `fragscope analyze --json` against Python's bare `pickle.load` of the same file, in the same
/// run, with #17's targets beside the figures.
fn against_pickle(snapshot: &Path) {
    let size_mib = std::fs::metadata(snapshot).unwrap().len() as f64 / (1 << 20) as f64;
    println!("\nsnapshot: {} ({size_mib:.0} MiB), median of {RUNS} runs each, alternated\n", snapshot.display());
    let (ours, python) = medians(
        || {
            let mut c = Command::new(env!("CARGO_BIN_EXE_fragscope"));
            c.args(["analyze", "--json"]).arg(snapshot);
            c
        },
        || {
            let mut c = Command::new("python3");
            c.args(["-c", "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"]).arg(snapshot);
            c
        },
    );
    println!("| command | wall time | peak RSS |");
    println!("|---|---|---|");
    println!("| `fragscope analyze --json` | {:.2} s | {:.0} MiB |", ours.wall_s, ours.rss_mib);
    println!("| `python3 -c \"pickle.load(...)\"` | {:.2} s | {:.0} MiB |", python.wall_s, python.rss_mib);
    let wall_target = WALL_TARGET_S * size_mib / BIG_TRACE_MIB;
    let times = python.wall_s / ours.wall_s;
    let rss_share = ours.rss_mib / size_mib;
    println!("\n| target | measured | |");
    println!("|---|---|---|");
    // #17 set an absolute time on one machine; #33 judges the ratio taken in the same run,
    // which a slower or busier machine moves far less. The time is shown beside it.
    println!(
        "| wall time ({wall_target:.2} s on the machine #17 was set on; not judged here) | {:.2} s | {} |",
        ours.wall_s,
        if ours.wall_s <= wall_target { "within it" } else { "over it" }
    );
    println!(
        "| at least {TIMES_PICKLE_TARGET:.0}x faster than pickle.load | {times:.1}x | {} |",
        verdict(times >= TIMES_PICKLE_TARGET)
    );
    println!(
        "| peak RSS at most half the file ({:.0} MiB) | {:.0} MiB ({:.0}%) | {} |",
        size_mib / 2.0,
        ours.rss_mib,
        100.0 * rss_share,
        verdict(rss_share <= 0.5)
    );
    println!("| {} |", final_counters(snapshot));
}

#[path = "../tests/integration/torch_counters.rs"]
mod torch_counters;
use torch_counters::COUNTERS;

/// A row saying whether the timed analysis ends with PyTorch's own counters, from the truth
/// file beside the snapshot or in `../shared` (a fast wrong answer is worth nothing).
fn final_counters(snapshot: &Path) -> String {
    let name = snapshot.file_name().unwrap().to_string_lossy().replace(".pickle", ".truth.json");
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/real").join(&name);
    let Some(truth) = [snapshot.with_file_name(&name), shared].into_iter().find_map(|p| std::fs::read(p).ok()) else {
        return format!("final counters equal PyTorch's | no {name} to check against | not checked");
    };
    let truth: serde_json::Value = serde_json::from_slice(&truth).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope")).args(["analyze", "--json"]).arg(snapshot).output().unwrap();
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = &ours["devices"][0]["final"];
    let differ: Vec<String> = COUNTERS
        .iter()
        .filter(|(o, t)| last[o] != truth["memory_stats"][t])
        .map(|(o, t)| format!("{o} {} against {}", last[o], truth["memory_stats"][t]))
        .collect();
    let equal = differ.is_empty();
    let what = if equal { format!("all {} of {name}", COUNTERS.len()) } else { differ.join(", ") };
    format!("final counters equal PyTorch's | {what} | {}", verdict(equal))
}

/// In-process: ingest alone, then replay + series + every analysis, then random states.
fn replay_table(path: &Path) {
    use fragscope::{analysis, ingest};
    let mut ingest_s = Vec::new();
    let (mut one_s, mut two_s) = (Vec::new(), Vec::new());
    let mut analyze_s = Vec::new();
    let mut last = None;
    let mut fast = 0;
    let mut later_part = None;
    // The forced two-part reads' split: walk, read, the earlier part's wait, the take-in.
    let mut split_ms: [Vec<f64>; 4] = Default::default();
    let mut stopped = 0;
    for _ in 0..RUNS {
        // Each way alternated with the default, which probes for a free core and picks. Without
        // the hash, as the command line reads a file: a hashing thread beside the read takes
        // the core a later part needs, and only `analyze --sha256` starts one.
        let forced = ingest::TwoParts { measure: false, ..ingest::TwoParts::default() };
        for (parts, times) in [(None, &mut one_s), (Some(forced), &mut two_s)] {
            let options = ingest::Options { two_parts: parts, hash: false, ..ingest::Options::default() };
            let t = Instant::now();
            let ingested = std::hint::black_box(ingest::ingest_path(path, &options).expect("ingest"));
            times.push(t.elapsed().as_secs_f64());
            if let (Some(_), Some(l)) = (parts, &ingested.later_part) {
                for (ms, d) in split_ms.iter_mut().zip([l.walked, l.read, l.waited, l.took_in]) {
                    ms.push(d.as_secs_f64() * 1e3);
                }
                stopped += usize::from(l.stopped);
            }
        }
        let t = Instant::now();
        let ingested = ingest::ingest_path(path, &ingest::Options::default()).expect("ingest");
        ingest_s.push(t.elapsed().as_secs_f64());
        fast = ingested.fast_dicts;
        later_part = ingested.later_part.clone();
        let t = Instant::now();
        let analyzed = analysis::analyze(&ingested.snapshot, ingested.source.clone(), analysis::Depth::Serve);
        analyze_s.push(t.elapsed().as_secs_f64());
        last = Some((ingested, analyzed));
    }
    let (ingested, analyzed) = last.expect("runs");
    let snap = &ingested.snapshot;
    let replay = &analyzed.replays[0];
    let n = replay.event_count();
    // A fixed pseudo-random sequence, so runs are comparable.
    let mut x = 0x9e3779b97f4a7c15u64;
    let (mut state_ms, mut breakdown_ms, mut flame_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..100 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let event = (x % n as u64) as usize;
        let t = Instant::now();
        let state = replay.state_at(snap, Some(event));
        state_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // What the breakdown route does: the state, then its blocks by category and call site.
        let moment = analysis::Moment::Event;
        let b = analyzed.indexes[0].breakdown(snap, &state, moment, Some(event as u64));
        breakdown_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // What the flame route adds to the state: its blocks by stack, as an icicle.
        let t = Instant::now();
        let f = analysis::flame::flame(snap, &state, &analyzed.indexes[0].labels, Some(event as u64));
        flame_ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box((state, b, f));
    }
    let mut sim_s = Vec::new();
    for conf in ["", "expandable_segments:True", ""] {
        let settings = fragscope::simulate::Settings { conf: Some(conf.to_string()), ..Default::default() };
        let t = Instant::now();
        let o = fragscope::simulate::simulate(snap, &snap.devices[0], &settings).expect("simulate");
        sim_s.push(t.elapsed().as_secs_f64());
        std::hint::black_box(o);
    }
    let (ing, ana) = (common::median(ingest_s), common::median(analyze_s));
    println!("\nIn process, {n} events (median of {RUNS} runs; targets from the issues):\n");
    println!("The reader's fast path read {fast} of the {n} trace entries.\n");
    println!("| step | time | target |");
    println!("|---|---|---|");
    let share =
        |r: &std::ops::Range<u64>| 100.0 * (r.end - r.start) as f64 / std::fs::metadata(path).unwrap().len() as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chose = match &later_part {
        Some(l) => format!("two parts, a second thread reading {:.0}% of the file", share(&l.bytes)),
        None => "one part".to_string(),
    };
    println!(
        "| ingest (read + model, hashing the file), {cores} cores, as chosen by a probe of the cores: {chose} | {ing:.2} s | |"
    );
    println!(
        "| ingest in one part, no hash (as `analyze` reads), alternated with the above | {:.2} s | |",
        common::median(one_s)
    );
    println!(
        "| ingest in two parts, no hash (as `analyze` reads), alternated with the above | {:.2} s | |",
        common::median(two_s)
    );
    if split_ms[0].len() == RUNS {
        let [walk, read, wait, take] = split_ms.map(common::median);
        println!(
            "| of which the second thread's walk to its start, then its read; the first thread's wait for it at the start, then its take-in (the second stopped midway in {stopped} of {RUNS}: `TwoParts::overtake`) | {walk:.0}, {read:.0}; {wait:.0}, {take:.0} ms | |"
        );
    }
    println!(
        "| replay index + all series + analysis | {ana:.2} s ({:.0}% of ingest) | at most 50% of ingest: {} |",
        100.0 * ana / ing,
        verdict(ana <= 0.5 * ing)
    );
    let state = common::median(state_ms);
    println!(
        "| state at a random event (median of 100) | {state:.2} ms | well under 1 ms (#17): {} |",
        verdict(state < 1.0)
    );
    println!(
        "| breakdown at a random event (state + categories + call sites, median of 100) | {:.2} ms | under 50 ms |",
        common::median(breakdown_ms)
    );
    let flame = common::median(flame_ms);
    println!(
        "| icicle of the state at a random event (beyond the state, median of 100) | {flame:.2} ms | under 100 ms, fluid on the page: {} |",
        verdict(flame < 100.0)
    );
    let sim = common::median(sim_s);
    println!(
        "| simulate the whole trace under another setting | {sim:.2} s | less than ingest ({ing:.2} s): {} |",
        verdict(sim < ing)
    );
}
