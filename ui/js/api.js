// The HTTP API as the pages use it: the token from local storage on every
// request, errors in words, and lists kept live with blocking queries.

const TOKEN_KEY = "cairn.token";

export const token = {
  get: () => localStorage.getItem(TOKEN_KEY) || "",
  set: (t) => localStorage.setItem(TOKEN_KEY, t),
  clear: () => localStorage.removeItem(TOKEN_KEY),
};

const DC_KEY = "cairn.dc";

/**
 * The datacenter the pages look at (`?dc=` on every request the servers
 * forward), kept for the tab's session; empty means this server's own.
 */
export const dc = {
  get: () => sessionStorage.getItem(DC_KEY) || "",
  set: (d) => (d ? sessionStorage.setItem(DC_KEY, d) : sessionStorage.removeItem(DC_KEY)),
};

/** `path` with `dc=` added when another datacenter is chosen; the agent's
 * own endpoints and the datacenter list are always this server's. */
function inDc(path) {
  const d = dc.get();
  if (!d || !path.startsWith("/v1/") || path.startsWith("/v1/agent/") || path.startsWith("/v1/catalog/datacenters")) {
    return path;
  }
  return `${path}${path.includes("?") ? "&" : "?"}dc=${encodeURIComponent(d)}`;
}

export class ApiError extends Error {
  constructor(status, body, what) {
    super(describe(status, body, what));
    this.status = status;
    this.body = body;
  }
}

/** A failure in words; a 403 names the permission the token lacks. */
function describe(status, body, what) {
  const text = (body || "").trim();
  if (status === 0) return `Could not reach cairn while ${what}: ${text || "network error"}.`;
  if (status === 403) {
    const m = text.match(/lacks permission '([^']+)'(?: on "(.*)")?/);
    if (m) {
      const on = m[2] !== undefined ? ` on "${m[2]}"` : "";
      return `Permission denied while ${what}: your token lacks '${m[1]}'${on}.` +
        (token.get() ? "" : " You are not logged in: log in with a token on the ACL page.");
    }
    if (/ACL not found/i.test(text)) {
      return `The token is not known to the servers (ACL not found) while ${what}. Log in with another on the ACL page.`;
    }
    return `Permission denied while ${what}: ${text || "forbidden"}.`;
  }
  if (status === 429) return `cairn is busy (too many requests) while ${what}; retrying.`;
  return `Request failed while ${what}: ${status}${text ? ` — ${text}` : ""}`;
}

/**
 * One request. Returns {data, index, filtered, status}; a non-2xx status is
 * an ApiError unless listed in `ok` (e.g. 404 for a missing key).
 */
export async function api(path, { method = "GET", body, signal, ok = [], what } = {}) {
  const headers = {};
  const t = token.get();
  if (t) headers["X-Consul-Token"] = t;
  what = what || `${method === "GET" ? "reading" : "writing"} ${path.split("?")[0]}`;
  let r;
  try {
    r = await fetch(inDc(path), { method, headers, body, signal, cache: "no-store" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, e.message, what);
  }
  const text = await r.text();
  if (!r.ok && !ok.includes(r.status)) throw new ApiError(r.status, text, what);
  let data = null;
  if (r.ok && text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  return {
    data,
    status: r.status,
    index: Number(r.headers.get("X-Consul-Index") || 0),
    filtered: r.headers.get("X-Consul-Results-Filtered-By-ACLs") === "true",
  };
}

const sleep = (ms, signal) => new Promise((res) => {
  const t = setTimeout(res, ms);
  signal?.addEventListener("abort", () => { clearTimeout(t); res(); }, { once: true });
});

/**
 * Keeps `path` live: a blocking query on `?index=` after the first answer,
 * `onData(data, answer)` on each new one, `onError(err)` on a failure,
 * then again after a backoff (0.5 s doubling to 10 s). Ends with `signal`.
 */
export async function watch(path, { signal, onData, onError, ok, what }) {
  let index = 0;
  let backoff = 0;
  const sep = path.includes("?") ? "&" : "?";
  while (!signal.aborted) {
    try {
      const q = index ? `${sep}index=${index}&wait=60s` : "";
      const a = await api(path + q, { signal, ok, what });
      // An index going backwards (a restore, a new leader): start over.
      const moved = a.index !== index;
      index = a.index > 0 && a.index >= index ? a.index : 0;
      backoff = 0;
      if (moved || !q) onData(a.data, a);
      // No index to block on: poll instead of spinning.
      if (!a.index) await sleep(5000, signal);
    } catch (e) {
      if (signal.aborted || e.name === "AbortError") return;
      onError(e);
      backoff = Math.min(Math.max(backoff * 2, 500), 10000);
      index = 0;
      await sleep(backoff, signal);
    }
  }
}

/** A KV key's path, each segment encoded. */
export const kvPath = (key) => "/v1/kv/" + key.split("/").map(encodeURIComponent).join("/");

/** Decodes a KV value (base64 of bytes) as UTF-8 text. */
export function b64text(v) {
  if (!v) return "";
  const bin = atob(v);
  const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}
