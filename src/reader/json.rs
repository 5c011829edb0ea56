//! Snapshots saved as JSON (`json.dump(snapshot)`) read into the same heap as pickles.
//!
//! serde_json streams the text; a visitor builds containers in the [`Heap`] and hands each
//! finished object to the [`Sink`], exactly as the pickle VM does, so the model builder sees one
//! form. serde_json caps nesting at 128; the reader's own limits apply on top.

use std::cell::Cell;
use std::fmt;
use std::io::Read;
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::error::{ErrorKind, Failure, ReadError};
use super::value::{Heap, Kind, Value};
use super::{Limits, Parsed, Sink};

/// Counts bytes as serde_json pulls them, so errors can name an offset, and enforces the size cap.
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
    max: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let room = self.max.saturating_sub(self.count.get());
        if room == 0 {
            return Err(std::io::Error::other("input size limit"));
        }
        let n = buf.len().min(room as usize);
        let got = self.inner.read(&mut buf[..n])?;
        self.count.set(self.count.get() + got as u64);
        Ok(got)
    }
}

struct Builder<'a, S: Sink> {
    heap: Heap,
    sink: &'a mut S,
    limits: &'a Limits,
    /// The first failure that is not serde_json's own; serde only carries a string.
    failure: Option<Failure<S::Error>>,
    count: Rc<Cell<u64>>,
}

impl<S: Sink> Builder<'_, S> {
    fn fail<E: de::Error>(&mut self, kind: ErrorKind) -> E {
        let offset = self.count.get();
        self.failure.get_or_insert(Failure::Read(ReadError { kind, offset }));
        E::custom("stopped")
    }

    fn add<E: de::Error>(&mut self, id: u32, v: Value) -> Result<(), E> {
        if self.heap.value_count() >= self.limits.max_values {
            return Err(self.fail(ErrorKind::Limit { what: "number of values", limit: self.limits.max_values }));
        }
        if self.heap.over_budget(1) {
            let kind = self.heap.memory_error(1);
            return Err(self.fail(kind));
        }
        if let Value::Node(child) = v {
            self.heap.seal(child);
        }
        let depth = self.heap.value_depth(v);
        if depth + 1 > self.limits.max_depth {
            return Err(self.fail(ErrorKind::Limit { what: "nesting depth", limit: self.limits.max_depth as u64 }));
        }
        self.heap.push(id, v, depth);
        Ok(())
    }

    fn node<E: de::Error>(&mut self, kind: Kind) -> Result<u32, E> {
        if self.heap.container_count() >= self.limits.max_containers.min(u32::MAX as u64) {
            let limit = self.limits.max_containers;
            return Err(self.fail(ErrorKind::Limit { what: "number of containers", limit }));
        }
        Ok(self.heap.new_node(kind))
    }

    fn string<E: de::Error>(&mut self, s: &str) -> Result<Value, E> {
        if s.len() as u64 > self.limits.max_string_bytes {
            let limit = self.limits.max_string_bytes;
            return Err(self.fail(ErrorKind::Limit { what: "string length in bytes", limit }));
        }
        match self.heap.strings.intern(s, self.limits.max_total_string_bytes) {
            Some(id) => Ok(Value::Str(id)),
            None => {
                let limit = self.limits.max_total_string_bytes;
                Err(self.fail(ErrorKind::Limit { what: "total string bytes", limit }))
            }
        }
    }
}

impl<'de, S: Sink> DeserializeSeed<'de> for &mut Builder<'_, S> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: Sink> Visitor<'de> for &mut Builder<'_, S> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map(Value::Int).unwrap_or(Value::UInt(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.string(v)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let id = self.node(Kind::List)?;
        while let Some(v) = seq.next_element_seed(&mut *self)? {
            self.add(id, v)?;
        }
        let len = self.heap.len(id);
        if len == 0 || len > 4096 {
            return Ok(Value::Node(id));
        }
        let items: Vec<Value> = self.heap.items(id).collect();
        let folded = self.sink.fold_list(&self.heap, &items);
        self.finish(id, folded)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let id = self.node(Kind::Dict)?;
        while let Some(k) = map.next_key_seed(&mut *self)? {
            let v = map.next_value_seed(&mut *self)?;
            self.add(id, k)?;
            self.add(id, v)?;
        }
        let items: Vec<Value> = self.heap.items(id).collect();
        let folded = self.sink.fold_dict(&self.heap, &items);
        self.finish(id, folded)
    }
}

impl<S: Sink> Builder<'_, S> {
    /// Applies the sink's fold decision for a finished container.
    fn finish<E: de::Error>(&mut self, id: u32, folded: Result<Option<u32>, S::Error>) -> Result<Value, E> {
        match folded {
            Ok(Some(f)) => {
                self.heap.fold(id, f);
                Ok(Value::Folded(f))
            }
            Ok(None) => Ok(Value::Node(id)),
            Err(error) => {
                let offset = self.count.get();
                self.failure.get_or_insert(Failure::Sink { error, offset });
                Err(de::Error::custom("stopped"))
            }
        }
    }
}

/// Reads one JSON document from `reader` into values, folding objects through `sink`.
pub fn read_json<R: Read, S: Sink>(reader: R, limits: &Limits, sink: &mut S) -> Result<Parsed, Failure<S::Error>> {
    let count = Rc::new(Cell::new(0));
    let counting =
        Counting { inner: std::io::BufReader::new(reader), count: count.clone(), max: limits.max_input_bytes };
    let mut heap = Heap::within(limits.max_heap_bytes);
    sink.prepare(&mut heap.strings);
    let mut builder = Builder { heap, sink, limits, failure: None, count: count.clone() };
    let mut de = serde_json::Deserializer::from_reader(counting);
    let result = (&mut builder).deserialize(&mut de).and_then(|root| de.end().map(|()| root));
    match result {
        Ok(root) => Ok(Parsed {
            root,
            heap: builder.heap,
            protocol: None,
            bytes_read: count.get(),
            fast_dicts: 0,
            later_part: None,
        }),
        Err(e) => Err(builder.failure.take().unwrap_or_else(|| {
            let kind = if e.is_eof() {
                ErrorKind::Truncated
            } else if e.is_io() && count.get() >= limits.max_input_bytes {
                ErrorKind::Limit { what: "input size in bytes", limit: limits.max_input_bytes }
            } else {
                ErrorKind::Json(e.to_string())
            };
            Failure::Read(ReadError { kind, offset: count.get().saturating_sub(1) })
        })),
    }
}
