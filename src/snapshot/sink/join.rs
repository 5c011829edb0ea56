//! The sink's side of a read in two parts (`reader/pickle/split.rs`): a copy that folds the
//! later part's entries on another thread, and taking what it folded in, with the ids a
//! single read gives (new frames, stacks, streams and unknown actions numbered in the order
//! the later part met them, after this part's).

use crate::reader::{FoldedIds, Ids};
use crate::snapshot::{Action, Event, Extra, Frame, StackId, Times};

use super::{STACK_TAG, SnapshotSink};

/// Events a chunk of a forked sink holds.
const CHUNK: usize = 1 << 16;

/// What a forked sink started from, and its events and their times so far in full chunks.
pub(super) struct Forked {
    frames: usize,
    stacks: usize,
    streams: usize,
    unknown: usize,
    chunks: Vec<(Vec<Event>, Times)>,
    /// Set once taken in: how its ids map.
    maps: Option<Maps>,
    /// Events in `chunks`.
    pub(super) chunked: usize,
}

impl Forked {
    /// Where the fork started, and the events it holds in chunks.
    fn start(&self) -> Forked {
        Forked { chunks: Vec::new(), maps: None, ..*self }
    }
}

impl SnapshotSink {
    /// A copy for the later part: what it interns is known, and it folds events afresh.
    pub(super) fn forked_copy(&self) -> SnapshotSink {
        SnapshotSink {
            keys: self.keys,
            max_events: self.max_events,
            events_budget: self.events_budget,
            events: Vec::new(),
            times: Times::default(),
            extras: Vec::new(),
            stacks: self.stacks.clone(),
            streams: self.streams.clone(),
            stream_index: self.stream_index.clone(),
            last_stream: self.last_stream,
            actions: self.actions.clone(),
            far_actions: self.far_actions.clone(),
            frame_by_node: self.frame_by_node.clone(),
            scratch: Vec::new(),
            stack_by_nodes: self.stack_by_nodes.clone(),
            node_scratch: Vec::new(),
            recent_frames: self.recent_frames.clone(),
            unknown_actions: self.unknown_actions.clone(),
            forked: Some(Forked {
                frames: self.stacks.frame_count(),
                stacks: self.stacks.stack_count(),
                streams: self.streams.len(),
                unknown: self.unknown_actions.len(),
                chunks: Vec::new(),
                chunked: 0,
                maps: None,
            }),
            ahead: super::ahead::Ahead::default(),
        }
    }

    /// Keeps an event (its time pushed already); a forked sink moves full chunks aside.
    #[inline(always)]
    pub(super) fn push_event(&mut self, event: Event) {
        self.events.push(event);
        if self.events.len().is_multiple_of(super::ahead::STEP) {
            self.ahead.request(&self.events);
            self.ahead.request(self.times.offsets());
        }
        if let Some(f) = &mut self.forked
            && self.events.len() == CHUNK
        {
            f.chunked += CHUNK;
            let events = std::mem::replace(&mut self.events, Vec::with_capacity(CHUNK));
            f.chunks.push((events, std::mem::take(&mut self.times)));
        }
    }

    /// Takes in what `later` (forked from this sink) folded; None, changing nothing, if the
    /// event, stream or action limits would be passed.
    pub(super) fn take_in(&mut self, later: &mut SnapshotSink, ids: &Ids) -> Option<Box<dyn FoldedIds + Send + Sync>> {
        let base = later.forked.as_ref().map(Forked::start)?;
        let (n_here, n_later) = (self.event_count(), base.chunked + later.events.len());
        let new_streams = later.streams[base.streams..].iter().filter(|s| !self.stream_index.contains_key(s)).count();
        let new_actions =
            later.unknown_actions[base.unknown..].iter().filter(|a| !self.unknown_actions.contains(a)).count();
        if (n_here + n_later) as u64 > self.max_events
            || self.streams.len() + new_streams > u16::MAX as usize
            || Action::FIRST_UNKNOWN as usize + self.unknown_actions.len() + new_actions > u8::MAX as usize + 1
        {
            return None;
        }
        let string = |s: u32| ids.string(s);
        let mut frames = Vec::new();
        for id in base.frames..later.stacks.frame_count() {
            let f = *later.stacks.frame(id as u32);
            frames.push(self.stacks.frame_id(Frame { filename: string(f.filename), name: string(f.name), ..f }));
        }
        let frame = |id: u32| if (id as usize) < base.frames { id } else { frames[id as usize - base.frames] };
        let mut stacks: Vec<StackId> = Vec::new();
        for id in base.stacks..later.stacks.stack_count() {
            let ids: Vec<u32> = later.stacks.frame_ids(id as StackId).iter().map(|&f| frame(f)).collect();
            stacks.push(self.stacks.stack_id(&ids));
        }
        let streams: Vec<u16> =
            later.streams[base.streams..].iter().map(|&raw| self.stream(raw, String::new).unwrap_or(0)).collect();
        let mut actions = Vec::new();
        for name in &later.unknown_actions[base.unknown..] {
            let i = match self.unknown_actions.iter().position(|a| a == name) {
                Some(i) => i,
                None => {
                    self.unknown_actions.push(name.clone());
                    self.unknown_actions.len() - 1
                }
            };
            actions.push(Action((Action::FIRST_UNKNOWN as usize + i) as u8));
        }
        let unknown_from = Action::FIRST_UNKNOWN as usize + base.unknown;
        let action = |a: Action| if (a.0 as usize) < unknown_from { a } else { actions[a.0 as usize - unknown_from] };
        for (s, a) in later.actions_seen().collect::<Vec<_>>() {
            let s = string(s);
            if self.actions.get(s as usize).is_none_or(|&c| c == 0) && !self.far_actions.contains_key(&s) {
                self.remember_action(s, action(a));
            }
        }
        for (&node, &f) in &later.frame_by_node {
            self.frame_by_node.entry(ids.node(node)).or_insert(frame(f));
        }
        for x in &later.extras {
            self.extras.push(Extra {
                event: x.event + n_here as u32,
                compile_context: x.compile_context.map(string),
                user_metadata: x.user_metadata.map(string),
            });
        }
        let maps = Maps { stacks: stacks.clone(), streams, actions, unknown_from };
        later.forked.as_mut()?.maps = Some(maps);
        Some(Box::new(Later { events: n_here as u32, first_stack: base.stacks, stacks }))
    }

    /// Appends the later part's events and their times, chunk by chunk, each freed once copied
    /// (never two copies of them), with the ids `take_in` mapped. The times are re-encoded on
    /// another thread meanwhile: the earlier part waits for this (on big_trace, the events took
    /// 16 ms and the times 7 one after the other; the take-in's median went from 26 to 19 ms).
    pub(super) fn append_later(&mut self, mut later: SnapshotSink) {
        let Some(Forked { chunks, maps: Some(maps), stacks: first_stack, streams: first_stream, .. }) = later.forked
        else {
            return;
        };
        let stack = |s: StackId| if (s as usize) < first_stack { s } else { maps.stacks[s as usize - first_stack] };
        let stream = |s: u16| if (s as usize) < first_stream { s } else { maps.streams[s as usize - first_stream] };
        let action = |a: Action| {
            if (a.0 as usize) < maps.unknown_from { a } else { maps.actions[a.0 as usize - maps.unknown_from] }
        };
        let same = maps.stacks.is_empty() && maps.streams.is_empty() && maps.actions.is_empty();
        let last = (std::mem::take(&mut later.events), std::mem::take(&mut later.times));
        let (events, times): (Vec<Vec<Event>>, Vec<Times>) = chunks.into_iter().chain(std::iter::once(last)).unzip();
        self.events.reserve(events.iter().map(Vec::len).sum());
        let (own_events, own_times) = (&mut self.events, &mut self.times);
        // The times the other thread did not take (none could start): appended after.
        let left = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<Times>();
            let helper = std::thread::Builder::new().name("take in".into()).spawn_scoped(scope, move || {
                for t in rx {
                    own_times.extend_from(&t);
                }
            });
            let mut left = Vec::new();
            // Each chunk's times go to the helper as its events are copied.
            for (chunk, t) in events.into_iter().zip(times) {
                match &helper {
                    Ok(_) => drop(tx.send(t)),
                    Err(_) => left.push(t),
                }
                if same {
                    own_events.extend_from_slice(&chunk);
                } else {
                    let map = |e: &Event| Event {
                        stack: stack(e.stack),
                        stream: stream(e.stream),
                        action: action(e.action),
                        ..*e
                    };
                    own_events.extend(chunk.iter().map(map));
                }
                // Freed here, as soon as it is copied, so that at most one chunk is held twice:
                // freed by the helper, chunks waited behind its times while it shared its core
                // with the memo's mapping (`reader/pickle/split.rs`), and that was the read's
                // peak. The unmapping costs this thread 1-2 ms (docs/PERFORMANCE.md).
                drop(chunk);
            }
            drop(tx);
            // Joined here, not left to the scope: the scope's wait ends before the thread has
            // exited and freed its handle, which the fuzzer's leak check (run as each input
            // returns) reported as a leak, once in 472,000 inputs.
            if let Ok(h) = helper {
                h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            left
        });
        for t in left {
            self.times.extend_from(&t);
        }
    }
}

/// How the later part's stacks, streams and unknown actions map to the whole read's, for
/// [`SnapshotSink::append_later`].
pub(super) struct Maps {
    stacks: Vec<StackId>,
    streams: Vec<u16>,
    actions: Vec<Action>,
    unknown_from: usize,
}

/// The ids the later part folded, as the whole read has them: its events come after this
/// part's, its stacks as interned here.
struct Later {
    events: u32,
    first_stack: usize,
    stacks: Vec<StackId>,
}

impl FoldedIds for Later {
    fn map(&self, f: u32) -> u32 {
        if f & STACK_TAG == 0 {
            return f + self.events;
        }
        let s = f & !STACK_TAG;
        (if (s as usize) < self.first_stack { s } else { self.stacks[s as usize - self.first_stack] }) | STACK_TAG
    }

    fn run(&self, start: u32, len: u32) -> Option<u32> {
        // Event ids shift as one; stack ids do not.
        let last = start.checked_add(len - 1)?;
        (last & STACK_TAG == 0).then_some(start + self.events)
    }
}
