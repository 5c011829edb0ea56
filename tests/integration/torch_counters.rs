//! Our `final` keys and PyTorch's `memory_stats()` counters they must equal: the truth tests
//! and the bench (which includes this file) check the same ones.

pub const COUNTERS: [(&str, &str); 8] = [
    ("reserved_bytes", "reserved_bytes.all.current"),
    ("allocated_bytes", "allocated_bytes.all.current"),
    ("active_bytes", "active_bytes.all.current"),
    ("requested_bytes", "requested_bytes.all.current"),
    ("segments", "segment.all.current"),
    ("allocations", "allocation.all.current"),
    ("inactive_split_blocks", "inactive_split.all.current"),
    ("inactive_split_bytes", "inactive_split_bytes.all.current"),
];
