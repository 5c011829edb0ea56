//! Whether a second thread would get a core of its own now, measured rather than inferred from
//! the core count: two cores may be one core's two hyperthreads, or one of them may be busy
//! with another process, and then work split over two threads takes longer than on one (a big
//! file read in two parts took 0.55 s against 0.50 in one, with the other core busy; 0.40
//! against 0.45 with it idle).
//!
//! Two measures, since neither sees both: the kernel's count of tasks running now (a busy core
//! shares its time in slices of a few milliseconds, longer than a probe that costs little can
//! watch), and the pace a second thread keeps beside this one (two hyperthreads of one core
//! each run at a fraction of a core's pace, and no count shows it).

use std::time::{Duration, Instant};

/// How long each half of the probe counts.
const SPAN: Duration = Duration::from_millis(2);

/// The share (percent) of its lone pace the second thread must keep beside the first.
const FREE_SHARE: u32 = 75;

/// What a probe measured.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// Percent of this thread's lone pace that a second thread kept while both counted.
    pub second_share: u32,
    /// Percent of its lone pace that this thread kept meanwhile.
    pub first_share: u32,
    /// Tasks the kernel had running or ready to run, besides this thread, when probed (the
    /// least of three reads of `/proc/loadavg`; None where there is none).
    pub others_running: Option<u32>,
    /// CPUs the kernel has online.
    pub cpus_online: u32,
}

impl Probe {
    /// Whether another CPU was idle and both threads kept most of their lone pace: a second
    /// core is free.
    pub fn second_core_free(&self) -> bool {
        let idle_cpu = self.others_running.is_none_or(|n| n + 1 < self.cpus_online);
        idle_cpu && self.second_share >= FREE_SHARE && self.first_share >= FREE_SHARE
    }
}

/// Probes taken at most before a second core is called busy.
const PROBES: usize = 3;

/// Whether a second core is free now: free if any of up to [`PROBES`] probes finds it so.
///
/// One probe's 2 ms windows are upset by anything that takes a slice of either core meanwhile
/// (a kernel thread, a timer): on a 2-core VM with both cores idle, one big_trace read in ten
/// or more was called busy and read in one part, 0.60 s instead of 0.38. The opposite mistake
/// costs far less (two parts on a core another process keeps busy: 0.55 s against 0.50 in one
/// part), and a core that is truly busy fails every probe, at 5 ms each.
pub fn second_core_free() -> bool {
    free_after(&probe())
}

/// [`second_core_free`], `first` being its first probe (the bench prints what it measured).
pub fn free_after(first: &Probe) -> bool {
    first.second_core_free() || (1..PROBES).any(|_| probe().second_core_free())
}

/// Counts through a fixed work loop for [`SPAN`] on this thread alone, then on this thread and
/// a new one at once (about 5 ms in all).
pub fn probe() -> Probe {
    let cpus_online = cpus_online();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Probe { second_share: 0, first_share: 100, others_running: None, cpus_online };
    }
    let before = others_running();
    count_for(SPAN / 4); // the clock ramps up
    let alone = count_for(SPAN).max(1);
    let after = others_running();
    let start = std::sync::Barrier::new(2);
    let (first, second) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            start.wait();
            count_for(SPAN)
        });
        start.wait();
        let first = count_for(SPAN);
        (first, other.join().unwrap_or(0))
    });
    let share = |n: u64| u32::try_from(n.saturating_mul(100) / alone).unwrap_or(u32::MAX);
    let last = others_running();
    let others_running = [before, after, last].into_iter().flatten().min();
    Probe { second_share: share(second), first_share: share(first), others_running, cpus_online }
}

/// Tasks running or runnable now, besides the reading thread: `/proc/loadavg`'s fourth field
/// is `running/total`, counted over the whole system (a container without its own view of
/// `/proc` sees the host's; its online CPUs are then the host's too).
fn others_running() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running = text.split_whitespace().nth(3)?.split('/').next()?.parse::<u32>().ok()?;
    Some(running.saturating_sub(1))
}

/// The CPUs the kernel runs tasks on: all of them, not this process's share.
fn cpus_online() -> u32 {
    #[cfg(unix)]
    // SAFETY: sysconf reads a configuration value and changes nothing.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    #[cfg(not(unix))]
    let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
    u32::try_from(n).unwrap_or(1).max(1)
}

/// Rounds of a small integer loop done in `span`, counted in rounds of 1024 steps.
fn count_for(span: Duration) -> u64 {
    let until = Instant::now() + span;
    let (mut rounds, mut x) = (0u64, 0x9e37_79b9_7f4a_7c15u64);
    while Instant::now() < until {
        for _ in 0..1024 {
            // xorshift: dependent integer steps, no memory traffic.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        rounds += 1;
    }
    std::hint::black_box(x);
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shares are measured against the lone pace, and the verdict follows them.
    #[test]
    fn a_probe_reports_both_shares() {
        let p = probe();
        assert!(p.first_share > 0, "{p:?}");
        assert!(p.cpus_online >= 1);
        let free = Probe { second_share: 95, first_share: 98, others_running: Some(0), cpus_online: 2 };
        assert!(free.second_core_free());
        assert!(!Probe { second_share: 50, ..free }.second_core_free(), "a hyperthread's pace");
        assert!(!Probe { others_running: Some(1), ..free }.second_core_free(), "the other CPU is busy");
        assert!(Probe { others_running: Some(1), cpus_online: 4, ..free }.second_core_free());
        assert!(Probe { others_running: None, ..free }.second_core_free(), "no count: the pace decides");
        assert!(free_after(&free), "a first probe that finds the core free settles it");
    }
}
