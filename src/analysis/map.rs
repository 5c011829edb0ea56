//! The segment map at one moment as the API and the page show it: segments to scale with
//! their blocks, each live block's share of the pinned memory, and the stacks they name.

use std::collections::BTreeMap;

use serde::Serialize;

use super::categories::Category;
use super::gaps::pinned;
use crate::replay::{BlockRec, NIL, State};
use crate::snapshot::sites::{CallSite, call_site, frames};
use crate::snapshot::{BlockState, Device, PoolKind, Snapshot, StackId};
use crate::units::Addr;

#[derive(Debug, Clone, Serialize)]
pub struct SegmentMap {
    pub device: i64,
    /// The event the state follows; None for the final `segments`.
    pub event: Option<u64>,
    pub totals: MapTotals,
    pub segments: Vec<SegmentView>,
    /// The stacks the blocks refer to, by id.
    pub stacks: BTreeMap<StackId, StackView>,
    /// The event itself, as the trace recorded it (None for the final `segments`).
    pub event_info: Option<EventInfo>,
}

/// One trace event as the API shows it: the request, where it came from, and the tags torch
/// attached to it. `index` counts the device's events.
#[derive(Debug, Clone, Serialize)]
pub struct EventInfo {
    pub index: u64,
    pub action: String,
    pub address: Addr,
    pub size: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    pub stack: StackId,
    pub call_site: Option<CallSite>,
    /// What torch.compile was running, when recorded.
    pub compile_context: Option<String>,
    /// What the program set with `torch.cuda.memory._set_memory_metadata` (the step, say).
    pub user_metadata: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MapTotals {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    pub pinned_free_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub segments: u64,
    pub blocks: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SegmentView {
    pub address: Addr,
    pub size: u64,
    pub pool: &'static str,
    /// A CUDA graph's or MemPool's private pool id; None for the default pool.
    pub private_pool: Option<(i64, i64)>,
    pub stream: i64,
    pub expandable: bool,
    pub pinned_free_bytes: u64,
    pub created_event: Option<u64>,
    pub blocks: Vec<BlockView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BlockView {
    pub address: Addr,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    pub stack: StackId,
    /// This live block's share of its segment's pinned free bytes (see `gaps`).
    pub pinned_share: u64,
    pub alloc_event: Option<u64>,
    /// What a live block holds (see `categories`), where the analysis knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StackView {
    pub call_site: Option<CallSite>,
    pub frames: Vec<CallSite>,
}

/// The map of `state`; `category` tells what a live block holds (None: not known).
pub fn segment_map(
    snapshot: &Snapshot,
    device: i64,
    event: Option<u64>,
    state: &State,
    category: impl Fn(&BlockRec) -> Option<Category>,
) -> SegmentMap {
    let shares: std::collections::HashMap<u64, u64> = pinned(state, &snapshot.stacks).shares.into_iter().collect();
    let mut stacks = BTreeMap::new();
    let mut segments = Vec::new();
    let mut blocks_total = 0;
    for s in state.segment_ids() {
        let seg = state.segment(s);
        let mut blocks = Vec::new();
        for b in state.block_ids(s) {
            let blk = state.block(b);
            stacks.entry(blk.stack).or_insert_with(|| StackView {
                call_site: call_site(&snapshot.stacks, blk.stack),
                frames: frames(&snapshot.stacks, blk.stack),
            });
            blocks.push(BlockView {
                address: Addr(blk.address),
                size: blk.size,
                requested_size: blk.requested,
                state: blk.state.name(),
                stack: blk.stack,
                pinned_share: if blk.state == BlockState::Inactive {
                    0
                } else {
                    shares.get(&blk.address).copied().unwrap_or(0)
                },
                alloc_event: (blk.event != NIL).then_some(blk.event as u64),
                category: if blk.state == BlockState::Inactive { None } else { category(blk) },
            });
        }
        blocks_total += blocks.len() as u64;
        segments.push(SegmentView {
            address: Addr(seg.address),
            size: seg.size,
            pool: if seg.pool.kind == PoolKind::Small { "small" } else { "large" },
            private_pool: seg.pool.is_private().then_some(seg.pool.id),
            stream: snapshot.stream(seg.stream),
            expandable: seg.expandable,
            pinned_free_bytes: if seg.live > 0 && !seg.expandable { seg.inactive } else { 0 },
            created_event: (seg.created != NIL).then_some(seg.created as u64),
            blocks,
        });
    }
    let t = state.totals;
    SegmentMap {
        device,
        event,
        event_info: event.and_then(|e| event_info(snapshot, device, e)),
        totals: MapTotals {
            reserved_bytes: t.reserved_bytes,
            allocated_bytes: t.allocated_bytes,
            active_bytes: t.active_bytes,
            requested_bytes: t.requested_bytes,
            pinned_free_bytes: t.pinned_free_bytes,
            largest_free_block_bytes: state.largest_free(),
            segments: segments.len() as u64,
            blocks: blocks_total,
        },
        segments,
        stacks,
    }
}

fn event_info(snapshot: &Snapshot, device: i64, index: u64) -> Option<EventInfo> {
    let d = snapshot.devices.iter().find(|d| d.device == device)?;
    event(snapshot, d, index as usize)
}

/// Event `index` of device `d`, None past its end.
pub fn event(snapshot: &Snapshot, d: &Device, index: usize) -> Option<EventInfo> {
    let e = snapshot.device_events(d).get(index)?;
    let (compile_context, user_metadata) = snapshot.extra(d.events.start + index);
    Some(EventInfo {
        index: index as u64,
        action: snapshot.action_name(e.action).to_string(),
        address: Addr(e.addr),
        size: e.size,
        stream: snapshot.stream(e.stream),
        time_us: snapshot.time(d.events.start + index),
        stack: e.stack,
        call_site: call_site(&snapshot.stacks, e.stack),
        compile_context: compile_context.map(str::to_string),
        user_metadata: user_metadata.map(str::to_string),
    })
}
