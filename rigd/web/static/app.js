// The settings page: sign-in, the header, and routing between the rigs
// screen (/settings/server/rigs) and a rig's tab (/settings/server/rigs/<id>).
import { call, EventSocket, onSignedOut, RpcError, signIn, signOut } from "./rpc.js";
import { h, replace, announce } from "./dom.js";
import { RigsScreen } from "./rigs.js";
import { RigTab } from "./rigtab.js";

export const HOME = "/settings/server/rigs";

const main = document.getElementById("main");
const conn = document.getElementById("conn");
const facts = document.getElementById("server-facts");
const who = document.getElementById("who");
const crumbRig = document.getElementById("crumb-rig");

let current = null; // the screen on show: { dispose() }
let socket = null;
const session = { me: null, info: null };

function setConnection(status, delay) {
  if (status === "reconnecting") {
    conn.hidden = false;
    announce(conn, `Connection to rigd lost — reconnecting in ${Math.round(delay / 100) / 10} s…`, "warn");
  } else if (status === "reconnected") {
    announce(conn, "Reconnected.", "ok");
    setTimeout(() => { if (conn.dataset.kind === "ok") conn.hidden = true; }, 2000);
  } else {
    conn.hidden = true;
  }
  if (current && current.onConnection) current.onConnection(status);
}

function showSignIn(message) {
  if (current) { current.dispose(); current = null; }
  if (socket) { socket.close(); socket = null; }
  session.me = null;
  replace(who);
  replace(facts);
  const status = h("p.status", { role: "alert", id: "signin-status" });
  const input = h("input", {
    id: "token", type: "password", name: "token", autocomplete: "current-password",
    required: true, "aria-describedby": "signin-help",
  });
  const form = h("form.card.signin", { "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in to rigd"),
    h("p", { id: "signin-help" }, "Paste your token: the admin token (in the server's data directory, ",
      h("code", {}, "admin.token"), ") or a person's own token."),
    h("label", { for: "token" }, "Token"), input,
    h("button.primary", { type: "submit" }, "Sign in"), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    announce(status, "Signing in…");
    try {
      await signIn(input.value.trim());
      input.value = "";
      await start();
    } catch (e) {
      announce(status, e instanceof RpcError ? e.describe() : String(e), "error");
      input.focus();
    }
  });
  replace(main, form);
  if (message) announce(status, message, "error");
  input.focus();
}

function header() {
  const info = session.info;
  const badges = [
    h("span.fact", {}, "Accelerator: ", h("strong", {}, info.accel || "none")),
    h("span.fact", {}, "Network: ", h("strong", {}, info.network || "none")),
    h("span.fact", { id: "memory-fact" }, "Memory: ",
      h("strong", {}, `${info.memoryInUseMb ?? 0} of ${info.memoryBudgetMb} MB`)),
  ];
  for (const pool of info.pools || []) {
    // A pool: how many of its rigs are ready, what the one filling is doing, or why it is not.
    const why = pool.error || pool.waiting || (pool.filling ? pool.progress : "");
    badges.push(h(`span.fact.pool${pool.error ? ".danger" : ""}`, { "data-pool": pool.key, title: why || "" },
      `Pool ${pool.key}: `, h("strong", {}, `${pool.ready}/${pool.size} ready`),
      pool.filling ? ` (${pool.filling} starting${pool.progress ? `: ${pool.progress}` : ""})` : "",
      pool.error ? ` — failed: ${pool.error}` : "", pool.waiting ? ` — waiting ${pool.waiting}` : ""));
  }
  if (info.accel === "tcg") badges.push(h("span.badge.danger", { title: info.accelProblem || "" }, "TCG — not a security boundary"));
  replace(facts, badges);
  replace(who, h("span", {}, session.me.name, session.me.admin ? " (admin)" : ""),
    h("button.link", { type: "button", onclick: async () => { await signOut(); showSignIn("Signed out."); } }, "Sign out"));
}

export async function refreshFacts() {
  try { session.info = await call("server.info"); header(); } catch { /* shown elsewhere */ }
}

function route() {
  if (current) { current.dispose(); current = null; }
  const path = location.pathname.replace(/\/+$/, "");
  const tab = path.startsWith(HOME + "/") ? decodeURIComponent(path.slice(HOME.length + 1)) : null;
  const ctx = { session, socket, main, navigate, refreshFacts, setCrumb };
  setCrumb(null);
  current = tab ? new RigTab(ctx, tab) : new RigsScreen(ctx);
}

function setCrumb(rigId) {
  replace(crumbRig, rigId ? [" › ", h("span", { "aria-current": "page" }, rigId)] : []);
}

export function navigate(path) {
  history.pushState({}, "", path);
  route();
}

async function start() {
  try {
    session.me = await call("whoami");
    session.info = await call("server.info");
  } catch (e) {
    if (e instanceof RpcError && e.signedOut) { showSignIn(); return; }
    replace(main, h("p.status", { role: "alert", "data-kind": "error" }, `rigd did not answer: ${e.message}`));
    return;
  }
  header();
  socket = new EventSocket({
    onEvent: (event) => { if (current && current.onEvent) current.onEvent(event); },
    onStatus: setConnection,
  });
  route();
}

onSignedOut(() => {
  if (session.me) showSignIn("Your session ended — sign in again to return to this page.");
});
window.addEventListener("popstate", () => { if (session.me) route(); });
document.addEventListener("click", (ev) => {
  const a = ev.target.closest && ev.target.closest("a[data-nav]");
  if (a && !ev.ctrlKey && !ev.metaKey && !ev.shiftKey && ev.button === 0) {
    ev.preventDefault();
    navigate(a.getAttribute("href"));
  }
});
start();
