//! `cargo bench --bench load`: the server under load, on loopback.
//!
//! 0. One client uploads big_trace to the idle server, three times with the Content-Length
//!    (parsed while it arrives) and three times chunked without one (so parsed after it
//!    arrives, as before): the time from the upload's last byte sent to `ready`, and from its
//!    answer (which comes once the upload is stored and recorded) to `ready`.
//! 1. Sixteen clients upload the real 243 MiB big_trace at once (each copy ends with a different
//!    byte after the pickle's STOP, so none is a duplicate and all sixteen are analysed) under a
//!    1.5 GiB `--analysis-memory`; the server's RSS is sampled until all are ready.
//!    Meanwhile one client asks for the `state` of a small snapshot that was ready before the
//!    burst, every 20 ms: a query of a ready snapshot must not wait behind the parses (target:
//!    p99 under 100 ms).
//! 2. Thirty seconds of mixed reads (the share page, the analysis JSON, a binary timeline) from
//!    16 client threads; requests per second, latency percentiles and errors.
//!
//! `cargo bench --bench load -- --replicas 2` runs the same against two replicas sharing a
//! PostgreSQL and an S3 server (`s3s-fs`), started as the team tests start them: uploads and
//! reads alternate between the replicas, and each replica's peak RSS is reported.
//!
//! `-- --ready-only` prints only the first table.
//!
//! Prints the figures; asserts nothing (machines are noisy).

#[path = "common.rs"]
mod common;
#[allow(dead_code)]
#[path = "../tests/integration/engines.rs"]
mod engines;

use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const BUDGET: u64 = 1536 << 20;
const CLIENTS: usize = 16;

fn rss_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(snapshot) = common::big_trace() else {
        println!("big_trace.pickle.xz not found beside the checkout; set FRAGSCOPE_BIG_TRACE");
        return;
    };
    println!("{}", common::machine());
    let size = std::fs::metadata(&snapshot).unwrap().len();
    let data = tempfile::tempdir().unwrap();
    let args: Vec<String> = std::env::args().collect();
    // `-- --parse-while-arriving false`: the 16 uploads as before this existed, to compare.
    let early = args.iter().position(|a| a == "--parse-while-arriving").and_then(|i| args.get(i + 1)).cloned();
    let early = early.unwrap_or_else(|| "true".into());
    let replicas: usize =
        args.iter().position(|a| a == "--replicas").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(1);
    let team = if replicas > 1 {
        match engines::Team::start() {
            Some(t) => Some(t),
            None => {
                println!("--replicas needs PostgreSQL and s3s-fs (see .ci/run)");
                return;
            }
        }
    } else {
        None
    };
    let (team_args, team_env) = match &team {
        Some(t) => (t.args(), t.s3.env()),
        None => (Vec::new(), Vec::new()),
    };
    let mut servers = Vec::new();
    let mut bases = Vec::new();
    for r in 0..replicas.max(1) {
        let mut server = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["serve", "--addr", "127.0.0.1:0", "--analysis-memory", &BUDGET.to_string()])
            .args(["--parse-while-arriving", &early, "--data-dir"])
            .arg(data.path().join(format!("data{r}")))
            .args(&team_args)
            .envs(team_env.iter().map(|(k, v)| (k, v)))
            .env("FRAGSCOPE_LOG", std::env::var("FRAGSCOPE_BENCH_LOG").unwrap_or("warn".into()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
        bases.push(line.trim().rsplit(' ').next().unwrap().to_string());
        servers.push(server);
    }
    let pids: Vec<u32> = servers.iter().map(|s| s.id()).collect();
    let base = bases[0].clone();
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(900)).build().unwrap();

    if replicas == 1 && early == "true" {
        ready_after_upload(&http, &base, &snapshot, size);
        // `-- --ready-only`: just that table.
        if args.iter().any(|a| a == "--ready-only") {
            for mut s in servers {
                let _ = s.kill();
            }
            return;
        }
    }

    let done = Arc::new(AtomicBool::new(false));
    let peaks: Arc<Vec<AtomicU64>> = Arc::new(pids.iter().map(|_| AtomicU64::new(0)).collect());
    let sampler = {
        let (done, peaks, pids) = (done.clone(), peaks.clone(), pids.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for (pid, peak) in pids.iter().zip(peaks.iter()) {
                    peak.fetch_max(rss_kib(*pid, "VmRSS:"), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // A snapshot ready before the burst, queried all through it.
    let small = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seed_frag_default.pickle");
    let r = http.post(format!("{base}/api/v1/snapshots")).body(std::fs::read(&small).unwrap()).send().unwrap();
    let ready_id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    common::wait_ready(&http, &base, &ready_id, Duration::from_millis(20));
    let state_url = format!("{base}/api/v1/snapshots/{ready_id}/devices/0/state?event=final");
    http.get(&state_url).send().unwrap();
    let querier = {
        let (done, http) = (done.clone(), http.clone());
        std::thread::spawn(move || {
            let mut took = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = http.get(&state_url).send().is_ok_and(|r| r.status().is_success());
                took.push((t.elapsed().as_secs_f64() * 1e3, ok));
                std::thread::sleep(Duration::from_millis(20));
            }
            took
        })
    };
    let t = Instant::now();
    let uploads: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let (http, base, path) = (http.clone(), bases[k % bases.len()].clone(), snapshot.clone());
            std::thread::spawn(move || {
                let body = std::fs::File::open(&path).unwrap().chain(std::io::Cursor::new(vec![k as u8]));
                let r = http
                    .post(format!("{base}/api/v1/snapshots"))
                    .body(reqwest::blocking::Body::sized(body, size + 1))
                    .send()
                    .unwrap();
                assert_eq!(r.status().as_u16(), 202);
                r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string()
            })
        })
        .collect();
    let ids: Vec<String> = uploads.into_iter().map(|h| h.join().unwrap()).collect();
    let uploaded = t.elapsed().as_secs_f64();
    for id in &ids {
        common::wait_ready(&http, &base, id, Duration::from_millis(100));
    }
    let all_ready = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let queried = querier.join().unwrap();
    let on = if replicas > 1 { format!("{replicas} replicas on PostgreSQL and S3") } else { "one server".into() };
    println!(
        "{CLIENTS} clients uploading {} MiB each at once to {on}, --analysis-memory {} MiB each:",
        size >> 20,
        BUDGET >> 20
    );
    println!("  all uploaded after {uploaded:.1} s, all analysed after {all_ready:.1} s");
    let mut ms: Vec<f64> = queried.iter().map(|(ms, _)| *ms).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    let failed = queried.iter().filter(|(_, ok)| !ok).count();
    let met = if at(0.99) < 100.0 && failed == 0 { "met" } else { "NOT MET" };
    println!(
        "  `state` of a ready snapshot meanwhile: {} queries, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {failed} failed (target p99 < 100 ms: {met})",
        ms.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
    for (r, (pid, peak)) in pids.iter().zip(peaks.iter()).enumerate() {
        let hwm = rss_kib(*pid, "VmHWM:").max(peak.load(Ordering::Relaxed));
        let within = if hwm << 10 <= BUDGET { "within it" } else { "OVER IT" };
        println!("  server {r} peak RSS {} MiB (budget {} MiB: {within})", hwm >> 10, BUDGET >> 20);
    }
    println!();

    // Read load.
    let stop = Instant::now() + Duration::from_secs(30);
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..16)
        .map(|k| {
            let (http, base, ids, latencies, errors) =
                (http.clone(), bases[k % bases.len()].clone(), ids.clone(), latencies.clone(), errors.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut i = k;
                while Instant::now() < stop {
                    let id = &ids[i % ids.len()];
                    let path = match i % 3 {
                        0 => format!("/s/{id}"),
                        1 => format!("/api/v1/snapshots/{id}/analysis"),
                        _ => format!(
                            "/api/v1/snapshots/{id}/devices/0/timeline?start={}&end={}&points=1200&format=bin",
                            (i * 7919) % 2_000_000,
                            3_000_000
                        ),
                    };
                    let t = Instant::now();
                    match http
                        .get(format!("{base}{path}"))
                        .send()
                        .and_then(|r| r.error_for_status())
                        .and_then(|r| r.bytes())
                    {
                        Ok(_) => mine.push(t.elapsed().as_secs_f64() * 1e3),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    i += 16;
                }
                latencies.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let mut l = latencies.lock().unwrap().clone();
    l.sort_by(f64::total_cmp);
    let pct = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
    println!("30 s of mixed reads (share page, analysis JSON, binary timeline) from 16 threads:");
    println!("| requests/s | p50 | p99 | errors |");
    println!("|---|---|---|---|");
    println!(
        "| {:.0} | {:.1} ms | {:.1} ms | {} |",
        l.len() as f64 / 30.0,
        pct(0.5),
        pct(0.99),
        errors.load(Ordering::Relaxed)
    );
    for mut s in servers {
        let _ = s.kill();
    }
}

/// Marks when the body's last byte was handed to the connection: the read that reaches
/// `total` bytes (a sized body is never read to its end).
struct MarkEnd<R> {
    inner: R,
    read: u64,
    total: u64,
    end: Arc<Mutex<Option<Instant>>>,
}

impl<R: Read> Read for MarkEnd<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read >= self.total || (n == 0 && !buf.is_empty()) {
            self.end.lock().unwrap().get_or_insert_with(Instant::now);
        }
        Ok(n)
    }
}

/// One upload of `path` with a distinct trailing byte, announced (`Content-Length`) or
/// chunked: how long the upload took, and the seconds to `ready` from its last byte sent and
/// from its answer (which comes once the upload is stored and recorded).
fn one_upload(
    http: &reqwest::blocking::Client,
    base: &str,
    path: &std::path::Path,
    size: u64,
    tag: u8,
    announced: bool,
) -> (f64, f64, f64) {
    let end = Arc::new(Mutex::new(None));
    let file = std::fs::File::open(path).unwrap().chain(std::io::Cursor::new(vec![tag]));
    let file = MarkEnd { inner: file, read: 0, total: size + 1, end: end.clone() };
    let body =
        if announced { reqwest::blocking::Body::sized(file, size + 1) } else { reqwest::blocking::Body::new(file) };
    let t = Instant::now();
    let r = http.post(format!("{base}/api/v1/snapshots")).body(body).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    let answered = Instant::now();
    common::wait_ready(http, base, &id, Duration::from_millis(2));
    let ready = Instant::now();
    let last_byte = end.lock().unwrap().unwrap_or(answered);
    ((last_byte - t).as_secs_f64(), (ready - last_byte).as_secs_f64(), (ready - answered).as_secs_f64())
}

fn ready_after_upload(http: &reqwest::blocking::Client, base: &str, path: &std::path::Path, size: u64) {
    println!("one {} MiB upload to the idle server: from its last byte to `ready`", size >> 20);
    println!(
        "| upload | upload took | last byte sent to answer | last byte sent to ready | answer to ready | target |"
    );
    println!("|---|---|---|---|---|---|");
    for (k, announced) in [true, false, true, false, true, false].into_iter().enumerate() {
        let (upload, ready, after_answer) = one_upload(http, base, path, size, 200 + k as u8, announced);
        let (how, target) = if announced {
            let met = common::verdict(ready <= 0.3);
            ("with Content-Length: parsed while it arrives", format!("within 0.3 s (#17): {met}"))
        } else {
            ("chunked, no length: parsed after it arrives (as before)", "reference".to_string())
        };
        let answer = ready - after_answer;
        println!("| {how} | {upload:.2} s | {answer:.2} s | {ready:.2} s | {after_answer:.2} s | {target} |");
    }
    println!();
}
