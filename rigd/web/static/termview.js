// A terminal rig's tab: an interactive terminal over the PTY WebSocket
// (/rig/term/<rigId>). Output arrives as binary frames; keystrokes go out as
// binary frames; a resize is a JSON text frame. A lost socket reconnects
// with backoff (a new shell: the old one ended with its connection).
import { wsUrl, backoff } from "./rpc.js";
import { h } from "./dom.js";
import { Terminal } from "./term.js";

export class TermView {
  constructor({ tab, status }) {
    this.tab = tab;
    this.say = status;
    this.box = h("div.term", { id: "terminal" });
    this.info = h("p.muted", { id: "term-info" }, "Connecting…");
    this.element = h("div.termwrap", {}, this.box, this.info);
    this.term = new Terminal(this.box, { cols: 100, rows: 30 });
    this.encoder = new TextEncoder();
    this.attempt = 0;
    this.disposed = false;
    this.term.onData((s) => { if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(this.encoder.encode(s)); });
    this.term.onResize((cols, rows) => this.sendSize(cols, rows));
    this.fitter = new ResizeObserver(() => this.term.fit());
    this.fitter.observe(this.box);
    this.box.addEventListener("dragover", (ev) => ev.preventDefault());
    this.box.addEventListener("drop", (ev) => {
      ev.preventDefault();
      const files = [...(ev.dataTransfer ? ev.dataTransfer.files : [])];
      if (files.length) this.tab.sendFiles(files, null);
    });
    this.open();
  }

  focus() { this.term.focus(); }

  dispose() {
    this.disposed = true;
    this.fitter.disconnect();
    if (this.ws) this.ws.close();
    this.term.dispose();
  }

  sendSize(cols, rows) {
    this.size = { cols, rows };
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  open() {
    const ws = new WebSocket(wsUrl(`/rig/term/${encodeURIComponent(this.tab.rigId)}`));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      this.info.textContent = "Connected: this terminal is a shell inside the rig.";
      this.term.fit();
      if (this.size) this.sendSize(this.size.cols, this.size.rows);
      this.term.focus();
    };
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") { this.term.write(new Uint8Array(m.data)); return; }
      let msg;
      try { msg = JSON.parse(m.data); } catch { return; }
      if (msg.type === "exit") this.exited = true;
      if (msg.type === "exit") this.info.textContent = `The shell exited${msg.exitCode !== undefined ? ` (status ${msg.exitCode})` : ""}.`;
    };
    ws.onclose = () => {
      if (this.disposed) return;
      this.ws = null;
      if (this.exited) {
        this.exited = false;
        this.info.append(" ", h("button", { type: "button", onclick: () => { this.term.write("\r\n"); this.open(); } }, "New shell"));
        return;
      }
      const delay = backoff(this.attempt++);
      this.info.textContent = `The terminal lost its connection — reconnecting in ${(delay / 1000).toFixed(1)} s (a new shell)…`;
      setTimeout(async () => {
        if (this.disposed) return;
        await this.tab.refresh();
        if (!this.disposed && this.tab.rig && this.tab.rig.phase !== "closed") {
          this.term.write("\r\n\x1b[2m[reconnected: a new shell]\x1b[0m\r\n");
          this.open();
        }
      }, delay);
    };
  }
}
