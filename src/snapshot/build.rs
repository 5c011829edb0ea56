//! From reader values to the typed model.
//!
//! [`SnapshotSink`] listens to the reader and folds each trace-entry dict into an [`Event`] as
//! soon as it is complete (so the generic tree of three million dicts never exists), interning
//! its stack by the frames list's heap handle. [`build`] then walks what is left (segments,
//! blocks, settings) and checks every field's type, naming its path on error. Unknown keys are
//! ignored and optional fields get torch's defaults, since torch versions differ.

use std::collections::{BTreeMap, HashMap};

use foldhash::HashMapExt;

use crate::reader::{Heap, Kind, Parsed, Sink, StrId, Strings, Value};

use super::{
    Action, Annotation, Block, BlockState, Device, EMPTY_STACK, Event, Extra, Frame, ModelError, NO_TIME, Pool,
    PoolKind, Segment, Snapshot, StackId, Stacks,
};

/// Ids of the keys the sink looks for, interned before reading (so they are 0..KEY_COUNT).
const KEY_COUNT: usize = 13;

#[derive(Default)]
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
const STACK_TAG: u32 = 1 << 31;

pub struct SnapshotSink {
    keys: Keys,
    max_events: u64,
    events: Vec<Event>,
    extras: Vec<Extra>,
    stacks: Stacks,
    streams: Vec<i64>,
    stream_index: HashMap<i64, u16>,
    last_stream: Option<(i64, u16)>,
    action_by_str: HashMap<StrId, Action>,
    last_action: Option<(StrId, Action)>,
    /// Frame of each frame dict already seen, by heap handle: torch shares frame dicts.
    frame_by_node: foldhash::HashMap<u32, crate::snapshot::FrameId>,
    scratch: Vec<crate::snapshot::FrameId>,
    /// Stack of each sequence of frame-dict handles already seen.
    stack_by_nodes: foldhash::HashMap<Box<[u32]>, StackId>,
    node_scratch: Vec<u32>,
    unknown_actions: Vec<String>,
}

impl SnapshotSink {
    pub fn new(max_events: u64) -> Self {
        SnapshotSink {
            keys: Keys::default(),
            max_events: max_events.min(STACK_TAG as u64 - 1),
            events: Vec::new(),
            extras: Vec::new(),
            stacks: Stacks::default(),
            streams: Vec::new(),
            stream_index: HashMap::new(),
            last_stream: None,
            action_by_str: HashMap::new(),
            last_action: None,
            frame_by_node: foldhash::HashMap::new(),
            scratch: Vec::new(),
            stack_by_nodes: foldhash::HashMap::new(),
            node_scratch: Vec::new(),
            unknown_actions: Vec::new(),
        }
    }

    fn stream(&mut self, raw: i64, path: impl Fn() -> String) -> Result<u16, ModelError> {
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
    fn stack(&mut self, heap: &Heap, v: Value, path: &dyn Fn() -> String) -> Result<StackId, ModelError> {
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

    fn intern_frames(&mut self, heap: &Heap, items: &[Value], path: &dyn Fn() -> String) -> Result<StackId, ModelError> {
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

fn found(heap: &Heap, v: Value) -> String {
    match v {
        Value::Node(id) => heap.kind(id).name().to_string(),
        Value::Str(s) => format!("str {:?}", heap.strings.get(s).chars().take(40).collect::<String>()),
        Value::Int(n) => format!("int {n}"),
        other => other.type_name().to_string(),
    }
}

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
        let k = &self.keys;
        let mut fields = [None; KEY_COUNT];
        for kv in items.chunks_exact(2) {
            let (key, v) = (kv[0], kv[1]);
            if let Value::Str(key) = key {
                if let Some(slot) = fields.get_mut(key as usize) {
                    *slot = Some(v);
                }
            }
        }
        let field = |id: StrId| fields.get(id as usize).copied().flatten();
        let action = field(k.action);
        let addr = field(k.addr).or(field(k.device_free)).unwrap_or(Value::None);
        let size = field(k.size).unwrap_or(Value::None);
        let stream = field(k.stream).unwrap_or(Value::None);
        let time = field(k.time_us).unwrap_or(Value::None);
        let frames = field(k.frames).unwrap_or(Value::None);
        let (cc, um) = (field(k.compile_context), field(k.user_metadata));
        let Some(action) = action else { return Ok(None) };
        let n = self.events.len();
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
            time_us,
            stack: self.stack(heap, frames, &|| format!("trace entry {n}"))?,
            stream,
            action,
        };
        let text = |v: Option<Value>| match v {
            Some(Value::Str(s)) if s != self.keys.not_available && !heap.strings.get(s).is_empty() => Some(s),
            _ => None,
        };
        let (compile_context, user_metadata) = (text(cc), text(um));
        if compile_context.is_some() || user_metadata.is_some() {
            self.extras.push(Extra { event: n as u32, compile_context, user_metadata });
        }
        self.events.push(event);
        Ok(Some(n as u32))
    }

    /// Folds a list of frame dicts into a stack id, so the millions of per-event frames lists
    /// torch writes are not kept; a list of anything else is left alone.
    fn fold_list(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, ModelError> {
        let is_frames = match items.first() {
            Some(&Value::Node(first)) => {
                self.frame_by_node.contains_key(&first)
                    || heap.kind(first) == Kind::Dict && heap.get(first, self.keys.filename).is_some()
            }
            _ => false,
        };
        if !is_frames {
            return Ok(None);
        }
        let n = self.events.len();
        let stack = self.intern_stack(heap, items, &|| format!("frames list read after trace entry {n}"))?;
        Ok(Some(stack | STACK_TAG))
    }
}

/// Builds the model from a finished read and the sink that listened to it.
pub fn build(parsed: Parsed, mut sink: SnapshotSink) -> Result<Snapshot, ModelError> {
    let Parsed { root, mut heap, .. } = parsed;
    let key = |name: &str| heap.strings.find(name);
    let (segments, traces, settings, annotations, legacy) = match root {
        Value::Node(id) if heap.kind(id) == Kind::List => (Some(root), None, None, None, true),
        Value::Node(id) if heap.kind(id) == Kind::Dict => {
            let get = |name: &str| key(name).and_then(|k| heap.get(id, k));
            let Some(segments) = get("segments") else {
                let keys: Vec<String> = heap
                    .pairs(id)
                    .take(8)
                    .map(|(k, _)| match k {
                        Value::Str(s) => format!("{:?}", heap.strings.get(s).chars().take(40).collect::<String>()),
                        other => other.type_name().to_string(),
                    })
                    .collect();
                let found = format!("a dict with keys [{}]", keys.join(", "));
                return Err(ModelError::new("(top level)", "a CUDA memory snapshot (a dict with 'segments')", found));
            };
            (Some(segments), get("device_traces"), get("allocator_settings"), get("external_annotations"), false)
        }
        other => {
            return Err(ModelError::new(
                "(top level)",
                "a CUDA memory snapshot (a dict with 'segments', or a list of segments)",
                found(&heap, other),
            ));
        }
    };
    let mut w = Walker { heap: &heap, sink: &mut sink };
    let mut by_device: BTreeMap<i64, Vec<Segment>> = BTreeMap::new();
    for (i, seg) in w.list(segments.unwrap_or(Value::None), "segments")?.into_iter().enumerate() {
        let (device, segment) = w.segment(seg, i)?;
        by_device.entry(device).or_default().push(segment);
    }
    let traces = match traces {
        Some(t) => w.traces(t)?,
        None => Vec::new(),
    };
    let allocator_settings = match settings {
        Some(Value::None) | None => None,
        Some(v) => Some(to_json(&heap, v, &mut 100_000)),
    };
    let annotations = match annotations {
        Some(v) => w.annotations(v)?,
        None => Vec::new(),
    };
    let (mut devices, events, extras) = split_devices(by_device, traces, sink.events, sink.extras);
    let mut warnings = Vec::new();
    for d in &mut devices {
        warnings.extend(super::validate::repair(d).into_iter().map(|w| format!("device {}: {w}", d.device)));
    }
    let mut stacks = sink.stacks;
    stacks.strings = std::mem::take(&mut heap.strings);
    Ok(Snapshot {
        devices,
        events,
        extras,
        stacks,
        streams: sink.streams,
        unknown_actions: sink.unknown_actions,
        allocator_settings,
        annotations,
        legacy,
        warnings,
    })
}

/// Arranges events device after device (a move, in the usual case where they already are) and
/// pairs each device's segments with its trace.
fn split_devices(
    mut by_device: BTreeMap<i64, Vec<Segment>>,
    traces: Vec<Vec<u32>>,
    events: Vec<Event>,
    extras: Vec<Extra>,
) -> (Vec<Device>, Vec<Event>, Vec<Extra>) {
    let in_order = traces.iter().flatten().enumerate().all(|(i, &e)| i as u32 == e)
        && traces.iter().map(|t| t.len()).sum::<usize>() == events.len();
    let (events, extras) = if in_order {
        (events, extras)
    } else {
        let mut new_index = HashMap::new();
        let mut out = Vec::with_capacity(traces.iter().map(|t| t.len()).sum());
        for &e in traces.iter().flatten() {
            new_index.entry(e).or_insert(out.len() as u32);
            out.push(events[e as usize]);
        }
        let extras = extras
            .into_iter()
            .filter_map(|x| Some(Extra { event: *new_index.get(&x.event)?, ..x }))
            .collect();
        (out, extras)
    };
    let mut devices = Vec::new();
    let mut start = 0;
    for (d, trace) in traces.iter().enumerate() {
        let segments = by_device.remove(&(d as i64)).unwrap_or_default();
        let range = start..start + trace.len();
        start = range.end;
        if !segments.is_empty() || !trace.is_empty() {
            devices.push(Device { device: d as i64, segments, events: range });
        }
    }
    for (device, segments) in by_device {
        devices.push(Device { device, segments, events: 0..0 });
    }
    devices.sort_by_key(|d| d.device);
    for d in &mut devices {
        d.segments.sort_by_key(|s| s.address);
    }
    (devices, events, extras)
}

struct Walker<'a> {
    heap: &'a Heap,
    sink: &'a mut SnapshotSink,
}

impl Walker<'_> {
    fn list(&self, v: Value, path: &str) -> Result<Vec<Value>, ModelError> {
        match v {
            Value::Node(id) if matches!(self.heap.kind(id), Kind::List | Kind::Tuple) => Ok(self.heap.items(id).collect()),
            Value::None => Ok(Vec::new()),
            other => Err(ModelError::new(path, "a list", found(self.heap, other))),
        }
    }

    fn dict(&self, v: Value, path: &dyn Fn() -> String) -> Result<u32, ModelError> {
        match v {
            Value::Node(id) if self.heap.kind(id) == Kind::Dict => Ok(id),
            other => Err(ModelError::new(path(), "a dict", found(self.heap, other))),
        }
    }

    fn field(&self, dict: u32, name: &str) -> Value {
        self.heap.strings.find(name).and_then(|k| self.heap.get(dict, k)).unwrap_or(Value::None)
    }

    fn int(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<i64>, ModelError> {
        match self.field(dict, name) {
            Value::Int(n) => Ok(Some(n)),
            Value::Bool(b) => Ok(Some(b as i64)),
            Value::None => Ok(None),
            other => Err(ModelError::new(format!("{}.{name}", path()), "int", found(self.heap, other))),
        }
    }

    fn size(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<u64>, ModelError> {
        match self.int(dict, name, path)? {
            Some(n) if n < 0 => Err(ModelError::new(format!("{}.{name}", path()), "a non-negative int", n.to_string())),
            n => Ok(n.map(|n| n as u64)),
        }
    }

    fn text(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<&str>, ModelError> {
        match self.field(dict, name) {
            Value::Str(s) => Ok(Some(self.heap.strings.get(s))),
            Value::None => Ok(None),
            other => Err(ModelError::new(format!("{}.{name}", path()), "str", found(self.heap, other))),
        }
    }

    fn required<T>(&self, v: Option<T>, name: &str, path: &dyn Fn() -> String) -> Result<T, ModelError> {
        v.ok_or_else(|| ModelError::new(format!("{}.{name}", path()), "a value", "none (missing)"))
    }

    fn segment(&mut self, v: Value, i: usize) -> Result<(i64, Segment), ModelError> {
        let path = || format!("segments[{i}]");
        let d = self.dict(v, &path)?;
        let address = self.size(d, "address", &path)?;
        let address = self.required(address, "address", &path)?;
        let total_size = self.size(d, "total_size", &path)?;
        let total_size = self.required(total_size, "total_size", &path)?;
        let device = self.int(d, "device", &path)?.unwrap_or(0);
        let stream = self.int(d, "stream", &path)?.unwrap_or(0);
        let stream = self.sink.stream(stream, || format!("{}.stream", path()))?;
        let kind = match self.text(d, "segment_type", &path)? {
            Some("small") => PoolKind::Small,
            Some("large") => PoolKind::Large,
            None if total_size <= 2 << 20 => PoolKind::Small,
            None => PoolKind::Large,
            Some(other) => {
                return Err(ModelError::new(format!("{}.segment_type", path()), "'small' or 'large'", format!("{other:?}")));
            }
        };
        let id = match self.field(d, "segment_pool_id") {
            Value::None => (0, 0),
            Value::Node(t) => match self.heap.items(t).collect::<Vec<_>>()[..] {
                [Value::Int(a), Value::Int(b)] => (a, b),
                _ => return Err(ModelError::new(format!("{}.segment_pool_id", path()), "a pair of ints", "something else")),
            },
            other => return Err(ModelError::new(format!("{}.segment_pool_id", path()), "a pair of ints", found(self.heap, other))),
        };
        let is_expandable = matches!(self.field(d, "is_expandable"), Value::Bool(true));
        let stack = self.sink.stack(self.heap, self.field(d, "frames"), &path)?;
        let mut blocks = Vec::new();
        let mut next = address;
        let block_values = self.list(self.field(d, "blocks"), &format!("{}.blocks", path()))?;
        for (j, b) in block_values.into_iter().enumerate() {
            let block = self.block(b, &|| format!("segments[{i}].blocks[{j}]"), next)?;
            next = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        Ok((device, Segment { address, total_size, stream, pool: Pool { kind, id }, is_expandable, stack, blocks }))
    }

    fn block(&mut self, v: Value, path: &dyn Fn() -> String, next: u64) -> Result<Block, ModelError> {
        let d = self.dict(v, path)?;
        let size = self.size(d, "size", path)?;
        let size = self.required(size, "size", path)?;
        let state = match self.text(d, "state", path)? {
            Some("active_allocated") => BlockState::ActiveAllocated,
            Some("active_pending_free") => BlockState::ActivePendingFree,
            Some("inactive") => BlockState::Inactive,
            other => {
                let found = other.map(|s| format!("{s:?}")).unwrap_or_else(|| "none".into());
                return Err(ModelError::new(
                    format!("{}.state", path()),
                    "'active_allocated', 'active_pending_free' or 'inactive'",
                    found,
                ));
            }
        };
        Ok(Block {
            address: self.size(d, "address", path)?.unwrap_or(next),
            size,
            requested_size: self.size(d, "requested_size", path)?.unwrap_or(size),
            state,
            stack: self.sink.stack(self.heap, self.field(d, "frames"), path)?,
        })
    }

    /// Each device's trace as indexes of folded events.
    fn traces(&self, v: Value) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut out = Vec::new();
        for (d, trace) in self.list(v, "device_traces")?.into_iter().enumerate() {
            let path = format!("device_traces[{d}]");
            if let Value::Node(id) = trace {
                if let (Kind::List, Some(run)) = (self.heap.kind(id), self.heap.folded_run(id).filter(|r| r.end <= STACK_TAG)) {
                    out.push(run.collect());
                    continue;
                }
            }
            let mut events = Vec::new();
            for (j, e) in self.list(trace, &path)?.into_iter().enumerate() {
                match e {
                    Value::Folded(f) if f & STACK_TAG == 0 => events.push(f),
                    other => {
                        let expected = "a trace entry (a dict with 'action')";
                        return Err(ModelError::new(format!("{path}[{j}]"), expected, found(self.heap, other)));
                    }
                }
            }
            out.push(events);
        }
        Ok(out)
    }

    fn annotations(&self, v: Value) -> Result<Vec<Annotation>, ModelError> {
        let mut out = Vec::new();
        for (i, a) in self.list(v, "external_annotations")?.into_iter().enumerate() {
            let path = || format!("external_annotations[{i}]");
            let d = self.dict(a, &path)?;
            out.push(Annotation {
                name: self.text(d, "name", &path)?.unwrap_or("").chars().take(1000).collect(),
                stage: self.text(d, "stage", &path)?.unwrap_or("").chars().take(16).collect(),
                device: self.int(d, "device", &path)?.unwrap_or(0),
                time_us: self.int(d, "time_us", &path)?.unwrap_or(NO_TIME),
            });
        }
        Ok(out)
    }
}

/// A generic value as JSON, for `allocator_settings`; stops after `budget` values.
fn to_json(heap: &Heap, v: Value, budget: &mut u32) -> serde_json::Value {
    use serde_json::Value as J;
    if *budget == 0 {
        return J::Null;
    }
    *budget -= 1;
    match v {
        Value::None | Value::Folded(_) => J::Null,
        Value::Bool(b) => J::Bool(b),
        Value::Int(n) => J::from(n),
        Value::UInt(n) => J::from(n),
        Value::Float(f) => serde_json::Number::from_f64(f).map(J::Number).unwrap_or(J::Null),
        Value::Str(s) | Value::Bytes(s) => J::String(heap.strings.get(s).to_string()),
        Value::Node(id) if heap.kind(id) == Kind::Dict => J::Object(
            heap.pairs(id)
                .map(|(k, v)| {
                    let key = match k {
                        Value::Str(s) => heap.strings.get(s).to_string(),
                        Value::Int(n) => n.to_string(),
                        Value::UInt(n) => n.to_string(),
                        other => other.type_name().to_string(),
                    };
                    (key, to_json(heap, v, budget))
                })
                .collect(),
        ),
        Value::Node(id) => J::Array(heap.items(id).map(|v| to_json(heap, v, budget)).collect()),
    }
}
