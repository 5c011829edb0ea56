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
