//! Shared helpers: fixture paths, running the real binary, and python3 as an independent oracle.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
// (TestServer below needs Stdio and Instant too.)

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

/// Says that a test skipped and why, on the terminal: libtest captures `eprintln!`, which
/// would make the skip silent; a write to the stderr handle is not captured.
pub fn skipped(why: &str) {
    note_skip(why);
}

/// Says on stderr that a test did not run and why, and adds it to `target/skipped-tests.txt`,
/// which `.ci/test` prints after the suite: a test that skipped must not read as one that
/// passed.
pub fn note_skip(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{test}: {why}");
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fragscope")
}

/// Runs a command to its end, or kills it after `limit` and says so: a hang guard, not a timing.
/// Its output is drained while it runs (a full pipe would stall it).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("{cmd:?} still running after {limit:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// `fragscope analyze --json FILE`, parsed.
pub fn analyze_json(path: &Path) -> serde_json::Value {
    analyze_json_with(path, &[])
}

/// [`analyze_json`] with more flags.
pub fn analyze_json_with(path: &Path, flags: &[&str]) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.args(["analyze", "--json"]).args(flags).arg(path);
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

/// The real server, on a free loopback port with its own data dir; killed when dropped.
pub struct TestServer {
    pub child: std::process::Child,
    pub base: String,
    pub data: std::path::PathBuf,
    _dir: Option<tempfile::TempDir>,
}

thread_local! {
    /// Set while a test runs on Postgres and S3 (see [`on_team_engines`]): every server the
    /// test starts on this thread then uses them.
    static TEAM: std::cell::RefCell<Option<std::rc::Rc<super::engines::Team>>> = const { std::cell::RefCell::new(None) };
}

/// Runs a server test with every server it starts on a fresh Postgres and S3 server, instead
/// of SQLite and the data folder. Skips (saying why) where the engines are missing.
pub fn on_team_engines(test: fn()) {
    let Some(team) = super::engines::Team::start() else { return };
    TEAM.with(|t| *t.borrow_mut() = Some(std::rc::Rc::new(team)));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            TEAM.with(|t| *t.borrow_mut() = None);
        }
    }
    let _reset = Reset;
    test();
}

impl TestServer {
    pub fn start(args: &[&str]) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut s = TestServer::start_in(&data, args);
        s._dir = Some(dir);
        s
    }

    /// Starts on an existing data dir (to test restarts).
    pub fn start_in(data: &Path, args: &[&str]) -> TestServer {
        let team = TEAM.with(|t| t.borrow().clone());
        match team {
            Some(team) => {
                let mut all: Vec<String> = team.args();
                all.extend(args.iter().map(|a| a.to_string()));
                let all: Vec<&str> = all.iter().map(String::as_str).collect();
                TestServer::start_with(data, &all, &team.s3.env())
            }
            None => TestServer::start_with(data, args, &[]),
        }
    }

    /// Starts with more environment (a replica's S3 settings).
    pub fn start_with(data: &Path, args: &[&str], env: &[(&str, String)]) -> TestServer {
        use std::io::BufRead;
        let mut child = Command::new(bin())
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(args)
            .env("FRAGSCOPE_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("the server prints its address");
        let base = line.rsplit(' ').next().unwrap().to_string();
        assert!(base.starts_with("http://127.0.0.1:"), "{line}");
        TestServer { child, base, data: data.to_path_buf(), _dir: None }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn client() -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
    }

    pub fn get(&self, path: &str) -> reqwest::blocking::Response {
        Self::client().get(self.url(path)).send().unwrap()
    }

    pub fn get_json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path);
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().unwrap()
    }

    /// Uploads a file as a raw body; returns the answer's JSON (asserting 202).
    pub fn upload(&self, file: &Path) -> serde_json::Value {
        let r = Self::client().post(self.url("/api/v1/snapshots")).body(std::fs::read(file).unwrap()).send().unwrap();
        assert_eq!(r.status().as_u16(), 202, "upload {}: {:?}", file.display(), r.text());
        r.json().unwrap()
    }

    /// DELETE `path` with a delete key (`X-Fragscope-Key`); the status.
    pub fn delete_with_key(&self, path: &str, key: &str) -> u16 {
        Self::client().delete(self.url(path)).header("x-fragscope-key", key).send().unwrap().status().as_u16()
    }

    /// The value of the `/metrics` line that starts with `line_start`.
    pub fn metric(&self, line_start: &str) -> u64 {
        let text = self.get("/metrics").text().unwrap();
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
    }

    /// Polls a snapshot until its analysis is done; returns its status JSON.
    pub fn wait_done(&self, id: &str) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let s = self.get_json(&format!("/api/v1/snapshots/{id}"));
            if s["status"] == "ready" || s["status"] == "failed" {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "analysis of {id} never finished: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's peak resident memory so far, in KiB (Linux).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A valid snapshot pickle of `cycles` alloc/free cycles in one 20 MiB segment: big inputs for
/// tests without committing big files. Written opcode by opcode (protocol 4).
pub fn synthetic_snapshot(cycles: usize) -> Vec<u8> {
    fn s(out: &mut Vec<u8>, text: &str) {
        out.push(0x8c);
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
    fn int(out: &mut Vec<u8>, v: u64) {
        out.push(0x8a);
        out.push(8);
        out.extend_from_slice(&v.to_le_bytes());
    }
    let (addr, seg) = (0x7f00_0000_0000u64, 20u64 << 20);
    let mut out = b"\x80\x04}(".to_vec();
    s(&mut out, "segments");
    out.extend_from_slice(b"](}(");
    for (k, v) in [("device", 0u64), ("address", addr), ("total_size", seg), ("stream", 0)] {
        s(&mut out, k);
        int(&mut out, v);
    }
    s(&mut out, "segment_type");
    s(&mut out, "large");
    s(&mut out, "blocks");
    out.extend_from_slice(b"](}(");
    s(&mut out, "size");
    int(&mut out, seg);
    s(&mut out, "state");
    s(&mut out, "inactive");
    out.extend_from_slice(b"ueue"); // block dict, blocks list; segment dict, segments list
    s(&mut out, "device_traces");
    out.extend_from_slice(b"](]");
    let mut t = 1_700_000_000_000_000u64;
    let mut event = |out: &mut Vec<u8>, action: &str, size: u64| {
        out.extend_from_slice(b"}(");
        s(out, "action");
        s(out, action);
        s(out, "addr");
        int(out, addr);
        s(out, "size");
        int(out, size);
        s(out, "stream");
        int(out, 0);
        s(out, "time_us");
        t += 1;
        int(out, t);
        out.push(b'u');
        out.push(b'a');
    };
    event(&mut out, "segment_alloc", seg);
    for _ in 0..cycles {
        event(&mut out, "alloc", 1 << 20);
        event(&mut out, "free_requested", 1 << 20);
        event(&mut out, "free_completed", 1 << 20);
    }
    out.extend_from_slice(b"eu."); // the trace into device_traces; the top dict
    out
}
