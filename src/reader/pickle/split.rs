//! One pickle read in two parts at once, on two cores: a snapshot's trace is one list of
//! millions of entries, and its back half can be read on another thread while this one reads
//! the front half.
//!
//! How: once the earlier part (this thread) has read a few batches of a big list, it copies
//! its heap, memo and sink and starts the later part's thread, which walks ahead (`walk.rs`)
//! to a batch boundary past the middle of what is left, learns there how long the memo will
//! be, and reads on from there to the list's end with its own memo puts at the right indexes.
//! When the earlier part reaches that boundary it takes the later part in: its strings,
//! containers and folded values get the ids a single read would have given them, in the same
//! order, and reading goes on after the list.
//!
//! Nothing the later part assumed is trusted: the earlier part takes it in only if it stands
//! exactly where the walk said (same offset, same list on top of the same stack, the memo as
//! long as the walk counted, none of the copied entries changed since), if the later part
//! read without an error, saw no memo entry made after the copy, changed none of the copied
//! containers, and if together they stay within every limit the single read checks on the
//! way. Otherwise the earlier part reads on alone, exactly as a single read would, and the
//! later part's work is thrown away: values, errors and their offsets are always a single
//! read's. `tests/integration/split.rs` and the `split` fuzz target hold the two to that.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::walk::{Pace, Start, walk};
use super::{Failure, Vm};
use crate::reader::input::Input;
use crate::reader::memo::Memo;
use crate::reader::value::{Heap, Kind, Mark, Value};
use crate::reader::{Limits, Parsed, Sink};

/// Opens the input again at a byte offset.
pub type Open = Arc<dyn Fn(u64) -> std::io::Result<Box<dyn Read + Send>> + Send + Sync>;

/// What a read in two parts needs: the input's length and a way to open it at an offset,
/// and when to split.
#[derive(Clone)]
pub struct Split {
    /// Bytes in the whole input.
    pub len: u64,
    /// Opens the input at an offset: the later part reads from there, and the earlier one
    /// goes on from the end of the later part.
    pub open: Open,
    /// Split only a list holding at least this many items when the earlier part considers
    /// it (Python writes lists in batches of 1000).
    pub min_items: usize,
    /// Split only when at least this many bytes are left.
    pub min_bytes: u64,
    /// The later part is started once the earlier one is this share of the way through the
    /// input (in thousandths),
    pub fork_share: u64,
    /// and has read this many trace entries in a row through the fast path: new frames,
    /// which the fast path leaves to the general machine, have become rare, and the later
    /// part's copy of the memo holds those it will refer to.
    pub quiet: u64,
    /// The later part starts at least this share of the way through what is left then
    /// (thousandths),
    pub later_share: u64,
    /// and, where this is set, at the first batch boundary past that where the two parts are
    /// on course to finish together: where what the later part has left to read is no more
    /// than what the earlier part has left to get there (`walk::Pace`). A fixed share
    /// balances the parts only where both cores run alike; on a machine whose cores do not
    /// (a virtual machine's, shared with others), the earlier part finished up to a fifth of
    /// the read after the later one, or waited as long for it.
    pub pace: bool,
    /// Where the earlier part reaches the later part's start while the later part still reads,
    /// and has read at least this much faster meanwhile (thousandths: 1500, half again as
    /// fast), it stops the later part, which ends at its next batch, and reads the rest of the
    /// list itself rather than wait. A pace is a forecast: a second core that another process
    /// takes after it (or a virtual machine's, shared) would keep the earlier part waiting
    /// for as long as it is slowed. 0: stop whenever it still reads; `u64::MAX`: never.
    pub overtake: u64,
}

/// Reads a pickle as [`super::read`] does, with the list that holds most of it (a trace)
/// read in two parts at once where it can be.
pub fn read_split<S: Sink + Send + 'static>(
    split: Split,
    limits: &Limits,
    sink: &mut S,
) -> Result<Parsed, Failure<S::Error>> {
    let jump = Arc::new(AtomicU64::new(NO_JUMP));
    let first = (split.open)(0).map_err(|e| {
        let kind = crate::reader::error::ErrorKind::Io(e.to_string());
        Failure::Read(crate::reader::ReadError { kind, offset: 0 })
    })?;
    let reader = Reopening { inner: first, open: split.open.clone(), jump: jump.clone() };
    let plan: Box<dyn Parts<Reopening, S>> = Box::new(Plan::Waiting { split, jump, tried: None });
    super::read_with(reader, limits, sink, Some(plan))
}

const NO_JUMP: u64 = u64::MAX;

/// The earlier part's reader: once the later part is taken in, it reads on from the
/// later part's end.
pub(super) struct Reopening {
    inner: Box<dyn Read + Send>,
    open: Open,
    jump: Arc<AtomicU64>,
}

impl Read for Reopening {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let to = self.jump.swap(NO_JUMP, Ordering::Relaxed);
        if to != NO_JUMP {
            self.inner = (self.open)(to)?;
        }
        self.inner.read(buf)
    }
}

/// The earlier part's side of a split, called by the machine after each APPENDS.
pub(super) trait Parts<R, S> {
    /// May start the later part, or take it in; returns the offset to read on from when it
    /// took it in.
    fn after_appends(&mut self, vm: &mut Vm<'_, R, S>) -> Option<u64>;
}

enum Plan<S> {
    /// Waiting for a big list; `tried` is the last one whose walk found no start.
    Waiting {
        split: Split,
        jump: Arc<AtomicU64>,
        tried: Option<u32>,
    },
    Running(Box<Running<S>>, Split),
    Done,
}

/// A later part reading on its thread, and what the earlier part needs to take it in.
struct Running<S> {
    jump: Arc<AtomicU64>,
    list: u32,
    stack: usize,
    marks: usize,
    /// Memo entries and side values the later part copied.
    copied: (usize, usize),
    mark: Mark,
    /// Values the list held when copied.
    kept: usize,
    /// Where the earlier part was when it forked.
    forked_at: u64,
    /// Where the later part starts, once its walk found it (0: nowhere), and the walk's
    /// answer to come until then. The start is never before `target`.
    start: Option<u64>,
    found: mpsc::Receiver<u64>,
    target: u64,
    /// Where the earlier part is, for a paced walk: it never waits for the walk's answer.
    earlier: Option<Arc<AtomicU64>>,
    control: Arc<Control>,
    done: mpsc::Receiver<Option<Box<Later<S>>>>,
    /// The later part's thread, joined when the earlier part drops it, so that no copy of
    /// the state outlives the read.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the later part read: up to `end`, the list's end or the first entry that needs a
/// memo entry it cannot see, where it stopped in the middle of a batch (`batch`): the values
/// it read of that batch are then in `stack`.
struct Later<S> {
    end: u64,
    heap: Heap,
    memo: Memo,
    sink: S,
    fast_dicts: u64,
    batch: bool,
    stack: Vec<Value>,
    /// The walk's time and the read's, and whether the earlier part stopped it.
    walked: Duration,
    read: Duration,
    stopped: bool,
}

/// What the two parts share while the later one goes: the flag that stops it (at its next
/// batch, or its walk at its next step), and how far its read has come, for the earlier part
/// to judge whether to wait for it ([`Split::overtake`]).
pub(super) struct Control {
    pub(super) stop: AtomicBool,
    /// The later part stopped because it was told to, before its list ended.
    stopped: AtomicBool,
    /// Where the later part is, after its last batch, and when its read began, in nanoseconds
    /// after the fork (0: it has not), and where the earlier part then was (0: not known, where
    /// the walk was not paced).
    at: AtomicU64,
    began_ns: AtomicU64,
    earlier_then: AtomicU64,
    forked: Instant,
}

impl Control {
    /// In the later part, at a batch's end: whether to stop there. Notes where it is.
    pub(super) fn stop_at(&self, at: u64) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            self.stopped.store(true, Ordering::Relaxed);
            return true;
        }
        self.at.store(at, Ordering::Relaxed);
        false
    }
}

impl<S> Running<S> {
    /// With the earlier part at the later part's start, `here`: whether the later part is
    /// still reading and reads slower than the earlier part, by `overtake` (see
    /// [`Split::overtake`]). Both are timed over the later part's read (the earlier part's
    /// speed while the later one walked is not what it reads at beside a read), or where the
    /// earlier part's place then is not known, the earlier one's since the fork.
    fn later_is_slower(&self, here: u64, overtake: u64) -> bool {
        let c = &self.control;
        let began = c.began_ns.load(Ordering::Relaxed);
        if overtake == u64::MAX || began == 0 {
            return false;
        }
        let since_fork = c.forked.elapsed().as_secs_f64();
        let reading = (since_fork - began as f64 * 1e-9).max(1e-6);
        let (from, span) = match c.earlier_then.load(Ordering::Relaxed) {
            0 => (self.forked_at, since_fork.max(1e-6)),
            then => (then, reading),
        };
        let earlier = here.saturating_sub(from) as f64 / span;
        let later = c.at.load(Ordering::Relaxed).saturating_sub(here) as f64 / reading;
        earlier * 1000.0 >= later * overtake as f64
    }

    /// The later part's start, once known; with the earlier part at `at` past the target,
    /// it waits for the walk's answer (the walk runs far ahead of the read) rather than
    /// risk passing the start unknowing. A paced walk picks a start well ahead of where the
    /// earlier part says it is (`walk::Pace`), so the earlier part never waits for it; should
    /// it pass the start before the answer comes, it reads on alone, as a single read.
    fn start(&mut self, at: u64) -> Option<u64> {
        if let Some(earlier) = &self.earlier {
            earlier.store(at, Ordering::Relaxed);
        }
        if self.start.is_none() {
            let wait = at >= self.target && self.earlier.is_none();
            self.start = if wait { self.found.recv().ok() } else { self.found.try_recv().ok() };
        }
        self.start
    }
}

impl<S> Drop for Running<S> {
    /// The later part stops at its next batch (or walk step) once told; a read it finished or
    /// gave up has already sent its answer into a channel that holds it.
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<S: Sink + Send + 'static> Parts<Reopening, S> for Plan<S> {
    fn after_appends(&mut self, vm: &mut Vm<'_, Reopening, S>) -> Option<u64> {
        let at = vm.input.offset();
        match std::mem::replace(self, Plan::Done) {
            Plan::Waiting { split, jump, tried } => {
                *self = match start(vm, &split, &jump, tried) {
                    Fork::Started(r) => Plan::Running(Box::new(r), split),
                    Fork::NotYet => Plan::Waiting { split, jump, tried },
                    Fork::Never => Plan::Done,
                };
                None
            }
            Plan::Running(mut r, split) => match r.start(at) {
                None => {
                    *self = Plan::Running(r, split);
                    None
                }
                // The walk found no start in this list: wait for another.
                Some(0) => {
                    *self = Plan::Waiting { split, jump: r.jump.clone(), tried: Some(r.list) };
                    None
                }
                Some(start) if at < start => {
                    *self = Plan::Running(r, split);
                    None
                }
                Some(start) if at == start => take_in(vm, &r, split.overtake),
                Some(_) => None,
            },
            Plan::Done => None,
        }
    }
}

enum Fork<S> {
    Started(Running<S>),
    /// Not a list to split here: look again after the next APPENDS.
    NotYet,
    /// Too little is left to gain from a split, or the state cannot be copied.
    Never,
}

/// Starts the later part if the list on top of the stack is big enough, far enough in, and
/// enough is left.
fn start<S: Sink + Send + 'static>(
    vm: &mut Vm<'_, Reopening, S>,
    split: &Split,
    jump: &Arc<AtomicU64>,
    tried: Option<u32>,
) -> Fork<S> {
    let at = vm.input.offset();
    if split.len < at + split.min_bytes {
        return Fork::Never;
    }
    let Some(&Value::Node(list)) = vm.stack.last() else { return Fork::NotYet };
    if tried == Some(list)
        || vm.heap.kind(list) != Kind::List
        || at < split.len / 1000 * split.fork_share
        || vm.heap.len(list) < split.min_items
        || vm.fast_streak < split.quiet
        // Another batch must follow: a list written in one ends here.
        || !vm.part_goes_on().unwrap_or(false)
    {
        return Fork::NotYet;
    }
    let copied = vm.memo.len();
    let (Some(memo), Some(sink)) = (vm.memo.fork(), vm.sink.fork()) else { return Fork::Never };
    let heap = vm.heap.fork(list);
    let target = at + (split.len - at) / 1000 * split.later_share;
    let earlier = split.pace.then(|| Arc::new(AtomicU64::new(at)));
    let pace = earlier.clone().map(|earlier| Pace::new(earlier, at, split.len));
    let (Some(max_stack), Some(max_marks)) = (
        vm.limits.max_stack.checked_sub(vm.stack.len() as u64 - 1),
        vm.limits.max_marks.checked_sub(vm.marks.len() as u64),
    ) else {
        return Fork::Never;
    };
    let limits = Limits { max_stack, max_marks, ..vm.limits.clone() };
    let control = Arc::new(Control {
        stop: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        at: AtomicU64::new(0),
        began_ns: AtomicU64::new(0),
        earlier_then: AtomicU64::new(0),
        forked: Instant::now(),
    });
    let (found_tx, found) = mpsc::sync_channel(1);
    let (tx, done) = mpsc::sync_channel(1);
    let later = LaterPart {
        open: split.open.clone(),
        from: at,
        target,
        pace,
        list,
        protocol: vm.protocol,
        limits,
        heap,
        memo,
        copied,
        sink,
        found: found_tx,
        control: control.clone(),
    };
    let spawned = std::thread::Builder::new().name("later part".into()).spawn(move || {
        let _ = tx.send(later.read().map(Box::new));
    });
    let Ok(thread) = spawned else { return Fork::Never };
    Fork::Started(Running {
        jump: jump.clone(),
        list,
        stack: vm.stack.len(),
        marks: vm.marks.len(),
        copied: (copied, vm.memo.others_len()),
        mark: vm.heap.mark(),
        kept: vm.heap.len(list),
        forked_at: at,
        start: None,
        found,
        target,
        earlier,
        control,
        done,
        thread: Some(thread),
    })
}

/// The later part's thread: its input, the copies it starts from, and where to start.
struct LaterPart<S> {
    open: Open,
    from: u64,
    target: u64,
    pace: Option<Pace>,
    list: u32,
    protocol: Option<u8>,
    limits: Limits,
    heap: Heap,
    memo: Memo,
    copied: usize,
    sink: S,
    found: mpsc::SyncSender<u64>,
    control: Arc<Control>,
}

impl<S: Sink> LaterPart<S> {
    fn read(self) -> Option<Later<S>> {
        let began = Instant::now();
        let found = self.walk();
        let walked = began.elapsed();
        if let Some(pace) = &self.pace {
            self.control.earlier_then.store(pace.earlier(), Ordering::Relaxed);
        }
        let _ = self.found.send(found.map_or(0, |s| s.at));
        let Start { at, memo: base } = found?;
        let LaterPart { open, list, protocol, limits, heap, mut memo, mut sink, control, .. } = self;
        control.at.store(at, Ordering::Relaxed);
        control.began_ns.store((control.forked.elapsed().as_nanos() as u64).max(1), Ordering::Relaxed);
        memo.rebase(base);
        let input = Input::starting_at(open(at).ok()?, at, limits.max_input_bytes);
        let (end, fast_dicts, heap, memo, batch, stack) = {
            let mut vm = Vm::new(input, &limits, &mut sink, heap, memo);
            vm.stack.push(Value::Node(list));
            vm.protocol = protocol;
            vm.part_ends = Some(control.clone());
            vm.run().ok()?;
            // Either the list ended (no MARK open), or an entry of the batch whose MARK is the
            // only one open needs what this part cannot see: it stops before that entry.
            let (end, batch) = match vm.marks.as_slice() {
                [] => (vm.input.offset(), false),
                [1] => (vm.at, true),
                _ => return None,
            };
            if vm.stack.first() != Some(&Value::Node(list)) || !batch && vm.stack.len() != 1 {
                return None;
            }
            let stack = vm.stack.split_off(1);
            (end, vm.fast_dicts, vm.heap, vm.memo, batch, stack)
        };
        let stopped = control.stopped.load(Ordering::Relaxed);
        let read = began.elapsed() - walked;
        Some(Later { end, heap, memo, sink, fast_dicts, batch, stack, walked, read, stopped })
    }

    fn walk(&self) -> Option<Start> {
        let mut input = Input::starting_at((self.open)(self.from).ok()?, self.from, self.limits.max_input_bytes);
        walk(&mut input, self.copied, self.copied, self.target, self.pace.as_ref(), &self.control.stop)
    }
}

/// Takes the later part in if the earlier part stands where it assumed and together they
/// keep every limit; returns where to read on from.
fn take_in<R: Read, S: Sink>(vm: &mut Vm<'_, R, S>, r: &Running<S>, overtake: u64) -> Option<u64> {
    if vm.stack.len() != r.stack || vm.stack.last() != Some(&Value::Node(r.list)) || vm.marks.len() != r.marks {
        return None;
    }
    let arrived = Instant::now();
    if r.later_is_slower(vm.input.offset(), overtake) {
        r.control.stop.store(true, Ordering::Relaxed);
    }
    let later = r.done.recv().ok()??;
    let waited = arrived.elapsed();
    let l = vm.limits;
    if !vm.memo.can_join(&later.memo, r.copied.0) {
        return None;
    }
    let ids = vm.heap.ids_for(&later.heap, r.mark, l)?;
    let Later { end, heap, memo, mut sink, fast_dicts, batch, stack, walked, read, stopped } = *later;
    let folded = vm.sink.join(&mut sink, &ids)?;
    // The later part's memo is mapped on another thread while its records are appended here;
    // without that thread (none could start), nothing has changed yet and the read goes on
    // in one part.
    let (others, others_copied) = (vm.memo.others_len(), r.copied.1);
    let map = |memo: Memo| memo.mapped(others, others_copied, &|v| ids.value(v, &*folded));
    let mapped = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Memo>();
        let thread = std::thread::Builder::new().spawn_scoped(scope, move || rx.recv().ok().map(map)).ok()?;
        tx.send(memo).ok()?;
        vm.sink.append(sink);
        vm.heap.join(heap, &ids, r.list, r.kept, &*folded);
        let mapped = thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        // The thread received the memo, so it mapped it.
        Some(mapped.expect("the later part's memo is mapped"))
    })?;
    vm.memo.join(mapped);
    if batch {
        vm.marks.push(vm.stack.len());
    }
    vm.stack.extend(stack.into_iter().map(|v| ids.value(v, &*folded)));
    vm.fast_dicts += fast_dicts;
    vm.later_part = Some(crate::reader::LaterPart {
        bytes: vm.input.offset()..end,
        forked_at: r.forked_at,
        walked,
        read,
        waited,
        took_in: arrived.elapsed() - waited,
        stopped,
    });
    r.jump.store(end, Ordering::Relaxed);
    Some(end)
}

impl<R: Read, S: Sink> Vm<'_, R, S> {
    /// After an APPENDS: the split read's plan, and a jump past the later part once taken in.
    pub(super) fn after_appends(&mut self) {
        let Some(mut parts) = self.parts.take() else { return };
        if let Some(end) = parts.after_appends(self) {
            self.input.reset(end);
        }
        self.parts = Some(parts);
    }

    /// In the later part, with no MARK open: whether its list goes on (a MARK opens the next
    /// batch; FRAME is the framing protocol 4 puts anywhere).
    pub(super) fn part_goes_on(&mut self) -> Result<bool, Failure<S::Error>> {
        if self.part_ends.as_ref().is_some_and(|control| control.stop_at(self.input.offset())) {
            return Ok(false);
        }
        let next = self.input.peek_filled().map_err(Failure::Read)?;
        Ok(matches!(next, Some(super::op::MARK | super::op::FRAME)))
    }
}
