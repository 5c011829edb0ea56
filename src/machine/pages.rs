//! The process's memory pages: faulting them in ahead of a writer, and the allocator's tuning.
//! Every call here that changes the whole process (glibc's `mallopt`) is in this file, so a
//! reader sees them together; the callers say why they need them.

/// The kernel's page size on the machines we run on.
const PAGE: usize = 4096;

/// Faults in the whole pages of `start..end` (addresses) that are not mapped yet, as zeros,
/// with `MADV_POPULATE_WRITE`: the first write to each page of fresh memory costs a fault and
/// a page of zeros, which another thread can pay ahead of the writer. It reads and writes no
/// value and leaves pages already written alone, so a thread writing the same memory meanwhile
/// is no race; a range no longer mapped fails, one the allocator has reused only maps a page of
/// it. Where the kernel lacks it (before Linux 5.14) it fails and nothing happens.
pub(crate) fn populate_write(range: std::ops::Range<usize>) {
    let (start, end) = (range.start.next_multiple_of(PAGE), range.end / PAGE * PAGE);
    #[cfg(target_os = "linux")]
    if end > start {
        // SAFETY: see above: the call maps pages and changes no memory Rust sees.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, end);
}

/// The process's peak resident memory so far in MiB (`VmHWM`), for the debug log: where in a
/// run the peak the benches judge is reached. None where there is no `/proc`.
pub(crate) fn peak_resident_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib >> 10)
}

/// Blocks of at least this many bytes go back to the system when freed, from now on in this
/// process (glibc's mmap threshold, which otherwise rises to the size of each block freed).
pub(crate) fn return_blocks_from(bytes: usize) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    mallopt_once(&ONCE, Tuning::MmapThreshold, bytes);
}

/// The heap grows by at least this many bytes more than asked, from now on in this process
/// (glibc's top pad; freed memory up to that much stays with the process).
pub(crate) fn grow_heap_by(bytes: usize) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    mallopt_once(&ONCE, Tuning::TopPad, bytes);
}

/// The glibc tuning parameters we set.
#[derive(Clone, Copy)]
enum Tuning {
    MmapThreshold,
    TopPad,
}

/// Sets one of glibc's tuning parameters, the first time only; elsewhere nothing.
fn mallopt_once(once: &'static std::sync::Once, tuning: Tuning, bytes: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let param = match tuning {
            Tuning::MmapThreshold => libc::M_MMAP_THRESHOLD,
            Tuning::TopPad => libc::M_TOP_PAD,
        };
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a tuning parameter of the allocator.
        once.call_once(|| unsafe {
            libc::mallopt(param, value);
        });
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (once, tuning, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Populating a buffer's spare capacity while another thread fills it changes no value,
    /// and a range of less than a page is left alone.
    #[test]
    fn populating_ahead_of_a_writer_changes_no_value() {
        let n = 1 << 20;
        let mut v: Vec<u64> = Vec::with_capacity(n);
        let base = v.as_ptr() as usize;
        std::thread::scope(|scope| {
            scope.spawn(move || {
                populate_write(base + 10..base + 100);
                for k in 0..8 {
                    populate_write(base + k * n..base + (k + 1) * n);
                }
            });
            v.extend((0..n as u64).map(|i| i ^ 0x5555));
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 ^ 0x5555));
        assert_eq!(v.as_ptr() as usize, base, "filled in place");
    }
}
