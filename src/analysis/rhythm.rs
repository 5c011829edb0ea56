//! The seed pattern: segments created at a regular rhythm (once a step) that stay pinned.
//!
//! Each step frees a big block and allocates a smaller long-lived one inside it; the next big
//! request cannot use the rest, so it makes a new segment, and so on. Detected as at least
//! three pinned segments whose creation events are evenly spaced: every gap between
//! consecutive creations within 25% of their median.

use serde::{Deserialize, Serialize};

use crate::replay::{NIL, State};
use crate::snapshot::Stacks;
use crate::snapshot::sites::{CallSite, call_site};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rhythm {
    pub detected: bool,
    /// Pinned segments whose creation is in the trace.
    pub pinned_segments: u64,
    /// Median events between two creations, when detected.
    pub period_events: Option<u64>,
    pub created_events: Vec<u64>,
    /// Where the segments were created (the big allocations), most frequent first.
    pub call_sites: Vec<CallSite>,
}

pub fn rhythm(state: &State, stacks: &Stacks) -> Rhythm {
    let mut segs: Vec<(u32, Option<CallSite>)> = state
        .segment_ids()
        .map(|s| state.segment(s))
        .filter(|s| s.live > 0 && s.inactive > 0 && !s.expandable && s.created != NIL)
        .map(|s| (s.created, call_site(stacks, s.stack)))
        .collect();
    segs.sort_by_key(|s| s.0);
    let created: Vec<u64> = segs.iter().map(|s| s.0 as u64).collect();
    let mut sites: Vec<(CallSite, usize)> = Vec::new();
    for site in segs.iter().filter_map(|s| s.1.clone()) {
        match sites.iter_mut().find(|(c, _)| *c == site) {
            Some((_, n)) => *n += 1,
            None => sites.push((site, 1)),
        }
    }
    sites.sort_by_key(|s| std::cmp::Reverse(s.1));
    let mut r = Rhythm {
        pinned_segments: created.len() as u64,
        call_sites: sites.into_iter().map(|s| s.0).collect(),
        created_events: created.clone(),
        ..Rhythm::default()
    };
    if created.len() < 3 {
        return r;
    }
    let mut gaps: Vec<u64> = created.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    let even = median > 0 && gaps.iter().all(|&g| g * 4 >= median * 3 && g * 4 <= median * 5);
    if even {
        r.detected = true;
        r.period_events = Some(median);
    }
    r
}
