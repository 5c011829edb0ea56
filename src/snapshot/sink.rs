//! The sink that listens to the reader: it folds each trace-entry dict into an [`Event`] and
//! each frames list into an interned stack as soon as they are complete, so the generic tree of
//! millions of dicts never exists. What it keeps, `build` then assembles into the model.

use foldhash::HashMapExt;

use crate::reader::{FoldedIds, Heap, Ids, Kind, Sink, StrId, Strings, Value};

use super::{Action, EMPTY_STACK, Event, Extra, Frame, ModelError, NO_TIME, StackId, Stacks};

/// Ids of the keys the sink looks for, interned before reading (so they are 0..KEY_COUNT).
const KEY_COUNT: usize = 13;

#[derive(Default, Clone, Copy)]
struct Keys {
    action: StrId,
    addr: StrId,
    size: StrId,
    stream: StrId,
    time_us: StrId,
    frames: StrId,
    compile_context: StrId,
    user_metadata: StrId,
    device_free: StrId,
    filename: StrId,
    line: StrId,
    name: StrId,
    not_available: StrId,
}

/// Folded ids with this bit set are stacks; without it, events.
pub(super) const STACK_TAG: u32 = 1 << 31;

/// Builds the model while the reader streams the trace, so entries never become values.
pub struct SnapshotSink {
    keys: Keys,
    max_events: u64,
    pub(super) events: Vec<Event>,
    pub(super) times: super::Times,
    pub(super) extras: Vec<Extra>,
    pub(super) stacks: Stacks,
    pub(super) streams: Vec<i64>,
    stream_index: foldhash::HashMap<i64, u16>,
    last_stream: Option<(i64, u16)>,
    /// Looked up once per event (the one-entry cache misses as actions alternate), so with
    /// foldhash rather than std's SipHash.
    action_by_str: foldhash::HashMap<StrId, Action>,
    last_action: Option<(StrId, Action)>,
    /// Frame of each frame dict already seen, by heap handle: torch shares frame dicts.
    frame_by_node: foldhash::HashMap<u32, crate::snapshot::FrameId>,
    scratch: Vec<crate::snapshot::FrameId>,
    /// Stack of each sequence of frame-dict handles already seen.
    stack_by_nodes: foldhash::HashMap<Box<[u32]>, StackId>,
    node_scratch: Vec<u32>,
    pub(super) unknown_actions: Vec<String>,
    /// A sink forked for the later part of a split read (`join.rs`): what it started from.
    /// Its events go in chunks, so that taking them in never holds two copies.
    forked: Option<join::Forked>,
}

mod join;

impl SnapshotSink {
    /// A sink that refuses more than `max_events` events.
    pub fn new(max_events: u64) -> Self {
        SnapshotSink {
            keys: Keys::default(),
            max_events: max_events.min(STACK_TAG as u64 - 1),
            events: Vec::new(),
            times: super::Times::default(),
            extras: Vec::new(),
            stacks: Stacks::default(),
            streams: Vec::new(),
            stream_index: foldhash::HashMap::new(),
            last_stream: None,
            action_by_str: foldhash::HashMap::new(),
            last_action: None,
            frame_by_node: foldhash::HashMap::new(),
            scratch: Vec::new(),
            stack_by_nodes: foldhash::HashMap::new(),
            node_scratch: Vec::new(),
            unknown_actions: Vec::new(),
            forked: None,
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

    fn action(&mut self, s: StrId, strings: &Strings, path: impl Fn() -> String) -> Result<Action, ModelError> {
        match self.last_action {
            Some((last, a)) if last == s => return Ok(a),
            _ => {}
        }
        if let Some(&a) = self.action_by_str.get(&s) {
            self.last_action = Some((s, a));
            return Ok(a);
        }
        let name = strings.get(s);
        let action = match Action::known(name) {
            Some(a) => a,
            None => {
                let code = Action::FIRST_UNKNOWN as usize + self.unknown_actions.len();
                if code > u8::MAX as usize {
                    return Err(ModelError::new(path(), "at most 246 distinct unknown actions", "more"));
                }
                self.unknown_actions.push(name.chars().take(64).collect());
                Action(code as u8)
            }
        };
        self.action_by_str.insert(s, action);
        Ok(action)
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

#[inline]
fn uint(heap: &Heap, v: Value, path: impl Fn() -> String) -> Result<u64, ModelError> {
    match v {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        Value::UInt(n) => Ok(n),
        Value::None => Ok(0),
        other => Err(ModelError::new(path(), "a non-negative int", found(heap, other))),
    }
}

impl Sink for SnapshotSink {
    type Error = ModelError;

    fn prepare(&mut self, strings: &mut Strings) {
        let mut k = |s: &str| strings.intern(s, u64::MAX).unwrap_or(0);
        self.keys = Keys {
            action: k("action"),
            addr: k("addr"),
            size: k("size"),
            stream: k("stream"),
            time_us: k("time_us"),
            frames: k("frames"),
            compile_context: k("compile_context"),
            user_metadata: k("user_metadata"),
            device_free: k("device_free"),
            filename: k("filename"),
            line: k("line"),
            name: k("name"),
            not_available: k("N/A"),
        };
        debug_assert_eq!(strings.len(), KEY_COUNT, "keys must be interned first, as 0..KEY_COUNT");
    }

    /// Folds a dict that has an `action` key into an [`Event`]; leaves every other dict alone.
    fn fold_dict(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, ModelError> {
        // `prepare` interned the keys first, so their ids are small and index `fields` directly.
        // Each field as the index of its pair (the last pair wins, as in a dict): 4 bytes a
        // key to clear per entry rather than a whole value.
        let k = &self.keys;
        let mut fields = [u32::MAX; KEY_COUNT];
        for (i, kv) in items.chunks_exact(2).enumerate() {
            if let Value::Str(key) = kv[0]
                && let Some(slot) = fields.get_mut(key as usize)
            {
                *slot = i as u32;
            }
        }
        let field = |id: StrId| fields.get(id as usize).and_then(|&i| items.get(2 * i as usize + 1)).copied();
        let action = field(k.action);
        let addr = field(k.addr).or(field(k.device_free)).unwrap_or(Value::None);
        let size = field(k.size).unwrap_or(Value::None);
        let stream = field(k.stream).unwrap_or(Value::None);
        let time = field(k.time_us).unwrap_or(Value::None);
        let frames = field(k.frames).unwrap_or(Value::None);
        let (cc, um) = (field(k.compile_context), field(k.user_metadata));
        let Some(action) = action else { return Ok(None) };
        let n = self.event_count();
        if n as u64 >= self.max_events {
            return Err(ModelError::new("device_traces", format!("at most {} events", self.max_events), "more"));
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

    fn join(&mut self, later: Self, ids: &Ids) -> Option<Box<dyn FoldedIds>> {
        self.take_in(later, ids)
    }

    /// Folds a list of frame dicts into a stack id, so the millions of per-event frames lists
    /// torch writes are not kept; a list of anything else is left alone.
    fn fold_list(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, ModelError> {
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
        Ok(Some(stack | STACK_TAG))
    }
}
