//! The fast path for the dict a snapshot holds millions of: a trace entry, pickled as
//! `EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`, its keys and values memo gets, short
//! strings or numbers, and its frames a list of memoized frame dicts (`MARK gets APPENDS`, or
//! `get APPEND` for one frame: most frees of a real training trace).
//!
//! It parses the bytes already buffered, in place, and hands the values straight to the sink:
//! sorted into its fields as they are read where it folds dicts by a few keys (`Sink::field`,
//! `fold_fields`: each key's field is learnt with the key, so a value goes to its place with no
//! pair kept and no second pass), else as pairs to `fold_dict`. No heap container, no trip
//! through the VM stack or the dispatch loop. Every check the general machine makes on these
//! opcodes is made here too (memo indexes, string and memo limits, depth, counts), and what
//! it ends with is what the general machine would:
//! the same folded id, memo and sink calls. On anything else (another opcode, the end of the
//! buffer, a limit within reach, a dict the sink does not fold) it undoes its memo puts and
//! the general machine reads the same bytes from the start, so values, errors and offsets
//! stay the general machine's. `tests/integration/fast_path.rs` and the `fast_path` fuzz target run
//! both paths on the same bytes and compare.
//!
//! Why it is shaped as it is (three million entries make every instruction count): each
//! opcode is read from a fixed [`STEP`]-byte view taken with one bounds check, so its operands
//! need none; the pairs go to an array on the stack, not a vector; the depth the general
//! machine would find by looking each value up again is kept as the values are read.

use std::io::Read;

mod lists;
mod values;

use super::opcodes as op;
use super::{Failure, Res, Vm};
use crate::reader::memo::Memo;
use crate::reader::value::{Heap, Kind, StrId, Value};
use crate::reader::{Fields, Limits, MAX_FIELDS, Sink};

/// Most key-value pairs the fast path takes in one dict (a trace entry has 8 or 9).
const MAX_PAIRS: usize = 16;
/// Most frames it takes in one frames list.
const MAX_FRAMES: usize = 256;
/// Bytes read at once for an opcode: its code and fixed operands take at most 10 (LONG1 of
/// eight bytes). An entry within this many bytes of the buffer's end goes to the general
/// machine, which refills.
const STEP: usize = 16;

/// What the fast path made of the bytes after an EMPTY_DICT.
enum Fast {
    /// The dict was folded; `used` bytes after the EMPTY_DICT were consumed.
    Folded { used: usize, value: Value },
    /// Not a shape it takes: the general machine reads these bytes.
    Fallback,
}

/// What [`Vm::entry_fast`] did with a dict.
pub(super) enum Entry {
    /// Read it: its folded value is on the stack.
    Read,
    /// Left it to the general machine.
    Fallback,
    /// Left it to the general machine, which refills the buffer it ran past the end of.
    Short,
    /// The later part of a split read met a memo entry it cannot see (`split.rs`): it stops
    /// before this dict, and the earlier part reads on from here.
    Unseen,
}

/// What the fast path keeps across entries: the frames buffer (filling a fresh one would cost
/// more than the parse), and the keys of the last dict it read.
pub(super) struct Scratch {
    frames: Vec<Value>,
    /// The last dict's keys that were memo gets of strings, as their bytes, in order: an entry
    /// whose keys are the same bytes has the same keys, while no memo entry was overwritten
    /// (`epoch`). torch's entries all have the same keys, so most keys are matched by one
    /// compare, with no memo read.
    keys: [Key; MAX_PAIRS],
    key_count: usize,
    epoch: u64,
    /// The keys being learnt from a dict that did not match.
    learning: [Key; MAX_PAIRS],
    /// The last short string read (its bytes in a word, and how many) and its id.
    last_string: ((u64, usize), StrId),
    /// Frames lists folded lately, found again by their bytes.
    lists: lists::Lists,
}

impl Default for Scratch {
    fn default() -> Self {
        let key = Key { word: 0, mask: 0, len: 0, value: Value::None, field: NO_FIELD };
        Scratch {
            frames: Vec::new(),
            keys: [key; MAX_PAIRS],
            key_count: 0,
            epoch: u64::MAX,
            learning: [key; MAX_PAIRS],
            last_string: ((0, usize::MAX), 0),
            lists: lists::Lists::default(),
        }
    }
}

/// A key as its opcode's bytes: BINGET or LONG_BINGET and the memo index, and the string
/// and its field for the sink ([`Sink::field`]; `NO_FIELD`: none).
#[derive(Clone, Copy)]
struct Key {
    word: u64,
    mask: u64,
    len: usize,
    value: Value,
    field: usize,
}

const NO_FIELD: usize = usize::MAX;

/// The machine's parts the fast path works on, borrowed apart from the input it reads.
struct Parts<'v, S> {
    scratch: &'v mut Scratch,
    heap: &'v mut Heap,
    memo: &'v mut Memo,
    sink: &'v mut S,
    limits: &'v Limits,
    /// Offset of the first byte of `buf`.
    base: u64,
    /// Memo length at the start, and the slots of the dict and list being built (a get of
    /// either inside the entry would be a cycle: the general machine names it).
    memo_start: usize,
    open_slots: [usize; 2],
    /// Containers read without building them; they count against the container limit.
    unbuilt: u64,
    /// A memo get named an entry this part cannot see (see [`Entry::Unseen`]).
    unseen: bool,
    /// The buffer ended before the dict did.
    short: bool,
    /// A one-item list read in this dict, folded at its SETITEMS (see `Parts::one_item`).
    one: Option<OneItem>,
}

/// A list of one frame dict waiting for its dict's SETITEMS: the frame, its depth, and where
/// its fold goes among the dict's values (a field, or an index into the pairs).
struct OneItem {
    frame: Value,
    depth: u32,
    place: usize,
}

const UNPLACED: usize = usize::MAX - 1;

impl<R: Read, S: Sink> Vm<'_, R, S> {
    /// Tries the fast path with the input just past an EMPTY_DICT, and goes on with the dicts
    /// that follow it directly (a batch of torch's entries is a run of them): each is read as
    /// if the machine had met its EMPTY_DICT and called this again, without the trip through
    /// the dispatch. The first that it does not read is left, EMPTY_DICT and all, to that
    /// trip, which tries it again here and then falls back as the first would have.
    #[inline]
    pub(super) fn entry_fast(&mut self) -> Res<Entry, S::Error> {
        let first = self.entry_one(0)?;
        if !matches!(first, Entry::Read) {
            return Ok(first);
        }
        loop {
            if self.input.window().first() != Some(&op::EMPTY_DICT) {
                return Ok(Entry::Read);
            }
            // Where the dispatch would have placed it: errors name this dict's bytes.
            self.at = self.input.offset();
            match self.entry_one(1)? {
                Entry::Read => self.fast_streak += 1,
                // Not read, nothing consumed: the dispatch reads its EMPTY_DICT (setting `at`
                // again) and calls again.
                _ => return Ok(Entry::Read),
            }
        }
    }

    /// One dict, its bytes `skip` bytes into the window (past its EMPTY_DICT when the
    /// dispatch has not read that).
    #[inline(always)]
    fn entry_one(&mut self, skip: usize) -> Res<Entry, S::Error> {
        let l = self.limits;
        // Room for everything the general machine would check as it goes.
        if self.stack.len() + 2 * MAX_PAIRS + MAX_FRAMES + 4 >= l.max_stack as usize
            || self.marks.len() + 2 >= l.max_marks as usize
            || self.heap.container_count() + 2 > l.max_containers.min(u32::MAX as u64)
        {
            return Ok(Entry::Fallback);
        }
        let (heads, memo_start, at) = (self.heap.node_count(), self.memo.len(), self.at);
        let mut parts = Parts {
            scratch: &mut self.fast,
            heap: &mut self.heap,
            memo: &mut self.memo,
            sink: &mut *self.sink,
            limits: l,
            base: self.input.offset() + skip as u64,
            memo_start,
            open_slots: [usize::MAX; 2],
            unbuilt: 0,
            unseen: false,
            short: false,
            one: None,
        };
        let outcome = parts.dict(self.input.window().get(skip..).unwrap_or_default(), &mut self.at);
        let (unbuilt, unseen, short) = (parts.unbuilt, parts.unseen, parts.short);
        match outcome {
            Ok(Fast::Folded { used, value }) => {
                self.input.advance(skip + used);
                self.heap.count_unbuilt(unbuilt);
                self.fast_dicts += 1;
                self.stack.push(value);
                Ok(Entry::Read)
            }
            Ok(Fast::Fallback) => {
                self.memo.truncate(memo_start);
                self.heap.truncate_nodes(heads);
                self.at = at;
                Ok(if unseen {
                    Entry::Unseen
                } else if short {
                    Entry::Short
                } else {
                    Entry::Fallback
                })
            }
            Err(e) => Err(e),
        }
    }
}

/// The `STEP` bytes at `p`, if the buffer holds them.
#[inline(always)]
fn step(buf: &[u8], p: usize) -> Option<&[u8; STEP]> {
    buf.get(p..p.checked_add(STEP)?)?.try_into().ok()
}

/// An opcode's first eight bytes as a word, for comparing keys.
#[inline(always)]
fn word(w: &[u8; STEP]) -> u64 {
    let (first, _) = w.split_first_chunk::<8>().unwrap_or((&[0; 8], &[]));
    u64::from_le_bytes(*first)
}

#[inline(always)]
fn u32_at(w: &[u8; STEP], i: usize) -> u32 {
    u32::from_le_bytes([w[i], w[i + 1], w[i + 2], w[i + 3]])
}

impl<S: Sink> Parts<'_, S> {
    /// Notes that the buffer ended before the dict did: the general machine refills.
    #[cold]
    fn ran_short<T>(&mut self) -> Option<T> {
        self.short = true;
        None
    }

    /// The dict after its EMPTY_DICT, up to and including its SETITEMS.
    #[inline]
    fn dict(&mut self, buf: &[u8], at: &mut u64) -> Res<Fast, S::Error> {
        if self.sink.takes_fields() { self.dict_as::<true>(buf, at) } else { self.dict_as::<false>(buf, at) }
    }

    /// [`Parts::dict`], its values sorted into the sink's fields as they are read
    /// (`BY_FIELD`), or kept as pairs.
    #[inline(always)]
    fn dict_as<const BY_FIELD: bool>(&mut self, buf: &[u8], at: &mut u64) -> Res<Fast, S::Error> {
        let Some(mut p) = self.open(buf, 0, 0) else { return Ok(Fast::Fallback) };
        // Only one of the two is used (and the other's filling optimized away).
        let mut items = [Value::None; 2 * MAX_PAIRS];
        let mut fields: Fields = [None; MAX_FIELDS];
        let mut depth = 0;
        // Keys are matched against the last dict's while they match, and learnt anew after.
        let known = if self.scratch.epoch == self.memo.overwrites() { self.scratch.key_count } else { 0 };
        let mut learnt = None;
        let mut pair = 0;
        loop {
            let Some((w, at_key)) = self.view(buf, p) else { return Ok(Fast::Fallback) };
            p = at_key;
            if w[0] == op::SETITEMS {
                break;
            }
            if pair == MAX_PAIRS {
                return Ok(Fast::Fallback);
            }
            let key = self.scratch.keys[pair.min(MAX_PAIRS - 1)];
            let field = if learnt.is_none() && pair < known && word(w) & key.mask == key.word {
                if !BY_FIELD {
                    items[2 * pair] = key.value;
                }
                p += key.len;
                key.field
            } else {
                let n = *learnt.get_or_insert_with(|| {
                    let n = pair.min(known);
                    self.scratch.learning[..n].copy_from_slice(&self.scratch.keys[..n]);
                    n
                });
                let mut read = Value::None;
                let Some(next) = self.item(buf, p, w, at, &mut read, &mut depth)? else {
                    return Ok(Fast::Fallback);
                };
                // A list as a key: left to the general machine.
                if self.one.as_ref().is_some_and(|o| o.place == UNPLACED) {
                    return Ok(Fast::Fallback);
                }
                if n == pair {
                    self.learn(pair, w, next - p, read, &mut learnt);
                }
                p = next;
                if BY_FIELD {
                    self.sink.field(read).unwrap_or(NO_FIELD)
                } else {
                    items[2 * pair] = read;
                    NO_FIELD
                }
            };
            let Some((w, at_value)) = self.view(buf, p) else { return Ok(Fast::Fallback) };
            let mut value = Value::None;
            let Some(next) = self.item(buf, at_value, w, at, &mut value, &mut depth)? else {
                return Ok(Fast::Fallback);
            };
            if let Some(one) = self.one.as_mut().filter(|o| o.place == UNPLACED) {
                one.place = if BY_FIELD { field } else { 2 * pair + 1 };
            }
            if !BY_FIELD {
                items[2 * pair + 1] = value;
            } else if let Some(slot) = fields.get_mut(field) {
                *slot = Some(value);
            }
            p = next;
            pair += 1;
        }
        if pair == 0 || !self.fold_one_item(p, at, &mut fields, &mut items, BY_FIELD)? {
            return Ok(Fast::Fallback);
        }
        let folded = if BY_FIELD {
            self.fold(2 * pair, depth, p, at, Kind::Dict, |sink, heap| sink.fold_fields(heap, &fields))
        } else {
            self.fold(2 * pair, depth, p, at, Kind::Dict, |sink, heap| sink.fold_dict(heap, &items[..2 * pair]))
        };
        let Some(value) = folded? else { return Ok(Fast::Fallback) };
        if let Some(n) = learnt {
            let s = &mut *self.scratch;
            (s.keys, s.key_count, s.epoch) = (s.learning, n, self.memo.overwrites());
        }
        Ok(Fast::Folded { used: p + 1, value })
    }

    /// [`values::past_frames`], noting that the buffer ran short where it does not hold it.
    #[inline(always)]
    fn view<'b>(&mut self, buf: &'b [u8], p: usize) -> Option<(&'b [u8; STEP], usize)> {
        values::past_frames(buf, p).or_else(|| self.ran_short())
    }

    /// Reads the key or value at `p` (its bytes in `w`) into `out`, raising `depth` to its
    /// depth; the position after it, or None to fall back.
    #[inline(always)]
    fn item(
        &mut self,
        buf: &[u8],
        p: usize,
        w: &[u8; STEP],
        at: &mut u64,
        out: &mut Value,
        depth: &mut u32,
    ) -> Res<Option<usize>, S::Error> {
        let found = if w[0] == op::EMPTY_LIST { self.frames(buf, p + 1, at)? } else { self.scalar(buf, p, w) };
        Ok(found.map(|(v, d, next)| {
            *out = v;
            *depth = (*depth).max(d);
            next
        }))
    }

    /// Keeps the key just read (`len` bytes) for the next dicts if it is a memo get of a string.
    #[inline(always)]
    fn learn(&mut self, pair: usize, w: &[u8; STEP], len: usize, value: Value, learnt: &mut Option<usize>) {
        if let (op::BINGET, 2) | (op::LONG_BINGET, 5) = (w[0], len)
            && let Value::Str(_) = value
        {
            let mask = u64::MAX >> (64 - 8 * len);
            let field = self.sink.field(value).unwrap_or(NO_FIELD);
            self.scratch.learning[pair] = Key { word: word(w) & mask, mask, len, value, field };
            *learnt = Some(pair + 1);
        }
    }

    /// Hands a finished container of `count` items (whose greatest depth is `depth`) to the
    /// sink by `call`, as the general machine would when its closing opcode (at `p`) places
    /// them: within the value and depth limits, and with the sink's errors at that opcode.
    /// None to fall back.
    #[inline(always)]
    fn fold(
        &mut self,
        count: usize,
        depth: u32,
        p: usize,
        at: &mut u64,
        kind: Kind,
        call: impl FnOnce(&mut S, &Heap) -> Result<Option<u32>, S::Error>,
    ) -> Res<Option<Value>, S::Error> {
        if !self.heap.room_for_values(count as u64, self.limits.max_values) || depth >= self.limits.max_depth {
            return Ok(None);
        }
        *at = self.base + p as u64;
        let folded = call(self.sink, self.heap);
        let folded = folded.map_err(|error| Failure::Sink { error, offset: *at })?;
        let Some(f) = folded else { return Ok(None) };
        let value = Value::Folded(f);
        if !self.close(usize::from(kind != Kind::Dict), value) {
            return Ok(None);
        }
        self.unbuilt += 1;
        Ok(Some(value))
    }
}

#[inline(always)]
fn le_u32(buf: &[u8], p: usize) -> Option<u32> {
    let b: [u8; 4] = buf.get(p..p + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}
