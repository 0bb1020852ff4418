// The rigs screen: a workspace switcher, the workspace's rigs (live from the
// event stream), opening rigs, the row actions, and the server panel.
import { call, RpcError } from "./rpc.js";
import { h, replace, duration, since, announce } from "./dom.js";
import { ServerPanel } from "./panel.js";

const WS_KEY = "rigd.workspace";
const COLUMNS = ["Rig", "Surface", "Phase", "Backend", "Display", "Controller", "Memory", "Age", "Idle", "Pins", "Actions"];

export class RigsScreen {
  constructor(ctx) {
    this.ctx = ctx;
    this.rigs = new Map();
    this.disposed = false;
    this.status = h("p.status", { role: "status", "aria-live": "polite", id: "rigs-status" });
    this.tbody = h("tbody", { id: "rigs-body" });
    this.select = h("select", { id: "workspace", onchange: () => this.switchTo(this.select.value) });
    this.surface = h("select", { id: "open-surface", name: "surface" });
    this.panel = new ServerPanel(ctx);
    const table = h("table.rigs", { "aria-labelledby": "rigs-title", "aria-describedby": "rigs-status" },
      h("caption.sr", {}, "Rigs of the workspace; updates live"),
      h("thead", {}, h("tr", {}, COLUMNS.map((c) => h("th", { scope: "col" }, c)))), this.tbody);
    const open = h("form.inline", { "aria-label": "Open a rig", onsubmit: (e) => { e.preventDefault(); this.open(); } },
      h("label", { for: "open-surface" }, "Surface"), this.surface,
      h("button.primary", { type: "submit", id: "open-rig" }, "Open rig"));
    // Named snapshots of the workspace (issue 29): what a rig's "Snapshot" kept, to open again.
    this.snapBody = h("tbody", { id: "snapshots-body" });
    const snapTable = h("table.rigs", { "aria-labelledby": "snapshots-title" },
      h("thead", {}, h("tr", {}, ["Snapshot", "Surface", "Size", "Taken", "From rig", "Actions"].map((c) => h("th", { scope: "col" }, c)))),
      this.snapBody);
    // Volumes of the workspace (issue 29): disks that outlive rigs (attached at rig.open).
    this.volBody = h("tbody", { id: "volumes-body" });
    this.volName = h("input", { id: "volume-name", name: "name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._-]{0,63}", size: 16 });
    this.volSize = h("input", { id: "volume-size", name: "sizeMb", type: "number", min: 16, value: 1024, required: true, size: 6 });
    const volForm = h("form.inline", { "aria-label": "Make a volume", onsubmit: (e) => { e.preventDefault(); this.createVolume(); } },
      h("label", { for: "volume-name" }, "Name"), this.volName,
      h("label", { for: "volume-size" }, "Size (MB)"), this.volSize,
      h("button", { type: "submit", id: "create-volume" }, "Make volume"));
    const volTable = h("table.rigs", { "aria-labelledby": "volumes-title" },
      h("thead", {}, h("tr", {}, ["Volume", "Size", "Made", "Attached to", "Actions"].map((c) => h("th", { scope: "col" }, c)))),
      this.volBody);
    // Seats of the workspace (issue 29): each named agent's lasting rig, who holds it, whom it is handed to.
    this.seatBody = h("tbody", { id: "seats-body" });
    const seatTable = h("table.rigs", { "aria-labelledby": "seats-title" },
      h("thead", {}, h("tr", {}, ["Seat", "Surface", "State", "Held by", "Handed to", "Volume", "Actions"].map((c) => h("th", { scope: "col" }, c)))),
      this.seatBody);
    // Saved logins of the workspace (issue 30): a person saves a site's password here once; an
    // agent's browser_use login fills it into that site's HTTPS form and never sees it.
    this.loginBody = h("tbody", { id: "logins-body" });
    this.loginSite = h("input", { id: "login-site", name: "site", type: "url", required: true, placeholder: "an https:// origin", size: 24 });
    this.loginAccount = h("input", { id: "login-account", name: "account", required: true, autocomplete: "off", size: 16 });
    this.loginPassword = h("input", { id: "login-password", name: "password", type: "password", required: true, autocomplete: "new-password", size: 16 });
    const loginForm = h("form.inline", { "aria-label": "Save a login", onsubmit: (e) => { e.preventDefault(); this.saveLogin(); } },
      h("label", { for: "login-site" }, "Site"), this.loginSite,
      h("label", { for: "login-account" }, "Account"), this.loginAccount,
      h("label", { for: "login-password" }, "Password"), this.loginPassword,
      h("button", { type: "submit", id: "save-login" }, "Save login"));
    const loginTable = h("table.rigs", { "aria-labelledby": "logins-title" },
      h("thead", {}, h("tr", {}, ["Site", "Account", "Saved", "Actions"].map((c) => h("th", { scope: "col" }, c)))),
      this.loginBody);
    replace(ctx.main,
      h("section.card", { "aria-labelledby": "rigs-title" },
        h("div.row", {},
          h("h1", { id: "rigs-title" }, "Rigs"),
          h("div.inline", {}, h("label", { for: "workspace" }, "Workspace"), this.select), open),
        this.status,
        h("div.scroll", {}, table)),
      h("section.card", { "aria-labelledby": "seats-title" },
        h("h2", { id: "seats-title" }, "Seats"),
        h("p.muted", {}, "A seat is a named agent's lasting rig: rig.open {seat} opens or wakes it, with its volume at /workspace and its own browser profile. Hand one to yourself to drive it; agents only watch until you hand it back."),
        h("div.scroll", {}, seatTable)),
      h("section.card", { "aria-labelledby": "logins-title" },
        h("div.row", {}, h("h2", { id: "logins-title" }, "Logins"), loginForm),
        h("p.muted", {}, "A saved login is sealed on the server and filled by browser_use login only into its own site's HTTPS form; agents see the account, never the password."),
        h("div.scroll", {}, loginTable)),
      h("section.card", { "aria-labelledby": "snapshots-title" },
        h("h2", { id: "snapshots-title" }, "Snapshots"),
        h("p.muted", {}, "A snapshot keeps a running terminal or computer rig's memory and disk; each open resumes it as a rig of its own."),
        h("div.scroll", {}, snapTable)),
      h("section.card", { "aria-labelledby": "volumes-title" },
        h("div.row", {}, h("h2", { id: "volumes-title" }, "Volumes"), volForm),
        h("p.muted", {}, "A volume is an ext4 disk of the workspace that outlives its rigs: rig.open {volumes: [{name, path}]} attaches it (one writer, or any number of readers)."),
        h("div.scroll", {}, volTable)),
      this.panel.element);
    this.timer = setInterval(() => this.tick(), 1000);
    this.load();
  }

  dispose() { this.disposed = true; clearInterval(this.timer); this.panel.dispose(); }

  async load() {
    try {
      const workspaces = await call("workspace.list");
      const info = this.ctx.session.info;
      // A browser rig runs one engine for life: one choice per engine this server starts.
      replace(this.surface, (info.surfaces || []).flatMap((s) => (s === "browser" && (info.engines || []).length
        ? info.engines.map((e) => h("option", { value: `browser:${e}` }, `browser (${e})`))
        : [h("option", { value: s }, s)])));
      if (!workspaces.length) {
        replace(this.select, h("option", { value: "" }, "no workspaces"));
        announce(this.status, "You are not a member of any workspace, so there are no rigs to show.");
        replace(this.tbody, h("tr", {}, h("td", { colspan: COLUMNS.length }, "No rigs.")));
        return;
      }
      const wanted = new URLSearchParams(location.search).get("ws") || localStorage.getItem(WS_KEY);
      const ws = workspaces.find((w) => w.id === wanted || w.name === wanted) || workspaces[0];
      replace(this.select, workspaces.map((w) => h("option", { value: w.id, selected: w.id === ws.id }, w.name)));
      await this.switchTo(ws.id);
    } catch (e) { this.fail(e); }
  }

  async switchTo(workspace) {
    this.workspace = workspace;
    localStorage.setItem(WS_KEY, workspace);
    this.ctx.socket.subscribe(workspace);
    await this.reload();
    await this.loadSeats();
    await this.loadSnapshots();
    await this.loadVolumes();
    await this.loadLogins();
  }

  async loadLogins() {
    try {
      const list = await call("login.list", { workspace: this.workspace });
      if (this.disposed) return;
      replace(this.loginBody, list.length ? list.map((l) => h("tr", { dataset: { site: l.site, account: l.account } },
        h("th", { scope: "row" }, l.site),
        h("td", {}, l.account),
        h("td", {}, new Date(l.createdAt).toLocaleString()),
        h("td.actions", {}, h("button.danger", { type: "button", "aria-label": `Remove the login ${l.account} at ${l.site}`, onclick: () => this.removeLogin(l) }, "Remove"))))
        : h("tr", {}, h("td", { colspan: 4 }, "No saved logins.")));
    } catch (e) { this.fail(e); }
  }

  async saveLogin() {
    const site = this.loginSite.value.trim(), account = this.loginAccount.value;
    announce(this.status, `Saving the login ${account} at ${site}…`);
    try {
      const saved = await call("login.save", { workspace: this.workspace, site, account, password: this.loginPassword.value });
      this.loginPassword.value = "";  // the password leaves the page as soon as it is saved
      announce(this.status, `Saved the login ${saved.account} at ${saved.site}.`, "ok");
      await this.loadLogins();
    } catch (e) { this.fail(e); }
  }

  async removeLogin(l) {
    announce(this.status, `Removing the login ${l.account} at ${l.site}…`);
    try {
      await call("login.rm", { workspace: this.workspace, site: l.site, account: l.account });
      announce(this.status, `Removed the login ${l.account} at ${l.site}.`, "ok");
      await this.loadLogins();
    } catch (e) { this.fail(e); }
  }

  async loadSeats() {
    try {
      const list = await call("seat.list", { workspace: this.workspace });
      if (this.disposed) return;
      const me = this.ctx.session.me;
      replace(this.seatBody, list.length ? list.map((seat) => {
        const mine = seat.handedTo && seat.handedTo.id === me.id;
        const running = ["provisioning", "ready", "parked"].includes(seat.state);
        return h("tr", { dataset: { seat: seat.name, state: seat.state } },
          h("th", { scope: "row" }, seat.name),
          h("td", {}, seat.engine ? `${seat.surface} (${seat.engine})` : seat.surface),
          h("td", {}, running && seat.rigId
            ? h("a", { href: `/settings/server/rigs/${encodeURIComponent(seat.rigId)}`, "data-nav": true, "aria-label": `Open the tab of seat ${seat.name}` }, `${seat.state} · ${seat.rigId}`)
            : seat.state),
          h("td", {}, seat.holder ? seat.holder.conversation : "—"),
          h("td", {}, seat.handedTo ? (mine ? "you" : seat.handedTo.id) : "—"),
          h("td", {}, `${seat.volume} at ${seat.path}`),
          h("td.actions", {},
            !seat.handedTo && h("button", { type: "button", "aria-label": `Hand seat ${seat.name} to me`, onclick: () => this.seatAct(seat, "Handing you", "seat.handOver") }, "Hand to me"),
            mine && h("button", { type: "button", "aria-label": `Hand seat ${seat.name} back`, onclick: () => this.seatAct(seat, "Handing back", "seat.handBack") }, "Hand back"),
            seat.holder && h("button", { type: "button", "aria-label": `Release seat ${seat.name}`, onclick: () => this.seatAct(seat, "Releasing", "seat.release") }, "Release"),
            h("button.danger", { type: "button", "aria-label": `Remove seat ${seat.name}`, disabled: running, onclick: () => this.seatAct(seat, "Removing", "seat.rm") }, "Remove")));
      }) : h("tr", {}, h("td", { colspan: 7 }, "No seats. rig.open {seat: NAME} makes one.")));
    } catch (e) { this.fail(e); }
  }

  async seatAct(seat, doing, method) {
    announce(this.status, `${doing} seat ${seat.name}…`);
    try {
      await call(method, { workspace: this.workspace, name: seat.name });
      announce(this.status, `${doing} seat ${seat.name}: done.`, "ok");
      await this.loadSeats();
      await this.reload();
    } catch (e) { this.fail(e); }
  }

  async loadVolumes() {
    try {
      const list = await call("volume.list", { workspace: this.workspace });
      if (this.disposed) return;
      replace(this.volBody, list.length ? list.map((v) => h("tr", { dataset: { volume: v.name } },
        h("th", { scope: "row" }, v.name),
        h("td", {}, `${v.sizeMb} MB`),
        h("td", {}, new Date(v.createdAt).toLocaleString()),
        h("td", {}, v.attachedTo.join(", ") || "—"),
        h("td.actions", {}, h("button.danger", { type: "button", "aria-label": `Remove volume ${v.name}`, disabled: v.attachedTo.length > 0, onclick: () => this.removeVolume(v) }, "Remove"))))
        : h("tr", {}, h("td", { colspan: 5 }, "No volumes.")));
    } catch (e) { this.fail(e); }
  }

  async createVolume() {
    const name = this.volName.value.trim();
    announce(this.status, `Making volume ${name}…`);
    try {
      const v = await call("volume.create", { workspace: this.workspace, name, sizeMb: Number(this.volSize.value) });
      announce(this.status, `Made volume ${v.name} (${v.sizeMb} MB).`, "ok");
      this.volName.value = "";
      await this.loadVolumes();
    } catch (e) { this.fail(e); }
  }

  async removeVolume(v) {
    announce(this.status, `Removing volume ${v.name}…`);
    try {
      await call("volume.rm", { workspace: this.workspace, name: v.name });
      announce(this.status, `Removed volume ${v.name}.`, "ok");
      await this.loadVolumes();
    } catch (e) { this.fail(e); }
  }

  async loadSnapshots() {
    try {
      const list = await call("snapshot.list", { workspace: this.workspace });
      if (this.disposed) return;
      replace(this.snapBody, list.length ? list.map((s) => h("tr", { dataset: { snapshot: s.name } },
        h("th", { scope: "row" }, s.name),
        h("td", {}, s.surface),
        h("td", {}, `${Math.ceil(s.bytes / 1048576)} MB`),
        h("td", {}, new Date(s.createdAt).toLocaleString()),
        h("td", {}, s.sourceRig),
        h("td.actions", {},
          h("button", { type: "button", "aria-label": `Open a rig from ${s.name}`, onclick: () => this.openSnapshot(s) }, "Open"),
          h("button.danger", { type: "button", "aria-label": `Remove snapshot ${s.name}`, onclick: () => this.removeSnapshot(s) }, "Remove"))))
        : h("tr", {}, h("td", { colspan: 6 }, "No snapshots. A ready terminal or computer rig's Snapshot button keeps one.")));
    } catch (e) { this.fail(e); }
  }

  async snapshot(rig) {
    const name = prompt(`Name the snapshot of ${rig.id} (letters, digits, . _ -)`, `${rig.surface}-${new Date().toISOString().slice(0, 16).replace(/[:T]/g, "-")}`);
    if (!name) return;
    announce(this.status, `Keeping ${rig.id} as ${name}…`);
    try {
      const kept = await call("snapshot.create", { rigId: rig.id, name });
      announce(this.status, `Kept ${rig.id} as snapshot ${kept.name} (${Math.ceil(kept.bytes / 1048576)} MB).`, "ok");
      await this.loadSnapshots();
    } catch (e) { this.fail(e); }
  }

  async openSnapshot(s) {
    announce(this.status, `Opening a rig from snapshot ${s.name}…`);
    try {
      const rig = await call("rig.open", { workspace: this.workspace, surface: s.surface, snapshot: s.name, wait: false });
      this.rigs.set(rig.id, rig);
      this.render();
      announce(this.status, `Opened ${rig.id} from snapshot ${s.name} (${rig.phase}).`, "ok");
    } catch (e) { this.fail(e); }
  }

  async removeSnapshot(s) {
    announce(this.status, `Removing snapshot ${s.name}…`);
    try {
      await call("snapshot.rm", { workspace: this.workspace, name: s.name });
      announce(this.status, `Removed snapshot ${s.name}.`, "ok");
      await this.loadSnapshots();
    } catch (e) { this.fail(e); }
  }

  async fork(rig) {
    announce(this.status, `Forking ${rig.id}…`);
    try {
      const { rigs } = await call("rig.fork", { rigId: rig.id, count: 1 });
      for (const copy of rigs) this.rigs.set(copy.id, copy);
      this.render();
      announce(this.status, `Forked ${rig.id}: ${rigs.map((r) => `${r.id} (${r.phase})`).join(", ")}.`, "ok");
    } catch (e) { this.fail(e); }
  }

  async reload() {
    try {
      const list = await call("rig.list", { workspace: this.workspace });
      if (this.disposed) return;
      this.rigs = new Map(list.map((r) => [r.id, r]));
      this.render();
      announce(this.status, `${list.length} rig${list.length === 1 ? "" : "s"}.`);
    } catch (e) { this.fail(e); }
  }

  onConnection(status) { if (status === "reconnected") this.reload(); }

  async onEvent(event) {
    if (event.workspace !== this.workspace || !event.rigId) return;
    if (event.type === "RigClosedEvent") {
      const seated = this.rigs.get(event.rigId)?.seat;
      this.rigs.delete(event.rigId);
      this.render();
      if (seated) this.loadSeats();
      announce(this.status, `Rig ${event.rigId} closed (${event.reason || event.closeReason || "closed"}).`);
      this.ctx.refreshFacts();
      return;
    }
    try {
      const rig = await call("rig.get", { rigId: event.rigId });
      if (this.disposed) return;
      const known = this.rigs.get(rig.id);
      if (rig.phase === "closed") this.rigs.delete(rig.id); else this.rigs.set(rig.id, rig);
      this.render();
      if (rig.seat && (!known || known.phase !== rig.phase || known.controller?.id !== rig.controller?.id)) this.loadSeats();
      if (event.type === "RigPhaseChanged") this.ctx.refreshFacts();
    } catch { /* gone, or not ours */ }
  }

  tick() {
    // Rigs coming up and pools filling say what they are doing (an image build's steps):
    // asked again every two seconds while any is.
    this.ticks = (this.ticks || 0) + 1;
    if (this.ticks % 2 === 0) {
      for (const rig of this.rigs.values()) {
        if (rig.phase === "provisioning") this.onEvent({ workspace: this.workspace, rigId: rig.id, type: "poll" });
      }
      if ((this.ctx.session.info.pools || []).some((p) => p.filling)) this.ctx.refreshFacts();
    }
    for (const tr of this.tbody.querySelectorAll("tr[data-rig]")) {
      const rig = this.rigs.get(tr.dataset.rig);
      if (!rig) continue;
      tr.querySelector(".age").textContent = duration(since(rig.createdAt));
      tr.querySelector(".idle").textContent = duration(since(rig.lastActiveAt));
    }
  }

  async open() {
    const [surface, engine] = this.surface.value.split(":");
    announce(this.status, `Opening a ${engine ? `${engine} ${surface}` : surface} rig…`);
    try {
      // Without waiting: the row shows at once, provisioning, with what it is doing (the first
      // rig of an engine builds its image for minutes), and the events bring it to ready.
      const rig = await call("rig.open", { workspace: this.workspace, surface, conversation: `page-${Date.now()}`,
        wait: false, ...(engine ? { engine } : {}) });
      this.rigs.set(rig.id, rig);
      this.render();
      announce(this.status, `Opened ${rig.id} (${rig.phase}${rig.start === "pool" ? ", from its pool" : ""}).`, "ok");
    } catch (e) { this.fail(e); }
  }

  async act(rig, label, method, params) {
    announce(this.status, `${label} ${rig.id}…`);
    try {
      const result = await call(method, params);
      if (result && result.id === rig.id) this.rigs.set(rig.id, result);
      if (method === "rig.close") this.rigs.delete(rig.id);
      this.render();
      announce(this.status, `${label} ${rig.id}: done.`, "ok");
    } catch (e) { this.fail(e); }
  }

  fail(e) { announce(this.status, e instanceof RpcError ? e.describe() : String(e), "error"); }

  render() {
    const me = this.ctx.session.me;
    const rows = [...this.rigs.values()].sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1));
    if (!rows.length) {
      replace(this.tbody, h("tr", {}, h("td", { colspan: COLUMNS.length }, "No rigs in this workspace. Open one above.")));
      return;
    }
    replace(this.tbody, rows.map((rig) => this.row(rig, me)));
  }

  row(rig, me) {
    const mine = rig.controller && rig.controller.kind === "person" && rig.controller.id === me.id;
    const running = ["ready", "busy", "parked"].includes(rig.phase);
    const failed = rig.phase === "failed";
    const actions = [
      h("a.button", { href: `/settings/server/rigs/${encodeURIComponent(rig.id)}`, "data-nav": true,
        "aria-label": `Open the tab of ${rig.id}` }, rig.surface === "terminal" ? "Terminal" : "View"),
      running && !mine && h("button", { type: "button", onclick: () => this.act(rig, "Taking control of", "rig.control", { rigId: rig.id, op: "take" }) }, "Take control"),
      running && mine && h("button", { type: "button", onclick: () => this.act(rig, "Handing back", "rig.control", { rigId: rig.id, op: "release" }) }, "Hand back"),
      rig.phase === "ready" && h("button", { type: "button", onclick: () => this.act(rig, "Parking", "rig.park", { rigId: rig.id }) }, "Park"),
      rig.phase === "ready" && h("button", { type: "button", "aria-label": `Fork ${rig.id}`, onclick: () => this.fork(rig) }, "Fork"),
      rig.phase === "ready" && rig.surface !== "browser" && h("button", { type: "button", "aria-label": `Snapshot ${rig.id}`, onclick: () => this.snapshot(rig) }, "Snapshot"),
      failed && h("button", { type: "button", onclick: () => this.act(rig, "Retrying", "rig.retry", { rigId: rig.id }) }, "Retry"),
      h("button.danger", { type: "button", "aria-label": `Close ${rig.id}`, onclick: () => this.act(rig, "Closing", "rig.close", { rigId: rig.id }) }, "Close"),
    ];
    const controller = rig.controller ? `${rig.controller.kind}${rig.controller.kind === "person" && rig.controller.id === me.id ? " (you)" : ""}` : "—";
    const memory = rig.residentMb ? `${rig.residentMb} / ${rig.memoryMb} MB` : `${rig.memoryMb} MB`;
    return h("tr", { dataset: { rig: rig.id, phase: rig.phase } },
      h("th", { scope: "row" }, h("a", { href: `/settings/server/rigs/${encodeURIComponent(rig.id)}`, "data-nav": true }, rig.id),
        rig.forkedFrom ? h("div.muted", {}, `forked from ${rig.forkedFrom}`) : null,
        rig.seat ? h("div.muted", {}, `seat ${rig.seat}`) : null),
      h("td", {}, rig.engine ? `${rig.surface} (${rig.engine})` : rig.surface),
      h("td.phase", {}, h("span.phase", { dataset: { phase: rig.phase } }, rig.phase),
        rig.phaseDetail ? h("div.muted", {}, rig.phaseDetail) : null,
        rig.failure ? h("div.error", {}, rig.failure) : null),
      h("td", {}, `${rig.backend} · ${rig.accel || "?"}`,
        rig.securityBoundary === false ? h("div", {}, h("span.badge.danger", { title: (rig.notes || []).join(" ") }, "not a security boundary")) : null),
      h("td", {}, rig.display ? `${rig.display.width}×${rig.display.height}` : "—"),
      h("td.controller", {}, controller),
      h("td", {}, memory),
      h("td.age", {}, duration(since(rig.createdAt))),
      h("td.idle", {}, duration(since(rig.lastActiveAt))),
      h("td", {}, (rig.pins || []).join(", ") || "—"),
      h("td.actions", {}, actions));
  }
}
