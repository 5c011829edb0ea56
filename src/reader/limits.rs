//! Every size, count and depth the reader accepts, in one place.

/// Caps checked before anything is allocated. The defaults hold real snapshots of several GB
/// with room to spare while keeping a hostile file from taking more than a bounded share of memory.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes of (decompressed) input read in all.
    pub max_input_bytes: u64,
    /// Bytes in one string.
    pub max_string_bytes: u64,
    /// Bytes of distinct string content in all.
    pub max_total_string_bytes: u64,
    /// Values held in all containers together (lists, tuples, dicts).
    pub max_values: u64,
    /// Containers in all.
    pub max_containers: u64,
    /// Entries in the memo.
    pub max_memo: u64,
    /// Values on the VM stack at once.
    pub max_stack: u64,
    /// Open MARKs at once.
    pub max_marks: u64,
    /// Nesting of containers; snapshots nest 6 deep.
    pub max_depth: u32,
    /// Bytes the values read may hold in memory at once (0: only the counts above cap them):
    /// the share of a memory budget the read may take, checked as containers and values are
    /// added ([`crate::reader::ErrorKind::Memory`]).
    pub max_heap_bytes: u64,
    /// Not a limit but a switch: read trace entries through the fast path
    /// (`pickle/entry.rs`). Off, the general machine reads everything; tests compare the two.
    pub entry_fast_path: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 16 << 30,
            max_string_bytes: 16 << 20,
            max_total_string_bytes: 1 << 30,
            max_values: 400_000_000,
            max_containers: 200_000_000,
            max_memo: 200_000_000,
            max_stack: 1 << 20,
            max_marks: 4096,
            max_depth: 64,
            max_heap_bytes: 0,
            entry_fast_path: true,
        }
    }
}
