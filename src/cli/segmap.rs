//! `fragscope state`: the segment map at one event as text, in the spirit of PyTorch's
//! `segsum`: one line per segment, its blocks drawn to scale in a fixed-width strip.

use std::fmt::Write;

use crate::replay::State;
use crate::snapshot::{BlockState, PoolKind, Snapshot};
use crate::units::bytes;

/// Characters per segment strip.
pub const WIDTH: usize = 64;

pub const LEGEND: &str = "# allocated   - pending free   x free, pinned by a live block   . free";

/// One glyph per strip cell: the state covering most of the cell's bytes.
fn strip(state: &State, seg: u32) -> String {
    let s = state.segment(seg);
    let pins = s.live > 0 && !s.expandable;
    let cell = s.size.div_ceil(WIDTH as u64).max(1);
    let mut weights = vec![[0u64; 4]; WIDTH];
    for b in state.block_ids(seg) {
        let blk = state.block(b);
        let kind = match blk.state {
            BlockState::ActiveAllocated => 0,
            BlockState::ActivePendingFree => 1,
            BlockState::Inactive if pins => 2,
            BlockState::Inactive => 3,
        };
        let (mut lo, hi) = (blk.address - s.address, blk.address - s.address + blk.size);
        while lo < hi {
            let c = (lo / cell) as usize;
            let end = ((c as u64 + 1) * cell).min(hi);
            weights[c.min(WIDTH - 1)][kind] += end - lo;
            lo = end;
        }
    }
    weights
        .iter()
        .map(|w| {
            let best = (0..4).max_by_key(|&k| (w[k], 4 - k)).unwrap_or(3);
            ['#', '-', 'x', '.'][best]
        })
        .collect()
}

/// The whole map, with a header line of totals.
pub fn render(snapshot: &Snapshot, state: &State, title: &str) -> String {
    let t = state.totals;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title}: reserved {}, allocated {}, active {}, pinned free {}",
        bytes(t.reserved_bytes),
        bytes(t.allocated_bytes),
        bytes(t.active_bytes),
        bytes(t.pinned_free_bytes)
    );
    let _ = writeln!(out, "{:<16} {:>12}  {:<16} blocks", "segment", "size", "pool");
    for s in state.segment_ids() {
        let seg = state.segment(s);
        let mut pool = match seg.pool.kind {
            PoolKind::Small => "small".to_string(),
            PoolKind::Large => "large".to_string(),
        };
        if seg.expandable {
            pool.push_str(" exp");
        }
        if seg.pool.is_private() {
            let _ = write!(pool, " {:?}", seg.pool.id);
        }
        let stream = snapshot.stream(seg.stream);
        if stream != 0 {
            let _ = write!(pool, " s{stream:#x}");
        }
        let pinned = if seg.live > 0 && !seg.expandable && seg.inactive > 0 {
            format!("  pinned {}", bytes(seg.inactive))
        } else {
            String::new()
        };
        let _ =
            writeln!(out, "{:<#16x} {:>12}  {:<16} {}{pinned}", seg.address, bytes(seg.size), pool, strip(state, s));
    }
    let _ = writeln!(out, "{LEGEND}");
    out
}
