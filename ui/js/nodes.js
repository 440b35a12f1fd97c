// Nodes: the list with health, and a node's services, checks and sessions.

import { h, fill, seg, worst, badge, tags, table } from "./dom.js";
import { api, watch } from "./api.js";
import { filteredNotice } from "./services.js";

const nodeHealth = (n) => worst((n.Checks || []).map((c) => c.Status));

export async function list(main, _p, ctx) {
  const q = h("input", { id: "node-search", type: "search", placeholder: "name or address" });
  const notice = h("div");
  const body = h("div", { id: "nodes" }, h("p", { class: "muted" }, "Loading nodes…"));
  fill(main, h("h1", {}, "Nodes"), ctx.errors, notice,
    h("div", { class: "filters", role: "search" }, h("label", {}, "Search", q)), body);
  let data = [];
  const draw = () => {
    const term = q.value.trim().toLowerCase();
    const rows = data.filter((n) => !term || n.Node.toLowerCase().includes(term) || n.Address.includes(term));
    fill(body, rows.length ? table(["Health", "Node", "Address", { text: "Services", class: "optional" }],
      rows.map((n) => h("tr", { dataset: { node: n.Node, health: nodeHealth(n) } },
        h("td", {}, badge(nodeHealth(n))),
        h("td", { class: "name" }, h("a", { href: `#/nodes/${seg(n.Node)}` }, n.Node)),
        h("td", {}, n.Address),
        h("td", { class: "optional" }, tags((n.Services || []).map((s) => s.Service))))), { label: "Nodes" })
      : h("p", { class: "muted" }, "No nodes."));
  };
  q.addEventListener("input", draw);
  await watch("/v1/internal/ui/nodes", {
    signal: ctx.signal, what: "listing nodes",
    onData: (d, a) => { ctx.clear(); data = d || []; fill(notice, filteredNotice(a.filtered)); draw(); },
    onError: ctx.error,
  });
}

export async function detail(main, [name], ctx) {
  const body = h("div", { id: "node-body" }, h("p", { class: "muted" }, "Loading…"));
  const sessions = h("div", { id: "node-sessions" });
  fill(main, h("p", {}, h("a", { href: "#/nodes" }, "← Nodes")), h("h1", {}, name), ctx.errors, body,
    h("h2", {}, "Sessions"), sessions);
  watch(`/v1/session/node/${seg(name)}`, {
    signal: ctx.signal, what: `listing the sessions of ${name}`,
    onData: (list) => fill(sessions, (list || []).length ? table(["ID", "Name", "Behavior", "TTL", "Lock delay"],
      list.map((s) => h("tr", {}, h("td", {}, h("code", {}, s.ID)), h("td", {}, s.Name || ""),
        h("td", {}, s.Behavior), h("td", {}, s.TTL || "—"), h("td", {}, `${(s.LockDelay || 0) / 1e9} s`))), { label: "Sessions" })
      : h("p", { class: "muted" }, "No sessions.")),
    onError: ctx.error,
  });
  await watch(`/v1/internal/ui/node/${seg(name)}`, {
    signal: ctx.signal, what: `reading node ${name}`, ok: [404],
    onData: (n, a) => {
      ctx.clear();
      if (a.status === 404 || !n) {
        fill(body, h("p", { class: "notice" }, `No node ${name}`, a.filtered ? " that your token may read." : "."));
        return;
      }
      fill(body, h("dl", { class: "kv" }, h("dt", {}, "Address"), h("dd", {}, n.Address),
        h("dt", {}, "Health"), h("dd", {}, badge(nodeHealth(n))),
        Object.entries(n.Meta || {}).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      filteredNotice(a.filtered),
      h("h2", {}, "Services"),
      (n.Services || []).length ? table(["Service", "ID", "Port", { text: "Tags", class: "optional" }],
        n.Services.map((s) => h("tr", {}, h("td", {}, h("a", { href: `#/services/${seg(s.Service)}` }, s.Service)),
          h("td", {}, s.ID), h("td", {}, String(s.Port)), h("td", { class: "optional" }, tags(s.Tags)))), { label: "Services" })
        : h("p", { class: "muted" }, "No services."),
      h("h2", {}, "Checks"),
      (n.Checks || []).length ? n.Checks.map((c) => h("div", { class: "check" }, badge(c.Status), " ",
        h("strong", {}, c.Name || c.CheckID), c.ServiceName ? h("span", { class: "muted" }, ` (${c.ServiceName})`) : "",
        c.Output ? h("pre", {}, c.Output) : null))
        : h("p", { class: "muted" }, "No checks."));
    },
    onError: ctx.error,
  });
}
