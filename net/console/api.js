// Calls to the broker's HTTP API (same origin), with the token if one is
// set. A refusal becomes an ApiError carrying the broker's own reason.

const TOKEN_KEY = "magnetar.token";

export class ApiError extends Error {
  constructor(status, reason) {
    super(`${status}: ${reason}`);
    this.status = status;
    this.reason = reason;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Called with the ApiError when the broker answers 401 (no or bad token).
let onUnauthorized = () => {};
export function whenUnauthorized(f) {
  onUnauthorized = f;
}

// Every request gives up after this long rather than leave a page waiting.
const TIMEOUT_MS = 15000;

async function send(method, path, body) {
  const headers = {};
  const t = token();
  if (t) headers["Authorization"] = `Bearer ${t}`;
  const init = { method, headers, signal: AbortSignal.timeout(TIMEOUT_MS) };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, `no answer from the broker (${e.message})`);
  }
  if (!resp.ok) {
    const text = await resp.text();
    let reason = text || resp.statusText;
    try {
      const j = JSON.parse(text);
      if (j && typeof j.reason === "string") reason = j.reason;
    } catch (_) {
      // not JSON: the text itself is the reason
    }
    const err = new ApiError(resp.status, reason);
    if (resp.status === 401) onUnauthorized(err);
    throw err;
  }
  return resp;
}

export async function get(path) {
  const resp = await send("GET", path);
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

// The answer itself: for peek, whose payload is the body and whose
// message fields are headers.
export async function getRaw(path) {
  return send("GET", path);
}

export async function put(path, body) {
  await send("PUT", path, body);
}

export async function post(path, body) {
  await send("POST", path, body);
}

export async function del(path) {
  await send("DELETE", path);
}

const enc = encodeURIComponent;

// `persistent://t/ns/x` as its REST path `/admin/v2/persistent/t/ns/x`.
export function topicPath(fullName) {
  const m = /^(persistent|non-persistent):\/\/([^/]+)\/([^/]+)\/(.+)$/.exec(fullName);
  if (!m) throw new Error(`not a topic name: ${fullName}`);
  return `/admin/v2/${m[1]}/${enc(m[2])}/${enc(m[3])}/${enc(m[4])}`;
}

export function subscriptionPath(fullName, sub) {
  return `${topicPath(fullName)}/subscription/${enc(sub)}`;
}

export function namespacePath(ns) {
  const [t, n] = ns.split("/");
  return `/admin/v2/namespaces/${enc(t)}/${enc(n)}`;
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}
