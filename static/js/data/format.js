// Formatting of sizes and addresses. Pure: no DOM.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** Bytes as `520.00 MiB`. */
export function bytes(n) {
  let v = Number(n);
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024;
    u += 1;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(2)} ${UNITS[u]}`;
}

/** A call site as `file.py:12 (name)`, or a dash. */
export function site(cs) {
  return cs ? `${cs.filename}:${cs.line} (${cs.name})` : "(no frames recorded)";
}

/** Hex address strings from the API ("0x7f...") to a Number of bytes (exact below 2^53). */
export function addr(hex) {
  return Number.parseInt(hex, 16);
}

/**
 * The cursor's caption: the event, and once its map has come, what the event did and the
 * tags torch attached to it (user metadata such as the step, the torch.compile context).
 * Plain text: the caller sets it as textContent.
 */
export function eventLabel(index, total, info) {
  const at = `After event ${index} of ${total}`;
  if (!info) return at;
  const where = info.call_site ? ` at ${site(info.call_site)}` : "";
  const tags = [info.user_metadata, info.compile_context].filter(Boolean).join(", ");
  return `${at}: ${info.action} ${bytes(info.size)}${where}${tags ? ` [${tags}]` : ""}`;
}
