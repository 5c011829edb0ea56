// Memory curves of several snapshots on one x axis: overlaid when few, small multiples when
// many. One path per curve: the points are already bucketed on the server.

import { fit } from "./canvas.js";
import { bytes } from "../data/format.js";
import { curvesMax, grid, OVERLAY_PAD, stepLabelEvery } from "../data/curves.js";

// NaN is where a curve has no value (a run that stopped sooner, by step): the line breaks.
function path(ctx, values, x0, y0, w, h, max) {
  ctx.beginPath();
  const n = values.length;
  let pen = false;
  for (let i = 0; i < n; i++) {
    if (Number.isNaN(values[i])) {
      pen = false;
      continue;
    }
    const x = x0 + (n === 1 ? 0 : (i / (n - 1)) * w);
    const y = y0 + h - (values[i] / max) * h;
    if (!pen) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
    pen = true;
  }
  ctx.stroke();
}

/** Step ticks under an overlay of `steps` steps: a line at each step's start, labelled as
 *  often as fits (at least 40 px apart). */
function stepAxis(ctx, steps, x0, w, h, pad) {
  const every = stepLabelEvery(steps, w);
  ctx.strokeStyle = "#e3e6ea";
  ctx.lineWidth = 1;
  ctx.fillStyle = "#667";
  for (let k = 0; k < steps; k++) {
    const x = Math.round(x0 + (k / steps) * w) + 0.5;
    ctx.beginPath();
    ctx.moveTo(x, pad.t);
    ctx.lineTo(x, h - pad.b);
    ctx.stroke();
    if (k % every === 0) ctx.fillText(k === 0 ? "step 1" : String(k + 1), x + 3, h - 4);
  }
}

/**
 * Draws `decoded` (see decodeCurves) into `canvas`; `style(i)` gives a curve's colour and
 * `label(i)` its name (used by small multiples); with `steps`, the x axis is that many steps.
 * Returns the layout, for hit tests.
 */
export function drawCurves(canvas, decoded, style, label, allocated = false, steps = null) {
  const layout = grid(decoded.curves.length, canvas.clientWidth);
  if (!layout.overlay) canvas.style.height = `${layout.rows * 90 + 10}px`;
  const { ctx, w, h } = fit(canvas);
  const max = curvesMax(decoded) || 1;
  ctx.font = "11px system-ui, sans-serif";
  if (layout.overlay) {
    const pad = OVERLAY_PAD;
    ctx.fillStyle = "#667";
    ctx.fillText(bytes(max), 4, pad.t + 8);
    ctx.fillText("0", 4, h - pad.b);
    if (steps) stepAxis(ctx, steps, pad.l, w - pad.l - pad.r, h, pad);
    else {
      ctx.fillText("start", pad.l, h - 4);
      ctx.fillText("end", w - pad.r - 20, h - 4);
    }
    decoded.curves.forEach((c, i) => {
      if (!c.ready) return;
      ctx.strokeStyle = style(i);
      ctx.lineWidth = 2;
      path(ctx, c.reserved, pad.l, pad.t, w - pad.l - pad.r, h - pad.t - pad.b, max);
      if (allocated) {
        ctx.lineWidth = 1;
        path(ctx, c.allocated, pad.l, pad.t, w - pad.l - pad.r, h - pad.t - pad.b, max);
      }
    });
    return layout;
  }
  const cw = w / layout.cols;
  decoded.curves.forEach((c, i) => {
    const x0 = (i % layout.cols) * cw;
    const y0 = Math.floor(i / layout.cols) * 90;
    ctx.strokeStyle = "#d8dce2";
    ctx.lineWidth = 1;
    ctx.strokeRect(x0 + 2, y0 + 4, cw - 4, 84);
    ctx.fillStyle = "#1d232a";
    ctx.fillText(label(i), x0 + 6, y0 + 16);
    if (!c.ready) return;
    ctx.strokeStyle = style(i);
    ctx.lineWidth = 1.5;
    path(ctx, c.reserved, x0 + 6, y0 + 20, cw - 12, 62, max);
  });
  return layout;
}
