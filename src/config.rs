//! The server's settings: each a `serve` flag and an environment variable, with defaults that
//! work on a fresh machine (a `fragscope-data` folder in the working directory, loopback only).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address to listen on (port 0 picks a free port and prints it).
    #[arg(long, env = "FRAGSCOPE_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Where uploads, results and the metadata database live.
    #[arg(long, env = "FRAGSCOPE_DATA_DIR", default_value = "fragscope-data")]
    pub data_dir: PathBuf,
    /// Largest accepted upload: bytes, or with a unit (500MB, 4GiB).
    #[arg(long, env = "FRAGSCOPE_MAX_UPLOAD", default_value = "4GiB", value_parser = parse_size)]
    pub max_upload: u64,
    /// If set, uploading, listing and deleting need `Authorization: Bearer TOKEN`.
    /// Opening a share link never does: the link is its own capability.
    #[arg(long, env = "FRAGSCOPE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Delete snapshots older than this many days (checked hourly); keep forever if unset.
    #[arg(long, env = "FRAGSCOPE_RETAIN_DAYS")]
    pub retain_days: Option<u64>,
    /// Analyses run at once (they are CPU-heavy); more uploads wait in a queue.
    #[arg(long, env = "FRAGSCOPE_ANALYSIS_WORKERS", default_value_t = 2)]
    pub analysis_workers: usize,
    /// Memory that analyses and parsed snapshots may use together (e.g. 8GiB); uploads wait
    /// in the queue for it. Default: half of the machine's memory.
    #[arg(long, env = "FRAGSCOPE_ANALYSIS_MEMORY", value_parser = parse_size)]
    pub analysis_memory: Option<u64>,
    /// Snapshots kept parsed in memory for state-at-event queries.
    #[arg(long, env = "FRAGSCOPE_LOADED_SNAPSHOTS", default_value_t = 4)]
    pub loaded_snapshots: usize,
    /// Seconds an upload may go without sending anything before it is cut off (408).
    #[arg(long = "request-timeout", env = "FRAGSCOPE_REQUEST_TIMEOUT", default_value_t = 30)]
    pub request_timeout_secs: u64,
    /// Connections served at once; more wait in the kernel's queue. A connection that sends
    /// no complete request head for 10 s (or --request-timeout, if lower), idle between
    /// requests included, is closed.
    #[arg(long, env = "FRAGSCOPE_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,
    /// Metadata and the analysis queue: `sqlite://PATH` or `postgres://USER:PASSWORD@HOST/DB`
    /// (several replicas share one). Default: `fragscope.db` in the data folder.
    #[arg(long, env = "FRAGSCOPE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Uploads and results: `s3://BUCKET/PREFIX` (also `gs://`, `az://`), configured by the
    /// `AWS_*` (`GOOGLE_*`, `AZURE_*`) variables; `AWS_ENDPOINT` for an S3-compatible server.
    /// Default: the data folder.
    #[arg(long, env = "FRAGSCOPE_BLOB_STORE")]
    pub blob_store: Option<String>,
    /// With an object store, the most bytes of blobs and results kept on this machine's disk.
    #[arg(long, env = "FRAGSCOPE_CACHE_SIZE", default_value = "20GiB", value_parser = parse_size)]
    pub cache_size: u64,
    /// Seconds a replica holds a job without renewing it; a replica that dies mid-analysis
    /// gives its job up after this long.
    #[arg(long, env = "FRAGSCOPE_LEASE_SECONDS", default_value_t = 60, hide = true)]
    pub lease_seconds: u64,
    /// Parse uploads that announce their size while they arrive (`service/early.rs`);
    /// `false` waits for the whole upload, as before (for comparisons).
    #[arg(long, env = "FRAGSCOPE_PARSE_WHILE_ARRIVING", default_value_t = true, action = clap::ArgAction::Set)]
    pub parse_while_arriving: bool,
}

impl Config {
    /// A configuration for tests: a given data dir, a free loopback port.
    pub fn for_tests(data_dir: PathBuf) -> Config {
        Config {
            addr: "127.0.0.1:0".parse().expect("loopback"),
            data_dir,
            max_upload: 4 << 30,
            token: None,
            retain_days: None,
            analysis_workers: 2,
            loaded_snapshots: 4,
            max_connections: 512,
            request_timeout_secs: 30,
            analysis_memory: None,
            database_url: None,
            blob_store: None,
            cache_size: 20 << 30,
            lease_seconds: 60,
            parse_while_arriving: true,
        }
    }

    /// The memory budget in bytes: `--analysis-memory`, or half of what the process may use
    /// (the machine's memory or its container's limit, whichever is smaller).
    pub fn memory_budget(&self) -> u64 {
        self.analysis_memory.unwrap_or_else(|| usable_memory() / 2)
    }
}

/// The memory this process may use: the machine's, capped by the cgroup's limit (v2
/// `memory.max`, or v1 `memory.limit_in_bytes`) where one is set.
pub fn usable_memory() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let machine = read("/proc/meminfo").as_deref().and_then(mem_total).unwrap_or(8 << 30);
    let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .filter_map(|p| read(p).as_deref().and_then(cgroup_limit))
        .min();
    cgroup.map_or(machine, |c| c.min(machine))
}

/// The memory a command-line analysis may take: half of [`usable_memory`], and at most
/// three quarters of the address space `ulimit -v` leaves it (the rest is code, stacks and
/// the allocator's arenas).
pub fn cli_memory_budget() -> u64 {
    let budget = usable_memory() / 2;
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0 && limit.rlim_cur != libc::RLIM_INFINITY {
            return budget.min(limit.rlim_cur / 4 * 3);
        }
    }
    budget
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// A cgroup's memory limit file: bytes, or None for `max` (v2) or v1's "no limit" (a number
/// near 2^63).
fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b < 1 << 60)
}

/// Why a size did not read.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SizeError {
    #[error("not a size: {0:?}")]
    NotANumber(String),
    #[error("unknown size unit {unit:?} in {size:?}")]
    Unit { unit: String, size: String },
}

/// `4GiB`, `500MB`, `1024`: bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number.parse().map_err(|_| SizeError::NotANumber(s.to_string()))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1048576.0,
        "g" | "gb" => 1e9,
        "gib" => 1073741824.0,
        "t" | "tb" => 1e12,
        "tib" => 1099511627776.0,
        other => return Err(SizeError::Unit { unit: other.to_string(), size: s.to_string() }),
    };
    Ok((n * scale) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_limit_caps_the_memory_and_max_means_none() {
        assert_eq!(cgroup_limit("6442450944\n"), Some(6 << 30));
        assert_eq!(cgroup_limit("max\n"), None);
        assert_eq!(cgroup_limit("9223372036854771712\n"), None, "v1's unlimited");
        assert_eq!(mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24576000 * 1024));
        assert!(usable_memory() > 0);
        assert!(cli_memory_budget() <= usable_memory() / 2);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("4 parsecs").is_err());
    }
}
