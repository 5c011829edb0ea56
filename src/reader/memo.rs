//! The pickle memo at 4 bytes an entry: real snapshots memoize millions of dicts, lists and
//! strings and nothing else, so a slot is a 3-bit tag and a 29-bit handle; anything else a
//! pickle memoizes goes to a side table.

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

/// The memo: `slots` by index, with the values that do not fit a slot in `others`.
#[derive(Default)]
pub(super) struct Memo {
    pub(super) slots: Vec<u32>,
    others: Vec<Value>,
    /// Puts at indexes beyond the end.
    pub(super) sparse: HashMap<u64, Value>,
}

impl Memo {
    /// Stores `v` at `index` (at most one past the end); false if the payload space is full.
    #[inline]
    pub(super) fn put(&mut self, index: usize, v: Value) -> bool {
        let slot = match v {
            Value::Node(id) if id <= MEMO_PAYLOAD => MEMO_NODE << TAG_SHIFT | id,
            Value::Str(id) if id <= MEMO_PAYLOAD => MEMO_STR << TAG_SHIFT | id,
            Value::Bytes(id) if id <= MEMO_PAYLOAD => MEMO_BYTES << TAG_SHIFT | id,
            Value::Folded(f) if (f & !(1 << 31)) <= FOLDED_LOW => {
                MEMO_FOLDED << TAG_SHIFT | ((f >> 3) & (1 << 28)) | (f & FOLDED_LOW)
            }
            other => {
                if self.others.len() > MEMO_PAYLOAD as usize {
                    return false;
                }
                self.others.push(other);
                MEMO_OTHER << TAG_SHIFT | (self.others.len() - 1) as u32
            }
        };
        if index == self.slots.len() {
            self.slots.push(slot);
        } else {
            self.slots[index] = slot;
        }
        true
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
        self.slots.truncate(len);
    }
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
        let mut memo = Memo::default();
        for (i, v) in values.iter().enumerate() {
            assert!(memo.put(i, *v));
        }
        for (i, v) in values.iter().enumerate() {
            assert_eq!(memo.decode(memo.slots[i]), *v, "slot {i}");
        }
    }
}
