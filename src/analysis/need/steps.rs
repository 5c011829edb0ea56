//! Where the trace's steps begin, for the projection: the training steps the phases found (an
//! optimizer step ends each), or else, in a loop without an optimizer, a sequence of
//! allocations repeated from one call site after another (each step of the seed workload makes
//! the same two requests; an evaluation loop makes the same forward's). An OOM's request counts
//! as an allocation here: it is the one the program made and the allocator refused.

use foldhash::{HashMap, HashMapExt};

use crate::analysis::phases::Phases;
use crate::snapshot::{Action, EMPTY_STACK, Event, Snapshot, StackId};

/// Steps as ranges of device events: step `s` is `starts[s]..starts[s + 1]` (the last runs to
/// the end of the trace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    pub starts: Vec<usize>,
    /// The boundaries are optimizer steps (or `user_metadata` tags), not a repeated sequence.
    pub from_phases: bool,
}

impl Steps {
    /// The events of step `s`.
    pub fn range(&self, s: usize, events: usize) -> std::ops::Range<usize> {
        let end = self.starts.get(s + 1).copied().unwrap_or(events);
        self.starts[s]..end
    }

    /// The step that holds event `i`.
    pub fn of(&self, i: usize) -> Option<usize> {
        self.starts.partition_point(|&s| s <= i).checked_sub(1)
    }
}

/// The steps of a device's trace, where it has any.
pub fn steps(snapshot: &Snapshot, events: &[Event], phases: &Phases) -> Option<Steps> {
    if phases.steps > 0 {
        let mut starts = vec![0];
        for i in 1..phases.step.len() {
            if phases.step[i] != phases.step[i - 1] {
                starts.push(i);
            }
        }
        return Some(Steps { starts, from_phases: true });
    }
    let depth =
        |stack: StackId| snapshot.stacks.frames(stack).filter(|f| snapshot.stacks.str(f.name) == "_call_impl").count();
    repeated(events, depth)
}

/// Fewer periods than this, and a repetition is chance.
const MIN_PERIODS: usize = 2;
/// Share of (period, call site) pairs where each once-a-step call site appears exactly once.
const REGULAR: f64 = 0.75;

/// Steps from a repeated sequence: the number of times most call sites (two at least)
/// allocated (at least twice) is the number of steps, and the earliest of those call sites
/// begins each step. Only when the sequence is regular: in most steps each of those call sites allocated once. Call
/// sites nested in the fewest module calls count (`depth`): a model's layers repeat too, many
/// times a forward, and a layer is not a step.
fn repeated(events: &[Event], depth: impl Fn(StackId) -> usize) -> Option<Steps> {
    let requests: Vec<(usize, StackId)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.action, Action::ALLOC | Action::OOM) && e.stack != EMPTY_STACK)
        .map(|(i, e)| (i, e.stack))
        .collect();
    // Counted over the allocations the program got; the refused one begins a step too.
    let mut count: HashMap<StackId, (usize, usize)> = HashMap::new();
    for (i, s) in requests.iter().filter(|(i, _)| events[*i].action == Action::ALLOC) {
        count.entry(*s).or_insert((0, *i)).0 += 1;
    }
    let shallow = count.iter().filter(|(_, (n, _))| *n >= MIN_PERIODS).map(|(s, _)| depth(*s)).min()?;
    count.retain(|s, (n, _)| *n >= MIN_PERIODS && depth(*s) == shallow);
    let mut sites_by_count: HashMap<usize, usize> = HashMap::new();
    for (n, _) in count.values() {
        if *n >= MIN_PERIODS {
            *sites_by_count.entry(*n).or_default() += 1;
        }
    }
    let (&periods, _) = sites_by_count.iter().max_by_key(|(n, sites)| (**sites, **n))?;
    let once: Vec<StackId> = count.iter().filter(|(_, (n, _))| *n == periods).map(|(s, _)| *s).collect();
    // One call site alone repeats trivially: a step is a sequence of at least two.
    if once.len() < 2 {
        return None;
    }
    let (&marker, _) = count.iter().filter(|(_, (n, _))| *n == periods).min_by_key(|(_, (_, first))| *first)?;
    let starts: Vec<usize> = requests.iter().filter(|(_, s)| *s == marker).map(|(i, _)| *i).collect();
    // Each once-a-step call site, once in each whole period.
    let mut seen: HashMap<StackId, u32> = HashMap::new();
    let (mut regular, mut pairs) = (0usize, 0usize);
    let mut next = 1;
    for (i, s) in requests.iter().filter(|(i, _)| *i >= starts[0]) {
        while next < starts.len() && *i >= starts[next] {
            regular += seen.values().filter(|n| **n == 1).count();
            pairs += once.len();
            seen.clear();
            next += 1;
        }
        if once.contains(s) {
            *seen.entry(*s).or_default() += 1;
        }
    }
    let whole = starts.len() - 1;
    if whole + 1 < MIN_PERIODS || pairs == 0 || (regular as f64) < REGULAR * pairs as f64 {
        return None;
    }
    let mut out = Steps { starts, from_phases: false };
    // Events before the first period belong to it (the setup before the loop).
    out.starts[0] = 0;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Action;

    fn ev(action: Action, stack: StackId) -> Event {
        Event { addr: 0, size: 0, stack, stream: 0, action }
    }

    #[test]
    fn a_repeated_pair_of_requests_makes_steps_and_the_refused_request_begins_the_last() {
        let (a, f, b) = (ev(Action::ALLOC, 1), ev(Action::FREE_COMPLETED, 0), ev(Action::ALLOC, 2));
        let mut events = vec![ev(Action::ALLOC, 7)];
        for _ in 0..3 {
            events.extend([a, f, b]);
        }
        events.push(ev(Action::OOM, 1));
        let s = repeated(&events, |_| 0).expect("steps");
        assert_eq!(s.starts, vec![0, 4, 7, 10]);
        assert_eq!(s.of(10), Some(3));
        assert_eq!(s.range(1, events.len()), 4..7);
    }

    #[test]
    fn requests_with_no_repeated_order_make_no_steps() {
        let events: Vec<Event> = [1, 2, 2, 1, 1, 2, 2, 2, 1].iter().map(|s| ev(Action::ALLOC, *s)).collect();
        assert_eq!(repeated(&events, |_| 0), None);
    }
}
