//! Properties of the reader on arbitrary and mutated input: it never panics, never hangs, and
//! every error names an offset inside the input.

use proptest::prelude::*;

use fragscope::ingest::{IngestError, Options, ingest};

fn check(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let len = bytes.len() as u64;
    match ingest(std::io::Cursor::new(bytes), &Options::default()) {
        Ok(_) => {}
        Err(IngestError::Read { error, stream: "" }) => prop_assert!(error.offset <= len, "{error}"),
        Err(IngestError::Model { offset, .. }) => prop_assert!(offset <= len),
        Err(_) => {}
    }
    Ok(())
}

/// A way of reading under one tight limit, named.
pub type Tighten = (&'static str, Box<dyn Fn(&mut Options)>);

/// Each limit a real snapshot can reach, set tight: the differential tests read under each.
pub fn tight_limits(memo: u64, values: u64, containers: u64, depth: u32, strings: u64) -> Vec<Tighten> {
    vec![
        ("memo", Box::new(move |o: &mut Options| o.limits.max_memo = memo)),
        ("values", Box::new(move |o: &mut Options| o.limits.max_values = values)),
        ("containers", Box::new(move |o: &mut Options| o.limits.max_containers = containers)),
        ("depth", Box::new(move |o: &mut Options| o.limits.max_depth = depth)),
        ("string bytes", Box::new(move |o: &mut Options| o.limits.max_total_string_bytes = strings)),
        ("events", Box::new(move |o: &mut Options| o.max_events = values / 10)),
        ("stack", Box::new(move |o: &mut Options| o.limits.max_stack = depth as u64 * 4)),
        ("marks", Box::new(move |o: &mut Options| o.limits.max_marks = depth as u64)),
    ]
}

/// The real snapshot the mutation tests start from.
pub fn seed() -> Vec<u8> {
    std::fs::read(crate::util::snapshot_path("seed_frag_default")).unwrap()
}

/// `seed()` with the bytes at the sampled places replaced.
pub fn mutated(edits: Vec<(prop::sample::Index, u8)>) -> Vec<u8> {
    let mut bytes = seed();
    for (at, b) in edits {
        let i = at.index(bytes.len());
        bytes[i] = b;
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check(bytes)?;
    }

    #[test]
    fn random_bytes_after_a_pickle_header_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut bytes = b"\x80\x04".to_vec();
        bytes.extend(body);
        check(bytes)?;
    }

    #[test]
    fn mutated_real_snapshots_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        check(mutated(edits))?;
    }
}
