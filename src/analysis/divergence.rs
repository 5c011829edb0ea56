//! Why one rank differs: what the rank that ran out of memory (or peaked highest) held more
//! than the median rank when it mattered, by category and by call site, and how much larger its
//! allocations were at the call sites both made them. Read from the two analysis documents.
//!
//! The same code on every rank makes the same allocations in the same places; a rank fed a
//! larger batch makes each activation at those places proportionally larger. So the ratio of
//! the mean block size at matched call sites tells the batch ratio without knowing the batch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::DeviceAnalysis;
use super::breakdown::{Breakdown, Moment};
use super::phases::Phase;
use super::summary::key_breakdown;
use crate::units::bytes;

/// Why the rank was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Picked {
    /// It ran out of memory (the lowest such rank).
    Oom,
    /// No rank ran out of memory; it peaked highest.
    HighestPeak,
}

/// One category of both ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryDelta {
    /// The category's name.
    pub category: String,
    /// Its bytes in the rank explained.
    pub rank_bytes: u64,
    /// In the median rank.
    pub median_bytes: u64,
    /// `rank_bytes - median_bytes`.
    pub delta: i64,
}

/// One call site of both ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteDelta {
    /// `file:line (function)`.
    pub call_site: String,
    /// What the rank's blocks there hold.
    pub category: String,
    /// Bytes there in the rank explained.
    pub rank_bytes: u64,
    /// In the median rank.
    pub median_bytes: u64,
    /// `rank_bytes - median_bytes`.
    pub delta: i64,
    /// The rank's mean block size there over the median rank's (both made blocks there).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub size_ratio: Option<f64>,
}

/// What the rank held more than the median rank (`summary.divergence` of a run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The rank explained.
    pub rank: i64,
    /// Why it was picked.
    pub picked: Picked,
    /// The rank whose peak is the median of the others'.
    pub median_rank: i64,
    /// When each is read: the rank at its first OOM (else its peak), the median at its peak.
    pub rank_moment: Moment,
    /// The phase the rank was in then.
    pub rank_phase: Phase,
    /// The median rank's moment.
    pub median_moment: Moment,
    /// The phase the median rank was in then.
    pub median_phase: Phase,
    /// Allocated bytes at those moments, the rank's less the median's.
    pub extra_allocated_bytes: i64,
    /// Categories, the largest difference first (both signs).
    pub categories: Vec<CategoryDelta>,
    /// Call sites where the rank held more, most first.
    pub call_sites: Vec<SiteDelta>,
    /// The typical ratio of block sizes at matched call sites of activations, temporaries and
    /// inputs (weighted by bytes): about the batch ratio when the batch differs. None when no
    /// such site was matched.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub size_ratio: Option<f64>,
    /// The same in one sentence.
    pub sentence: String,
    /// The compare page of the median rank (a) and this rank (b); set by the service.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub compare_url: String,
}

/// How many call sites a divergence lists.
const SITES: usize = 5;

/// A ratio this far from 1 is said as a larger (or smaller) batch.
const BATCH_RATIO: f64 = 1.2;

/// What `rank` (on `d`) held more than `median_rank` (on `m`).
pub fn divergence(
    rank: i64,
    picked: Picked,
    d: &DeviceAnalysis,
    median_rank: i64,
    m: &DeviceAnalysis,
) -> Option<Divergence> {
    let a = key_breakdown(d)?;
    let b = m.memory.breakdown.iter().find(|b| b.moment == Moment::Peak).or_else(|| key_breakdown(m))?;
    let categories = category_deltas(a, b);
    let call_sites = site_deltas(a, b);
    let size_ratio = size_ratio(&call_sites);
    let mut out = Divergence {
        rank,
        picked,
        median_rank,
        rank_moment: a.moment,
        rank_phase: a.phase,
        median_moment: b.moment,
        median_phase: b.phase,
        extra_allocated_bytes: a.allocated_bytes as i64 - b.allocated_bytes as i64,
        categories,
        call_sites: call_sites.into_iter().filter(|s| s.delta > 0).take(SITES).collect(),
        size_ratio,
        sentence: String::new(),
        compare_url: String::new(),
    };
    out.sentence = sentence(&out);
    Some(out)
}

fn category_deltas(a: &Breakdown, b: &Breakdown) -> Vec<CategoryDelta> {
    let mut out: Vec<CategoryDelta> = super::categories::Category::ALL
        .iter()
        .map(|c| {
            let (x, y) = (a.categories.get(c).copied().unwrap_or(0), b.categories.get(c).copied().unwrap_or(0));
            CategoryDelta { category: c.as_str().into(), rank_bytes: x, median_bytes: y, delta: x as i64 - y as i64 }
        })
        .filter(|c| c.rank_bytes > 0 || c.median_bytes > 0)
        .collect();
    out.sort_by(|p, q| q.delta.unsigned_abs().cmp(&p.delta.unsigned_abs()).then(p.category.cmp(&q.category)));
    out
}

/// Bytes, blocks and the category of the most bytes, per named call site.
fn sites(b: &Breakdown) -> BTreeMap<String, (u64, u64, String)> {
    let mut out: BTreeMap<String, (u64, u64, String, u64)> = BTreeMap::new();
    for s in b.call_sites.iter() {
        let Some(site) = &s.call_site else { continue };
        let e = out.entry(site.to_string()).or_insert((0, 0, String::new(), 0));
        e.0 += s.bytes;
        e.1 += s.blocks;
        if s.bytes > e.3 {
            (e.2, e.3) = (s.category.as_str().into(), s.bytes);
        }
    }
    out.into_iter().map(|(k, (bytes, blocks, c, _))| (k, (bytes, blocks, c))).collect()
}

fn site_deltas(a: &Breakdown, b: &Breakdown) -> Vec<SiteDelta> {
    let (sa, sb) = (sites(a), sites(b));
    let mut out: Vec<SiteDelta> = sa
        .iter()
        .map(|(name, (x, xn, cat))| {
            let (y, yn) = sb.get(name).map(|(y, yn, _)| (*y, *yn)).unwrap_or((0, 0));
            let ratio = (*xn > 0 && yn > 0 && y > 0).then(|| (*x as f64 / *xn as f64) / (y as f64 / yn as f64));
            SiteDelta {
                call_site: name.clone(),
                category: cat.clone(),
                rank_bytes: *x,
                median_bytes: y,
                delta: *x as i64 - y as i64,
                size_ratio: ratio,
            }
        })
        .collect();
    out.sort_by(|p, q| q.delta.cmp(&p.delta).then(p.call_site.cmp(&q.call_site)));
    out
}

/// The bytes-weighted median of the block-size ratios at matched sites whose blocks scale
/// with the batch (activations, temporaries, inputs).
fn size_ratio(sites: &[SiteDelta]) -> Option<f64> {
    let mut ratios: Vec<(f64, u64)> = sites
        .iter()
        .filter(|s| matches!(s.category.as_str(), "activation" | "temporary" | "input"))
        .filter_map(|s| s.size_ratio.map(|r| (r, s.rank_bytes.min(s.median_bytes))))
        .collect();
    ratios.sort_by(|p, q| p.0.total_cmp(&q.0));
    let total: u64 = ratios.iter().map(|r| r.1).sum();
    let mut seen = 0;
    for (r, w) in &ratios {
        seen += w;
        if seen * 2 >= total {
            return Some((r * 100.0).round() / 100.0);
        }
    }
    None
}

fn moment_words(m: Moment, p: Phase) -> String {
    let at = match m {
        Moment::Oom => "its OOM",
        Moment::Peak => "its peak",
        Moment::Final => "the end",
        Moment::Event => "the event",
    };
    let phase = match p {
        Phase::Forward => " (forward)",
        Phase::Backward => " (backward)",
        Phase::Optimizer => " (optimizer step)",
        Phase::Other => "",
    };
    format!("{at}{phase}")
}

fn sentence(d: &Divergence) -> String {
    let when = format!(
        "at {} than the median rank (rank {}) held at {}",
        moment_words(d.rank_moment, d.rank_phase),
        d.median_rank,
        moment_words(d.median_moment, d.median_phase)
    );
    let top = d.categories.iter().filter(|c| c.delta > 0).max_by_key(|c| c.delta);
    let Some(top) = top else {
        return format!("Rank {} held no category more {when}.", d.rank);
    };
    let mut s =
        format!("Rank {} held {} more {} {when}", d.rank, bytes(top.delta as u64), top.category.replace('_', " "));
    if let Some(site) = d.call_sites.iter().find(|s| s.category == top.category).or(d.call_sites.first()) {
        s += &format!(", {} more of it made at {}", bytes(site.delta as u64), site.call_site);
    }
    // One decimal, rounded half up (1.95 reads as 2.0).
    let one = |r: f64| (r * 10.0).round() / 10.0;
    match d.size_ratio {
        Some(r) if r >= BATCH_RATIO => {
            s += &format!(
                "; its allocations at the same call sites are {:.1}x the median rank's, as a batch (or sequence) {:.1}x larger makes them",
                one(r),
                one(r)
            )
        }
        Some(r) if r <= 1.0 / BATCH_RATIO => {
            s += &format!(
                "; its allocations at the same call sites are {r:.2}x the median rank's: smaller, so it held more of them"
            )
        }
        Some(_) => {
            s += "; its allocations at the same call sites are the median rank's size: it held more of them, not larger ones"
        }
        None => {}
    }
    s + "."
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::breakdown::SiteBytes;
    use crate::analysis::categories::Category;
    use crate::snapshot::sites::CallSite;

    fn breakdown(moment: Moment, sites: &[(&str, Category, u64, u64)]) -> Breakdown {
        let mut categories = BTreeMap::new();
        for (_, c, b, _) in sites {
            *categories.entry(*c).or_insert(0) += b;
        }
        Breakdown {
            moment,
            event_index: Some(1),
            allocated_bytes: sites.iter().map(|s| s.2).sum(),
            phase: Phase::Forward,
            categories,
            call_sites: sites
                .iter()
                .map(|(name, c, b, n)| SiteBytes {
                    call_site: Some(CallSite { filename: name.to_string(), line: 1, name: "f".into() }),
                    category: *c,
                    bytes: *b,
                    blocks: *n,
                })
                .collect(),
            unsharded_parameter_bytes: 0,
            kv_cache: None,
        }
    }

    #[test]
    fn twice_the_block_sizes_at_the_same_sites_read_as_a_batch_twice_as_large() {
        let a =
            breakdown(Moment::Oom, &[("m.py", Category::Activation, 800, 4), ("w.py", Category::Parameter, 100, 1)]);
        let b =
            breakdown(Moment::Peak, &[("m.py", Category::Activation, 400, 4), ("w.py", Category::Parameter, 100, 1)]);
        assert_eq!(size_ratio(&site_deltas(&a, &b)), Some(2.0));
        let sites = site_deltas(&a, &b);
        assert_eq!((sites[0].call_site.as_str(), sites[0].delta), ("m.py:1 (f)", 400));
        let c = category_deltas(&a, &b);
        assert_eq!((c[0].category.as_str(), c[0].delta), ("activation", 400));
    }

    #[test]
    fn more_blocks_of_the_same_size_are_not_a_larger_batch() {
        let a = breakdown(Moment::Oom, &[("m.py", Category::Activation, 800, 8)]);
        let b = breakdown(Moment::Peak, &[("m.py", Category::Activation, 400, 4)]);
        assert_eq!(size_ratio(&site_deltas(&a, &b)), Some(1.0));
        let sites = site_deltas(&a, &b);
        assert_eq!(sites[0].size_ratio, Some(1.0));
    }
}
