//! Limits small enough for the fuzzer to reach them (and to keep each run small), shared by the
//! targets that compare two ways of reading the same bytes.

use fragscope::ingest::Options;

pub fn options() -> Options {
    let mut options = Options::default();
    options.limits.max_input_bytes = 1 << 24;
    options.limits.max_values = 1 << 16;
    options.limits.max_memo = 1 << 14;
    options.limits.max_containers = 1 << 14;
    options.limits.max_depth = 12;
    options
}
