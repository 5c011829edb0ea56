//! What a platform team scrapes: counters kept as the server works, and gauges read from the
//! store when asked, rendered in the Prometheus text format (`GET /metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters since the process started.
#[derive(Default)]
pub struct Counters {
    pub uploads: AtomicU64,
    pub uploads_refused: AtomicU64,
    pub analyses_ready: AtomicU64,
    pub analyses_failed: AtomicU64,
    /// Analyses that used the parse made while the upload arrived (see `early`).
    pub analyses_early: AtomicU64,
    /// Microseconds spent in analyses, for the mean duration.
    pub analysis_micros: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The gauges read when scraped.
pub struct Gauges {
    /// Snapshots (uploads) by status name.
    pub by_status: Vec<(String, u64)>,
    /// Bytes of distinct uploads stored.
    pub stored_bytes: u64,
    /// Runs.
    pub runs: u64,
    /// Bytes of the analysis budget free now.
    pub budget_free_bytes: u64,
    /// Analyses waiting in the queue (all replicas).
    pub queued: u64,
    /// Analyses held under a live lease (all replicas).
    pub running: u64,
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP fragscope_{name} {help}\n# TYPE fragscope_{name} {kind}");
    for (labels, v) in samples {
        let _ = writeln!(out, "fragscope_{name}{labels} {v}");
    }
}

/// The Prometheus text exposition of both.
pub fn render(c: &Counters, g: &Gauges) -> String {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut out = String::new();
    metric(&mut out, "uploads_total", "counter", "Uploads accepted.", &[("", get(&c.uploads))]);
    metric(&mut out, "uploads_refused_total", "counter", "Uploads refused (4xx).", &[("", get(&c.uploads_refused))]);
    let (ready, failed) = (get(&c.analyses_ready), get(&c.analyses_failed));
    metric(
        &mut out,
        "analyses_total",
        "counter",
        "Analyses finished, by outcome.",
        &[("{outcome=\"ready\"}", ready), ("{outcome=\"failed\"}", failed)],
    );
    metric(
        &mut out,
        "analyses_parsed_while_arriving_total",
        "counter",
        "Analyses made from the parse that ran while the upload arrived.",
        &[("", get(&c.analyses_early))],
    );
    let _ = writeln!(
        out,
        "# HELP fragscope_analysis_seconds Time analyses took.\n# TYPE fragscope_analysis_seconds summary\n\
         fragscope_analysis_seconds_sum {:.6}\nfragscope_analysis_seconds_count {}",
        get(&c.analysis_micros) as f64 / 1e6,
        ready + failed
    );
    let labels: Vec<String> = g.by_status.iter().map(|(s, _)| format!("{{status=\"{s}\"}}")).collect();
    let samples: Vec<(&str, u64)> = labels.iter().zip(&g.by_status).map(|(l, (_, n))| (l.as_str(), *n)).collect();
    metric(&mut out, "snapshots", "gauge", "Snapshots by analysis status.", &samples);
    metric(&mut out, "analyses_queued", "gauge", "Analyses waiting, on every replica.", &[("", g.queued)]);
    metric(&mut out, "analyses_running", "gauge", "Analyses running, on every replica.", &[("", g.running)]);
    metric(&mut out, "stored_bytes", "gauge", "Bytes of distinct uploads stored.", &[("", g.stored_bytes)]);
    metric(&mut out, "runs", "gauge", "Runs (jobs of many ranks).", &[("", g.runs)]);
    metric(
        &mut out,
        "analysis_budget_free_bytes",
        "gauge",
        "Analysis memory budget free now.",
        &[("", g.budget_free_bytes)],
    );
    metric(
        &mut out,
        "cache_hits_total",
        "counter",
        "Queries served from a parsed snapshot in memory.",
        &[("", get(&c.cache_hits))],
    );
    metric(
        &mut out,
        "cache_misses_total",
        "counter",
        "Queries that parsed a snapshot again.",
        &[("", get(&c.cache_misses))],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_help_type_and_labelled_samples() {
        let c = Counters::default();
        Counters::add(&c.uploads, 3);
        Counters::add(&c.analyses_ready, 2);
        Counters::add(&c.analysis_micros, 1_500_000);
        let g = Gauges {
            by_status: vec![("ready".into(), 2)],
            stored_bytes: 10,
            runs: 1,
            budget_free_bytes: 5,
            queued: 4,
            running: 1,
        };
        let text = render(&c, &g);
        assert!(text.contains("# TYPE fragscope_uploads_total counter\nfragscope_uploads_total 3\n"), "{text}");
        assert!(text.contains("fragscope_analyses_total{outcome=\"ready\"} 2\n"), "{text}");
        assert!(
            text.contains("fragscope_analysis_seconds_sum 1.500000\nfragscope_analysis_seconds_count 2\n"),
            "{text}"
        );
        assert!(text.contains("fragscope_snapshots{status=\"ready\"} 2\n"), "{text}");
        assert!(
            text.contains("fragscope_analyses_queued 4\nfragscope_analyses_running 1\n")
                || text.contains("fragscope_analyses_queued 4\n"),
            "{text}"
        );
    }
}
