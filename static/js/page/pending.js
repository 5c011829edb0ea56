// The page of a snapshot still being analysed: progress until it is ready, then a reload into
// the full page; the reader's message if it failed.

import { bytes } from "../data/format.js";

/** Until the analysis is done: show progress, then reload into the full page. */
export async function pending(api) {
  const text = document.getElementById("status-text");
  const bar = document.getElementById("progress");
  for (;;) {
    const r = await fetch(api);
    if (!r.ok) return;
    const s = await r.json();
    bar.value = s.progress;
    text.textContent = s.status === "analyzing" ? `Analysing: ${Math.round(s.progress * 100)}% of ${bytes(s.bytes)} read.` : `Analysis ${s.status}.`;
    if (s.status === "ready") return location.reload();
    if (s.status === "failed") {
      text.textContent = "The analysis failed:";
      let err = document.getElementById("error");
      if (!err) {
        err = document.createElement("p");
        err.id = "error";
        err.className = "error";
        bar.after(err);
      }
      err.textContent = s.error;
      bar.hidden = true;
      return;
    }
    await new Promise((res) => setTimeout(res, 400));
  }
}
