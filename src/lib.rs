//! fragscope: why did the GPU run out of memory?
//!
//! Reads PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`), replays the
//! allocator's trace, and names the free memory that live blocks pin and what to change.
//!
//! Data flows one way, one module per stage:
//!
//! 0. `units`, `config`, [`machine`] (memory pages, the allocator's tuning, free cores): used by any.
//! 1. `reader`: hostile bytes to values (pickle or JSON); never executes, caps everything.
//! 2. [`snapshot`]: values to the typed model (segments, blocks, compact events, stacks).
//! 3. [`ingest`]: the only caller of the reader: sniffs and decompresses, then 1 and 2.
//! 4. [`replay`]: the allocator's state right after any event; checkpoints; observers.
//! 5. [`analysis`]: every number reported about a snapshot, and the diagnosis;
//!    [`simulate`]: the trace replayed through a model of the allocator under other settings.
//! 6. `store`: every file write and SQL query: uploads, metadata, results.
//! 7. `service`: upload admission, the analysis queue and parsed snapshots in memory.
//! 8. [`web`]: the HTTP API and pages; [`cli`]: the `fragscope` command; `config`.
//!
//! Dependencies point down this list only; the reader depends on nothing in the crate, and
//! the web layer never reaches into the reader.

#![warn(missing_docs)]
pub mod analysis;
pub mod cli;
pub(crate) mod config;
pub mod ingest;
pub mod machine;
pub(crate) mod reader;
pub mod replay;
pub(crate) mod service;
pub mod simulate;
pub mod snapshot;
pub(crate) mod store;
#[cfg(test)]
pub(crate) mod testkit;
pub(crate) mod units;
pub mod web;
