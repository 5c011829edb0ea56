//! The fast path for the dict a snapshot holds millions of: a trace entry, pickled as
//! `EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`, its keys and values memo gets, short
//! strings or numbers, and its frames a list of memoized frame dicts.
//!
//! It parses the bytes already buffered, in place, and hands the pairs straight to the sink's
//! `fold_dict`: no heap container, no trip through the VM stack or the dispatch loop. Every
//! check the general machine makes on these opcodes is made here too (memo indexes, string
//! and memo limits, depth, counts), and what it ends with is what the general machine would:
//! the same folded id, memo and sink calls. On anything else (another opcode, the end of the
//! buffer, a limit within reach, a dict the sink does not fold) it undoes its memo puts and
//! the general machine reads the same bytes from the start, so values, errors and offsets
//! stay the general machine's. `tests/integration/fast_path.rs` and the `fast_path` fuzz target run
//! both paths on the same bytes and compare.

use std::io::Read;

use super::super::memo::Memo;
use super::super::value::{Heap, Kind, Value};
use super::super::{Limits, Sink};
use super::opcodes as op;
use super::{Failure, Res, Vm};

/// Most key-value pairs the fast path takes in one dict (a trace entry has 8 or 9).
const MAX_PAIRS: usize = 16;
/// Most frames it takes in one frames list.
const MAX_FRAMES: usize = 256;

/// What the fast path made of the bytes after an EMPTY_DICT.
enum Fast {
    /// The dict was folded; `used` bytes after the EMPTY_DICT were consumed.
    Folded { used: usize, value: Value },
    /// Not a shape it takes: the general machine reads these bytes.
    Fallback,
}

/// Item buffers kept across entries (filling fresh arrays would cost more than the parse).
#[derive(Default)]
pub(super) struct Scratch {
    items: Vec<Value>,
    frames: Vec<Value>,
}

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
}

impl<R: Read, S: Sink> Vm<'_, R, S> {
    /// Tries the fast path with the input just past an EMPTY_DICT; true if it read the dict.
    #[inline]
    pub(super) fn entry_fast(&mut self) -> Res<bool, S::Error> {
        let l = self.limits;
        // Room for everything the general machine would check as it goes.
        if self.stack.len() + 2 * MAX_PAIRS + MAX_FRAMES + 4 >= l.max_stack as usize
            || self.marks.len() + 2 >= l.max_marks as usize
            || self.heap.container_count() + 2 > l.max_containers.min(u32::MAX as u64)
        {
            return Ok(false);
        }
        let (heads, memo_start, at) = (self.heap.node_count(), self.memo.slots.len(), self.at);
        let mut parts = Parts {
            scratch: &mut self.fast,
            heap: &mut self.heap,
            memo: &mut self.memo,
            sink: &mut *self.sink,
            limits: l,
            base: self.input.offset(),
            memo_start,
            open_slots: [usize::MAX; 2],
            unbuilt: 0,
        };
        let outcome = parts.dict(self.input.window(), &mut self.at);
        let unbuilt = parts.unbuilt;
        match outcome {
            Ok(Fast::Folded { used, value }) => {
                self.input.advance(used);
                self.heap.count_unbuilt(unbuilt);
                self.fast_dicts += 1;
                self.stack.push(value);
                Ok(true)
            }
            Ok(Fast::Fallback) => {
                self.memo.truncate(memo_start);
                self.heap.truncate_nodes(heads);
                self.at = at;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

impl<S: Sink> Parts<'_, S> {
    /// The dict after its EMPTY_DICT, up to and including its SETITEMS.
    #[inline]
    fn dict(&mut self, buf: &[u8], at: &mut u64) -> Res<Fast, S::Error> {
        let Some(mut p) = self.open(buf, 0, 0) else { return Ok(Fast::Fallback) };
        let mut items = std::mem::take(&mut self.scratch.items);
        items.clear();
        let outcome = self.pairs(buf, &mut p, &mut items, at);
        let folded = match outcome {
            Ok(true) => self.fold(&items, p, at, Kind::Dict),
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        self.scratch.items = items;
        let Some(value) = folded? else { return Ok(Fast::Fallback) };
        Ok(Fast::Folded { used: p + 1, value })
    }

    /// The pairs of a dict up to its SETITEMS (at `p` after); false to fall back.
    #[inline(always)]
    fn pairs(&mut self, buf: &[u8], p: &mut usize, items: &mut Vec<Value>, at: &mut u64) -> Res<bool, S::Error> {
        loop {
            let Some(&code) = buf.get(*p) else { return Ok(false) };
            if code == op::SETITEMS {
                return Ok(!items.is_empty() && items.len().is_multiple_of(2));
            }
            if items.len() == 2 * MAX_PAIRS {
                return Ok(false);
            }
            let found = if code == op::EMPTY_LIST { self.frames(buf, *p + 1, at)? } else { self.scalar(buf, *p) };
            let Some((value, next)) = found else { return Ok(false) };
            *p = next;
            items.push(value);
        }
    }

    /// Hands a finished container's `items` to the sink, as the general machine would when
    /// its closing opcode (at `p`) places them: within the value and depth limits, and with
    /// the sink's errors at that opcode. None to fall back.
    fn fold(&mut self, items: &[Value], p: usize, at: &mut u64, kind: Kind) -> Res<Option<Value>, S::Error> {
        let depth = items.iter().map(|&v| self.heap.value_depth(v)).max().unwrap_or(0);
        if self.heap.value_count() + items.len() as u64 > self.limits.max_values || depth >= self.limits.max_depth {
            return Ok(None);
        }
        *at = self.base + p as u64;
        let folded = match kind {
            Kind::Dict => self.sink.fold_dict(self.heap, items),
            _ => self.sink.fold_list(self.heap, items),
        };
        let folded = folded.map_err(|error| Failure::Sink { error, offset: *at })?;
        let Some(f) = folded else { return Ok(None) };
        let value = Value::Folded(f);
        if !self.close(usize::from(kind != Kind::Dict), value) {
            return Ok(None);
        }
        self.unbuilt += 1;
        Ok(Some(value))
    }

    /// A frames list after its EMPTY_LIST: memoized frame dicts, folded by the sink into one
    /// value, or none. Returns the value and the position after the list.
    fn frames(&mut self, buf: &[u8], from: usize, at: &mut u64) -> Res<Option<(Value, usize)>, S::Error> {
        if buf.get(self.memo_op(buf, from).map_or(from, |(_, p)| p)) != Some(&op::MARK) {
            return Ok(self.empty_list(buf, from));
        }
        let Some(mut p) = self.open(buf, from, 1) else { return Ok(None) };
        let mut items = std::mem::take(&mut self.scratch.frames);
        items.clear();
        let complete = loop {
            let Some(&code) = buf.get(p) else { break false };
            if code == op::APPENDS {
                break !items.is_empty();
            }
            if items.len() == MAX_FRAMES {
                break false;
            }
            // A frame dict the general machine has placed before: anything else it would
            // seal or fold on the way in, which is its business.
            match self.get(buf, p) {
                Some((v @ Value::Node(id), next)) if self.heap.kind(id) == Kind::Dict && self.heap.sealed(id) => {
                    items.push(v);
                    p = next;
                }
                _ => break false,
            }
        };
        let folded = if complete { self.fold(&items, p, at, Kind::List) } else { Ok(None) };
        self.scratch.frames = items;
        Ok(folded?.map(|v| (v, p + 1)))
    }

    /// An empty list (torch's frames of an allocation made outside Python): a real, empty
    /// container, sealed as it is placed, as the general machine leaves it.
    fn empty_list(&mut self, buf: &[u8], p: usize) -> Option<(Value, usize)> {
        let (put, next) = self.memo_op(buf, p)?;
        let id = self.heap.new_node(Kind::List);
        self.heap.seal(id);
        let v = Value::Node(id);
        if put {
            self.put(v)?;
        }
        Some((v, next))
    }

    /// After a new container's opcode at `p`: its memo put, which must append (a placeholder
    /// until the container is done), then MARK. Returns the position after the MARK.
    fn open(&mut self, buf: &[u8], p: usize, which: usize) -> Option<usize> {
        let (put, p) = self.memo_op(buf, p)?;
        if put {
            self.open_slots[which] = self.memo.slots.len();
            self.put(Value::Node(0))?;
        }
        (buf.get(p) == Some(&op::MARK)).then_some(p + 1)
    }

    /// Gives an opened container's memo slot, if any, its final value.
    fn close(&mut self, which: usize, value: Value) -> bool {
        let slot = std::mem::replace(&mut self.open_slots[which], usize::MAX);
        slot == usize::MAX || self.memo.put(slot, value)
    }

    /// A memo put at `p` (MEMOIZE, or BINPUT / LONG_BINPUT of the next index), if there is
    /// one: whether there was, and the position after it. None for a put elsewhere.
    #[inline(always)]
    fn memo_op(&self, buf: &[u8], p: usize) -> Option<(bool, usize)> {
        let next = self.memo.slots.len() as u64;
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
    fn put(&mut self, v: Value) -> Option<()> {
        let len = self.memo.slots.len();
        if len as u64 >= self.limits.max_memo {
            return None;
        }
        self.memo.put(len, v).then_some(())
    }

    /// A memo get at `p`, resolved as the general machine's settling would see the value.
    #[inline(always)]
    fn get(&self, buf: &[u8], p: usize) -> Option<(Value, usize)> {
        let (index, next) = match *buf.get(p)? {
            op::BINGET => (*buf.get(p + 1)? as usize, p + 2),
            op::LONG_BINGET => (le_u32(buf, p + 1)? as usize, p + 5),
            _ => return None,
        };
        let slot = *self.memo.slots.get(index)?;
        if index >= self.memo_start && self.open_slots.contains(&index) {
            return None;
        }
        let v = match self.memo.decode(slot) {
            Value::Node(id) => match self.heap.folded(id) {
                Some(f) => Value::Folded(f),
                None if self.heap.sealed(id) => Value::Node(id),
                None => return None,
            },
            v => v,
        };
        Some((v, next))
    }

    /// A key or value that is no container: a memo get, a string with its memo put, a
    /// number, None or a bool. Returns it and the position after it.
    #[inline(always)]
    fn scalar(&mut self, buf: &[u8], p: usize) -> Option<(Value, usize)> {
        let code = *buf.get(p)?;
        let (v, next) = match code {
            op::BINGET | op::LONG_BINGET => return self.get(buf, p),
            op::SHORT_BINUNICODE => {
                let n = *buf.get(p + 1)? as usize;
                self.string(buf, p + 2, n)?
            }
            op::BINUNICODE => {
                let n = le_u32(buf, p + 1)? as usize;
                self.string(buf, p + 5, n)?
            }
            op::BININT1 => (Value::Int(*buf.get(p + 1)? as i64), p + 2),
            op::BININT2 => (Value::Int(u16::from_le_bytes(bytes(buf, p + 1)?) as i64), p + 3),
            op::BININT => (Value::Int(le_u32(buf, p + 1)? as i32 as i64), p + 5),
            op::LONG1 => {
                let n = *buf.get(p + 1)? as usize;
                if n > 8 {
                    return None;
                }
                // One 8-byte load (the entry goes on past the number), the bytes shifted to
                // the top of the word: an arithmetic shift down sign-extends them.
                let word = u64::from_le_bytes(bytes(buf, p + 2)?);
                let v = if n == 0 { 0 } else { ((word << (64 - 8 * n)) as i64) >> (64 - 8 * n) };
                (Value::Int(v), p + 2 + n)
            }
            op::BINFLOAT => (Value::Float(f64::from_be_bytes(bytes(buf, p + 1)?)), p + 9),
            op::NONE => (Value::None, p + 1),
            op::NEWTRUE => (Value::Bool(true), p + 1),
            op::NEWFALSE => (Value::Bool(false), p + 1),
            _ => return None,
        };
        Some((v, next))
    }

    /// A string of `n` bytes at `p`, interned, and the memo put after it if any.
    #[inline(always)]
    fn string(&mut self, buf: &[u8], p: usize, n: usize) -> Option<(Value, usize)> {
        if n as u64 > self.limits.max_string_bytes {
            return None;
        }
        let raw = buf.get(p..p.checked_add(n)?)?;
        let id = self.heap.strings.intern_bytes(raw, self.limits.max_total_string_bytes)?;
        let v = Value::Str(id);
        let (put, next) = self.memo_op(buf, p + n)?;
        if put {
            self.put(v)?;
        }
        Some((v, next))
    }
}

#[inline(always)]
fn bytes<const N: usize>(buf: &[u8], p: usize) -> Option<[u8; N]> {
    buf.get(p..p + N)?.try_into().ok()
}

#[inline(always)]
fn le_u32(buf: &[u8], p: usize) -> Option<u32> {
    bytes::<4>(buf, p).map(u32::from_le_bytes)
}
