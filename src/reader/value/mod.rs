//! The values the reader produces: scalars inline, strings and containers by handle.
//!
//! Containers live in a [`Heap`] and are referred to by index, so a value the pickle shares
//! (a memoized frame dict, a stack list) stays one object however often it is referenced.
//! Strings are interned by content. A [`Value`] is 16 bytes.

mod join;
mod strings;
pub use join::Ids;
pub(crate) use join::Mark;
pub use strings::Strings;

/// Index into [`Strings`].
pub type StrId = u32;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int in [2^63, 2^64): torch writes `size_t(-1)` as the line of frames it has none for.
    UInt(u64),
    Float(f64),
    Str(StrId),
    /// Raw bytes from BINBYTES and friends, kept as a (lossy) string.
    Bytes(StrId),
    /// A list, tuple, dict or set in the heap.
    Node(u32),
    /// A dict or list the sink replaced by an id of its own (see [`super::Sink`]).
    Folded(u32),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Node(_) => "container",
            Value::Folded(_) => "folded value",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    List,
    Tuple,
    Dict,
    Set,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::List => "list",
            Kind::Tuple => "tuple",
            Kind::Dict => "dict",
            Kind::Set => "set",
        }
    }
}

/// A run of consecutive folded ids is stored as one item, so a list of three million trace
/// entries costs a few bytes instead of 48 MB.
#[derive(Debug, Clone, Copy)]
enum Item {
    One(Value),
    FoldedRun { start: u32, len: u32 },
}

/// `Head::slot` of a container that has no item list yet.
const NO_SLOT: u32 = u32::MAX;

/// Per-container bookkeeping: 8 bytes, because a real snapshot has millions of containers
/// (a training trace's frees without a python stack are each an empty list: 1.2M on
/// train_big). Two bools beside the kind made it 12.
#[derive(Debug, Clone, Copy)]
struct Head {
    kind: Kind,
    /// `SEALED`: placed into another container (or folded), it may no longer change. This is
    /// what makes cycles impossible: closing a cycle always means changing a container already
    /// placed. `FOLDED`: the sink folded it; `slot` is the folded id.
    flags: u8,
    depth: u16,
    /// Index into `Heap::slots`, or the folded id once folded.
    slot: u32,
}

const _: () = assert!(std::mem::size_of::<Head>() == 8);

const SEALED: u8 = 1;
const FOLDED: u8 = 2;

impl Head {
    #[inline(always)]
    fn sealed(&self) -> bool {
        self.flags & SEALED != 0
    }

    #[inline(always)]
    fn folded(&self) -> bool {
        self.flags & FOLDED != 0
    }
}

/// All containers of one read, addressed by index.
#[derive(Debug, Default, Clone)]
pub struct Heap {
    heads: Vec<Head>,
    /// Item lists of live containers; a folded dict's list is recycled through `free`.
    slots: Vec<Vec<Item>>,
    free: Vec<u32>,
    pub strings: Strings,
    values: u64,
    /// Containers the entry fast path read without building (see `pickle/entry.rs`).
    unbuilt: u64,
    /// The most values a limit check asked room for (`value_count` plus the values to add):
    /// a later part read apart is held to the limit by it when it is taken in.
    values_asked: u64,
    /// In a later part's copy: how many containers were copied, and the one list among them
    /// it may extend; changing any other (sealing, folding, extending) sets `changed_copies`,
    /// and the copy can no longer be taken in.
    copied: Option<(u32, u32)>,
    changed_copies: bool,
    /// The most bytes the heap may hold ([`super::Limits::max_heap_bytes`]); 0: no cap.
    pub(super) budget: u64,
    /// Bytes the read holds beside the heap (the memo), charged to the same budget.
    pub(super) outside: u64,
}

impl Heap {
    /// An empty heap that may hold `budget` bytes (0: no cap).
    pub(super) fn within(budget: u64) -> Heap {
        Heap { budget, ..Heap::default() }
    }

    /// Containers read so far, built or not: what the container limit counts.
    pub fn container_count(&self) -> u64 {
        self.heads.len() as u64 + self.unbuilt
    }
    pub(super) fn node_count(&self) -> usize {
        self.heads.len()
    }
    pub(super) fn count_unbuilt(&mut self, n: u64) {
        self.unbuilt += n;
    }
    /// Forgets the nodes from `len` on, which must hold no items yet (a fast path's undo).
    pub(super) fn truncate_nodes(&mut self, len: usize) {
        self.heads.truncate(len);
    }
    pub fn value_count(&self) -> u64 {
        self.values
    }

    /// Whether `n` more values stay within `max` (the value limit's check) and the heap's
    /// memory budget, remembering the most asked for.
    #[inline(always)]
    pub(super) fn room_for_values(&mut self, n: u64, max: u64) -> bool {
        let asked = self.values + n;
        self.values_asked = self.values_asked.max(asked);
        asked <= max && !self.over_budget(n)
    }

    /// About the bytes the heap holds with `more` values added: item lists, heads and
    /// strings, each with its allocation's overhead. An upper bound of what it really takes,
    /// so that a budget charged with it holds.
    pub fn approx_bytes(&self, more: u64) -> u64 {
        let items = (self.values + more) * std::mem::size_of::<Item>() as u64;
        let lists = self.slots.len() as u64 * (std::mem::size_of::<Vec<Item>>() as u64 + 32);
        let heads = self.heads.len() as u64 * std::mem::size_of::<Head>() as u64;
        items + lists + heads + self.strings.approx_bytes() + self.outside
    }

    /// The error for a heap past its budget with `more` values.
    pub(super) fn memory_error(&self, more: u64) -> super::ErrorKind {
        super::ErrorKind::Memory {
            containers: self.container_count(),
            values: self.values + more,
            bytes: self.approx_bytes(more),
            limit: self.budget,
        }
    }

    /// Whether `more` values (or a container, with 0) would take the heap past its budget.
    #[inline(always)]
    pub(super) fn over_budget(&self, more: u64) -> bool {
        self.budget != 0 && self.approx_bytes(more) > self.budget
    }

    pub(super) fn new_node(&mut self, kind: Kind) -> u32 {
        let id = self.heads.len() as u32;
        // The item list is taken on the first append: most containers of a snapshot are trace
        // entries folded straight off the stack, which never need one.
        self.heads.push(Head { kind, flags: 0, depth: 1, slot: NO_SLOT });
        id
    }

    pub fn kind(&self, id: u32) -> Kind {
        self.heads[id as usize].kind
    }
    pub fn depth(&self, id: u32) -> u32 {
        self.heads[id as usize].depth as u32
    }
    pub(super) fn folded(&self, id: u32) -> Option<u32> {
        let h = self.heads[id as usize];
        h.folded().then_some(h.slot)
    }
    pub(super) fn sealed(&self, id: u32) -> bool {
        self.heads[id as usize].sealed()
    }
    pub(super) fn seal(&mut self, id: u32) {
        self.note_change(id, false);
        self.heads[id as usize].flags |= SEALED;
    }

    /// A later part's copy notes a change to a copied container (see `copied`).
    #[inline(always)]
    fn note_change(&mut self, id: u32, extending: bool) {
        if let Some((copied, list)) = self.copied
            && id < copied
            && !(extending && id == list)
        {
            self.changed_copies = true;
        }
    }

    /// Makes sure a free item list is at hand, as the general machine's APPEND to a new list
    /// takes one and its fold gives it back: the entry fast path, which builds no list, keeps
    /// the count of item lists (and so the memory charged) the same.
    pub(super) fn keep_free_slot(&mut self) {
        if self.free.is_empty() {
            self.slots.push(Vec::new());
            self.free.push((self.slots.len() - 1) as u32);
        }
    }

    pub(super) fn fold(&mut self, id: u32, folded: u32) {
        self.note_change(id, false);
        let head = &mut self.heads[id as usize];
        if !head.folded() && head.slot != NO_SLOT {
            let mut items = std::mem::take(&mut self.slots[head.slot as usize]);
            self.values -= items.len() as u64;
            items.clear();
            self.slots[head.slot as usize] = items;
            self.free.push(head.slot);
        }
        head.flags |= FOLDED;
        head.slot = folded;
    }

    /// What a container already placed reads as when a memo get meets it again: its folded
    /// id, or the node itself once sealed, with the depth either adds; None while it is open.
    /// One lookup of its head, for the entry fast path.
    #[inline(always)]
    pub(super) fn placed(&self, id: u32) -> Option<(Value, u32)> {
        let h = self.heads.get(id as usize)?;
        if h.folded() {
            Some((Value::Folded(h.slot), 2))
        } else if h.sealed() {
            Some((Value::Node(id), h.depth as u32))
        } else {
            None
        }
    }

    /// The depth of a sealed dict that is not folded (a frame dict met again); None for
    /// anything else.
    #[inline(always)]
    pub(super) fn sealed_dict(&self, id: u32) -> Option<u32> {
        let h = self.heads.get(id as usize)?;
        (h.kind == Kind::Dict && h.sealed() && !h.folded()).then_some(h.depth as u32)
    }

    /// Depth a value adds to a container holding it.
    pub(super) fn value_depth(&self, v: Value) -> u32 {
        match v {
            Value::Node(id) => self.depth(id),
            Value::Folded(_) => 2,
            _ => 0,
        }
    }

    fn items_of(&self, id: u32) -> &[Item] {
        let h = self.heads[id as usize];
        if h.folded() || h.slot == NO_SLOT { &[] } else { &self.slots[h.slot as usize] }
    }

    /// Appends `v`, whose depth the caller computed and checked (the VM caps it far below
    /// u16).
    pub(super) fn push(&mut self, id: u32, v: Value, v_depth: u32) {
        self.extend(id, &[v], v_depth);
    }

    /// Appends settled values whose greatest depth is `max_depth`, with one lookup of the
    /// container. Runs of folded ids merge in lists only, so a dict's items stay key, value, ...
    pub(super) fn extend(&mut self, id: u32, values: &[Value], max_depth: u32) {
        self.note_change(id, true);
        self.values += values.len() as u64;
        let d = (max_depth + 1).min(u16::MAX as u32) as u16;
        let head = &mut self.heads[id as usize];
        head.depth = head.depth.max(d);
        let is_list = head.kind == Kind::List;
        if head.slot == NO_SLOT {
            head.slot = match self.free.pop() {
                Some(slot) => slot,
                None => {
                    self.slots.push(Vec::new());
                    (self.slots.len() - 1) as u32
                }
            };
        }
        push_items(&mut self.slots[head.slot as usize], is_list, values);
    }

    /// Appends items holding `count` values of greatest depth `max_depth` (a later part's,
    /// see `join.rs`), merging runs of folded ids as [`Heap::extend`] does.
    fn extend_items(&mut self, id: u32, items: &[Item], count: u64, max_depth: u32) {
        // An empty extend takes the list's item slot and raises its depth.
        self.extend(id, &[], max_depth);
        self.values += count;
        let head = self.heads[id as usize];
        let list = &mut self.slots[head.slot as usize];
        for &item in items {
            match (item, list.last_mut()) {
                (Item::FoldedRun { start, len }, Some(Item::FoldedRun { start: s, len: l }))
                    if s.checked_add(*l) == Some(start) =>
                {
                    *l += len;
                }
                (Item::One(v), _) => push_items(list, head.kind == Kind::List, &[v]),
                (run, _) => list.push(run),
            }
        }
    }

    /// Number of items (a dict's keys and values count separately).
    pub fn len(&self, id: u32) -> usize {
        self.items_of(id)
            .iter()
            .map(|i| match i {
                Item::One(_) => 1,
                Item::FoldedRun { len, .. } => *len as usize,
            })
            .sum()
    }

    /// The items of a list, tuple or set (or a dict's keys and values interleaved).
    pub fn items(&self, id: u32) -> impl Iterator<Item = Value> + '_ {
        self.items_of(id).iter().flat_map(|i| {
            let (one, run) = match *i {
                Item::One(v) => (Some(v), 0..0),
                Item::FoldedRun { start, len } => (None, start..start + len),
            };
            one.into_iter().chain(run.map(Value::Folded))
        })
    }

    /// True if the container holds nothing (faster than `len`).
    pub fn is_empty(&self, id: u32) -> bool {
        self.items_of(id).is_empty()
    }

    /// Consecutive folded ids held by a list, when that is all it holds.
    pub fn folded_run(&self, id: u32) -> Option<std::ops::Range<u32>> {
        match self.items_of(id) {
            [] => Some(0..0),
            [Item::FoldedRun { start, len }] => Some(*start..*start + *len),
            _ => None,
        }
    }

    /// Key-value pairs of a dict.
    pub fn pairs(&self, id: u32) -> impl Iterator<Item = (Value, Value)> + '_ {
        // Dict items never merge into runs (see `push`), so each item is one value.
        let one = |i: &Item| match *i {
            Item::One(v) => v,
            Item::FoldedRun { start, .. } => Value::Folded(start),
        };
        self.items_of(id).chunks_exact(2).map(move |kv| (one(&kv[0]), one(&kv[1])))
    }

    /// The value under a string key of a dict.
    pub fn get(&self, id: u32, key: StrId) -> Option<Value> {
        self.pairs(id).find(|(k, _)| *k == Value::Str(key)).map(|(_, v)| v)
    }
}

/// Appends values to an item list: runs of folded ids merge in lists only, so a dict's items
/// stay key, value, ...
#[inline]
fn push_items(items: &mut Vec<Item>, is_list: bool, values: &[Value]) {
    items.reserve(values.len());
    for &v in values {
        if let (Value::Folded(f), true) = (v, is_list) {
            if let Some(Item::FoldedRun { start, len }) = items.last_mut()
                && start.checked_add(*len) == Some(f)
            {
                *len += 1;
                continue;
            }
            items.push(Item::FoldedRun { start: f, len: 1 });
        } else {
            items.push(Item::One(v));
        }
    }
}
