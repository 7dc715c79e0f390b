// The topology (`/topology`): nodes by block and subblock, GPU-NIC pairings, the contract audit.

import { bytes, h, maybe, pathBadge, secs, section, short, svg, table } from "./common.js";

// Links from a node or a pod to what concerns it: its requests now; pages added later (incidents)
// append theirs here.
export const nodeLinks = [(name) => h("a", { href: `/requests?node=${encodeURIComponent(name)}` }, "requests")];
export const podLinks = [(name) => h("a", { href: `/requests?pod=${encodeURIComponent(name)}` }, "requests")];

// The window whose KV transfers are drawn (`?window=`), in seconds: at most 3 hours (the API's bound).
const WINDOWS = { "15m": [900, "last 15 min"], "1h": [3600, "last hour"], "3h": [10800, "last 3 h"] };

export async function topologyPage(main, params) {
  const win = Object.hasOwn(WINDOWS, (params && params.get("window")) || "") ? params.get("window") : "1h";
  const since = Math.floor(Date.now() / 1000) - WINDOWS[win][0];
  const [topo, contract, moved] = await Promise.all([
    maybe("/api/v1/topology"), maybe("/api/v1/contract"), maybe(`/api/v1/stats/transfers?since=${since}`)]);
  if (topo.error) {
    main.replaceChildren(h("h1", {}, "Topology"), h("p", { class: "bad", role: "alert" }, topo.error));
    return;
  }
  const nodes = new Map(topo.nodes.map((n) => [n.name, n]));
  const placed = new Set();
  const blocks = Object.entries(topo.blocks || {}).map(([block, subs]) =>
    h("div", { class: "block" }, h("h3", {}, `block ${short(block, 16)}`),
      Object.entries(subs).map(([sub, names]) =>
        h("div", { class: "subblock" }, h("h4", {}, `subblock ${short(sub, 16)}`),
          names.map((n) => { placed.add(n); return nodeCard(nodes.get(n), n); })))));
  const loose = topo.nodes.filter((n) => !placed.has(n.name));
  const chooser = h("div", { class: "tabs" }, "transfers: ", Object.entries(WINDOWS).map(([w, [, label]]) =>
    h("a", { href: `/topology?window=${w}`, class: w === win ? "active" : "" }, label)));
  main.replaceChildren(...[
    h("div", { class: "pagehead" }, h("h1", {}, "Topology"), chooser),
    h("p", {}, `${topo.nodes.length} nodes, ${topo.pods.length} pods, ${Object.keys(topo.rails || {}).length} rails · sources: ${(topo.sources || []).length}`),
    topo.warnings.length ? section(`Warnings (${topo.warnings.length})`, h("ul", { class: "plain" }, topo.warnings.map((w) => h("li", { class: "warn" }, typeof w === "string" ? w : JSON.stringify(w))))) : null,
    topo.discovery_gaps.length ? section(`Discovery gaps (${topo.discovery_gaps.length})`, h("ul", { class: "plain" }, topo.discovery_gaps.map((g) => h("li", { class: "warn" }, typeof g === "string" ? g : `${g.object}: missing ${(g.missing || []).join(", ")}${g.note ? ` (${g.note})` : ""}`)))) : null,
    railMatrix(topo),
    transfersSection(topo, moved, WINDOWS[win][1]),
    contractSummary(contract),
    section("Nodes by block and subblock",
      h("details", {}, h("summary", {}, "every node's GPUs, NICs and pairings"),
        h("div", { class: "blocks" }, blocks, loose.length ? h("div", { class: "block" }, h("h3", {}, "no block label"), loose.map((n) => nodeCard(n, n.name))) : ""))),
  ].filter(Boolean));
}

// A node's distinctive part: GKE names share their long pool prefix.
const nodeLabel = (n, len = 22) => short(n.replace(/^gke-/, "").replace(/^.*-pool-/, ""), len);

// Nodes in block / subblock order, one column per rail: each GPU in the column of its paired
// NIC's rail ("gpu-0 ↔ mlx5_0"); GPUs without a paired RDMA NIC in the last column.
function railMatrix(topo) {
  const rails = Object.keys(topo.rails || {}).sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const order = [];
  for (const subs of Object.values(topo.blocks || {})) for (const names of Object.values(subs)) order.push(...names);
  for (const n of topo.nodes) if (!order.includes(n.name)) order.push(n.name);
  const byName = new Map(topo.nodes.map((n) => [n.name, n]));
  const pods = new Map();
  for (const p of topo.pods || []) if (p.node) (pods.get(p.node) || pods.set(p.node, []).get(p.node)).push(p);
  const rows = order.filter((n) => byName.has(n)).map((name) => {
    const node = byName.get(name);
    const nics = new Map(node.nics.map((n) => [n.name, n]));
    const cells = new Map(rails.map((r) => [r, []]));
    const unpaired = [];
    for (const g of node.gpus) {
      const p = (node.pairings || []).find((x) => x.gpu === g.name);
      const paired = p ? p.nics.map((n) => nics.get(n)).filter(Boolean) : [];
      const onRail = paired.filter((n) => n.rail && cells.has(n.rail));
      if (!onRail.length) unpaired.push(g.name);
      for (const n of onRail) {
        cells.get(n.rail).push(h("span", { class: "pairing", title: p.evidence || "" }, g.name, " ↔ ", h("span", { class: "nic" }, n.rdma_device || n.name)));
      }
    }
    return h("tr", { id: `matrix-${name}` },
      h("td", {}, h("strong", { title: name }, nodeLabel(name, 28)), h("div", { class: "muted" },
        `${short(node.block || "", 6)}/${short(node.subblock || "", 6)} · `, nodeLinks.map((f, i) => [i ? " · " : "", f(name)])),
        h("div", {}, (pods.get(name) || []).map((p) => h("div", { class: "muted" }, `${p.role || "pod"} `, h("a", { href: `/requests?pod=${encodeURIComponent(p.name)}` }, p.name))))),
      rails.map((r) => h("td", { class: "cell" }, cells.get(r).length ? cells.get(r) : h("span", { class: "muted" }, "—"))),
      h("td", { class: "cell" }, unpaired.length ? h("span", { class: "warn" }, unpaired.join(", ")) : h("span", { class: "muted" }, "none")));
  });
  return section(`Rails × nodes: each GPU beside its paired NIC (${rails.length} rails, ${order.length} nodes)`,
    h("p", { class: "muted" }, "A GPU sits in the column of the rail its paired NIC is on; hover a pairing for how it was paired."),
    table(["node", ...rails.map((r) => r.replace(/^.*?(\d+)$/, "rail $1")), "not paired"], rows, "compact matrix"));
}

// Which node pairs moved KV over which path in the window (/api/v1/stats/transfers): prefill
// nodes on the left, decode nodes on the right, one line per pair and path class, its width
// growing with the requests.
function transfersSection(topo, moved, label) {
  if (moved.error) return section("KV transfers", h("p", { class: "warn" }, `transfers unavailable: ${moved.error}`));
  const groups = moved.groups;
  if (!groups.length) return section(`KV transfers (${label})`, h("p", { class: "muted", id: "transfers" }, "No KV transfer in the window."));
  const left = [...new Set(groups.map((g) => g.prefill_node || "?"))].sort();
  const right = [...new Set(groups.map((g) => g.decode_node || "?"))].sort();
  const W = 640;
  const rowH = 26;
  const H = Math.max(left.length, right.length) * rowH + 30;
  const yOf = (list, n) => 24 + list.indexOf(n) * rowH + ((Math.max(left.length, right.length) - list.length) * rowH) / 2;
  const maxN = Math.max(...groups.map((g) => g.requests));
  const drawing = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "KV transfers between node pairs by path class" },
    svg("text", { x: 4, y: 12, class: "nodelabel" }, "prefill node"),
    svg("text", { x: W - 4, y: 12, "text-anchor": "end", class: "nodelabel" }, "decode node"),
    groups.map((g, i) => {
      const y1 = yOf(left, g.prefill_node || "?");
      const y2 = yOf(right, g.decode_node || "?");
      const bend = ((i % 5) - 2) * 6;
      return svg("path", { d: `M170,${y1} C320,${y1 + bend} 320,${y2 + bend} ${W - 170},${y2}`, class: `edge pc-${g.path_class}`,
        "stroke-width": (1.5 + (6 * g.requests) / maxN).toFixed(1) },
      svg("title", {}, `${g.prefill_node} → ${g.decode_node}: ${g.requests} over ${g.path_class}`));
    }),
    left.map((n) => svg("text", { x: 165, y: yOf(left, n) + 4, "text-anchor": "end", class: "nodelabel" }, svg("title", {}, n), nodeLabel(n))),
    right.map((n) => svg("text", { x: W - 165, y: yOf(right, n) + 4, class: "nodelabel" }, svg("title", {}, n), nodeLabel(n))));
  const classes = [...new Set(groups.map((g) => g.path_class))];
  const rows = groups.map((g) => h("tr", {},
    h("td", {}, h("a", { href: `/requests?node=${encodeURIComponent(g.prefill_node || "")}&path_class=${g.path_class}` }, g.prefill_node || "?")),
    h("td", {}, h("a", { href: `/requests?node=${encodeURIComponent(g.decode_node || "")}&path_class=${g.path_class}` }, g.decode_node || "?")),
    h("td", {}, pathBadge(g.path_class)), h("td", {}, g.pairing_level || "—"),
    h("td", { class: "num" }, g.requests), h("td", { class: "num" }, bytes(g.kv_bytes)), h("td", { class: "num" }, secs(g.kv_duration_s_mean))));
  return section(`KV transfers by node pair and path (${label})`,
    h("figure", { class: "chart transfers", id: "transfers" }, drawing,
      h("div", { class: "legend" }, classes.map((c) => h("span", {}, h("span", { class: `swatch pc-${c}` }), c)))),
    h("details", {}, h("summary", {}, `${groups.length} node pairs and paths`),
      table(["prefill node", "decode node", "path", "level", "requests", "bytes", "mean KV time"], rows, "compact")),
    moved.truncated ? h("p", { class: "warn" }, "Only the largest groups are shown.") : null);
}

// The audit's fleet line on this page; the audit with its reasons is its own page.
function contractSummary(contract) {
  if (contract.error) return section("Contract audit per pod", h("p", { class: "warn" }, contract.error));
  const ob = (contract.fleet || {}).obligations || {};
  return section("Contract audit per pod",
    h("p", {}, Object.entries(ob).map(([name, o]) => h("span", { class: "legenditem" },
      `${name}: `, h("span", { class: `status-${o.status}` }, o.status), ` (${o.counts.ok} ok, ${o.counts.broken} broken, ${o.counts.unknown} unknown) `))),
    h("p", {}, h("a", { href: "/contract", id: "contract-link" }, "The audit per pod, with its reasons »")));
}

function nodeCard(node, name) {
  if (!node) return h("div", { class: "node" }, h("h5", {}, name), h("p", { class: "warn" }, "not in the node list"));
  const nics = new Map(node.nics.map((n) => [n.name, n]));
  const pairing = new Map((node.pairings || []).map((p) => [p.gpu, p]));
  const rows = node.gpus.map((g) => {
    const p = pairing.get(g.name);
    const ns = p ? p.nics.map((n) => nics.get(n)).filter(Boolean) : [];
    return h("tr", {},
      h("td", {}, g.name),
      h("td", {}, ns.map((n) => n.rdma_device || n.name).join(", ") || h("span", { class: "warn" }, "none")),
      h("td", {}, ns.map((n) => n.rail || "—").join(", ") || "—"),
      h("td", { title: p ? p.evidence : "" }, p ? `${p.method}: ${p.evidence}` : h("span", { class: "warn" }, "not paired")));
  });
  return h("div", { class: "node", id: `node-${node.name}` },
    h("h5", {}, h("a", { href: `/requests?node=${encodeURIComponent(node.name)}` }, node.name)),
    h("div", { class: "muted" }, `${node.machine_type || "?"} · ${node.zone || "?"} · RDMA ${node.rdma_path ? "yes" : "no"}`),
    table(["GPU", "NIC", "rail", "paired by"], rows, "compact"));
}
