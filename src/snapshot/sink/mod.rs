//! The sink that listens to the reader: it folds each trace-entry dict into an [`Event`] and
//! each frames list into an interned stack as soon as they are complete, so the generic tree of
//! millions of dicts never exists. What it keeps, `build` then assembles into the model.

use foldhash::HashMapExt;

use crate::reader::{Fields, FoldedIds, Heap, Ids, Kind, MAX_FIELDS, Sink, StrId, Strings, Value};

use super::{Action, EMPTY_STACK, Event, Extra, Frame, ModelError, NO_TIME, StackId, Stacks};

/// Ids of the keys the sink looks for, interned before reading (so they are 0..KEY_COUNT).
const KEY_COUNT: usize = 13;
/// The first of them, up to `device_free`, are a trace entry's.
const ENTRY_KEYS: usize = 9;
const _: () = assert!(ENTRY_KEYS <= MAX_FIELDS, "each entry key needs its own field");
/// Action strings with ids below this are looked up in a table.
const ACTION_TABLE: usize = 1 << 16;

#[derive(Default, Clone, Copy)]
struct Keys {
    filename: StrId,
    line: StrId,
    name: StrId,
    not_available: StrId,
}

/// The keys, interned in this order before anything else: a trace entry's are the first
/// `ENTRY_KEYS`, so that `fold_dict` finds each by its id.
const KEY_NAMES: [&str; KEY_COUNT] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "compile_context",
    "user_metadata",
    "device_free",
    "filename",
    "line",
    "name",
    "N/A",
];

/// Folded ids with this bit set are stacks; without it, events.
pub(super) const STACK_TAG: u32 = 1 << 31;

/// Builds the model while the reader streams the trace, so entries never become values.
pub struct SnapshotSink {
    keys: Keys,
    max_events: u64,
    /// The memory budget, where it (not the count limit) bounds the events.
    events_budget: Option<super::Budget>,
    pub(super) events: Vec<Event>,
    pub(super) times: super::Times,
    pub(super) extras: Vec<Extra>,
    pub(super) stacks: Stacks,
    pub(super) streams: Vec<i64>,
    stream_index: foldhash::HashMap<i64, u16>,
    last_stream: Option<(i64, u16)>,
    /// The action of each action string, looked up once per event: by id in a table (code
    /// plus one; 0 for a string not seen as an action) for the first ids, where torch's few
    /// action names are; in a map beyond.
    actions: Vec<u8>,
    far_actions: foldhash::HashMap<StrId, Action>,
    /// Frame of each frame dict already seen, by heap handle: torch shares frame dicts.
    frame_by_node: foldhash::HashMap<u32, crate::snapshot::FrameId>,
    scratch: Vec<crate::snapshot::FrameId>,
    /// Stack of each sequence of frame-dict handles already seen.
    stack_by_nodes: foldhash::HashMap<nodes::Nodes, StackId>,
    node_scratch: Vec<u32>,
    /// Frames lists folded lately (their frame-dict handles) and their stacks, by
    /// `recent_slot`: a list of the same frames is folded again with no hashing.
    recent_frames: [(Vec<u32>, StackId); RECENT],
    pub(super) unknown_actions: Vec<String>,
    /// A sink forked for the later part of a split read (`join.rs`): what it started from.
    /// Its events go in chunks, so that taking them in never holds two copies.
    forked: Option<join::Forked>,
    /// Faults the event column's next pages in on another thread.
    ahead: ahead::Ahead,
}

mod actions;
mod ahead;
mod join;
mod nodes;

impl SnapshotSink {
    /// A sink that also refuses more events than `budget` holds.
    pub fn within(mut self, budget: Option<super::Budget>) -> Self {
        if let Some(b) = budget
            && b.max_events() < self.max_events
        {
            self.max_events = b.max_events();
            self.events_budget = Some(b);
        }
        self
    }

    /// A sink that refuses more than `max_events` events.
    pub fn new(max_events: u64) -> Self {
        SnapshotSink {
            keys: Keys::default(),
            max_events: max_events.min(STACK_TAG as u64 - 1),
            events_budget: None,
            events: Vec::new(),
            times: super::Times::default(),
            extras: Vec::new(),
            stacks: Stacks::default(),
            streams: Vec::new(),
            stream_index: foldhash::HashMap::new(),
            last_stream: None,
            actions: Vec::new(),
            far_actions: foldhash::HashMap::new(),
            frame_by_node: foldhash::HashMap::new(),
            scratch: Vec::new(),
            stack_by_nodes: foldhash::HashMap::new(),
            node_scratch: Vec::new(),
            recent_frames: Default::default(),
            unknown_actions: Vec::new(),
            forked: None,
            ahead: ahead::Ahead::default(),
        }
    }

    /// Events folded so far (the id the next one gets).
    #[inline(always)]
    fn event_count(&self) -> usize {
        self.events.len() + self.forked.as_ref().map_or(0, |f| f.chunked)
    }

    pub(super) fn stream(&mut self, raw: i64, path: impl Fn() -> String) -> Result<u16, ModelError> {
        match self.last_stream {
            Some((last, i)) if last == raw => return Ok(i),
            _ => {}
        }
        if let Some(&i) = self.stream_index.get(&raw) {
            self.last_stream = Some((raw, i));
            return Ok(i);
        }
        if self.streams.len() >= u16::MAX as usize {
            return Err(ModelError::new(path(), "at most 65535 distinct streams", "more"));
        }
        let i = self.streams.len() as u16;
        self.streams.push(raw);
        self.stream_index.insert(raw, i);
        Ok(i)
    }

    /// The stack a `frames` value stands for. Non-empty frames lists were folded into stack
    /// ids as they were read (see `fold_list`); what is left is empty or malformed.
    pub(super) fn stack(&mut self, heap: &Heap, v: Value, path: &dyn Fn() -> String) -> Result<StackId, ModelError> {
        let list = match v {
            Value::None => return Ok(EMPTY_STACK),
            Value::Folded(f) if f & STACK_TAG != 0 => return Ok(f & !STACK_TAG),
            Value::Node(id) if matches!(heap.kind(id), Kind::List | Kind::Tuple) => id,
            other => return Err(ModelError::new(format!("{}.frames", path()), "a list of frames", found(heap, other))),
        };
        let items: Vec<Value> = heap.items(list).collect();
        self.intern_stack(heap, &items, path)
    }

    fn intern_stack(&mut self, heap: &Heap, items: &[Value], path: &dyn Fn() -> String) -> Result<StackId, ModelError> {
        // torch shares frame dicts but writes a fresh list for most events: look the list up by
        // its frame dicts' handles first, one hash instead of one per frame.
        let mut nodes = std::mem::take(&mut self.node_scratch);
        nodes.clear();
        nodes.extend(items.iter().map(|v| match v {
            Value::Node(id) => *id,
            _ => u32::MAX,
        }));
        if let Some(&stack) = self.stack_by_nodes.get(nodes.as_slice()) {
            self.node_scratch = nodes;
            return Ok(stack);
        }
        let stack = self.intern_frames(heap, items, path)?;
        if !nodes.contains(&u32::MAX) {
            self.stack_by_nodes.insert(nodes.as_slice().into(), stack);
        }
        self.node_scratch = nodes;
        Ok(stack)
    }

    fn intern_frames(
        &mut self,
        heap: &Heap,
        items: &[Value],
        path: &dyn Fn() -> String,
    ) -> Result<StackId, ModelError> {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for (i, &item) in items.iter().enumerate() {
            let Value::Node(frame) = item else {
                return Err(ModelError::new(format!("{}.frames[{i}]", path()), "a frame dict", found(heap, item)));
            };
            if let Some(&id) = self.frame_by_node.get(&frame) {
                ids.push(id);
                continue;
            }
            let mut f = Frame { filename: self.keys.not_available, line: 0, name: self.keys.not_available };
            for (k, v) in heap.pairs(frame) {
                match (k, v) {
                    (Value::Str(k), Value::Str(s)) if k == self.keys.filename => f.filename = s,
                    (Value::Str(k), Value::Str(s)) if k == self.keys.name => f.name = s,
                    (Value::Str(k), Value::Int(n)) if k == self.keys.line => f.line = n,
                    // size_t(-1): torch's "no line".
                    (Value::Str(k), Value::UInt(_)) if k == self.keys.line => f.line = -1,
                    _ => {}
                }
            }
            let id = self.stacks.frame_id(f);
            self.frame_by_node.insert(frame, id);
            ids.push(id);
        }
        let stack = self.stacks.stack_id(&ids);
        self.scratch = ids;
        Ok(stack)
    }
}

/// Frames lists remembered by `fold_list`.
const RECENT: usize = 16;

/// Where `fold_list` remembers a frames list: by its first two frames.
#[inline(always)]
fn recent_slot(items: &[Value]) -> usize {
    let handle = |i: usize| match items.get(i) {
        Some(Value::Node(n)) => *n as usize,
        _ => 0,
    };
    (handle(0) ^ handle(1).rotate_left(3)) % RECENT
}

pub(super) fn found(heap: &Heap, v: Value) -> String {
    match v {
        Value::Node(id) => heap.kind(id).name().to_string(),
        Value::Str(s) => format!("str {:?}", heap.strings.get(s).chars().take(40).collect::<String>()),
        Value::Int(n) => format!("int {n}"),
        Value::Folded(f) if f & STACK_TAG != 0 => "a frames list".to_string(),
        Value::Folded(_) => "a trace entry".to_string(),
        other => other.type_name().to_string(),
    }
}

/// Inlined into `fold_dict` (it was a call per event); the error is built out of line.
#[inline(always)]
fn uint(heap: &Heap, v: Value, path: impl Fn() -> String) -> Result<u64, ModelError> {
    match v {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        Value::UInt(n) => Ok(n),
        Value::None => Ok(0),
        other => Err(not_uint(heap, other, path())),
    }
}

#[cold]
#[inline(never)]
fn not_uint(heap: &Heap, v: Value, path: String) -> ModelError {
    ModelError::new(path, "a non-negative int", found(heap, v))
}

impl Sink for SnapshotSink {
    type Error = ModelError;

    fn prepare(&mut self, strings: &mut Strings) {
        let ids: Vec<StrId> = KEY_NAMES.iter().map(|k| strings.intern(k, u64::MAX).unwrap_or(0)).collect();
        debug_assert!(ids.iter().enumerate().all(|(i, &id)| id == i as StrId), "keys must be interned first");
        self.keys = Keys { filename: ids[9], line: ids[10], name: ids[11], not_available: ids[12] };
    }

    /// Folds a dict that has an `action` key into an [`Event`]; leaves every other dict alone.
    fn fold_dict(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, ModelError> {
        let mut fields: Fields = [None; MAX_FIELDS];
        for kv in items.chunks_exact(2) {
            if let Some(slot) = self.field(kv[0]).and_then(|f| fields.get_mut(f)) {
                *slot = Some(kv[1]);
            }
        }
        self.fold_fields(heap, &fields)
    }

    /// `prepare` interned the keys first, in `Keys` order: an entry's keys are the ids below
    /// ENTRY_KEYS, each its own field.
    #[inline(always)]
    fn field(&self, key: Value) -> Option<usize> {
        match key {
            Value::Str(key) if (key as usize) < ENTRY_KEYS => Some(key as usize),
            _ => None,
        }
    }

    fn takes_fields(&self) -> bool {
        true
    }

    #[inline(always)]
    fn fold_fields(&mut self, heap: &Heap, fields: &Fields) -> Result<Option<u32>, ModelError> {
        let [action, addr, size, stream, time, frames, cc, um, device_free, ..] = *fields;
        let addr = addr.or(device_free).unwrap_or(Value::None);
        let (size, stream) = (size.unwrap_or(Value::None), stream.unwrap_or(Value::None));
        let (time, frames) = (time.unwrap_or(Value::None), frames.unwrap_or(Value::None));
        let Some(action) = action else { return Ok(None) };
        let n = self.event_count();
        if n as u64 >= self.max_events {
            let why = match self.events_budget {
                Some(b) => format!(
                    " (what the memory budget of {} MiB holds, at {} bytes an event)",
                    b.bytes >> 20,
                    b.per_event
                ),
                None => String::new(),
            };
            return Err(ModelError::new("device_traces", format!("at most {} events{why}", self.max_events), "more"));
        }
        let path = |field: &str| format!("trace entry {n} (counting all devices).{field}");
        let Value::Str(action) = action else {
            return Err(ModelError::new(path("action"), "str", found(heap, action)));
        };
        let action = self.action(action, &heap.strings, || path("action"))?;
        let time_us = match time {
            Value::Int(t) => t,
            Value::Float(t) if t.is_finite() => t as i64,
            Value::None => NO_TIME,
            other => return Err(ModelError::new(path("time_us"), "int", found(heap, other))),
        };
        let stream = match stream {
            Value::Int(s) => self.stream(s, || path("stream"))?,
            Value::None => self.stream(0, || path("stream"))?,
            other => return Err(ModelError::new(path("stream"), "int", found(heap, other))),
        };
        let event = Event {
            addr: uint(heap, addr, || path("addr"))?,
            size: uint(heap, size, || path("size"))?,
            stack: match frames {
                // The common case, a frames list folded as it was read: no call.
                Value::Folded(f) if f & STACK_TAG != 0 => f & !STACK_TAG,
                other => self.stack(heap, other, &|| format!("trace entry {n}"))?,
            },
            stream,
            action,
        };
        let text = |v: Option<Value>| match v {
            Some(Value::Str(s)) if s != self.keys.not_available && !heap.strings.is_empty_at(s) => Some(s),
            _ => None,
        };
        let (compile_context, user_metadata) = (text(cc), text(um));
        if compile_context.is_some() || user_metadata.is_some() {
            self.extras.push(Extra { event: n as u32, compile_context, user_metadata });
        }
        self.times.push((time_us != NO_TIME).then_some(time_us));
        self.push_event(event);
        Ok(Some(n as u32))
    }

    fn fork(&self) -> Option<Self> {
        Some(self.forked_copy())
    }

    fn join(&mut self, later: &mut Self, ids: &Ids) -> Option<Box<dyn FoldedIds + Send + Sync>> {
        self.take_in(later, ids)
    }

    fn append(&mut self, later: Self) {
        self.append_later(later);
    }

    /// Folds a list of frame dicts into a stack id, so the millions of per-event frames lists
    /// torch writes are not kept; a list of anything else is left alone.
    fn fold_list(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, ModelError> {
        // torch writes a fresh list for most events, of the frames of a few recent ones.
        let slot = recent_slot(items);
        let (last, stack) = &self.recent_frames[slot];
        if last.len() == items.len() && items.iter().zip(last).all(|(v, &n)| *v == Value::Node(n)) {
            return Ok(Some(stack | STACK_TAG));
        }
        let is_frames = match items.first() {
            // The heap check first: a scan of a few pairs, cheaper than the hash lookup that
            // catches a frame dict without a filename already seen in another stack.
            Some(&Value::Node(first)) => {
                heap.kind(first) == Kind::Dict && heap.get(first, self.keys.filename).is_some()
                    || self.frame_by_node.contains_key(&first)
            }
            _ => false,
        };
        if !is_frames {
            return Ok(None);
        }
        let n = self.event_count();
        let stack = self.intern_stack(heap, items, &|| format!("frames list read after trace entry {n}"))?;
        if items.iter().all(|v| matches!(v, Value::Node(_))) {
            let nodes = items.iter().map(|v| if let Value::Node(n) = v { *n } else { 0 });
            let recent = &mut self.recent_frames[slot];
            recent.0.clear();
            recent.0.extend(nodes);
            recent.1 = stack;
        }
        Ok(Some(stack | STACK_TAG))
    }
}
