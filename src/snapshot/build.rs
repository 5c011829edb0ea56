//! From reader values to the typed model: [`build`] walks (`walker.rs`) what the sink (`sink`) left in
//! the heap (segments, blocks, settings) and checks every field's type, naming its path on
//! error. Unknown keys are ignored and optional fields get torch's defaults, since torch
//! versions differ.

use std::collections::{BTreeMap, HashMap};

use crate::reader::{Heap, Kind, Parsed, Value};

use super::expansion::{Budget, Charged, MAX_DEVICES};
use super::sink::{SnapshotSink, found};
use super::walker::Walker;

use super::{Device, Event, Extra, ModelError, Recorded, Segment, Snapshot};

/// Builds the model from a finished read and the sink that listened to it.
pub fn build(parsed: Parsed, sink: SnapshotSink) -> Result<Snapshot, ModelError> {
    build_within(parsed, sink, None)
}

/// [`build`], charging each segment's blocks to `budget` (beside what the read holds and the
/// events) before they are made, and refusing past it.
pub fn build_within(parsed: Parsed, mut sink: SnapshotSink, budget: Option<Budget>) -> Result<Snapshot, ModelError> {
    let Parsed { root, mut heap, .. } = parsed;
    let Top { segments, traces, settings, annotations, context, legacy } = top(&heap, root)?;
    let read = heap.approx_bytes(0);
    let charge = budget.map(|b| (b, read, Charged::default()));
    let mut w = Walker { heap: &heap, sink: &mut sink, seen: Default::default(), segments: 0, charge };
    let mut by_device: BTreeMap<i64, Vec<Segment>> = BTreeMap::new();
    for (i, seg) in w.list(segments, "segments")?.into_iter().enumerate() {
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

/// What the top level holds: a dict's parts by key, or (from torch before 1.13) the list of
/// segments alone.
struct Top {
    segments: Value,
    traces: Option<Value>,
    settings: Option<Value>,
    annotations: Option<Value>,
    context: Option<Value>,
    legacy: bool,
}

fn top(heap: &Heap, root: Value) -> Result<Top, ModelError> {
    let key = |name: &str| heap.strings.find(name);
    match root {
        Value::Node(id) if heap.kind(id) == Kind::List => {
            Ok(Top { segments: root, traces: None, settings: None, annotations: None, context: None, legacy: true })
        }
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
            Ok(Top {
                segments,
                traces: get("device_traces"),
                settings: get("allocator_settings"),
                annotations: get("external_annotations"),
                context: get("fragscope_context"),
                legacy: false,
            })
        }
        other => Err(ModelError::new(
            "(top level)",
            "a CUDA memory snapshot (a dict with 'segments', or a list of segments)",
            found(heap, other),
        )),
    }
}

pub(super) fn too_many_devices(path: String, devices: usize) -> ModelError {
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
pub(super) enum Trace {
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

/// A generic value as JSON, for `allocator_settings`; stops after `budget` values.
pub(super) fn to_json(heap: &Heap, v: Value, budget: &mut u32) -> serde_json::Value {
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
