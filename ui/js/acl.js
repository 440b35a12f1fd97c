// ACL: log in with a token (kept in local storage, sent as X-Consul-Token
// on every request) or through an OIDC auth method (the provider's log-in
// page, then back here), who it is, and the tokens, policies and roles
// lists for a token that may read them.

import { h, fill, table } from "./dom.js";
import { api, token } from "./api.js";

const OIDC_KEY = "cairn.oidc";
let notice = "";

/** A random hex string (an OIDC client nonce). */
function nonce() {
  return [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Sends the browser to the provider of the oidc method `name`; it comes
 * back to this page's address with `?code=&state=`. */
async function startOidc(name, msg) {
  const pending = { method: name, nonce: nonce() };
  sessionStorage.setItem(OIDC_KEY, JSON.stringify(pending));
  try {
    const r = await api("/v1/acl/oidc/auth-url", {
      method: "POST", what: `starting the log-in with ${name}`,
      body: JSON.stringify({ AuthMethod: name, RedirectURI: location.origin + location.pathname, ClientNonce: pending.nonce }),
    });
    location.assign(r.data.AuthURL);
  } catch (e) {
    sessionStorage.removeItem(OIDC_KEY);
    fill(msg, h("p", { class: "error" }, e.message));
  }
}

/**
 * Ends an OIDC log-in the provider sent this tab back from (`?code=` and
 * `?state=` in the address): the code traded for a token, which is then
 * the one every request carries. The address is cleaned first, so a
 * reload never sends the code twice. Runs before the first render.
 */
export async function finishOidc() {
  const q = new URLSearchParams(location.search);
  if (!q.has("state") && !q.has("error")) return;
  const pending = JSON.parse(sessionStorage.getItem(OIDC_KEY) || "null");
  sessionStorage.removeItem(OIDC_KEY);
  history.replaceState(null, "", location.pathname + "#/acl");
  if (q.has("error")) {
    notice = `The provider refused the log-in: ${q.get("error_description") || q.get("error")}.`;
    return;
  }
  if (!pending) {
    notice = "A log-in came back that this tab did not start; start it again.";
    return;
  }
  try {
    const r = await api("/v1/acl/oidc/callback", {
      method: "POST", what: `finishing the log-in with ${pending.method}`,
      body: JSON.stringify({ AuthMethod: pending.method, State: q.get("state"), Code: q.get("code") || "", ClientNonce: pending.nonce }),
    });
    token.set(r.data.SecretID);
    window.dispatchEvent(new Event("cairn-token"));
  } catch (e) {
    notice = e.message;
  }
}

export async function page(main, _p, ctx) {
  const input = h("input", { id: "acl-token", type: "password", autocomplete: "off", required: true });
  const msg = h("div", { "aria-live": "polite", id: "acl-message" });
  const form = h("form", { id: "acl-login", class: "inline", "aria-label": "Log in with a token" },
    h("label", {}, "Token (SecretID)", input), h("button", { class: "primary", type: "submit" }, "Log in"));
  const who = h("div", { id: "acl-who" });
  const lists = h("div", { id: "acl-lists" });
  if (notice) {
    fill(msg, h("p", { class: "error" }, notice));
    notice = "";
  }
  const sso = h("div", { id: "acl-oidc" });
  fill(main, h("h1", {}, "Access control"), ctx.errors, form, sso, msg, who, lists);
  try {
    const methods = (await api("/v1/internal/ui/oidc-auth-methods", { signal: ctx.signal, what: "listing log-in methods" })).data || [];
    fill(sso, methods.map((m) => h("button", { type: "button", id: `oidc-${m.Name}`, onclick: () => startOidc(m.Name, msg) },
      `Log in with ${m.DisplayName || m.Name}`)));
  } catch (e) {
    if (e.name === "AbortError") return;
  }
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
  let fromLogin = false;
  const logout = h("button", { type: "button", id: "acl-logout", onclick: async () => {
    // A token a login made is deleted with the log-out (Consul's logout).
    if (fromLogin) {
      try { await api("/v1/acl/logout", { method: "POST", what: "logging out" }); } catch { /* gone already */ }
    }
    token.clear();
    window.dispatchEvent(new Event("cairn-token"));
    show(who, lists, ctx);
  } }, "Log out");
  try {
    const self = (await api("/v1/acl/token/self", { what: "reading your token" })).data;
    fromLogin = Boolean(self.AuthMethod);
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
