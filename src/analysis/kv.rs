//! An inference KV cache, found by how it grows: a decode loop appends one token to every
//! layer's keys and values each step, and a cache that concatenates (transformers'
//! `DynamicCache`, a hand-written `past_key_values` loop) makes, per token, one new block per
//! layer from the same line, each one token longer than the block it replaces. Per stack, the
//! allocations made in a forward then come in runs of equal size, each run as long as the
//! last and `delta` bytes larger: [`MIN_TOKENS`] such runs in a row make a cache.
//!
//! A cache allocated once at its full length (a static cache) does not grow; it is found by
//! its frames instead (`cache_utils.py`'s update under a `generate`) on a trace without a
//! backward (inference), and its per-token numbers stay unknown.
//!
//! The sequences come from the token ids: `generate` grows the attention mask (or the ids) by
//! one int64 per sequence per token, in code around the model (no module's forward in its
//! frames), and its length in tokens equals the cache's.

use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};

use super::phases::{Phase, Phases, Tag};
use crate::snapshot::{Action, EMPTY_STACK, Event, Snapshot, StackId};

/// Runs of one-token-longer blocks in a row that make a decode loop's cache.
pub const MIN_TOKENS: u32 = 5;

/// What the trace tells of a KV cache, at the OOM or the end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvCache {
    /// Bytes the cache grows per generated token (all layers, keys and values, all sequences).
    pub bytes_per_token: Option<u64>,
    /// Tokens in the cache (prompt and generated).
    pub tokens: Option<u64>,
    /// Layers (blocks made per token by one line).
    pub layers: Option<u64>,
    /// Sequences decoded together, from the growth of the token ids.
    pub sequences: Option<u64>,
    /// Cache bytes alive at that moment.
    pub bytes: u64,
}

/// A stack whose blocks grow as a cache does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    /// Bytes each block grows per token.
    pub delta: u64,
    /// Blocks per token (layers).
    pub per_token: u32,
}

/// The stacks of a device's cache: growing ones with their numbers, and (inference only)
/// ones whose frames are a cache's update.
#[derive(Debug, Clone, Default)]
pub struct Stacks {
    /// Stacks that grow as a decode loop's cache, with how.
    pub growing: HashMap<StackId, Chain>,
    /// Stacks of a cache's update in an inference trace (a static cache does not grow).
    pub by_frames: foldhash::HashSet<StackId>,
    /// Int64 chains outside the forward: (bytes per token, last size), for the sequences.
    ids: Vec<(u64, u64)>,
}

impl Stacks {
    /// Whether blocks made at `stack` are cache.
    pub fn contains(&self, stack: StackId) -> bool {
        // Asked of every allocation: most traces have no cache.
        if self.growing.is_empty() && self.by_frames.is_empty() {
            return false;
        }
        self.growing.contains_key(&stack) || self.by_frames.contains(&stack)
    }
}

/// Follows one stack's allocation sizes.
#[derive(Default, Clone, Copy)]
struct Follow {
    size: u64,
    count: u32,
    prev_count: u32,
    delta: u64,
    streak: u32,
    best: Option<(u32, Chain)>,
}

impl Follow {
    fn push(&mut self, size: u64) {
        if size == self.size {
            self.count += 1;
            return;
        }
        let grew = size > self.size && self.count > 0;
        let d = size.wrapping_sub(self.size);
        if grew && d == self.delta && self.count == self.prev_count {
            self.streak += 1;
        } else {
            self.streak = u32::from(grew);
        }
        if grew && self.streak + 1 >= MIN_TOKENS && self.best.is_none_or(|b| b.0 <= self.streak) {
            self.best = Some((self.streak, Chain { delta: d, per_token: self.count }));
        }
        (self.delta, self.prev_count, self.count, self.size) = (d, self.count, 1, size);
    }
}

/// A cache's update called from a generation loop (not a forward that only builds a cache it
/// drops, as a model called outside `generate` does).
fn cache_frames(snapshot: &Snapshot, stack: StackId) -> bool {
    let (mut update, mut generate) = (false, false);
    for f in snapshot.stacks.frames(stack) {
        let file = snapshot.stacks.str(f.filename).replace('\\', "/");
        update |= file.ends_with("cache_utils.py") && snapshot.stacks.str(f.name) == "update";
        generate |= snapshot.stacks.str(f.name) == "generate";
    }
    update && generate
}

/// The cache's stacks on one device.
pub fn stacks(snapshot: &Snapshot, events: &[Event], phases: &Phases) -> Stacks {
    // By what the frames say: a module's forward (the cache), or code around the model (the
    // ids and the mask, which `generate` grows between two forwards).
    // The cache is made in a forward: only the forward's events are read for it, and the
    // code around the model only where a cache was found.
    let mut forward: HashMap<StackId, Follow> = HashMap::new();
    let mut out = Stacks::default();
    // `cache_frames` once per stack, not per allocation.
    let mut is_update: HashMap<StackId, bool> = HashMap::new();
    for i in phases.events_in(Phase::Forward) {
        let e = &events[i];
        if e.action != Action::ALLOC || e.stack == EMPTY_STACK {
            continue;
        }
        if phases.tag_of(e.stack) == Tag::Forward {
            forward.entry(e.stack).or_default().push(e.size);
        }
        if !phases.training && *is_update.entry(e.stack).or_insert_with(|| cache_frames(snapshot, e.stack)) {
            out.by_frames.insert(e.stack);
        }
    }
    out.growing = forward.into_iter().filter_map(|(s, f)| Some((s, f.best?.1))).collect();
    if !out.growing.is_empty() {
        let mut outside: HashMap<StackId, Follow> = HashMap::new();
        for e in events {
            if e.action == Action::ALLOC && e.stack != EMPTY_STACK && phases.tag_of(e.stack) == Tag::User {
                outside.entry(e.stack).or_default().push(e.size);
            }
        }
        out.ids = outside
            .into_values()
            .filter_map(|f| f.best.map(|b| (b.1, f.size)))
            .filter(|(c, _)| c.per_token == 1 && c.delta % 8 == 0)
            .map(|(c, last)| (c.delta, last))
            .collect();
    }
    out
}

/// The cache's numbers from its blocks alive at a moment (`alive`: stack and size of each).
pub fn measure(stacks: &Stacks, alive: &[(StackId, u64)]) -> Option<KvCache> {
    let kv: Vec<&(StackId, u64)> = alive.iter().filter(|(s, _)| stacks.contains(*s)).collect();
    if kv.is_empty() {
        return None;
    }
    let bytes = kv.iter().map(|k| k.1).sum();
    let mut out = KvCache { bytes, ..KvCache::default() };
    // Per growing stack alive now: its chain, and its longest block.
    let mut by_stack: HashMap<StackId, u64> = HashMap::new();
    for (s, size) in &kv {
        if stacks.growing.contains_key(s) {
            let m = by_stack.entry(*s).or_default();
            *m = (*m).max(*size);
        }
    }
    if by_stack.is_empty() {
        return Some(out);
    }
    let chains: Vec<(Chain, u64)> = by_stack.iter().map(|(s, longest)| (stacks.growing[s], *longest)).collect();
    out.bytes_per_token = Some(chains.iter().map(|(c, _)| c.delta * c.per_token as u64).sum());
    out.layers = chains.iter().map(|(c, _)| c.per_token as u64).max();
    let tokens = chains.iter().map(|(c, longest)| longest / c.delta.max(1)).max().unwrap_or(0);
    out.tokens = Some(tokens);
    // The token ids: one int64 per sequence per token, as long as the cache.
    out.sequences = stacks.ids.iter().find(|(d, last)| last / d == tokens).map(|(d, _)| d / 8);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_one_token_longer_blocks_make_a_chain_and_noise_does_not() {
        let mut f = Follow::default();
        for t in 0..8u64 {
            for _ in 0..16 {
                f.push(1000 + 64 * t);
            }
        }
        assert_eq!(f.best.map(|b| b.1), Some(Chain { delta: 64, per_token: 16 }));
        // Sizes that change every step, by varying amounts (a training loop of varying shapes).
        let mut g = Follow::default();
        for size in [512u64, 768, 256, 1024, 1536, 640, 768, 896, 128, 512] {
            for _ in 0..8 {
                g.push(size);
            }
        }
        assert_eq!(g.best, None);
    }
}
