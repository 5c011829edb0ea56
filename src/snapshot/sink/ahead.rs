//! Faults in the pages of the event and time columns a little ahead of the sink, on a thread
//! of its own.
//!
//! Every first write to a fresh page is a fault and a page of zeros: for big_trace's 84 MB of
//! events and times, 20,000 faults, a tenth of the read's time on its core, while the other
//! core is half idle (the hash beside the read takes the rest). [`crate::machine::pages::populate_write`]
//! changes no value, so the sink writing the same column meanwhile is no race, and a range the
//! column has left (it grew and moved) costs at most a page of memory. Only `STEP` items ahead
//! are faulted, so the column's spare capacity stays out of memory as before.

use std::sync::mpsc;

/// Events between two requests, and how far ahead each reaches.
pub(super) const STEP: usize = 8192;
/// Columns shorter than this are not worth a thread.
const FROM: usize = 1 << 16;

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
        let start = base + (column.len() + STEP) * size;
        let end = base + (column.len() + 2 * STEP).min(column.capacity()) * size;
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
        crate::machine::pages::populate_write(r);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// As the sink calls it: a request at every `STEP` items. Past `FROM` items a thread
    /// starts (on Linux), and the column's values are the ones pushed, however it grew.
    #[test]
    fn a_column_faulted_in_ahead_keeps_its_values() {
        let mut ahead = Ahead::default();
        let mut column: Vec<u64> = Vec::new();
        let n = 5 * FROM + 123;
        for i in 0..n as u64 {
            column.push(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            if column.len().is_multiple_of(STEP) {
                ahead.request(&column);
            }
            if column.len() == FROM - 1 {
                assert!(ahead.thread.is_none(), "no thread for a short column");
            }
        }
        assert_eq!(ahead.thread.is_some(), cfg!(target_os = "linux"));
        drop(ahead);
        assert!(column.iter().enumerate().all(|(i, &v)| v == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    }
}
