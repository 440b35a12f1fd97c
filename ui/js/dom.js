// Building DOM without innerHTML: every value from the API is text.

/** h("a", {href: "#/x", class: "y"}, "text", child...) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** An encoded path segment. */
export const seg = (s) => encodeURIComponent(s);

/** The worst of some statuses: critical > warning > passing. */
export function worst(statuses) {
  let w = "passing";
  for (const s of statuses) {
    if (s === "critical" || s === "maintenance") return "critical";
    if (s === "warning") w = "warning";
  }
  return w;
}

export function badge(status, text) {
  return h("span", { class: `badge health-${status}` }, text ?? status);
}

export function tags(list) {
  return (list || []).map((t) => h("span", { class: "tag" }, t));
}

export function table(headers, rows, opts = {}) {
  return h("div", { class: "scroll" },
    h("table", opts.label ? { "aria-label": opts.label } : {},
      h("thead", {}, h("tr", {}, headers.map((c) =>
        typeof c === "string" ? h("th", { scope: "col" }, c) : h("th", { scope: "col", class: c.class }, c.text)))),
      h("tbody", {}, rows)));
}

/** Service detail tabs. */
export function tabs(items, current) {
  return h("nav", { class: "tabs", "aria-label": "Sections of this page" },
    items.map(([href, text]) => h("a", { href, "aria-current": href === current ? "page" : null }, text)));
}
