//! Frames lists the fast path has folded lately, found again by their bytes: a trace repeats
//! a few thousand call stacks millions of times, and a list whose bytes (the memo gets of its
//! frame dicts) are those of one folded before, while no memo entry was overwritten, folds to
//! the same value without reading the memo or calling the sink ([`Sink::fold_list`]).
//!
//! Why a set-associative table keyed by the list's first 16 bytes: the lists of a trace
//! interleave (an allocation's stack, then another's free), so the list matched last is
//! seldom the next one (big_trace: 2.0M of 2.0M lookups), and a training trace's python stacks
//! run to 20-40 frames, past the 48 bytes once kept (train_big: 322k of 834k lists were read
//! whole for that).

use super::super::Res;
use super::*;
use crate::reader::Sink;
use crate::reader::value::Value;

/// Sets, ways in a set, and the most bytes of a list remembered (50 frames by LONG_BINGET).
const SETS: usize = 64;
const WAYS: usize = 4;
const LIST_BYTES: usize = 256;
// A power of two above one: `tag_of` shifts by 64 less its bits.
const _: () = assert!(SETS.is_power_of_two() && SETS > 1);

/// A frames list folded lately: its bytes after MARK up to and including its APPENDS, the
/// 16 bytes from its start (which may run past it) as its tag, and its fold (the folded value,
/// its frames and their greatest depth).
#[derive(Clone, Copy)]
struct List {
    body: [u8; LIST_BYTES],
    tag: [u64; 2],
    len: usize,
    folded: Value,
    count: usize,
    depth: u32,
}

/// The lists remembered (allocated at the first one), valid while the memo's overwrite count
/// is `epoch`, and each set's next way to fill.
pub(super) struct Lists {
    slots: Vec<List>,
    next: [u8; SETS],
    epoch: u64,
}

impl Default for Lists {
    fn default() -> Self {
        Lists { slots: Vec::new(), next: [0; SETS], epoch: u64::MAX }
    }
}

/// The tag of the list whose body starts at `w`, and its set.
#[inline(always)]
fn tag_of(w: &[u8; STEP]) -> ([u64; 2], usize) {
    let (a, b) = w.split_at(8);
    let a = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
    let b = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
    // The top bits of a multiplicative hash: as many as index the sets.
    let set = ((a ^ b.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SETS.trailing_zeros())) as usize;
    ([a, b], set)
}

impl<S: Sink> Parts<'_, S> {
    /// A frames list whose bytes, from after its MARK to its APPENDS, are those of one folded
    /// lately: its fold, the limits checked as the fold checks them.
    #[inline(always)]
    pub(super) fn repeated_list(
        &mut self,
        buf: &[u8],
        body: usize,
        at: &mut u64,
    ) -> Res<Option<(Value, u32, usize)>, S::Error> {
        let lists = &self.scratch.lists;
        if lists.epoch != self.memo.overwrites() || lists.slots.is_empty() {
            return Ok(None);
        }
        let Some(w) = step(buf, body) else { return Ok(None) };
        let (tag, set) = tag_of(w);
        let ahead: Option<&[u8; LIST_BYTES]> = buf.get(body..body + LIST_BYTES).and_then(|b| b.try_into().ok());
        let ways = lists.slots.get(set * WAYS..(set + 1) * WAYS).unwrap_or_default();
        let Some(list) = ways.iter().find(|l| l.len > 0 && l.tag == tag && same_bytes(buf, body, ahead, l)) else {
            return Ok(None);
        };
        let (value, count, depth, len) = (list.folded, list.count, list.depth, list.len);
        if !self.heap.room_for_values(count as u64, self.limits.max_values) || depth >= self.limits.max_depth {
            return Ok(None);
        }
        *at = self.base + (body + len - 1) as u64;
        if !self.close(1, value) {
            return Ok(None);
        }
        self.unbuilt += 1;
        Ok(Some((value, 2, body + len)))
    }

    /// Keeps a folded frames list, its body `buf[body..=end]`, for [`Parts::repeated_list`].
    pub(super) fn remember_list(
        &mut self,
        buf: &[u8],
        body: usize,
        end: usize,
        folded: Value,
        count: usize,
        depth: u32,
    ) {
        let (Some(bytes), Some(w)) = (buf.get(body..=end), step(buf, body)) else { return };
        if bytes.len() > LIST_BYTES {
            return;
        }
        let (tag, set) = tag_of(w);
        let lists = &mut self.scratch.lists;
        if lists.slots.is_empty() {
            let empty = List { body: [0; LIST_BYTES], tag: [0; 2], len: 0, folded: Value::None, count: 0, depth: 0 };
            lists.slots = vec![empty; SETS * WAYS];
        }
        if lists.epoch != self.memo.overwrites() {
            lists.slots.iter_mut().for_each(|l| l.len = 0);
            lists.epoch = self.memo.overwrites();
        }
        let way = lists.next[set] as usize % WAYS;
        lists.next[set] = lists.next[set].wrapping_add(1);
        let Some(slot) = lists.slots.get_mut(set * WAYS + way) else { return };
        slot.body[..bytes.len()].copy_from_slice(bytes);
        (slot.tag, slot.len, slot.folded, slot.count, slot.depth) = (tag, bytes.len(), folded, count, depth);
    }
}

/// Whether the bytes at `at` begin with `list`'s body: compared a word at a time within the
/// `LIST_BYTES` ahead where the buffer holds them (a call to memcmp per entry showed), else
/// as slices.
#[inline(always)]
fn same_bytes(buf: &[u8], at: usize, ahead: Option<&[u8; LIST_BYTES]>, list: &List) -> bool {
    let Some(ahead) = ahead else { return buf.get(at..at + list.len) == list.body.get(..list.len) };
    let mut diff = 0u64;
    let words = ahead.chunks_exact(8).zip(list.body.chunks_exact(8)).take(list.len.div_ceil(8));
    for (i, (a, b)) in words.enumerate() {
        let (a, b) =
            (u64::from_le_bytes(a.try_into().unwrap_or([0; 8])), u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        // The bytes of this word that are the body's: all, or the first few of the last.
        let n = list.len - 8 * i;
        let keep = if n >= 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
        diff |= (a ^ b) & keep;
    }
    diff == 0
}
