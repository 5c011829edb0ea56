// The home page: drag-and-drop or pick snapshots; each is uploaded with a progress bar, then
// its analysis is followed to the end. One file lands on its page; several dropped together
// are one run (ranks from `rank<N>` in the file names, else their order) and land on its page.

import { bytes } from "./data/format.js";

const drop = document.getElementById("drop");
const input = document.getElementById("files");
const list = document.getElementById("uploads");
const token = document.getElementById("token");
// The token is remembered for this browser session (not across sessions, not in the URL).
if (token) {
  token.value = sessionStorage.getItem("fragscope-token") || "";
  token.addEventListener("change", () => sessionStorage.setItem("fragscope-token", token.value));
}

drop.addEventListener("dragover", (ev) => {
  ev.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (ev) => {
  ev.preventDefault();
  drop.classList.remove("over");
  start([...ev.dataTransfer.files]);
});
input.addEventListener("change", () => start([...input.files]));

function start(files) {
  const run = files.length > 1 ? runKey() : null;
  const ranks = rankFiles(files);
  const jobs = files.map((f, i) => upload(f, run ? { key: run, rank: ranks[i] } : null));
  Promise.all(jobs).then((results) => {
    const done = results.filter(Boolean);
    if (files.length === 1 && done.length === 1) location.href = done[0].page_url;
    else if (run && done.length && done[0].run) location.href = done[0].run.page_url;
    else refreshRecent();
  });
}

/** A key no other drop shares (any random string groups the uploads; it opens nothing). */
function runKey() {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return `browser-${[...b].map((x) => x.toString(16).padStart(2, "0")).join("")}`;
}

/** Each file's rank: the number after `rank` in its name, else its place in the drop. */
function rankFiles(files) {
  const found = files.map((f) => /rank[_-]?(\d+)/i.exec(f.name));
  const all = found.every(Boolean) && new Set(found.map((m) => m[1])).size === files.length;
  return files.map((_, i) => (all ? Number(found[i][1]) : i));
}

/** Uploads one file (XHR: fetch cannot report upload progress); resolves to the upload's
 * answer once analysed, or null. */
function upload(file, run) {
  const li = document.createElement("li");
  const title = document.createElement("div");
  title.textContent = `${file.name} (${bytes(file.size)})`;
  const bar = document.createElement("progress");
  bar.max = 1;
  bar.value = 0;
  const status = document.createElement("div");
  status.className = "hint";
  status.textContent = "Uploading…";
  li.append(title, bar, status);
  list.append(li);
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    const into = run ? `&run=${encodeURIComponent(run.key)}&rank=${run.rank}` : "";
    xhr.open("POST", `/api/v1/snapshots?name=${encodeURIComponent(file.name)}${into}`);
    if (token && token.value) xhr.setRequestHeader("Authorization", `Bearer ${token.value}`);
    xhr.upload.addEventListener("progress", (ev) => {
      if (ev.lengthComputable) bar.value = ev.loaded / ev.total;
    });
    xhr.addEventListener("load", async () => {
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = { detail: xhr.responseText };
      }
      if (xhr.status !== 202) {
        status.className = "error";
        status.textContent = `Refused (${xhr.status}): ${body.detail || "unknown error"}`;
        bar.hidden = true;
        return resolve(null);
      }
      keepDeleteKey(body);
      resolve(await follow(body, bar, status));
    });
    xhr.addEventListener("error", () => {
      status.className = "error";
      status.textContent = "The upload failed: the server could not be reached.";
      resolve(null);
    });
    xhr.send(file);
  });
}

/** Keeps the delete keys an upload's answer gave, in this browser only: without a server
 *  token they are what deletes the upload (and the run it started). */
function keepDeleteKey(created) {
  try {
    if (created.delete_key) localStorage.setItem(`fragscope-key:${created.id}`, created.delete_key);
    if (created.run && created.run.started) localStorage.setItem(`fragscope-key:${created.run.id}`, created.delete_key);
  } catch {
    // Storage refused (private mode): the key is still in the API's answer.
  }
}

/** Follows an analysis; the progress bar now shows the share of the file parsed. */
async function follow(created, bar, status) {
  bar.value = 0;
  for (;;) {
    const s = await (await fetch(created.status_url)).json();
    bar.value = s.progress;
    status.textContent = `Analysis ${s.status}${s.status === "analyzing" ? `: ${Math.round(s.progress * 100)}%` : ""}`;
    if (s.status === "ready" || s.status === "failed") {
      const a = document.createElement("a");
      a.href = created.page_url;
      a.textContent = s.status === "ready" ? `Open the diagnosis: ${verdictWords(s.verdict)}` : "See why it failed";
      status.replaceChildren(a);
      if (s.status === "failed") {
        const why = document.createElement("div");
        why.className = "error";
        why.textContent = s.error;
        status.append(why);
      }
      return s.status === "ready" ? created : null;
    }
    await new Promise((res) => setTimeout(res, 300));
  }
}

/** A verdict as the page says it. */
function verdictWords(v) {
  return { fragmentation: "out of memory, fragmentation", capacity: "out of memory, capacity", no_oom: "no OOM" }[v] || "ready";
}

/** The recent snapshots again, as the server renders them (escaped there), after uploads. */
async function refreshRecent() {
  const r = await fetch("/");
  if (!r.ok) return;
  const fresh = new DOMParser().parseFromString(await r.text(), "text/html").getElementById("recent");
  const now = document.getElementById("recent");
  if (fresh && now) now.replaceWith(document.importNode(fresh, true));
}
