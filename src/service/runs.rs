//! Runs (one job's ranks), comparisons of two snapshots, and memory curves of several
//! snapshots on one x axis: what the run and compare pages and routes are made of.

use serde::Serialize;

use super::{Service, ServiceError};
use crate::analysis::compare::{Comparison, compare};
use crate::analysis::divergence::{Divergence, Picked, divergence};
use crate::analysis::summary::{RunSummary, Summary, main_device};
use crate::store::{RunRow, SnapshotRow, Status};

/// One rank of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RankView {
    pub rank: i64,
    pub snapshot_id: String,
    pub name: String,
    pub page_url: String,
    pub status: Status,
    pub peak_reserved_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub oom: Option<bool>,
    pub verdict: Option<String>,
    pub pinned_free_bytes: Option<u64>,
    pub largest_category: Option<String>,
    /// Bytes by category when it mattered (the first OOM, else the peak).
    pub categories: std::collections::BTreeMap<String, u64>,
    /// Why the analysis failed, if it did.
    pub error: Option<String>,
}

/// A run: its ranks and what they add up to (`GET /api/v1/runs/{id}`).
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub id: String,
    /// The run key the uploads gave (a job id).
    pub name: String,
    pub page_url: String,
    pub created_at: i64,
    pub ranks: Vec<RankView>,
    /// Uploads that named a rank another upload already held: listed, not counted. The first
    /// upload of a rank keeps it until it is deleted.
    pub later_uploads: Vec<RankView>,
    pub summary: RunSummary,
}

/// The memory curves of several snapshots on one x axis.
pub struct Curves {
    pub points: usize,
    /// Per snapshot: the bucket maxima of reserved and of allocated bytes (None: not ready).
    pub curves: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    /// The x axis: by step (`Some(steps)`, the most any snapshot ran; each point is
    /// `steps / points` of a step, and a snapshot that stopped sooner is NaN past its end), or
    /// the share of each one's events (None).
    pub steps: Option<u32>,
}

impl Curves {
    /// Little-endian: u32 curves, u32 points, then per curve `points` f32 of reserved bytes
    /// and `points` of allocated (NaN for a snapshot not ready, or past its end by step).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.curves.len() * self.points * 8);
        out.extend((self.curves.len() as u32).to_le_bytes());
        out.extend((self.points as u32).to_le_bytes());
        for c in &self.curves {
            for s in 0..2 {
                for i in 0..self.points {
                    let v = c.as_ref().map(|(r, a)| if s == 0 { r[i] } else { a[i] }).unwrap_or(f32::NAN);
                    out.extend(v.to_le_bytes());
                }
            }
        }
        out
    }
}

/// The most snapshots one curves request may draw.
pub const MAX_CURVES: usize = 256;

/// The most ranks a run may name: far past any job, small enough that a rank number is a
/// place in a list and not a key a stranger picks.
pub const MAX_RANK: i64 = 65_535;

/// Uploads with the rank each holds (or named).
type Ranked = Vec<(i64, SnapshotRow)>;

/// A run's uploads (in the order they arrived) by the rank they hold: each rank's first
/// upload, then uploads without a rank in the lowest ranks no upload named, in upload order.
/// A later upload naming a rank already held does not replace it (a stranger who knows the
/// job id could otherwise swap a rank's snapshot): it is returned apart, with the rank it named.
fn by_rank(rows: Vec<SnapshotRow>) -> (Ranked, Ranked) {
    let named: std::collections::BTreeSet<i64> = rows.iter().filter_map(|r| r.rank).collect();
    let mut free = (0..).filter(|r| !named.contains(r));
    let (mut held, mut later): (Ranked, Ranked) = (Vec::new(), Vec::new());
    let mut taken = std::collections::BTreeSet::new();
    for row in rows {
        let rank = match row.rank {
            Some(r) => r,
            None => free.next().unwrap_or(i64::MAX),
        };
        if taken.insert(rank) { held.push((rank, row)) } else { later.push((rank, row)) }
    }
    held.sort_by_key(|(r, _)| *r);
    (held, later)
}

fn rank_view(rank: i64, row: &SnapshotRow) -> RankView {
    let s = row.summary.as_ref();
    RankView {
        rank,
        snapshot_id: row.id.clone(),
        name: row.name.clone(),
        page_url: format!("/s/{}", row.id),
        status: row.status,
        peak_reserved_bytes: s.map(|s| s.peak_reserved_bytes),
        peak_allocated_bytes: s.map(|s| s.peak_allocated_bytes),
        oom: s.map(|s| s.oom),
        verdict: row.verdict.clone(),
        pinned_free_bytes: s.map(|s| s.pinned_free_bytes),
        largest_category: s.and_then(|s| s.largest_category.clone()),
        categories: s.map(|s| s.categories.clone()).unwrap_or_default(),
        error: row.error.clone(),
    }
}

impl Service {
    /// A ready snapshot's summary, computed from its analysis (and kept) when the analysis
    /// was stored before summaries were.
    async fn with_summary(&self, mut row: SnapshotRow) -> SnapshotRow {
        if row.status == Status::Ready
            && row.summary.is_none()
            && let Ok(a) = self.analysis(&row).await
            && let Some(s) = Summary::of(&a)
        {
            let _ = self.store.meta.set_summary(&row.sha256, &s).await;
            row.summary = Some(s);
        }
        row
    }

    /// A run with each rank's numbers and why its OOM rank differs.
    pub async fn run(&self, run: RunRow) -> Result<RunView, ServiceError> {
        self.run_view(run, true).await
    }

    async fn run_view(&self, run: RunRow, explain: bool) -> Result<RunView, ServiceError> {
        let mut rows = Vec::new();
        for row in self.store.meta.run_snapshots(&run.id).await? {
            rows.push(self.with_summary(row).await);
        }
        let (ranks, later) = by_rank(rows);
        let summaries: Vec<(i64, Option<&Summary>)> = ranks.iter().map(|(r, row)| (*r, row.summary.as_ref())).collect();
        let mut summary = RunSummary::of(&summaries);
        if explain && let Some((rank, picked, median)) = summary.to_explain(&summaries) {
            summary.divergence = self.divergence(&ranks, rank, picked, median).await;
        }
        Ok(RunView {
            page_url: format!("/r/{}", run.id),
            id: run.id,
            name: run.key,
            created_at: run.created_at,
            ranks: ranks.iter().map(|(r, row)| rank_view(*r, row)).collect(),
            later_uploads: later.iter().map(|(r, row)| rank_view(*r, row)).collect(),
            summary,
        })
    }

    /// What `rank` held more than `median` (None when an analysis cannot be read: the run
    /// view still shows its ranks).
    async fn divergence(&self, ranks: &Ranked, rank: i64, picked: Picked, median: i64) -> Option<Divergence> {
        let row = |r: i64| ranks.iter().find(|(x, _)| *x == r).map(|(_, row)| row);
        let (a, m) = (row(rank)?, row(median)?);
        let (da, dm) = (self.analysis(a).await.ok()?, self.analysis(m).await.ok()?);
        let mut d = divergence(rank, picked, main_device(&da)?, median, main_device(&dm)?)?;
        d.compare_url = format!("/compare/{}/{}", m.id, a.id);
        Some(d)
    }

    /// Runs, newest first (without each one's divergence: a list does not read analyses).
    pub async fn runs(&self, limit: u32, offset: u32) -> Result<Vec<RunView>, ServiceError> {
        let mut out = Vec::new();
        for run in self.store.meta.runs(limit, offset).await? {
            out.push(self.run_view(run, false).await?);
        }
        Ok(out)
    }

    /// Deletes a run and its snapshots; false when there was none.
    pub async fn delete_run(&self, id: &str) -> Result<bool, ServiceError> {
        let Some(deleted) = self.store.delete_run(id).await? else { return Ok(false) };
        for d in deleted.iter().filter(|d| d.last) {
            self.loaded.remove(&d.sha256);
        }
        Ok(true)
    }

    /// Compares two ready snapshots (`a` before, `b` after).
    pub async fn compare(&self, a: &SnapshotRow, b: &SnapshotRow) -> Result<Comparison, ServiceError> {
        let (a, b) = (self.analysis(a).await?, self.analysis(b).await?);
        Ok(compare(&a, &b))
    }

    /// Each snapshot's reserved and allocated bytes over its events, in `points` buckets: of
    /// the steps when `by_step` and every ready snapshot has steps (so that a run that died in
    /// step 2 is not stretched over one that ran 16), else of the share of its events gone by.
    pub async fn curves(&self, rows: &[SnapshotRow], points: usize, by_step: bool) -> Result<Curves, ServiceError> {
        let mut series = Vec::with_capacity(rows.len());
        for row in rows {
            series.push(self.series(row, points, by_step).await?);
        }
        // By step only when every ready snapshot has steps (and one is ready).
        let ready = || series.iter().flatten();
        let by_step = by_step && ready().next().is_some() && ready().all(|(_, steps)| !steps.is_empty());
        let most = by_step.then(|| ready().map(|(_, steps)| steps.len()).max().unwrap_or(0) as u32);
        let curves = series
            .iter()
            .map(|s| {
                s.as_ref().map(|(d, steps)| match most {
                    Some(most) => resample(d, points, |e| at_step(steps, e) / most as f64, true),
                    None => {
                        let total = (d.end - d.start).max(1) as f64;
                        resample(d, points, |e| (e - d.start) as f64 / total, false)
                    }
                })
            })
            .collect();
        Ok(Curves { points, curves, steps: most })
    }

    /// A ready snapshot's timeline in `points` buckets and, `by_step`, its steps' event ranges
    /// (read from its analysis only then). None: not ready, or gone.
    async fn series(
        &self,
        row: &SnapshotRow,
        points: usize,
        by_step: bool,
    ) -> Result<Option<(crate::analysis::timeline::Downsampled, Vec<(u64, u64)>)>, ServiceError> {
        if row.status != Status::Ready {
            return Ok(None);
        }
        let row = self.with_summary(row.clone()).await;
        let device = row.summary.as_ref().map(|s| s.device).unwrap_or(0);
        let d = match self.timeline(&row, device, None, None, points).await {
            Ok(d) => d,
            Err(ServiceError::Missing(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !by_step {
            return Ok(Some((d, Vec::new())));
        }
        let steps = match self.analysis(&row).await {
            Ok(a) => a
                .devices
                .iter()
                .find(|x| x.device == device)
                // Steps past the cap are not listed: such a run is drawn by the share of events.
                .filter(|x| x.memory.steps_total == 0)
                .map(|x| x.memory.steps.iter().map(|s| (s.first_event, s.last_event)).collect())
                .unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        Ok(Some((d, steps)))
    }
}

/// Where event `e` falls in steps: step `i` spans `[i, i + 1)`; before the first step is 0,
/// between two steps the end of the earlier, after the last the number of steps.
fn at_step(steps: &[(u64, u64)], e: u64) -> f64 {
    let i = steps.partition_point(|(first, _)| *first <= e);
    if i == 0 {
        return 0.0;
    }
    let (first, last) = steps[i - 1];
    if e > last {
        return i as f64;
    }
    (i - 1) as f64 + (e - first) as f64 / (last - first + 1) as f64
}

/// Buckets by event onto `points` equal parts of `x(event)` in `[0, 1]`: each part takes the
/// largest bucket that starts in it, and an empty part repeats the one before; with `ends`,
/// parts past the last bucket stay NaN (the run stopped there).
fn resample(
    d: &crate::analysis::timeline::Downsampled,
    points: usize,
    x: impl Fn(u64) -> f64,
    ends: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (mut reserved, mut allocated) = (vec![f32::NAN; points], vec![f32::NAN; points]);
    let mut last = 0;
    for (i, e) in d.event.iter().enumerate() {
        let j = ((x(*e) * points as f64) as usize).min(points - 1);
        last = last.max(j);
        let (r, a) = (d.max[0][i] as f32, d.max[1][i] as f32);
        reserved[j] = if reserved[j].is_nan() { r } else { reserved[j].max(r) };
        allocated[j] = if allocated[j].is_nan() { a } else { allocated[j].max(a) };
    }
    let fill = if ends { last + 1 } else { points };
    for j in 1..fill {
        if reserved[j].is_nan() {
            (reserved[j], allocated[j]) = (reserved[j - 1], allocated[j - 1]);
        }
    }
    (reserved, allocated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, rank: Option<i64>, created_at: i64) -> SnapshotRow {
        SnapshotRow {
            id: id.into(),
            sha256: String::new(),
            name: id.into(),
            note: String::new(),
            bytes: 1,
            status: Status::Ready,
            error: None,
            verdict: None,
            created_at,
            run_id: None,
            rank,
            summary: None,
        }
    }

    #[test]
    fn a_rank_keeps_its_first_upload_and_a_later_one_is_set_apart() {
        let rows = vec![row("a", Some(1), 1), row("b", Some(0), 2), row("c", Some(1), 3), row("d", None, 4)];
        let (held, later) = by_rank(rows);
        let ids = |v: Vec<(i64, SnapshotRow)>| v.into_iter().map(|(r, row)| (r, row.id)).collect::<Vec<_>>();
        assert_eq!(ids(held), vec![(0, "b".to_string()), (1, "a".to_string()), (2, "d".to_string())]);
        assert_eq!(ids(later), vec![(1, "c".to_string())]);
    }

    #[test]
    fn uploads_without_a_rank_take_the_lowest_free_ranks() {
        let rows = vec![row("a", Some(65_535), 1), row("b", None, 2), row("c", Some(1), 3), row("d", None, 4)];
        let (held, _) = by_rank(rows);
        let got: Vec<(i64, String)> = held.into_iter().map(|(r, row)| (r, row.id)).collect();
        let want = [(0, "b"), (1, "c"), (2, "d"), (65_535, "a")];
        assert_eq!(got, want.map(|(r, id)| (r, id.to_string())));
    }

    #[test]
    fn curves_are_resampled_onto_shares_of_the_events() {
        let d = crate::analysis::timeline::Downsampled {
            start: 0,
            end: 4,
            event: vec![0, 1, 2, 3],
            time_us: vec![0; 4],
            min: Default::default(),
            max: [vec![1, 5, 2, 7], vec![1, 2, 3, 4], vec![], vec![], vec![]],
        };
        let share = |e: u64| e as f64 / 4.0;
        let (r, a) = resample(&d, 8, share, false);
        assert_eq!(r, vec![1.0, 1.0, 5.0, 5.0, 2.0, 2.0, 7.0, 7.0]);
        assert_eq!(a[7], 4.0);
        let (r, _) = resample(&d, 2, share, false);
        assert_eq!(r, vec![5.0, 7.0]);
        // By step, a run that stopped halfway leaves the rest of the axis empty.
        let (r, _) = resample(&d, 8, |e| e as f64 / 8.0, true);
        assert_eq!(&r[..4], &[1.0, 5.0, 2.0, 7.0]);
        assert!(r[4..].iter().all(|v| v.is_nan()), "{r:?}");
    }

    #[test]
    fn events_fall_in_their_step() {
        let steps = [(10, 19), (20, 29), (40, 49)];
        assert_eq!(at_step(&steps, 3), 0.0, "before the first step");
        assert_eq!(at_step(&steps, 15), 0.5);
        assert_eq!(at_step(&steps, 20), 1.0);
        assert_eq!(at_step(&steps, 35), 2.0, "between steps: the end of the earlier");
        assert_eq!(at_step(&steps, 45), 2.5);
        assert_eq!(at_step(&steps, 99), 3.0, "after the last");
    }
}
