// The request list (`/requests`): filters, a relative time range, orders, keyset paging over the
// query API (older by the API's cursor, newer by the cursors this page came through), the total
// of the window and a duration-over-time scatter of the page where a click opens the request.

import { scatter } from "./charts.js";
import { FLAGS, PAGE_SIZE, PATH_CLASSES, Unauthorized, api, flagBadge, h, maybe, pathBadge, reqHref, secs, short, table } from "./common.js";

const LIST_FILTERS = ["flag", "path_class", "node", "pod", "model", "since", "until"];
// The API's orders (`order=`), each paged by its own cursor over the whole filtered window.
const LIST_ORDERS = {
  start: { label: "newest", first: "« newest", prev: "« newer", next: "older »", note: "" },
  ttft: { label: "TTFT", first: "« slowest", prev: "« slower", next: "faster »", note: "slowest TTFT first; requests without a first token are not in this order" },
  kv_time: { label: "KV time", first: "« slowest", prev: "« slower", next: "faster »", note: "slowest KV transfer first; requests without a KV transfer are not in this order" },
};
// Relative ranges (`range=`): `since` is now minus this when the page loads.
export const RANGES = { "15m": [900, "last 15 min"], "1h": [3600, "last hour"], "6h": [21600, "last 6 h"], "24h": [86400, "last 24 h"] };
// Cursors of the pages before this one (`prev=`, repeated), so "newer" goes back; bounded.
const MAX_PREV = 20;

function effectiveParams(params) {
  const q = new URLSearchParams();
  for (const k of [...LIST_FILTERS, "order", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
  const range = params.get("range");
  if (Object.hasOwn(RANGES, range || "")) {
    q.set("since", String(Math.floor(Date.now() / 1000) - RANGES[range][0]));
    q.delete("until");
  }
  const limit = Number.parseInt(params.get("limit") || "", 10);
  q.set("limit", String(limit >= 1 && limit <= 1000 ? limit : PAGE_SIZE));
  return q;
}

// How many requests the filters match in the window, where the per-hour rollups can tell
// (/api/v1/stats: by flag, by path class, or all); other filters are not counted.
async function totalOf(q) {
  const window = ["since", "until"].filter((k) => q.get(k)).map((k) => `&${k}=${encodeURIComponent(q.get(k))}`).join("");
  const other = ["node", "pod", "model"].some((k) => q.get(k));
  if (other || (q.get("flag") && q.get("path_class"))) return null;
  const by = q.get("flag") ? "flag" : "path_class";
  const r = await maybe(`/api/v1/stats?group_by=${by}${window}`);
  if (r.error) return null;
  const key = q.get("flag") || q.get("path_class");
  return r.groups.filter((g) => !key || g[by] === key).reduce((a, g) => a + g.requests, 0);
}

export async function requestsPage(main, params) {
  const q = effectiveParams(params);
  const orderKey = Object.hasOwn(LIST_ORDERS, params.get("order") || "") ? params.get("order") : "start";
  const order = LIST_ORDERS[orderKey];
  let page;
  let total;
  try {
    [page, total] = await Promise.all([api(`/api/v1/requests?${q}`), totalOf(q)]);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    main.replaceChildren(h("div", { class: "pagehead" }, h("h1", {}, "Requests")), filterForm(params),
      h("p", { class: "bad", role: "alert", id: "refused" }, `The filter was refused: ${e.message}`));
    return;
  }
  const orderLink = (key) => {
    const p = new URLSearchParams(params);
    p.delete("cursor"); // a cursor pages on only in the order that issued it
    p.delete("prev");
    if (key === "start") p.delete("order");
    else p.set("order", key);
    return h("a", { href: `/requests?${p}`, id: `order-${key}`, class: orderKey === key ? "active" : "" },
      LIST_ORDERS[key].label);
  };
  const rows = page.items.map((r) => {
    const kv = r.kv_transfer || {};
    return h("tr", { "data-trace": r.trace_id },
      h("td", { class: "nowrap" }, h("a", { href: reqHref(r.trace_id) }, (r.start || "").replace("T", " ").slice(0, 23))),
      h("td", {}, h("a", { href: reqHref(r.trace_id), title: r.request_id || "" }, short(r.request_id || r.trace_id, 14))),
      h("td", { class: "num" }, secs(r.ttft_s)),
      h("td", { class: "num" }, secs(kv.duration_s)),
      h("td", {}, pathBadge(kv.path_class)),
      h("td", { class: "nodes" }, h("span", { title: (r.prefill || {}).node || "" }, (r.prefill || {}).pod || "—"), " → ",
        h("span", { title: (r.decode || {}).node || "" }, (r.decode || {}).pod || "—")),
      h("td", {}, h("span", { class: "flags" }, (r.flags || []).map((f) => flagBadge(f.name)))));
  });
  const prev = params.getAll("prev");
  const first = new URLSearchParams(params);
  first.delete("cursor");
  first.delete("prev");
  const newer = new URLSearchParams(params);
  newer.delete("prev");
  newer.delete("cursor");
  for (const c of prev.slice(0, -1)) newer.append("prev", c);
  if (prev.length && prev[prev.length - 1]) newer.set("cursor", prev[prev.length - 1]);
  const older = new URLSearchParams(params);
  if (page.next_cursor) {
    older.set("cursor", page.next_cursor);
    older.delete("prev");
    // The first page is `prev=` empty: "newer" from the second page goes to the first.
    for (const c of [...prev, params.get("cursor") || ""].slice(-MAX_PREV)) older.append("prev", c);
  }
  const shown = page.items.length;
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Requests")),
    filterForm(params),
    h("p", { class: "totals", id: "totals" },
      total === null
        ? `${shown} shown; the total is counted for the time range, flag and path class filters only`
        : `${total.toLocaleString()} requests match in ${params.get("range") ? RANGES[params.get("range")]?.[1] || "the range" : q.get("since") || q.get("until") ? "the range" : "the store"}; ${shown} shown`),
    durationChart(page.items, orderKey),
    h("div", { class: "tabs" }, "order: ", Object.keys(LIST_ORDERS).map(orderLink),
      order.note ? h("span", { class: "muted" }, ` (${order.note})`) : ""),
    table(["start (UTC)", "request", "TTFT", "KV time", "path", "prefill → decode", "flags"], rows, "requests"),
    h("nav", { class: "pager" },
      params.get("cursor") ? h("a", { href: `/requests?${first}`, id: "first-page" }, order.first) : "",
      params.get("cursor") && prev.length ? h("a", { href: `/requests?${newer}`, id: "prev-page", rel: "prev" }, order.prev) : "",
      page.next_cursor ? h("a", { href: `/requests?${older}`, id: "next-page", rel: "next" }, order.next) : h("span", { class: "muted" }, "end of list")));
}

// Jaeger's chart: each request of the page at its start time and end-to-end duration (TTFT in
// the TTFT order), flagged ones in red; a click opens the request.
function durationChart(items, orderKey) {
  const yOf = (r) => (orderKey === "ttft" ? r.ttft_s : orderKey === "kv_time" ? (r.kv_transfer || {}).duration_s : r.e2e_s ?? r.ttft_s);
  const what = orderKey === "ttft" ? "TTFT" : orderKey === "kv_time" ? "KV time" : "duration";
  const points = items.filter((r) => r.start && typeof yOf(r) === "number").map((r) => ({
    t_ms: Date.parse(r.start),
    y: yOf(r),
    href: reqHref(r.trace_id),
    cls: (r.flags || []).length ? "dot-flagged" : "dot-ok",
    title: `${(r.start || "").slice(11, 23)} ${what} ${secs(yOf(r))}${(r.flags || []).length ? ` · ${r.flags.map((f) => f.name).join(", ")}` : ""}`,
  }));
  const ts = points.map((p) => p.t_ms);
  return h("section", { class: "card scatter" },
    h("h2", {}, `${what[0].toUpperCase()}${what.slice(1)} of the requests shown, over time (UTC)`),
    scatter(points, { x0: Math.min(...ts), x1: Math.max(...ts), yFmt: secs, id: "duration-chart", label: `${what} per request over time` }),
    h("div", { class: "legend" }, h("span", {}, h("span", { class: "swatch dot-flagged" }), "flagged"),
      h("span", {}, h("span", { class: "swatch dot-ok" }), "no flag")));
}

function filterForm(params) {
  const sel = (name, values, labels) => h("label", {}, name.replace("_", " "),
    h("select", { name }, h("option", { value: "" }, "any"),
      values.map((v) => h("option", { value: v, selected: params.get(name) === v }, labels ? labels[v] : v))));
  const txt = (name, ph, disabled) => h("label", { class: disabled === undefined ? "" : `custom-time ${disabled ? "off" : ""}` }, name,
    h("input", { name, value: params.get(name) || "", placeholder: ph, size: 18, disabled }));
  const range = Object.hasOwn(RANGES, params.get("range") || "") ? params.get("range") : params.get("since") || params.get("until") ? "custom" : "";
  const relative = Object.hasOwn(RANGES, range);
  const rangeSel = h("select", { name: "range" }, h("option", { value: "" }, "any time"),
    Object.entries(RANGES).map(([k, [, label]]) => h("option", { value: k, selected: range === k }, label)),
    h("option", { value: "custom", selected: range === "custom" }, "custom…"));
  const since = txt("since", "RFC 3339 or unix s", relative);
  const until = txt("until", "RFC 3339 or unix s", relative);
  rangeSel.addEventListener("change", () => {
    const off = rangeSel.value !== "custom" && rangeSel.value !== "";
    for (const l of [since, until]) { l.classList.toggle("off", off); l.querySelector("input").disabled = off; }
  });
  return h("form", {
    class: "filters", method: "get", action: "/requests",
    // "custom" and "any time" are no parameter of their own: since/until say it.
    onsubmit: () => { if (!Object.hasOwn(RANGES, rangeSel.value)) rangeSel.disabled = true; },
  },
    h("label", {}, "time", rangeSel), since, until,
    sel("flag", FLAGS), sel("path_class", PATH_CLASSES), txt("node", "node name"), txt("pod", "pod name"),
    txt("model", "model"),
    params.get("order") ? h("input", { type: "hidden", name: "order", value: params.get("order") }) : "",
    params.get("limit") ? h("input", { type: "hidden", name: "limit", value: params.get("limit") }) : "",
    h("button", { type: "submit" }, "Filter"), h("a", { href: "/requests" }, "clear"));
}
