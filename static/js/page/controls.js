// The page's forms and buttons that stand apart from the drawings: the what-if form (a
// simulation through the API) and the copy buttons of the remedies' code.

import { bytes } from "../data/format.js";

/** Each device's what-if form asks the API to replay the trace under other settings. */
export function bindWhatIf(api) {
  for (const form of document.querySelectorAll("form.whatif")) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const out = form.querySelector(".result");
      const q = new URLSearchParams();
      for (const name of ["conf", "mempool", "reuse", "capacity"]) {
        const v = form.elements[name].value.trim();
        if (v || name === "conf") q.set(name, v);
      }
      if (!form.elements.conf.value.trim()) q.delete("conf");
      out.textContent = "Simulating…";
      const r = await fetch(`${api}/devices/${form.dataset.device}/simulate?${q}`);
      const o = await r.json();
      if (!r.ok) {
        out.textContent = `Cannot simulate: ${o.detail}`;
        return;
      }
      const verdict = o.oom ? `out of memory at event ${o.oom.event_index} (${bytes(o.oom.requested_bytes)} requested)` : "no OOM";
      const within = o.capacity_bytes === null ? " (no budget)" : ` within ${bytes(o.capacity_bytes)}${o.capacity_source === "implied" ? ", the budget the OOM implies" : ""}`;
      out.textContent = `Predicted${within}: ${verdict}, peak ${bytes(o.peak_reserved_bytes)} reserved, ${bytes(o.pinned_free_bytes_at_end)} pinned at the end (${o.replayed_events} events replayed).`;
    });
  }
}

/** Copy buttons put a remedy's code on the clipboard. */
export function bindCopy() {
  for (const b of document.querySelectorAll("button.copy")) {
    b.addEventListener("click", async () => {
      const code = b.parentElement.querySelector("code").textContent;
      try {
        await navigator.clipboard.writeText(code);
        b.textContent = "Copied";
      } catch {
        b.textContent = "Select and copy";
      }
      setTimeout(() => (b.textContent = "Copy"), 1500);
    });
  }
}

/** The delete button: asks first, sends the session's token and this browser's delete key
 *  for the upload (kept when it was uploaded here), asks for either when the server refuses,
 *  and goes home once the snapshot is gone. */
export function bindDelete(api) {
  const button = document.getElementById("delete");
  if (!button) return;
  const id = api.split("/").pop();
  button.addEventListener("click", async () => {
    if (!confirm("Delete this snapshot? Its link stops working for everyone.")) return;
    const send = () => {
      const headers = {};
      const t = sessionStorage.getItem("fragscope-token");
      if (t) headers.Authorization = `Bearer ${t}`;
      const k = localStorage.getItem(`fragscope-key:${id}`);
      if (k) headers["X-Fragscope-Key"] = k;
      return fetch(api, { method: "DELETE", headers });
    };
    let r = await send();
    if (r.status === 401) {
      const t = prompt("This server needs its token to delete:");
      if (!t) return;
      sessionStorage.setItem("fragscope-token", t);
      r = await send();
    } else if (r.status === 403) {
      const k = prompt("Only the uploader deletes a snapshot: paste the delete key its upload returned:");
      if (!k) return;
      localStorage.setItem(`fragscope-key:${id}`, k.trim());
      r = await send();
    }
    if (r.ok) {
      localStorage.removeItem(`fragscope-key:${id}`);
      location.href = "/";
    } else button.textContent = `delete failed (${r.status})`;
  });
}

/** "compare with…": opens the comparison of this snapshot (a) with the one picked (b). */
export function bindCompare(id) {
  const select = document.getElementById("compare-with");
  if (!select) return;
  select.addEventListener("change", () => {
    if (/^[0-9a-f]{32}$/.test(select.value)) location.href = `/compare/${id}/${select.value}`;
  });
}
