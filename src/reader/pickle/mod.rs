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
mod operands;
mod shapes;
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
    /// The later part, once taken in.
    later_part: Option<crate::reader::LaterPart>,
    protocol: Option<u8>,
    /// Offset of the opcode being run, for errors.
    at: u64,
    /// A read in two parts (`split.rs`): the earlier part's plan for the later one.
    parts: Option<Box<dyn split::Parts<R, S> + 'a>>,
    /// The later part's reader stops where its list ends: at an opcode other than MARK or
    /// FRAME with no MARK open (or when the flag is set: the earlier part gave up on it).
    part_ends: Option<std::sync::Arc<split::Control>>,
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
}
