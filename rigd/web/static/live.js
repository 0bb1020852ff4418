// The live view of a computer rig: frames from /rig/live/<rigId> drawn on a
// canvas scaled to fit, and — while this person holds control — mouse,
// wheel and keyboard sent back as guest pixels and X11 keysyms. Files
// dropped on the canvas go through the file lane at the drop point; a paste
// (ctrl+v) puts this computer's clipboard on the rig's first, then presses v.
import { call, wsUrl, backoff, RpcError } from "./rpc.js";
import { h } from "./dom.js";
import { keysymOf } from "./keys.js";

export class LiveView {
  constructor({ tab, status }) {
    this.tab = tab;
    this.say = status;
    this.control = tab.mine();
    this.display = tab.rig.display || { width: 1280, height: 800 };
    this.canvas = h("canvas.screen", {
      id: "screen", tabindex: 0, width: this.display.width, height: this.display.height,
      role: "img", "aria-label": `Live view of ${tab.rigId}. Take control, then focus here to type and click; Ctrl+] leaves the view.`,
      title: "While you hold control, keys go to the rig; Ctrl+] leaves the view",
    });
    this.ctx2d = this.canvas.getContext("2d");
    // Keys are read from a transparent textarea over the canvas that holds the focus: only an
    // editable element gets the text a layout, a dead key or an IME produces without a US key
    // (beforeinput, compositionend); that text goes to the rig as typed text.
    this.input = h("textarea.screen-input", {
      id: "screen-input", tabindex: -1, autocomplete: "off", autocapitalize: "off", spellcheck: "false",
      "aria-label": `Keyboard of ${tab.rigId}`,
    });
    this.imeOpen = false;
    this.info = h("p.muted", { id: "view-info", "aria-live": "off" }, "Connecting to the live view…");
    // A browser rig's tab has a small address bar for the person driving it: the same
    // browser_use verbs an agent calls (navigate, history, reload), audited as theirs.
    this.bar = tab.rig.surface === "browser" ? this.addressBar() : null;
    this.element = h("div.live", {}, this.bar, this.canvas, this.input, this.info);
    this.frames = 0;
    this.attempt = 0;
    this.disposed = false;
    this.pendingMove = null;
    this.held = new Set();
    this.texted = new Set();
    this.bind();
    this.open();
  }

  addressBar() {
    this.address = h("input", {
      id: "address", name: "url", type: "url", autocomplete: "off", spellcheck: "false",
      placeholder: "https://…", "aria-label": "Address",
    });
    const button = (label, text, action) => h("button", {
      type: "button", title: label, "aria-label": label, onclick: () => this.browse(action),
    }, text);
    this.barButtons = [
      button("Back", "←", { action: "history", direction: "back" }),
      button("Forward", "→", { action: "history", direction: "forward" }),
      button("Reload", "⟳", { action: "reload" }),
    ];
    this.go = h("button", { type: "submit" }, "Go");
    const form = h("form.addressbar", {
      "aria-label": "Browser controls",
      onsubmit: (ev) => {
        ev.preventDefault();
        let url = this.address.value.trim();
        if (url && !/^[a-z][a-z0-9+.-]*:/i.test(url)) url = `https://${url}`;
        if (url) this.browse({ action: "navigate", url });
      },
    }, ...this.barButtons, this.address, this.go);
    this.enableBar();
    return form;
  }

  enableBar() {
    if (!this.address) return;
    for (const el of [...this.barButtons, this.address, this.go]) el.disabled = !this.control;
    this.address.title = this.control ? "" : "Take control to drive the browser";
  }

  /** One browser_use verb as this person (refused unless they hold control); the bar shows
   * where the page went. */
  async browse(action) {
    if (!this.control) return;
    try {
      const out = await call("rig.act", { rigId: this.tab.rigId, tool: "browser_use", action });
      if (out && typeof out.url === "string") this.address.value = out.url;
      if (out && out.note) this.say(out.note, "warn");
    } catch (e) {
      this.say(e instanceof RpcError ? e.describe() : String(e), "error");
    }
  }

  dispose() {
    this.disposed = true;
    this.releaseAll();
    if (this.ws) this.ws.close();
  }

  /** Focus the keyboard's textarea, bringing the screen into view as focusing it would. */
  focus() {
    if (document.activeElement === this.input) return;
    this.input.focus({ preventScroll: true });
    this.canvas.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  setControl(mine) {
    if (this.control && !mine) this.releaseAll();
    this.control = mine;
    this.canvas.classList.toggle("driving", mine);
    this.enableBar();
  }

  open() {
    const ws = new WebSocket(wsUrl(`/rig/live/${encodeURIComponent(this.tab.rigId)}`));
    ws.binaryType = "blob";
    this.ws = ws;
    let header = null;
    ws.onopen = () => { this.attempt = 0; this.info.textContent = "Connected; waiting for the screen to change…"; };
    ws.onmessage = async (m) => {
      if (typeof m.data === "string") {
        let msg;
        try { msg = JSON.parse(m.data); } catch { return; }
        if (msg.type === "frame") header = msg;
        else if (msg.type === "hello" && msg.display) this.resize(msg.display);
        else if (msg.type === "error") this.say(`The rig refused input: ${msg.reason}${msg.field ? ` (${msg.field})` : ""}`, "error");
        return;
      }
      if (!header) return;
      const meta = header;
      header = null;
      try {
        const bitmap = await createImageBitmap(m.data);
        if (meta.display) this.resize(meta.display);
        this.ctx2d.drawImage(bitmap, 0, 0, this.canvas.width, this.canvas.height);
        bitmap.close();
        this.frames++;
        this.canvas.dataset.frames = String(this.frames);
        this.info.textContent = `Frame ${meta.seq} · ${meta.imageSize.width}×${meta.imageSize.height} · from ${meta.source}`;
      } catch { /* a broken image: wait for the next */ }
    };
    ws.onclose = () => {
      if (this.disposed) return;
      this.ws = null;
      const delay = backoff(this.attempt++);
      this.info.textContent = `The live view lost its connection — reconnecting in ${(delay / 1000).toFixed(1)} s…`;
      this.say("Live view reconnecting…", "warn");
      setTimeout(async () => {
        if (this.disposed) return;
        await this.tab.refresh();
        if (!this.disposed && this.tab.rig && this.tab.rig.phase !== "closed") this.open();
      }, delay);
    };
  }

  resize(d) {
    if (d.width === this.display.width && d.height === this.display.height) return;
    this.display = d;
    this.canvas.width = d.width;
    this.canvas.height = d.height;
  }

  send(msg) {
    if (this.control && this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg));
  }

  /** A pointer event's position in guest pixels. */
  point(ev) {
    const r = this.canvas.getBoundingClientRect();
    const x = Math.floor(((ev.clientX - r.left) * this.display.width) / r.width);
    const y = Math.floor(((ev.clientY - r.top) * this.display.height) / r.height);
    return { x: Math.min(this.display.width - 1, Math.max(0, x)), y: Math.min(this.display.height - 1, Math.max(0, y)) };
  }

  releaseAll() {
    for (const key of this.held) this.send({ type: "key", key, down: false });
    this.held.clear();
  }

  bind() {
    const c = this.canvas;
    const buttons = ["left", "middle", "right"];
    c.addEventListener("mousemove", (ev) => {
      if (!this.control) return;
      const first = this.pendingMove === null;
      this.pendingMove = this.point(ev);
      if (first) requestAnimationFrame(() => {
        const p = this.pendingMove;
        this.pendingMove = null;
        if (p) this.send({ type: "move", ...p });
      });
    });
    c.addEventListener("mousedown", (ev) => {
      this.focus();
      if (!this.control || !buttons[ev.button]) return;
      ev.preventDefault();
      this.pendingMove = null;
      this.send({ type: "button", button: buttons[ev.button], down: true, ...this.point(ev) });
    });
    c.addEventListener("mouseup", (ev) => {
      if (!this.control || !buttons[ev.button]) return;
      ev.preventDefault();
      this.send({ type: "button", button: buttons[ev.button], down: false, ...this.point(ev) });
    });
    c.addEventListener("contextmenu", (ev) => { if (this.control) ev.preventDefault(); });
    c.addEventListener("wheel", (ev) => {
      if (!this.control) return;
      ev.preventDefault();
      const vertical = Math.abs(ev.deltaY) >= Math.abs(ev.deltaX);
      const delta = vertical ? ev.deltaY : ev.deltaX;
      if (!delta) return;
      const direction = vertical ? (delta > 0 ? "down" : "up") : (delta > 0 ? "right" : "left");
      const amount = Math.min(5, Math.max(1, Math.round(Math.abs(delta) / (ev.deltaMode ? 1 : 100))));
      this.send({ type: "wheel", direction, amount });
    }, { passive: false });
    const t = this.input;
    c.addEventListener("focus", () => this.focus());
    c.addEventListener("keydown", (ev) => this.key(ev, true));
    c.addEventListener("keyup", (ev) => this.key(ev, false));
    t.addEventListener("keydown", (ev) => this.key(ev, true));
    t.addEventListener("keyup", (ev) => this.key(ev, false));
    t.addEventListener("blur", () => this.releaseAll());
    t.addEventListener("paste", (ev) => this.paste(ev));
    t.addEventListener("beforeinput", (ev) => {
      if (ev.inputType === "insertCompositionText") { this.imeOpen = true; return; }
      if (ev.inputType === "insertText" || ev.inputType === "insertReplacementText") {
        ev.preventDefault();
        this.typeText(ev.data || (ev.dataTransfer ? ev.dataTransfer.getData("text/plain") : ""));
      }
    });
    t.addEventListener("compositionend", (ev) => this.typeText(ev.data));
    t.addEventListener("input", () => { if (!this.imeOpen) t.value = ""; });
    c.addEventListener("dragover", (ev) => { ev.preventDefault(); c.classList.add("dropping"); });
    c.addEventListener("dragleave", () => c.classList.remove("dropping"));
    c.addEventListener("drop", (ev) => {
      ev.preventDefault();
      c.classList.remove("dropping");
      const files = [...(ev.dataTransfer ? ev.dataTransfer.files : [])];
      if (files.length) this.tab.sendFiles(files, this.point(ev));
    });
  }

  /** Text with no key of its own (a layout's, a dead key's, an IME's): typed as text. */
  typeText(text) {
    this.imeOpen = false;
    this.input.value = "";
    if (!text || !this.control) return;
    for (let i = 0; i < text.length; i += 4000) this.send({ type: "text", text: text.slice(i, i + 4000) });
  }

  key(ev, down) {
    if (!this.control) return;
    // A key that only composes (a dead key, an IME at work): its text comes at the end.
    if (ev.isComposing || ev.keyCode === 229 || ev.key === "Dead" || ev.key === "Process") return;
    // ctrl/cmd+v: let the browser's paste event carry this computer's
    // clipboard to the rig first (paste() then presses v).
    if ((ev.ctrlKey || ev.metaKey) && ev.code === "KeyV") return;
    // ctrl+]: the way out of the canvas for a keyboard (every other key goes to the rig).
    if (ev.ctrlKey && ev.code === "BracketRight") {
      ev.preventDefault();
      if (down) { this.releaseAll(); const out = document.getElementById("hand-back"); if (out) out.focus(); else this.input.blur(); }
      return;
    }
    ev.preventDefault();
    // A printable character without ctrl/alt/meta goes as text: the rig types
    // that character (shifted or on a spare key as needed), whatever this
    // computer's layout. Everything else is a physical key, so shortcuts,
    // arrows and held modifiers arrive as keys.
    const printable = ev.key && [...ev.key].length === 1 && !ev.ctrlKey && !ev.altKey && !ev.metaKey;
    if (printable || this.texted.has(ev.code)) {
      if (down && printable) { this.texted.add(ev.code); this.send({ type: "text", text: ev.key }); }
      if (!down) this.texted.delete(ev.code);
      return;
    }
    const keysym = keysymOf(ev.code);
    if (!keysym || ev.code === "CapsLock") return;
    if (down) this.held.add(keysym); else this.held.delete(keysym);
    this.send({ type: "key", key: keysym, down });
  }

  async paste(ev) {
    if (!this.control) return;
    ev.preventDefault();
    const data = ev.clipboardData;
    const image = data && [...data.files].find((f) => f.type === "image/png" || f.type === "image/jpeg");
    const text = data ? data.getData("text/plain") : "";
    if (this.tab.rig.surface === "browser") {
      // A headless browser has no system clipboard to fill: the text is typed at the caret.
      if (!text) { this.say("Only text pastes into a browser rig.", "error"); return; }
      for (let i = 0; i < text.length; i += 4000) this.send({ type: "text", text: text.slice(i, i + 4000) });
      return;
    }
    try {
      if (image) await this.tab.pasteData(image, image.type);
      else if (text) await this.tab.pasteData(text, "text/plain; charset=utf-8");
      else return;
    } catch (e) {
      this.say(`Paste refused: ${e.describe ? e.describe() : e}`, "error");
      return;
    }
    this.send({ type: "key", key: "v", down: true });
    this.send({ type: "key", key: "v", down: false });
  }
}
