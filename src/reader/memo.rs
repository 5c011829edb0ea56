//! The pickle memo at 4 bytes an entry: real snapshots memoize millions of dicts, lists and
//! strings and nothing else, so a slot is a 3-bit tag and a 29-bit handle; anything else a
//! pickle memoizes goes to a side table.
//!
//! The slots live in two runs so that a read split in two parts (`pickle/split.rs`) never
//! copies them: `tail` holds the slots from `tail_base` on, where every put goes, and `head`
//! the slots below it. A whole read has an empty head and a base of 0. The reader of a later
//! part has in its head a copy of the earlier part's first slots, the only ones below its own
//! it may read; once the earlier part takes the later one in, its own slots become the head
//! and the later part's the tail.

use std::collections::HashMap;

use super::value::Value;

/// Payload bits of a memo slot; the top three bits say what the payload is.
pub(super) const MEMO_PAYLOAD: u32 = (1 << 29) - 1;
const TAG_SHIFT: u32 = 29;
const MEMO_NODE: u32 = 0;
const MEMO_STR: u32 = 1;
const MEMO_BYTES: u32 = 2;
/// A folded id below 2^28, or 2^31 plus one below 2^28 (payload bit 28 stands for bit 31):
/// the sink's event and stack ids, which the entry fast path memoizes folded, with no node.
const MEMO_FOLDED: u32 = 3;
const MEMO_OTHER: u32 = 4;
const FOLDED_LOW: u32 = (1 << 28) - 1;

/// The memo: slots by index, with the values that do not fit a slot in `others`.
#[derive(Default)]
pub(super) struct Memo {
    head: Vec<u32>,
    tail: Vec<u32>,
    tail_base: usize,
    others: Vec<Value>,
    /// Puts at indexes beyond the end.
    pub(super) sparse: HashMap<u64, Value>,
    /// The lowest index a put overwrote (rather than appended), or `usize::MAX`: a later
    /// part's copy of the first slots is only good if none of them changed meanwhile.
    lowest_overwrite: usize,
    /// Puts that overwrote: what the fast path learnt of the memo holds while it stays.
    overwrites: u64,
    /// The head is this read's own (it took a later part in), not a later part's copy.
    own_head: bool,
}

impl Memo {
    pub(super) fn new() -> Memo {
        Memo { lowest_overwrite: usize::MAX, ..Memo::default() }
    }

    /// Entries so far: the index the next MEMOIZE puts at.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.tail_base + self.tail.len()
    }

    /// The slot at `index`, if it was put (and, in a later part, if this part can see it).
    #[inline(always)]
    pub(super) fn slot(&self, index: usize) -> Option<u32> {
        match index.checked_sub(self.tail_base) {
            Some(i) => self.tail.get(i).copied(),
            None => self.head.get(index).copied(),
        }
    }

    /// Whether `index` is one of the earlier part's entries a later part cannot see: made
    /// after its copy, before its own.
    #[inline(always)]
    pub(super) fn unseen(&self, index: usize) -> bool {
        index >= self.head.len() && index < self.tail_base
    }

    /// Stores `v` at `index` (at most one past the end); false if the payload space is full,
    /// or if `index` lies below a later part's own slots.
    #[inline(always)]
    pub(super) fn put(&mut self, index: usize, v: Value) -> bool {
        let slot = match encode(v) {
            Some(slot) => slot,
            None => {
                if self.others.len() > MEMO_PAYLOAD as usize {
                    return false;
                }
                self.others.push(v);
                MEMO_OTHER << TAG_SHIFT | (self.others.len() - 1) as u32
            }
        };
        let target = match index.checked_sub(self.tail_base) {
            Some(i) if i == self.tail.len() => {
                self.tail.push(slot);
                return true;
            }
            Some(i) => &mut self.tail[i],
            // Below the tail: after a join, a slot the earlier part put, as any read may
            // overwrite; in a later part, a slot it must leave alone.
            None => match self.head.get_mut(index) {
                Some(slot) if self.own_head => slot,
                _ => return false,
            },
        };
        *target = slot;
        self.lowest_overwrite = self.lowest_overwrite.min(index);
        self.overwrites += 1;
        true
    }

    /// Gives a slot this read put as a placeholder (the fast path's container, put before its
    /// items are read) its value: not an overwrite of what the pickle memoized.
    #[inline(always)]
    pub(super) fn fill(&mut self, index: usize, v: Value) -> bool {
        let (lowest, overwrites) = (self.lowest_overwrite, self.overwrites);
        let done = self.put(index, v);
        (self.lowest_overwrite, self.overwrites) = (lowest, overwrites);
        done
    }

    /// Puts so far that overwrote an entry (rather than appended one).
    #[inline(always)]
    pub(super) fn overwrites(&self) -> u64 {
        self.overwrites
    }

    /// Plain branches rather than a `match`: the jump table it compiles to mispredicts as
    /// strings and containers alternate.
    #[inline(always)]
    pub(super) fn decode(&self, slot: u32) -> Value {
        let payload = slot & MEMO_PAYLOAD;
        let tag = slot >> TAG_SHIFT;
        if tag == MEMO_STR {
            Value::Str(payload)
        } else if tag == MEMO_NODE {
            Value::Node(payload)
        } else if tag == MEMO_FOLDED {
            Value::Folded(((payload & (1 << 28)) << 3) | (payload & FOLDED_LOW))
        } else if tag == MEMO_BYTES {
            Value::Bytes(payload)
        } else {
            // Only `put` writes slots, and it writes this tag with an index into `others`.
            self.others.get(payload as usize).copied().unwrap_or(Value::None)
        }
    }

    /// Forgets the entries from `len` on: the fast path undoes its puts when it falls back.
    pub(super) fn truncate(&mut self, len: usize) {
        self.tail.truncate(len.saturating_sub(self.tail_base));
    }

    /// A memo for the reader of a later part: it sees a copy of this one's slots so far (what
    /// holds the keys and frames a trace refers back to), and this one notes from now on what
    /// it overwrites. None when it cannot be split (sparse puts, or split once already).
    pub(super) fn fork(&mut self) -> Option<Memo> {
        if !self.sparse.is_empty() || !self.head.is_empty() || self.tail_base != 0 {
            return None;
        }
        self.lowest_overwrite = usize::MAX;
        Some(Memo {
            head: self.tail.clone(),
            tail: Vec::new(),
            tail_base: self.tail.len(),
            others: self.others.clone(),
            sparse: HashMap::new(),
            lowest_overwrite: usize::MAX,
            overwrites: 0,
            own_head: false,
        })
    }

    /// Sets where a later part's own puts start (`base`, at least the copy's length).
    pub(super) fn rebase(&mut self, base: usize) {
        self.tail.clear();
        self.tail_base = base.max(self.head.len());
    }

    /// Side values held (those that fit no slot).
    pub(super) fn others_len(&self) -> usize {
        self.others.len()
    }

    /// Whether a later part forked from this memo when it held `copied` slots can be taken
    /// in now: this memo ends where the later part's own slots start, none of the copied
    /// slots changed since, and the later part neither overwrote nor put sparsely.
    pub(super) fn can_join(&self, later: &Memo, copied: usize) -> bool {
        self.head.is_empty()
            && self.tail_base == 0
            && self.len() == later.tail_base
            && self.lowest_overwrite >= copied
            && later.lowest_overwrite == usize::MAX
            && later.sparse.is_empty()
            && self.others.len() + later.others.len() + later.tail.len() < MEMO_PAYLOAD as usize
    }

    /// A later part's own slots (see [`Memo::can_join`]) as the memo it joins has them:
    /// each value mapped by `map` from the later part's ids to the whole read's. `others` is
    /// how many side values that memo holds, `others_copied` how many the later part's copy
    /// started with. Runs on its own, beside the rest of a join (`split.rs`).
    pub(super) fn mapped(self, others: usize, others_copied: usize, map: &dyn Fn(Value) -> Value) -> Mapped {
        let Memo { tail: mut slots, tail_base, others: theirs, .. } = self;
        // The later part's own side values go after the earlier part's, and after them any
        // value that no longer fits a slot once mapped (`can_join` counted the room).
        let mut side: Vec<Value> = theirs.into_iter().skip(others_copied).map(map).collect();
        let shift = others - others_copied;
        for slot in slots.iter_mut() {
            let payload = *slot & MEMO_PAYLOAD;
            let tag = *slot >> TAG_SHIFT;
            if tag == MEMO_OTHER {
                if payload as usize >= others_copied {
                    *slot = MEMO_OTHER << TAG_SHIFT | (payload as usize + shift) as u32;
                }
                continue;
            }
            let value = map(decode_slot(tag, payload));
            *slot = encode(value).unwrap_or_else(|| {
                side.push(value);
                MEMO_OTHER << TAG_SHIFT | (others + side.len() - 1) as u32
            });
        }
        Mapped { slots, base: tail_base, side }
    }

    /// Takes in a later part's slots as [`Memo::mapped`] made them.
    pub(super) fn join(&mut self, later: Mapped) {
        self.others.extend(later.side);
        self.head = std::mem::take(&mut self.tail);
        self.tail = later.slots;
        self.tail_base = later.base;
        self.own_head = true;
    }
}

/// A later part's slots mapped to the whole read's ids, and the side values that go with them.
pub(super) struct Mapped {
    slots: Vec<u32>,
    base: usize,
    side: Vec<Value>,
}

/// A slot's value, for the tags other than a side value's.
fn decode_slot(tag: u32, payload: u32) -> Value {
    match tag {
        MEMO_STR => Value::Str(payload),
        MEMO_NODE => Value::Node(payload),
        MEMO_FOLDED => Value::Folded(((payload & (1 << 28)) << 3) | (payload & FOLDED_LOW)),
        _ => Value::Bytes(payload),
    }
}

/// The slot of a value that fits one: a handle of 29 bits with its tag.
#[inline(always)]
fn encode(v: Value) -> Option<u32> {
    Some(match v {
        Value::Node(id) if id <= MEMO_PAYLOAD => MEMO_NODE << TAG_SHIFT | id,
        Value::Str(id) if id <= MEMO_PAYLOAD => MEMO_STR << TAG_SHIFT | id,
        Value::Bytes(id) if id <= MEMO_PAYLOAD => MEMO_BYTES << TAG_SHIFT | id,
        Value::Folded(f) if (f & !(1 << 31)) <= FOLDED_LOW => {
            MEMO_FOLDED << TAG_SHIFT | ((f >> 3) & (1 << 28)) | (f & FOLDED_LOW)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips() {
        let values = [
            Value::Node(0),
            Value::Node(MEMO_PAYLOAD),
            Value::Node(MEMO_PAYLOAD + 1),
            Value::Str(7),
            Value::Bytes(MEMO_PAYLOAD),
            Value::Folded(0),
            Value::Folded(FOLDED_LOW),
            Value::Folded(FOLDED_LOW + 1),
            Value::Folded(1 << 31),
            Value::Folded(1 << 31 | FOLDED_LOW),
            Value::Folded(1 << 31 | (FOLDED_LOW + 1)),
            Value::Folded(u32::MAX),
            Value::Int(-3),
            Value::None,
        ];
        let mut memo = Memo::new();
        for (i, v) in values.iter().enumerate() {
            assert!(memo.put(i, *v));
        }
        for (i, v) in values.iter().enumerate() {
            assert_eq!(memo.decode(memo.slot(i).unwrap()), *v, "slot {i}");
        }
    }

    #[test]
    fn a_later_part_sees_the_copied_slots_and_its_own_and_joins_in_order() {
        let mut earlier = Memo::new();
        earlier.put(0, Value::Str(1));
        earlier.put(1, Value::Int(-5));
        let mut later = earlier.fork().unwrap();
        later.rebase(4);
        assert_eq!(later.len(), 4);
        assert!(later.put(4, Value::Folded(0)));
        assert!(later.put(5, Value::Float(2.5)));
        assert!(!later.put(1, Value::None), "a put below its own slots");
        assert_eq!(later.decode(later.slot(1).unwrap()), Value::Int(-5));
        assert_eq!(later.slot(2), None, "the earlier part's slots after the copy are not seen");
        assert_eq!(later.decode(later.slot(5).unwrap()), Value::Float(2.5));
        // The earlier part reads on to where the later one starts, then takes it in.
        earlier.put(2, Value::Str(9));
        earlier.put(3, Value::Int(7));
        assert!(earlier.can_join(&later, 2));
        let shift = |v: Value| match v {
            Value::Folded(f) => Value::Folded(f + 100),
            v => v,
        };
        let others = earlier.others_len();
        earlier.join(later.mapped(others, 1, &shift));
        let all: Vec<Value> = (0..6).map(|i| earlier.decode(earlier.slot(i).unwrap())).collect();
        let want = [Value::Str(1), Value::Int(-5), Value::Str(9), Value::Int(7), Value::Folded(100), Value::Float(2.5)];
        assert_eq!(all, want);
        assert!(earlier.put(6, Value::Str(3)));
        assert_eq!(earlier.len(), 7);
        // Its own slots stay its to overwrite, as in any read.
        assert!(earlier.put(1, Value::Str(8)));
        assert_eq!(earlier.decode(earlier.slot(1).unwrap()), Value::Str(8));
    }

    #[test]
    fn an_overwrite_of_a_copied_slot_stops_the_join() {
        let mut earlier = Memo::new();
        earlier.put(0, Value::Str(1));
        let mut later = earlier.fork().unwrap();
        later.rebase(2);
        earlier.put(1, Value::Str(2));
        earlier.put(0, Value::Str(3));
        assert!(!earlier.can_join(&later, 1));
    }
}
