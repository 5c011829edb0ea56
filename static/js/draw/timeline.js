// The memory timeline on a canvas: reserved, allocated, active and pinned bytes over events
// (min-max bands from the server's buckets), OOM markers, step boundaries, segment creations,
// what the step that died needed (a line above the trace's end: a snapshot taken at an OOM
// ends there) against the budget, and a cursor that is dragged or stepped with the arrow keys.
// Shift-drag selects a range to zoom into.

import { fit as fitCanvas, resized, counted } from "./canvas.js";
import { bucketOf, peak, growth } from "../data/columns.js";
import { bytes } from "../data/format.js";
import { stepLabelEvery } from "../data/curves.js";

const PAD = { l: 64, r: 10, t: 14, b: 20 };
const COLORS = { reserved_bytes: "#d5deea", allocated_bytes: "#2f6fc4", active_bytes: "#1d232a", pinned_free_bytes: "#d9534f" };

export class Timeline {
  constructor(canvas, { onCursor, onRange }) {
    this.canvas = canvas;
    this.onCursor = onCursor;
    this.onRange = onRange;
    this.tl = null;
    this.ooms = [];
    this.steps = [];
    this.cursor = 0;
    this.brush = null;
    this.bind();
  }

  /** The columns to draw, with the cursor's event where the caller moves it as well (one drawing). */
  setData(tl, ooms, steps = [], need = null, events = 0, cursor = this.cursor) {
    this.tl = tl;
    this.cursor = cursor;
    this.ooms = ooms;
    this.steps = steps;
    this.need = need;
    this.events = events;
    this.draw();
  }

  // The projected need and the budget to draw: only where the trace died of an OOM and the
  // view reaches its end.
  needLines() {
    const n = this.need;
    if (!n || !this.ooms.length || n.method === "observed" || !this.tl || this.tl.end < this.events) return null;
    return { need: n.peak_reserved_bytes || 0, budget: n.budget_bytes || 0 };
  }

  setCursor(event) {
    this.cursor = event;
    this.draw();
  }

  /** The exact totals right after `event` (the segment map's), for the cursor's label. */
  setAt(event, totals) {
    this.at = { event, reserved: totals.reserved_bytes, allocated: totals.allocated_bytes };
    this.draw();
  }

  xOf(event) {
    const w = this.canvas.clientWidth - PAD.l - PAD.r;
    const span = Math.max(1, this.tl.end - this.tl.start);
    return PAD.l + ((event - this.tl.start) / span) * w;
  }

  eventAt(x) {
    const w = this.canvas.clientWidth - PAD.l - PAD.r;
    const f = Math.min(1, Math.max(0, (x - PAD.l) / w));
    return Math.min(this.tl.end - 1, Math.max(this.tl.start, Math.round(this.tl.start + f * (this.tl.end - this.tl.start))));
  }

  draw() {
    const c = this.canvas;
    const { ctx, w, h } = fitCanvas(c);
    const tl = this.tl;
    if (!tl || tl.n === 0) return;
    counted(c);
    const lines = this.needLines();
    const top = Math.max(peak(tl, ["reserved_bytes"]), lines ? Math.max(lines.need, lines.budget) : 0) * 1.05 || 1;
    const y = (v) => h - PAD.b - (v / top) * (h - PAD.t - PAD.b);
    const step = (w - PAD.l - PAD.r) / tl.n;
    // Reserved as the backdrop; allocated from zero; pinned free memory stacked on allocated
    // (reserved = allocated + pinned + the rest); active as a line.
    for (let i = 0; i < tl.n; i++) {
      const x = PAD.l + i * step;
      const wd = Math.max(step, 1);
      const alloc = tl.max.allocated_bytes[i];
      ctx.fillStyle = COLORS.reserved_bytes;
      ctx.fillRect(x, y(tl.max.reserved_bytes[i]), wd, y(0) - y(tl.max.reserved_bytes[i]));
      ctx.fillStyle = COLORS.allocated_bytes;
      ctx.fillRect(x, y(alloc), wd, y(tl.min.allocated_bytes[i]) - y(alloc) + (y(0) - y(tl.min.allocated_bytes[i])));
      ctx.fillStyle = COLORS.pinned_free_bytes;
      ctx.fillRect(x, y(alloc + tl.max.pinned_free_bytes[i]), wd, y(alloc) - y(alloc + tl.max.pinned_free_bytes[i]));
      ctx.fillStyle = COLORS.active_bytes;
      ctx.fillRect(x, y(tl.max.active_bytes[i]) - 1, wd, 2);
    }
    ctx.fillStyle = "#556";
    for (const i of growth(tl)) ctx.fillRect(PAD.l + i * step, PAD.t - 8, 1, 5);
    // Step boundaries: a dotted line where each training step begins. Labels count from 1 as
    // the diagnosis does ("died in step 4"), on a white plate above the bars, as often as
    // they fit 40 px apart.
    ctx.font = "11px system-ui, sans-serif";
    const shown = this.steps.filter((s) => s.first_event >= tl.start && s.first_event < tl.end);
    const every = stepLabelEvery(Math.max(1, this.steps.length), w - PAD.l - PAD.r);
    ctx.strokeStyle = "#8a919c";
    ctx.setLineDash([2, 3]);
    const labels = [];
    for (const s of shown) {
      const x = Math.round(this.xOf(s.first_event)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, PAD.t);
      ctx.lineTo(x, h - PAD.b);
      ctx.stroke();
      if (s.index % every === 0) labels.push([labels.length ? `${s.index + 1}` : `step ${s.index + 1}`, x]);
    }
    ctx.setLineDash([]);
    let free = -Infinity;
    for (const [text, x] of labels) {
      const lw = ctx.measureText(text).width;
      if (x + 2 < free || x + lw + 4 > w - PAD.r) continue;
      ctx.fillStyle = "rgba(255, 255, 255, .85)";
      ctx.fillRect(x + 1, h - PAD.b - 14, lw + 3, 13);
      ctx.fillStyle = "#334";
      ctx.fillText(text, x + 2, h - PAD.b - 3);
      free = x + lw + 8;
    }
    // What the browser tests read: where the step lines were drawn, and their labels.
    this.canvas.dataset.steps = String(shown.length);
    this.canvas.dataset.stepLabels = labels.map((l) => l[0]).join(",");
    ctx.strokeStyle = "#b3261e";
    ctx.fillStyle = "#b3261e";
    for (const o of this.ooms) {
      if (o.event_index < tl.start || o.event_index >= tl.end) continue;
      const x = this.xOf(o.event_index);
      ctx.beginPath();
      ctx.moveTo(x, PAD.t);
      ctx.lineTo(x, h - PAD.b);
      ctx.stroke();
      ctx.fillText("OOM", Math.min(x + 3, w - 30), PAD.t + 10);
    }
    if (lines) this.drawNeed(ctx, lines, y, w);
    ctx.fillStyle = "#334";
    ctx.fillText(bytes(top / 1.05), 4, PAD.t + 4);
    ctx.fillText("0", 4, h - PAD.b);
    ctx.fillText(`event ${tl.start}`, PAD.l, h - 5);
    const endLabel = `event ${tl.end - 1}`;
    ctx.fillText(endLabel, w - PAD.r - ctx.measureText(endLabel).width, h - 5);
    if (this.cursor >= tl.start && this.cursor < tl.end) {
      const x = this.xOf(this.cursor);
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      ctx.moveTo(x, PAD.t - 4);
      ctx.lineTo(x, h - PAD.b);
      ctx.stroke();
      // The value at the event itself (from the map's state), and the pixel's range apart:
      // a bucket's maximum is not what the event held.
      const b = bucketOf(tl, this.cursor);
      const range = (k) => (tl.min[k][b] === tl.max[k][b] ? bytes(tl.max[k][b]) : `${bytes(tl.min[k][b])}–${bytes(tl.max[k][b])}`);
      const exact = this.at && this.at.event === this.cursor;
      const label = exact
        ? `${this.cursor}: reserved ${bytes(this.at.reserved)}, allocated ${bytes(this.at.allocated)} (this pixel: allocated ${range("allocated_bytes")})`
        : `${this.cursor}: this pixel reserved ${range("reserved_bytes")}, allocated ${range("allocated_bytes")}`;
      this.canvas.dataset.cursorLabel = label;
      // On a white plate, below the OOM labels: the bars and the cursor never strike through it.
      const lw = ctx.measureText(label).width;
      const lx = Math.min(x + 4, w - lw - 4);
      ctx.fillStyle = "rgba(255, 255, 255, .9)";
      ctx.fillRect(lx - 2, PAD.t + 15, lw + 4, 14);
      ctx.fillStyle = "#000";
      ctx.fillText(label, lx, PAD.t + 22);
    }
    if (this.brush) {
      ctx.fillStyle = "rgba(26, 95, 180, .15)";
      ctx.fillRect(Math.min(this.brush.a, this.brush.b), PAD.t, Math.abs(this.brush.b - this.brush.a), h - PAD.t - PAD.b);
    }
  }

  // The budget as a dashed line across; the step's projected need as a bar over the last
  // stretch of the trace, where the step died.
  drawNeed(ctx, { need, budget }, y, w) {
    const right = w - PAD.r;
    if (budget) {
      ctx.strokeStyle = "#b3261e";
      ctx.setLineDash([6, 4]);
      ctx.beginPath();
      ctx.moveTo(PAD.l, Math.round(y(budget)) + 0.5);
      ctx.lineTo(right, Math.round(y(budget)) + 0.5);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = "#b3261e";
      ctx.fillText(`budget ${bytes(budget)}`, PAD.l + 4, y(budget) - 3);
    }
    if (need) {
      const from = Math.max(PAD.l, right - Math.max(60, (right - PAD.l) * 0.12));
      ctx.fillStyle = "#7a4fb5";
      ctx.fillRect(from, Math.round(y(need)) - 1, right - from, 3);
      const label = `step needs ${bytes(need)}`;
      ctx.fillText(label, Math.max(PAD.l, right - ctx.measureText(label).width), y(need) - 4);
    }
    // What the browser tests read: the lines drawn.
    this.canvas.dataset.need = String(need);
    this.canvas.dataset.budget = String(budget);
  }

  bind() {
    const c = this.canvas;
    let down = false;
    let pending = null;
    const move = (x) => {
      pending = this.eventAt(x);
      requestAnimationFrame(() => {
        if (pending === null) return;
        this.onCursor(pending);
        pending = null;
      });
    };
    c.addEventListener("mousedown", (ev) => {
      if (!this.tl) return;
      c.focus();
      down = true;
      if (ev.shiftKey) this.brush = { a: ev.offsetX, b: ev.offsetX };
      else move(ev.offsetX);
    });
    c.addEventListener("mousemove", (ev) => {
      if (!down) return;
      if (this.brush) {
        this.brush.b = ev.offsetX;
        this.draw();
      } else move(ev.offsetX);
    });
    const up = () => {
      if (down && this.brush) {
        const [a, b] = [this.eventAt(Math.min(this.brush.a, this.brush.b)), this.eventAt(Math.max(this.brush.a, this.brush.b))];
        this.brush = null;
        if (b - a >= 2) this.onRange([a, b + 1]);
        else this.draw();
      }
      down = false;
    };
    c.addEventListener("mouseup", up);
    c.addEventListener("mouseleave", up);
    c.addEventListener("dblclick", () => this.onRange(null));
    c.addEventListener("keydown", (ev) => {
      if (!this.tl) return;
      const bucket = Math.max(1, Math.round((this.tl.end - this.tl.start) / this.tl.n));
      const by = { ArrowLeft: -1, ArrowRight: 1, PageUp: -10 * bucket, PageDown: 10 * bucket }[ev.key];
      if (by === undefined) return;
      ev.preventDefault();
      const step = ev.shiftKey ? by * bucket : by;
      this.onCursor(Math.min(this.tl.end - 1, Math.max(this.tl.start, this.cursor + step)));
    });
    new ResizeObserver(() => {
      if (resized(c)) this.draw();
    }).observe(c);
  }
}
