//! From reader values to the typed model: [`build`] walks what the sink (`sink.rs`) left in
//! the heap (segments, blocks, settings) and checks every field's type, naming its path on
//! error. Unknown keys are ignored and optional fields get torch's defaults, since torch
//! versions differ.

use std::collections::{BTreeMap, HashMap};

use crate::reader::{Heap, Kind, Parsed, Value};

use super::expansion::{Besides, Budget, Charged, MAX_DEVICES, MAX_SEGMENTS, MIN_BLOCK, repeated, take, take_run};
use super::sink::{STACK_TAG, SnapshotSink, found};

use super::{
    Annotation, Block, BlockState, Device, Event, Extra, ModelError, NO_TIME, Pool, PoolKind, Recorded, Segment,
    Snapshot,
};

/// Builds the model from a finished read and the sink that listened to it.
pub fn build(parsed: Parsed, sink: SnapshotSink) -> Result<Snapshot, ModelError> {
    build_within(parsed, sink, None)
}

/// [`build`], charging each segment's blocks to `budget` (beside what the read holds and the
/// events) before they are made, and refusing past it.
pub fn build_within(parsed: Parsed, mut sink: SnapshotSink, budget: Option<Budget>) -> Result<Snapshot, ModelError> {
    let Parsed { root, mut heap, .. } = parsed;
    let key = |name: &str| heap.strings.find(name);
    let (segments, traces, settings, annotations, context, legacy) = match root {
        Value::Node(id) if heap.kind(id) == Kind::List => (Some(root), None, None, None, None, true),
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
            (
                Some(segments),
                get("device_traces"),
                get("allocator_settings"),
                get("external_annotations"),
                get("fragscope_context"),
                false,
            )
        }
        other => {
            return Err(ModelError::new(
                "(top level)",
                "a CUDA memory snapshot (a dict with 'segments', or a list of segments)",
                found(&heap, other),
            ));
        }
    };
    let read = heap.approx_bytes(0);
    let charge = budget.map(|b| (b, read, Charged::default()));
    let mut w = Walker { heap: &heap, sink: &mut sink, seen: Default::default(), segments: 0, charge };
    let mut by_device: BTreeMap<i64, Vec<Segment>> = BTreeMap::new();
    for (i, seg) in w.list(segments.unwrap_or(Value::None), "segments")?.into_iter().enumerate() {
        let (device, segment) = w.segment(seg, i)?;
        by_device.entry(device).or_default().push(segment);
        if by_device.len() > MAX_DEVICES {
            return Err(too_many_devices(format!("segments[{i}].device"), by_device.len()));
        }
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
    let recorded = match context {
        Some(v) => recorded(&to_json(&heap, v, &mut 1_000)),
        None => Vec::new(),
    };
    let (mut devices, events, times, extras) = split_devices(by_device, traces, sink.events, sink.times, sink.extras);
    let mut warnings = Vec::new();
    for d in &mut devices {
        warnings.extend(super::validate::repair(d).into_iter().map(|w| format!("device {}: {w}", d.device)));
    }
    let mut stacks = sink.stacks;
    stacks.strings = std::mem::take(&mut heap.strings);
    Ok(Snapshot {
        devices,
        events,
        times,
        extras,
        stacks,
        streams: sink.streams,
        unknown_actions: sink.unknown_actions,
        allocator_settings,
        annotations,
        recorded,
        legacy,
        warnings,
    })
}

fn too_many_devices(path: String, devices: usize) -> ModelError {
    ModelError::new(
        path,
        format!("at most {MAX_DEVICES} devices (one process sees a node's GPUs)"),
        format!("{devices} devices so far"),
    )
}

/// `fragscope_context`, the key our capture client adds beside torch's: per device, its total
/// memory and the per-process budget. Malformed entries are skipped, not errors: the context
/// only sharpens the diagnosis, and a snapshot without it is still whole.
fn recorded(v: &serde_json::Value) -> Vec<Recorded> {
    let Some(devices) = v.get("devices").and_then(|d| d.as_array()) else { return Vec::new() };
    devices
        .iter()
        .take(64)
        .filter_map(|d| {
            let field = |k: &str| d.get(k).and_then(|x| x.as_u64()).filter(|&n| n > 0);
            Some(Recorded {
                device: d.get("device")?.as_i64()?,
                total_bytes: field("total_bytes"),
                budget_bytes: field("budget_bytes"),
            })
        })
        .collect()
}

/// Arranges events device after device (a move, in the usual case where they already are) and
/// pairs each device's segments with its trace.
fn split_devices(
    mut by_device: BTreeMap<i64, Vec<Segment>>,
    traces: Vec<Trace>,
    events: Vec<Event>,
    times: super::Times,
    extras: Vec<Extra>,
) -> (Vec<Device>, Vec<Event>, super::Times, Vec<Extra>) {
    let (events, times, extras) = if in_order(&traces, events.len()) {
        (events, times, extras)
    } else {
        let mut new_index = HashMap::new();
        let mut out = Vec::with_capacity(traces.iter().map(|t| t.len()).sum());
        for e in traces.iter().flat_map(Trace::ids) {
            new_index.entry(e).or_insert(out.len() as u32);
            out.push(events[e as usize]);
        }
        let mut extras: Vec<Extra> =
            extras.into_iter().filter_map(|x| Some(Extra { event: *new_index.get(&x.event)?, ..x })).collect();
        // Kept in event order, so one event's extras are found by binary search.
        extras.sort_by_key(|x| x.event);
        let times = times.reordered(traces.iter().flat_map(Trace::ids).map(|e| e as usize));
        (out, times, extras)
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
    (devices, events, times, extras)
}

/// One device's trace, by folded event ids: as torch writes it, one run of them.
enum Trace {
    Run(std::ops::Range<u32>),
    Listed(Vec<u32>),
}

impl Trace {
    fn len(&self) -> usize {
        match self {
            Trace::Run(r) => r.len(),
            Trace::Listed(ids) => ids.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ids(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            Trace::Run(r) => Box::new(r.clone()),
            Trace::Listed(ids) => Box::new(ids.iter().copied()),
        }
    }
}

/// Whether the traces list every event once, in the order they were folded.
fn in_order(traces: &[Trace], events: usize) -> bool {
    let mut next = 0u32;
    for t in traces {
        match t {
            Trace::Run(r) if r.is_empty() => {}
            Trace::Run(r) if r.start == next => next = r.end,
            Trace::Run(_) => return false,
            Trace::Listed(ids) => {
                for &e in ids {
                    if e != next {
                        return false;
                    }
                    next += 1;
                }
            }
        }
    }
    next as usize == events
}

struct Walker<'a> {
    heap: &'a Heap,
    sink: &'a mut SnapshotSink,
    /// Segment and block dicts already read. torch writes each as its own dict; a pickle that
    /// lists one shared object many times (legal, through the memo) would expand a few bytes
    /// into gigabytes of model, so a repeat is refused, not expanded.
    seen: foldhash::HashSet<u32>,
    segments: usize,
    /// The budget, the bytes the read holds, and what the segments built so far were charged.
    charge: Option<(Budget, u64, Charged)>,
}

impl Walker<'_> {
    fn list(&self, v: Value, path: &str) -> Result<Vec<Value>, ModelError> {
        match v {
            Value::Node(id) if matches!(self.heap.kind(id), Kind::List | Kind::Tuple) => {
                Ok(self.heap.items(id).collect())
            }
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
            Value::UInt(n) => Err(ModelError::new(
                format!("{}.{name}", path()),
                "an int below 2^63",
                format!("{n}, past what any allocator hands out"),
            )),
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
        if !self.seen.insert(d) {
            return Err(repeated(path(), "segment"));
        }
        self.segments += 1;
        if self.segments > MAX_SEGMENTS {
            return Err(ModelError::new(
                path(),
                format!("at most {MAX_SEGMENTS} segments (256 GiB in the smallest, 2 MiB segments)"),
                "more segments than any GPU holds",
            ));
        }
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
                return Err(ModelError::new(
                    format!("{}.segment_type", path()),
                    "'small' or 'large'",
                    format!("{other:?}"),
                ));
            }
        };
        let id = match self.field(d, "segment_pool_id") {
            Value::None => (0, 0),
            Value::Node(t) => match self.heap.items(t).collect::<Vec<_>>()[..] {
                [Value::Int(a), Value::Int(b)] => (a, b),
                _ => {
                    return Err(ModelError::new(
                        format!("{}.segment_pool_id", path()),
                        "a pair of ints",
                        "something else",
                    ));
                }
            },
            other => {
                return Err(ModelError::new(
                    format!("{}.segment_pool_id", path()),
                    "a pair of ints",
                    found(self.heap, other),
                ));
            }
        };
        let is_expandable = matches!(self.field(d, "is_expandable"), Value::Bool(true));
        let stack = self.sink.stack(self.heap, self.field(d, "frames"), &path)?;
        let mut blocks = Vec::new();
        let mut next = address;
        let block_values = self.list(self.field(d, "blocks"), &format!("{}.blocks", path()))?;
        if block_values.len() as u64 > total_size / MIN_BLOCK + 1 {
            return Err(ModelError::new(
                format!("{}.blocks", path()),
                format!(
                    "at most {} blocks (one per {MIN_BLOCK} bytes of its {total_size})",
                    total_size / MIN_BLOCK + 1
                ),
                format!("{} blocks", block_values.len()),
            ));
        }
        if let Some((budget, read, charged)) = &mut self.charge {
            let events = self.sink.events.len() as u64;
            charged.segment(budget, Besides { read: *read, events }, block_values.len() as u64, &path)?;
        }
        for (j, b) in block_values.into_iter().enumerate() {
            let block = self.block(b, &|| format!("segments[{i}].blocks[{j}]"), next)?;
            next = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        Ok((device, Segment { address, total_size, stream, pool: Pool { kind, id }, is_expandable, stack, blocks }))
    }

    fn block(&mut self, v: Value, path: &dyn Fn() -> String, next: u64) -> Result<Block, ModelError> {
        let d = self.dict(v, path)?;
        if !self.seen.insert(d) {
            return Err(repeated(path(), "block"));
        }
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
    fn traces(&self, v: Value) -> Result<Vec<Trace>, ModelError> {
        let mut out = Vec::new();
        // Which folded entries a trace has listed: each may be listed once, on one device.
        let mut taken = vec![0u64; self.sink.events.len().div_ceil(64)];
        for (d, trace) in self.list(v, "device_traces")?.into_iter().enumerate() {
            let path = format!("device_traces[{d}]");
            if d >= MAX_DEVICES {
                return Err(too_many_devices(path, d + 1));
            }
            if let Value::Node(id) = trace
                && let (Kind::List, Some(run)) =
                    (self.heap.kind(id), self.heap.folded_run(id).filter(|r| r.end <= STACK_TAG))
            {
                if let Some(j) = take_run(&mut taken, run.clone()) {
                    return Err(repeated(format!("{path}[{j}]"), "trace entry"));
                }
                out.push(Trace::Run(run));
                continue;
            }
            let mut events = Vec::new();
            for (j, e) in self.list(trace, &path)?.into_iter().enumerate() {
                match e {
                    Value::Folded(f) if f & STACK_TAG == 0 => {
                        if !take(&mut taken, f) {
                            return Err(repeated(format!("{path}[{j}]"), "trace entry"));
                        }
                        events.push(f)
                    }
                    other => {
                        let expected = "a trace entry (a dict of a few keys, 'action' among them)";
                        let what = match other {
                            // A dict the sink did not fold: too many keys, or none it reads.
                            Value::Node(id) if self.heap.kind(id) == Kind::Dict => {
                                format!("a dict of {} keys that is none", self.heap.pairs(id).count())
                            }
                            other => found(self.heap, other),
                        };
                        return Err(ModelError::new(format!("{path}[{j}]"), expected, what));
                    }
                }
            }
            out.push(Trace::Listed(events));
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
