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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Replay;
    use crate::testkit::{MIB, SnapshotBuilder, USER};

    /// `steps` steps of the seed pattern: a new 1 GiB segment, its block freed, a 520 MiB
    /// block that stays in it; `noise` extra events (another segment's alloc and free) before
    /// step `at`, to break the rhythm.
    fn seed(steps: u64, noise: Option<(u64, usize)>) -> Rhythm {
        let big = ("train.py", 20, "big");
        let mut b = SnapshotBuilder::new();
        let base = 0x7f00_0000_0000u64;
        let other = base - (20 * MIB);
        for k in 0..steps {
            let a = base + k * 1024 * MIB;
            b = b.segment(a, 1024 * MIB, &[(520 * MIB, "active_allocated", &[USER]), (504 * MIB, "inactive", &[])]);
        }
        if noise.is_some() {
            b = b.segment(other, 20 * MIB, &[(20 * MIB, "inactive", &[])]);
        }
        for k in 0..steps {
            if let Some((at, n)) = noise
                && k == at
            {
                b = b.event("segment_alloc", other, 20 * MIB, &[USER]);
                for _ in 0..n {
                    b = b.event("alloc", other, MIB, &[USER]).free(other, MIB, &[USER]);
                }
            }
            let a = base + k * 1024 * MIB;
            b = b.alloc_in_new_segment(a, 1024 * MIB, 1024 * MIB, &[big]).free(a, 1024 * MIB, &[big]).event(
                "alloc",
                a,
                520 * MIB,
                &[USER],
            );
        }
        let s = b.build();
        let replay = Replay::run(&s, &s.devices[0], &mut ());
        assert!(replay.final_mismatches.is_empty(), "{:?}", replay.final_mismatches);
        rhythm(&replay.end, &s.stacks)
    }

    #[test]
    fn pinned_segments_made_at_an_even_rhythm_are_the_seed_pattern() {
        let r = seed(4, None);
        assert!(r.detected);
        assert_eq!((r.pinned_segments, r.period_events), (4, Some(5)));
        assert_eq!(r.call_sites[0].name, "big");
    }

    #[test]
    fn too_few_or_uneven_creations_are_no_rhythm() {
        assert!(!seed(2, None).detected, "two segments make no rhythm");
        assert!(!seed(4, Some((2, 6))).detected, "a step twice as long breaks it");
    }
}
