//! The need of a step that died, from an earlier step that ran whole: what was alive when the
//! dying step began (the weights, and the optimizer's state that the first `step()` made), plus
//! what the earlier step made and freed within itself, moment by moment, each of those
//! allocations scaled by how much larger the dying step's are. The two steps are aligned by
//! call site: the n-th allocation a stack made in the dying step is the n-th it made in the
//! earlier one. A matched allocation scales by its own ratio; one the dying step never reached
//! scales by the byte-weighted median ratio of the batch-sized ones (a batch twice as big makes
//! activations twice as big, and weights, gradients and optimizer state stay as they are).

use foldhash::{HashMap, HashMapExt};

use super::mix::{Mix, Model};
use crate::analysis::categories::{Category, NEVER};
use crate::analysis::memory::{Index, live_blocks};
use crate::analysis::phases::Phase;
use crate::replay::{Replay, Rules};
use crate::snapshot::{Action, Event, Snapshot, StackId};

/// What the earlier step tells about the dying one.
pub struct Projection {
    pub model: Model,
    /// The byte-weighted median ratio of the batch-sized allocations, dying step to earlier one.
    pub ratio: f64,
    /// Share of the dying step's requests matched in the earlier step.
    pub matched: f64,
}

/// Fewer matched requests than this share, and the steps do not run the same code.
const MIN_MATCHED: f64 = 0.6;

/// Categories whose size follows the micro-batch: what a forward saves, its temporaries and
/// the backward's, the batch. Memory kept across steps (`other`) and what cannot be told
/// (`unknown`) are counted as fixed.
pub fn batch_sized(c: Category) -> bool {
    matches!(c, Category::Activation | Category::Temporary | Category::Input)
}

/// Projects step `dying` (events `dying.start..=oom`) from step `earlier`; None when the two
/// do not run the same code.
#[allow(clippy::too_many_arguments)]
pub fn project(
    snapshot: &Snapshot,
    events: &[Event],
    index: &Index,
    replay: &Replay,
    rules: &Rules,
    earlier: std::ops::Range<usize>,
    dying: std::ops::Range<usize>,
) -> Option<Projection> {
    let scaling = scaling(events, index, earlier.clone(), dying.clone())?;
    let (ratio, matched) = (scaling.ratio, scaling.matched);
    // Alive when the dying step began.
    let start = replay.state_at(snapshot, dying.start.checked_sub(1));
    let mut persistent = Mix::default();
    for b in live_blocks(&start).filter(|b| b.state == crate::snapshot::BlockState::ActiveAllocated) {
        persistent.add(index.labels.of(b), b.size, false, true);
    }
    let mut changes = changes(events, index, rules, earlier, &scaling);
    changes.sort_by_key(|(at, change, _)| (*at, *change));
    let (mut made, mut gone) = (Mix::default(), Mix::default());
    let mut moments = Vec::new();
    for (_, change, m) in changes {
        match change {
            Change::Made => {
                made = made.plus(&m);
                moments.push(persistent.plus(&made).minus(&gone));
            }
            Change::Freed => made = made.minus(&m),
            Change::Older => gone = gone.plus(&m),
        }
    }
    moments.push(persistent);
    Some(Projection { model: Model::of(moments), ratio, matched })
}

/// How the dying step's requests compare with the earlier step's, matched by call site and
/// order: per allocation of the earlier step, the dying step's size over its own; the batch
/// ratio (a weighted median of the batch-sized ones); the share of requests matched.
struct Scaling {
    scale: HashMap<usize, f64>,
    ratio: f64,
    matched: f64,
}

fn scaling(
    events: &[Event],
    index: &Index,
    earlier: std::ops::Range<usize>,
    dying: std::ops::Range<usize>,
) -> Option<Scaling> {
    let key_of = |range: std::ops::Range<usize>| {
        let mut nth: HashMap<StackId, u32> = HashMap::new();
        range
            .filter(|&i| matches!(events[i].action, Action::ALLOC | Action::OOM))
            .map(|i| {
                let n = nth.entry(events[i].stack).or_default();
                *n += 1;
                ((events[i].stack, *n), i)
            })
            .collect::<Vec<_>>()
    };
    let reference: HashMap<(StackId, u32), usize> = key_of(earlier.clone()).into_iter().collect();
    let requests = key_of(dying.clone());
    if requests.is_empty() {
        return None;
    }
    // Per allocation of the earlier step: the dying step's size over its own.
    let mut scale: HashMap<usize, f64> = HashMap::new();
    let mut ratios: Vec<(f64, u64)> = Vec::new();
    for (key, i) in &requests {
        let Some(&j) = reference.get(key) else { continue };
        let (now, then) = (events[*i].size.max(1), events[j].size.max(1));
        let r = (now as f64 / then as f64).clamp(0.05, 20.0);
        scale.insert(j, r);
        let phase = index.phases.phase.get(j).copied().unwrap_or(Phase::Other);
        if then >= 1 << 20 && phase != Phase::Optimizer && batch_sized(index.labels.at(j)) {
            ratios.push((r, then));
        }
    }
    let matched = scale.len() as f64 / requests.len() as f64;
    if matched < MIN_MATCHED {
        return None;
    }
    let ratio = weighted_median(&mut ratios).unwrap_or(1.0);
    Some(Scaling { scale, ratio, matched })
}

/// The earlier step's own allocations that it freed itself (scaled to the dying step), and
/// what it freed of older ones, each at its event.
fn changes(
    events: &[Event],
    index: &Index,
    rules: &Rules,
    earlier: std::ops::Range<usize>,
    Scaling { scale, ratio, .. }: &Scaling,
) -> Vec<(usize, Change, Mix)> {
    let ratio = *ratio;
    let mut changes: Vec<(usize, Change, Mix)> = Vec::new();
    for i in earlier.clone() {
        let e = &events[i];
        if e.action != Action::ALLOC {
            continue;
        }
        let free = index.freed[i];
        if free == NEVER || free as usize >= earlier.end {
            continue;
        }
        let c = index.labels.at(i);
        let phase = index.phases.phase[i];
        let batched = phase != Phase::Optimizer && batch_sized(c);
        let factor = scale.get(&i).copied().unwrap_or(if batched { ratio } else { 1.0 });
        let bytes = (rules.round_size(e.size) as f64 * factor).round() as u64;
        let mut m = Mix::default();
        m.add(c, bytes, batched, false);
        changes.push((i, Change::Made, m));
        changes.push((free as usize, Change::Freed, m));
    }
    for (i, e) in events.iter().enumerate().take(earlier.start) {
        let free = index.freed[i];
        if e.action == Action::ALLOC && free != NEVER && earlier.contains(&(free as usize)) {
            let mut m = Mix::default();
            m.add(index.labels.at(i), rules.round_size(e.size), false, true);
            changes.push((free as usize, Change::Older, m));
        }
    }
    changes
}

/// What happens at an event of the earlier step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    /// One of its own allocations.
    Made,
    /// The free of one of its own.
    Freed,
    /// The free of a block made before it.
    Older,
}

/// The median of `(value, weight)` pairs by weight.
fn weighted_median(v: &mut [(f64, u64)]) -> Option<f64> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = v.iter().map(|x| x.1).sum();
    let mut run = 0;
    v.iter()
        .find(|x| {
            run += x.1;
            2 * run >= total
        })
        .map(|x| x.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_weighted_median_follows_the_bytes() {
        let mut v = vec![(1.0, 10), (2.0, 100), (1.0, 5)];
        assert_eq!(weighted_median(&mut v), Some(2.0));
        assert_eq!(weighted_median(&mut []), None);
    }
}
