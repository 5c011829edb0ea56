//! The reader: hostile bytes in, values out. This is fragscope's security boundary.
//!
//! Why not serde-pickle: it fails on every real snapshot (`Syntax(Recursive)`: its memo
//! reference counting breaks on a shared list of shared dicts, which is how torch writes stack
//! frames), and its workaround silently replaces shared data with None. Generic pickle crates
//! also build one owned tree, which multiplies memory by the sharing factor. This reader keeps
//! shared values shared (one heap container per pickled object) and lets a [`Sink`] fold each
//! trace-entry dict into a compact record the moment it is complete, so three million events
//! never exist as a generic tree.
//!
//! What it accepts: pickle protocols 0 to 5 holding builtins only (dict, list, tuple, set, str,
//! bytes, int, float, bool, None), and JSON (see [`read_json`]).
//! What it refuses, naming the opcode and its byte offset: GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
//! NEWOBJ, NEWOBJ_EX, INST, OBJ, PERSID, BINPERSID, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER: the
//! opcodes that import or call code or reach out-of-band data. Nothing is ever executed.
//! Every length, count, depth and memo index is checked against [`Limits`] before anything
//! is allocated; a container can no longer change once it is placed in another, which rules
//! out cycles. Errors are [`ReadError`]s with the offset of the failing opcode; nothing panics.
//!
//! Trace entries, millions to a snapshot, are read by a fast path (`pickle/entry.rs`) that
//! takes only the opcodes torch's entries are made of, checks what the general machine
//! checks, and hands anything else back to it from the entry's first byte; the two are held to
//! the same result by differential tests and a fuzz target of their own. It can be switched off
//! ([`Limits::entry_fast_path`]).
//!
//! A file that can be opened again at any offset may be read in two parts at once
//! ([`read_pickle_split`], `pickle/split.rs`): a second thread reads the back half of the list
//! that holds most of it from a copy of the first part's state, and the first part takes that
//! in only once it has checked every assumption the second part made, and that together they
//! keep every limit; otherwise it reads on alone. Values, errors and offsets are a single
//! read's either way (differential tests, and a third fuzz target).
//!
//! The reader depends on nothing else in the crate.

mod error;
mod input;
mod json;
mod limits;
mod memo;
mod pickle;
mod text;
mod value;

pub use error::{ErrorKind, Failure, ReadError};
pub use json::read_json;
pub use limits::Limits;
pub use pickle::{Open, Split};
pub use value::{Heap, Ids, Kind, StrId, Strings, Value};

/// What a read produced: the root value and the heap its containers live in.
#[derive(Debug)]
pub struct Parsed {
    pub root: Value,
    pub heap: Heap,
    /// The PROTO opcode's protocol; None for JSON and for protocols 0 and 1 (which have none).
    pub protocol: Option<u8>,
    pub bytes_read: u64,
    /// Dicts the entry fast path read (the general machine read the rest).
    pub fast_dicts: u64,
    /// The bytes a second thread read and how its time went, where a split read took its
    /// part in.
    pub later_part: Option<LaterPart>,
}

/// How the later part of a read in two parts went ([`Split`]), for the bench and the log: a
/// machine whose second core is slower or shared shows here as a wait.
#[derive(Debug, Clone)]
pub struct LaterPart {
    /// The bytes the second thread read.
    pub bytes: std::ops::Range<u64>,
    /// Where the earlier part was when it started the later one.
    pub forked_at: u64,
    /// The later part's walk to its start,
    pub walked: std::time::Duration,
    /// and its read from there.
    pub read: std::time::Duration,
    /// How long the earlier part, at the start, waited for the later part to finish (about
    /// zero where it had),
    pub waited: std::time::Duration,
    /// and how long taking it in took.
    pub took_in: std::time::Duration,
    /// The earlier part, there first and reading faster, stopped the later part at its next
    /// batch and read the rest itself ([`Split::overtake`]).
    pub stopped: bool,
}

/// Most fields a sink folds dicts by (see [`Sink::field`]).
pub const MAX_FIELDS: usize = 16;

/// A dict's values by field (see [`Sink::field`]).
pub type Fields = [Option<Value>; MAX_FIELDS];

/// Listens to the reader. The reader pushes; the sink decides what to keep compactly.
///
/// A container is complete when it is placed into another one, or earlier: Python's pickler
/// writes a container's items right after creating it, in batches of 1000, so a batch of fewer
/// on a still-empty container is all it will ever get. The pickle VM offers such a batch
/// straight from its stack, so millions of trace entries never enter the heap. A pickle that
/// changes a folded container afterwards is refused (Python never writes one).
pub trait Sink {
    type Error;

    /// Called once before reading, to intern the keys the sink will look for, so that later
    /// comparisons are of ids.
    fn prepare(&mut self, _strings: &mut Strings) {}

    /// Called once for each dict when it is complete, with its items (key, value, key, ...).
    /// Returning `Some(id)` replaces the dict by `Value::Folded(id)`; its items are not kept.
    fn fold_dict(&mut self, _heap: &Heap, _items: &[Value]) -> Result<Option<u32>, Self::Error> {
        Ok(None)
    }

    /// The field of a dict key, where the sink folds dicts by a few keys (at most
    /// [`MAX_FIELDS`]) and ignores every other: the entry fast path then sorts a dict's values
    /// into fields as it reads them and calls [`Sink::fold_fields`], instead of handing over
    /// the pairs. None for a key the sink ignores, and for every key of a sink that does not.
    fn field(&self, _key: Value) -> Option<usize> {
        None
    }

    /// Whether [`Sink::field`] names fields at all.
    fn takes_fields(&self) -> bool {
        false
    }

    /// [`Sink::fold_dict`] for a dict given as its fields: each the value of the last pair
    /// whose key has that field. It must answer as `fold_dict` does for the pairs.
    fn fold_fields(&mut self, _heap: &Heap, _fields: &Fields) -> Result<Option<u32>, Self::Error> {
        Ok(None)
    }

    /// The same for each non-empty list (a stack's frames list, say). The same items must
    /// fold the same way each time: the entry fast path reuses the answer for a list of the
    /// same memoized containers.
    fn fold_list(&mut self, _heap: &Heap, _items: &[Value]) -> Result<Option<u32>, Self::Error> {
        Ok(None)
    }

    /// A sink for a later part of the same read, read on another thread from this one's
    /// state now (see [`read_pickle_split`]); None where it cannot be split.
    fn fork(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Takes in what `later`, forked from this sink, knows from the part after the one this
    /// sink has read by now (the names its folded ids stand for); `ids` maps the later part's
    /// string and container ids to this read's. Returns how its folded ids map to this
    /// read's, or None, changing nothing, if the two cannot be joined (together they pass a
    /// limit): the read then goes on in one part. [`Sink::append`] follows.
    fn join(&mut self, _later: &mut Self, _ids: &Ids) -> Option<Box<dyn FoldedIds + Send + Sync>>
    where
        Self: Sized,
    {
        None
    }

    /// Appends what `later` folded (its records, many), once [`Sink::join`] has taken it in:
    /// the reader maps the rest of the later part meanwhile, on another thread.
    fn append(&mut self, _later: Self)
    where
        Self: Sized,
    {
    }
}

/// How the folded ids of a later part read apart map to the whole read's (see [`Sink::join`]).
pub trait FoldedIds {
    /// The whole read's id of one.
    fn map(&self, later: u32) -> u32;

    /// The first id of a run of `len` consecutive ids from `start`, if they map to
    /// consecutive ids (a trace's entries do): a list of millions of them stays a few runs.
    fn run(&self, _start: u32, _len: u32) -> Option<u32> {
        None
    }
}

/// A sink that folds nothing: the whole value tree is kept (the reader's own tests).
#[cfg(test)]
pub struct KeepAll;

#[cfg(test)]
impl Sink for KeepAll {
    type Error = std::convert::Infallible;
}

/// Reads one pickle from `reader`, up to its STOP opcode.
pub fn read_pickle<R: std::io::Read, S: Sink>(
    reader: R,
    limits: &Limits,
    sink: &mut S,
) -> Result<Parsed, Failure<S::Error>> {
    pickle::read(reader, limits, sink)
}

/// Reads one pickle as [`read_pickle`] does, reading the list that holds most of it (a
/// snapshot's trace) in two parts at once where it can: same values, same errors.
pub fn read_pickle_split<S: Sink + Send + 'static>(
    split: Split,
    limits: &Limits,
    sink: &mut S,
) -> Result<Parsed, Failure<S::Error>> {
    pickle::read_split(split, limits, sink)
}

#[cfg(test)]
mod tests;
