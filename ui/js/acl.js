// ACL: log in with a token (kept in local storage, sent as X-Consul-Token
// on every request), who it is, and the tokens, policies and roles lists
// for a token that may read them.

import { h, fill, table } from "./dom.js";
import { api, token } from "./api.js";

export async function page(main, _p, ctx) {
  const input = h("input", { id: "acl-token", type: "password", autocomplete: "off", required: true });
  const msg = h("div", { "aria-live": "polite", id: "acl-message" });
  const form = h("form", { id: "acl-login", class: "inline", "aria-label": "Log in with a token" },
    h("label", {}, "Token (SecretID)", input), h("button", { class: "primary", type: "submit" }, "Log in"));
  const who = h("div", { id: "acl-who" });
  const lists = h("div", { id: "acl-lists" });
  fill(main, h("h1", {}, "Access control"), ctx.errors, form, msg, who, lists);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    token.set(t);
    window.dispatchEvent(new Event("cairn-token"));
    input.value = "";
    try {
      await api("/v1/acl/token/self", { what: "checking the token" });
      fill(msg, h("p", { class: "ok" }, "Logged in. Every page now shows what this token may read."));
    } catch (e) {
      token.clear();
      window.dispatchEvent(new Event("cairn-token"));
      fill(msg, h("p", { class: "error" }, e.message));
    }
    show(who, lists, ctx);
  });
  await show(who, lists, ctx);
}

async function show(who, lists, ctx) {
  if (!token.get()) {
    fill(who, h("p", { class: "notice", id: "acl-anonymous" },
      "You are not logged in: requests carry no token (the anonymous token). With ACLs on, log in to see what your token may read."));
    fill(lists);
    return;
  }
  const logout = h("button", { type: "button", id: "acl-logout", onclick: () => {
    token.clear();
    window.dispatchEvent(new Event("cairn-token"));
    show(who, lists, ctx);
  } }, "Log out");
  try {
    const self = (await api("/v1/acl/token/self", { what: "reading your token" })).data;
    fill(who, h("p", {}, "Logged in as ", h("strong", {}, self.Description || self.AccessorID), " (accessor ",
      h("code", {}, self.AccessorID), ") with policies ", (self.Policies || []).map((p) => p.Name).join(", ") || "none", ". "), logout);
  } catch (e) {
    fill(who, h("p", { class: "error" }, e.message), logout);
  }
  const sections = [];
  for (const [title, path, cols, row] of [
    ["Tokens", "/v1/acl/tokens", ["Accessor", "Description", "Policies"],
      (t) => [h("code", {}, t.AccessorID), t.Description || "", (t.Policies || []).map((p) => p.Name).join(", ")]],
    ["Policies", "/v1/acl/policies", ["Name", "Description"], (p) => [p.Name, p.Description || ""]],
    ["Roles", "/v1/acl/roles", ["Name", "Description"], (r) => [r.Name, r.Description || ""]],
  ]) {
    let content;
    try {
      const list = (await api(path, { signal: ctx.signal, what: `listing ${title.toLowerCase()}` })).data || [];
      content = list.length ? table(cols, list.map((x) => h("tr", {}, row(x).map((c) => h("td", {}, c)))), { label: title })
        : h("p", { class: "muted" }, `No ${title.toLowerCase()}.`);
    } catch (e) {
      if (e.name === "AbortError") return;
      content = h("p", { class: "muted" }, e.message);
    }
    sections.push(h("section", { "aria-label": title }, h("h2", {}, title), content));
  }
  fill(lists, sections);
}
