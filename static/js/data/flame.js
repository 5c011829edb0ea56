// The icicle's layout from the server's columns (/flame): each node's depth and its start in
// bytes from the left, siblings in the order sent (largest first). Pure: no DOM.

/** Adds `depth` and `x` (bytes from the left edge of the root) to the flame's columns. */
export function layoutFlame(f) {
  const n = f.parent.length;
  const depth = new Uint16Array(n);
  const x = new Float64Array(n);
  // The next free byte under each node: parents come before children, siblings in order.
  const next = new Float64Array(n);
  for (let i = 1; i < n; i++) {
    const p = f.parent[i];
    depth[i] = depth[p] + 1;
    x[i] = x[p] + next[p];
    next[p] += f.bytes[i];
  }
  let maxDepth = 0;
  for (let i = 0; i < n; i++) if (depth[i] > maxDepth) maxDepth = depth[i];
  return { ...f, depth, x, maxDepth };
}

/** The nodes to draw when `focus` fills a `width` px wide view: those inside the focus's byte
 *  range (and its ancestors, full width) at least `minPx` wide. Returns `[i, left, right]`. */
export function visibleNodes(l, focus, width, minPx = 0.5) {
  const x0 = l.x[focus];
  const span = l.bytes[focus] || 1;
  const scale = width / span;
  const out = [];
  for (let i = 0; i < l.parent.length; i++) {
    if (l.depth[i] < l.depth[focus]) {
      // An ancestor of the focus spans the view (the others are outside it).
      if (isAncestor(l, i, focus)) out.push([i, 0, width]);
      continue;
    }
    const left = (l.x[i] - x0) * scale;
    const right = left + l.bytes[i] * scale;
    if (right <= 0 || left >= width || right - left < minPx) continue;
    if (l.depth[i] === l.depth[focus] && i !== focus) continue;
    out.push([i, Math.max(0, left), Math.min(width, right)]);
  }
  return out;
}

function isAncestor(l, a, i) {
  while (i !== 0) {
    i = l.parent[i];
    if (i === a) return true;
  }
  return a === 0;
}

/** The node under `(px, row)` among those `visibleNodes` returned, or -1. */
export function nodeAt(l, shown, px, row) {
  for (const [i, left, right] of shown) if (l.depth[i] === row && px >= left && px < right) return i;
  return -1;
}
