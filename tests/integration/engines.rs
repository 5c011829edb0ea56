//! The engines a team runs fragscope on, started the way their users start them: PostgreSQL
//! from Debian (`initdb`, `pg_ctl`) in a temp folder on a loopback port, and `s3s-fs`, an S3
//! server over a local folder. Both are killed when dropped.
//!
//! Where either is missing the tests that need it skip with a printed reason, unless
//! `FRAGSCOPE_REQUIRE_ENGINES` is set (`.ci/run` sets it after installing both): then a
//! missing engine fails the test. `benches/load.rs` includes this file too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Says that a test skipped and why, on the terminal (not captured by libtest).
fn skipped(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
    // As util::note_skip (this file is also part of the load bench, which has no util).
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{test}: {why}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn find(name: &str, also: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(also.iter().map(PathBuf::from));
    let mut found: Vec<PathBuf> = dirs.map(|d| d.join(name)).filter(|p| p.is_file()).collect();
    if found.is_empty() {
        // Debian keeps the server's programs under a versioned folder, off PATH.
        if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
            found.extend(rd.filter_map(|e| Some(e.ok()?.path().join("bin").join(name))).filter(|p| p.is_file()));
        }
    }
    found.into_iter().next()
}

/// None (after saying why) when an engine is missing and not required.
fn missing<T>(what: &str) -> Option<T> {
    if std::env::var_os("FRAGSCOPE_REQUIRE_ENGINES").is_some() {
        panic!("{what} is required here (FRAGSCOPE_REQUIRE_ENGINES) but not installed");
    }
    skipped(&format!("{what} is not installed (.ci/run installs it)"));
    None
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `program` as an unprivileged user when we are root (postgres refuses to run as root).
fn as_postgres_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

pub struct Postgres {
    pg_ctl: PathBuf,
    data: PathBuf,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Postgres {
    pub fn start() -> Option<Postgres> {
        let (Some(initdb), Some(pg_ctl)) = (find("initdb", &[]), find("pg_ctl", &[])) else {
            return missing("PostgreSQL (initdb, pg_ctl)");
        };
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("pg");
        std::fs::create_dir(&data).unwrap();
        if is_root() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let ok = Command::new("chown").args(["nobody:nogroup"]).arg(&data).status().unwrap();
            assert!(ok.success(), "chown the Postgres folder");
        }
        let out = as_postgres_user(&initdb)
            .args(["-A", "trust", "-U", "fragscope", "--no-sync", "-E", "UTF8", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let options = format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", data.display());
        let out = as_postgres_user(&pg_ctl)
            .args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .args(["-l"])
            .arg(data.join("log"))
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let log = std::fs::read_to_string(data.join("log")).unwrap_or_default();
        assert!(out.status.success(), "pg_ctl start: {}\n{log}", String::from_utf8_lossy(&out.stderr));
        let url = format!("postgres://fragscope@127.0.0.1:{port}/postgres");
        Some(Postgres { pg_ctl, data, url, _dir: dir })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres_user(&self.pg_ctl)
            .args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

pub struct S3 {
    child: Child,
    /// The folder the server keeps objects in: `ROOT/BUCKET/KEY`.
    pub root: PathBuf,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

pub const BUCKET: &str = "fragscope";
const KEY: &str = "fragscope-test";
const SECRET: &str = "fragscope-test-secret";

impl S3 {
    pub fn start() -> Option<S3> {
        let home = std::env::var("HOME").unwrap_or_default();
        let Some(bin) = find("s3s-fs", &[&format!("{home}/.cargo/bin")]) else {
            return missing("s3s-fs (cargo install s3s-fs@0.14.1 --features binary --locked)");
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("s3");
        std::fs::create_dir_all(root.join(BUCKET)).unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", KEY, "--secret-key", SECRET])
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "s3s-fs never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(S3 { child, root, endpoint: format!("http://127.0.0.1:{port}"), _dir: dir })
    }

    /// The environment a fragscope server needs to reach this store, the standard way.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// Files the store holds under a key prefix of the bucket.
    pub fn files(&self, prefix: &str) -> Vec<PathBuf> {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    if e.path().is_dir() { walk(&e.path(), out) } else { out.push(e.path()) }
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root.join(BUCKET).join(prefix), &mut out);
        out
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Postgres and S3 together, and the flags and environment a replica needs for them.
pub struct Team {
    pub pg: Postgres,
    pub s3: S3,
}

impl Team {
    pub fn start() -> Option<Team> {
        Some(Team { pg: Postgres::start()?, s3: S3::start()? })
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--database-url".into(),
            self.pg.url.clone(),
            "--blob-store".into(),
            format!("s3://{BUCKET}/team"),
            "--lease-seconds".into(),
            "3".into(),
        ]
    }
}
