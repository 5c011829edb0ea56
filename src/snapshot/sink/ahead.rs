//! Faults in the pages of the event and time columns a little ahead of the sink, on a thread
//! of its own.
//!
//! Every first write to a fresh page is a fault and a page of zeros: for big_trace's 84 MB of
//! events and times, 20,000 faults, a tenth of the read's time on its core, while the other core is
//! half idle (the hash beside the read takes the rest). `MADV_POPULATE_WRITE` maps the pages
//! that are not mapped yet, as zeros, and leaves those already written alone; it reads and
//! writes no value, so the sink writing the same column meanwhile is no race. A range the
//! column has left (it grew and moved) fails or maps a page the allocator holds: nothing
//! changes but a page of memory. Only `STEP` events ahead are faulted, so the column's spare
//! capacity stays out of memory as before. Where the kernel lacks it (before Linux 5.14) the
//! call fails and nothing happens.

use std::sync::mpsc;

/// Events between two requests, and how far ahead each reaches.
pub(super) const STEP: usize = 8192;
/// Columns shorter than this are not worth a thread.
const FROM: usize = 1 << 16;
const PAGE: usize = 4096;

#[derive(Default)]
pub(super) struct Ahead {
    requests: Option<mpsc::Sender<std::ops::Range<usize>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ahead {
    /// Called when a column's length is a multiple of `STEP`: asks for the pages of the
    /// `STEP` items after the next `STEP`, within its capacity.
    #[cold]
    pub(super) fn request<T>(&mut self, column: &Vec<T>) {
        if !cfg!(target_os = "linux") || column.len() < FROM {
            return;
        }
        let size = std::mem::size_of::<T>();
        let base = column.as_ptr() as usize;
        let start = (base + (column.len() + STEP) * size).next_multiple_of(PAGE);
        let end = (base + (column.len() + 2 * STEP).min(column.capacity()) * size) / PAGE * PAGE;
        if end <= start {
            return;
        }
        if self.requests.is_none() {
            let (tx, rx) = mpsc::channel::<std::ops::Range<usize>>();
            self.thread = std::thread::Builder::new().name("fault ahead".into()).spawn(move || fault_in(rx)).ok();
            self.requests = self.thread.is_some().then_some(tx);
        }
        if let Some(tx) = &self.requests {
            let _ = tx.send(start..end);
        }
    }
}

fn fault_in(rx: mpsc::Receiver<std::ops::Range<usize>>) {
    for r in rx {
        #[cfg(target_os = "linux")]
        // SAFETY: see the module comment: the call maps pages and changes no memory Rust sees.
        unsafe {
            libc::madvise(r.start as *mut libc::c_void, r.end - r.start, libc::MADV_POPULATE_WRITE);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = r;
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
