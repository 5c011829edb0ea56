// The icicle of the memory alive at the cursor: one row per stack depth, outermost frame on
// top, widths in bytes, coloured by what the node's blocks mostly hold. A click zooms to a
// node (it fills the width, its ancestors above it); a click on the top row zooms out.
// Only nodes inside the view and at least half a pixel wide are drawn.

import { fit as fitCanvas } from "./canvas.js";
import { categoryColor } from "../data/colors.js";
import { bytes } from "../data/format.js";
import { layoutFlame, visibleNodes, nodeAt } from "../data/flame.js";

const ROW = 18;

export class FlameView {
  constructor(canvas, tooltip) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.l = null;
    this.focus = 0;
    this.shown = [];
    canvas.addEventListener("click", (ev) => {
      const i = this.at(ev);
      if (i < 0) return;
      this.focus = i === this.focus ? this.l.parent[i] : i;
      this.draw();
    });
    canvas.addEventListener("mousemove", (ev) => this.hover(ev));
    canvas.addEventListener("mouseleave", () => (this.tooltip.hidden = true));
  }

  setData(flame) {
    // The focus is kept across events where the same frame path still exists; else the root.
    const path = this.l ? this.pathOf(this.focus) : [];
    this.l = layoutFlame(flame);
    this.focus = this.find(path);
    const rows = Math.min(40, this.l.maxDepth + 1);
    this.canvas.style.height = `${Math.max(3, rows) * ROW + 2}px`;
    this.draw();
  }

  pathOf(i) {
    const names = [];
    while (i !== 0) {
      names.unshift(this.l.names[this.l.name[i]]);
      i = this.l.parent[i];
    }
    return names;
  }

  find(path) {
    let at = 0;
    for (const name of path) {
      let next = -1;
      for (let i = at + 1; i < this.l.parent.length; i++) {
        if (this.l.parent[i] === at && this.l.names[this.l.name[i]] === name) {
          next = i;
          break;
        }
      }
      if (next < 0) return at;
      at = next;
    }
    return at;
  }

  draw() {
    const { ctx, w } = fitCanvas(this.canvas);
    if (!this.l) return;
    this.shown = visibleNodes(this.l, this.focus, w);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (const [i, left, right] of this.shown) {
      const y = this.l.depth[i] * ROW;
      ctx.fillStyle = i === 0 ? "#c3c8d0" : categoryColor(this.l.category[i]);
      ctx.fillRect(left, y, Math.max(right - left - 1, 0.5), ROW - 1);
      if (right - left > 40) {
        const name = this.l.names[this.l.name[i]];
        const label = `${name} ${bytes(this.l.bytes[i])}`;
        ctx.fillStyle = "#111";
        ctx.save();
        ctx.beginPath();
        ctx.rect(left, y, right - left - 2, ROW);
        ctx.clip();
        ctx.fillText(label, left + 3, y + ROW / 2);
        ctx.restore();
      }
    }
    this.canvas.dataset.nodes = String(this.shown.length);
    this.canvas.dataset.focus = this.focus === 0 ? "" : this.l.names[this.l.name[this.focus]];
  }

  at(ev) {
    if (!this.l) return -1;
    const box = this.canvas.getBoundingClientRect();
    return nodeAt(this.l, this.shown, ev.clientX - box.left, Math.floor((ev.clientY - box.top) / ROW));
  }

  hover(ev) {
    const i = this.at(ev);
    if (i < 0) {
      this.tooltip.hidden = true;
      return;
    }
    const share = ((100 * this.l.bytes[i]) / (this.l.bytes[0] || 1)).toFixed(1);
    this.tooltip.textContent = `${this.l.names[this.l.name[i]]}\n${bytes(this.l.bytes[i])} (${share}% of live memory), mostly ${this.l.category[i].replace("_", " ")}`;
    this.tooltip.hidden = false;
    const box = this.canvas.parentElement.getBoundingClientRect();
    this.tooltip.style.left = `${ev.clientX - box.left + 12}px`;
    this.tooltip.style.top = `${ev.clientY - box.top + 12}px`;
  }
}
