// Unit tests of the page's pure data modules (node --test; run by the cargo suite).
import assert from "node:assert/strict";
import test from "node:test";

import { decodeTimeline, bucketOf, peak, growth, SERIES } from "../../static/js/data/columns.js";
import { parse, format } from "../../static/js/data/fragment.js";
import { runs, order, fit, hit, zoom, rowAt, ROW } from "../../static/js/data/layout.js";
import { siteColor, hash, assignSiteColors, sitesByBytes, PALETTE } from "../../static/js/data/colors.js";
import { bytes, eventLabel } from "../../static/js/data/format.js";
import { firstView, inRange, stateUrl, timelineUrl, activeUrl, activeBy } from "../../static/js/data/requests.js";

function timeline(n, start, end) {
  const v = [n, start, end];
  for (let i = 0; i < n; i++) v.push(start + i * 10);
  for (let i = 0; i < n; i++) v.push(1000 + i);
  for (let s = 0; s < SERIES.length; s++) {
    for (let i = 0; i < n; i++) v.push(i * (s + 1));
    for (let i = 0; i < n; i++) v.push(i * (s + 1) + 5);
  }
  return new Float64Array(v).buffer;
}

test("timeline columns decode without copying and find buckets", () => {
  const tl = decodeTimeline(timeline(4, 100, 140));
  assert.equal(tl.n, 4);
  assert.deepEqual([...tl.event], [100, 110, 120, 130]);
  assert.deepEqual([...tl.max.allocated_bytes], [5, 7, 9, 11]);
  assert.equal(bucketOf(tl, 125), 2);
  assert.equal(bucketOf(tl, 100), 0);
  assert.equal(bucketOf(tl, 999), 3);
  assert.equal(peak(tl, ["reserved_bytes"]), 8);
  assert.deepEqual(growth(tl), [1, 2, 3]);
  assert.throws(() => decodeTimeline(new Float64Array([5, 0, 1]).buffer));
});

test("the fragment round-trips and refuses junk", () => {
  const v = { device: 1, event: 42, sort: "pinned", sel: "0x7f00", site: 3, range: [10, 20] };
  assert.deepEqual(parse(format(v)), v);
  const junk = parse("#d=x&e=-1&sort=evil&sel=<script>&r=9-3");
  assert.equal(junk.device, null);
  assert.equal(junk.event, null);
  assert.equal(junk.sort, "address");
  assert.equal(junk.sel, null);
  assert.equal(junk.range, null);
});

const seg = {
  address: "0x1000",
  size: 1000,
  pinned_free_bytes: 400,
  blocks: [
    { address: "0x1000", size: 600, state: "active_allocated" },
    { address: "0x1258", size: 400, state: "inactive" },
  ],
};

test("runs map blocks to pixels and mark pinned gaps", () => {
  const r = runs(seg, 0, 10, 100); // 10 bytes per pixel
  assert.deepEqual(r.map((x) => [x.x, x.w, x.kind, x.block]), [
    [0, 60, "alloc", 0],
    [60, 40, "pinned", 1],
  ]);
  assert.equal(hit(r, 65).block, 1);
  assert.equal(hit(r, 150), null);
});

test("sub-pixel blocks merge into one-pixel runs of the dominant state", () => {
  const tiny = {
    address: "0x0",
    size: 100,
    pinned_free_bytes: 0,
    blocks: [
      { address: "0x0", size: 30, state: "active_allocated" },
      { address: "0x1e", size: 60, state: "inactive" },
      { address: "0x5a", size: 10, state: "active_allocated" },
    ],
  };
  const r = runs(tiny, 0, 1000, 50); // all in pixel 0
  assert.equal(r.length, 1);
  assert.equal(r[0].kind, "free");
  assert.equal(r[0].block, -1);
});

test("zoom keeps the byte under the pointer", () => {
  const v = zoom({ x0: 0, bpp: 10 }, 50, 0.5);
  assert.equal(v.x0 + 50 * v.bpp, 500);
  assert.equal(v.bpp, 5);
  assert.equal(rowAt(ROW * 2 + 3, 5), 7);
  assert.equal(rowAt(ROW * 2 + ROW - 1, 5), -1, "the gap between rows is no row");
});

test("sorting and fitting", () => {
  const segs = [{ size: 10, pinned_free_bytes: 0 }, { size: 30, pinned_free_bytes: 5 }, { size: 20, pinned_free_bytes: 9 }];
  assert.deepEqual(order(segs, "size"), [1, 2, 0]);
  assert.deepEqual(order(segs, "pinned"), [2, 1, 0]);
  assert.deepEqual(order(segs, "address"), [0, 1, 2]);
  assert.equal(fit(segs, 170 + 8 + 30), 1);
});

test("colours are stable per call site and formats read well", () => {
  assert.equal(siteColor("a.py:1:f"), siteColor("a.py:1:f"));
  assert.notEqual(siteColor("a.py:1:f"), siteColor("a.py:2:f"));
  assert.equal(hash(""), 0x811c9dc5);
  // The sites that hold the most get twelve distinct palette colours, in order; the rest a
  // muted hue; two neighbouring lines are never left to the hash alone.
  const keys = Array.from({ length: 14 }, (_, i) => `m.py:${i}:f`);
  assert.equal(assignSiteColors(["m.py:0:f", "", "m.py:0:f", ...keys.slice(1)]), true);
  assert.deepEqual(keys.slice(0, 12).map(siteColor), PALETTE);
  assert.equal(new Set(PALETTE).size, 12);
  assert.match(siteColor(keys[12]), /^hsl\(\d+ 30% /);
  assert.equal(assignSiteColors(keys), false, "the same sites: nothing to redraw");
  const device = { breakdown: [{ call_sites: [{ bytes: 5, call_site: { filename: "a.py", line: 1, name: "f" } }] },
    { call_sites: [{ bytes: 9, call_site: { filename: "b.py", line: 2, name: "g" } }] }] };
  assert.deepEqual(sitesByBytes(device), ["b.py:2:g", "a.py:1:f"]);
  assignSiteColors([]);
  assert.equal(bytes(545259520), "520.00 MiB");
  assert.equal(bytes(12), "12 B");
});

test("the cursor caption names the event's request, site and tags", () => {
  assert.equal(eventLabel(7, 100, null), "After event 7 of 100");
  const info = {
    action: "alloc",
    size: 2097152,
    call_site: { filename: "train.py", line: 12, name: "step" },
    user_metadata: "step=3",
    compile_context: null,
  };
  assert.equal(eventLabel(7, 100, info), "After event 7 of 100: alloc 2.00 MiB at train.py:12 (step) [step=3]");
  const bare = { action: "free_completed", size: 512, call_site: null, user_metadata: null, compile_context: null };
  assert.equal(eventLabel(8, 100, bare), "After event 8 of 100: free_completed 512 B");
});

test("colouring by what blocks hold is kept in the fragment, and every category has its colour", async () => {
  const { categoryColor, CATEGORY_COLORS } = await import("../../static/js/data/colors.js");
  const v = { device: 0, event: 7, sort: "address", sel: null, site: null, range: null, colour: "category" };
  assert.deepEqual(parse(format(v)), v);
  assert.equal(parse("#c=evil").colour, undefined);
  const colours = Object.values(CATEGORY_COLORS);
  assert.equal(new Set(colours).size, 9, "nine distinct colours");
  assert.equal(colours.length, 9);
  assert.equal(categoryColor("activation"), CATEGORY_COLORS.activation);
  assert.equal(categoryColor(undefined), CATEGORY_COLORS.unknown);
});

import { decodeCurves, curvesMax, grid, sortRanks, rankColor, curveAt, stepLabelEvery, stepsOfAxis } from "../../static/js/data/curves.js";

test("step labels stand 40 px apart at most every 1, 2, 5, 10...; the axis header is read", () => {
  assert.equal(stepLabelEvery(8, 800), 1);
  assert.equal(stepLabelEvery(16, 400), 2);
  assert.equal(stepLabelEvery(300, 800), 20);
  assert.equal(stepsOfAxis("steps=12"), 12);
  assert.equal(stepsOfAxis("share"), null);
  assert.equal(stepsOfAxis(null), null);
});

test("curves decode per snapshot, with not-ready ones marked", () => {
  const points = 3;
  const buf = new ArrayBuffer(8 + 2 * points * 8);
  const head = new DataView(buf);
  head.setUint32(0, 2, true);
  head.setUint32(4, points, true);
  const f = new Float32Array(buf, 8);
  f.set([1, 5, 2, 0, 1, 1, NaN, NaN, NaN, NaN, NaN, NaN]);
  const d = decodeCurves(buf);
  assert.equal(d.points, 3);
  assert.deepEqual([...d.curves[0].reserved], [1, 5, 2]);
  assert.deepEqual([...d.curves[0].allocated], [0, 1, 1]);
  assert.equal(d.curves[1].ready, false);
  assert.equal(curvesMax(d), 5);
});

test("more than 8 ranks become small multiples; ranks sort by rank or peak", () => {
  assert.equal(grid(8, 1000).overlay, true);
  const g = grid(64, 1120);
  assert.equal(g.overlay, false);
  assert.equal(g.cols * g.rows >= 64, true);
  const ranks = [{ rank: 0, peak_reserved_bytes: 5 }, { rank: 1, peak_reserved_bytes: 9 }, { rank: 2, peak_reserved_bytes: null }];
  assert.deepEqual(sortRanks(ranks, "peak").map((r) => r.rank), [1, 0, 2]);
  assert.deepEqual(sortRanks(ranks, "rank").map((r) => r.rank), [0, 1, 2]);
});

test("the first view fills the fragment's gaps, and its requests are the same URLs each time", () => {
  const devices = [
    { device: 0, events: 100, start: 3 },
    { device: 2, events: 50, start: 0 },
  ];
  assert.deepEqual([firstView("", devices).device, firstView("", devices).event], [0, 3]);
  const v = firstView("#d=2&e=15&r=10-20&c=category", devices);
  assert.deepEqual([v.device, v.event, v.range, v.colour], [2, 15, [10, 20], "category"]);
  // A cursor outside the zoomed range moves to its nearest edge.
  assert.equal(firstView("#d=2&e=49&r=10-20", devices).event, 19);
  assert.equal(firstView("#d=2&e=3&r=10-20", devices).event, 10);
  assert.equal(inRange({ event: 5, range: null }).event, 5, "no range, no move");
  // An unknown device falls back to the first; an event past the end to the device's start.
  assert.deepEqual([firstView("#d=7&e=100", devices).device, firstView("#d=7&e=100", devices).event], [0, 3]);
  assert.equal(firstView("#d=2&e=50", devices).event, 0);
  const api = "/api/v1/snapshots/x";
  assert.equal(stateUrl(api, 2, 49), "/api/v1/snapshots/x/devices/2/state?event=49");
  // A point per pixel for the timeline, per two for the chart, within their bounds.
  assert.equal(timelineUrl(api, 0, [0, 100], 1150.4), "/api/v1/snapshots/x/devices/0/timeline?start=0&end=100&points=1150&format=bin");
  assert.match(timelineUrl(api, 0, [0, 100], 10), /points=50&/);
  assert.match(timelineUrl(api, 0, [0, 100], 9000), /points=4000&/);
  // The chart's resolution is the one the server makes with the analysis, at any width.
  assert.equal(activeUrl(api, 0, [5, 9], "site"), "/api/v1/snapshots/x/devices/0/active?start=5&end=9&points=500&top=8&by=site");
  assert.match(activeUrl(api, 0, [0, 100], "category"), /points=500&top=8&by=category$/);
  // The chart follows the map's colouring: by category, else by call site.
  assert.deepEqual([activeBy("category"), activeBy("site"), activeBy(null)], ["category", "site", "site"]);
});

test("healthy ranks are never red, and the pointer finds the nearest curve and its rank", () => {
  for (let i = 0; i < 64; i++) {
    const hue = Number(/hsl\((\d+)/.exec(rankColor(i, false))[1]);
    assert.ok(hue >= 90 && hue <= 300, `rank ${i}: hue ${hue} is red-ish`);
  }
  assert.equal(rankColor(3, true), "#b3261e");
  const points = 3;
  const buf = new ArrayBuffer(8 + 2 * points * 8);
  const head = new DataView(buf);
  head.setUint32(0, 2, true);
  head.setUint32(4, points, true);
  new Float32Array(buf, 8, points).set([10, 10, 10]);
  new Float32Array(buf, 8 + points * 8, points).set([100, 100, 100]);
  const d = decodeCurves(buf);
  const layout = grid(2, 600);
  // 600 x 260, padding 64/8/8/18: the top curve (100, the max) at y = 8, the low one near 234.
  assert.deepEqual(curveAt(d, layout, 600, 260, 300, 10), { index: 1, value: 100 });
  assert.deepEqual(curveAt(d, layout, 600, 260, 300, 230), { index: 0, value: 10 });
  assert.equal(curveAt(d, layout, 600, 260, 10, 100), null, "left of the chart");
});

import { layoutFlame, visibleNodes, nodeAt } from "../../static/js/data/flame.js";

test("the icicle lays siblings side by side under their parent and draws only what is visible", () => {
  // root 100 -> a 60 (-> c 50), b 40
  const f = { parent: [0, 0, 0, 1], name: [0, 1, 2, 3], names: ["all", "a", "b", "c"], bytes: [100, 60, 40, 50], category: [] };
  const l = layoutFlame(f);
  assert.deepEqual([...l.depth], [0, 1, 1, 2]);
  assert.deepEqual([...l.x], [0, 0, 60, 0]);
  assert.equal(l.maxDepth, 2);
  const all = visibleNodes(l, 0, 1000);
  assert.deepEqual(all.map((n) => n[0]), [0, 1, 2, 3]);
  assert.deepEqual(all.find((n) => n[0] === 2).slice(1), [600, 1000]);
  // Zoomed to b: the root spans the view above it, a and c are out of view.
  const b = visibleNodes(l, 2, 1000);
  assert.deepEqual(b.map((n) => n[0]), [0, 2]);
  assert.deepEqual(b[1].slice(1), [0, 1000]);
  assert.equal(nodeAt(l, all, 700, 1), 2);
  assert.equal(nodeAt(l, all, 700, 2), -1, "nothing under b");
  // A node under half a pixel is not drawn.
  const tiny = layoutFlame({ ...f, bytes: [1e9, 1e9 - 1, 1, 1e9 - 1] });
  assert.equal(visibleNodes(tiny, 0, 1000).some((n) => n[0] === 2), false);
});
