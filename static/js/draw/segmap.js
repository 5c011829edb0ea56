// The segment map on a canvas: one row per segment, blocks to scale, coloured by call site or
// by what they hold;
// free gaps pinned by live blocks hatched and outlined, the live blocks that pin them outlined.
// Only visible rows are drawn, and a row never needs more shapes than it has pixels.

import { fit as fitCanvas, resized, counted } from "./canvas.js";
import { LABEL, ROW, BAR, order, fit, runs, hit, rowAt, zoom } from "../data/layout.js";
import { FREE, PINNED, PENDING, siteColor, siteKey, categoryColor } from "../data/colors.js";
import { bytes, site } from "../data/format.js";

export class SegMap {
  constructor(canvas, tooltip, details, { onSelect }) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.details = details;
    this.onSelect = onSelect;
    this.map = null;
    this.sort = "address";
    this.sel = null;
    this.site = null;
    /** `site` (a colour per call site) or `category` (a colour per what a block holds). */
    this.colourBy = "site";
    this.view = { x0: 0, bpp: 1, y0: 0 };
    this.fitted = false;
    this.rows = [];
    this.bind();
  }

  setMap(map) {
    this.map = map;
    // As tall as the rows need, within bounds; more rows scroll (shift-wheel or drag).
    const want = Math.max(120, Math.min(520, map.segments.length * ROW + 8));
    if (Math.abs(this.canvas.clientHeight - want) > 2) this.canvas.style.height = `${want}px`;
    this.rowOrder = order(map.segments, this.sort);
    if (!this.fitted) this.resetView();
    this.showSelected();
    this.draw();
  }

  /** The details of the selected block, where this map has it (a link opened cold, say). */
  showSelected() {
    if (!this.map || !this.sel) return;
    for (const seg of this.map.segments) {
      const block = seg.blocks.find((b) => b.address === this.sel);
      if (block) {
        this.details.textContent = this.describe({ seg, block }).join("\n");
        this.details.hidden = false;
        return;
      }
    }
  }

  setSort(sort) {
    this.sort = sort;
    if (this.map) this.rowOrder = order(this.map.segments, sort);
    this.draw();
  }

  resetView() {
    if (!this.map) return;
    this.view = { x0: 0, bpp: fit(this.map.segments, this.canvas.clientWidth), y0: 0 };
    this.fitted = true;
  }

  setColourBy(by) {
    this.colourBy = by === "category" ? "category" : "site";
    this.draw();
  }

  highlight(siteKeyOrNull) {
    if (siteKeyOrNull === this.site) return;
    this.site = siteKeyOrNull;
    this.draw();
  }

  select(address) {
    this.sel = address;
    this.draw();
  }

  barWidth() {
    return this.canvas.clientWidth - LABEL - 8;
  }

  stackOf(block) {
    return this.map.stacks[String(block.stack)] || null;
  }

  colorOf(seg, run) {
    if (run.kind === "free") return FREE;
    if (run.kind === "pending") return PENDING;
    if (run.kind === "pinned") return this.hatch;
    if (run.block < 0) return "#55606e";
    if (this.colourBy === "category") return categoryColor(seg.blocks[run.block].category);
    const st = this.stackOf(seg.blocks[run.block]);
    return siteColor(siteKey(st && st.call_site));
  }

  draw() {
    const c = this.canvas;
    const { ctx, w, h } = fitCanvas(c);
    if (!this.hatch) this.hatch = makeHatch(ctx);
    if (!this.map) return;
    counted(c);
    const width = this.barWidth();
    const visible = Math.ceil(h / ROW);
    const first = Math.max(0, Math.min(this.view.y0, Math.max(0, this.rowOrder.length - visible)));
    this.view.y0 = first;
    this.rows = [];
    ctx.font = "11px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    // A label that does not fit its column keeps the size whole and shortens the address.
    const room = LABEL - 8;
    let cut = 0;
    const label = (seg) => {
      const full = `${seg.address} ${bytes(seg.size)}`;
      if (ctx.measureText(full).width <= room) return full;
      const short = `…${seg.address.slice(-8)} ${bytes(seg.size)}`;
      if (ctx.measureText(short).width > room) cut++;
      return short;
    };
    for (let r = first; r < Math.min(this.rowOrder.length, first + visible + 1); r++) {
      const seg = this.map.segments[this.rowOrder[r]];
      const y = (r - first) * ROW + 3;
      ctx.fillStyle = "#334";
      ctx.fillText(label(seg), 4, y + BAR / 2);
      const rowRuns = runs(seg, this.view.x0, this.view.bpp, width);
      this.rows.push({ r, seg, runs: rowRuns, y });
      for (const run of rowRuns) this.drawRun(ctx, seg, run, y);
      const end = (seg.size - this.view.x0) / this.view.bpp;
      ctx.strokeStyle = "#8a919c";
      ctx.lineWidth = 1;
      ctx.strokeRect(LABEL + Math.max(0, -this.view.x0 / this.view.bpp) + 0.5, y + 0.5, Math.max(1, Math.min(width, end)), BAR - 1);
    }
    // What the browser tests read: labels that still did not fit, and, to find shapes, the
    // geometry of this drawing.
    c.dataset.labelsCut = String(cut);
    c.dataset.layout = JSON.stringify({ label: LABEL, row: ROW, bar: BAR, top: 3, x0: this.view.x0, bpp: this.view.bpp, first, order: this.rowOrder.map((i) => this.map.segments[i].address), event: this.map.event });
  }

  drawRun(ctx, seg, run, y) {
    const x = LABEL + run.x;
    const block = run.block >= 0 ? seg.blocks[run.block] : null;
    const key = block ? siteKey(this.stackOf(block)?.call_site) : null;
    const dim = this.site !== null && run.kind === "alloc" && key !== this.site;
    ctx.globalAlpha = dim ? 0.25 : 1;
    ctx.fillStyle = this.colorOf(seg, run);
    ctx.fillRect(x, y, Math.max(run.w, 1), BAR);
    ctx.globalAlpha = 1;
    if (run.kind === "pinned" && run.w >= 3) {
      ctx.strokeStyle = "#3a3f47";
      ctx.lineWidth = 1;
      ctx.strokeRect(x + 0.5, y + 0.5, run.w - 1, BAR - 1);
    }
    if (block && block.pinned_share > 0 && run.w >= 2) {
      ctx.strokeStyle = "#b3261e";
      ctx.lineWidth = 2;
      ctx.strokeRect(x + 1, y + 1, run.w - 2, BAR - 2);
    }
    if (block && (block.address === this.sel || (this.site !== null && key === this.site))) {
      ctx.strokeStyle = "#000";
      ctx.lineWidth = 2.5;
      ctx.strokeRect(x + 1, y + 1, Math.max(run.w - 2, 1), BAR - 2);
    }
  }

  /** The block under a canvas point, with its segment. */
  pick(px, py) {
    const r = rowAt(py - 3, this.view.y0);
    const row = this.rows.find((x) => x.r === r);
    if (!row || px < LABEL) return null;
    const run = hit(row.runs, px - LABEL);
    if (!run) return null;
    return { seg: row.seg, run, block: run.block >= 0 ? row.seg.blocks[run.block] : null };
  }

  describe(p) {
    const lines = [];
    if (!p.block) {
      lines.push(`${p.run.kind === "pinned" ? "free, pinned by live blocks" : p.run.kind}: blocks too small to show at this zoom`);
      return lines;
    }
    const b = p.block;
    lines.push(`${b.state} at ${b.address}`);
    lines.push(`size ${bytes(b.size)}${b.state === "inactive" ? "" : `, requested ${bytes(b.requested_size)}`}`);
    // What it holds (parameter, activation, KV cache, ...), as the category colouring shows.
    if (b.category && b.state !== "inactive") lines.push(`holds: ${b.category.replace("_", " ")}`);
    if (b.state === "inactive") lines.push(p.seg.pinned_free_bytes > 0 ? "free, but pinned: this segment holds live blocks" : "free, and the segment can be released");
    if (b.pinned_share > 0) lines.push(`pins ${bytes(b.pinned_share)} of free memory`);
    if (b.alloc_event !== null) lines.push(`allocated at event ${b.alloc_event}`);
    lines.push(`segment ${p.seg.address}, ${bytes(p.seg.size)}, ${p.seg.pool} pool${p.seg.expandable ? ", expandable" : ""}`);
    const st = this.stackOf(b);
    if (st && st.frames.length) {
      lines.push("stack:");
      for (const f of st.frames.slice(0, 14)) lines.push(`  ${site(f)}`);
      if (st.frames.length > 14) lines.push(`  … ${st.frames.length - 14} more`);
    }
    return lines;
  }

  bind() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener("mousemove", (ev) => {
      if (drag) {
        const dx = ev.offsetX - drag.x;
        const dy = ev.offsetY - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
        this.view.x0 = Math.max(0, drag.x0 - dx * this.view.bpp);
        this.view.y0 = Math.max(0, drag.y0 - Math.round(dy / ROW));
        this.draw();
        return;
      }
      const p = this.map && this.pick(ev.offsetX, ev.offsetY);
      if (!p) {
        this.tooltip.hidden = true;
        return;
      }
      this.tooltip.textContent = this.describe(p).join("\n");
      this.tooltip.hidden = false;
      const left = Math.min(ev.offsetX + 14, c.clientWidth - 300);
      this.tooltip.style.left = `${Math.max(0, left)}px`;
      this.tooltip.style.top = `${ev.offsetY + 16}px`;
    });
    c.addEventListener("mouseleave", () => {
      this.tooltip.hidden = true;
      drag = null;
    });
    c.addEventListener("mousedown", (ev) => {
      drag = { x: ev.offsetX, y: ev.offsetY, x0: this.view.x0, y0: this.view.y0, moved: false };
    });
    c.addEventListener("mouseup", (ev) => {
      const moved = drag && drag.moved;
      drag = null;
      if (moved) return;
      const p = this.map && this.pick(ev.offsetX, ev.offsetY);
      if (!p || !p.block) return;
      this.sel = p.block.address;
      this.details.textContent = this.describe(p).join("\n");
      this.details.hidden = false;
      this.onSelect(this.sel);
      this.draw();
    });
    c.addEventListener("wheel", (ev) => {
      if (!this.map) return;
      ev.preventDefault();
      if (ev.shiftKey) {
        this.view.y0 = Math.max(0, this.view.y0 + Math.sign(ev.deltaY) * 3);
      } else {
        this.view = zoom(this.view, Math.max(0, ev.offsetX - LABEL), ev.deltaY > 0 ? 1.25 : 0.8);
      }
      this.draw();
    }, { passive: false });
    c.addEventListener("dblclick", () => {
      this.resetView();
      this.draw();
    });
    c.addEventListener("keydown", (ev) => {
      const f = { "+": 0.8, "=": 0.8, "-": 1.25 }[ev.key];
      if (f) {
        this.view = zoom(this.view, this.barWidth() / 2, f);
        this.draw();
      }
    });
    new ResizeObserver(() => {
      if (resized(c)) this.draw();
    }).observe(c);
  }
}

/** Grey diagonal hatching for pinned free memory. */
function makeHatch(ctx) {
  const tile = new OffscreenCanvas(6, 6);
  const t = tile.getContext("2d");
  t.fillStyle = "#eceef1";
  t.fillRect(0, 0, 6, 6);
  t.strokeStyle = PINNED;
  t.lineWidth = 2;
  t.beginPath();
  t.moveTo(-1, 7);
  t.lineTo(7, -1);
  t.stroke();
  return ctx.createPattern(tile, "repeat");
}
