//! Active memory by call site over events: what PyTorch's viewer calls the "Active Memory
//! Timeline", aggregated here so three million events draw as a few hundred columns. Live
//! (active) bytes are summed per call site at the busiest instant of each bucket (so the
//! chart's top is the trace's peak, not whatever a bucket's last event left) and at the end of
//! the last; the `top` sites by
//! peak are kept apart and the rest summed as `other`. Grouped by category instead, there is
//! one series per category of memory (see `categories`). Sizes are the requests rounded as the
//! allocator rounds them: a large-pool block can hold up to 1 MiB more (the rest it was not
//! split from), which the segment map and the breakdowns count.

use foldhash::{HashMap, HashMapExt};
use serde::Serialize;

use super::categories::{Category, Labels};
use crate::replay::{BlockRec, Replay, Rules, State};
use crate::snapshot::sites::{CallSite, call_site};
use crate::snapshot::{Action, BlockState, Device, Event, Snapshot, StackId};

#[derive(Debug, Clone, Serialize)]
pub struct ActiveBySite {
    pub start: u64,
    pub end: u64,
    /// The last event of each bucket; the values are the state right after the bucket's event
    /// of most live bytes (the last bucket's: after its last event, the end of the range).
    pub event: Vec<u64>,
    pub sites: Vec<SiteSeries>,
    pub other: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SiteSeries {
    /// The call site of this series (grouped by call site).
    pub call_site: Option<CallSite>,
    /// What its blocks hold (grouped by category).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    pub values: Vec<u64>,
}

/// What one series of the chart gathers: blocks of one call site, or of one category.
#[derive(Clone, Copy)]
pub enum Group<'a> {
    Site,
    Category(&'a Labels),
}

/// Live bytes over events `range` in `points` buckets, grouped as `group` says: by call
/// site (the `top` by peak apart, the rest as `other`) or by category.
pub fn active_by(
    snapshot: &Snapshot,
    device: &Device,
    replay: &Replay,
    range: std::ops::Range<usize>,
    points: usize,
    top: usize,
    group: Group,
) -> ActiveBySite {
    let events = snapshot.device_events(device);
    let range = range.start.min(events.len())..range.end.min(events.len());
    let start_state: State = replay.state_at(snapshot, range.start.checked_sub(1));
    let mut keys =
        Keys { snapshot, group, site_of_stack: vec![u32::MAX; snapshot.stacks.stack_count()], sites: Vec::new() };
    // Live blocks by address: a free's own stack is where it was freed, not allocated.
    let mut live: HashMap<u64, (usize, u64)> = HashMap::with_capacity(1 << 12);
    let mut totals: Vec<u64> = Vec::new();
    for s in start_state.segment_ids() {
        for b in start_state.block_ids(s) {
            let blk = start_state.block(b);
            if blk.state != BlockState::Inactive {
                let i = keys.key(Some(blk), 0, blk.stack);
                live.insert(blk.address, (i, blk.size));
                add(&mut totals, i, blk.size as i64);
            }
        }
    }
    let rules = Rules::from_settings(snapshot.allocator_settings.as_ref());
    let mut walk = Walk { keys, rules, live, totals };
    let (columns, bucket_events) = walk.buckets(events, range.clone(), points);
    let series = top_series(&walk.keys, &columns, top);
    ActiveBySite {
        start: range.start as u64,
        end: range.end as u64,
        event: bucket_events,
        sites: series.sites,
        other: series.other,
    }
}

/// The series a block belongs to: by call site, or by category (series i is
/// `Category::ALL[i]`).
struct Keys<'a> {
    snapshot: &'a Snapshot,
    group: Group<'a>,
    /// Asked once per allocation of a whole trace (a page load): stack ids are dense, so a
    /// table rather than a hash.
    site_of_stack: Vec<u32>,
    sites: Vec<Option<CallSite>>,
}

impl Keys<'_> {
    fn key(&mut self, blk: Option<&BlockRec>, event: usize, stack: StackId) -> usize {
        match self.group {
            Group::Site => self.site(stack),
            Group::Category(labels) => {
                let c = blk.map(|b| labels.of(b)).unwrap_or_else(|| labels.at(event));
                Category::ALL.iter().position(|x| *x == c).unwrap_or(Category::ALL.len() - 1)
            }
        }
    }

    fn site(&mut self, stack: StackId) -> usize {
        let known = self.site_of_stack.get(stack as usize).copied().filter(|&s| s != u32::MAX);
        if let Some(s) = known {
            return s as usize;
        }
        let cs = call_site(&self.snapshot.stacks, stack);
        let i = match self.sites.iter().position(|s| *s == cs) {
            Some(i) => i,
            None => {
                self.sites.push(cs);
                self.sites.len() - 1
            }
        };
        if let Some(slot) = self.site_of_stack.get_mut(stack as usize) {
            *slot = i as u32;
        }
        i
    }
}

/// The live bytes of each series as the events go by.
struct Walk<'a> {
    keys: Keys<'a>,
    rules: Rules,
    /// Live blocks by address: the series and rounded size each was counted under.
    live: HashMap<u64, (usize, u64)>,
    totals: Vec<u64>,
}

impl Walk<'_> {
    /// Each bucket's column (its busiest state; the last bucket's end) and last event.
    fn buckets(&mut self, events: &[Event], range: std::ops::Range<usize>, points: usize) -> (Vec<Vec<u64>>, Vec<u64>) {
        let n = range.len();
        let points = points.clamp(1, n.max(1));
        let mut columns: Vec<Vec<u64>> = Vec::with_capacity(points);
        let mut bucket_events = Vec::with_capacity(points);
        let mut next = 1;
        // The bucket's busiest state so far, and the changes made since it: a new maximum
        // applies them, so keeping it costs one step per event, not a copy of every series.
        let mut sum: i64 = self.totals.iter().map(|v| *v as i64).sum();
        let (mut best, mut best_sum, mut since) = (self.totals.clone(), i64::MIN, Vec::<(usize, i64)>::new());
        for (k, i) in range.enumerate() {
            for (s, by) in self.event(i, &events[i]) {
                let done = add(&mut self.totals, s, by);
                sum += done;
                since.push((s, done));
            }
            if sum > best_sum {
                for (s, by) in since.drain(..) {
                    add(&mut best, s, by);
                }
                best_sum = sum;
            }
            if k + 1 >= next * n / points || k + 1 == n {
                // The last column is the end of the range (at an OOM, the state it met).
                columns.push(if k + 1 == n { self.totals.clone() } else { best.clone() });
                bucket_events.push(i as u64);
                next += 1;
                // The next bucket starts from the state now.
                for (s, by) in since.drain(..) {
                    add(&mut best, s, by);
                }
                best_sum = i64::MIN;
            }
        }
        (columns, bucket_events)
    }

    /// The changes event `i` makes: at most a block replaced and a block added.
    fn event(&mut self, i: usize, e: &Event) -> impl Iterator<Item = (usize, i64)> + use<> {
        let (mut gone, mut came) = (None, None);
        match e.action {
            Action::ALLOC => {
                let s = self.keys.key(None, i, e.stack);
                let size = self.rules.round_size(e.size);
                gone = self.live.insert(e.addr, (s, size));
                came = Some((s, size));
            }
            Action::FREE_COMPLETED => gone = self.live.remove(&{ e.addr }),
            _ => {}
        }
        let gone = gone.map(|(s, size)| (s, -(size as i64)));
        gone.into_iter().chain(came.map(|(s, size)| (s, size as i64)))
    }
}

/// The chart's series: the top sites by peak, everything else summed as `other`. Categories
/// are few: all are kept.
struct Series {
    sites: Vec<SiteSeries>,
    other: Vec<u64>,
}

fn top_series(keys: &Keys, columns: &[Vec<u64>], top: usize) -> Series {
    let (groups, top) = match keys.group {
        Group::Site => (keys.sites.len(), top),
        Group::Category(_) => (Category::ALL.len(), Category::ALL.len()),
    };
    let mut peaks: Vec<(usize, u64)> =
        (0..groups).map(|s| (s, columns.iter().map(|c| c.get(s).copied().unwrap_or(0)).max().unwrap_or(0))).collect();
    peaks.sort_by_key(|p| std::cmp::Reverse(p.1));
    let kept: Vec<usize> = peaks.iter().filter(|p| p.1 > 0).take(top).map(|p| p.0).collect();
    let sites = kept
        .iter()
        .map(|&s| SiteSeries {
            call_site: keys.sites.get(s).cloned().flatten(),
            category: matches!(keys.group, Group::Category(_)).then(|| Category::ALL[s]),
            values: columns.iter().map(|c| c.get(s).copied().unwrap_or(0)).collect(),
        })
        .collect();
    let other =
        columns.iter().map(|c| c.iter().enumerate().filter(|(s, _)| !kept.contains(s)).map(|(_, v)| v).sum()).collect();
    Series { sites, other }
}

/// Adds `by` to a series (never below 0) and returns the change made.
fn add(totals: &mut Vec<u64>, site: usize, by: i64) -> i64 {
    if totals.len() <= site {
        totals.resize(site + 1, 0);
    }
    let old = totals[site] as i64;
    totals[site] = (old + by).max(0) as u64;
    totals[site] as i64 - old
}
