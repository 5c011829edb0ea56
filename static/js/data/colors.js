// Stable colours: one per call site, the same on every page and every reload. Pure: no DOM.

export const FREE = "#d9dbe0";
export const PINNED = "#9aa0aa";
export const PENDING = "#e0c060";
export const UNKNOWN = "#7f8a99";

/** FNV-1a of a string: a stable 32-bit hash. */
export function hash(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** Twelve colours told apart at a glance (Tableau's, and three more), for the sites that
 *  hold the most memory. */
export const PALETTE = [
  "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#edc948",
  "#76b7b2", "#ff9da7", "#9c755f", "#17becf", "#bcbd22", "#7f3c8d",
];

// The sites given a palette colour, by key: set from the analysis, the same for every view
// of one snapshot, so a site is one colour in the map, the chart and the tables.
const assigned = new Map();

/** Gives the first twelve of `keys` (the sites that hold the most, most first) the palette's
 *  colours, in order; returns whether any colour changed. */
export function assignSiteColors(keys) {
  const next = new Map();
  for (const k of keys) {
    if (!k || next.has(k)) continue;
    if (next.size === PALETTE.length) break;
    next.set(k, PALETTE[next.size]);
  }
  const same = next.size === assigned.size && [...next].every(([k, c]) => assigned.get(k) === c);
  assigned.clear();
  for (const [k, c] of next) assigned.set(k, c);
  return !same;
}

/** The colour of a call site key (`file:line:name`): its palette colour when it is among
 *  the sites that hold the most, else a muted hue from its hash (never grey). */
export function siteColor(key) {
  if (!key) return UNKNOWN;
  const mine = assigned.get(key);
  if (mine) return mine;
  const h = hash(key);
  const hue = h % 360;
  const light = 58 + ((h >>> 9) % 3) * 8;
  return `hsl(${hue} 30% ${light}%)`;
}

/** The call sites to colour first: those of the analysis' breakdowns (the OOM, the peak, the
 *  end), largest first, each once. */
export function sitesByBytes(device) {
  const rows = [];
  for (const b of (device && device.breakdown) || []) for (const s of b.call_sites || []) rows.push(s);
  rows.sort((a, b) => b.bytes - a.bytes);
  return rows.map((s) => siteKey(s.call_site));
}

export function siteKey(cs) {
  return cs ? `${cs.filename}:${cs.line}:${cs.name}` : "";
}

/** Colours of the categories of memory (the page's legend and panel use the same). */
export const CATEGORY_COLORS = {
  parameter: "#3b6fb6",
  gradient: "#7fa7e0",
  optimizer_state: "#7b4fa8",
  activation: "#d9822b",
  temporary: "#f2c38b",
  input: "#3d9a6b",
  kv_cache: "#c2417a",
  other: "#a67c52",
  unknown: "#6b7380",
};

/** The colour of a block's category; a block whose category is not known is `unknown`. */
export function categoryColor(category) {
  return CATEGORY_COLORS[category] || CATEGORY_COLORS.unknown;
}
