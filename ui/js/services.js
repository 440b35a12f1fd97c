// Services: the list (health at a glance, search, filters, sort, live) and
// a service's page (instances and checks, topology, routing, intentions).

import { h, fill, seg, worst, badge, tags, table, tabs } from "./dom.js";
import { api, watch } from "./api.js";
import { routing } from "./routing.js";
import { intentionRows } from "./intentions.js";

export function health(s) {
  if (s.ChecksCritical > 0) return "critical";
  if (s.ChecksWarning > 0) return "warning";
  return "passing";
}

const RANK = { critical: 0, warning: 1, passing: 2 };

/** A notice that the token hid some rows, with the way to log in. */
export function filteredNotice(filtered) {
  return filtered
    ? h("p", { class: "notice", id: "acl-filtered" },
      "Some results are hidden: your token may not read them. ",
      h("a", { href: "#/acl" }, "Log in with a token"), " to see more.")
    : null;
}

export async function list(main, _params, ctx) {
  const q = h("input", { id: "svc-search", type: "search", placeholder: "name or tag" });
  const hs = h("select", { id: "svc-health" },
    ["all", "passing", "warning", "critical"].map((v) => h("option", { value: v }, v)));
  const kind = h("select", { id: "svc-kind" },
    [["all", "all"], ["", "service"], ["connect-proxy", "connect-proxy"], ["mesh-gateway", "mesh-gateway"],
      ["terminating-gateway", "terminating-gateway"], ["ingress-gateway", "ingress-gateway"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  const sort = h("select", { id: "svc-sort" },
    [["name", "name A–Z"], ["-name", "name Z–A"], ["health", "unhealthy first"], ["instances", "most instances"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  const tag = h("select", { id: "svc-tag" }, h("option", { value: "" }, "all"));
  const count = h("p", { class: "muted", "aria-live": "polite", id: "svc-count" });
  const notice = h("div");
  const body = h("div", { id: "services" }, h("p", { class: "muted" }, "Loading services…"));
  fill(main, h("h1", {}, "Services"), ctx.errors, notice,
    h("div", { class: "filters", role: "search" },
      h("label", {}, "Search", q), h("label", {}, "Health", hs),
      h("label", {}, "Kind", kind), h("label", {}, "Tag", tag), h("label", {}, "Sort", sort)),
    count, body);
  let data = [];
  const draw = () => {
    const term = q.value.trim().toLowerCase();
    let rows = data.filter((s) =>
      (!term || s.Name.toLowerCase().includes(term) || (s.Tags || []).some((t) => t.toLowerCase().includes(term))) &&
      (hs.value === "all" || health(s) === hs.value) &&
      (kind.value === "all" || (s.Kind || "") === kind.value) &&
      (!tag.value || (s.Tags || []).includes(tag.value)));
    const by = sort.value;
    rows.sort((a, b) =>
      by === "health" ? RANK[health(a)] - RANK[health(b)] || a.Name.localeCompare(b.Name)
        : by === "instances" ? b.InstanceCount - a.InstanceCount || a.Name.localeCompare(b.Name)
          : by === "-name" ? b.Name.localeCompare(a.Name) : a.Name.localeCompare(b.Name));
    count.textContent = `${rows.length} of ${data.length} services`;
    fill(body, rows.length === 0 ? h("p", { class: "muted" }, data.length ? "No service matches." : "No services.") :
      table(["Health", "Service", { text: "Kind", class: "optional" }, "Instances",
        { text: "Checks", class: "optional" }, { text: "Tags", class: "optional" }],
      rows.map((s) => {
        const st = health(s);
        return h("tr", { dataset: { service: s.Name, health: st } },
          h("td", {}, badge(st)),
          h("td", { class: "name" }, h("a", { href: `#/services/${seg(s.Name)}` }, s.Name),
            s.ConnectedWithProxy ? h("span", { class: "tag", title: "has a sidecar proxy" }, "in mesh") : null,
            (s.ExternalSources || []).map((x) => h("span", { class: "tag" }, x))),
          h("td", { class: "optional" }, s.Kind || "service"),
          h("td", {}, String(s.InstanceCount)),
          h("td", { class: "optional" },
            h("span", { class: "health-passing", title: "passing" }, `${s.ChecksPassing} ✓ `),
            h("span", { class: "health-warning", title: "warning" }, `${s.ChecksWarning} ! `),
            h("span", { class: "health-critical", title: "critical" }, `${s.ChecksCritical} ✗`)),
          h("td", { class: "optional" }, tags(s.Tags)));
      }), { label: "Services" }));
  };
  // The tag choices follow the catalog; a chosen tag stays chosen while any
  // service still carries it.
  const tagChoices = () => {
    const all = [...new Set(data.flatMap((s) => s.Tags || []))].sort();
    const chosen = all.includes(tag.value) ? tag.value : "";
    fill(tag, h("option", { value: "" }, "all"), all.map((t) => h("option", { value: t, selected: t === chosen }, t)));
    tag.value = chosen;
  };
  for (const el of [q, hs, kind, tag, sort]) for (const ev of ["input", "change"]) el.addEventListener(ev, draw);
  await watch("/v1/internal/ui/services", {
    signal: ctx.signal,
    what: "listing services",
    onData: (d, a) => {
      ctx.clear(); data = d || []; fill(notice, filteredNotice(a.filtered)); tagChoices(); draw();
      // The benchmark's first-render figure (scripts/ui_render.py) reads this mark.
      if (!performance.getEntriesByName("cairn:services-rendered").length) performance.mark("cairn:services-rendered");
    },
    onError: ctx.error,
  });
}

function instanceRow(i) {
  const checks = i.Checks || [];
  const st = worst(checks.map((c) => c.Status));
  const addr = i.Service.Address || i.Node.Address;
  return h("tr", { dataset: { health: st, instance: i.Service.ID } },
    h("td", {}, badge(st)),
    h("td", {}, h("a", { href: `#/nodes/${seg(i.Node.Node)}` }, i.Node.Node), h("div", { class: "muted" }, i.Service.ID)),
    h("td", {}, `${addr}:${i.Service.Port}`),
    h("td", { class: "optional" }, tags(i.Service.Tags),
      Object.entries(i.Service.Meta || {}).map(([k, v]) => h("span", { class: "tag" }, `${k}=${v}`))),
    h("td", {}, checks.length === 0 ? h("span", { class: "muted" }, "no checks") :
      checks.map((c) => h("div", { class: "check" },
        badge(c.Status), " ", h("strong", {}, c.Name || c.CheckID),
        c.ServiceID ? "" : h("span", { class: "muted" }, " (node)"),
        c.Output ? h("pre", {}, c.Output) : null))));
}

export async function detail(main, [name, tab = ""], ctx) {
  const base = `#/services/${seg(name)}`;
  const here = tab ? `${base}/${tab}` : base;
  const body = h("div", { id: "service-body" }, h("p", { class: "muted" }, "Loading…"));
  const items = [[base, "Instances"], [`${base}/topology`, "Topology"],
    [`${base}/routing`, "Routing"], [`${base}/intentions`, "Intentions"]];
  const linked = [`${base}/linked`, "Linked services"];
  const nav = h("div", {}, tabs(tab === "linked" ? [...items, linked] : items, here));
  fill(main, h("p", {}, h("a", { href: "#/services" }, "← Services")),
    h("h1", {}, name), nav, ctx.errors, body);
  if (tab === "linked") return gatewayServices(body, name, ctx);
  if (tab === "routing") return routing(body, name, ctx);
  if (tab === "topology") return topology(body, name, ctx);
  if (tab === "intentions") return serviceIntentions(body, name, ctx);
  await watch(`/v1/health/service/${seg(name)}`, {
    signal: ctx.signal,
    what: `reading the instances of ${name}`,
    onData: (list, a) => {
      ctx.clear();
      const all = list || [];
      // A gateway's page also lists the services it links.
      if (all.some((i) => GATEWAYS.includes(i.Service.Kind)) && !nav.querySelector(`a[href="${linked[0]}"]`)) {
        fill(nav, tabs([...items, linked], here));
      }
      const allTags = [...new Set(all.flatMap((i) => i.Service.Tags || []))].sort();
      fill(body, filteredNotice(a.filtered),
        h("p", {}, `${all.length} instance${all.length === 1 ? "" : "s"}. `, allTags.length ? ["Tags: ", tags(allTags)] : ""),
        all.length ? table(["Health", "Node", "Address", { text: "Tags and meta", class: "optional" }, "Checks"],
          all.map(instanceRow), { label: "Instances" }) : h("p", { class: "muted" }, "No instances."));
    },
    onError: ctx.error,
  });
}

const GATEWAYS = ["ingress-gateway", "terminating-gateway", "mesh-gateway"];

async function gatewayServices(body, name, ctx) {
  await watch(`/v1/internal/ui/gateway-services-nodes/${seg(name)}`, {
    signal: ctx.signal,
    what: `reading the services linked to ${name}`,
    onData: (list, a) => {
      ctx.clear();
      const rows = list || [];
      fill(body, filteredNotice(a.filtered), rows.length
        ? table(["Health", "Service", "Instances", { text: "Tags", class: "optional" }], rows.map((s) =>
          h("tr", { dataset: { service: s.Name, health: health(s) } },
            h("td", {}, badge(health(s))),
            h("td", {}, h("a", { href: `#/services/${seg(s.Name)}` }, s.Name)),
            h("td", {}, String(s.InstanceCount ?? 0)),
            h("td", { class: "optional" }, tags(s.Tags)))), { label: `Services linked to ${name}` })
        : h("p", { class: "muted" }, `No services are linked to ${name}.`));
    },
    onError: ctx.error,
  });
}

function edge(e) {
  const ok = e.Intention?.Allowed;
  return h("li", { dataset: { edge: e.Name, allowed: String(!!ok) } },
    h("a", { href: `#/services/${seg(e.Name)}/topology` }, e.Name), " ",
    h("span", { class: ok ? "allowed" : "denied" },
      ok ? "allowed" : "denied", e.Intention?.HasPermissions ? " (L7 permissions)" : "",
      e.Intention?.HasExact ? "" : " by default"));
}

async function topology(body, name, ctx) {
  await watch(`/v1/internal/ui/service-topology/${seg(name)}`, {
    signal: ctx.signal,
    what: `reading the topology of ${name}`,
    onData: (t) => {
      ctx.clear();
      const side = (title, list) => h("section", { "aria-label": title }, h("h2", {}, title),
        list.length ? h("ul", {}, list.map(edge)) : h("p", { class: "muted" }, "None."));
      fill(body, h("p", { class: "muted" }, `Protocol ${t.Protocol}. Edges from proxy registrations; each marked by what intentions decide.`),
        h("div", { class: "topo" },
          side("Downstreams", t.Downstreams || []),
          h("div", { class: "me" }, "→ ", name, " →"),
          side("Upstreams", t.Upstreams || [])),
        t.FilteredByACLs ? filteredNotice(true) : null);
    },
    onError: ctx.error,
  });
}

async function serviceIntentions(body, name, ctx) {
  await watch("/v1/connect/intentions", {
    signal: ctx.signal,
    what: "listing intentions",
    onData: (list) => {
      ctx.clear();
      const mine = (list || []).filter((i) => i.DestinationName === name || i.SourceName === name ||
        i.DestinationName === "*" || i.SourceName === "*");
      fill(body, mine.length ? intentionRows(mine, ctx, false) : h("p", { class: "muted" }, "No intentions apply to this service."),
        h("p", {}, h("a", { href: "#/intentions" }, "Manage intentions")));
    },
    onError: ctx.error,
  });
}
