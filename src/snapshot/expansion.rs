//! What keeps a small file from expanding into a huge model: a pickle may list one object many
//! times through its memo, and torch never does for a segment, a block or a trace entry, so a
//! repeat is refused where it is met. Counts past what a GPU holds are refused too.

use super::ModelError;

/// The most segments a snapshot may hold: 256 GiB in the smallest (2 MiB) segments.
pub(crate) const MAX_SEGMENTS: usize = 1 << 17;
/// The smallest block the allocator makes, which bounds the blocks a segment can hold.
pub(super) const MIN_BLOCK: u64 = 512;

/// Marks folded entry `f` as listed; false if it was already.
pub(super) fn take(taken: &mut [u64], f: u32) -> bool {
    let (word, bit) = (f as usize / 64, 1u64 << (f % 64));
    match taken.get_mut(word) {
        Some(w) if *w & bit != 0 => false,
        Some(w) => {
            *w |= bit;
            true
        }
        None => true,
    }
}

/// Marks a run of folded entries as listed, a word at a time; where one was already, its
/// place in the run (those before it are marked then, as `take` one by one would leave them).
pub(super) fn take_run(taken: &mut [u64], run: std::ops::Range<u32>) -> Option<usize> {
    let (start, end) = (run.start as usize, (run.end as usize).min(taken.len() * 64));
    let mut at = start;
    while at < end {
        let (word, bit) = (at / 64, at % 64);
        let bits = (end - at).min(64 - bit);
        let mask = if bits == 64 { u64::MAX } else { ((1u64 << bits) - 1) << bit };
        let clash = taken[word] & mask;
        if clash != 0 {
            let first = word * 64 + clash.trailing_zeros() as usize;
            taken[word] |= mask & ((1u64 << (first % 64)) - 1);
            return Some(first - start);
        }
        taken[word] |= mask;
        at += bits;
    }
    None
}

/// A shared object where the format has a distinct one: refused before it expands.
pub(super) fn repeated(path: String, what: &str) -> ModelError {
    ModelError::new(
        path,
        format!("a {what} of its own (torch writes each {what} once)"),
        format!("the same {what} object as an earlier one: shared objects are not expanded"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_taken_once() {
        let mut taken = vec![0u64; 2];
        assert!(take(&mut taken, 70));
        assert!(!take(&mut taken, 70));
        assert!(take(&mut taken, 3));
    }

    #[test]
    fn a_run_is_taken_as_its_entries_one_by_one_would_be() {
        // Runs of every start and length over three words, on a few patterns already taken.
        for pattern in [0u64, 1 << 5, 1 << 63, 0x8000_0000_0000_0001] {
            for start in 0..150u32 {
                for len in [0u32, 1, 2, 5, 63, 64, 65, 100, 200] {
                    let mut one = vec![0, pattern, 0];
                    let mut run = one.clone();
                    let by_one = (start..start + len).position(|f| !take(&mut one, f));
                    assert_eq!(take_run(&mut run, start..start + len), by_one, "{pattern:#x} {start} {len}");
                    assert_eq!(run, one, "{pattern:#x} {start} {len}");
                }
            }
        }
    }
}
