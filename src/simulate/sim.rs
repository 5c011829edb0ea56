//! The replay under other settings: each event of the trace asked of the allocator model
//! (`allocator`), with the private pools, a mempool for one call site, reused buffers and
//! shrunk requests the settings ask for, until the trace ends or the model runs out.

use foldhash::HashMap;

use super::allocator::Allocator;
use super::*;

/// A traced block in the model: a block of its own, or one of a reuse site's buffers.
#[derive(Clone, Copy)]
pub(super) enum Tag {
    Block(u32),
    Buffer(usize),
}

pub(super) struct Sim<'a> {
    pub(super) trace: Option<Vec<u64>>,
    pub(super) snapshot: &'a Snapshot,
    pub(super) events: &'a [Event],
    pub(super) alloc: Allocator,
    pub(super) tags: HashMap<u64, Tag>,
    /// Private pool ids of the snapshot to the model's pool numbers (0 is the default pool).
    pub(super) pools: HashMap<(i64, i64), u32>,
    pub(super) mempool: Option<(String, HashMap<StackId, bool>)>,
    pub(super) reuse: Option<Reuse>,
    pub(super) oom: Option<SimOom>,
    pub(super) replayed: u64,
    pub(super) shrink: Option<std::sync::Arc<Shrink>>,
}

pub(super) struct Reuse {
    pub(super) site: String,
    pub(super) matches: HashMap<StackId, bool>,
    pub(super) size: u64,
    pub(super) buffers: Vec<u32>,
    pub(super) idle: Vec<usize>,
}

pub(super) const MEMPOOL: u32 = u32::MAX;

impl Sim<'_> {
    /// The model's pool for a block the replayed `state` holds at `address`; without a state
    /// (no private pools in the trace), the default pool.
    fn pool_of(&mut self, state: Option<&State>, address: u64) -> u32 {
        let Some((state, b)) = state.and_then(|s| Some((s, s.block_at(address)?))) else { return 0 };
        let id = state.segment(state.block(b).segment).pool.id;
        if id == (0, 0) {
            return 0;
        }
        let next = self.pools.len() as u32 + 1;
        *self.pools.entry(id).or_insert(next)
    }

    pub(super) fn matches(snapshot: &Snapshot, cache: &mut HashMap<StackId, bool>, site: &str, stack: StackId) -> bool {
        *cache.entry(stack).or_insert_with(|| site_matches(snapshot, stack, site))
    }

    fn request(&mut self, index: usize, address: Option<u64>, size: u64, stream: u16, stack: StackId, pool: u32) {
        let snapshot = self.snapshot;
        if let Some(r) = &mut self.reuse
            && Self::matches(snapshot, &mut r.matches, &r.site, stack)
        {
            let buffer = match r.idle.pop() {
                Some(i) => i,
                None => match self.alloc.malloc(r.size, stream, pool) {
                    Some(b) => {
                        r.buffers.push(b);
                        r.buffers.len() - 1
                    }
                    None => {
                        let size = r.size;
                        return self.fail(index, size);
                    }
                },
            };
            if let Some(a) = address {
                self.tags.insert(a, Tag::Buffer(buffer));
            }
            return;
        }
        let private = match &mut self.mempool {
            Some((site, cache)) => Self::matches(snapshot, cache, site, stack),
            None => false,
        };
        let pool = if private { MEMPOOL } else { pool };
        match self.alloc.malloc(size, stream, pool) {
            Some(b) => {
                if let Some(a) = address {
                    self.tags.insert(a, Tag::Block(b));
                }
            }
            None => {
                let rounded = self.alloc.round(size);
                self.fail(index, rounded)
            }
        }
    }

    fn fail(&mut self, index: usize, requested: u64) {
        self.oom = Some(SimOom {
            event_index: index as u64,
            requested_bytes: requested,
            reserved_bytes: self.alloc.reserved,
            allocated_bytes: self.alloc.allocated,
        });
    }

    /// Whether a release in the trace is the program's `torch.cuda.empty_cache()` (which the
    /// model must repeat) rather than the allocator's own (which the model makes by itself).
    /// Its stack says so (torch records `empty_cache` in `torch/cuda/memory.py`); without
    /// frames, a release that no new segment follows was not the allocator's retry.
    fn user_release(&self, index: usize, e: &Event) -> bool {
        let stacks = &self.snapshot.stacks;
        let mut frames = stacks.frames(e.stack).peekable();
        if frames.peek().is_some() {
            return stacks.frames(e.stack).any(|f| stacks.str(f.name) == "empty_cache");
        }
        let creates = |a: Action| {
            matches!(
                a,
                Action::SEGMENT_ALLOC
                    | Action::SEGMENT_MAP
                    | Action::SEGMENT_FREE
                    | Action::SEGMENT_UNMAP
                    | Action::OOM
            )
        };
        self.events.get(index + 1).is_none_or(|n| !creates(n.action))
    }

    fn release(&mut self, address: u64) {
        match self.tags.remove(&address) {
            Some(Tag::Block(b)) => self.alloc.free(b),
            Some(Tag::Buffer(i)) => {
                if let Some(r) = &mut self.reuse {
                    r.idle.push(i);
                }
            }
            None => {}
        }
    }
}

impl Observer for Sim<'_> {
    fn start(&mut self, initial: &State) {
        for s in initial.segment_ids() {
            for b in initial.block_ids(s) {
                let blk = initial.block(b);
                if blk.state != BlockState::Inactive {
                    let pool = self.pool_of(Some(initial), blk.address);
                    let keep = self.shrink.as_ref().and_then(|s| s.before.get(&blk.address).copied()).unwrap_or(100);
                    let size = Shrink::apply(blk.size, keep);
                    let stream = initial.segment(s).stream;
                    self.request(0, Some(blk.address), size, stream, blk.stack, pool);
                }
            }
        }
    }

    fn event(&mut self, index: usize, e: &Event, state: &State) {
        if self.oom.is_none() {
            self.step(index, e, Some(state));
        }
    }
}

impl Sim<'_> {
    /// Feeds the model the trace. Only a request's pool needs the replay's state at each
    /// event; without private pools every request goes to the default one, and the state
    /// before the trace is all the model needs from the replay (a fifth of the time saved).
    pub(super) fn run(&mut self, device: &Device) {
        let start = Start::derive(self.snapshot, device);
        if start.private_pools() {
            start.run(self.snapshot, device, self, false);
            return;
        }
        self.start(start.initial());
        for (i, e) in self.events.iter().enumerate() {
            if self.oom.is_some() {
                break;
            }
            self.step(i, e, None);
        }
    }

    fn shrunk(&self, index: usize, size: u64) -> u64 {
        let keep = self.shrink.as_ref().and_then(|s| s.events.get(index).copied()).unwrap_or(100);
        Shrink::apply(size, keep)
    }

    fn step(&mut self, index: usize, e: &Event, state: Option<&State>) {
        self.replayed = index as u64 + 1;
        self.event_inner(index, e, state);
        if let Some(t) = &mut self.trace {
            t.push(self.alloc.reserved);
        }
    }

    fn event_inner(&mut self, index: usize, e: &Event, state: Option<&State>) {
        match e.action {
            Action::ALLOC => {
                let pool = self.pool_of(state, e.addr);
                self.request(index, Some(e.addr), self.shrunk(index, e.size), e.stream, e.stack, pool);
            }
            Action::OOM => self.request(index, None, self.shrunk(index, e.size), e.stream, e.stack, 0),
            Action::FREE_COMPLETED => self.release(e.addr),
            Action::SEGMENT_FREE | Action::SEGMENT_UNMAP if self.user_release(index, e) => self.alloc.release_cached(),
            _ => {}
        }
    }
}
