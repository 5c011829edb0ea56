//! The pickle memo at 4 bytes an entry: real snapshots memoize millions of dicts, lists and
//! strings and nothing else, so a slot is a 2-bit tag and a 30-bit handle; anything else a
//! pickle memoizes goes to a side table.

use std::collections::HashMap;

use super::value::Value;

/// Payload bits of a memo slot; the top two bits say what the payload is.
pub(super) const MEMO_PAYLOAD: u32 = (1 << 30) - 1;
const MEMO_NODE: u32 = 0;
const MEMO_STR: u32 = 1 << 30;
const MEMO_BYTES: u32 = 2 << 30;
const MEMO_OTHER: u32 = 3 << 30;

/// The memo at 4 bytes an entry: real snapshots memoize millions of dicts, lists and strings
/// and nothing else; anything else a pickle memoizes goes to `others`.
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
            Value::Node(id) if id <= MEMO_PAYLOAD => MEMO_NODE | id,
            Value::Str(id) if id <= MEMO_PAYLOAD => MEMO_STR | id,
            Value::Bytes(id) if id <= MEMO_PAYLOAD => MEMO_BYTES | id,
            other => {
                if self.others.len() > MEMO_PAYLOAD as usize {
                    return false;
                }
                self.others.push(other);
                MEMO_OTHER | (self.others.len() - 1) as u32
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
        let tag = slot & !MEMO_PAYLOAD;
        if tag == MEMO_STR {
            Value::Str(payload)
        } else if tag == MEMO_NODE {
            Value::Node(payload)
        } else if tag == MEMO_BYTES {
            Value::Bytes(payload)
        } else {
            self.others[payload as usize]
        }
    }
}
