//! Errors of the reader: every one carries the byte offset where reading stopped.

use std::fmt;

/// Why the reader stopped, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub kind: ErrorKind,
    /// Offset in the (decompressed) input of the opcode or token that failed.
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input ended in the middle of a value.
    Truncated,
    /// An opcode that would import or call code (GLOBAL, REDUCE, ...): never executed.
    Refused {
        opcode: &'static str,
    },
    /// A byte that is no pickle opcode, or one this reader does not implement.
    UnknownOpcode(u8),
    UnsupportedProtocol(u8),
    /// A named limit from [`super::Limits`] would be exceeded.
    Limit {
        what: &'static str,
        limit: u64,
    },
    /// The values read so far would take more memory than [`super::Limits::max_heap_bytes`].
    Memory {
        containers: u64,
        values: u64,
        bytes: u64,
        limit: u64,
    },
    /// A memo get of an index that was never put.
    MemoMissing(u64),
    /// An opcode found too few values on the stack, or no MARK.
    StackUnderflow {
        opcode: &'static str,
    },
    /// An opcode found a value of the wrong kind (APPEND onto a dict, a list as a dict key...).
    WrongType {
        opcode: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    /// A container refers to itself; snapshots never do.
    Recursive,
    BadUtf8,
    IntTooLarge,
    BadText(&'static str),
    /// The input was JSON and serde_json refused it.
    Json(String),
    /// The stream ended without STOP.
    NoStop,
    Io(String),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Truncated => write!(f, "input ends in the middle of a value (truncated file?)"),
            ErrorKind::Refused { opcode } => write!(
                f,
                "refused pickle opcode {opcode}: it would import or call Python code, and a memory snapshot never needs it"
            ),
            ErrorKind::UnknownOpcode(op) => write!(f, "unknown pickle opcode 0x{op:02x}"),
            ErrorKind::UnsupportedProtocol(p) => write!(f, "pickle protocol {p} is not supported (0 to 5 are)"),
            ErrorKind::Limit { what, limit } => write!(f, "{what} exceeds the limit of {limit}"),
            ErrorKind::Memory { containers, values, bytes, limit } => write!(
                f,
                "{containers} containers holding {values} values take about {} MiB, past the memory budget of {} MiB",
                bytes >> 20,
                limit >> 20
            ),
            ErrorKind::MemoMissing(i) => write!(f, "memo index {i} was never stored"),
            ErrorKind::StackUnderflow { opcode } => write!(f, "{opcode} found too few values on the stack"),
            ErrorKind::WrongType { opcode, expected, found } => {
                write!(f, "{opcode} expected {expected}, found {found}")
            }
            ErrorKind::Recursive => write!(f, "a container contains itself"),
            ErrorKind::BadUtf8 => write!(f, "string is not valid UTF-8"),
            ErrorKind::IntTooLarge => write!(f, "integer does not fit in 64 bits"),
            ErrorKind::BadText(what) => write!(f, "malformed {what}"),
            ErrorKind::Json(msg) => write!(f, "invalid JSON: {msg}"),
            ErrorKind::NoStop => write!(f, "pickle ends without STOP (truncated file?)"),
            ErrorKind::Io(msg) => write!(f, "read failed: {msg}"),
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.kind, self.offset)
    }
}

impl std::error::Error for ReadError {}

/// A reader failure, or the sink's refusal of a value it was handed.
#[derive(Debug)]
pub enum Failure<E> {
    Read(ReadError),
    Sink { error: E, offset: u64 },
}

impl<E> From<ReadError> for Failure<E> {
    fn from(e: ReadError) -> Self {
        Failure::Read(e)
    }
}
