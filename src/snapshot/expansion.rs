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
}
