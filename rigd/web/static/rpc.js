// The page's link to rigd: JSON-RPC over POST /rpc, and one RPC WebSocket
// (GET /rpc) for events, reconnected with backoff. Both are authenticated
// by the session cookie the sign-in set (HttpOnly: this script never sees
// it); the browser adds this page's Origin to every POST and WebSocket, which
// the server checks before any state change.

export class RpcError extends Error {
  constructor(error, status) {
    super(error && error.message ? error.message : `HTTP ${status}`);
    this.code = error ? error.code : null;
    this.data = (error && error.data) || {};
    this.status = status;
  }
  get signedOut() { return this.status === 401 || this.code === -32001; }
  describe() {
    const field = this.data.field ? ` (${this.data.field}: ${this.data.reason || ""})` : "";
    return this.message + field;
  }
}

const listeners = { signedOut: [] };
export function onSignedOut(cb) { listeners.signedOut.push(cb); }
function signedOut() { for (const cb of listeners.signedOut) cb(); }

let nextId = 1;

/** One RPC call; throws RpcError. A 401 also tells the page to sign in again. */
export async function call(method, params = {}) {
  let response;
  try {
    response = await fetch("/rpc", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: nextId++, method, params }),
    });
  } catch (err) {
    throw new RpcError({ message: `rigd is unreachable (${err.message})` }, 0);
  }
  let body = null;
  try { body = await response.json(); } catch { /* not JSON */ }
  const error = body && body.error;
  if (error || !response.ok) {
    const e = new RpcError(error || { message: `HTTP ${response.status}` }, response.status);
    if (e.signedOut) signedOut();
    throw e;
  }
  return body.result;
}

export async function signIn(token) {
  const response = await fetch("/session", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }),
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new RpcError(body.error || { message: `HTTP ${response.status}` }, response.status);
  return body;
}

export async function signOut() {
  await fetch("/session/end", { method: "POST", credentials: "same-origin" });
}

export function wsUrl(path) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

/** Retry delays for lost sockets: 0.5 s doubling to 8 s. */
export function backoff(attempt) { return Math.min(8000, 500 * 2 ** attempt); }

/**
 * The RPC WebSocket: events of the subscribed workspace, kept across
 * reconnects (each reconnect subscribes again and reports `reconnected`, so
 * the caller reloads what it may have missed).
 */
export class EventSocket {
  constructor({ onEvent, onStatus }) {
    this.onEvent = onEvent;
    this.onStatus = onStatus || (() => {});
    this.workspace = null;
    this.attempt = 0;
    this.closed = false;
    this.ws = null;
    this.pending = new Map();
  }
  subscribe(workspace) {
    this.workspace = workspace;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this._subscribe();
    else if (!this.ws) this._open();
  }
  close() { this.closed = true; if (this.ws) this.ws.close(); }
  _send(method, params) {
    const id = nextId++;
    this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    return id;
  }
  _subscribe() { if (this.workspace) this._send("events.subscribe", { workspace: this.workspace }); }
  _open() {
    const ws = new WebSocket(wsUrl("/rpc"));
    this.ws = ws;
    ws.onopen = () => {
      const again = this.attempt > 0;
      this.attempt = 0;
      this._subscribe();
      this.onStatus(again ? "reconnected" : "connected");
    };
    ws.onmessage = (m) => {
      let msg;
      try { msg = JSON.parse(m.data); } catch { return; }
      if (msg.method === "rig.event") this.onEvent(msg.params);
    };
    ws.onclose = (ev) => {
      this.ws = null;
      if (this.closed) return;
      // A refused upgrade looks like any lost socket (1006): ask whether the
      // session still holds (a 401 sends the page to sign-in) before retrying.
      const delay = backoff(this.attempt++);
      this.onStatus("reconnecting", delay);
      setTimeout(() => {
        if (this.closed) return;
        call("whoami").then(() => { if (!this.closed) this._open(); },
          (e) => { if (!e.signedOut && !this.closed) this._open(); });
      }, delay);
    };
  }
}

/** Lanes over plain HTTP with the session cookie; errors as RpcError. */
export async function lane(path, init = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...init });
  if (response.status >= 400) {
    const body = await response.json().catch(() => ({}));
    const e = new RpcError(body.error || { message: `HTTP ${response.status}` }, response.status);
    if (response.status === 401) signedOut();
    throw e;
  }
  return response;
}

/** Upload files as one drop, reporting progress (fetch cannot, XHR can). */
export function uploadDrop(rigId, files, point, onProgress) {
  return new Promise((resolve, reject) => {
    const form = new FormData();
    for (const f of files) form.append("file", f, f.name);
    const q = point ? `?x=${point.x}&y=${point.y}` : "";
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/rig/files/${encodeURIComponent(rigId)}${q}`);
    xhr.withCredentials = true;
    xhr.upload.onprogress = (e) => { if (e.lengthComputable) onProgress(e.loaded, e.total); };
    xhr.onload = () => {
      let body = {};
      try { body = JSON.parse(xhr.responseText); } catch { /* empty */ }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(new RpcError(body.error || { message: `HTTP ${xhr.status}` }, xhr.status));
    };
    xhr.onerror = () => reject(new RpcError({ message: "the upload was interrupted" }, 0));
    xhr.send(form);
  });
}

/** base64url of a UTF-8 string (the files lane's `p`). */
export function b64url(text) {
  const bytes = new TextEncoder().encode(text);
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
