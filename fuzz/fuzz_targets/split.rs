//! A pickle read in two parts at once (`src/reader/pickle/split.rs`) against the same pickle
//! read in one, on arbitrary bytes: neither may panic, and both must end with the same model or
//! the same error. The split is forced wherever one is possible (the first list of two batches,
//! from its start), at a place the first byte chooses; where that byte is odd, paced (where
//! the threads' speeds put it), from the same place on; where the second is odd, the later
//! part is stopped midway if it still reads when the earlier part gets there. Seed it with
//! `corpus/split` (small snapshots whose trace is written in batches of three) and the
//! reader's corpus.
#![no_main]

use std::io::Write;

use fragscope::ingest::{Options, TwoParts, ingest_path};
use libfuzzer_sys::fuzz_target;

#[path = "small.rs"]
mod small;

fn read(path: &std::path::Path, parts: Option<TwoParts>) -> String {
    let options = Options { two_parts: parts, ..small::options() };
    match ingest_path(path, &options) {
        Ok(i) => format!("{}\n{:?}", i.snapshot.canonical_text(), i.source),
        Err(e) => format!("error: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&share, _)) = data.split_first() else { return };
    let dir = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" };
    let Ok(mut file) = tempfile::NamedTempFile::new_in(dir) else { return };
    if file.write_all(data).is_err() {
        return;
    }
    let later_share = 50 + share as u64 * 900 / 255;
    let pace = share % 2 == 1;
    // Where the second byte is odd, the earlier part stops a later part still reading when it
    // gets to its start, and reads the rest itself.
    let overtake = if data.get(1).is_some_and(|b| b % 2 == 1) { 0 } else { u64::MAX };
    let forced =
        TwoParts { min_bytes: 0, min_items: 2, fork_share: 0, quiet: 0, later_share, pace, overtake, measure: false };
    let two = read(file.path(), Some(forced));
    let one = read(file.path(), None);
    assert!(one == two, "one part and two differ:\none: {one:.2000}\ntwo: {two:.2000}");
});
