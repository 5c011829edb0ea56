//! What keeps a small file from expanding into a huge model: a pickle may list one object many
//! times through its memo, and torch never does for a segment, a block or a trace entry, so a
//! repeat is refused where it is met. Counts past what a GPU holds are refused too.

use super::ModelError;

/// The most segments a snapshot may hold: 256 GiB in the smallest (2 MiB) segments.
pub(crate) const MAX_SEGMENTS: usize = 1 << 17;
/// The smallest block the allocator makes, which bounds the blocks a segment can hold.
pub(super) const MIN_BLOCK: u64 = 512;
/// The most devices a snapshot may hold: one process sees a node's GPUs, a few dozen at most.
pub const MAX_DEVICES: usize = 64;

/// A memory budget for one snapshot's read, model and analysis, and what each part costs
/// through all three: charged as the model is built, before the parts are made, so that a
/// small compressed file of millions of blocks is refused by name instead of exhausting
/// memory. The costs are the analysis's to know (`analysis::cost::costs`); ingest passes
/// them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes in all.
    pub bytes: u64,
    /// Per block of the segments, through the analysis (model, replay states, maps).
    pub per_block: u64,
    /// Per segment.
    pub per_segment: u64,
    /// Per trace event.
    pub per_event: u64,
}

impl Budget {
    /// The most events the budget holds, with nothing else.
    pub fn max_events(&self) -> u64 {
        self.bytes / self.per_event.max(1)
    }
}

/// What the model holds beside its blocks and segments: bytes the reader holds, and events.
pub(super) struct Besides {
    pub(super) read: u64,
    pub(super) events: u64,
}

/// Counts charged to a [`Budget`] while a model is built.
#[derive(Debug, Default)]
pub(super) struct Charged {
    pub(super) blocks: u64,
    pub(super) segments: u64,
}

impl Charged {
    /// Charges segment `path` and its `blocks`, beside `read` bytes the reader holds and
    /// `events` events; an error naming the counts and the budget when they pass it.
    pub(super) fn segment(
        &mut self,
        budget: &Budget,
        Besides { read, events }: Besides,
        blocks: u64,
        path: &dyn Fn() -> String,
    ) -> Result<(), ModelError> {
        self.blocks += blocks;
        self.segments += 1;
        let need = read
            + self.blocks.saturating_mul(budget.per_block)
            + self.segments.saturating_mul(budget.per_segment)
            + events.saturating_mul(budget.per_event);
        if need <= budget.bytes {
            return Ok(());
        }
        Err(ModelError::new(
            format!("{}.blocks", path()),
            format!("a snapshot whose analysis fits the memory budget of {} MiB", budget.bytes >> 20),
            format!(
                "{} blocks in {} segments and {events} events so far, about {} MiB to read and analyse \
                 ({} bytes a block)",
                self.blocks,
                self.segments,
                need >> 20,
                budget.per_block
            ),
        ))
    }
}

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
    fn blocks_are_charged_before_they_are_built() {
        let budget = Budget { bytes: 10_000, per_block: 100, per_segment: 1000, per_event: 10 };
        let mut charged = Charged::default();
        let path = || "segments[1]".to_string();
        assert!(
            charged.segment(&budget, Besides { read: 1000, events: 100 }, 50, &path).is_ok(),
            "1000 + 5000 + 1000 + 1000"
        );
        let e = charged.segment(&budget, Besides { read: 1000, events: 100 }, 11, &path).unwrap_err().to_string();
        assert!(e.contains("segments[1].blocks") && e.contains("61 blocks in 2 segments and 100 events"), "{e}");
        assert_eq!(budget.max_events(), 1000);
    }

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
