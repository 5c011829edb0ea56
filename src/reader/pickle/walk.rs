//! A walk over opcodes that builds nothing: it finds where the later part of a split read
//! (`split.rs`) can start, and how many memo entries the pickle has made by then.
//!
//! It steps over each opcode's operands exactly as the machine reads them, counts the memo's
//! appends, and follows the MARKs, so that it knows where a batch of the list closes. It
//! follows binary opcodes only: a text opcode, a refused or unknown one, or the end of the
//! list before the target means no split. Nothing it finds is trusted: the earlier part
//! checks, when it gets there, that it stands where the walk said.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::opcodes as op;
use super::shapes::{Shapes, Table};
use crate::reader::input::Input;

/// Where the later part can start: right after the APPENDS that closes a batch of the list,
/// at byte `at`, with `memo` entries made before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Start {
    pub at: u64,
    pub memo: usize,
}

/// Where the earlier part of a split read is, which it stores after each batch: a paced walk
/// stops where the two parts are on course to finish together, wherever the machine runs one
/// part slower than the other.
pub(super) struct Pace {
    earlier: Arc<AtomicU64>,
    /// The input's end.
    end: u64,
    /// How far ahead of the earlier part a start must be, so that the earlier part hears of it
    /// before it gets there (it reads a few MiB in the time it takes to hear).
    ahead: u64,
}

impl Pace {
    /// A pace for a later part forked at byte `from` of an input of `end` bytes.
    pub(super) fn new(earlier: Arc<AtomicU64>, from: u64, end: u64) -> Pace {
        Pace { earlier, end, ahead: (end.saturating_sub(from) / 64).min(4 << 20) }
    }

    /// Where the earlier part last said it was.
    pub(super) fn earlier(&self) -> u64 {
        self.earlier.load(Ordering::Relaxed)
    }

    /// Whether `at` is far enough ahead of the earlier part to start there.
    fn ahead_of_earlier(&self, at: u64) -> bool {
        at >= self.earlier().saturating_add(self.ahead)
    }

    /// Whether a later part starting at `at` ends no later than the earlier part gets there:
    /// what is left past `at` is no more than what lies between the earlier part and `at`.
    /// The walk's own time is spent already; both parts read alike, byte for byte, so their
    /// speeds are taken to be the same from here on, and how fast each core was until now
    /// shows in how far the earlier part came while the walk went.
    fn balanced(&self, at: u64) -> bool {
        let earlier = self.earlier();
        self.ahead_of_earlier(at) && at - earlier >= self.end.saturating_sub(at)
    }
}

/// An opcode and its fixed operands fit in this many bytes (FRAME and BINFLOAT take 9).
const VIEW: usize = 16;

/// What the walk's fast loop does with each opcode: step over so many bytes (1 to 9), over a
/// string or number of one length byte (`SHORT`), count a memo entry, open or close a MARK
/// (a close to the list's own level goes the slow way), or 0: the slow way (`Walk::step`).
const SHORT: u8 = 100;
const COUNT: u8 = 101;
const OPEN: u8 = 102;
const CLOSE: u8 = 103;
static FAST: [u8; 256] = fast_table();

const fn fast_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let ones = [
        op::NONE,
        op::NEWTRUE,
        op::NEWFALSE,
        op::EMPTY_DICT,
        op::EMPTY_LIST,
        op::EMPTY_TUPLE,
        op::EMPTY_SET,
        op::POP,
        op::DUP,
        op::APPEND,
        op::SETITEM,
        op::TUPLE1,
        op::TUPLE1 + 1,
        op::TUPLE3,
    ];
    let mut i = 0;
    while i < ones.len() {
        t[ones[i] as usize] = 1;
        i += 1;
    }
    t[op::BINGET as usize] = 2;
    t[op::BININT1 as usize] = 2;
    t[op::BININT2 as usize] = 3;
    t[op::BININT as usize] = 5;
    t[op::LONG_BINGET as usize] = 5;
    t[op::BINFLOAT as usize] = 9;
    t[op::FRAME as usize] = 9;
    t[op::SHORT_BINUNICODE as usize] = SHORT;
    t[op::SHORT_BINSTRING as usize] = SHORT;
    t[op::SHORT_BINBYTES as usize] = SHORT;
    t[op::LONG1 as usize] = SHORT;
    t[op::MEMOIZE as usize] = COUNT;
    t[op::MARK as usize] = OPEN;
    t[op::SETITEMS as usize] = CLOSE;
    t[op::APPENDS as usize] = CLOSE;
    t[op::ADDITEMS as usize] = CLOSE;
    t[op::TUPLE as usize] = CLOSE;
    t[op::LIST as usize] = CLOSE;
    t[op::DICT as usize] = CLOSE;
    t[op::FROZENSET as usize] = CLOSE;
    t[op::POP_MARK as usize] = CLOSE;
    t
}

/// The fast table as a shape reads it.
fn table(code: u8) -> Table {
    match FAST[code as usize] {
        0 => Table::Other,
        SHORT => Table::Short,
        COUNT => Table::Count,
        OPEN => Table::Open,
        CLOSE => Table::Close,
        n => Table::Fixed(n as usize),
    }
}

struct Walk<'p> {
    memo: usize,
    /// MARKs open above the list.
    depth: u32,
    /// Entries the later part has copied (the first ones); those after, up to where it
    /// starts, it cannot see.
    copied: usize,
    target: u64,
    /// A start past the target, kept if the batch after it reads nothing the later part
    /// cannot see (a trace entry may refer back to the one before it).
    candidate: Option<Start>,
    /// Starts passed over so: after `PASS_OVER`, the next is taken anyway, and the later part
    /// reads up to its first entry that refers back past its copy.
    passed: u32,
    pace: Option<&'p Pace>,
}

const PASS_OVER: u32 = 8;

enum Step {
    /// Bytes the opcode took, operands included.
    Next(u64),
    Found(Start),
    /// No split: the list ended, or an opcode the walk does not follow.
    Stop,
}

/// Walks from right after an APPENDS on the list (no MARK open above it), with `memo`
/// entries made, to the first batch boundary at or past byte `target` (and, with a `pace`,
/// where the parts are balanced) after which the next batch reads no memo entry between the
/// first `copied` and that boundary. None when there is none, or when `cancel` is set.
pub(super) fn walk<R: Read>(
    input: &mut Input<R>,
    memo: usize,
    copied: usize,
    target: u64,
    pace: Option<&Pace>,
    cancel: &AtomicBool,
) -> Option<Start> {
    let mut w = Walk { memo, depth: 0, copied, target, candidate: None, passed: 0, pace };
    let mut shapes = Shapes::default();
    loop {
        if cancel.load(Ordering::Relaxed) || !input.ensure(VIEW).ok()? {
            return None;
        }
        let buf = input.window();
        let mut p = 0;
        let mut skip = 0u64;
        // Where the item not matched by a shape started, in this window.
        let mut learning = None;
        while p + VIEW <= buf.len() {
            // Most opcodes only need stepping over: by a table, with the batch open and no
            // start waiting for its check.
            let code = buf[p];
            if w.depth != 0 && w.candidate.is_none() {
                // Most items, by the shape of one before (`shapes.rs`).
                if w.depth == 1 && code == op::EMPTY_DICT {
                    if let Some(from) = learning.take() {
                        shapes.learn(&buf[from..p], table);
                    }
                    if let Some((n, memo)) = shapes.find(&buf[p..], VIEW) {
                        p += n;
                        w.memo += memo;
                        continue;
                    }
                    learning = Some(p);
                }
                match FAST[code as usize] {
                    0 => {}
                    SHORT => {
                        p += 2 + buf[p + 1] as usize;
                        continue;
                    }
                    COUNT => {
                        w.memo += 1;
                        p += 1;
                        continue;
                    }
                    OPEN => {
                        w.depth += 1;
                        p += 1;
                        continue;
                    }
                    CLOSE if w.depth > 1 => {
                        w.depth -= 1;
                        p += 1;
                        continue;
                    }
                    CLOSE => {}
                    n => {
                        p += n as usize;
                        continue;
                    }
                }
            }
            let view: &[u8; VIEW] = buf[p..p + VIEW].try_into().ok()?;
            match w.step(view, input.offset() + p as u64) {
                Step::Next(n) if n as usize <= buf.len() - p => p += n as usize,
                // A long string: skip past the buffer.
                Step::Next(n) => {
                    skip = n - (buf.len() - p) as u64;
                    p = buf.len();
                }
                Step::Found(start) => return Some(start),
                Step::Stop => return None,
            }
        }
        // A short string may end past the buffer too.
        skip += p.saturating_sub(buf.len()) as u64;
        input.advance(p.min(buf.len()));
        input.skip_bytes(skip).ok()?;
    }
}

impl Walk<'_> {
    /// One opcode, its bytes in `v`; `at` is its offset.
    #[inline(always)]
    fn step(&mut self, v: &[u8; VIEW], at: u64) -> Step {
        let code = v[0];
        if self.depth == 0 && code != op::MARK && code != op::FRAME {
            return Step::Stop;
        }
        let u32_at = |i: usize| u32::from_le_bytes([v[i], v[i + 1], v[i + 2], v[i + 3]]) as u64;
        let u64_at =
            |i: usize| u64::from_le_bytes([v[i], v[i + 1], v[i + 2], v[i + 3], v[i + 4], v[i + 5], v[i + 6], v[i + 7]]);
        let n = match code {
            op::BINGET => return self.get(v[1] as usize, 2),
            op::LONG_BINGET => return self.get(u32_at(1) as usize, 5),
            op::MEMOIZE => {
                self.memo += 1;
                1
            }
            op::BINPUT => self.put(v[1] as usize, 2),
            op::LONG_BINPUT => self.put(u32_at(1) as usize, 5),
            op::MARK => {
                self.depth += 1;
                1
            }
            op::APPENDS
            | op::SETITEMS
            | op::ADDITEMS
            | op::TUPLE
            | op::LIST
            | op::DICT
            | op::FROZENSET
            | op::POP_MARK => {
                self.depth -= 1;
                if code == op::APPENDS && self.depth == 0 {
                    return self.boundary(at + 1);
                }
                1
            }
            op::STOP => return Step::Stop,
            op::POP
            | op::DUP
            | op::NONE
            | op::NEWTRUE
            | op::NEWFALSE
            | op::EMPTY_DICT
            | op::EMPTY_LIST
            | op::EMPTY_TUPLE
            | op::EMPTY_SET
            | op::APPEND
            | op::SETITEM
            | op::TUPLE1..=op::TUPLE3 => 1,
            op::BININT1 | op::PROTO => 2,
            op::BININT2 => 3,
            op::BININT => 5,
            op::BINFLOAT | op::FRAME => 9,
            op::SHORT_BINSTRING | op::SHORT_BINBYTES | op::SHORT_BINUNICODE | op::LONG1 => 2 + v[1] as u64,
            op::BINSTRING | op::BINBYTES | op::BINUNICODE | op::LONG4 => 5 + u32_at(1),
            op::BINUNICODE8 | op::BINBYTES8 | op::BYTEARRAY8 => match u64_at(1).checked_add(9) {
                Some(n) => n,
                None => return Step::Stop,
            },
            _ => return Step::Stop,
        };
        Step::Next(n)
    }

    fn get(&mut self, index: usize, n: u64) -> Step {
        if let Some(c) = self.candidate
            && index >= self.copied
            && index < c.memo
            && self.passed < PASS_OVER
        {
            self.candidate = None;
            self.passed += 1;
        }
        Step::Next(n)
    }

    /// BINPUT and LONG_BINPUT append when they name the next index (as the pickler's do).
    fn put(&mut self, index: usize, n: u64) -> u64 {
        if index == self.memo {
            self.memo += 1;
        }
        n
    }

    /// A batch of the list closed, the next opcode at `at`.
    fn boundary(&mut self, at: u64) -> Step {
        if let Some(c) = self.candidate {
            // Paced, the earlier part may have come near it while its next batch was checked.
            if self.pace.is_none_or(|p| p.ahead_of_earlier(c.at)) {
                return Step::Found(c);
            }
            self.candidate = None;
        }
        if at >= self.target && self.pace.is_none_or(|p| p.balanced(at)) {
            self.candidate = Some(Start { at, memo: self.memo });
        }
        Step::Next(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `batches` batches of `per` one-entry dicts `{'k': i}`, the key memoized
    /// once, as protocol 4 writes it; returns the pickle and the offset after each batch.
    fn list(batches: usize, per: usize, refer_back: bool) -> (Vec<u8>, Vec<u64>) {
        let mut b = vec![0x80, 4, op::EMPTY_LIST, op::MEMOIZE];
        let mut ends = Vec::new();
        let mut memo = 1;
        for batch in 0..batches {
            b.push(op::MARK);
            for i in 0..per {
                b.extend_from_slice(&[op::EMPTY_DICT, op::MEMOIZE]);
                memo += 1;
                if batch == 0 && i == 0 {
                    b.extend_from_slice(&[op::SHORT_BINUNICODE, 1, b'k', op::MEMOIZE]);
                    memo += 1;
                } else {
                    b.extend_from_slice(&[op::BINGET, 2]);
                }
                if refer_back && batch == 2 && i == 0 {
                    // The first entry of batch 2 refers to the last dict of batch 1.
                    b.extend_from_slice(&[op::LONG_BINGET]);
                    b.extend_from_slice(&((memo - 2) as u32).to_le_bytes());
                } else {
                    b.extend_from_slice(&[op::BININT1, i as u8]);
                }
                b.push(op::SETITEM);
            }
            b.push(op::APPENDS);
            ends.push(b.len() as u64);
        }
        b.extend_from_slice(&[op::STOP]);
        b.extend_from_slice(&[0; VIEW]);
        (b, ends)
    }

    fn walk_from(bytes: &[u8], from: u64, memo: usize, copied: usize, target: u64) -> Option<Start> {
        let mut input = Input::new(bytes, u64::MAX);
        input.skip_bytes(from).unwrap();
        walk(&mut input, memo, copied, target, None, &AtomicBool::new(false))
    }

    #[test]
    fn finds_the_first_clean_boundary_past_the_target_and_the_memo_there() {
        let (bytes, ends) = list(5, 3, false);
        // After batch 0: the list, 3 dicts and the key are memoized.
        let start = walk_from(&bytes, ends[0], 5, 5, ends[1]).unwrap();
        assert_eq!(start, Start { at: ends[1], memo: 8 });
        let start = walk_from(&bytes, ends[0], 5, 5, ends[1] + 1).unwrap();
        assert_eq!(start, Start { at: ends[2], memo: 11 });
    }

    #[test]
    fn a_boundary_whose_next_batch_refers_back_is_passed_over() {
        let (bytes, ends) = list(5, 3, true);
        let start = walk_from(&bytes, ends[0], 5, 5, ends[1]).unwrap();
        assert_eq!(start, Start { at: ends[2], memo: 11 }, "batch 2 reads a dict of batch 1");
        // With that dict among the copied entries, the first boundary serves.
        let start = walk_from(&bytes, ends[0], 5, 9, ends[1]).unwrap();
        assert_eq!(start.at, ends[1]);
    }

    #[test]
    fn a_paced_walk_stops_where_what_is_left_after_it_is_no_more_than_what_lies_before_it() {
        let (bytes, ends) = list(20, 3, false);
        let end = bytes.len() as u64;
        let paced = |earlier: u64| {
            let pace = Pace { earlier: Arc::new(AtomicU64::new(earlier)), end, ahead: 0 };
            let mut input = Input::new(&bytes[..], u64::MAX);
            input.skip_bytes(ends[0]).unwrap();
            walk(&mut input, 5, 5, 0, Some(&pace), &AtomicBool::new(false)).map(|s| s.at)
        };
        // The first boundary at least halfway from the earlier part to the end.
        let expect = |earlier: u64| ends.iter().copied().find(|&at| at - earlier.min(at) >= end - at);
        for earlier in [ends[0], ends[3] + 2, ends[9]] {
            assert_eq!(paced(earlier), expect(earlier), "earlier part at {earlier}");
        }
        assert!(paced(ends[9]) > paced(ends[0]), "a later part gets less to read when the earlier is further on");
        // Never at or behind where the earlier part is, nor within `ahead` of it.
        let pace = Pace { earlier: Arc::new(AtomicU64::new(ends[0])), end, ahead: ends[15] - ends[0] };
        let mut input = Input::new(&bytes[..], u64::MAX);
        input.skip_bytes(ends[0]).unwrap();
        let start = walk(&mut input, 5, 5, 0, Some(&pace), &AtomicBool::new(false)).unwrap();
        assert_eq!(start.at, ends[15]);
    }

    #[test]
    fn no_split_when_the_list_ends_first_or_on_a_text_opcode() {
        let (bytes, ends) = list(3, 3, false);
        assert_eq!(walk_from(&bytes, ends[0], 5, 5, ends[2] + 1), None);
        let (mut bytes, ends) = list(4, 3, false);
        let at = ends[1] as usize + 1;
        bytes[at] = op::INT;
        assert_eq!(walk_from(&bytes, ends[0], 5, 5, ends[2]), None);
    }

    /// The walk as one step per opcode, with no table and no shapes: what the fast loop
    /// must agree with.
    fn reference(bytes: &[u8], from: u64, memo: usize, copied: usize, target: u64) -> Option<Start> {
        let mut w = Walk { memo, depth: 0, copied, target, candidate: None, passed: 0, pace: None };
        let mut p = from as usize;
        loop {
            let v: &[u8; VIEW] = bytes.get(p..p + VIEW)?.try_into().ok()?;
            match w.step(v, p as u64) {
                Step::Next(n) => p += n as usize,
                Step::Found(start) => return Some(start),
                Step::Stop => return None,
            }
        }
    }

    /// Hands out at most `most` bytes a read, so the walk's windows end anywhere.
    struct Trickle<'a> {
        bytes: &'a [u8],
        most: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.most).min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    /// A list of trace-like entries of many layouts: ints of each width, floats, strings new
    /// and referenced (short and past a shape's length), nested frames, BINPUT, a FRAME
    /// between items, and now and then a reference back to an earlier batch's entry.
    fn varied_list(seed: u64, batches: usize) -> (Vec<u8>, Vec<(u64, usize)>) {
        let mut rng = seed;
        let mut next = move |n: u64| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let mut b = vec![0x80, 4, op::EMPTY_LIST, op::MEMOIZE];
        let mut memo = 1usize;
        let mut ends = Vec::new();
        let string = |b: &mut Vec<u8>, len: usize| {
            if len < 256 {
                b.extend_from_slice(&[op::SHORT_BINUNICODE, len as u8]);
            } else {
                b.push(op::BINUNICODE);
                b.extend_from_slice(&(len as u32).to_le_bytes());
            }
            b.resize(b.len() + len, b'x');
        };
        for _ in 0..batches {
            b.push(op::MARK);
            for _ in 0..1 + next(12) {
                if next(40) == 0 {
                    b.push(op::FRAME);
                    b.extend_from_slice(&(1u64 << 16).to_le_bytes());
                }
                b.extend_from_slice(&[op::EMPTY_DICT, op::MEMOIZE, op::MARK]);
                memo += 1;
                for _ in 0..1 + next(4) {
                    // The key: a new string or one read back.
                    if memo < 3 || next(4) == 0 {
                        string(&mut b, 1 + next(6) as usize);
                        b.push(op::MEMOIZE);
                        memo += 1;
                    } else {
                        b.extend_from_slice(&[op::BINGET, next(memo.min(256) as u64) as u8]);
                    }
                    match next(10) {
                        0 => b.extend_from_slice(&[op::BININT1, next(256) as u8]),
                        1 => b.extend_from_slice(&[op::BININT2, 1, 2]),
                        2 => b.extend_from_slice(&[op::BININT, 1, 2, 3, 4]),
                        3 => b.extend_from_slice(&[op::BINFLOAT, 0, 0, 0, 0, 0, 0, 0, 1]),
                        4 => {
                            string(&mut b, next(3) as usize * 150);
                            b.push(op::MEMOIZE);
                            memo += 1;
                        }
                        5 => {
                            b.extend_from_slice(&[op::EMPTY_LIST, op::MEMOIZE, op::MARK, op::NONE, op::NEWTRUE]);
                            b.push(op::APPENDS);
                            memo += 1;
                        }
                        6 => {
                            b.extend_from_slice(&[op::NONE, op::BINPUT, memo as u8]);
                            if memo < 256 {
                                memo += 1;
                            }
                        }
                        7 if memo > 300 => {
                            // Refers back some way: a dict of this batch or one before.
                            b.push(op::LONG_BINGET);
                            b.extend_from_slice(&((memo - 1 - next(60) as usize) as u32).to_le_bytes());
                        }
                        _ => b.push(op::NONE),
                    }
                }
                b.push(op::SETITEMS);
            }
            b.push(op::APPENDS);
            ends.push((b.len() as u64, memo));
        }
        b.push(op::STOP);
        b.extend_from_slice(&[0; VIEW]);
        (b, ends)
    }

    #[test]
    fn stepping_by_shapes_finds_what_stepping_by_opcodes_finds() {
        for seed in 0..12 {
            let (bytes, ends) = varied_list(seed, 3000);
            assert!(bytes.len() > 512 << 10, "the list spans several windows");
            let (from, memo) = ends[0];
            let mut found = 0;
            for i in (1..ends.len()).step_by(293) {
                for target in [ends[i].0 - 1, ends[i].0, ends[i].0 + 1] {
                    for copied in [memo, memo + 40] {
                        let want = reference(&bytes, from, memo, copied, target);
                        let got = walk_from(&bytes, from, memo, copied, target);
                        assert_eq!(got, want, "seed {seed}, target {target}, copied {copied}");
                        let mut input = Input::new(Trickle { bytes: &bytes, most: 7 + seed as usize * 13 }, u64::MAX);
                        input.skip_bytes(from).unwrap();
                        let trickled = walk(&mut input, memo, copied, target, None, &AtomicBool::new(false));
                        assert_eq!(trickled, want, "seed {seed}, target {target}, in short reads");
                        found += usize::from(want.is_some());
                    }
                }
            }
            assert!(found > 20, "most targets have a start: {found}");
        }
    }
}
