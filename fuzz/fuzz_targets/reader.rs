//! The reader on arbitrary bytes: it must never panic, and every error must name an offset
//! inside the input. Run: `cargo +nightly fuzz run reader fuzz/corpus/reader`.
#![no_main]

use fragscope::ingest::{IngestError, Options, ingest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let mut options = Options::default();
    // Keep each run small: the limits are what is under test, not the machine's memory.
    options.limits.max_input_bytes = 1 << 24;
    options.limits.max_values = 1 << 20;
    match ingest(std::io::Cursor::new(data.to_vec()), &options) {
        Ok(ingested) => assert_eq!(ingested.source.bytes, len),
        Err(IngestError::Read { error, stream: "" }) => assert!(error.offset <= len, "{error}"),
        Err(IngestError::Model { offset, .. }) => assert!(offset <= len),
        Err(_) => {}
    }
});
