//! The `fragscope` command: subcommands, their arguments, and their text output.
//!
//! Exit codes: 0 success, 2 the input was refused (bad file, not a snapshot, no such event),
//! 1 anything else.

mod compare;
mod mcp;
mod report;
mod segmap;
mod simulate;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::analysis::{self, Analysis};
use crate::ingest::{self, IngestError};
use crate::units::bytes;

#[derive(Debug, Parser)]
#[command(
    name = "fragscope",
    version,
    about = "Why did the GPU run out of memory? Reads PyTorch CUDA memory snapshots."
)]
/// The `fragscope` command line.
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the web server (upload snapshots, share diagnosis links, REST API).
    Serve(crate::config::Config),
    /// Analyse a snapshot file and print what it holds.
    Analyze {
        /// A snapshot: pickle (protocol 2-5) or JSON, optionally gzip- or zstd-compressed.
        file: PathBuf,
        /// Print the analysis as JSON (the same document the API serves).
        #[arg(long)]
        json: bool,
        /// The memory budget the job has (e.g. 12GiB): remedies are weighed against it, at an
        /// OOM and when the peak comes within 10% of it. Without it, an OOM's budget is what was
        /// reserved when it happened.
        #[arg(long, value_parser = crate::config::parse_size)]
        capacity: Option<u64>,
        /// The device's total memory (e.g. 140GiB, what `torch.cuda.get_device_properties(0)
        /// .total_memory` says): with it, an OOM's report says how much the process held
        /// outside PyTorch's allocator.
        #[arg(long, value_parser = crate::config::parse_size)]
        device_total: Option<u64>,
        /// Also print the file's sha256, the address the server keeps it under. It is not
        /// computed otherwise: on a CPU without SHA instructions it costs more than the analysis.
        #[arg(long)]
        sha256: bool,
    },
    /// Replay the trace through a model of the caching allocator under other settings.
    Simulate {
        /// The snapshot file.
        file: PathBuf,
        /// The device, when the snapshot holds several: `cuda:1` or `1` (default: the first).
        #[arg(long, value_parser = parse_device)]
        device: Option<i64>,
        /// `PYTORCH_CUDA_ALLOC_CONF` to try, e.g. 'expandable_segments:True,max_split_size_mb:256';
        /// '' is the default allocator; omitted, the snapshot's own settings.
        #[arg(long)]
        conf: Option<String>,
        /// Send a call site's allocations (`file.py:123` or a function name) to a private MemPool.
        #[arg(long)]
        mempool: Option<String>,
        /// Serve a call site's allocations from preallocated buffers of its largest size.
        #[arg(long)]
        reuse: Option<String>,
        /// The memory budget (e.g. 6GiB); without it, no OOM is predicted.
        #[arg(long, value_parser = crate::config::parse_size)]
        capacity: Option<u64>,
        /// Print the outcome as JSON (the same document the API's simulate route serves).
        #[arg(long)]
        json: bool,
    },
    /// Compare two snapshots: a run and the same run after a change, or two ranks of a job.
    Compare {
        /// The first snapshot ("before").
        a: PathBuf,
        /// The second ("after").
        b: PathBuf,
        /// Print the comparison as JSON (the same document as `/api/v1/compare`).
        #[arg(long)]
        json: bool,
    },
    /// Print the segment map at one event: segments to scale, pinned gaps marked.
    State {
        /// The snapshot file.
        file: PathBuf,
        /// An event index (0 is the first), `start` (before the first), `oom` (the first OOM)
        /// or `final` (the snapshot's segments).
        #[arg(long, default_value = "final")]
        event: String,
        /// The device, when the snapshot holds several: `cuda:1` or `1` (default: the first).
        #[arg(long, value_parser = parse_device)]
        device: Option<i64>,
    },
    /// Serve the commands above to a coding agent: a Model Context Protocol server on
    /// stdin/stdout (tools: analyze, state, breakdown, simulate, compare).
    Mcp,
}

/// A device as people write it: `cuda:1`, `1`.
fn parse_device(s: &str) -> Result<i64, String> {
    let n = s.trim().strip_prefix("cuda:").unwrap_or(s.trim());
    n.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| format!("a device is `cuda:N` or `N`, got {s:?}"))
}

/// Runs a command; the exit code is 0 on success, 1 on an error, 2 on bad input.
pub fn run(cli: Cli) -> ExitCode {
    if !matches!(cli.command, Command::Serve(_)) {
        log_if_asked();
    }
    match cli.command {
        Command::Serve(config) => serve(config),
        Command::Mcp => match mcp::run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fragscope mcp: {e}");
                ExitCode::from(1)
            }
        },
        Command::Analyze { file, json, capacity, device_total, sha256 } => {
            match analyze(&file, json, analysis::Options { capacity, device_total }, sha256) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => failed(&file, e),
            }
        }
        Command::Simulate { file, device, conf, mempool, reuse, capacity, json } => {
            let settings = crate::simulate::Settings { conf, capacity, mempool, reuse, shrink: None };
            match simulate::simulate(&file, device, &settings, json) {
                Ok(Ok(text)) => print_text(&file, &text),
                Ok(Err(usage)) => {
                    eprintln!("fragscope: {}: {usage}", file.display());
                    ExitCode::from(2)
                }
                Err(e) => fail(&file, e),
            }
        }
        Command::Compare { a, b, json } => match compare::run(&a, &b, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err((file, e)) => failed(&file, e),
        },
        Command::State { file, event, device } => match state(&file, &event, device) {
            Ok(Ok(text)) => print_text(&file, &text),
            Ok(Err(usage)) => {
                eprintln!("fragscope: {}: {usage}", file.display());
                ExitCode::from(2)
            }
            Err(e) => fail(&file, e),
        },
    }
}

/// The device `--device` names, else the first; a usage error naming the devices there are.
fn pick_device(snap: &crate::snapshot::Snapshot, device: Option<i64>) -> Result<&crate::snapshot::Device, String> {
    let d = match device {
        Some(want) => snap.devices.iter().find(|d| d.device == want),
        None => snap.devices.first(),
    };
    d.ok_or_else(|| {
        let devices: Vec<i64> = snap.devices.iter().map(|d| d.device).collect();
        format!("no device {} (devices: {devices:?})", device.unwrap_or(0))
    })
}

/// The segment map text, or a usage error (no such device or event).
fn state(file: &std::path::Path, event: &str, device: Option<i64>) -> Result<Result<String, String>, IngestError> {
    let snap = ingest::ingest_path(file, &options())?.snapshot;
    let d = match pick_device(&snap, device) {
        Ok(d) => d,
        Err(usage) => return Ok(Err(usage)),
    };
    let n = snap.device_events(d).len();
    let replay = || crate::replay::Replay::run_with(&snap, d, &mut (), false);
    let (state, title) = match event {
        "final" => (crate::replay::final_state(d), format!("device {}, final", d.device)),
        "start" => (replay().state_at(&snap, None), format!("device {}, before the first of {n} events", d.device)),
        "oom" => match snap.device_events(d).iter().position(|e| e.action == crate::snapshot::Action::OOM) {
            Some(i) => {
                (replay().state_at(&snap, Some(i)), format!("device {}, at the OOM (event {i} of {n})", d.device))
            }
            None => return Ok(Err("this trace has no OOM".into())),
        },
        n_str => match n_str.parse::<usize>() {
            Ok(i) if i < n => {
                let action = snap.action_name(snap.device_events(d)[i].action).to_string();
                (replay().state_at(&snap, Some(i)), format!("device {}, after event {i} ({action}) of {n}", d.device))
            }
            _ => {
                let range = if n == 0 { "(this trace has no events)".to_string() } else { format!("0 to {}", n - 1) };
                return Ok(Err(format!("--event must be an event index {range}, start, oom or final; got {n_str:?}")));
            }
        },
    };
    Ok(Ok(segmap::render(&snap, &state, &title)))
}

/// The commands other than `serve` log only where `FRAGSCOPE_LOG` asks (to standard error):
/// `FRAGSCOPE_LOG=debug` tells how a big file's read in two parts went.
fn log_if_asked() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("FRAGSCOPE_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::io::stderr).init();
    }
}

fn serve(config: crate::config::Config) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FRAGSCOPE_LOG")
        .unwrap_or_else(|_| "info,tower_http=warn,sqlx=warn".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fragscope: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let served = runtime.block_on(crate::web::serve(config));
    // An analysis still parsing was given back to the queue: do not wait for it to finish.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fragscope: {e}");
            ExitCode::from(1)
        }
    }
}

/// Reading options for the commands: the reader, model and analysis held to the memory the
/// process may take (`config::cli_memory_budget`), so that a file too big for it is refused
/// by name (exit 2) rather than aborting on a failed allocation.
pub(crate) fn options() -> ingest::Options {
    options_within(crate::config::cli_memory_budget())
}

/// The server's reading options (`service::ingest_options`, which the CLI may not use) with
/// a budget always set, and no hash: only `analyze --sha256` prints one.
fn options_within(budget: u64) -> ingest::Options {
    ingest::Options { memory: Some(analysis::cost::costs(budget)), hash: false, ..ingest::Options::default() }
}

fn fail(file: &std::path::Path, e: IngestError) -> ExitCode {
    eprintln!("fragscope: {}: {e}", file.display());
    match e {
        IngestError::Io(_) => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}

fn analyze(file: &std::path::Path, json: bool, options: analysis::Options, hash: bool) -> Result<(), Failed> {
    // Where the file's hash is asked for, the analysis runs while it is finished; its source
    // is filled in after.
    let budget = crate::config::cli_memory_budget();
    let reading = ingest::Options { hash, ..options_within(budget) };
    let (ingested, analyzed) = ingest::ingest_path_then(file, &reading, |snapshot| {
        analysis::cost::within(snapshot, budget)?;
        Ok(analysis::analyze_with(snapshot, crate::snapshot::Source::default(), analysis::Depth::Report, options))
    })?;
    let mut analyzed = analyzed.map_err(|e: analysis::OverBudget| IngestError::Unsupported(e.to_string()))?;
    analyzed.analysis.source = ingested.source;
    let analysis = &analyzed.analysis;
    // The process ends right after printing: freeing the model piece by piece would only cost
    // time (a tenth of a second on a 243 MiB snapshot), so leave it to the OS.
    std::mem::forget(ingested.snapshot);
    std::mem::forget(analyzed.replays);
    std::mem::forget(analyzed.indexes);
    to_stdout(|out| {
        if json {
            serde_json::to_writer_pretty(&mut *out, analysis).map_err(std::io::Error::from)?;
            writeln!(out)
        } else {
            write_text(out, file, analysis)
        }
    })
    .map_err(Failed::Write)
}

/// Why a command that prints a report failed: its input, or standard output.
enum Failed {
    Read(IngestError),
    Write(std::io::Error),
}

impl From<IngestError> for Failed {
    fn from(e: IngestError) -> Self {
        Failed::Read(e)
    }
}

/// Exit 1 where standard output failed (a full disk), naming it rather than the input.
fn failed(file: &std::path::Path, e: Failed) -> ExitCode {
    match e {
        Failed::Read(e) => fail(file, e),
        Failed::Write(e) => {
            eprintln!("fragscope: cannot write the report to standard output: {e}");
            ExitCode::from(1)
        }
    }
}

/// Prints a command's text (`state`, `simulate`) as the reports are printed: a full disk is
/// exit 1 by name, not a panic or a silent success.
fn print_text(file: &std::path::Path, text: &str) -> ExitCode {
    match to_stdout(|out| out.write_all(text.as_bytes())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(file, Failed::Write(e)),
    }
}

/// Writes a report to standard output through one buffer, flushed before the answer: a
/// pretty-printed report of a real trace is tens of thousands of lines, and standard output
/// alone writes each line with a system call of its own (77,000 on train_big: 0.1 s of CPU
/// of the run's 0.97). The buffer's own flush on drop would lose a failure (a full
/// disk) unseen. A closed pipe (`| head`) is not an error worth reporting.
fn to_stdout(
    write: impl FnOnce(&mut std::io::BufWriter<std::io::StdoutLock<'static>>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}

fn write_text(out: &mut impl Write, file: &std::path::Path, a: &Analysis) -> std::io::Result<()> {
    let s = &a.source;
    let protocol = s.pickle_protocol.map(|p| format!(" protocol {p}")).unwrap_or_default();
    let compression = if s.compression == "none" { String::new() } else { format!(", {}", s.compression) };
    writeln!(
        out,
        "{}: {}{protocol}{compression}, {}{}",
        file.display(),
        s.encoding,
        bytes(s.bytes),
        s.sha256.as_ref().map(|h| format!(", sha256 {h}")).unwrap_or_default()
    )?;
    if a.devices.is_empty() {
        writeln!(out, "no segments and no trace: nothing was allocated while recording")?;
    }
    for d in &a.devices {
        let f = &d.final_state;
        writeln!(out, "device {}", d.device)?;
        let ranges = if f.expandable_ranges > 0 {
            format!(" + {} expandable ranges", f.expandable_ranges)
        } else {
            String::new()
        };
        writeln!(out, "  reserved    {:>12}  in {} segments{ranges}", bytes(f.reserved_bytes), f.segments)?;
        writeln!(out, "  allocated   {:>12}  in {} allocations", bytes(f.allocated_bytes), f.allocations)?;
        writeln!(out, "  active      {:>12}", bytes(f.active_bytes))?;
        writeln!(
            out,
            "  free        {:>12}  reserved but unallocated",
            bytes(f.reserved_bytes - f.allocated_bytes.min(f.reserved_bytes))
        )?;
        writeln!(out, "  largest free block {}", bytes(f.largest_free_block_bytes))?;
        writeln!(out, "  inactive split: {} blocks, {}", f.inactive_split_blocks, bytes(f.inactive_split_bytes))?;
        let t = &d.trace;
        let span = match (t.first_time_us, t.last_time_us) {
            (Some(a), Some(b)) => format!(" over {:.3} s", (b - a) as f64 / 1e6),
            _ => String::new(),
        };
        let actions: Vec<String> = t.actions.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(out, "  trace: {} events{span} ({})", t.events, actions.join(", "))?;
        report::write_diagnosis(out, d)?;
    }
    Ok(())
}
