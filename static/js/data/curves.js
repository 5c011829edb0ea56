// The curves of several snapshots on one x axis (/api/v1/curves): decoded without copying,
// and the layout of the run page's small multiples. No drawing here.

/** Decodes little-endian u32 count, u32 points, then per curve reserved and allocated f32s. */
export function decodeCurves(buffer) {
  const head = new DataView(buffer, 0, 8);
  const count = head.getUint32(0, true);
  const points = head.getUint32(4, true);
  const curves = [];
  for (let c = 0; c < count; c++) {
    const at = 8 + c * points * 8;
    const reserved = new Float32Array(buffer, at, points);
    const allocated = new Float32Array(buffer, at + points * 4, points);
    curves.push({ reserved, allocated, ready: !Number.isNaN(reserved[0]) });
  }
  return { points, curves };
}

/** The highest value of any curve (0 when none is ready). */
export function curvesMax(decoded) {
  let max = 0;
  for (const c of decoded.curves) {
    if (!c.ready) continue;
    for (const v of c.reserved) if (v > max) max = v;
  }
  return max;
}

/** Up to 8 curves share one chart; more get one small chart each, in a grid `cols` wide. */
export function grid(count, width) {
  if (count <= 8) return { cols: 1, rows: 1, overlay: true };
  const cols = Math.max(2, Math.min(8, Math.floor(width / 140)));
  return { cols, rows: Math.ceil(count / cols), overlay: false };
}

/** Ranks ordered for the table: by rank, or by peak reserved (highest first, not ready last). */
export function sortRanks(ranks, by) {
  const copy = ranks.slice();
  if (by === "peak") copy.sort((a, b) => (b.peak_reserved_bytes ?? -1) - (a.peak_reserved_bytes ?? -1) || a.rank - b.rank);
  else copy.sort((a, b) => a.rank - b.rank);
  return copy;
}

/** Label every how many steps so that labels of `steps` steps over `width` px stand at least
 *  40 px apart (1, 2, 5, 10, 20, 50...). */
export function stepLabelEvery(steps, width) {
  const room = Math.max(1, Math.floor(width / 40));
  for (let every = 1; ; every *= 10) {
    for (const m of [1, 2, 5]) if (Math.ceil(steps / (every * m)) <= room) return every * m;
  }
}

/** The x axis the server put curves on (`X-Fragscope-Axis`): a number of steps, or null for
 *  the share of each snapshot's events. */
export function stepsOfAxis(header) {
  const m = /^steps=(\d+)$/.exec(header || "");
  return m ? Number(m[1]) : null;
}

/** The overlaid chart's padding, shared by drawing and hit testing. */
export const OVERLAY_PAD = { l: 64, r: 8, t: 8, b: 18 };

/** A rank's colour: red only for a rank that ran out of memory; the others take hues from
 *  green to violet, never red, so that "OOM ranks in red" holds. */
export function rankColor(i, oom) {
  return oom ? "#b3261e" : `hsl(${100 + ((i * 47) % 200)} 45% 42% / 0.85)`;
}

/**
 * The curve under a point of a chart `w` x `h` drawn by drawCurves with `layout`: its index
 * and the value there, or null. Overlaid: the ready curve nearest the point at its x; small
 * multiples: the cell's curve.
 */
export function curveAt(decoded, layout, w, h, x, y) {
  const n = decoded.points;
  if (!n) return null;
  if (layout.overlay) {
    const p = OVERLAY_PAD;
    const cw = w - p.l - p.r;
    const ch = h - p.t - p.b;
    if (x < p.l || x > w - p.r || cw <= 0 || ch <= 0) return null;
    const k = Math.round(((x - p.l) / cw) * (n - 1));
    const max = curvesMax(decoded) || 1;
    let best = null;
    decoded.curves.forEach((c, i) => {
      if (!c.ready) return;
      if (Number.isNaN(c.reserved[k])) return;
      const cy = p.t + ch - (c.reserved[k] / max) * ch;
      const d = Math.abs(cy - y);
      if (best === null || d < best.d) best = { index: i, value: c.reserved[k], d };
    });
    return best && { index: best.index, value: best.value };
  }
  const cellW = w / layout.cols;
  const i = Math.floor(y / 90) * layout.cols + Math.floor(x / cellW);
  const c = decoded.curves[i];
  if (!c) return null;
  const k = Math.max(0, Math.min(n - 1, Math.round(((x - (i % layout.cols) * cellW - 6) / (cellW - 12)) * (n - 1))));
  return { index: i, value: c.ready ? c.reserved[k] : null };
}
