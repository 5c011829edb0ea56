//! One line per snapshot: the numbers a run's page and a comparison put side by side. Kept
//! with the snapshot's row so a run of 64 ranks is one query, not 64 analysis documents.

use serde::{Deserialize, Serialize};

use super::breakdown::{Breakdown, Moment};
use super::{Analysis, DeviceAnalysis};

/// A snapshot at a glance: its busiest device's peaks, OOM and verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The device these numbers are of: the one with an OOM, else the highest peak.
    pub device: i64,
    /// Most bytes reserved at once over the trace.
    pub peak_reserved_bytes: u64,
    /// Most bytes allocated at once over the trace.
    pub peak_allocated_bytes: u64,
    /// The trace holds an out-of-memory event.
    pub oom: bool,
    /// The diagnosis verdict (`no_oom`, `capacity`, `fragmentation`, ...).
    pub verdict: String,
    /// Free bytes pinned by live blocks: at the first OOM, else at the end.
    pub pinned_free_bytes: u64,
    /// The category holding most bytes: at the first OOM, else at the peak.
    pub largest_category: Option<String>,
    /// Bytes by category at that moment (what fills memory), the empty ones left out.
    #[serde(default)]
    pub categories: std::collections::BTreeMap<String, u64>,
}

/// The device a summary describes: the first with an OOM, else the one that peaked highest.
pub fn main_device(a: &Analysis) -> Option<&DeviceAnalysis> {
    a.devices.iter().find(|d| !d.ooms.is_empty()).or_else(|| a.devices.iter().max_by_key(|d| d.peak.reserved_bytes))
}

/// Free bytes pinned by live blocks when it mattered: at the first OOM, else at the end.
pub fn pinned_free_bytes(d: &DeviceAnalysis) -> u64 {
    d.ooms.first().map(|o| o.pinned_free_bytes).unwrap_or(d.pinned.bytes)
}

/// The breakdown that says what filled memory when it mattered: the first OOM's, else the
/// peak's, else the end's.
pub fn key_breakdown(d: &DeviceAnalysis) -> Option<&Breakdown> {
    let at = |m: Moment| d.memory.breakdown.iter().find(|b| b.moment == m);
    at(Moment::Oom).or_else(|| at(Moment::Peak)).or_else(|| at(Moment::Final))
}

impl Summary {
    /// The summary of an analysis (None when it has no device).
    pub fn of(a: &Analysis) -> Option<Summary> {
        let d = main_device(a)?;
        let key = key_breakdown(d);
        let largest = key
            .and_then(|b| b.categories.iter().filter(|(_, v)| **v > 0).max_by_key(|(_, v)| **v).map(|(c, _)| *c))
            .map(|c| c.as_str().to_string());
        let categories = key
            .map(|b| b.categories.iter().filter(|(_, v)| **v > 0).map(|(c, v)| (c.as_str().to_string(), *v)).collect())
            .unwrap_or_default();
        Some(Summary {
            device: d.device,
            peak_reserved_bytes: d.peak.reserved_bytes,
            peak_allocated_bytes: d.peak.allocated_bytes,
            oom: !d.ooms.is_empty(),
            verdict: d.diagnosis.verdict.as_str().to_string(),
            pinned_free_bytes: pinned_free_bytes(d),
            largest_category: largest,
            categories,
        })
    }
}

/// The spread of peaks across a run's ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeakSpread {
    /// The lowest rank peak of reserved bytes.
    pub min: u64,
    /// The highest.
    pub max: u64,
    /// The rank that reached it (the lowest of equals).
    pub rank_of_max: Option<i64>,
}

/// A run at a glance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Ranks uploaded.
    pub ranks: u64,
    /// Ranks whose analysis is done.
    pub ready: u64,
    /// Ranks that ran out of memory, in rank order.
    pub oom_ranks: Vec<i64>,
    /// Peaks of reserved bytes over the ready ranks.
    pub peak_reserved_bytes: PeakSpread,
    /// The highest rank peak over the lowest (1.0: balanced); None until a rank is ready.
    pub imbalance: Option<f64>,
    /// Why the OOM rank (else the highest) differs from the median rank: set on one run's
    /// view, not on lists of runs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub divergence: Option<super::divergence::Divergence>,
}

/// Below this imbalance, a run without an OOM has no rank worth explaining.
const EXPLAIN_IMBALANCE: f64 = 1.05;

impl RunSummary {
    /// Sums up the ranks of a run: `(rank, summary once ready)`.
    pub fn of(ranks: &[(i64, Option<&Summary>)]) -> RunSummary {
        let ready: Vec<(i64, &Summary)> = ranks.iter().filter_map(|(r, s)| s.map(|s| (*r, s))).collect();
        let mut oom_ranks: Vec<i64> = ready.iter().filter(|(_, s)| s.oom).map(|(r, _)| *r).collect();
        oom_ranks.sort_unstable();
        let min = ready.iter().map(|(_, s)| s.peak_reserved_bytes).min().unwrap_or(0);
        let max = ready.iter().map(|(_, s)| s.peak_reserved_bytes).max().unwrap_or(0);
        let rank_of_max = ready
            .iter()
            .filter(|(_, s)| s.peak_reserved_bytes == max)
            .map(|(r, _)| *r)
            .min()
            .filter(|_| !ready.is_empty());
        RunSummary {
            ranks: ranks.len() as u64,
            ready: ready.len() as u64,
            oom_ranks,
            peak_reserved_bytes: PeakSpread { min, max, rank_of_max },
            imbalance: (!ready.is_empty()).then(|| max as f64 / min.max(1) as f64),
            divergence: None,
        }
    }

    /// The rank to explain and the rank to hold it against: the lowest OOM rank (else the
    /// highest peak, when the peaks differ), and the rank whose peak is the median of the
    /// others' (the lower of two middles). None with fewer than two ready ranks.
    pub fn to_explain(&self, ranks: &[(i64, Option<&Summary>)]) -> Option<(i64, super::divergence::Picked, i64)> {
        use super::divergence::Picked;
        let (rank, picked) = match self.oom_ranks.first() {
            Some(r) => (*r, Picked::Oom),
            None if self.imbalance? >= EXPLAIN_IMBALANCE => {
                (self.peak_reserved_bytes.rank_of_max?, Picked::HighestPeak)
            }
            None => return None,
        };
        let mut others: Vec<(u64, i64)> = ranks
            .iter()
            .filter(|(r, _)| *r != rank)
            .filter_map(|(r, s)| s.map(|s| (s.peak_reserved_bytes, *r)))
            .collect();
        others.sort_unstable();
        let median = others.get(others.len().checked_sub(1)? / 2)?.1;
        Some((rank, picked, median))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(peak: u64, oom: bool) -> Summary {
        Summary {
            device: 0,
            peak_reserved_bytes: peak,
            peak_allocated_bytes: peak / 2,
            oom,
            verdict: if oom { "capacity" } else { "no_oom" }.into(),
            pinned_free_bytes: 0,
            largest_category: None,
            categories: Default::default(),
        }
    }

    #[test]
    fn a_run_names_its_oom_ranks_and_its_imbalance() {
        let (a, b, c) = (s(100, false), s(300, true), s(150, false));
        let r = RunSummary::of(&[(2, Some(&c)), (0, Some(&a)), (1, Some(&b)), (3, None)]);
        assert_eq!((r.ranks, r.ready), (4, 3));
        assert_eq!(r.oom_ranks, vec![1]);
        assert_eq!(r.peak_reserved_bytes, PeakSpread { min: 100, max: 300, rank_of_max: Some(1) });
        assert_eq!(r.imbalance, Some(3.0));
    }

    #[test]
    fn the_oom_rank_is_explained_against_the_median_of_the_others() {
        use crate::analysis::divergence::Picked;
        let (a, b, c, d) = (s(100, false), s(300, true), s(150, false), s(120, false));
        let ranks = [(0, Some(&a)), (1, Some(&b)), (2, Some(&c)), (3, Some(&d))];
        let r = RunSummary::of(&ranks);
        assert_eq!(r.to_explain(&ranks), Some((1, Picked::Oom, 3)));
        let (e, f) = (s(100, false), s(100, false));
        let even = [(0, Some(&e)), (1, Some(&f))];
        assert_eq!(RunSummary::of(&even).to_explain(&even), None, "balanced and healthy: nothing to explain");
        let (g, h) = (s(100, false), s(200, false));
        let uneven = [(0, Some(&g)), (1, Some(&h)), (2, None)];
        assert_eq!(RunSummary::of(&uneven).to_explain(&uneven), Some((1, Picked::HighestPeak, 0)));
        let one = [(0, Some(&b))];
        assert_eq!(RunSummary::of(&one).to_explain(&one), None);
    }

    #[test]
    fn a_run_with_nothing_ready_has_no_imbalance() {
        let r = RunSummary::of(&[(0, None)]);
        assert_eq!((r.ready, r.imbalance, r.peak_reserved_bytes.rank_of_max), (0, None, None));
    }
}
