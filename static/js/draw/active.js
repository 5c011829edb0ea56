// The active-memory timeline: live bytes stacked by the call site that allocated them (or by
// what they hold), over events. The server aggregates (a few top call sites and "other"), so three million events
// draw as a few hundred columns.

import { fit as fitCanvas } from "./canvas.js";
import { siteColor, siteKey, categoryColor } from "../data/colors.js";
import { bytes, site } from "../data/format.js";

export function drawActive(canvas, legend, data) {
  const { ctx, w, h } = fitCanvas(canvas);
  legend.replaceChildren();
  const n = data.event.length;
  if (n === 0) return;
  const layers = data.sites.map((s) =>
    s.category
      ? { values: s.values, color: categoryColor(s.category), label: s.category.replace("_", " ") }
      : { values: s.values, color: siteColor(siteKey(s.call_site)), label: site(s.call_site) },
  );
  if (data.other.some((v) => v > 0)) layers.push({ values: data.other, color: "#c3c8d0", label: "other call sites" });
  let top = 1;
  for (let i = 0; i < n; i++) {
    let sum = 0;
    for (const l of layers) sum += l.values[i];
    top = Math.max(top, sum);
  }
  const pad = 64;
  const step = (w - pad - 10) / n;
  const scale = (h - 24) / top;
  for (let i = 0; i < n; i++) {
    let y = h - 18;
    for (const l of layers) {
      const v = l.values[i] * scale;
      if (v > 0) {
        ctx.fillStyle = l.color;
        ctx.fillRect(pad + i * step, y - v, Math.max(step, 1), v);
      }
      y -= v;
    }
  }
  ctx.fillStyle = "#334";
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(bytes(top), 4, 12);
  ctx.fillText("0", 4, h - 18);
  for (const l of layers) {
    const li = document.createElement("li");
    const key = document.createElement("i");
    key.style.background = l.color;
    li.append(key, document.createTextNode(l.label));
    legend.append(li);
  }
}
