// Shared helpers of the railtrace UI pages: constants, DOM building, formatting, the API client
// and the token form. Plain ES module, no dependencies, no build step. Text from spans is always
// inserted as text, never as HTML.
export const TOKEN_KEY = "railtrace.api_token";
export const STAGES = ["scheduling", "prefill_queue", "prefill", "kv_transfer", "decode_queue", "decode"];
export const FLAGS = [
  "tcp_fallback", "cross_rail", "gpu_nic_mismatch", "topology_blind_pairing",
  "broken_trace", "kv_transfer_failed", "slow_kv_transfer",
];
export const PATH_CLASSES = ["nvlink", "shm", "rdma_same_rail", "rdma_cross_rail", "tcp", "unknown"];
export const LEVELS = ["host", "nvlink", "subblock", "block", "zone", "region", "unknown"];
export const PAGE_SIZE = 50;

export class Unauthorized extends Error {}

// -- DOM helpers ------------------------------------------------------------------------

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

// The same for SVG elements (charts, drawings): attributes only, no inline style text.
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const secs = (x) => (x === null || x === undefined ? "—" : x >= 1 ? `${x.toFixed(2)} s` : `${(x * 1000).toFixed(1)} ms`);
export const pct = (x) => (x === null || x === undefined ? "—" : `${(x * 100).toFixed(1)}%`);
export const bytes = (n) => {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
};
export const short = (s, n = 12) => (s && s.length > n ? `${s.slice(0, n)}…` : s || "—");
export const reqHref = (id) => `/requests/${encodeURIComponent(id)}`;

export function flagBadge(name) {
  return h("a", { class: `flag flag-${name}`, href: `/requests?flag=${name}`, title: name }, name);
}

export function pathBadge(pc) {
  return h("span", { class: `path path-${pc || "unknown"}` }, pc || "—");
}

export function table(headers, rows, cls) {
  return h("div", { class: "scroll" },
    h("table", { class: cls || "" },
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none")))));
}

export function section(title, ...body) {
  return h("section", { class: "card" }, h("h2", {}, title), ...body);
}

// -- API --------------------------------------------------------------------------------

export async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const resp = await fetch(path, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  if (resp.status === 401) throw new Unauthorized();
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = new Error(errorText(body) || `${resp.status} ${resp.statusText}`);
    err.status = resp.status;
    err.body = body;
    throw err;
  }
  return body;
}

// The server's own words for a refused request: FastAPI's `detail` is a string, or for a refused
// parameter a list of {loc, msg}; Grafana-shaped answers carry `message`.
export function errorText(body) {
  const d = body && (body.detail ?? body.message ?? body.error);
  if (d === undefined || d === null) return "";
  if (typeof d === "string") return d;
  if (Array.isArray(d)) {
    return d.map((e) => (e && typeof e === "object"
      ? `${(e.loc || []).filter((x) => x !== "query" && x !== "path").join(".") || "request"}: ${e.msg || JSON.stringify(e)}`
      : String(e))).join("; ");
  }
  return JSON.stringify(d);
}

// An optional part of a page: its failure is shown in its place, not over the page.
export async function maybe(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    return { error: e.message, status: e.status, body: e.body };
  }
}

export function tokenForm(main) {
  const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true, "aria-label": "API token" });
  main.replaceChildren(section("API token",
    h("p", {}, "This railtrace requires its API token (RAILTRACE_API_TOKEN) to read traces. It is kept for this browser tab only."),
    h("form", {
      class: "filters",
      onsubmit: (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        location.reload();
      },
    }, input, h("button", { type: "submit" }, "Open"))));
}

export function tile(label, value, href, cls) {
  const v = h("div", { class: `value ${cls || ""}` }, value);
  return h("div", { class: "tile" }, h("div", { class: "label" }, label), href ? h("a", { href }, v) : v);
}
