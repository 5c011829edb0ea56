//! Two snapshots side by side: a run and the same run after a change (another allocator
//! setting, a smaller batch), or two ranks of one job. Every number here is read from the two
//! analysis documents; nothing is replayed again.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::summary::{key_breakdown, main_device, pinned_free_bytes};
use super::{Analysis, DeviceAnalysis};

/// One number of both snapshots, and how it changed (`b - a`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// In the first snapshot.
    pub a: u64,
    /// In the second.
    pub b: u64,
    /// `b - a`.
    pub delta: i64,
}

impl Pair {
    fn new(a: u64, b: u64) -> Pair {
        Pair { a, b, delta: b as i64 - a as i64 }
    }
}

/// A value of both snapshots that has no difference, only sameness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Both<T> {
    /// In the first snapshot.
    pub a: T,
    /// In the second.
    pub b: T,
}

/// A call site's bytes at each snapshot's peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteChange {
    /// `file:line (function)`, or `unknown` for blocks without a user frame.
    pub call_site: String,
    /// Bytes at the first snapshot's peak (0: not among its top sites).
    pub a_bytes: u64,
    /// Bytes at the second snapshot's peak.
    pub b_bytes: u64,
    /// `b_bytes - a_bytes`.
    pub delta: i64,
}

/// One device of both snapshots.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceComparison {
    /// The device of the first snapshot.
    pub device: i64,
    /// The device of the second, where it differs (two ranks on two GPUs).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub b_device: Option<i64>,
    /// Most bytes reserved at once.
    pub peak_reserved_bytes: Pair,
    /// Most bytes allocated at once.
    pub peak_allocated_bytes: Pair,
    /// Reserved at the end of the trace.
    pub final_reserved_bytes: Pair,
    /// Whether each ran out of memory.
    pub oom: Both<bool>,
    /// Each one's diagnosis verdict.
    pub verdict: Both<String>,
    /// Free bytes pinned by live blocks: at the first OOM, else at the end.
    pub pinned_free_bytes: Pair,
    /// Bytes by call site at each one's peak, largest change first.
    pub call_sites: Vec<SiteChange>,
    /// Bytes by category at each one's first OOM, else its peak.
    pub categories: BTreeMap<String, Pair>,
    /// Steps each ran (an OOM's cut-off step counts).
    #[serde(default)]
    pub steps: Both<u64>,
    /// Where both have steps: the highest step peak of allocated bytes within the steps both
    /// reached, so that a run that went further is not read as needing more.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shared_steps_peak_allocated_bytes: Option<Pair>,
    /// Said when they ran different numbers of steps: the totals compare runs of different
    /// lengths ("b ran 8 steps, a died in step 6").
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub steps_note: Option<String>,
}

/// The allocator settings of both, and the keys whose values differ.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettingsComparison {
    /// The first snapshot's `allocator_settings`.
    pub a: Option<serde_json::Value>,
    /// The second's.
    pub b: Option<serde_json::Value>,
    /// Keys set differently (or set in only one).
    pub changed: Vec<String>,
}

/// The comparison document (`/api/v1/compare` and `fragscope compare --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// Devices paired by index; two single-device snapshots on different GPUs pair their devices.
    pub devices: Vec<DeviceComparison>,
    /// The allocator settings side by side.
    pub settings: SettingsComparison,
}

/// How many changed call sites a comparison lists.
const SITES: usize = 20;

/// Compares two analyses: `a` before, `b` after.
pub fn compare(a: &Analysis, b: &Analysis) -> Comparison {
    let mut devices: Vec<DeviceComparison> = a
        .devices
        .iter()
        .filter_map(|da| b.devices.iter().find(|db| db.device == da.device).map(|db| device(da, db)))
        .collect();
    if devices.is_empty()
        && let (Some(da), Some(db)) = (main_device(a), main_device(b))
    {
        devices.push(device(da, db));
    }
    Comparison { devices, settings: settings(a.allocator_settings.as_ref(), b.allocator_settings.as_ref()) }
}

fn device(a: &DeviceAnalysis, b: &DeviceAnalysis) -> DeviceComparison {
    DeviceComparison {
        device: a.device,
        b_device: (a.device != b.device).then_some(b.device),
        peak_reserved_bytes: Pair::new(a.peak.reserved_bytes, b.peak.reserved_bytes),
        peak_allocated_bytes: Pair::new(a.peak.allocated_bytes, b.peak.allocated_bytes),
        final_reserved_bytes: Pair::new(a.final_state.reserved_bytes, b.final_state.reserved_bytes),
        oom: Both { a: !a.ooms.is_empty(), b: !b.ooms.is_empty() },
        verdict: Both { a: a.diagnosis.verdict.as_str().into(), b: b.diagnosis.verdict.as_str().into() },
        pinned_free_bytes: Pair::new(pinned_free_bytes(a), pinned_free_bytes(b)),
        call_sites: call_sites(a, b),
        categories: categories(a, b),
        steps: Both { a: a.memory.step_count(), b: b.memory.step_count() },
        shared_steps_peak_allocated_bytes: shared_steps_peak(a, b),
        steps_note: steps_note(a, b),
    }
}

/// The highest step peak within the steps both runs reached.
fn shared_steps_peak(a: &DeviceAnalysis, b: &DeviceAnalysis) -> Option<Pair> {
    let k = a.memory.steps.len().min(b.memory.steps.len());
    let peak = |d: &DeviceAnalysis| d.memory.steps[..k].iter().map(|s| s.peak_allocated_bytes).max();
    Some(Pair::new(peak(a)?, peak(b)?))
}

fn steps_note(a: &DeviceAnalysis, b: &DeviceAnalysis) -> Option<String> {
    let (na, nb) = (a.memory.step_count(), b.memory.step_count());
    if na == nb || na == 0 || nb == 0 {
        return None;
    }
    let ran = |side: &str, n: u64, d: &DeviceAnalysis| {
        if d.ooms.is_empty() { format!("{side} ran {n} steps") } else { format!("{side} died in step {n}") }
    };
    Some(format!(
        "{}, {}: the totals compare runs of different lengths; within the {} steps both reached, the highest step peaks are compared apart",
        ran("a", na, a),
        ran("b", nb, b),
        na.min(nb)
    ))
}

/// Bytes per call site at the peak (the sites the analysis kept, the top ones).
fn sites_at_peak(d: &DeviceAnalysis) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let peak = d.memory.breakdown.iter().find(|b| b.moment == super::breakdown::Moment::Peak);
    for s in peak.map(|b| b.call_sites.as_slice()).unwrap_or_default() {
        let name = s.call_site.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "unknown".into());
        *out.entry(name).or_insert(0) += s.bytes;
    }
    out
}

fn call_sites(a: &DeviceAnalysis, b: &DeviceAnalysis) -> Vec<SiteChange> {
    let (sa, sb) = (sites_at_peak(a), sites_at_peak(b));
    let names: BTreeSet<&String> = sa.keys().chain(sb.keys()).collect();
    let mut out: Vec<SiteChange> = names
        .into_iter()
        .map(|n| {
            let (x, y) = (sa.get(n).copied().unwrap_or(0), sb.get(n).copied().unwrap_or(0));
            SiteChange { call_site: n.clone(), a_bytes: x, b_bytes: y, delta: y as i64 - x as i64 }
        })
        .collect();
    out.sort_by(|p, q| q.delta.unsigned_abs().cmp(&p.delta.unsigned_abs()).then(p.call_site.cmp(&q.call_site)));
    out.truncate(SITES);
    out
}

fn categories(a: &DeviceAnalysis, b: &DeviceAnalysis) -> BTreeMap<String, Pair> {
    let (ka, kb) = (key_breakdown(a), key_breakdown(b));
    let mut out = BTreeMap::new();
    for c in super::categories::Category::ALL {
        let get = |k: Option<&super::breakdown::Breakdown>| k.and_then(|k| k.categories.get(&c)).copied().unwrap_or(0);
        let (x, y) = (get(ka), get(kb));
        if x > 0 || y > 0 {
            out.insert(c.as_str().to_string(), Pair::new(x, y));
        }
    }
    out
}

fn settings(a: Option<&serde_json::Value>, b: Option<&serde_json::Value>) -> SettingsComparison {
    let keys = |v: Option<&serde_json::Value>| -> BTreeMap<String, serde_json::Value> {
        v.and_then(|v| v.as_object())
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let (ka, kb) = (keys(a), keys(b));
    let all: BTreeSet<&String> = ka.keys().chain(kb.keys()).collect();
    let changed = all.into_iter().filter(|k| ka.get(*k) != kb.get(*k)).cloned().collect();
    SettingsComparison { a: a.cloned(), b: b.cloned(), changed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changed_settings_are_the_keys_that_differ_or_are_missing() {
        let a = json!({"expandable_segments": false, "max_split_size": -1});
        let b = json!({"expandable_segments": true, "max_split_size": -1, "new": 1});
        let s = settings(Some(&a), Some(&b));
        assert_eq!(s.changed, vec!["expandable_segments".to_string(), "new".to_string()]);
        assert!(settings(None, None).changed.is_empty());
    }

    #[test]
    fn a_pair_s_delta_is_signed() {
        assert_eq!(Pair::new(10, 4).delta, -6);
        assert_eq!(Pair::new(4, 10).delta, 6);
    }
}
