// Geometry of the segment map: rows, scales, level of detail, hit testing. Pure: no DOM.
//
// Each segment is a row; x is bytes from the segment's start, scaled so the largest segment
// fits at zoom 1. Blocks narrower than a pixel are merged into one-pixel runs showing the state
// that covers most of their bytes, so a row never needs more shapes than it has pixels.

import { addr } from "./format.js";

export const LABEL = 170; // px of row labels, left of the bars
export const ROW = 22; // px from one row to the next
export const BAR = 16; // px of bar height
export const KINDS = ["alloc", "pending", "pinned", "free"];

/** Row order of segment indices. */
export function order(segments, sort) {
  const idx = segments.map((_, i) => i);
  if (sort === "size") idx.sort((a, b) => segments[b].size - segments[a].size || a - b);
  else if (sort === "pinned") idx.sort((a, b) => segments[b].pinned_free_bytes - segments[a].pinned_free_bytes || a - b);
  return idx;
}

/** Bytes per pixel that fit the largest segment into the bar area. */
export function fit(segments, width) {
  const largest = segments.reduce((m, s) => Math.max(m, s.size), 1);
  return largest / Math.max(1, width - LABEL - 8);
}

/** What a block shows as. */
export function kind(segment, block) {
  if (block.state === "active_allocated") return "alloc";
  if (block.state === "active_pending_free") return "pending";
  return segment.pinned_free_bytes > 0 ? "pinned" : "free";
}

/**
 * Runs of one row over `width` pixels from byte offset `x0` at `bpp` bytes per pixel:
 * [{x, w, kind, block}], `block` the block index, or -1 where sub-pixel blocks were merged.
 */
export function runs(segment, x0, bpp, width) {
  const out = [];
  const base = addr(segment.address);
  let acc = null;
  const flush = () => {
    if (!acc) return;
    let best = 0;
    for (let k = 1; k < 4; k++) if (acc.weights[k] > acc.weights[best]) best = k;
    out.push({ x: acc.x, w: 1, kind: KINDS[best], block: acc.count === 1 ? acc.block : -1 });
    acc = null;
  };
  segment.blocks.forEach((b, i) => {
    const start = (addr(b.address) - base - x0) / bpp;
    const end = start + b.size / bpp;
    if (end <= 0 || start >= width) return;
    const s = Math.max(0, start);
    const e = Math.min(width, end);
    const k = kind(segment, b);
    if (e - s >= 1) {
      flush();
      out.push({ x: s, w: e - s, kind: k, block: i });
      return;
    }
    const px = Math.floor(s);
    if (acc && acc.x !== px) flush();
    if (!acc) acc = { x: px, weights: [0, 0, 0, 0], block: i, count: 0 };
    acc.weights[KINDS.indexOf(k)] += b.size;
    acc.count += 1;
  });
  flush();
  return out;
}

/** The run under pixel `x`, if any. */
export function hit(rowRuns, x) {
  for (const r of rowRuns) if (x >= r.x && x < r.x + Math.max(r.w, 1)) return r;
  return null;
}

/** The row under pixel `y`, given the first visible row. */
export function rowAt(y, firstRow) {
  const r = Math.floor(y / ROW);
  return y - r * ROW < BAR + 3 ? firstRow + r : -1;
}

/** Zooms around pixel `px` of the bar area: the byte under it stays under it. */
export function zoom(view, px, factor) {
  const at = view.x0 + px * view.bpp;
  const bpp = Math.max(1e-3, view.bpp * factor);
  return { ...view, bpp, x0: Math.max(0, at - px * bpp) };
}
