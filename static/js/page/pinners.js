// The table of who pins free memory: one row per call site, a click highlights its blocks on
// the map (and a second click clears it). Text from the snapshot goes in as text only.

import { bytes, site } from "../data/format.js";

/** Fills `body` with `pinners`; `selected` is the row on, `pick(i)` returns the row on after a click. */
export function renderPinners(body, pinners, selected, pick) {
  body.replaceChildren();
  pinners.forEach((x, i) => {
    const tr = document.createElement("tr");
    for (const text of [site(x.call_site), String(x.blocks), bytes(x.live_bytes), bytes(x.pinned_free_bytes)]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    if (selected === i) tr.classList.add("on");
    tr.addEventListener("click", () => {
      const on = pick(i);
      for (const row of body.children) row.classList.remove("on");
      if (on !== null) tr.classList.add("on");
    });
    body.append(tr);
  });
}
