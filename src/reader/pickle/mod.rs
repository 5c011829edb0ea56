//! The pickle virtual machine, reduced to what data needs: it builds values, never objects.
//!
//! Each opcode is read with its operands, checked against [`Limits`], and applied to a value
//! stack. Opcodes that import or call (GLOBAL, REDUCE, ...) stop the read with `Refused`.

use std::io::Read;

use super::error::{ErrorKind, Failure, ReadError};
use super::input::Input;
use super::memo::{MEMO_PAYLOAD, Memo};
use super::value::{Heap, Kind, Value};
use super::{Limits, Parsed, Sink};

mod dispatch;
mod entry;
mod opcodes;
mod split;
mod walk;

pub use split::{Open, Split, read_split};

use opcodes as op;

type Res<T, E> = Result<T, Failure<E>>;

/// Python's pickler writes APPENDS and SETITEMS in batches of this many values or pairs.
const PY_BATCH: usize = 1000;
/// Containers larger than this are never offered to the sink for folding.
const FOLD_MAX_ITEMS: usize = 4096;

pub(super) struct Vm<'a, R, S> {
    input: Input<R>,
    limits: &'a Limits,
    sink: &'a mut S,
    heap: Heap,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    scratch: Vec<u8>,
    fast: entry::Scratch,
    fast_dicts: u64,
    /// Dicts the fast path read since it last left one to the general machine: new frames
    /// make it do so, and a split waits until they have become rare (`split.rs`).
    fast_streak: u64,
    /// The bytes a later part read, once taken in.
    later_part: Option<std::ops::Range<u64>>,
    protocol: Option<u8>,
    /// Offset of the opcode being run, for errors.
    at: u64,
    /// A read in two parts (`split.rs`): the earlier part's plan for the later one.
    parts: Option<Box<dyn split::Parts<R, S> + 'a>>,
    /// The later part's reader stops where its list ends: at an opcode other than MARK or
    /// FRAME with no MARK open (or when the flag is set: the earlier part gave up on it).
    part_ends: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl<'a, R: Read, S: Sink> Vm<'a, R, S> {
    fn new(input: Input<R>, limits: &'a Limits, sink: &'a mut S, heap: Heap, memo: Memo) -> Self {
        Vm {
            input,
            limits,
            sink,
            heap,
            stack: Vec::new(),
            marks: Vec::new(),
            memo,
            scratch: Vec::new(),
            fast: entry::Scratch::default(),
            fast_dicts: 0,
            fast_streak: 0,
            later_part: None,
            protocol: None,
            at: 0,
            parts: None,
            part_ends: None,
        }
    }
}

/// Runs a pickle to its STOP and returns the value it built.
pub fn read<R: Read, S: Sink>(reader: R, limits: &Limits, sink: &mut S) -> Result<Parsed, Failure<S::Error>> {
    read_with(reader, limits, sink, None)
}

fn read_with<'a, R: Read, S: Sink>(
    reader: R,
    limits: &'a Limits,
    sink: &'a mut S,
    parts: Option<Box<dyn split::Parts<R, S> + 'a>>,
) -> Result<Parsed, Failure<S::Error>> {
    let mut heap = Heap::within(limits.max_heap_bytes);
    sink.prepare(&mut heap.strings);
    let input = Input::new(reader, limits.max_input_bytes);
    let mut vm = Vm::new(input, limits, sink, heap, Memo::new());
    vm.parts = parts;
    let mut root = vm.run()?;
    // A root dict the sink folded reads as its folded id, as it does anywhere else (and as
    // the entry fast path leaves it).
    if let Value::Node(id) = root
        && let Some(f) = vm.heap.folded(id)
    {
        root = Value::Folded(f);
    }
    Ok(Parsed {
        root,
        heap: vm.heap,
        protocol: vm.protocol,
        bytes_read: vm.input.offset(),
        fast_dicts: vm.fast_dicts,
        later_part: vm.later_part,
    })
}

impl<R: Read, S: Sink> Vm<'_, R, S> {
    fn err<T>(&self, kind: ErrorKind) -> Res<T, S::Error> {
        Err(Failure::Read(ReadError { kind, offset: self.at }))
    }

    fn limit<T>(&self, what: &'static str, limit: u64) -> Res<T, S::Error> {
        self.err(ErrorKind::Limit { what, limit })
    }

    #[inline]
    fn push(&mut self, v: Value) -> Res<(), S::Error> {
        if self.stack.len() as u64 >= self.limits.max_stack {
            return self.limit("stack depth", self.limits.max_stack);
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self, opcode: &'static str) -> Res<Value, S::Error> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.err(ErrorKind::StackUnderflow { opcode });
        }
        Ok(self.stack.pop().unwrap_or(Value::None))
    }

    /// The top value; like Python's unpickler, values below the last MARK are out of reach.
    fn top(&self, opcode: &'static str) -> Res<Value, S::Error> {
        let floor = self.marks.last().copied().unwrap_or(0);
        match self.stack.last() {
            Some(v) if self.stack.len() > floor => Ok(*v),
            _ => self.err(ErrorKind::StackUnderflow { opcode }),
        }
    }

    /// Index of the last MARK; the values above it are taken by the caller.
    fn pop_mark(&mut self, opcode: &'static str) -> Res<usize, S::Error> {
        match self.marks.pop() {
            Some(m) if m <= self.stack.len() => Ok(m),
            _ => self.err(ErrorKind::StackUnderflow { opcode }),
        }
    }

    /// A value is leaving the stack for a container: seal it, and let the sink fold it if the
    /// early path (see [`Sink`]) did not.
    #[inline]
    fn settle(&mut self, v: Value) -> Res<Value, S::Error> {
        let Value::Node(id) = v else { return Ok(v) };
        if let Some(f) = self.heap.folded(id) {
            return Ok(Value::Folded(f));
        }
        if self.heap.sealed(id) {
            return Ok(v);
        }
        self.heap.seal(id);
        let kind = self.heap.kind(id);
        let len = self.heap.len(id);
        if !matches!(kind, Kind::Dict | Kind::List) || len == 0 || len > FOLD_MAX_ITEMS {
            return Ok(v);
        }
        let items: Vec<Value> = self.heap.items(id).collect();
        let folded = self.offer(kind, &items)?;
        match folded {
            Some(f) => {
                self.heap.fold(id, f);
                Ok(Value::Folded(f))
            }
            None => Ok(v),
        }
    }

    fn offer(&mut self, kind: Kind, items: &[Value]) -> Res<Option<u32>, S::Error> {
        let folded = match kind {
            Kind::Dict => self.sink.fold_dict(&self.heap, items),
            _ => self.sink.fold_list(&self.heap, items),
        };
        folded.map_err(|error| Failure::Sink { error, offset: self.at })
    }

    fn new_node(&mut self, kind: Kind) -> Res<u32, S::Error> {
        if self.heap.container_count() >= self.limits.max_containers.min(u32::MAX as u64) {
            return self.limit("number of containers", self.limits.max_containers);
        }
        if self.heap.over_budget(0) {
            return self.err(self.heap.memory_error(0));
        }
        Ok(self.heap.new_node(kind))
    }

    /// Settles the stack's values from `from` up, to be placed into container `id`; returns
    /// their greatest depth.
    fn settle_range(&mut self, id: u32, from: usize) -> Res<u32, S::Error> {
        let n = (self.stack.len() - from) as u64;
        if !self.heap.room_for_values(n, self.limits.max_values) {
            if self.heap.value_count() + n > self.limits.max_values {
                return self.limit("number of values", self.limits.max_values);
            }
            return self.err(self.heap.memory_error(n));
        }
        let mut max_depth = 0;
        for i in from..self.stack.len() {
            // Only containers are sealed or folded; a value the fast path folded (memoized as
            // such) has the depth of one folded here.
            let v = match self.stack[i] {
                Value::Node(child) if child == id => return self.err(ErrorKind::Recursive),
                Value::Node(child) => {
                    let v = self.settle(Value::Node(child))?;
                    self.stack[i] = v;
                    v
                }
                v => v,
            };
            max_depth = max_depth.max(self.heap.value_depth(v));
        }
        if max_depth + 1 > self.limits.max_depth {
            return self.limit("nesting depth", self.limits.max_depth as u64);
        }
        Ok(max_depth)
    }

    /// Moves the stack's values from `from` up into container `id` (which must still be open).
    fn extend(&mut self, id: u32, from: usize) -> Res<(), S::Error> {
        let max_depth = self.settle_range(id, from)?;
        self.heap.extend(id, &self.stack[from..], max_depth);
        self.stack.truncate(from);
        Ok(())
    }

    /// The container a mutating opcode applies to, checked to be of one of `kinds`.
    fn target(&self, v: Value, opcode: &'static str, expected: &'static str, kinds: &[Kind]) -> Res<u32, S::Error> {
        match v {
            Value::Node(id) if kinds.contains(&self.heap.kind(id)) && self.heap.folded(id).is_none() => {
                if self.heap.sealed(id) {
                    return self.err(ErrorKind::Recursive);
                }
                Ok(id)
            }
            Value::Node(id) => {
                let found = if self.heap.folded(id).is_some() { "folded value" } else { self.heap.kind(id).name() };
                self.err(ErrorKind::WrongType { opcode, expected, found })
            }
            other => self.err(ErrorKind::WrongType { opcode, expected, found: other.type_name() }),
        }
    }

    /// Builds a new container from the values above the last MARK.
    fn collect(&mut self, kind: Kind, opcode: &'static str) -> Res<(), S::Error> {
        let mark = self.pop_mark(opcode)?;
        if kind == Kind::Dict && !(self.stack.len() - mark).is_multiple_of(2) {
            return self.err(ErrorKind::StackUnderflow { opcode });
        }
        let id = self.new_node(kind)?;
        self.extend(id, mark)?;
        self.push(Value::Node(id))
    }

    /// Adds the values above the last MARK to the container below it.
    fn extend_from_mark(&mut self, opcode: &'static str, expected: &'static str, kinds: &[Kind]) -> Res<(), S::Error> {
        let mark = self.pop_mark(opcode)?;
        if mark == 0 {
            return self.err(ErrorKind::StackUnderflow { opcode });
        }
        let id = self.target(self.stack[mark - 1], opcode, expected, kinds)?;
        let n = self.stack.len() - mark;
        let kind = self.heap.kind(id);
        if kind == Kind::Dict && !n.is_multiple_of(2) {
            return self.err(ErrorKind::StackUnderflow { opcode });
        }
        let max_depth = self.settle_range(id, mark)?;
        // The early fold: a short batch on an empty container is its last (see `Sink`).
        if n > 0 && n < PY_BATCH && kind != Kind::Set && self.heap.is_empty(id) {
            let items = std::mem::take(&mut self.stack);
            let folded = self.offer(kind, &items[mark..]);
            self.stack = items;
            if let Some(f) = folded? {
                self.heap.seal(id);
                self.heap.fold(id, f);
                self.stack.truncate(mark);
                return Ok(());
            }
        }
        self.heap.extend(id, &self.stack[mark..], max_depth);
        self.stack.truncate(mark);
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Res<(), S::Error> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.err(ErrorKind::StackUnderflow { opcode: "PUT" });
        }
        let v = self.stack[self.stack.len() - 1];
        self.memo_store(index, v)
    }

    /// Puts `v` (the value on top of the stack) in the memo at `index`, within the limits.
    #[inline(always)]
    fn memo_store(&mut self, index: u64, v: Value) -> Res<(), S::Error> {
        let len = self.memo.len() as u64;
        if index > len {
            // Python's pickler never skips indexes; allow a few, as a map.
            if self.memo.sparse.len() as u64 >= self.limits.max_marks {
                return self.limit("sparse memo entries", self.limits.max_marks);
            }
            self.memo.sparse.insert(index, v);
            return Ok(());
        }
        if index == len && len >= self.limits.max_memo {
            return self.limit("memo size", self.limits.max_memo);
        }
        // The memo's slots count against the heap's budget, checked every 64Ki entries.
        if index == len && len & 0xFFFF == 0 && self.heap.budget != 0 {
            self.heap.outside = len * 8;
            if self.heap.over_budget(0) {
                return self.err(self.heap.memory_error(0));
            }
        }
        if !self.memo.put(index as usize, v) {
            return self.limit("memoized scalars", MEMO_PAYLOAD as u64);
        }
        Ok(())
    }

    #[inline(always)]
    fn memo_get(&mut self, index: u64) -> Res<(), S::Error> {
        if let Some(slot) = self.memo.slot(index as usize) {
            let v = self.memo.decode(slot);
            return self.push(v);
        }
        match self.memo.sparse.get(&index) {
            Some(&v) => self.push(v),
            None => self.err(ErrorKind::MemoMissing(index)),
        }
    }

    /// BINGET and LONG_BINGET, and the gets right after: they come in runs (a dict's keys and
    /// their shared values), and testing for the next one here predicts better than the
    /// dispatch's jump table.
    #[inline(always)]
    fn memo_get_run(&mut self, mut op: u8) -> Res<(), S::Error> {
        loop {
            let i = if op == op::BINGET {
                self.input.byte()? as u64
            } else {
                u32::from_le_bytes(self.input.array()?) as u64
            };
            self.memo_get(i)?;
            match self.input.peek() {
                Some(next @ (op::BINGET | op::LONG_BINGET)) => {
                    self.at = self.input.offset();
                    self.input.skip(1);
                    op = next;
                }
                _ => return Ok(()),
            }
        }
    }

    fn string(&mut self, len: u64, bytes: bool) -> Res<Value, S::Error> {
        if len > self.limits.max_string_bytes {
            return self.limit("string length in bytes", self.limits.max_string_bytes);
        }
        let raw = self.input.take(len as usize, &mut self.scratch)?;
        let Some(id) = self.heap.strings.intern_bytes(raw, self.limits.max_total_string_bytes) else {
            return self.limit("total string bytes", self.limits.max_total_string_bytes);
        };
        let v = if bytes { Value::Bytes(id) } else { Value::Str(id) };
        self.push(v)?;
        Ok(v)
    }

    fn long(&mut self, len: u64) -> Res<(), S::Error> {
        if let Some(high) = self.input.take_le(len as usize) {
            // The bytes sit at the top of `high`: an arithmetic shift down sign-extends them.
            let v = if len == 0 { 0 } else { (high as i64) >> (64 - 8 * len) };
            return self.push(Value::Int(v));
        }
        if len <= 8 {
            // Near the end of the buffer: byte by byte.
            let mut raw = [0u8; 8];
            for b in raw.iter_mut().take(len as usize) {
                *b = self.input.byte()?;
            }
            let negative = len > 0 && raw[len as usize - 1] & 0x80 != 0;
            if negative {
                raw[len as usize..].fill(0xff);
            }
            return self.push(Value::Int(i64::from_le_bytes(raw)));
        }
        if len > 64 {
            return self.err(ErrorKind::IntTooLarge);
        }
        let raw = self.input.take(len as usize, &mut self.scratch)?;
        match super::text::le_int(raw) {
            Some(v) => self.push(v),
            None => self.err(ErrorKind::IntTooLarge),
        }
    }

    fn text_line(&mut self) -> Res<String, S::Error> {
        let line = self.input.line(256, &mut self.scratch)?;
        Ok(String::from_utf8_lossy(line).into_owned())
    }

    fn text_index(&mut self) -> Res<u64, S::Error> {
        let line = self.text_line()?;
        match line.trim().parse::<u64>() {
            Ok(i) => Ok(i),
            Err(_) => self.err(ErrorKind::BadText("memo index")),
        }
    }

    /// MEMOIZE right after the value it names, done without a trip through the dispatch loop:
    /// protocol 4 writes it after every string and container. `v` is the value just pushed,
    /// passed along rather than read back from the stack (a load right after the store of the
    /// same 16 bytes stalls).
    #[inline(always)]
    fn fused_memoize(&mut self, v: Value) -> Res<(), S::Error> {
        if self.input.peek() == Some(op::MEMOIZE) {
            self.at = self.input.offset();
            self.input.skip(1);
            self.memo_store(self.memo.len() as u64, v)?;
        }
        Ok(())
    }

    /// MEMOIZE and MARK after a new container (`EMPTY_DICT MEMOIZE MARK` opens every dict).
    #[inline(always)]
    fn fused_memoize_mark(&mut self, v: Value) -> Res<(), S::Error> {
        self.fused_memoize(v)?;
        if self.input.peek() == Some(op::MARK) && (self.marks.len() as u64) < self.limits.max_marks {
            self.input.skip(1);
            self.marks.push(self.stack.len());
        }
        Ok(())
    }
}
