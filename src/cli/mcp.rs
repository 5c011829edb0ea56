//! `fragscope mcp`: a Model Context Protocol server on stdin/stdout, so that a coding agent can
//! ask why a job ran out of memory. Its tools are the command line's verbs on snapshot files of
//! this machine: analyze, state and breakdown at an event, simulate a setting, compare two.
//! Each answers with the same JSON document as the REST API; a bad file or argument answers
//! with a tool error that says what is wrong (the agent reads it), never a crash.
//!
//! The protocol is the `rmcp` crate's (the official SDK), not a JSON-RPC loop of our own. The
//! last file analysed is kept, so that state and breakdown at many events cost one parse.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

use crate::analysis::{self, Analyzed};
use crate::ingest;
use crate::snapshot::Snapshot;

/// A parsed and analysed file, kept for the next question about it.
struct Held {
    path: PathBuf,
    modified: Option<std::time::SystemTime>,
    snapshot: Snapshot,
    analyzed: Analyzed,
}

#[derive(Clone)]
pub struct Server {
    tool_router: ToolRouter<Self>,
    held: Arc<Mutex<Option<Arc<Held>>>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AnalyzeArgs {
    /// A snapshot file: pickle (protocol 2-5) or JSON, optionally gzip- or zstd-compressed.
    pub file: String,
    /// The job's memory budget in bytes: remedies are weighed against it.
    pub capacity_bytes: Option<u64>,
    /// The device's total memory in bytes, to tell what the process held outside PyTorch.
    pub device_total_bytes: Option<u64>,
}

/// An event: its index (0 is the first), or "oom" (the first OOM), or "final" (the end).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum EventArg {
    Index(u64),
    Name(String),
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AtArgs {
    /// A snapshot file.
    pub file: String,
    /// An event index, "oom" or "final" (default).
    pub event: Option<EventArg>,
    /// The device (default: the first).
    pub device: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SimulateArgs {
    /// A snapshot file.
    pub file: String,
    /// PYTORCH_CUDA_ALLOC_CONF to try, e.g. "expandable_segments:True"; "" is the default
    /// allocator; absent, the snapshot's own settings.
    pub conf: Option<String>,
    /// The memory budget in bytes; without it, no OOM is predicted.
    pub capacity_bytes: Option<u64>,
    /// A call site (`file.py:123` or a function name) whose allocations go to a private MemPool.
    pub mempool: Option<String>,
    /// A call site whose allocations are served from reused buffers.
    pub reuse: Option<String>,
    /// The device (default: the first).
    pub device: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CompareArgs {
    /// The first snapshot file ("before").
    pub a: String,
    /// The second ("after").
    pub b: String,
}

fn json(value: &impl serde::Serialize) -> CallToolResult {
    match serde_json::to_string(value) {
        Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        Err(e) => refuse(format!("could not write the answer: {e}")),
    }
}

fn refuse(why: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(why)])
}

/// Runs CPU-heavy work off the protocol's thread; its error is the tool's error text.
async fn blocking(work: impl FnOnce() -> Result<CallToolResult, String> + Send + 'static) -> CallToolResult {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => refuse(why),
        Err(e) => refuse(format!("the tool failed: {e}")),
    }
}

fn read(file: &Path) -> Result<(Snapshot, crate::snapshot::Source), String> {
    let ingested = ingest::ingest_path(file, &super::options()).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok((ingested.snapshot, ingested.source))
}

fn device_index(snapshot: &Snapshot, device: Option<i64>) -> Result<usize, String> {
    match device {
        None if !snapshot.devices.is_empty() => Some(0),
        Some(want) => snapshot.devices.iter().position(|d| d.device == want),
        None => None,
    }
    .ok_or_else(|| {
        let devices: Vec<i64> = snapshot.devices.iter().map(|d| d.device).collect();
        format!("no device {} (devices: {devices:?})", device.unwrap_or(0))
    })
}

/// The event an argument names on device `i`: None for the end.
fn event_of(held: &Held, i: usize, event: &Option<EventArg>) -> Result<Option<u64>, String> {
    let d = &held.snapshot.devices[i];
    let events = held.snapshot.device_events(d);
    match event {
        None => Ok(None),
        Some(EventArg::Index(e)) if (*e as usize) < events.len() => Ok(Some(*e)),
        Some(EventArg::Name(n)) if n == "final" => Ok(None),
        Some(EventArg::Name(n)) if n == "oom" => events
            .iter()
            .position(|e| e.action == crate::snapshot::Action::OOM)
            .map(|e| Some(e as u64))
            .ok_or_else(|| "this trace has no OOM".to_string()),
        Some(EventArg::Name(n)) if n.parse::<u64>().is_ok() => {
            event_of(held, i, &Some(EventArg::Index(n.parse().unwrap_or(0))))
        }
        Some(other) => Err(format!(
            "event must be an index from 0 to {}, \"oom\" or \"final\"; got {other:?}",
            events.len().saturating_sub(1)
        )),
    }
}

impl Server {
    /// The last call's parse, when it was of this file and the file has not changed since.
    fn cached(&self, file: &str) -> Result<Option<Arc<Held>>, String> {
        let path = PathBuf::from(file);
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let held = self.held.lock().map_err(|e| e.to_string())?;
        Ok(held.as_ref().filter(|h| h.path == path && h.modified == modified).cloned())
    }

    /// The file parsed and analysed, from the last call when it has not changed since.
    fn held(&self, file: &str) -> Result<Arc<Held>, String> {
        if let Some(h) = self.cached(file)? {
            return Ok(h);
        }
        let path = PathBuf::from(file);
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let (snapshot, source) = read(&path)?;
        let analyzed = analysis::analyze(&snapshot, source, analysis::Depth::Serve);
        let held = Arc::new(Held { path, modified, snapshot, analyzed });
        *self.held.lock().map_err(|e| e.to_string())? = Some(held.clone());
        Ok(held)
    }
}

impl Server {
    /// A question about one device at one event of a file (`state`, `breakdown`).
    async fn at(
        &self,
        a: AtArgs,
        answer: impl FnOnce(&Held, usize, Option<u64>) -> CallToolResult + Send + 'static,
    ) -> CallToolResult {
        let me = self.clone();
        blocking(move || {
            let held = me.held(&a.file)?;
            let i = device_index(&held.snapshot, a.device)?;
            let event = event_of(&held, i, &a.event)?;
            Ok(answer(&held, i, event))
        })
        .await
    }
}

#[tool_router]
impl Server {
    pub fn new() -> Self {
        Server { tool_router: Self::tool_router(), held: Arc::new(Mutex::new(None)) }
    }

    #[tool(
        description = "Why a PyTorch CUDA memory snapshot ran out of memory: the verdict (fragmentation, capacity, no OOM), what the step needed against the budget, what fills memory by category and call site, any growth (leak), and the remedies with their predicted effect. The same JSON as fragscope's REST API analysis."
    )]
    async fn analyze(&self, Parameters(a): Parameters<AnalyzeArgs>) -> Result<CallToolResult, ErrorData> {
        let me = self.clone();
        Ok(blocking(move || {
            // Without a budget or device total, the analysis kept for state and breakdown is
            // this one: the agent's usual next questions then cost no second parse.
            if a.capacity_bytes.is_none() && a.device_total_bytes.is_none() {
                return Ok(json(&me.held(&a.file)?.analyzed.analysis));
            }
            let (snapshot, source) = read(Path::new(&a.file))?;
            let options = analysis::Options { capacity: a.capacity_bytes, device_total: a.device_total_bytes };
            Ok(json(&analysis::analyze_with(&snapshot, source, analysis::Depth::Report, options).analysis))
        })
        .await)
    }

    #[tool(
        description = "The allocator's segments and blocks right after an event (or at the end): each segment's blocks with size, state, category and frames, and the free gaps pinned by live blocks."
    )]
    async fn state(&self, Parameters(a): Parameters<AtArgs>) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .at(a, |held, i, event| {
                json(&held.analyzed.indexes[i].segment_map_at(
                    &held.snapshot,
                    &held.snapshot.devices[i],
                    &held.analyzed.replays[i],
                    event,
                ))
            })
            .await)
    }

    #[tool(
        description = "What fills memory right after an event (or at the end): allocated bytes by category (parameter, gradient, optimizer_state, activation, temporary, input, kv_cache, other, unknown) and the top call sites."
    )]
    async fn breakdown(&self, Parameters(a): Parameters<AtArgs>) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .at(a, |held, i, event| {
                json(&held.analyzed.indexes[i].breakdown_at(
                    &held.snapshot,
                    &held.snapshot.devices[i],
                    &held.analyzed.replays[i],
                    event,
                ))
            })
            .await)
    }

    #[tool(
        description = "Replays the trace through a model of PyTorch's caching allocator under other settings (PYTORCH_CUDA_ALLOC_CONF, a MemPool or a reused buffer for one call site) within a budget: whether it would still run out of memory, and its peaks."
    )]
    async fn simulate(&self, Parameters(a): Parameters<SimulateArgs>) -> Result<CallToolResult, ErrorData> {
        let me = self.clone();
        Ok(blocking(move || {
            // The file an earlier call parsed is not parsed again (a simulation needs no analysis:
            // an unheld file is only read).
            let held = me.cached(&a.file)?;
            let read_now = match &held {
                Some(_) => None,
                None => Some(read(Path::new(&a.file))?.0),
            };
            let snapshot = held.as_ref().map(|h| &h.snapshot).or(read_now.as_ref()).expect("one of them");
            let i = device_index(snapshot, a.device)?;
            let settings = crate::simulate::Settings {
                conf: a.conf,
                capacity: a.capacity_bytes,
                mempool: a.mempool,
                reuse: a.reuse,
                shrink: None,
            };
            Ok(json(&crate::simulate::simulate(snapshot, &snapshot.devices[i], &settings).map_err(|e| e.to_string())?))
        })
        .await)
    }

    #[tool(
        description = "Compares two snapshots (a run and the same run after a change, or two ranks): both verdicts, the settings that changed, peaks, categories and the call sites that changed most."
    )]
    async fn compare(&self, Parameters(a): Parameters<CompareArgs>) -> Result<CallToolResult, ErrorData> {
        Ok(blocking(move || {
            let analysed = |file: &str| -> Result<analysis::Analysis, String> {
                let (snapshot, source) = read(Path::new(file))?;
                Ok(analysis::analyze(&snapshot, source, analysis::Depth::Report).analysis)
            };
            let (x, y) = (analysed(&a.a)?, analysed(&a.b)?);
            Ok(json(&analysis::compare::compare(&x, &y)))
        })
        .await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("fragscope", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "fragscope explains why a PyTorch job ran out of GPU memory, from a snapshot file \
             (torch.cuda.memory._dump_snapshot). Start with analyze; then breakdown or state at \
             an event it names, simulate to try an allocator setting, compare for a rerun.",
            )
    }
}

/// Serves the tools on stdin/stdout until the client closes them.
pub fn run() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let service = Server::new().serve(rmcp::transport::stdio()).await.map_err(|e| e.to_string())?;
        service.waiting().await.map_err(|e| e.to_string())?;
        Ok(())
    })
}
