// Decoding of the timeline's binary columns (see the API: format=bin). Pure: no DOM.

export const SERIES = ["reserved_bytes", "allocated_bytes", "active_bytes", "pinned_free_bytes", "largest_free_block_bytes"];

/**
 * Little-endian f64: [points, start, end], then `points` values each of: event, time_us, and
 * the min then max of every series in SERIES order. Views share the buffer: no copies.
 */
export function decodeTimeline(buffer) {
  const f = new Float64Array(buffer);
  if (f.length < 3) throw new Error("timeline too short");
  const n = f[0];
  if (f.length !== 3 + n * (2 + 2 * SERIES.length)) throw new Error(`timeline of ${f.length} values for ${n} points`);
  let o = 3;
  const take = () => {
    const v = f.subarray(o, o + n);
    o += n;
    return v;
  };
  const event = take();
  const time = take();
  const min = {};
  const max = {};
  for (const s of SERIES) {
    min[s] = take();
    max[s] = take();
  }
  return { n, start: f[1], end: f[2], event, time, min, max };
}

/** Index of the bucket holding `event` (buckets start at `event[i]`). */
export function bucketOf(tl, event) {
  let lo = 0;
  let hi = tl.n - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (tl.event[mid] <= event) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** The largest value of the given series' maxima. */
export function peak(tl, names) {
  let m = 0;
  for (const s of names) for (const v of tl.max[s]) if (v > m) m = v;
  return m;
}

/** Buckets where reserved memory grew: a segment was created there. */
export function growth(tl) {
  const out = [];
  const r = tl.max.reserved_bytes;
  for (let i = 1; i < tl.n; i++) if (r[i] > r[i - 1]) out.push(i);
  return out;
}
