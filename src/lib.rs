//! fragscope: why did the GPU run out of memory?
//!
//! Reads PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`), replays the
//! allocator's trace, and names the free memory that live blocks pin and what to change.
//!
//! Data flows one way, one module per stage:
//!
//! 1. [`reader`]: hostile bytes to values (pickle or JSON); never executes, caps everything.
//! 2. [`snapshot`]: values to the typed model (segments, blocks, compact events, stacks).
//! 3. [`ingest`]: the only caller of the reader: sniffs and decompresses, then 1 and 2.
//! 4. [`analysis`]: every number reported about a snapshot.
//! 5. [`cli`]: the `fragscope` command's subcommands and their text output.
//!
//! Dependencies point down this list only; the reader depends on nothing in the crate.

pub mod analysis;
pub mod cli;
pub mod ingest;
pub mod reader;
pub mod replay;
pub mod snapshot;
pub mod units;
