//! The repeated module of a forward: the line that calls the same module again and again (a
//! transformer's loop over its decoder layers), how many times, and what each call keeps for
//! the backward. Found from frames alone: every allocation a layer makes carries the loop's
//! frame, and the allocations under it repeat with a period (one layer's worth), since each
//! layer runs the same code. The model's parameters repeat the same way, which gives the
//! number of layers before the forward has run them all.

use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};

use crate::analysis::categories::NEVER;
use crate::replay::Rules;
use crate::snapshot::sites::CallSite;
use crate::snapshot::{Action, EMPTY_STACK, Event, FrameId, Snapshot, StackId};

/// The repeated module of a forward pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Layers {
    /// The line that calls it (inside the model's own `forward`).
    pub call_site: CallSite,
    /// The file of the module it calls, where frames show it.
    pub module_file: Option<String>,
    /// Calls in one forward: from a whole forward, or else from the parameters' pattern.
    pub calls: u32,
    /// Calls completed in the forward measured.
    pub done: u32,
    /// What each call keeps for the backward (the median over the calls measured).
    pub saved_bytes_per_call: u64,
    /// The output of each call, which is the next call's input: what checkpointing keeps.
    pub input_bytes: u64,
}

/// Frames of torch itself, and C++ frames: never the model's own loop.
fn torch_frame(snapshot: &Snapshot, f: FrameId) -> bool {
    let file = snapshot.stacks.str(snapshot.stacks.frame(f).filename).replace('\\', "/");
    file.contains("site-packages/torch/") || file.contains("dist-packages/torch/") || file.starts_with("torch/") || {
        let native = [".cpp", ".h", ".cu", ".cuh", ".cc"].iter().any(|x| file.ends_with(x));
        native || file == "??" || file.is_empty()
    }
}

/// Share of positions whose stack is the one a period later.
const PERIODIC: f64 = 0.9;

/// The repeated module among the allocations of `range` (one forward pass), with what its
/// calls keep alive right after event `at` (the OOM, or the forward's end).
pub fn find(
    snapshot: &Snapshot,
    events: &[Event],
    range: std::ops::Range<usize>,
    at: usize,
    freed: &[u32],
    rules: &Rules,
) -> Option<Layers> {
    let (allocs, under) = allocs_under_frames(snapshot, events, range);
    let stack = |pos: usize| events[allocs[pos]].stack;
    // The frame whose calls cover the most allocations in whole periods, with the fewest
    // besides (an outer frame covers the embedding and the head too), and of those the
    // outermost: the loop's line rather than each layer's own wrapper.
    let ids_first = |f: FrameId| {
        let ids = snapshot.stacks.frame_ids(stack(under[&f][0]));
        ids.iter().position(|&id| id == f).unwrap_or(0)
    };
    // (its rank, the frame, the first position of its first call, the period, the calls)
    type Candidate = ((usize, std::cmp::Reverse<usize>, usize), FrameId, usize, usize, usize);
    let mut best: Option<Candidate> = None;
    for (&f, positions) in &under {
        let Some((first, period, calls)) = periodic(positions, &stack) else { continue };
        // Positions that repeat a period away, before or after: the calls, not what follows them.
        let repeats = |k: usize| {
            (k + period < positions.len() && stack(positions[k]) == stack(positions[k + period]))
                || (k >= first + period && stack(positions[k]) == stack(positions[k - period]))
        };
        let covered = (first..positions.len()).filter(|&k| repeats(k)).count();
        let key = (covered, std::cmp::Reverse(positions.len() - covered), ids_first(f));
        if best.as_ref().is_none_or(|b| (key, std::cmp::Reverse(f)) > (b.0, std::cmp::Reverse(b.1))) {
            best = Some((key, f, first, period, calls));
        }
    }
    let (_, frame, first, period, calls) = best?;
    let positions = &under[&frame][first..];
    let alive = |pos: usize| {
        let i = allocs[pos];
        freed[i] == NEVER || freed[i] as usize > at
    };
    // The forward has left the loop when the event measured is not under it: every call ran.
    let left = !snapshot.stacks.frame_ids(events[at].stack).contains(&frame) && allocs[*positions.last()?] < at;
    let done = if left { calls } else { positions.len() / period };
    let (mut saved, mut inputs) = (Vec::new(), Vec::new());
    for call in positions.chunks(period).filter(|c| c.len() == period) {
        saved.push(call.iter().filter(|&&p| alive(p)).map(|&p| rules.round_size(events[allocs[p]].size)).sum());
        if let Some(&last) = call.iter().rev().find(|&&p| alive(p)) {
            inputs.push(rules.round_size(events[allocs[last]].size));
        }
    }
    let f = snapshot.stacks.frame(frame);
    let call_site = CallSite {
        filename: snapshot.stacks.str(f.filename).to_string(),
        line: f.line,
        name: snapshot.stacks.str(f.name).to_string(),
    };
    // The callee: the nearest frame inside the loop's that is not torch's own.
    let module_file = callee_file(snapshot, snapshot.stacks.frame_ids(events[allocs[positions[0]]].stack), frame);
    Some(Layers {
        call_site,
        module_file,
        calls: calls as u32,
        done: done as u32,
        saved_bytes_per_call: median(saved),
        input_bytes: median(inputs),
    })
}

/// The allocations of `range` with a stack, and under each frame not torch's own the
/// positions (in that list) of the allocations it is on the stack of.
fn allocs_under_frames(
    snapshot: &Snapshot,
    events: &[Event],
    range: std::ops::Range<usize>,
) -> (Vec<usize>, HashMap<FrameId, Vec<usize>>) {
    let allocs: Vec<usize> =
        range.filter(|&i| events[i].action == Action::ALLOC && events[i].stack != EMPTY_STACK).collect();
    let mut under: HashMap<FrameId, Vec<usize>> = HashMap::new();
    let mut frames_of: HashMap<StackId, Vec<FrameId>> = HashMap::new();
    for (pos, &i) in allocs.iter().enumerate() {
        let frames = frames_of.entry(events[i].stack).or_insert_with(|| {
            let mut f: Vec<FrameId> = snapshot.stacks.frame_ids(events[i].stack).to_vec();
            f.retain(|&id| !torch_frame(snapshot, id));
            f.dedup();
            f
        });
        for &f in frames.iter() {
            under.entry(f).or_default().push(pos);
        }
    }
    (allocs, under)
}

/// The callee of the loop at `frame`: the file of the nearest frame inside it on `ids` that
/// is not torch's own.
fn callee_file(snapshot: &Snapshot, ids: &[FrameId], frame: FrameId) -> Option<String> {
    ids.iter()
        .position(|&id| id == frame)
        .and_then(|k| ids[..k].iter().rev().find(|&&id| !torch_frame(snapshot, id)))
        .map(|&id| snapshot.stacks.str(snapshot.stacks.frame(id).filename).to_string())
}

/// Where the allocations at `positions` repeat: the first position of the first call, the
/// period and the number of calls. The call site that allocates once a call is the one whose
/// count most call sites share; the first call may differ (a layer that sets something up).
fn periodic(positions: &[usize], stack: &impl Fn(usize) -> StackId) -> Option<(usize, usize, usize)> {
    let mut count: HashMap<StackId, (usize, usize)> = HashMap::new();
    for (k, &p) in positions.iter().enumerate() {
        count.entry(stack(p)).or_insert((0, k)).0 += 1;
    }
    let mut by_count: HashMap<usize, usize> = HashMap::new();
    for (n, _) in count.values().filter(|(n, _)| *n >= 2) {
        *by_count.entry(*n).or_default() += 1;
    }
    let (&calls, _) = by_count.iter().max_by_key(|(n, sites)| (**sites, **n))?;
    let (&marker, _) = count.iter().filter(|(_, (n, _))| *n == calls).min_by_key(|(_, (_, first))| *first)?;
    let starts: Vec<usize> = (0..positions.len()).filter(|&k| stack(positions[k]) == marker).collect();
    let mut gaps: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let period = *gaps.get(gaps.len() / 2)?;
    let first = starts[0];
    let n = positions.len() - first;
    if period == 0 || n < 2 * period {
        return None;
    }
    let same =
        (first..positions.len() - period).filter(|&k| stack(positions[k]) == stack(positions[k + period])).count();
    ((same as f64) >= PERIODIC * (n - period) as f64).then_some((first, period, calls))
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// How many layers the parameters repeat: the period of their sizes in the order they were
/// made, and how many periods it covers. None when they do not repeat.
pub fn from_parameters(sizes: &[u64]) -> Option<u32> {
    let n = sizes.len();
    (1..=64.min(n / 2)).find_map(|p| {
        let same = (0..n - p).filter(|&i| sizes[i] == sizes[i + p]).count();
        // Most of the sizes repeat a period later; the layers are what the run of them spans.
        (same >= 3 * p && same as f64 >= 0.75 * (n - p) as f64).then(|| (same / p + 1) as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_that_repeat_every_twelve_tensors_are_sixteen_layers() {
        let mut sizes = vec![100, 50];
        for _ in 0..16 {
            sizes.extend([4, 4, 12, 3, 9, 9, 4, 4, 16, 16, 64, 64]);
        }
        sizes.extend([4, 4]);
        assert_eq!(from_parameters(&sizes), Some(16));
        assert_eq!(from_parameters(&[1, 2, 3, 4, 5, 6, 7]), None);
    }
}
