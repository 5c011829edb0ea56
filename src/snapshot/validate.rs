//! Contradictions in a snapshot, found and repaired before anything is computed from it.
//!
//! A hostile or corrupt file can claim blocks that overflow their segment, blocks that overlap,
//! or segments that overlap. Each such thing is dropped (the first claim to an address wins)
//! and reported as a warning, so every later stage can trust that blocks lie inside their
//! segment, in address order, without overlap.

use super::{Device, Segment};

const MAX_WARNINGS: usize = 50;

/// Repairs `device` in place; returns what it changed, in words.
pub fn repair(device: &mut Device) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut warn = |w: String| {
        if warnings.len() < MAX_WARNINGS {
            warnings.push(w);
        }
    };
    device.segments.sort_by_key(|s| s.address);
    let mut kept: Vec<Segment> = Vec::with_capacity(device.segments.len());
    for mut seg in std::mem::take(&mut device.segments) {
        let end = seg.address.checked_add(seg.total_size);
        let Some(end) = end else {
            warn(format!(
                "segment {:#x} of {} bytes runs past the end of the address space: dropped",
                seg.address, seg.total_size
            ));
            continue;
        };
        if let Some(prev) = kept.last()
            && seg.address < prev.address + prev.total_size
        {
            warn(format!("segment {:#x} overlaps segment {:#x}: dropped", seg.address, prev.address));
            continue;
        }
        seg.blocks.sort_by_key(|b| b.address);
        let mut next = seg.address;
        let before = seg.blocks.len();
        seg.blocks.retain(|b| {
            let ok = b.address >= next && b.address.checked_add(b.size).is_some_and(|e| e <= end) && b.size > 0;
            if ok {
                next = b.address + b.size;
            }
            ok
        });
        if seg.blocks.len() != before {
            warn(format!(
                "segment {:#x}: {} blocks lie outside it or overlap others: dropped",
                seg.address,
                before - seg.blocks.len()
            ));
        }
        kept.push(seg);
    }
    device.segments = kept;
    warnings
}
