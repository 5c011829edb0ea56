//! A test kit for unit tests: [`SnapshotBuilder`] writes a small snapshot as torch would
//! (`segments` with their blocks, one device trace), pickles it with serde-pickle's writer
//! (which writes pickles fine; only its reader fails on real snapshots, see the notes) and
//! reads it back through our own reader, so a test states a situation in a few lines and
//! exercises the whole path from bytes to model.

use std::collections::BTreeMap;

use serde_pickle::{HashableValue as K, SerOptions, Value as V};

use crate::snapshot::Snapshot;

pub const MIB: u64 = 1 << 20;

/// A fixed pseudo-random sequence (xorshift64) from `seed`, so that a randomized test reads
/// the same values every run.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A frame as `(filename, line, name)`.
pub type Frame = (&'static str, i64, &'static str);

#[derive(Default)]
pub struct SnapshotBuilder {
    segments: Vec<V>,
    trace: Vec<V>,
    context: Option<V>,
}

fn dict(entries: Vec<(&str, V)>) -> V {
    V::Dict(entries.into_iter().map(|(k, v)| (K::String(k.to_string()), v)).collect::<BTreeMap<_, _>>())
}

fn frames(fs: &[Frame]) -> V {
    V::List(
        fs.iter()
            .map(|(f, l, n)| {
                dict(vec![
                    ("filename", V::String(f.to_string())),
                    ("line", V::I64(*l)),
                    ("name", V::String(n.to_string())),
                ])
            })
            .collect(),
    )
}

impl SnapshotBuilder {
    pub fn new() -> SnapshotBuilder {
        SnapshotBuilder::default()
    }

    /// A segment at `address` of the large pool (or small, for 2 MiB ones) holding `blocks`:
    /// `(size, state, frames)` in address order; they must add up to `size`.
    pub fn segment(mut self, address: u64, size: u64, blocks: &[(u64, &str, &[Frame])]) -> Self {
        let mut at = address;
        let blocks: Vec<V> = blocks
            .iter()
            .map(|(bsize, state, fs)| {
                let b = dict(vec![
                    ("address", V::I64(at as i64)),
                    ("size", V::I64(*bsize as i64)),
                    ("requested_size", V::I64(*bsize as i64)),
                    ("state", V::String(state.to_string())),
                    ("frames", frames(fs)),
                ]);
                at += bsize;
                b
            })
            .collect();
        assert_eq!(at, address + size, "blocks must tile their segment");
        let pool = if size == 2 * MIB { "small" } else { "large" };
        self.segments.push(dict(vec![
            ("device", V::I64(0)),
            ("address", V::I64(address as i64)),
            ("total_size", V::I64(size as i64)),
            ("stream", V::I64(0)),
            ("segment_type", V::String(pool.into())),
            ("segment_pool_id", V::Tuple(vec![V::I64(0), V::I64(0)])),
            ("is_expandable", V::Bool(false)),
            ("frames", V::List(vec![])),
            ("blocks", V::List(blocks)),
        ]));
        self
    }

    /// A trace entry: `action` at `addr` for `size` bytes, made at `frames`.
    pub fn event(mut self, action: &str, addr: u64, size: u64, fs: &[Frame]) -> Self {
        self.trace.push(dict(vec![
            ("action", V::String(action.to_string())),
            ("addr", V::I64(addr as i64)),
            ("size", V::I64(size as i64)),
            ("stream", V::I64(0)),
            ("time_us", V::I64(self.trace.len() as i64)),
            ("frames", frames(fs)),
        ]));
        self
    }

    /// An allocation and its segment, as torch records a request that needed a new segment.
    pub fn alloc_in_new_segment(self, addr: u64, segment: u64, size: u64, fs: &[Frame]) -> Self {
        self.event("segment_alloc", addr, segment, fs).event("alloc", addr, size, fs)
    }

    /// An allocation and its two-step free.
    pub fn free(self, addr: u64, size: u64, fs: &[Frame]) -> Self {
        self.event("free_requested", addr, size, fs).event("free_completed", addr, size, fs)
    }

    /// The `fragscope_context` our capture client adds: device 0's total and budget.
    pub fn recorded(mut self, total: u64, budget: u64) -> Self {
        let device = dict(vec![
            ("device", V::I64(0)),
            ("total_bytes", V::I64(total as i64)),
            ("budget_bytes", V::I64(budget as i64)),
        ]);
        self.context = Some(dict(vec![("devices", V::List(vec![device]))]));
        self
    }

    /// The pickle bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut top = vec![
            ("segments", V::List(self.segments.clone())),
            ("device_traces", V::List(vec![V::List(self.trace.clone())])),
        ];
        if let Some(c) = &self.context {
            top.push(("fragscope_context", c.clone()));
        }
        serde_pickle::value_to_vec(&dict(top), SerOptions::new()).expect("serde-pickle writes the snapshot")
    }

    /// The snapshot, read back by our reader.
    pub fn build(&self) -> Snapshot {
        let bytes = self.bytes();
        crate::ingest::ingest(std::io::Cursor::new(bytes), &crate::ingest::Options::default())
            .expect("the built snapshot reads")
            .snapshot
    }
}

/// A frame of user code, as the call site most tests name.
pub const USER: Frame = ("train.py", 10, "step");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_snapshot_reads_back_as_written() {
        let s = SnapshotBuilder::new()
            .segment(0x7f00_0000_0000, 20 * MIB, &[(4 * MIB, "active_allocated", &[USER]), (16 * MIB, "inactive", &[])])
            .alloc_in_new_segment(0x7f00_0000_0000, 20 * MIB, 4 * MIB, &[USER])
            .build();
        assert_eq!(s.devices.len(), 1);
        let d = &s.devices[0];
        assert_eq!(d.segments.len(), 1);
        assert_eq!(d.segments[0].blocks.len(), 2);
        assert_eq!(s.device_events(d).len(), 2);
    }
}
