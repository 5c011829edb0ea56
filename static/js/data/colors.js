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

/** The colour of a call site key (`file:line:name`); spread over hues, never grey. */
export function siteColor(key) {
  if (!key) return UNKNOWN;
  const h = hash(key);
  const hue = h % 360;
  const light = 42 + ((h >>> 9) % 3) * 8;
  return `hsl(${hue} 62% ${light}%)`;
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
