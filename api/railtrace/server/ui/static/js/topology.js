// The topology (`/topology`): nodes by block and subblock, GPU-NIC pairings, the contract audit.

import { h, maybe, section, short, table } from "./common.js";

export async function topologyPage(main) {
  const [topo, contract] = await Promise.all([maybe("/api/v1/topology"), maybe("/api/v1/contract")]);
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
  main.replaceChildren(
    h("div", { class: "pagehead" }, h("h1", {}, "Topology")),
    h("p", {}, `${topo.nodes.length} nodes, ${topo.pods.length} pods, ${Object.keys(topo.rails || {}).length} rails · sources: ${(topo.sources || []).length}`),
    section(`Warnings (${topo.warnings.length})`, h("ul", { class: "plain" }, topo.warnings.map((w) => h("li", { class: "warn" }, typeof w === "string" ? w : JSON.stringify(w))))),
    section(`Discovery gaps (${topo.discovery_gaps.length})`, h("ul", { class: "plain" }, topo.discovery_gaps.map((g) => h("li", { class: "warn" }, typeof g === "string" ? g : `${g.object}: missing ${(g.missing || []).join(", ")}${g.note ? ` (${g.note})` : ""}`)))),
    section("Nodes by block and subblock", h("div", { class: "blocks" }, blocks, loose.length ? h("div", { class: "block" }, h("h3", {}, "no block label"), loose.map((n) => nodeCard(n, n.name))) : "")),
    contractSection(contract));
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

function contractSection(contract) {
  if (contract.error) return section("Contract audit", h("p", { class: "warn" }, contract.error));
  const obligations = ["discovered", "preserved", "verified", "consumed"];
  const rows = (contract.pods || []).map((p) => h("tr", {},
    h("td", {}, h("a", { href: `/requests?pod=${encodeURIComponent(p.name)}` }, p.name)),
    h("td", {}, p.pool || p.role || "—"),
    h("td", {}, p.node || "—"),
    obligations.map((o) => {
      const ob = (p.obligations || {})[o] || {};
      return h("td", { class: `status-${ob.status || "unknown"}`, title: ob.summary || "" }, ob.status || "—");
    })));
  return section("Contract audit per pod", table(["pod", "pool", "node", ...obligations], rows, "compact"));
}
