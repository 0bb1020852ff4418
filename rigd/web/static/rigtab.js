// A rig's tab (/settings/server/rigs/<rigId>): its state and control lease,
// the live view (computer) or an interactive terminal (terminal), the
// clipboard and file lanes, and the audit log. A heartbeat (rig.watch every
// 2 s) keeps the rig warm while the tab is open and renews a held lease.
import { call, RpcError, lane, uploadDrop, b64url, wsUrl, backoff } from "./rpc.js";
import { h, replace, duration, until, bytes, announce } from "./dom.js";
import { LiveView } from "./live.js";
import { TermView } from "./termview.js";

// Where a rig's dropped files land, by surface (the server's drop targets).
const DROP_HOME = { terminal: "/root/file.txt", computer: "/home/rig/file.txt", browser: "/tmp/cc-drops/file.txt" };
const DROP_SAYS = {
  terminal: "Drop files on the terminal, or pick them; they land in ~/drops.",
  computer: "Drop files on the screen, or pick them; they land in ~/Drops.",
  browser: "Drop files on the page, or pick them; they land in /tmp/cc-drops.",
};

const HEARTBEAT_MS = 2000;
const PORTS_MS = 4000;
const LOG_PAGE = 50;

export class RigTab {
  constructor(ctx, rigId) {
    this.ctx = ctx;
    this.rigId = rigId;
    this.disposed = false;
    this.rig = null;
    ctx.setCrumb(rigId);
    this.title = h("h1", { id: "rig-title" }, rigId);
    this.state = h("div.state", { id: "rig-state" });
    // Fork and Snapshot (issue 29), beside the title (no line of their own above the screen).
    this.actions = h("div.inline", { id: "rig-actions" });
    this.banner = h("div.banner", { role: "alert", id: "rig-banner", hidden: true });
    this.control = h("div.control", { id: "control", "aria-live": "polite" });
    this.status = h("p.status", { role: "status", "aria-live": "polite", id: "tab-status" });
    this.stage = h("div.stage", { id: "stage" });
    this.tools = h("div.tools", { id: "tools" });
    this.ports = h("div.ports", { id: "rig-ports", "aria-live": "polite" });
    this.logBody = h("tbody", { id: "log-body" });
    this.logMore = h("button", { type: "button", id: "log-older", hidden: true, onclick: () => this.loadLog(true) }, "Older entries");
    replace(ctx.main,
      h("section.card", { "aria-labelledby": "rig-title" },
        h("div.row", {}, this.title, this.actions, h("a", { href: "/settings/server/rigs", "data-nav": true }, "← All rigs")),
        this.banner, this.state, this.ports, this.control, this.status, this.stage, this.tools),
      h("section.card", { "aria-labelledby": "log-title" },
        h("div.row", {}, h("h2", { id: "log-title" }, "Audit log"),
          h("button", { type: "button", onclick: () => this.loadLog(false) }, "Refresh")),
        h("p.muted", {}, "Every input with its actor; typed text appears only as its length and a hash."),
        h("div.scroll", {}, h("table", { "aria-labelledby": "log-title" },
          h("thead", {}, h("tr", {}, ["#", "When", "Actor", "Tool", "Action", "Details", "Outcome"].map((c) => h("th", { scope: "col" }, c)))),
          this.logBody)), this.logMore));
    this.clock = setInterval(() => this.renderControl(), 1000);
    this.start();
  }

  dispose() {
    this.disposed = true;
    clearInterval(this.clock);
    clearTimeout(this.portsTimer);
    clearTimeout(this.beat);
    if (this.view) this.view.dispose();
  }

  async start() {
    try {
      this.rig = await call("rig.get", { rigId: this.rigId });
    } catch (e) {
      announce(this.status, describe(e), "error");
      return;
    }
    this.ctx.socket.subscribe(this.rig.workspace);
    this.render();
    this.loadLog(false);
    if (this.rig.phase === "closed") { this.ended(this.rig); return; }
    this.heartbeat();
    this.mountView();
    if (this.rig.surface === "terminal") this.loadPorts();
  }

  mountView() {
    if (this.view || this.disposed || !this.rig) return;
    if (!["ready", "busy", "parked"].includes(this.rig.phase)) {
      replace(this.stage, h("p.muted", {}, `The rig is ${this.rig.phase}; the view opens when it is ready.`));
      return;
    }
    const hooks = { tab: this, status: (t, k) => announce(this.status, t, k) };
    this.view = this.rig.surface === "terminal" ? new TermView(hooks) : new LiveView(hooks);
    replace(this.stage, this.view.element);
    this.renderTools();
  }

  mine() {
    const c = this.rig && this.rig.controller;
    return Boolean(c && c.kind === "person" && c.id === this.ctx.session.me.id);
  }

  async heartbeat() {
    if (this.disposed || !this.rig || this.rig.phase === "closed") return;
    if (document.visibilityState !== "hidden") {
      try {
        const beat = await call("rig.watch", { rigId: this.rigId });
        if (beat.controller !== undefined && this.rig) this.rig.controller = beat.controller;
      } catch (e) {
        if (e instanceof RpcError && e.code === -32009) await this.refresh();
      }
    }
    this.beat = setTimeout(() => this.heartbeat(), HEARTBEAT_MS);
  }

  async refresh() {
    try {
      this.rig = await call("rig.get", { rigId: this.rigId });
      this.render();
      if (this.rig.phase === "closed") this.ended(this.rig);
      else this.mountView();
    } catch (e) { announce(this.status, describe(e), "error"); }
  }

  onConnection(status) { if (status === "reconnected") this.refresh(); }

  async onEvent(event) {
    if (event.rigId !== this.rigId) return;
    if (event.type === "RigClosedEvent") {
      await this.refresh();
      return;
    }
    await this.refresh();
    if (event.type === "RigControlChanged") this.loadLog(false);
  }

  // What the guest serves (RIGS.md §8): a link per forwarded port and per dev domain, polled
  // as often as the server discovers them.
  async loadPorts() {
    if (this.disposed || !this.rig || this.rig.phase === "closed") { replace(this.ports); return; }
    try {
      this.renderPorts(await call("rig.ports", { rigId: this.rigId }));
    } catch (e) {
      if (!(e instanceof RpcError && e.code === -32009)) announce(this.status, describe(e), "error");
      replace(this.ports);
    }
    this.portsTimer = setTimeout(() => this.loadPorts(), PORTS_MS);
  }

  renderPorts(p) {
    const link = (url, text) => h("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, text);
    const items = p.ports.map((f) => h("li", { dataset: { guestPort: f.guestPort } },
      link(f.url, `port ${f.guestPort} → 127.0.0.1:${f.hostPort}`),
      f.lanUrl ? [" · ", link(f.lanUrl, `on the network: ${f.lanUrl}`)] : null));
    const names = p.domains.map((d) => h("li", { dataset: { domain: d.name } },
      d.httpsUrl ? link(d.httpsUrl, d.httpsUrl) : null, d.httpsUrl && d.url ? " · " : null,
      d.url ? link(d.url, d.url) : null, ` (port ${d.guestPort})`));
    const none = p.ports.length || names.length ? null
      : h("p.muted", {}, p.problem || "Nothing listens in the rig yet; servers it starts appear here.");
    replace(this.ports, h("h2", { id: "ports-title" }, "Ports"), none,
      items.length ? h("ul", { "aria-label": "Forwarded ports" }, items) : null,
      names.length ? h("ul", { "aria-label": "Dev domains" }, names) : null,
      p.notForwarded.length ? h("p.muted", {}, `${p.listening - p.ports.length} more listening ports are not forwarded (at most 16).`) : null);
  }

  ended(rig) {
    clearTimeout(this.beat);
    if (this.view) { this.view.dispose(); this.view = null; }
    this.banner.hidden = false;
    replace(this.banner, h("strong", {}, "This rig has closed"), `: ${rig.closeReason || "closed"}`,
      rig.failure ? ` — ${rig.failure}` : "", ".");
    replace(this.stage);
    replace(this.tools);
    replace(this.control);
  }

  render() {
    const rig = this.rig;
    const facts = [
      ["Surface", rig.surface], ["Phase", `${rig.phase}${rig.phaseDetail ? ` — ${rig.phaseDetail}` : ""}`],
      ["Backend", `${rig.backend} · ${rig.accel || "?"}`],
      ["Display", rig.display ? `${rig.display.width}×${rig.display.height}` : "—"],
      ["Memory", rig.residentMb ? `${rig.residentMb} of ${rig.memoryMb} MB resident` : `${rig.memoryMb} MB`],
    ];
    if (rig.forkedFrom) facts.push(["Forked from", h("a", { href: `/settings/server/rigs/${encodeURIComponent(rig.forkedFrom)}`, "data-nav": true }, rig.forkedFrom)]);
    if (rig.seat) facts.push(["Seat", `${rig.seat}${this.mine() ? " — handed to you" : ""}`]);
    // Fork and Snapshot (issue 29): copies of this instant, or this instant kept by name (a rig
    // with volumes, a seat's, has neither: copies would share its disks). A seat is handed over.
    const plain = !(rig.volumes || []).length;
    replace(this.actions, [
      rig.phase === "ready" && plain ? h("button", { type: "button", id: "fork-rig", onclick: () => this.fork() }, "Fork") : null,
      rig.phase === "ready" && plain && rig.surface !== "browser" ? h("button", { type: "button", id: "snapshot-rig", onclick: () => this.snapshot() }, "Snapshot") : null,
      rig.seat && !this.mine() ? h("button", { type: "button", id: "seat-hand-over", onclick: () => this.seatHand("seat.handOver", "Handed to you") }, "Hand seat to me") : null,
      rig.seat && this.mine() ? h("button", { type: "button", id: "seat-hand-back", onclick: () => this.seatHand("seat.handBack", "Handed back") }, "Hand seat back") : null]);
    replace(this.state, h("dl.facts", {}, facts.map(([k, v]) => [h("dt", {}, k), h("dd", { dataset: { fact: k.toLowerCase() } }, v)])),
      rig.securityBoundary === false ? h("span.badge.danger", {}, "TCG — not a security boundary") : null);
    this.renderControl();
    if (this.view && this.view.setControl) this.view.setControl(this.mine());
  }

  async seatHand(method, done) {
    try {
      await call(method, { workspace: this.rig.workspace, name: this.rig.seat });
      announce(this.status, `${done}: seat ${this.rig.seat}.`, "ok");
      await this.refresh();
    } catch (e) { announce(this.status, describe(e), "error"); }
  }

  async fork() {
    announce(this.status, "Forking this rig…");
    try {
      const { rigs } = await call("rig.fork", { rigId: this.rigId, count: 1 });
      replace(this.status, "Forked: ", rigs.map((r) => h("a", { href: `/settings/server/rigs/${encodeURIComponent(r.id)}`, "data-nav": true }, `${r.id} (${r.phase})`)));
    } catch (e) { announce(this.status, describe(e), "error"); }
  }

  async snapshot() {
    const name = prompt("Name the snapshot (letters, digits, . _ -)", `${this.rig.surface}-${new Date().toISOString().slice(0, 16).replace(/[:T]/g, "-")}`);
    if (!name) return;
    announce(this.status, `Keeping this rig as ${name}…`);
    try {
      const kept = await call("snapshot.create", { rigId: this.rigId, name });
      announce(this.status, `Kept as snapshot ${kept.name} (${Math.ceil(kept.bytes / 1048576)} MB); the workspace's rigs page lists it.`, "ok");
    } catch (e) { announce(this.status, describe(e), "error"); }
  }

  renderControl() {
    const rig = this.rig;
    if (!rig || rig.phase === "closed" || this.disposed) return;
    const c = rig.controller;
    if (this.mine()) {
      const left = c.until ? until(c.until) : null;
      const text = `You hold control${left !== null ? ` — lease ${duration(left)} left (renewed while this tab is open)` : ""}.`;
      const existing = this.control.querySelector(".lease");
      if (existing && this.control.dataset.mode === "mine") { existing.textContent = text; return; }
      this.control.dataset.mode = "mine";
      replace(this.control, h("span.lease", { id: "lease" }, text), " ",
        h("button.primary", { type: "button", id: "hand-back", onclick: () => this.setControl("release") }, "Hand back"));
      return;
    }
    const mode = c && c.kind === "person" ? "other" : "free";
    if (this.control.dataset.mode === mode) return;
    this.control.dataset.mode = mode;
    const who = c ? (c.kind === "person" ? "another person" : "an agent") : "nobody";
    replace(this.control, h("span", {}, `View only — ${who} is driving.`), " ",
      mode === "other" ? null : h("button.primary", { type: "button", id: "take-control", onclick: () => this.setControl("take") }, "Take control"));
  }

  async setControl(op) {
    try {
      this.rig = await call("rig.control", { rigId: this.rigId, op });
      this.control.dataset.mode = "";
      this.render();
      announce(this.status, op === "take" ? "You have control: input goes to the rig." : "Handed back.", "ok");
      if (op === "take" && this.view && this.view.focus) this.view.focus();
    } catch (e) { announce(this.status, describe(e), "error"); }
  }

  renderTools() {
    const progress = h("progress", { id: "drop-progress", max: 1, value: 0, hidden: true, "aria-label": "Upload progress" });
    const dropStatus = h("p.status", { role: "status", "aria-live": "polite", id: "drop-status" });
    const pick = h("input", { type: "file", id: "drop-pick", multiple: true,
      onchange: () => { if (pick.files.length) this.sendFiles([...pick.files], null); pick.value = ""; } });
    const path = h("input", { id: "download-path", name: "path", size: 36, placeholder: DROP_HOME[this.rig.surface] || DROP_HOME.computer });
    const download = h("form.inline", { "aria-label": "Download a file from the rig", onsubmit: (e) => {
      e.preventDefault();
      if (!path.value.trim()) return;
      const a = h("a", { href: `/rig/files/${encodeURIComponent(this.rigId)}?p=${b64url(path.value.trim())}`, download: "" });
      document.body.append(a); a.click(); a.remove();
    } }, h("label", { for: "download-path" }, "Download a guest path"), path, h("button", { type: "submit" }, "Download"));
    this.dropUi = { progress, status: dropStatus };
    const clip = h("div.inline", {},
      h("button", { type: "button", id: "copy-out", onclick: () => this.copyOut() }, "Copy from rig"),
      h("button", { type: "button", id: "paste-in", onclick: () => this.pasteFromHost() }, "Paste into rig"));
    this.clipOut = h("div", { id: "clip-out" });
    this.prompt = h("div.prompt", { id: "clip-prompt", role: "dialog", "aria-modal": "false", "aria-labelledby": "clip-prompt-title", hidden: true });
    replace(this.tools,
      h("div.tool", {}, h("h2", {}, "Clipboard"), clip, this.prompt, this.clipOut),
      h("div.tool", {}, h("h2", {}, "Files"),
        h("p.muted", {}, DROP_SAYS[this.rig.surface] || DROP_SAYS.computer),
        h("label", { for: "drop-pick" }, "Send files"), pick, progress, dropStatus, download));
  }

  async sendFiles(files, point) {
    const { progress, status } = this.dropUi;
    const total = files.reduce((n, f) => n + f.size, 0);
    progress.hidden = false;
    progress.max = Math.max(1, total);
    progress.value = 0;
    announce(status, `Sending ${files.length} file${files.length === 1 ? "" : "s"} (${bytes(total)})…`);
    try {
      const result = await uploadDrop(this.rigId, files, point, (sent, all) => {
        progress.max = all; progress.value = sent;
        announce(status, `Sending… ${Math.round((100 * sent) / all)}%`);
      });
      progress.value = progress.max;
      const told = result.told === "clipboard" ? " Their paths are on the rig's clipboard." : "";
      announce(status, `Saved ${result.saved.map((s) => s.path).join(", ")}.${told}`, "ok");
      this.loadLog(false);
    } catch (e) {
      progress.hidden = true;
      announce(status, describe(e), "error");
    }
  }

  /** Host → rig: the text (or image) given, through the clipboard lane. */
  async pasteData(blob, type) {
    await lane(`/rig/clipboard/${encodeURIComponent(this.rigId)}`, {
      method: "POST", headers: { "Content-Type": type }, body: blob,
    });
  }

  async pasteFromHost() {
    try {
      const text = await navigator.clipboard.readText();
      await this.pasteData(text, "text/plain; charset=utf-8");
      announce(this.status, `Pasted ${text.length} characters into the rig's clipboard.`, "ok");
    } catch (e) { announce(this.status, `Paste: ${describe(e)}`, "error"); }
  }

  /** Rig → host: asks first when the person's policy says so. */
  async copyOut(again = true) {
    let response;
    try {
      response = await lane(`/rig/clipboard/${encodeURIComponent(this.rigId)}`);
    } catch (e) {
      if (e instanceof RpcError && e.status === 403 && e.data.ask && again) { this.ask(); return; }
      announce(this.status, `Copy: ${describe(e)}`, "error");
      return;
    }
    if (response.status === 204) { announce(this.status, "The rig's clipboard is empty."); replace(this.clipOut); return; }
    const type = response.headers.get("Content-Type") || "";
    if (type.startsWith("image/")) {
      const blob = await response.blob();
      replace(this.clipOut, h("img", { src: URL.createObjectURL(blob), alt: "Image copied from the rig", class: "clip-image" }));
      try { await navigator.clipboard.write([new ClipboardItem({ [blob.type]: blob })]); } catch { /* shown above */ }
      announce(this.status, `Copied an image (${bytes(blob.size)}) from the rig.`, "ok");
      return;
    }
    const text = await response.text();
    replace(this.clipOut, h("label", { for: "clip-text" }, "Copied from the rig"),
      h("textarea", { id: "clip-text", readonly: true, rows: 3, cols: 50 }, text));
    try { await navigator.clipboard.writeText(text); } catch { /* the text is shown above */ }
    announce(this.status, `Copied ${text.length} characters from the rig.`, "ok");
  }

  ask() {
    const done = async (choice) => {
      this.prompt.hidden = true;
      try {
        if (choice === "grant") await call("clipboard.grant", { rigId: this.rigId });
        else if (choice === "always") await call("clipboard.policy.set", { rigToHost: "allow" });
        else { announce(this.status, "Copy denied: nothing left the rig."); return; }
        await this.copyOut(false);
      } catch (e) { announce(this.status, describe(e), "error"); }
    };
    this.prompt.hidden = false;
    replace(this.prompt,
      h("p", { id: "clip-prompt-title" }, "Copy the rig's clipboard to this computer?"),
      h("button.primary", { type: "button", id: "clip-grant", onclick: () => done("grant") }, "Allow for ten minutes"),
      h("button", { type: "button", id: "clip-always", onclick: () => done("always") }, "Always"),
      h("button", { type: "button", id: "clip-deny", onclick: () => done("deny") }, "Deny"));
    this.prompt.querySelector("button").focus();
  }

  async loadLog(older) {
    // Newest first: a page is the rows before a seq; seqs run 1, 2, 3… with
    // no gaps, so a page whose last row is above 1 has older rows.
    try {
      const before = older && this.oldest ? this.oldest : Number.MAX_SAFE_INTEGER;
      const rows = await call("rig.log", { rigId: this.rigId, beforeSeq: before, limit: LOG_PAGE });
      if (!older) replace(this.logBody);
      for (const r of rows) this.logBody.append(logRow(r));
      if (rows.length) this.oldest = rows[rows.length - 1].seq;
      this.logMore.hidden = !(rows.length && rows[rows.length - 1].seq > 1);
      if (!older && !rows.length) this.logBody.append(h("tr", {}, h("td", { colspan: 7 }, "Nothing logged yet.")));
    } catch (e) { announce(this.status, describe(e), "error"); }
  }
}

function logRow(r) {
  return h("tr", {},
    h("td", {}, String(r.seq)), h("td", {}, new Date(r.at).toLocaleTimeString()),
    h("td", {}, `${r.actor.kind}`), h("td", {}, r.tool), h("td", {}, r.verb),
    h("td", {}, h("code", {}, summarise(r.args))),
    h("td", {}, r.outcome + (r.error ? `: ${r.error}` : "")));
}

/** The logged shape; masked text stays as the server stored it (length and hash). */
function summarise(args) {
  if (!args || typeof args !== "object") return "";
  return Object.entries(args).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ").slice(0, 200);
}

function describe(e) { return e instanceof RpcError ? e.describe() : String(e); }

export { wsUrl, backoff };
