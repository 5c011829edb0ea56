//! Ingest: the only caller of the reader. Bytes in, a [`Snapshot`] out.
//!
//! Sniffs the format by magic bytes (never by file name): `80` pickle, `1f 8b` gzip,
//! `28 b5 2f fd` zstd, `{`/`[` JSON, anything else is tried as a protocol 0/1 pickle.
//! Decompression is capped twice: by the reader's input-size limit, and by a ratio (output may
//! not outgrow input by more than `max_ratio`, after a grace of 64 MiB), so a bomb stops early.
//! The raw bytes are hashed as they pass (sha256, the content address a notebook can compute
//! with hashlib) and counted for progress reports.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

mod gzip;
mod input;
mod two_parts;

use input::{Counted, Peek, Prefetch, RatioCap, SharedCount, read_full};

/// How a read in two parts went: [`Ingested::later_part`].
pub use crate::reader::LaterPart;
use crate::reader::{self, Failure, Limits, ReadError};
use crate::snapshot::{self, ModelError, Snapshot, SnapshotSink, Source};

/// Limits for one ingest.
#[derive(Debug, Clone)]
pub struct Options {
    /// The reader's caps on sizes, depth and counts.
    pub limits: Limits,
    /// Most trace events accepted over all devices.
    pub max_events: u64,
    /// Largest accepted decompressed/compressed ratio.
    pub max_ratio: u64,
    /// Raw bytes consumed so far, for progress reports.
    pub progress: Option<Arc<AtomicU64>>,
    /// When a file on disk is read in two parts at once (None: never).
    pub two_parts: Option<TwoParts>,
    /// Whether the raw bytes are hashed (`Source::sha256`) as they are read.
    pub hash: bool,
    /// The memory the read, the model and the analysis may take together, and what each
    /// part costs (`analysis::cost::costs`): the reader's values, the events and each
    /// segment's blocks are charged to it before they are made. None: only the counts cap them.
    pub memory: Option<snapshot::Budget>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            max_events: 100_000_000,
            max_ratio: 200,
            progress: None,
            two_parts: TwoParts::where_cores_allow(),
            hash: true,
            memory: None,
        }
    }
}

/// When a pickle file is read in two parts at once, on two cores (`reader::Split`): its
/// trace's back half on a thread of its own. The result is the same either way.
#[derive(Debug, Clone, Copy)]
pub struct TwoParts {
    /// Files smaller than this are read in one part.
    pub min_bytes: u64,
    /// The list split must hold this many items when the first part reaches the fork.
    pub min_items: usize,
    /// The second part is started this share of the way into the file (thousandths),
    pub fork_share: u64,
    /// once this many trace entries in a row met no new frame (see `reader::Split`).
    pub quiet: u64,
    /// It starts at least this share of the way through what is left then (thousandths),
    pub later_share: u64,
    /// and, where `pace` is set, where the two parts are then on course to finish together,
    /// from how far the first has come while the second walked (see `reader::Split::pace`);
    /// else right there.
    pub pace: bool,
    /// The first part, at the second's start while the second still reads, stops it and reads
    /// the rest itself where it has read this much faster (thousandths; see
    /// `reader::Split::overtake`).
    pub overtake: u64,
    /// Probe for a free second core before each such read (false: always two parts).
    pub measure: bool,
}

impl TwoParts {
    /// The split, where the machine has two cores or more; whether a file is then read in two
    /// parts is measured when it is opened ([`TwoParts::measure`]).
    pub fn where_cores_allow() -> Option<TwoParts> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores >= 2).then(TwoParts::default)
    }

    /// Whether a file that qualifies is read in two parts now: where `measure` is set, only if
    /// a second core is free at the moment (`machine::cores::second_core_free`, 5 ms where it
    /// is, 15 where it is not). Two parts take a quarter more CPU time in all (the later part's
    /// walk to its start, the copies it takes in), which a busy second core does not win back.
    fn now(&self) -> bool {
        !self.measure || crate::machine::cores::second_core_free()
    }
}

impl Default for TwoParts {
    fn default() -> Self {
        TwoParts {
            min_bytes: 48 << 20,
            min_items: 4000,
            fork_share: 20,
            quiet: 4000,
            later_share: 300,
            pace: true,
            overtake: 1500,
            measure: true,
        }
    }
}

/// A parsed snapshot and what its file was.
#[derive(Debug)]
pub struct Ingested {
    /// The typed model.
    pub snapshot: Snapshot,
    /// Size, hash and format of the file.
    pub source: Source,
    /// Dicts the reader's fast path for trace entries read (the rest went through its general
    /// machine): what the tests and the bench check the fast path by.
    pub fast_dicts: u64,
    /// The bytes a second thread read and how its time went, where the file was read in two
    /// parts.
    pub later_part: Option<LaterPart>,
}

/// Why bytes are not a snapshot we can read.
#[derive(Debug)]
pub enum IngestError {
    /// No bytes at all.
    Empty,
    /// A format we recognise but do not read (xz, a compressed stream inside another).
    Unsupported(String),
    /// The reader refused the bytes; `stream` says which bytes the offset counts.
    Read {
        /// What the reader refused, and where.
        error: ReadError,
        /// `file`, or the decompressed stream the offset counts in.
        stream: &'static str,
    },
    /// The bytes were a valid pickle or JSON, but not a memory snapshot.
    Model {
        /// What in the snapshot had the wrong type or shape.
        error: ModelError,
        /// Bytes read when it was found.
        offset: u64,
    },
    /// Reading the input failed.
    Io(std::io::Error),
}

impl fmt::Display for IngestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IngestError::Empty => write!(f, "the file is empty"),
            IngestError::Unsupported(what) => write!(f, "{what}"),
            IngestError::Read { error, stream: "" } => write!(f, "{error}"),
            IngestError::Read { error, stream } => write!(f, "{error} of the {stream}-decompressed data"),
            IngestError::Model { error, offset } => {
                write!(f, "not a valid memory snapshot: {error} (near byte {offset})")
            }
            IngestError::Io(e) => write!(f, "could not read the file: {e}"),
        }
    }
}

impl std::error::Error for IngestError {}

impl IngestError {
    /// The input passed one of the reader's size, count or depth limits (rather than being
    /// malformed): what a server answers with 413.
    pub fn is_over_limit(&self) -> bool {
        matches!(self, IngestError::Read { error, .. } if matches!(error.kind, reader::ErrorKind::Limit { .. }))
    }

    /// The values read so far would pass the memory budget (see `Options::memory`): refused
    /// as the model's budget refusals are (422), since what stops first depends on the budget,
    /// not on the file.
    pub fn is_over_budget(&self) -> bool {
        matches!(self, IngestError::Read { error, .. } if matches!(error.kind, reader::ErrorKind::Memory { .. }))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Pickle,
    Json,
    Gzip,
    Zstd,
}

/// Checks a file's first bytes: an error for formats that are certainly not a snapshot.
pub fn check_head(head: &[u8]) -> Result<(), IngestError> {
    sniff(head).map(|_| ())
}

/// What parsing and analysing an upload of `bytes` needs at its peak, in bytes: measured on
/// real snapshots, about 1.6x an uncompressed pickle (model, series, checkpoints); a compressed
/// one unpacks to about 20x its size. `head` is the file's first bytes.
pub fn memory_estimate(bytes: u64, head: &[u8]) -> u64 {
    let unpacked = if is_compressed(head) { bytes.saturating_mul(20) } else { bytes };
    unpacked.saturating_mul(8) / 5 + (16 << 20)
}

/// Whether a file's first bytes are gzip's or zstd's.
pub fn is_compressed(head: &[u8]) -> bool {
    matches!(head, [0x1f, 0x8b, ..] | [0x28, 0xb5, 0x2f, 0xfd, ..])
}

/// The file name extension of a snapshot by its first bytes: `.pickle`, `.json`, or `.gz` /
/// `.zst` for compressed ones (what is inside is not known from the head); empty if none fits.
pub fn extension(head: &[u8]) -> &'static str {
    match sniff(head) {
        Ok(Format::Pickle) => ".pickle",
        Ok(Format::Json) => ".json",
        Ok(Format::Gzip) => ".gz",
        Ok(Format::Zstd) => ".zst",
        Err(_) => "",
    }
}

/// Opcodes a pickle of protocol 0 or 1 can start with (2 and up start with PROTO, 0x80).
const OLD_PICKLE_STARTS: &[u8] = b"(]})NIJKLMFGSTUVXdlt";

/// What a file is, by its first bytes: one rule for the server (which sees the first 64 bytes
/// of an upload) and the command line.
fn sniff(head: &[u8]) -> Result<Format, IngestError> {
    let first_text = head.iter().find(|b| !b.is_ascii_whitespace());
    Ok(match head {
        [] => return Err(IngestError::Empty),
        // Only whitespace so far: JSON may start later (the reader decides, and names the byte).
        _ if first_text.is_none() => Format::Json,
        [0x1f, 0x8b, ..] => Format::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Format::Zstd,
        [0xfd, b'7', b'z', b'X', b'Z', ..] => {
            return Err(IngestError::Unsupported(
                "xz-compressed files are not read: unpack with `xz -d`, or use gzip or zstd".into(),
            ));
        }
        [b'P', b'K', 3, 4, ..] => {
            return Err(IngestError::Unsupported("zip archives are not read: upload the snapshot inside".into()));
        }
        _ if matches!(first_text, Some(b'{') | Some(b'[')) => Format::Json,
        [0x80, ..] => Format::Pickle,
        [b, ..] if OLD_PICKLE_STARTS.contains(b) => Format::Pickle,
        _ => {
            let shown: Vec<String> = head.iter().take(8).map(|b| format!("{b:02x}")).collect();
            return Err(IngestError::Unsupported(format!(
                "not a pickle, JSON, gzip or zstd file (it starts with {}) at byte 0",
                shown.join(" ")
            )));
        }
    })
}

/// Reads a snapshot in any supported form from `raw`.
pub fn ingest<R: Read + Send + 'static>(raw: R, options: &Options) -> Result<Ingested, IngestError> {
    if !options.hash && options.progress.is_none() {
        return ingest_direct(raw, options);
    }
    let mut prefetch = Prefetch::start(raw, options.progress.clone(), options.hash);
    let decoded = decode_any(&mut prefetch, options);
    let (sha256, bytes) = prefetch.finish()?;
    let (Model { snapshot, protocol: pickle_protocol, fast_dicts, later_part }, encoding, compression) = decoded?;
    let source =
        Source { bytes, sha256, encoding: encoding.to_string(), compression: compression.to_string(), pickle_protocol };
    Ok(Ingested { snapshot, source, fast_dicts, later_part })
}

/// [`ingest`] with neither a hash nor a progress count to keep: a reading thread would only
/// copy each chunk once more, on a core that a one-part read was chosen for being busy, so
/// the decoder reads `raw` itself. The size is still the whole input's.
fn ingest_direct<R: Read>(raw: R, options: &Options) -> Result<Ingested, IngestError> {
    let count = SharedCount(std::cell::Cell::new(0));
    // Reads as big as its buffer go straight into the reader's own buffer (`BufReader` passes
    // them through), so only the sniffed head is copied.
    let mut direct = BufReader::with_capacity(64 << 10, Counted { inner: raw, count: &count });
    let decoded = decode_any(&mut direct, options);
    // As the reading thread does: on to the end, so that the size is the input's (an error
    // past what the decoder read is no error of the snapshot's, there as here).
    let _ = std::io::copy(&mut direct, &mut std::io::sink());
    let (Model { snapshot, protocol: pickle_protocol, fast_dicts, later_part }, encoding, compression) = decoded?;
    let bytes = count.0.get();
    let source = Source {
        bytes,
        sha256: None,
        encoding: encoding.to_string(),
        compression: compression.to_string(),
        pickle_protocol,
    };
    Ok(Ingested { snapshot, source, fast_dicts, later_part })
}

type Decoded = (Model, &'static str, &'static str);

/// What one decode made.
struct Model {
    snapshot: Snapshot,
    protocol: Option<u8>,
    fast_dicts: u64,
    later_part: Option<LaterPart>,
}

fn decode_any<P: Peek>(raw: &mut P, options: &Options) -> Result<Decoded, IngestError> {
    Ok({
        let format = sniff(raw.peek().map_err(IngestError::Io)?)?;
        let mut outer = raw;
        match format {
            Format::Pickle | Format::Json => {
                let m = decode(&mut outer, format, options, "")?;
                (m, if format == Format::Json { "json" } else { "pickle" }, "none")
            }
            Format::Gzip | Format::Zstd => {
                let count = SharedCount(std::cell::Cell::new(0));
                let counted = Counted { inner: &mut outer, count: &count };
                let (name, decoder): (&'static str, Box<dyn Read + '_>) = if format == Format::Gzip {
                    ("gzip", Box::new(gzip::GzipMembers::new(BufReader::new(counted))))
                } else {
                    let d = zstd::stream::read::Decoder::new(counted).map_err(IngestError::Io)?;
                    ("zstd", Box::new(d))
                };
                let capped = RatioCap { inner: decoder, raw: &count, out: 0, max_ratio: options.max_ratio };
                let mut inner = BufReader::with_capacity(64 << 10, capped);
                let inner_format = sniff(inner.fill_buf().map_err(|e| read_io(e, name))?)?;
                if matches!(inner_format, Format::Gzip | Format::Zstd) {
                    return Err(IngestError::Unsupported(format!("a compressed stream inside {name} is not read")));
                }
                let m = decode(&mut inner, inner_format, options, name)?;
                // Read the compressed stream to its end, so a truncated or corrupt trailer
                // (checksum, size) is reported rather than ignored.
                std::io::copy(&mut inner, &mut std::io::sink()).map_err(|e| read_io(e, name))?;
                (m, if inner_format == Format::Json { "json" } else { "pickle" }, name)
            }
        }
    })
}

fn read_io(e: std::io::Error, stream: &'static str) -> IngestError {
    let kind = reader::ErrorKind::Io(format!("{stream} stream is corrupt or truncated: {e}"));
    IngestError::Read { error: ReadError { kind, offset: 0 }, stream }
}

fn decode<R: Read>(input: R, format: Format, options: &Options, stream: &'static str) -> Result<Model, IngestError> {
    let mut sink = SnapshotSink::new(options.max_events).within(options.memory);
    let limits = options.limits_within();
    let parsed = if format == Format::Json {
        reader::read_json(input, &limits, &mut sink)
    } else {
        reader::read_pickle(input, &limits, &mut sink)
    };
    model(parsed, sink, stream, options.memory)
}

impl Options {
    /// The reader's limits, its values held to the memory budget where there is one.
    pub(super) fn limits_within(&self) -> Limits {
        let mut limits = self.limits.clone();
        if let Some(b) = self.memory
            && (limits.max_heap_bytes == 0 || b.bytes < limits.max_heap_bytes)
        {
            limits.max_heap_bytes = b.bytes;
        }
        limits
    }
}

/// The model from what the reader made of the input, or the error it met.
fn model(
    parsed: Result<reader::Parsed, Failure<ModelError>>,
    sink: SnapshotSink,
    stream: &'static str,
    budget: Option<snapshot::Budget>,
) -> Result<Model, IngestError> {
    let parsed = match parsed {
        Ok(p) => p,
        Err(Failure::Read(error)) => return Err(IngestError::Read { error, stream }),
        Err(Failure::Sink { error, offset }) => return Err(IngestError::Model { error, offset }),
    };
    let (protocol, offset, fast_dicts) = (parsed.protocol, parsed.bytes_read, parsed.fast_dicts);
    let later_part = parsed.later_part.clone();
    let snapshot =
        snapshot::build_within(parsed, sink, budget).map_err(|error| IngestError::Model { error, offset })?;
    Ok(Model { snapshot, protocol, fast_dicts, later_part })
}

/// Reads a snapshot file from disk; a big uncompressed pickle in two parts at once where
/// `options.two_parts` says so.
pub fn ingest_path(path: &std::path::Path, options: &Options) -> Result<Ingested, IngestError> {
    ingest_path_then(path, options, |_| ()).map(|(ingested, ())| ingested)
}

/// [`ingest_path`], and `then` on the snapshot as soon as it is built: where the file is read
/// in two parts, the file's hash is still being finished on another core meanwhile (a
/// tenth of a big read), so work that does not need the hash goes in `then`.
pub fn ingest_path_then<T>(
    path: &std::path::Path,
    options: &Options,
    then: impl FnOnce(&Snapshot) -> T,
) -> Result<(Ingested, T), IngestError> {
    let mut file = std::fs::File::open(path).map_err(IngestError::Io)?;
    if let Some(parts) = options.two_parts {
        let len = file.metadata().map_err(IngestError::Io)?.len();
        let mut head = [0u8; 64];
        let n = read_full(&mut file, &mut head).map_err(IngestError::Io)?;
        if len >= parts.min_bytes && matches!(sniff(&head[..n]), Ok(Format::Pickle)) && parts.now() {
            return two_parts::ingest(path, len, parts, options, then);
        }
        file = std::fs::File::open(path).map_err(IngestError::Io)?;
    }
    let ingested = ingest(file, options)?;
    let out = then(&ingested.snapshot);
    Ok((ingested, out))
}
