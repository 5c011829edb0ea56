//! Taking in the heap of a later part read apart (`pickle/split.rs`): its own strings and
//! containers get the ids a single read would have given them, in the order it made them.

use super::{Heap, Item, NO_SLOT, StrId, Value, push_items};
use crate::reader::{FoldedIds, Limits};

/// How far a heap had come when a later part's copy was taken from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    nodes: usize,
    strings: usize,
    values: u64,
    unbuilt: u64,
}

/// Where the ids of a later part read apart go in the whole read: its own strings and
/// containers (see [`crate::reader::Sink::join`]).
pub struct Ids {
    mark: Mark,
    /// This read's id of each string the later part added.
    strings: Vec<StrId>,
    /// This read's id of the later part's first own container.
    first_node: u32,
}

impl Ids {
    /// This read's id of one of the later part's strings.
    pub fn string(&self, id: StrId) -> StrId {
        match (id as usize).checked_sub(self.mark.strings) {
            Some(i) => self.strings.get(i).copied().unwrap_or(id),
            None => id,
        }
    }

    /// This read's id of one of the later part's containers.
    pub fn node(&self, id: u32) -> u32 {
        match (id as usize).checked_sub(self.mark.nodes) {
            Some(i) => self.first_node + i as u32,
            None => id,
        }
    }

    /// A value of the later part as this read has it; folded ids are the sink's to map.
    pub(crate) fn value(&self, v: Value, folded: &dyn FoldedIds) -> Value {
        match v {
            Value::Str(id) => Value::Str(self.string(id)),
            Value::Bytes(id) => Value::Bytes(self.string(id)),
            Value::Node(id) => Value::Node(self.node(id)),
            Value::Folded(f) => Value::Folded(folded.map(f)),
            v => v,
        }
    }
}

impl Heap {
    /// How far this heap has come, for [`Heap::ids_for`] once a later part is read.
    pub(crate) fn mark(&self) -> Mark {
        Mark { nodes: self.heads.len(), strings: self.strings.len(), values: self.values, unbuilt: self.unbuilt }
    }

    /// A copy for the reader of a later part, which counts what it asks of the value limit
    /// afresh and may change none of the containers copied but `list`, which it extends.
    pub(crate) fn fork(&self, list: u32) -> Heap {
        Heap { values_asked: 0, copied: Some((self.heads.len() as u32, list)), ..self.clone() }
    }

    /// The ids `later` (a copy taken at `mark`) will have here, or None if taking it in would
    /// pass a limit a single read checks on the way: containers, values or string bytes.
    /// Changes nothing.
    pub(crate) fn ids_for(&self, later: &Heap, mark: Mark, limits: &Limits) -> Option<Ids> {
        let (max_containers, max_values) = (limits.max_containers, limits.max_values);
        let max_string_bytes = limits.max_total_string_bytes;
        if later.changed_copies {
            return None;
        }
        let containers = later.container_count().checked_sub((mark.nodes as u64) + mark.unbuilt)?;
        if self.container_count() + containers > max_containers.min(u32::MAX as u64) {
            return None;
        }
        if self.values + later.values_asked.saturating_sub(mark.values) > max_values {
            return None;
        }
        let (mut strings, mut next, mut bytes) = (Vec::new(), self.strings.len() as StrId, self.strings.text.len());
        for id in mark.strings..later.strings.len() {
            let s = later.strings.get(id as StrId);
            match self.strings.find(s) {
                Some(found) => strings.push(found),
                None => {
                    strings.push(next);
                    next += 1;
                    bytes += s.len();
                }
            }
        }
        if bytes as u64 > max_string_bytes || bytes > u32::MAX as usize {
            return None;
        }
        Some(Ids { mark, strings, first_node: self.heads.len() as u32 })
    }

    /// Takes in `later`'s own strings and containers as `ids` placed them, and appends the
    /// values it added to `list` (a list it held when copied) after the `kept` it had then.
    /// `folded` maps the later part's folded ids to this read's.
    pub(crate) fn join(&mut self, mut later: Heap, ids: &Ids, list: u32, kept: usize, folded: &dyn FoldedIds) {
        let mark = ids.mark;
        for id in mark.strings..later.strings.len() {
            // Interned here in the later part's order: `ids_for` counted their bytes.
            let _ = self.strings.intern(later.strings.get(id as StrId), u64::MAX);
        }
        let (appended, count, depth) = added(&later, list, kept, ids, folded);
        let new_values = later.values - mark.values - count;
        for i in mark.nodes..later.heads.len() {
            let mut head = later.heads[i];
            if head.folded() {
                head.slot = folded.map(head.slot);
            } else if head.slot != NO_SLOT {
                let items = std::mem::take(&mut later.slots[head.slot as usize]);
                let values: Vec<Value> = expand(&items).map(|v| ids.value(v, folded)).collect();
                self.slots.push(Vec::new());
                head.slot = (self.slots.len() - 1) as u32;
                push_items(&mut self.slots[head.slot as usize], head.kind == super::Kind::List, &values);
            }
            self.heads.push(head);
        }
        self.values += new_values;
        self.unbuilt += later.unbuilt - mark.unbuilt;
        self.values_asked = self.values_asked.max(self.values + later.values_asked.saturating_sub(mark.values));
        if count > 0 {
            self.extend_items(list, &appended, count, depth);
        }
    }
}

/// The items the later part added to `list` after the `kept` values it held when copied, as
/// this read has them, with how many values they hold and their greatest depth. Runs of
/// folded ids stay runs where the sink maps them to runs.
fn added(later: &Heap, list: u32, kept: usize, ids: &Ids, folded: &dyn FoldedIds) -> (Vec<Item>, u64, u32) {
    let (mut out, mut skip, mut count, mut depth) = (Vec::new(), kept, 0u64, 0);
    for item in later.items_of(list) {
        match *item {
            Item::One(v) => {
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                depth = depth.max(later.value_depth(v));
                out.push(Item::One(ids.value(v, folded)));
                count += 1;
            }
            Item::FoldedRun { start, len } => {
                let dropped = skip.min(len as usize) as u32;
                skip -= dropped as usize;
                let (start, len) = (start + dropped, len - dropped);
                if len == 0 {
                    continue;
                }
                depth = depth.max(later.value_depth(Value::Folded(start)));
                count += len as u64;
                match folded.run(start, len) {
                    Some(first) => out.push(Item::FoldedRun { start: first, len }),
                    None => out.extend((start..start + len).map(|f| Item::One(Value::Folded(folded.map(f))))),
                }
            }
        }
    }
    (out, count, depth)
}

/// The values an item list holds, folded runs spelt out.
fn expand(items: &[Item]) -> impl Iterator<Item = Value> + '_ {
    items.iter().flat_map(|i| {
        let (one, run) = match *i {
            Item::One(v) => (Some(v), 0..0),
            Item::FoldedRun { start, len } => (None, start..start + len),
        };
        one.into_iter().chain(run.map(Value::Folded))
    })
}
