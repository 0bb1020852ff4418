// The server panel: desktop images (import with progress and ETA, the list
// and which one boots) and clipboard access (the signed-in person's own
// choices; an admin also sees everyone's).
import { call, RpcError } from "./rpc.js";
import { h, replace, duration, bytes, announce } from "./dom.js";

const CHOICES = [["allow", "Allow"], ["ask", "Ask first"], ["deny", "Deny"]];

export class ServerPanel {
  constructor(ctx) {
    this.ctx = ctx;
    this.disposed = false;
    this.images = h("tbody", { id: "images-body" });
    this.importStatus = h("p.status", { role: "status", "aria-live": "polite", id: "import-status" });
    this.progress = h("progress", { id: "import-progress", max: 1, value: 0, hidden: true, "aria-label": "Import progress" });
    this.source = h("input", { id: "import-source", name: "source", required: true, size: 40,
      placeholder: "https://…/rigd-image.json or /path/disk.qcow2" });
    this.sha = h("input", { id: "import-sha256", name: "sha256", required: true, size: 40,
      pattern: "(sha256:)?[0-9a-fA-F]{64}", placeholder: "64 hex digits" });
    this.cancel = h("button", { type: "button", hidden: true, onclick: () => this.cancelImport() }, "Cancel import");
    this.clipStatus = h("p.status", { role: "status", "aria-live": "polite" });
    this.h2r = h("select", { id: "clip-host-to-rig", onchange: () => this.setPolicy({ hostToRig: this.h2r.value }) },
      CHOICES.map(([v, t]) => h("option", { value: v }, t)));
    this.r2h = h("select", { id: "clip-rig-to-host", onchange: () => this.setPolicy({ rigToHost: this.r2h.value }) },
      CHOICES.map(([v, t]) => h("option", { value: v }, t)));
    this.grants = h("ul", { id: "clip-grants" });
    this.everyone = h("div", { id: "clip-everyone" });
    const admin = ctx.session.me.admin;
    this.element = h("div.panel", {},
      h("section.card", { "aria-labelledby": "images-title" },
        h("h2", { id: "images-title" }, "Desktop images"),
        h("table", { "aria-labelledby": "images-title" },
          h("thead", {}, h("tr", {}, ["Image", "Guest protocol", "Display", "Size", "Imported", "Boots"].map((c) => h("th", { scope: "col" }, c)))),
          this.images),
        admin ? h("form.grid", { "aria-label": "Import a desktop image", onsubmit: (e) => { e.preventDefault(); this.startImport(); } },
          h("label", { for: "import-source" }, "URL or path"), this.source,
          h("label", { for: "import-sha256" }, "sha256"), this.sha,
          h("div", {}, h("button.primary", { type: "submit", id: "import-start" }, "Import"), " ", this.cancel)) :
          h("p.muted", {}, "Only an admin can import images."),
        this.progress, this.importStatus),
      h("section.card", { "aria-labelledby": "clip-title" },
        h("h2", { id: "clip-title" }, "Clipboard access"),
        h("p.muted", {}, "Your own choices, per direction; never a workspace setting."),
        h("div.grid", {},
          h("label", { for: "clip-host-to-rig" }, "Paste from this computer into rigs"), this.h2r,
          h("label", { for: "clip-rig-to-host" }, "Copy from rigs to this computer"), this.r2h),
        h("h3", {}, "Ten-minute grants"), this.grants, this.clipStatus,
        admin ? h("div", {}, h("h3", {}, "Everyone's choices"), this.everyone) : null));
    this.loadImages();
    this.loadPolicy();
  }

  dispose() { this.disposed = true; clearTimeout(this.poll); }

  async loadImages() {
    try {
      const list = await call("image.list");
      if (this.disposed) return;
      if (!list.length) {
        replace(this.images, h("tr", {}, h("td", { colspan: 6 }, "No desktop image yet (make images-desktop builds one).")));
        return;
      }
      replace(this.images, list.map((i) => h("tr", { dataset: { sha256: i.sha256 } },
        h("td", {}, h("code", { title: i.sha256 }, `sha256:${i.sha256.slice(0, 16)}…`)),
        h("td", {}, String(i.guestProtocol)),
        h("td", {}, i.display ? `${i.display.width}×${i.display.height}` : "—"),
        h("td", {}, bytes(i.bytes)),
        h("td", {}, i.importedAt ? new Date(i.importedAt).toLocaleString()
          : i.state === "built" ? "built, imported on first use" : "—"),
        h("td", {}, i.boots ? h("strong", {}, "boots new rigs") : "—"))));
    } catch (e) { announce(this.importStatus, describe(e), "error"); }
  }

  async startImport() {
    this.progress.hidden = false;
    this.progress.removeAttribute("value");
    announce(this.importStatus, "Starting the import…");
    try {
      const job = await call("image.import", { source: this.source.value.trim(), sha256: this.sha.value.trim() });
      this.job = job.importId;
      this.cancel.hidden = false;
      this.track(job);
    } catch (e) {
      this.progress.hidden = true;
      announce(this.importStatus, describe(e), "error");
    }
  }

  async cancelImport() {
    if (!this.job) return;
    try { await call("image.importCancel", { importId: this.job }); } catch (e) { announce(this.importStatus, describe(e), "error"); }
  }

  track(job) {
    if (this.disposed) return;
    if (job.totalBytes) { this.progress.max = job.totalBytes; this.progress.value = job.bytes || 0; }
    const rate = job.rateBps ? `${bytes(job.rateBps)}/s` : "";
    const eta = job.etaS !== null && job.etaS !== undefined ? `, about ${duration(job.etaS)} left` : "";
    if (job.state === "running") {
      const of = job.totalBytes ? ` of ${bytes(job.totalBytes)}` : "";
      announce(this.importStatus, `${job.phase || "importing"}: ${bytes(job.bytes || 0)}${of} ${rate}${eta}`);
      this.poll = setTimeout(async () => {
        try { this.track(await call("image.importStatus", { importId: job.importId })); } catch (e) { announce(this.importStatus, describe(e), "error"); }
      }, 500);
      return;
    }
    this.cancel.hidden = true;
    this.job = null;
    if (job.state === "done") {
      this.progress.value = this.progress.max;
      announce(this.importStatus, `Imported sha256:${job.image ? job.image.sha256 : ""}.`, "ok");
      this.loadImages();
    } else {
      this.progress.hidden = true;
      const msg = job.error ? job.error.message : job.state;
      announce(this.importStatus, `Import ${job.state}: ${msg}`, "error");
    }
  }

  async loadPolicy() {
    try {
      this.showPolicy(await call("clipboard.policy.get"));
      if (this.ctx.session.me.admin) {
        const all = await call("clipboard.policy.list");
        replace(this.everyone, h("table", {},
          h("thead", {}, h("tr", {}, ["Person", "Paste into rigs", "Copy out of rigs", "Grants"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, all.map((p) => h("tr", {},
            h("td", {}, p.user.name), h("td", {}, p.hostToRig), h("td", {}, p.rigToHost),
            h("td", {}, (p.grants || []).map((g) => g.rigId).join(", ") || "—"))))));
      }
    } catch (e) { announce(this.clipStatus, describe(e), "error"); }
  }

  showPolicy(policy) {
    this.h2r.value = policy.hostToRig;
    this.r2h.value = policy.rigToHost;
    replace(this.grants, policy.grants.length ? policy.grants.map((g) => h("li", {}, `${g.rigId} until ${new Date(g.until).toLocaleTimeString()}`)) : h("li.muted", {}, "none"));
  }

  async setPolicy(change) {
    try {
      this.showPolicy(await call("clipboard.policy.set", change));
      announce(this.clipStatus, "Saved.", "ok");
    } catch (e) { announce(this.clipStatus, describe(e), "error"); }
  }
}

function describe(e) { return e instanceof RpcError ? e.describe() : String(e); }
