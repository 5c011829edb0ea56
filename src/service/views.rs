//! What a page or a notebook asks of one analysed snapshot beyond its stored analysis: the
//! segment map, breakdown, icicle and pinners at an event, a page of events, a stack's frames,
//! live bytes by call site or category, and a what-if replay. Each is computed on the parsed
//! snapshot (parsed again if it is not held) off the async threads: replaying and aggregating
//! are CPU work. The end of a device, stored at analysis time, is read from the store; the
//! chart of active memory a page opens first is made once the snapshot is ready (`loaded`).

use serde::Serialize;

use crate::analysis::breakdown::Breakdown;
use crate::analysis::flame::Flame;
use crate::analysis::{gaps, map};
use crate::snapshot::{Device, sites};

use super::loaded::Entry;
use super::{Service, ServiceError, SnapshotRow};

/// Who pins free memory right after an event, as `/pinners?event=N` answers.
#[derive(Debug, Serialize)]
pub struct PinnersAt {
    /// The CUDA device index.
    pub device: i64,
    /// The event.
    pub event: u64,
    /// Bytes and gaps pinned.
    pub pinned: gaps::PinnedSummary,
    /// The blocks that pin them, by call site.
    pub pinners: Vec<gaps::Pinner>,
    /// The 20 largest pinned gaps.
    pub gaps: Vec<gaps::Gap>,
}

/// A page of a device's trace events.
#[derive(Debug, Serialize)]
pub(crate) struct EventsPage {
    /// The CUDA device index.
    pub device: i64,
    /// Events the device's trace holds.
    pub total: usize,
    /// The first event of the page.
    pub start: u64,
    /// The page.
    pub events: Vec<map::EventInfo>,
    /// Where the next page starts; None after the last.
    pub next_start: Option<u64>,
}

/// A stack's frames and the call site it is shown by.
#[derive(Debug, Serialize)]
pub(crate) struct StackFrames {
    /// The stack's id (from segment maps and events).
    pub stack: u32,
    /// The frame it is shown by.
    pub call_site: Option<sites::CallSite>,
    /// Innermost first.
    pub frames: Vec<sites::CallSite>,
}

/// How live bytes are grouped over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveBy {
    /// By the call site that made each block.
    Site,
    /// By category (activation, parameter, ...).
    Category,
}

/// Which events live bytes are shown over, and how finely.
#[derive(Debug, Clone, Copy)]
pub struct ActiveQuery {
    /// First event (default 0).
    pub start: Option<usize>,
    /// One past the last event (default: the device's last).
    pub end: Option<usize>,
    /// Buckets at most.
    pub points: usize,
    /// Groups shown by name; the rest are summed.
    pub top: usize,
    /// Grouped by site or by category.
    pub by: ActiveBy,
}

impl Service {
    /// Runs `f` on one device of the parsed snapshot, off the async threads.
    async fn on_device<T: Send + 'static>(
        &self,
        row: &SnapshotRow,
        device: i64,
        f: impl FnOnce(&Entry, usize, &Device) -> Result<T, ServiceError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        let entry = self.entry(row).await?;
        tokio::task::spawn_blocking(move || {
            let (i, d) = entry.device(device).ok_or(ServiceError::Missing("device"))?;
            f(&entry, i, d)
        })
        .await
        .map_err(|e| ServiceError::internal("working on a parsed snapshot")(e.into()))?
    }

    /// The segments and blocks of a device right after `event` (None: the end), as JSON: the
    /// end and the first OOMs as stored at analysis time, any other event made now.
    pub async fn segment_map(
        &self,
        row: &SnapshotRow,
        device: i64,
        event: Option<u64>,
    ) -> Result<Vec<u8>, ServiceError> {
        if let Some(stored) = self.stored_map(&row.sha256, device, event) {
            return Ok(stored);
        }
        self.on_device(row, device, move |entry, i, d| {
            check_event(entry, d, event)?;
            serde_json::to_vec(&entry.segment_map(i, event))
                .map_err(|e| ServiceError::internal("writing a segment map")(e.into()))
        })
        .await
    }

    /// What fills a device's memory right after `event` (None: the end, as stored).
    pub async fn breakdown(
        &self,
        row: &SnapshotRow,
        device: i64,
        event: Option<u64>,
    ) -> Result<Breakdown, ServiceError> {
        if event.is_none()
            && let Some(end) = self.final_breakdown(row, device).await?
        {
            return Ok(end);
        }
        self.on_device(row, device, move |entry, i, d| {
            check_event(entry, d, event)?;
            Ok(entry.breakdown(i, event))
        })
        .await
    }

    /// A device's live memory right after `event` (None: the end) by the stacks that made it.
    pub async fn flame(&self, row: &SnapshotRow, device: i64, event: Option<u64>) -> Result<Flame, ServiceError> {
        self.on_device(row, device, move |entry, i, d| {
            check_event(entry, d, event)?;
            Ok(entry.flame(i, event))
        })
        .await
    }

    /// Who pins free memory right after `event`, by replaying to it.
    pub async fn pinners_at(&self, row: &SnapshotRow, device: i64, event: u64) -> Result<PinnersAt, ServiceError> {
        self.on_device(row, device, move |entry, i, d| {
            check_event(entry, d, Some(event))?;
            let state = entry.replays[i].state_at(&entry.snapshot, Some(event as usize));
            let p = gaps::pinned(&state, &entry.snapshot.stacks);
            Ok(PinnersAt {
                device,
                event,
                pinned: p.summary,
                pinners: p.pinners,
                gaps: p.gaps.into_iter().take(20).collect(),
            })
        })
        .await
    }

    /// A device's trace events from `start`, `limit` at most.
    pub async fn events(
        &self,
        row: &SnapshotRow,
        device: i64,
        start: u64,
        limit: u64,
    ) -> Result<EventsPage, ServiceError> {
        let entry = self.entry(row).await?;
        let (_, d) = entry.device(device).ok_or(ServiceError::Missing("device"))?;
        let total = entry.snapshot.device_events(d).len();
        let events: Vec<map::EventInfo> =
            (start as usize..).take(limit as usize).map_while(|i| map::event(&entry.snapshot, d, i)).collect();
        let next = (start + events.len() as u64) < total as u64;
        Ok(EventsPage { device, total, start, events, next_start: next.then_some(start + limit) })
    }

    /// The frames of a stack.
    pub async fn stack(&self, row: &SnapshotRow, stack: u32) -> Result<StackFrames, ServiceError> {
        let entry = self.entry(row).await?;
        let s = &entry.snapshot.stacks;
        if stack as usize >= s.stack_count() {
            return Err(ServiceError::Missing("stack"));
        }
        Ok(StackFrames { stack, call_site: sites::call_site(s, stack), frames: sites::frames(s, stack) })
    }

    /// Live bytes of a device over events, grouped, as JSON.
    pub async fn active(&self, row: &SnapshotRow, device: i64, q: ActiveQuery) -> Result<Vec<u8>, ServiceError> {
        self.on_device(row, device, move |entry, i, _| entry.active(i, q)).await
    }

    /// A device's trace replayed through the allocator model under other settings. The caller
    /// holds a [`Service::simulation_slot`].
    pub async fn simulate(
        &self,
        row: &SnapshotRow,
        device: i64,
        settings: crate::simulate::Settings,
    ) -> Result<crate::simulate::Outcome, ServiceError> {
        self.on_device(row, device, move |entry, _, d| {
            crate::simulate::simulate(&entry.snapshot, d, &settings).map_err(|e| ServiceError::Invalid(e.to_string()))
        })
        .await
    }
}

/// Refuses an event past the device's last.
fn check_event(entry: &Entry, d: &Device, event: Option<u64>) -> Result<(), ServiceError> {
    let n = entry.snapshot.device_events(d).len() as u64;
    match event {
        Some(e) if e >= n => Err(ServiceError::Invalid(format!("event {e} is past the last of {n} events"))),
        _ => Ok(()),
    }
}
