//! The walk over what the sink left in the heap: each field read with its type checked and
//! its path named on error, segments and blocks charged to the budget as they are built.

use crate::reader::{Heap, Kind, Value};

use super::build::{Trace, too_many_devices};
use super::expansion::{Besides, Budget, Charged, MAX_SEGMENTS, MIN_BLOCK, repeated, take, take_run};
use super::sink::{STACK_TAG, SnapshotSink, found};
use super::*;

pub(super) struct Walker<'a> {
    pub(super) heap: &'a Heap,
    pub(super) sink: &'a mut SnapshotSink,
    /// Segment and block dicts already read. torch writes each as its own dict; a pickle that
    /// lists one shared object many times (legal, through the memo) would expand a few bytes
    /// into gigabytes of model, so a repeat is refused, not expanded.
    pub(super) seen: foldhash::HashSet<u32>,
    pub(super) segments: usize,
    /// The budget, the bytes the read holds, and what the segments built so far were charged.
    pub(super) charge: Option<(Budget, u64, Charged)>,
}

impl Walker<'_> {
    pub(super) fn list(&self, v: Value, path: &str) -> Result<Vec<Value>, ModelError> {
        match v {
            Value::Node(id) if matches!(self.heap.kind(id), Kind::List | Kind::Tuple) => {
                Ok(self.heap.items(id).collect())
            }
            Value::None => Ok(Vec::new()),
            other => Err(ModelError::new(path, "a list", found(self.heap, other))),
        }
    }

    pub(super) fn dict(&self, v: Value, path: &dyn Fn() -> String) -> Result<u32, ModelError> {
        match v {
            Value::Node(id) if self.heap.kind(id) == Kind::Dict => Ok(id),
            other => Err(ModelError::new(path(), "a dict", found(self.heap, other))),
        }
    }

    pub(super) fn field(&self, dict: u32, name: &str) -> Value {
        self.heap.strings.find(name).and_then(|k| self.heap.get(dict, k)).unwrap_or(Value::None)
    }

    pub(super) fn int(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<i64>, ModelError> {
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

    pub(super) fn size(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<u64>, ModelError> {
        match self.int(dict, name, path)? {
            Some(n) if n < 0 => Err(ModelError::new(format!("{}.{name}", path()), "a non-negative int", n.to_string())),
            n => Ok(n.map(|n| n as u64)),
        }
    }

    pub(super) fn text(&self, dict: u32, name: &str, path: &dyn Fn() -> String) -> Result<Option<&str>, ModelError> {
        match self.field(dict, name) {
            Value::Str(s) => Ok(Some(self.heap.strings.get(s))),
            Value::None => Ok(None),
            other => Err(ModelError::new(format!("{}.{name}", path()), "str", found(self.heap, other))),
        }
    }

    pub(super) fn required<T>(&self, v: Option<T>, name: &str, path: &dyn Fn() -> String) -> Result<T, ModelError> {
        v.ok_or_else(|| ModelError::new(format!("{}.{name}", path()), "a value", "none (missing)"))
    }

    pub(super) fn segment(&mut self, v: Value, i: usize) -> Result<(i64, Segment), ModelError> {
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

    pub(super) fn block(&mut self, v: Value, path: &dyn Fn() -> String, next: u64) -> Result<Block, ModelError> {
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
    pub(super) fn traces(&self, v: Value) -> Result<Vec<Trace>, ModelError> {
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

    pub(super) fn annotations(&self, v: Value) -> Result<Vec<Annotation>, ModelError> {
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
