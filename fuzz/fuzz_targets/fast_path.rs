//! The reader's entry fast path against its general machine on arbitrary bytes: neither may
//! panic, and both must end with the same model or the same error. Seed it with the reader's
//! corpus: `cargo +nightly fuzz run fast_path corpus/reader`.
#![no_main]

use fragscope::ingest::ingest;
use libfuzzer_sys::fuzz_target;

#[path = "small.rs"]
mod small;

fn read(data: &[u8], fast: bool) -> String {
    let mut options = small::options();
    options.limits.entry_fast_path = fast;
    match ingest(std::io::Cursor::new(data.to_vec()), &options) {
        Ok(i) => {
            assert!(fast || i.fast_dicts == 0);
            format!("{}\n{:?}", i.snapshot.canonical_text(), i.source)
        }
        Err(e) => format!("error: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let fast = read(data, true);
    let general = read(data, false);
    assert!(fast == general, "the paths differ:\nfast: {fast:.2000}\ngeneral: {general:.2000}");
});
