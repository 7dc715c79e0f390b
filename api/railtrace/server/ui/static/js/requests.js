// The request list (`/requests`): filters, orders and keyset paging over the query API.

import { FLAGS, PAGE_SIZE, PATH_CLASSES, Unauthorized, api, flagBadge, h, pathBadge, reqHref, secs, short, table } from "./common.js";

const LIST_FILTERS = ["flag", "path_class", "node", "pod", "model", "since", "until"];
// The API's orders (`order=`), each paged by its own cursor over the whole filtered window.
const LIST_ORDERS = {
  start: { label: "newest", first: "« newest", next: "older »", note: "" },
  ttft: { label: "TTFT", first: "« slowest", next: "faster »", note: "slowest TTFT first; requests without a first token are not in this order" },
  kv_time: { label: "KV time", first: "« slowest", next: "faster »", note: "slowest KV transfer first; requests without a KV transfer are not in this order" },
};

export async function requestsPage(main, params) {
  const q = new URLSearchParams();
  for (const k of [...LIST_FILTERS, "order", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
  const limit = Number.parseInt(params.get("limit") || "", 10);
  q.set("limit", String(limit >= 1 && limit <= 1000 ? limit : PAGE_SIZE));
  const orderKey = Object.hasOwn(LIST_ORDERS, params.get("order") || "") ? params.get("order") : "start";
  const order = LIST_ORDERS[orderKey];
  let page;
  try {
    page = await api(`/api/v1/requests?${q}`);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    main.replaceChildren(filterForm(params), h("p", { class: "bad", role: "alert" }, `The filter was refused: ${e.message}`));
    return;
  }
  const orderLink = (key) => {
    const p = new URLSearchParams(params);
    p.delete("cursor"); // a cursor pages on only in the order that issued it
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
  const first = new URLSearchParams(params);
  first.delete("cursor");
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Requests")),
    filterForm(params),
    h("div", { class: "tabs" }, "order: ", Object.keys(LIST_ORDERS).map(orderLink),
      order.note ? h("span", { class: "muted" }, ` (${order.note})`) : ""),
    table(["start (UTC)", "request", "TTFT", "KV time", "path", "prefill → decode", "flags"], rows, "requests"),
    h("nav", { class: "pager" },
      params.get("cursor") ? h("a", { href: `/requests?${first}`, id: "first-page" }, order.first) : "",
      page.next_cursor ? h("a", { href: `/requests?${next}`, id: "next-page", rel: "next" }, order.next) : h("span", { class: "muted" }, "end of list")));
}

function filterForm(params) {
  const sel = (name, values) => h("label", {}, name.replace("_", " "),
    h("select", { name }, h("option", { value: "" }, "any"),
      values.map((v) => h("option", { value: v, selected: params.get(name) === v }, v))));
  const txt = (name, ph) => h("label", {}, name,
    h("input", { name, value: params.get(name) || "", placeholder: ph, size: 18 }));
  return h("form", { class: "filters", method: "get", action: "/requests" },
    sel("flag", FLAGS), sel("path_class", PATH_CLASSES), txt("node", "node name"), txt("pod", "pod name"),
    txt("model", "model"), txt("since", "RFC 3339 or unix s"), txt("until", "RFC 3339 or unix s"),
    params.get("order") ? h("input", { type: "hidden", name: "order", value: params.get("order") }) : "",
    h("button", { type: "submit" }, "Filter"), h("a", { href: "/requests" }, "clear"));
}
