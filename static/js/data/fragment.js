// The view's state in the URL fragment, so a share link reopens the same view. Pure: no DOM.
// Format: #d=DEVICE&e=EVENT&sort=address|size|pinned&sel=0xADDR&site=N&r=START-END&c=category
// (`c` only when live blocks are coloured by what they hold; by call site is the default).

const SORTS = new Set(["address", "size", "pinned"]);

export function parse(hash) {
  const out = { device: null, event: null, sort: "address", sel: null, site: null, range: null };
  const params = new URLSearchParams(String(hash || "").replace(/^#/, ""));
  const int = (k) => {
    const v = params.get(k);
    return v !== null && /^\d+$/.test(v) ? Number(v) : null;
  };
  out.device = int("d");
  out.event = int("e");
  out.site = int("site");
  const sort = params.get("sort");
  if (SORTS.has(sort)) out.sort = sort;
  const sel = params.get("sel");
  if (sel && /^0x[0-9a-f]{1,16}$/.test(sel)) out.sel = sel;
  const r = params.get("r");
  const m = r && /^(\d+)-(\d+)$/.exec(r);
  if (m && Number(m[1]) < Number(m[2])) out.range = [Number(m[1]), Number(m[2])];
  if (params.get("c") === "category") out.colour = "category";
  return out;
}

export function format(v) {
  const p = new URLSearchParams();
  if (v.device !== null && v.device !== undefined) p.set("d", String(v.device));
  if (v.event !== null && v.event !== undefined) p.set("e", String(v.event));
  if (v.sort && v.sort !== "address") p.set("sort", v.sort);
  if (v.sel) p.set("sel", v.sel);
  if (v.site !== null && v.site !== undefined) p.set("site", String(v.site));
  if (v.range) p.set("r", `${v.range[0]}-${v.range[1]}`);
  if (v.colour === "category") p.set("c", "category");
  return "#" + p.toString();
}
