// A service's compiled discovery chain drawn as four columns: routers →
// splitters (with weights) → resolvers (failover marked) → targets.

import { h, fill, seg } from "./dom.js";
import { watch } from "./api.js";

function label(chain, id) {
  const n = chain.Nodes?.[id];
  if (n) return `${n.Type} ${n.Name}`;
  const t = chain.Targets?.[id];
  return t ? targetName(t) : id;
}

function targetName(t) {
  return [t.ServiceSubset, t.Service].filter(Boolean).join(".") + (t.Datacenter ? ` (${t.Datacenter})` : "");
}

function match(def) {
  const m = def?.Match?.HTTP;
  if (!m) return "any request";
  const parts = [];
  if (m.PathExact) parts.push(`path = ${m.PathExact}`);
  if (m.PathPrefix) parts.push(`path prefix ${m.PathPrefix}`);
  if (m.PathRegex) parts.push(`path ~ ${m.PathRegex}`);
  for (const hd of m.Header || []) parts.push(`header ${hd.Name}`);
  for (const qp of m.QueryParam || []) parts.push(`query ${qp.Name}`);
  if (m.Methods?.length) parts.push(m.Methods.join("/"));
  return parts.join(", ") || "any request";
}

export function drawChain(chain) {
  const nodes = Object.entries(chain.Nodes || {});
  const of = (type) => nodes.filter(([, n]) => n.Type === type);
  const col = (title, cards) => h("section", { class: "col", "aria-label": title },
    h("h3", {}, title), cards.length ? cards : h("p", { class: "muted" }, "none"));
  const start = chain.StartNode;
  const routers = of("router").map(([id, n]) => h("div", { class: "card router", dataset: { node: id } },
    h("strong", {}, `Router ${n.Name}`), id === start ? [" ", h("span", { class: "tag" }, "start")] : null,
    h("ul", {}, (n.Routes || []).map((r) => h("li", { class: "edge" }, match(r.Definition), " → ", label(chain, r.NextNode))))));
  const splitters = of("splitter").map(([id, n]) => h("div", { class: "card splitter", dataset: { node: id } },
    h("strong", {}, `Splitter ${n.Name}`), id === start ? [" ", h("span", { class: "tag" }, "start")] : null,
    h("ul", {}, (n.Splits || []).map((s) => h("li", { class: "edge", dataset: { weight: s.Weight } },
      h("span", { class: "weight" }, `${s.Weight}%`), " → ", label(chain, s.NextNode))))));
  const resolvers = of("resolver").map(([id, n]) => {
    const r = n.Resolver || {};
    const fo = r.Failover?.Targets || [];
    return h("div", { class: "card resolver", dataset: { node: id } },
      h("strong", {}, `Resolver ${n.Name}`), id === start ? [" ", h("span", { class: "tag" }, "start")] : null,
      r.Default ? h("span", { class: "tag" }, "default") : null,
      h("ul", {},
        h("li", { class: "edge" }, "→ ", label(chain, r.Target)),
        r.ConnectTimeout ? h("li", { class: "edge muted" }, `connect timeout ${r.ConnectTimeout}`) : null,
        fo.map((t) => h("li", { class: "edge failover" }, "failover → ", label(chain, t)))));
  });
  const failovers = new Set(of("resolver").flatMap(([, n]) => n.Resolver?.Failover?.Targets || []));
  const targets = Object.entries(chain.Targets || {}).map(([id, t]) => h("div", { class: "card target", dataset: { target: id } },
    h("strong", {}, targetName(t)), failovers.has(id) ? h("span", { class: "failover" }, " failover") : null,
    h("div", { class: "muted" }, id)));
  return h("div", { class: "graph", id: "chain" },
    col("Routers", routers), col("Splitters", splitters), col("Resolvers", resolvers), col("Targets", targets));
}

export async function routing(body, name, ctx) {
  await watch(`/v1/discovery-chain/${seg(name)}`, {
    signal: ctx.signal,
    what: `compiling the discovery chain of ${name}`,
    onData: (d) => {
      ctx.clear();
      const chain = d?.Chain || {};
      fill(body, h("p", { class: "muted" }, `Protocol ${chain.Protocol || "tcp"}. Requests enter at ${label(chain, chain.StartNode)}.`),
        drawChain(chain));
    },
    onError: ctx.error,
  });
}
