//! The values inside a trace entry: frames lists (folded whole, or found again in `lists.rs`),
//! memo gets and puts, scalars and short strings, each read from the buffered bytes as
//! the general machine would read them (see the parent module).

use super::super::Res;
use super::super::opcodes as op;
use super::*;
use crate::reader::Sink;
use crate::reader::value::{Kind, Value};

impl<S: Sink> Parts<'_, S> {
    /// A frames list after its EMPTY_LIST: memoized frame dicts, folded by the sink into one
    /// value, or none. Returns the value, its depth and the position after the list.
    pub(super) fn frames(
        &mut self,
        buf: &[u8],
        from: usize,
        at: &mut u64,
    ) -> Res<Option<(Value, u32, usize)>, S::Error> {
        // A list after a one-item list in the same dict would be folded before it by the
        // general machine (see `one_item`): left to it.
        if self.one.is_some() {
            return Ok(None);
        }
        let after_put = self.memo_op(buf, from).map_or(from, |(_, p)| p);
        if buf.get(after_put) != Some(&op::MARK) {
            if let Some(frame) = one_item_form(buf, after_put) {
                return Ok(self.one_item(buf, from, frame));
            }
            return Ok(self.empty_list(buf, from));
        }
        let Some(mut p) = self.open(buf, from, 1) else { return Ok(None) };
        let body = p;
        if let Some(hit) = self.repeated_list(buf, body, at)? {
            return Ok(Some(hit));
        }
        let mut items = std::mem::take(&mut self.scratch.frames);
        items.clear();
        let mut depth = 0;
        let complete = loop {
            let Some(w) = step(buf, p).or_else(|| self.ran_short()) else { break false };
            if w[0] == op::APPENDS {
                break !items.is_empty();
            }
            if w[0] == op::FRAME {
                p += 9;
                continue;
            }
            if items.len() == MAX_FRAMES {
                break false;
            }
            // A frame dict the general machine has placed before: anything else it would
            // seal or fold on the way in, which is its business.
            let (index, next) = match w[0] {
                op::BINGET => (w[1] as usize, p + 2),
                op::LONG_BINGET => (u32_at(w, 1) as usize, p + 5),
                _ => break false,
            };
            let Some(Value::Node(id)) = self.get_raw(index) else { break false };
            let Some(d) = self.heap.sealed_dict(id) else { break false };
            items.push(Value::Node(id));
            depth = depth.max(d);
            p = next;
        };
        let folded = if complete {
            self.fold(items.len(), depth, p, at, Kind::List, |sink, heap| sink.fold_list(heap, &items))
        } else {
            Ok(None)
        };
        let count = items.len();
        self.scratch.frames = items;
        let folded = folded?;
        if let Some(v) = folded {
            self.remember_list(buf, body, p, v, count, depth);
        }
        // A folded list adds the depth of a folded value.
        Ok(folded.map(|v| (v, 2, p + 1)))
    }

    /// A list of one frame, pickled `EMPTY_LIST [put] get APPEND` (Python writes a batch of one
    /// item with APPEND): its memo put and frame dict now, its fold deferred to the dict's
    /// SETITEMS ([`Parts::fold_one_item`]), where the general machine settles the list and
    /// folds it. The value returned stands in for the fold until then. `frame` is the get's
    /// memo index and the position after APPEND.
    fn one_item(&mut self, buf: &[u8], from: usize, frame: (usize, usize)) -> Option<(Value, u32, usize)> {
        let (index, next) = frame;
        // The put first: a get of the list itself is then refused as the general machine
        // refuses it (a list appended to itself).
        self.put_open(buf, from, 1)?;
        let Some(Value::Node(id)) = self.get_raw(index) else { return None };
        let depth = self.heap.sealed_dict(id)?;
        self.one = Some(OneItem { frame: Value::Node(id), depth, place: UNPLACED });
        Some((Value::None, 2, next))
    }

    /// The one-item list read in this dict, if any, folded as the general machine folds it
    /// when the dict's SETITEMS (at `p`) settles it: first, after any list folded at its own
    /// APPENDS. Its fold is put in its place among the dict's values (`place` in `fields` or
    /// `items`). False to fall back.
    #[inline(always)]
    pub(super) fn fold_one_item(
        &mut self,
        p: usize,
        at: &mut u64,
        fields: &mut Fields,
        items: &mut [Value],
        by_field: bool,
    ) -> Res<bool, S::Error> {
        let Some(one) = self.one.take() else { return Ok(true) };
        let frame = [one.frame];
        let Some(v) = self.fold(1, one.depth, p, at, Kind::List, |sink, heap| sink.fold_list(heap, &frame))? else {
            return Ok(false);
        };
        // The general machine's APPEND took an item list, which the fold gave back.
        self.heap.keep_free_slot();
        if by_field {
            if let Some(slot) = fields.get_mut(one.place) {
                *slot = Some(v);
            }
        } else if let Some(slot) = items.get_mut(one.place) {
            *slot = v;
        }
        Ok(true)
    }

    /// An empty list (torch's frames of an allocation made outside Python): a real, empty
    /// container, sealed as it is placed, as the general machine leaves it.
    pub(super) fn empty_list(&mut self, buf: &[u8], p: usize) -> Option<(Value, u32, usize)> {
        let (put, next) = self.memo_op(buf, p)?;
        let id = self.heap.new_node(Kind::List);
        self.heap.seal(id);
        let v = Value::Node(id);
        if put {
            self.put(v)?;
        }
        Some((v, self.heap.depth(id), next))
    }

    /// After a new container's opcode at `p`: its memo put, which must append (a placeholder
    /// until the container is done), then MARK. Returns the position after the MARK.
    #[inline(always)]
    pub(super) fn open(&mut self, buf: &[u8], p: usize, which: usize) -> Option<usize> {
        let p = self.put_open(buf, p, which)?;
        (buf.get(p) == Some(&op::MARK)).then_some(p + 1)
    }

    /// A new container's memo put at `p`, if any, as a placeholder in slot `which` until the
    /// container is done. Returns the position after it.
    #[inline(always)]
    fn put_open(&mut self, buf: &[u8], p: usize, which: usize) -> Option<usize> {
        let (put, p) = self.memo_op(buf, p)?;
        if put {
            self.open_slots[which] = self.memo.len();
            self.put(Value::Node(0))?;
        }
        Some(p)
    }

    /// Gives an opened container's memo slot, if any, its final value.
    #[inline(always)]
    pub(super) fn close(&mut self, which: usize, value: Value) -> bool {
        let slot = std::mem::replace(&mut self.open_slots[which], usize::MAX);
        slot == usize::MAX || self.memo.fill(slot, value)
    }

    /// A memo put at `p` (MEMOIZE, or BINPUT / LONG_BINPUT of the next index), if there is
    /// one: whether there was, and the position after it. None for a put elsewhere.
    #[inline(always)]
    pub(super) fn memo_op(&self, buf: &[u8], p: usize) -> Option<(bool, usize)> {
        let next = self.memo.len() as u64;
        match *buf.get(p)? {
            op::MEMOIZE => Some((true, p + 1)),
            op::BINPUT => (*buf.get(p + 1)? as u64 == next).then_some((true, p + 2)),
            op::LONG_BINPUT => (le_u32(buf, p + 1)? as u64 == next).then_some((true, p + 5)),
            _ => Some((false, p)),
        }
    }

    /// Appends `v` to the memo within its limits (a miss leaves the limit's error to the
    /// general machine).
    #[inline(always)]
    pub(super) fn put(&mut self, v: Value) -> Option<()> {
        let len = self.memo.len();
        if len as u64 >= self.limits.max_memo {
            return None;
        }
        self.memo.put(len, v).then_some(())
    }

    /// The memo's value at `index`, unless it is a container this entry has opened.
    #[inline(always)]
    pub(super) fn get_raw(&mut self, index: usize) -> Option<Value> {
        let Some(slot) = self.memo.slot(index) else {
            self.unseen |= self.memo.unseen(index);
            return None;
        };
        if index >= self.memo_start && self.open_slots.contains(&index) {
            return None;
        }
        Some(self.memo.decode(slot))
    }

    /// A memo get's value as the general machine's settling would see it, with its depth.
    #[inline(always)]
    pub(super) fn get(&mut self, index: usize) -> Option<(Value, u32)> {
        match self.get_raw(index)? {
            Value::Node(id) => self.heap.placed(id),
            v @ Value::Folded(_) => Some((v, 2)),
            v => Some((v, 0)),
        }
    }

    /// A key or value that is no container, its opcode's bytes in `w`: a memo get, a string
    /// with its memo put, a number, None or a bool. Returns it, its depth and the position
    /// after it.
    #[inline(always)]
    pub(super) fn scalar(&mut self, buf: &[u8], p: usize, w: &[u8; STEP]) -> Option<(Value, u32, usize)> {
        let (v, next) = match w[0] {
            op::LONG_BINGET => {
                let (v, d) = self.get(u32_at(w, 1) as usize)?;
                return Some((v, d, p + 5));
            }
            op::BINGET => {
                let (v, d) = self.get(w[1] as usize)?;
                return Some((v, d, p + 2));
            }
            op::LONG1 => {
                let n = w[1] as usize;
                if n > 8 {
                    return None;
                }
                // The bytes shifted to the top of the word: an arithmetic shift down
                // sign-extends them.
                let word = u64::from_le_bytes([w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9]]);
                let v = if n == 0 { 0 } else { ((word << (64 - 8 * n)) as i64) >> (64 - 8 * n) };
                (Value::Int(v), p + 2 + n)
            }
            op::BININT => (Value::Int(u32_at(w, 1) as i32 as i64), p + 5),
            op::BININT1 => (Value::Int(w[1] as i64), p + 2),
            op::BININT2 => (Value::Int(u16::from_le_bytes([w[1], w[2]]) as i64), p + 3),
            op::SHORT_BINUNICODE => return self.string(buf, p + 2, w[1] as usize),
            op::BINUNICODE => return self.string(buf, p + 5, u32_at(w, 1) as usize),
            op::BINFLOAT => {
                let bits = [w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]];
                (Value::Float(f64::from_be_bytes(bits)), p + 9)
            }
            op::NONE => (Value::None, p + 1),
            op::NEWTRUE => (Value::Bool(true), p + 1),
            op::NEWFALSE => (Value::Bool(false), p + 1),
            _ => return None,
        };
        Some((v, 0, next))
    }

    /// A string of `n` bytes at `p`, interned, and the memo put after it if any.
    #[inline(always)]
    pub(super) fn string(&mut self, buf: &[u8], p: usize, n: usize) -> Option<(Value, u32, usize)> {
        if n as u64 > self.limits.max_string_bytes {
            return None;
        }
        let raw = buf.get(p..p.checked_add(n)?)?;
        // torch writes a fresh 'N/A' in every entry: the same bytes as the last short string
        // read here are the same string.
        // Its bytes as a word: one load where eight are buffered (a copy of `n` bytes was a
        // call to memcpy per entry).
        let short = (n <= 8).then(|| {
            let word = match buf.get(p..p + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                Some(b) => u64::from_le_bytes(b) & if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 },
                None => {
                    let mut word = [0u8; 8];
                    word[..n].copy_from_slice(raw);
                    u64::from_le_bytes(word)
                }
            };
            (word, n)
        });
        let id = match (short, self.scratch.last_string) {
            (Some(key), (last, id)) if key == last => id,
            _ => {
                let id = self.heap.strings.intern_bytes(raw, self.limits.max_total_string_bytes)?;
                if let Some(key) = short {
                    self.scratch.last_string = (key, id);
                }
                id
            }
        };
        let v = Value::Str(id);
        let (put, next) = self.memo_op(buf, p + n)?;
        if put {
            self.put(v)?;
        }
        Some((v, 0, next))
    }
}

/// Whether the bytes at `p` (after a list's memo put) are a memo get and APPEND, FRAMEs
/// aside: the get's index and the position after APPEND.
#[inline(always)]
fn one_item_form(buf: &[u8], p: usize) -> Option<(usize, usize)> {
    let (w, p) = past_frames(buf, p)?;
    let (index, next) = match w[0] {
        op::BINGET => (w[1] as usize, p + 2),
        op::LONG_BINGET => (u32_at(w, 1) as usize, p + 5),
        _ => return None,
    };
    let (w, p) = past_frames(buf, next)?;
    (w[0] == op::APPEND).then_some((index, p + 1))
}

/// The `STEP` bytes of the first opcode at or after `p` that is not FRAME (protocol 4 frames
/// the pickle every 64 KiB, between any two opcodes), and where it is, if buffered.
#[inline(always)]
pub(super) fn past_frames(buf: &[u8], mut p: usize) -> Option<(&[u8; STEP], usize)> {
    loop {
        let w = step(buf, p)?;
        if w[0] != op::FRAME {
            return Some((w, p));
        }
        p += 9;
    }
}
