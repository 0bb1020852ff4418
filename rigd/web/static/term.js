// term.js — a compact VT100/xterm-subset terminal emulator for rigd's page.
//
// How this works. Output from the guest goes through a streaming TextDecoder
// and then a byte-at-a-time (code point at a time) state machine in the
// shape of Paul Williams' DEC parser: GROUND prints, ESC/CSI collect a
// bounded parameter list and dispatch on the final byte, OSC/DCS/APC/PM/SOS
// strings are collected up to a cap and then dropped. Everything the guest
// sends is hostile: counts are clamped to the screen, parameters are capped
// in number and value, strings are capped in length, and nothing the guest
// sends ever reaches innerHTML (text goes in through text nodes, styles are
// built from numbers we parsed). The screen is an array of Line objects
// (a char and an attribute per cell); mutations mark rows dirty and a
// repaint of only those rows happens at most once per animation frame. The
// normal screen keeps ~1000 lines of scrollback; the alternate screen none.
//
// Styling is done through the CSSOM (element.style), never a <style> element,
// so the page can run under a strict Content-Security-Policy. Colours can be
// themed with CSS variables on any ancestor: --rigd-term-fg, --rigd-term-bg,
// --rigd-term-font.
//
// Known limits (one cell per character, no mouse reporting, no reflow, an
// IME window at the corner...): docs/decisions.md, "In-page terminal".

const SCROLLBACK = 1000;
const MAX_PARAMS = 32;
const MAX_PARAM_VALUE = 65535;
const MAX_STRING = 4096; // OSC/DCS payload kept; the rest is dropped
const MAX_REPLY = 65536; // bytes of DSR/DA replies per write()
const MAX_CELL = 8; // UTF-16 units per cell (a base char plus combining marks)
const MAX_COLS = 1000;
const MAX_ROWS = 500;

const FG_DEFAULT = 'var(--rigd-term-fg, #d8d8d8)';
const BG_DEFAULT = 'var(--rigd-term-bg, #111111)';

// Attribute flags.
const BOLD = 1, DIM = 2, ITALIC = 4, UNDERLINE = 8, INVERSE = 16, HIDDEN = 32, STRIKE = 64, BLINK = 128;

const SGR_ON = { 1: BOLD, 2: DIM, 3: ITALIC, 4: UNDERLINE, 5: BLINK, 6: BLINK, 7: INVERSE, 8: HIDDEN, 9: STRIKE, 21: UNDERLINE };
const SGR_OFF = { 22: BOLD | DIM, 23: ITALIC, 24: UNDERLINE, 25: BLINK, 27: INVERSE, 28: HIDDEN, 29: STRIKE };

// The xterm 256-colour palette: 16 system colours, a 6x6x6 cube, 24 greys.
const PALETTE = (() => {
  const p = ['#000000', '#cd0000', '#00cd00', '#cdcd00', '#0000ee', '#cd00cd', '#00cdcd', '#e5e5e5',
    '#7f7f7f', '#ff0000', '#00ff00', '#ffff00', '#5c5cff', '#ff00ff', '#00ffff', '#ffffff'];
  const hex = (n) => n.toString(16).padStart(2, '0');
  const level = [0, 95, 135, 175, 215, 255];
  for (let i = 0; i < 216; i++) {
    p.push('#' + hex(level[Math.floor(i / 36)]) + hex(level[Math.floor(i / 6) % 6]) + hex(level[i % 6]));
  }
  for (let i = 0; i < 24; i++) p.push('#' + hex(8 + i * 10).repeat(3));
  return p;
})();

// A colour is -1 (default), 0..255 (palette) or TRUE|0xRRGGBB.
const TRUE = 0x1000000;
function cssColor(c) {
  if (c < 0) return null;
  if (c < 256) return PALETTE[c];
  return '#' + (c & 0xffffff).toString(16).padStart(6, '0');
}

// Cell attributes are immutable and interned, so runs of equal cells can be
// found by identity. The intern table is capped: a guest cycling through
// millions of truecolours only costs us a table that is cleared now and then.
class Attr {
  constructor(fg, bg, flags) {
    this.fg = fg;
    this.bg = bg;
    this.flags = flags;
    this.key = fg + ',' + bg + ',' + flags;
    this.css = Attr.css(fg, bg, flags, false, true);
  }

  static css(fg, bg, flags, cursor, focused) {
    let inv = (flags & INVERSE) !== 0;
    if (cursor && focused) inv = !inv;
    let color = cssColor(fg), back = cssColor(bg);
    if (inv) {
      [color, back] = [back || BG_DEFAULT, color || FG_DEFAULT];
    }
    let s = '';
    if (flags & HIDDEN) s += 'color:transparent;';
    else if (color) s += 'color:' + color + ';';
    if (back) s += 'background:' + back + ';';
    if (flags & BOLD) s += 'font-weight:bold;';
    if (flags & DIM) s += 'opacity:0.6;';
    if (flags & ITALIC) s += 'font-style:italic;';
    if (flags & (UNDERLINE | STRIKE)) {
      s += 'text-decoration:' + (flags & UNDERLINE ? 'underline ' : '') + (flags & STRIKE ? 'line-through' : '') + ';';
    }
    if (cursor && !focused) s += 'outline:1px solid ' + FG_DEFAULT + ';outline-offset:-1px;';
    return s;
  }
}
const interned = new Map();
function attr(fg, bg, flags) {
  const key = fg + ',' + bg + ',' + flags;
  let a = interned.get(key);
  if (!a) {
    if (interned.size > 4096) interned.clear();
    a = new Attr(fg, bg, flags);
    interned.set(key, a);
  }
  return a;
}
const DEFAULT_ATTR = attr(-1, -1, 0);

class Line {
  constructor(cols, a = DEFAULT_ATTR) {
    this.ch = new Array(cols).fill(' ');
    this.at = new Array(cols).fill(a);
  }

  fill(from, to, a) {
    for (let x = from; x < to; x++) {
      this.ch[x] = ' ';
      this.at[x] = a;
    }
  }

  resize(cols) {
    const n = this.ch.length;
    if (cols < n) {
      this.ch.length = cols;
      this.at.length = cols;
    } else {
      for (let x = n; x < cols; x++) {
        this.ch.push(' ');
        this.at.push(DEFAULT_ATTR);
      }
    }
  }

  isBlank() {
    for (let x = 0; x < this.ch.length; x++) {
      if (this.ch[x] !== ' ' || this.at[x].bg !== -1) return false;
    }
    return true;
  }

  text() {
    return this.ch.join('').replace(/ +$/, '');
  }
}

// One screen: its lines, its scrollback (normal screen only) and the cursor
// saved by DECSC on it.
class Screen {
  constructor(cols, rows, scrollback) {
    this.lines = Array.from({ length: rows }, () => new Line(cols));
    this.sb = scrollback ? [] : null;
    this.saved = null;
  }

  pushScrollback(line) {
    if (!this.sb) return;
    this.sb.push(line);
    // Trim in batches: Array#splice is O(n), so do it once per 64 lines.
    if (this.sb.length > SCROLLBACK + 64) this.sb.splice(0, this.sb.length - SCROLLBACK);
  }

  // Resize in place; returns the cursor row moved along with the content.
  resize(cols, rows, cy) {
    for (const l of this.lines) l.resize(cols);
    if (rows < this.lines.length) {
      // Drop blank rows below the cursor first, then push rows off the top.
      while (this.lines.length > rows && this.lines.length - 1 > cy && this.lines[this.lines.length - 1].isBlank()) {
        this.lines.pop();
      }
      while (this.lines.length > rows) {
        this.pushScrollback(this.lines.shift());
        cy--;
      }
    } else {
      while (this.lines.length < rows) {
        if (this.sb && this.sb.length) {
          const l = this.sb.pop();
          l.resize(cols);
          this.lines.unshift(l);
          cy++;
        } else {
          this.lines.push(new Line(cols));
        }
      }
    }
    return Math.max(0, cy);
  }
}

// DEC special graphics (ESC ( 0): the line-drawing set for 0x60..0x7e.
const DEC_GRAPHICS = '◆▒␉␌␍␊°±␤␋┘┐┌└┼⎺⎻─⎼⎽├┤┴┬│≤≥π≠£·';

// Parser states.
const GROUND = 0, ESC = 1, ESC_INT = 2, CSI = 3, CSI_IGNORE = 4, STR = 5, STR_ESC = 6;

// Zero-width code points that join the previous cell (combining marks,
// variation selectors, ZWJ/ZWNJ). A simple range check, not full Unicode.
function isZeroWidth(c) {
  return (c >= 0x300 && c <= 0x36f) || (c >= 0x1ab0 && c <= 0x1aff) || (c >= 0x1dc0 && c <= 0x1dff) ||
    (c >= 0x200b && c <= 0x200f) || (c >= 0x20d0 && c <= 0x20ff) || (c >= 0xfe00 && c <= 0xfe0f) ||
    (c >= 0xfe20 && c <= 0xfe2f) || (c >= 0xe0100 && c <= 0xe01ef);
}

export class Terminal {
  /**
   * @param {HTMLElement} container  the terminal fills it (width/height 100%)
   * @param {{cols?: number, rows?: number, fontSize?: number}} [options]
   */
  constructor(container, { cols = 80, rows = 24, fontSize = 14 } = {}) {
    this._container = container;
    this._cols = clamp(cols | 0, 2, MAX_COLS);
    this._rows = clamp(rows | 0, 1, MAX_ROWS);
    this._fontSize = fontSize;
    this._lineHeight = Math.ceil(fontSize * 1.2);
    this._decoder = new TextDecoder('utf-8');
    this._dataCbs = [];
    this._resizeCbs = [];
    this._titleCbs = [];
    this._raf = 0;
    this._disposed = false;
    this._cellWidth = 0;
    this._reset();
    this._buildDom();
  }

  // ---- public API --------------------------------------------------------

  get cols() { return this._cols; }
  get rows() { return this._rows; }
  /** The element that takes focus and keys (role=textbox). */
  get element() { return this._root; }

  /** Feed guest output: bytes (UTF-8, may split sequences) or a string. */
  write(data) {
    if (this._disposed) return;
    const s = typeof data === 'string' ? data
      : this._decoder.decode(data instanceof ArrayBuffer ? new Uint8Array(data) : data, { stream: true });
    if (!s) return;
    this._replies = '';
    this._title = null;
    this._parse(s);
    if (this._viewOffset) {
      this._viewOffset = 0;
      this._dirtyAll = true;
    }
    this._schedule();
    const r = this._replies, title = this._title;
    this._replies = '';
    this._title = null;
    if (title !== null) for (const cb of this._titleCbs.slice()) cb(title);
    if (r) this._emit(r);
  }

  /** Listen to what the user types (already encoded for the pty). Returns an unsubscribe function. */
  onData(cb) { return subscribe(this._dataCbs, cb); }
  /** Listen to size changes (from fit() or resize()). Returns an unsubscribe function. */
  onResize(cb) { return subscribe(this._resizeCbs, cb); }
  /** Listen to window title changes (OSC 0/2; control characters removed). Returns an unsubscribe function. */
  onTitle(cb) { return subscribe(this._titleCbs, cb); }

  /** Size the grid to the container; returns {cols, rows}. */
  fit() {
    const w = this._container.clientWidth, h = this._container.clientHeight;
    const cw = this._measure();
    if (w > 0 && h > 0 && cw > 0) {
      this.resize(Math.floor(w / cw), Math.floor(h / this._lineHeight));
    }
    return { cols: this._cols, rows: this._rows };
  }

  resize(cols, rows) {
    cols = clamp(cols | 0, 2, MAX_COLS);
    rows = clamp(rows | 0, 1, MAX_ROWS);
    if (cols === this._cols && rows === this._rows) return;
    const active = this._scr;
    for (const s of [this._normal, this._alt]) {
      if (s === active) this._y = s.resize(cols, rows, this._y);
      else if (s.saved) s.saved.y = s.resize(cols, rows, s.saved.y);
      else s.resize(cols, rows, 0);
    }
    this._cols = cols;
    this._rows = rows;
    this._x = Math.min(this._x, cols - 1);
    this._y = Math.min(this._y, rows - 1);
    this._wrapPending = false;
    this._top = 0;
    this._bottom = rows - 1;
    this._tabs = defaultTabs(cols);
    this._viewOffset = 0;
    this._buildRows();
    for (const cb of this._resizeCbs.slice()) cb(cols, rows);
  }

  focus() { this._root.focus(); } // (which hands the focus to the input)

  /** The screen's text (not the scrollback), rows joined by "\n", trailing spaces trimmed. */
  text() {
    return this._scr.lines.map((l) => l.text()).join('\n');
  }

  dispose() {
    if (this._disposed) return;
    this._disposed = true;
    if (this._raf) cancelAnimationFrame(this._raf);
    this._root.remove();
    this._dataCbs.length = this._resizeCbs.length = this._titleCbs.length = 0;
  }

  // ---- state -------------------------------------------------------------

  _reset() {
    this._normal = new Screen(this._cols, this._rows, true);
    this._alt = new Screen(this._cols, this._rows, false);
    this._scr = this._normal;
    this._x = 0;
    this._y = 0;
    this._wrapPending = false;
    this._attr = DEFAULT_ATTR;
    this._top = 0;
    this._bottom = this._rows - 1;
    this._tabs = defaultTabs(this._cols);
    this._charsets = ['B', 'B'];
    this._gl = 0;
    this._lastChar = ' ';
    this._softModes();
    this._bracketedPaste = false;
    this._viewOffset = 0;
    this._state = GROUND;
    this._params = [];
    this._sub = [];
    this._param = -1;
    this._prefix = '';
    this._inter = '';
    this._str = '';
    this._strKind = '';
    this._strOverflow = false;
    this._replies = '';
    this._dirty = new Uint8Array(this._rows);
    this._dirtyAll = true;
  }

  _softModes() {
    this._appCursor = false;
    this._autowrap = true;
    this._cursorVisible = true;
    this._origin = false;
    this._insert = false;
  }

  _blank() {
    // Erasing uses the current background (xterm's BCE), nothing else.
    return this._attr.bg === -1 ? DEFAULT_ATTR : attr(-1, this._attr.bg, 0);
  }

  _touch(y) {
    this._dirty[y] = 1;
  }

  _touchRange(from, to) {
    for (let y = from; y <= to; y++) this._dirty[y] = 1;
  }

  // ---- the parser --------------------------------------------------------

  _parse(s) {
    const n = s.length;
    for (let i = 0; i < n; i++) {
      let c = s.charCodeAt(i);
      if (c >= 0xd800 && c <= 0xdbff && i + 1 < n) {
        const d = s.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) {
          c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
          i++;
        }
      }
      this._feed(c);
    }
  }

  _feed(c) {
    switch (this._state) {
      case GROUND:
        if (c >= 0x20 && c !== 0x7f && (c < 0x80 || c > 0x9f)) this._print(c);
        else this._control(c);
        return;
      case ESC:
        if (c < 0x20) return this._control(c);
        if (c >= 0x20 && c <= 0x2f) {
          this._inter = String.fromCharCode(c);
          this._state = ESC_INT;
          return;
        }
        this._state = GROUND;
        return this._escDispatch(c);
      case ESC_INT:
        if (c < 0x20) return this._control(c);
        if (c >= 0x20 && c <= 0x2f) return; // further intermediates: ignored
        this._state = GROUND;
        return this._escIntDispatch(this._inter, c);
      case CSI:
        return this._csiByte(c);
      case CSI_IGNORE:
        if (c < 0x20) return this._control(c);
        if (c >= 0x40 && c <= 0x7e) this._state = GROUND;
        return;
      case STR:
        if (c === 0x07 && this._strKind === ']') return this._strEnd();
        if (c === 0x1b) { this._state = STR_ESC; return; }
        if (c === 0x18 || c === 0x1a) { this._state = GROUND; return; }
        if (c === 0x9c) return this._strEnd();
        if (c < 0x20) return;
        if (this._str.length < MAX_STRING) this._str += String.fromCodePoint(c);
        else this._strOverflow = true;
        return;
      case STR_ESC:
        // ESC \ is ST; any other ESC ends the string and starts an escape.
        this._strEnd();
        if (c !== 0x5c) {
          this._state = ESC;
          this._feed(c);
        }
        return;
    }
  }

  _control(c) {
    switch (c) {
      case 0x08: // BS
        this._wrapPending = false;
        if (this._x > 0) this._x--;
        return;
      case 0x09: // HT
        this._tab(1);
        return;
      case 0x0a: case 0x0b: case 0x0c: // LF, VT, FF
        this._index();
        return;
      case 0x0d: // CR
        this._x = 0;
        this._wrapPending = false;
        return;
      case 0x0e: this._gl = 1; return; // SO
      case 0x0f: this._gl = 0; return; // SI
      case 0x18: case 0x1a: this._state = GROUND; return; // CAN, SUB
      case 0x1b:
        this._state = ESC;
        return;
      default: // BEL, NUL, C1 and the rest: ignored
    }
  }

  _escDispatch(c) {
    switch (String.fromCharCode(c)) {
      case '[':
        this._state = CSI;
        this._params = [];
        this._sub = [];
        this._param = -1;
        this._prefix = '';
        this._inter = '';
        return;
      case ']': case 'P': case 'X': case '^': case '_':
        this._state = STR;
        this._strKind = String.fromCharCode(c);
        this._str = '';
        this._strOverflow = false;
        return;
      case '7': return this._saveCursor();
      case '8': return this._restoreCursor();
      case 'D': return this._index();
      case 'E':
        this._x = 0;
        return this._index();
      case 'M': return this._reverseIndex();
      case 'H':
        this._tabs[this._x] = 1;
        return;
      case 'c': return this._reset(); // RIS
      default: // ESC = / ESC > (keypad), ESC \ (lone ST) and unknowns: ignored
    }
  }

  _escIntDispatch(inter, c) {
    const f = String.fromCharCode(c);
    if (inter === '(' || inter === ')') this._charsets[inter === '(' ? 0 : 1] = f; // others (ESC # 8...): ignored
  }

  _csiByte(c) {
    if (c >= 0x30 && c <= 0x39) { // digit
      if (this._param < 0) this._param = 0;
      this._param = Math.min(this._param * 10 + (c - 0x30), MAX_PARAM_VALUE);
    } else if (c === 0x3b || c === 0x3a) { // ; or : (sub-parameter)
      this._pushParam();
      this._nextIsSub = c === 0x3a;
    } else if (c >= 0x3c && c <= 0x3f) { // private marker
      if (this._params.length || this._param >= 0 || this._inter) this._state = CSI_IGNORE;
      else this._prefix += String.fromCharCode(c);
    } else if (c >= 0x20 && c <= 0x2f) {
      this._inter += String.fromCharCode(c);
    } else if (c >= 0x40 && c <= 0x7e) {
      this._pushParam();
      this._state = GROUND;
      this._csiDispatch(String.fromCharCode(c));
    } else if (c < 0x20) {
      this._control(c); // C0 controls execute inside a CSI (ESC restarts)
    } else {
      this._state = CSI_IGNORE;
    }
  }

  _pushParam() {
    if (this._params.length < MAX_PARAMS) {
      this._params.push(this._param);
      this._sub.push(this._nextIsSub === true);
    }
    this._param = -1;
    this._nextIsSub = false;
  }

  // The i-th parameter, with `def` for missing or zero (counts and positions).
  _p(i, def = 1) {
    const v = this._params[i];
    return v > 0 ? v : def;
  }

  _csiDispatch(f) {
    const p = this._params, pre = this._prefix, inter = this._inter;
    const rows = this._rows, cols = this._cols;
    if (pre === '?') {
      if (f === 'h' || f === 'l') for (const m of p) this._decMode(m, f === 'h');
      return; // DECRQM and other private queries: ignored
    }
    if (inter) {
      if (inter === '!' && f === 'p') this._softReset();
      return; // DECSCUSR (CSI SP q) and others: ignored
    }
    if (pre) return; // DA2/DA3, XTVERSION, kitty keyboard queries...: no answer
    if ('ABCDEFGHIZJKLMPXadef`@'.includes(f)) this._wrapPending = false; // SGR, DSR... keep it
    const y = this._y, n = this._p(0);
    switch (f) {
      case 'A': this._y = Math.max(y - n, y >= this._top ? this._top : 0); break;
      case 'B': case 'e': this._y = Math.min(y + n, y <= this._bottom ? this._bottom : rows - 1); break;
      case 'C': case 'a': this._x = Math.min(this._x + n, cols - 1); break;
      case 'D': this._x = Math.max(this._x - n, 0); break;
      case 'E': this._x = 0; this._y = Math.min(y + n, y <= this._bottom ? this._bottom : rows - 1); break;
      case 'F': this._x = 0; this._y = Math.max(y - n, y >= this._top ? this._top : 0); break;
      case 'G': case '`': this._x = Math.min(n, cols) - 1; break;
      case 'H': case 'f': this._moveTo(this._p(0) - 1, this._p(1) - 1); break;
      case 'd': this._moveTo(this._p(0) - 1, this._x); break;
      case 'I': this._tab(Math.min(n, cols)); break;
      case 'Z': this._tab(Math.min(n, cols), -1); break;
      case 'J': this._eraseDisplay(p[0] > 0 ? p[0] : 0); break;
      case 'K': this._eraseLine(p[0] > 0 ? p[0] : 0); break;
      case '@': this._insertChars(Math.min(n, cols)); break;
      case 'P': this._deleteChars(Math.min(n, cols)); break;
      case 'X': {
        this._scr.lines[y].fill(this._x, this._x + Math.min(n, cols - this._x), this._blank());
        this._touch(y);
        break;
      }
      case 'L': case 'M': this._insertDeleteLines(Math.min(n, rows), f === 'L'); break;
      case 'S': this._scrollUp(Math.min(n, rows)); break;
      case 'T': if (p.length <= 1) this._scrollUp(Math.min(n, rows), true); break;
      case 'b': { // REP: repeat the last printed character
        const ch = this._lastChar;
        for (let i = Math.min(n, cols * rows); i > 0; i--) this._putChar(ch);
        break;
      }
      case 'g':
        if (!(p[0] > 0)) this._tabs[this._x] = 0;
        else if (p[0] === 3) this._tabs.fill(0);
        break;
      case 'm': this._sgr(); break;
      case 'r': {
        const top = this._p(0) - 1, bottom = Math.min(this._p(1, rows), rows) - 1;
        if (top < bottom) {
          this._top = top;
          this._bottom = bottom;
          this._moveTo(0, 0);
        }
        break;
      }
      case 's': this._saveCursor(); break;
      case 'u': this._restoreCursor(); break;
      case 'h': case 'l':
        for (const m of p) if (m === 4) this._insert = f === 'h';
        break;
      case 'n':
        if (p[0] === 5) this._reply('\x1b[0n');
        else if (p[0] === 6) {
          const row = this._origin ? this._y - this._top + 1 : this._y + 1;
          this._reply('\x1b[' + row + ';' + (this._x + 1) + 'R');
        }
        break;
      case 'c':
        if (!(p[0] > 0)) this._reply('\x1b[?1;2c'); // VT100 with advanced video
        break;
      default: // CSI t (window ops), unknown finals: ignored
    }
  }

  _decMode(m, on) {
    switch (m) {
      case 1: this._appCursor = on; break;
      case 6:
        this._origin = on;
        this._moveTo(0, 0);
        break;
      case 7:
        this._autowrap = on;
        if (!on) this._wrapPending = false;
        break;
      case 25:
        this._cursorVisible = on;
        break;
      case 47: case 1047:
        if (on) this._enterAlt(false);
        else this._leaveAlt(m === 1047);
        break;
      case 1048:
        if (on) this._saveCursor();
        else this._restoreCursor();
        break;
      case 1049:
        if (on) {
          if (this._scr === this._alt) break;
          this._saveCursor();
          this._enterAlt(true);
        } else if (this._scr === this._alt) {
          this._leaveAlt(true);
          this._restoreCursor();
        }
        break;
      case 2004: this._bracketedPaste = on; break;
      default: // mouse modes, focus events, blinking cursor...: ignored
    }
  }

  _enterAlt(clear) {
    if (this._scr === this._alt) return;
    this._scr = this._alt;
    if (clear) for (const l of this._alt.lines) l.fill(0, l.ch.length, DEFAULT_ATTR);
    this._viewOffset = 0;
    this._dirtyAll = true;
  }

  _leaveAlt(clear) {
    if (this._scr !== this._alt) return;
    if (clear) for (const l of this._alt.lines) l.fill(0, l.ch.length, DEFAULT_ATTR);
    this._scr = this._normal;
    this._dirtyAll = true;
  }

  _sgr() {
    const p = this._params, sub = this._sub;
    let { fg, bg, flags } = this._attr;
    if (p.length === 0) p.push(-1);
    for (let i = 0; i < p.length; i++) {
      const v = p[i] < 0 ? 0 : p[i];
      // Colon sub-parameters after this one form a group (38:2::r:g:b).
      let j = i + 1;
      while (j < p.length && sub[j]) j++;
      const group = p.slice(i, j);
      if (v === 38 || v === 48 || v === 58) {
        let color = null;
        if (group.length > 1) { // colon form
          if (group[1] === 5 && group.length >= 3) color = group[2] & 255;
          else if (group[1] === 2 && group.length >= 5) {
            const [r, g, b] = group.slice(-3);
            color = rgb(r, g, b);
          }
          i = j - 1;
        } else if (p[i + 1] === 5) { // semicolon form
          color = p[i + 2] >= 0 ? p[i + 2] & 255 : null;
          i += 2;
        } else if (p[i + 1] === 2) {
          color = rgb(p[i + 2], p[i + 3], p[i + 4]);
          i += 4;
        }
        if (color !== null && v === 38) fg = color;
        if (color !== null && v === 48) bg = color;
        continue; // 58 (underline colour) is parsed and dropped
      }
      i = j - 1;
      if (v === 0) { fg = -1; bg = -1; flags = 0; }
      else if (v === 4 && group[1] === 0) flags &= ~UNDERLINE; // 4:0 is "no underline"
      else if (SGR_ON[v]) flags |= SGR_ON[v];
      else if (SGR_OFF[v]) flags &= ~SGR_OFF[v];
      else if (v >= 30 && v <= 37) fg = v - 30;
      else if (v === 39) fg = -1;
      else if (v >= 40 && v <= 47) bg = v - 40;
      else if (v === 49) bg = -1;
      else if (v >= 90 && v <= 97) fg = v - 90 + 8;
      else if (v >= 100 && v <= 107) bg = v - 100 + 8;
    }
    this._attr = attr(fg, bg, flags);
  }

  _strEnd() {
    this._state = GROUND;
    if (this._strKind !== ']' || this._strOverflow) return;
    const m = /^(\d+);(.*)$/s.exec(this._str);
    if (m && (m[1] === '0' || m[1] === '2')) {
      // eslint-disable-next-line no-control-regex
      const title = m[2].replace(/[\x00-\x1f\x7f-\x9f]/g, '');
      this._title = title; // announced after the write, like replies
    }
    this._str = '';
  }

  _reply(s) {
    if (this._replies.length + s.length <= MAX_REPLY) this._replies += s;
  }

  // ---- screen operations -------------------------------------------------

  _print(c) {
    if (isZeroWidth(c)) {
      // Join the previous cell (the one just written).
      const x = this._wrapPending ? this._x : this._x - 1;
      if (x >= 0) {
        const line = this._scr.lines[this._y];
        if (line.ch[x].length < MAX_CELL) line.ch[x] += String.fromCodePoint(c);
        this._touch(this._y);
      }
      return;
    }
    let ch;
    if (c >= 0x60 && c <= 0x7e && this._charsets[this._gl] === '0') ch = DEC_GRAPHICS[c - 0x60];
    else ch = String.fromCodePoint(c);
    this._lastChar = ch;
    this._putChar(ch);
  }

  _putChar(ch) {
    if (this._wrapPending) {
      this._wrapPending = false;
      this._x = 0;
      this._index();
    }
    if (this._insert) this._insertChars(1);
    const line = this._scr.lines[this._y];
    line.ch[this._x] = ch;
    line.at[this._x] = this._attr;
    this._touch(this._y);
    if (this._x === this._cols - 1) this._wrapPending = this._autowrap;
    else this._x++;
  }

  _moveTo(row, col) {
    this._wrapPending = false;
    if (this._origin) {
      this._y = clamp(row + this._top, this._top, this._bottom);
    } else {
      this._y = clamp(row, 0, this._rows - 1);
    }
    this._x = clamp(col, 0, this._cols - 1);
  }

  // Move n tab stops forward (dir 1) or back (dir -1), stopping at the edges.
  _tab(n, dir = 1) {
    this._wrapPending = false;
    const end = dir > 0 ? this._cols - 1 : 0;
    let x = this._x;
    for (let i = 0; i < n && x !== end; i++) {
      x += dir;
      while (x !== end && !this._tabs[x]) x += dir;
    }
    this._x = x;
  }

  _index() {
    if (this._y === this._bottom) this._scrollUp(1);
    else if (this._y < this._rows - 1) this._y++;
  }

  _reverseIndex() {
    this._wrapPending = false;
    if (this._y === this._top) this._scrollUp(1, true);
    else if (this._y > 0) this._y--;
  }

  // Scroll the region up (lines leave at the top: to the scrollback if the
  // region starts at row 1) or down (lines leave at the bottom).
  _scrollUp(n, down = false) {
    const top = this._top, bottom = this._bottom, lines = this._scr.lines, blank = this._blank();
    n = Math.min(n, bottom - top + 1);
    for (let i = 0; i < n; i++) {
      if (down) {
        lines.splice(bottom, 1);
        lines.splice(top, 0, new Line(this._cols, blank));
      } else {
        const [gone] = lines.splice(top, 1);
        if (top === 0) this._scr.pushScrollback(gone);
        lines.splice(bottom, 0, new Line(this._cols, blank));
      }
    }
    this._touchRange(top, bottom);
  }

  // IL/DL: scroll the part of the region below the cursor (never into the scrollback).
  _insertDeleteLines(n, insert) {
    if (this._y < this._top || this._y > this._bottom) return;
    const top = this._top, sb = this._scr.sb;
    this._top = this._y;
    this._scr.sb = null;
    this._scrollUp(n, insert);
    this._scr.sb = sb;
    this._top = top;
    this._x = 0;
  }

  _insertChars(n) {
    const line = this._scr.lines[this._y], x = this._x, cols = this._cols;
    n = Math.min(n, cols - x);
    const blank = this._blank();
    line.ch.splice(x, 0, ...new Array(n).fill(' '));
    line.at.splice(x, 0, ...new Array(n).fill(blank));
    line.ch.length = line.at.length = cols;
    this._touch(this._y);
  }

  _deleteChars(n) {
    const line = this._scr.lines[this._y], x = this._x, cols = this._cols;
    n = Math.min(n, cols - x);
    line.ch.splice(x, n);
    line.at.splice(x, n);
    const blank = this._blank();
    for (let i = 0; i < n; i++) {
      line.ch.push(' ');
      line.at.push(blank);
    }
    this._touch(this._y);
  }

  _eraseDisplay(mode) {
    const lines = this._scr.lines, blank = this._blank(), y = this._y, cols = this._cols;
    if (mode === 0) {
      lines[y].fill(this._x, cols, blank);
      for (let r = y + 1; r < this._rows; r++) lines[r].fill(0, cols, blank);
      this._touchRange(y, this._rows - 1);
    } else if (mode === 1) {
      lines[y].fill(0, this._x + 1, blank);
      for (let r = 0; r < y; r++) lines[r].fill(0, cols, blank);
      this._touchRange(0, y);
    } else if (mode === 2) {
      for (const l of lines) l.fill(0, cols, blank);
      this._dirtyAll = true;
    } else if (mode === 3 && this._scr.sb) {
      this._scr.sb.length = 0;
      this._viewOffset = 0;
      this._dirtyAll = true;
    }
  }

  _eraseLine(mode) {
    const line = this._scr.lines[this._y], blank = this._blank();
    if (mode === 0) line.fill(this._x, this._cols, blank);
    else if (mode === 1) line.fill(0, this._x + 1, blank);
    else if (mode === 2) line.fill(0, this._cols, blank);
    this._touch(this._y);
  }

  _saveCursor() {
    this._scr.saved = {
      x: this._x, y: this._y, attr: this._attr, wrap: this._wrapPending, origin: this._origin,
      charsets: this._charsets.slice(), gl: this._gl,
    };
  }

  _restoreCursor() {
    const s = this._scr.saved;
    if (!s) {
      this._moveTo(0, 0);
      return;
    }
    this._x = Math.min(s.x, this._cols - 1);
    this._y = Math.min(s.y, this._rows - 1);
    this._attr = s.attr;
    this._wrapPending = s.wrap && s.x === this._x;
    this._origin = s.origin;
    this._charsets = s.charsets.slice();
    this._gl = s.gl;
  }

  _softReset() {
    this._softModes();
    this._attr = DEFAULT_ATTR;
    this._top = 0;
    this._bottom = this._rows - 1;
    this._charsets = ['B', 'B'];
    this._gl = 0;
    this._normal.saved = this._alt.saved = null;
  }

  // ---- DOM and rendering -------------------------------------------------

  _buildDom() {
    const root = document.createElement('div');
    root.className = 'rigd-term';
    root.tabIndex = 0;
    root.setAttribute('role', 'textbox');
    root.setAttribute('aria-label', 'Terminal');
    root.setAttribute('aria-multiline', 'true');
    root.setAttribute('aria-roledescription', 'terminal');
    Object.assign(root.style, {
      position: 'relative', overflow: 'hidden', width: '100%', height: '100%', boxSizing: 'border-box',
      whiteSpace: 'pre', fontFamily: 'var(--rigd-term-font, "DejaVu Sans Mono", Menlo, Consolas, monospace)',
      fontSize: this._fontSize + 'px', lineHeight: this._lineHeight + 'px', color: FG_DEFAULT,
      background: BG_DEFAULT, outline: 'none', cursor: 'text',
    });
    const grid = document.createElement('div');
    grid.className = 'rigd-term-grid';
    root.appendChild(grid);
    this._root = root;
    this._grid = grid;
    this._focused = false;
    this._paintedCursor = '';
    this._buildRows();
    // Keys come from a hidden textarea holding the focus: only an editable element gets the
    // text a layout, dead key or IME makes without a US key (beforeinput, compositionend).
    const input = this._input = document.createElement('textarea');
    input.className = 'rigd-term-input';
    input.setAttribute('aria-label', 'Keyboard');
    input.tabIndex = -1;
    Object.assign(input.style, { position: 'absolute', width: '1px', height: '1px', opacity: 0, zIndex: -1 });
    root.appendChild(input);
    root.addEventListener('keydown', (e) => this._onKey(e));
    root.addEventListener('paste', (e) => this._onPaste(e));
    root.addEventListener('copy', (e) => this._onCopy(e));
    root.addEventListener('wheel', (e) => this._onWheel(e), { passive: false });
    root.addEventListener('focus', () => input.focus({ preventScroll: true }));
    root.addEventListener('focusin', () => this._setFocused(true));
    root.addEventListener('focusout', (e) => this._setFocused(root.contains(e.relatedTarget)));
    input.addEventListener('beforeinput', (e) => {
      if (e.inputType === 'insertCompositionText') this._imeOpen = true;
      else if (/^insert(Replacement)?Text$/.test(e.inputType)) {
        e.preventDefault();
        this._onText(e.data || e.dataTransfer?.getData('text/plain'));
      }
    });
    input.addEventListener('compositionend', (e) => this._onText(e.data));
    input.addEventListener('input', () => { if (!this._imeOpen) input.value = ''; });
    this._container.appendChild(root);
  }

  _buildRows() {
    const els = [];
    for (let i = 0; i < this._rows; i++) {
      const row = document.createElement('div');
      row.className = 'rigd-term-row';
      row.style.height = this._lineHeight + 'px';
      row.style.overflow = 'hidden';
      els.push(row);
    }
    this._grid.replaceChildren(...els);
    this._rowEls = els;
    this._dirty = new Uint8Array(this._rows);
    this._dirtyAll = true;
    this._schedule();
  }

  _measure() {
    const probe = document.createElement('span');
    probe.textContent = 'W'.repeat(40);
    probe.style.position = 'absolute';
    probe.style.visibility = 'hidden';
    this._root.appendChild(probe);
    const w = probe.getBoundingClientRect().width / 40;
    probe.remove();
    if (w > 0) this._cellWidth = w;
    return this._cellWidth || this._fontSize * 0.6;
  }

  _setFocused(on) {
    this._focused = on;
    this._root.style.boxShadow = on ? 'inset 0 0 0 1px var(--rigd-term-focus, #4a90d9)' : '';
    this._paintedCursor = ''; // repaint the cursor in its focused/unfocused look
    this._schedule();
  }

  _schedule() {
    if (!this._raf && !this._disposed) this._raf = requestAnimationFrame(() => this._render());
  }

  // The line shown on display row i (the view may be scrolled back).
  _lineAt(i) {
    if (!this._viewOffset) return this._scr.lines[i];
    const sb = this._scr.sb, idx = sb.length - this._viewOffset + i;
    return idx < sb.length ? sb[idx] : this._scr.lines[idx - sb.length];
  }

  _render() {
    this._raf = 0;
    if (this._disposed) return;
    const showCursor = this._cursorVisible && this._viewOffset === 0;
    const cy = showCursor ? this._y : -1;
    const cursorKey = cy + ',' + this._x + ',' + this._focused;
    if (cursorKey !== this._paintedCursor) {
      if (this._paintedCursorY >= 0 && this._paintedCursorY < this._rows) this._dirty[this._paintedCursorY] = 1;
      if (cy >= 0) this._dirty[cy] = 1;
      this._paintedCursor = cursorKey;
      this._paintedCursorY = cy;
    }
    for (let i = 0; i < this._rows; i++) {
      if (this._dirtyAll || this._dirty[i]) this._paintRow(this._rowEls[i], this._lineAt(i), i === cy ? this._x : -1);
    }
    this._dirty.fill(0);
    this._dirtyAll = false;
  }

  // Rebuild one row as runs of equally styled cells: default-styled runs
  // are bare text nodes, others spans; the cursor cell is a span of its own.
  _paintRow(el, line, cx) {
    const n = Math.min(line.ch.length, this._cols), ch = line.ch, at = line.at;
    const parts = [];
    let start = 0;
    for (let x = 1; x <= n; x++) {
      if (x < n && x !== cx && x !== cx + 1 && (at[x] === at[start] || at[x].key === at[start].key)) continue;
      const text = ch.slice(start, x).join('');
      const a = at[start];
      if (start === cx) {
        const span = document.createElement('span');
        span.className = 'rigd-term-cursor';
        span.style.cssText = Attr.css(a.fg, a.bg, a.flags, true, this._focused);
        span.textContent = text;
        parts.push(span);
      } else if (a.css === '') {
        parts.push(document.createTextNode(text));
      } else {
        const span = document.createElement('span');
        span.style.cssText = a.css;
        span.textContent = text;
        parts.push(span);
      }
      start = x;
    }
    el.replaceChildren(...parts);
  }

  // ---- input -------------------------------------------------------------

  _emit(s) {
    for (const cb of this._dataCbs.slice()) cb(s);
  }

  _scrollView(lines) {
    const sb = this._scr.sb;
    if (!sb) return false;
    const v = clamp(this._viewOffset + lines, 0, sb.length);
    if (v === this._viewOffset) return false;
    this._viewOffset = v;
    this._dirtyAll = true;
    this._schedule();
    return true;
  }

  _snapBack() {
    if (this._viewOffset) this._scrollView(-this._viewOffset);
  }

  _onWheel(e) {
    if (!this._scr.sb || e.deltaY === 0) return;
    const px = e.deltaMode === 1 ? e.deltaY * this._lineHeight : e.deltaMode === 2 ? e.deltaY * this._rows * this._lineHeight : e.deltaY;
    const lines = Math.max(1, Math.round(Math.abs(px) / this._lineHeight));
    if (this._scrollView(px < 0 ? lines : -lines)) e.preventDefault();
  }

  _onKey(e) {
    if (e.isComposing || e.keyCode === 229) return;
    if (e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey && this._scr.sb &&
        (e.key === 'PageUp' || e.key === 'PageDown')) {
      this._scrollView(e.key === 'PageUp' ? this._rows - 1 : 1 - this._rows);
      e.preventDefault();
      return;
    }
    const s = this._encodeKey(e);
    if (s === null) return; // not ours: let the browser have it
    e.preventDefault();
    this._snapBack();
    this._emit(s);
  }

  // Text with no key of its own, sent as typed; a composition whole, at its end.
  _onText(text) {
    this._imeOpen = false;
    this._input.value = '';
    if (!text) return;
    this._snapBack();
    this._emit(text.replace(/\r\n?|\n/g, '\r'));
  }

  _encodeKey(e) {
    const key = e.key, ctrl = e.ctrlKey, alt = e.altKey, shift = e.shiftKey;
    if (e.metaKey) return null; // Cmd+C, Cmd+V...: the browser's
    const mod = 1 + (shift ? 1 : 0) + (alt ? 2 : 0) + (ctrl ? 4 : 0);
    const esc = alt ? '\x1b' : '';
    switch (key) {
      case 'Enter': return esc + '\r';
      case 'Backspace': return esc + (ctrl ? '\x08' : '\x7f');
      case 'Tab':
        if (ctrl || alt) return null;
        return shift ? '\x1b[Z' : '\t';
      case 'Escape': return '\x1b';
      case 'ArrowUp': case 'ArrowDown': case 'ArrowRight': case 'ArrowLeft': case 'Home': case 'End': {
        const f = { ArrowUp: 'A', ArrowDown: 'B', ArrowRight: 'C', ArrowLeft: 'D', Home: 'H', End: 'F' }[key];
        if (mod > 1) return '\x1b[1;' + mod + f;
        return (this._appCursor ? '\x1bO' : '\x1b[') + f;
      }
      case 'Insert': case 'Delete': case 'PageUp': case 'PageDown': {
        if (key === 'Insert' && shift && mod === 2) return null; // Shift+Insert: the browser's paste
        const n = { Insert: 2, Delete: 3, PageUp: 5, PageDown: 6 }[key];
        return '\x1b[' + n + (mod > 1 ? ';' + mod : '') + '~';
      }
      default:
    }
    const fn = /^F([1-9]|1[0-2])$/.exec(key);
    if (fn) {
      const k = Number(fn[1]);
      if (k <= 4) return mod > 1 ? '\x1b[1;' + mod + 'PQRS'[k - 1] : '\x1bO' + 'PQRS'[k - 1];
      const n = [15, 17, 18, 19, 20, 21, 23, 24][k - 5];
      return '\x1b[' + n + (mod > 1 ? ';' + mod : '') + '~';
    }
    if ([...key].length !== 1) return null; // Shift, Dead, Process, media keys...
    if (e.getModifierState && e.getModifierState('AltGraph')) return key; // AltGr+key is a character
    if (ctrl) {
      if (shift && /^[a-z]$/i.test(key)) return null; // Ctrl+Shift+C/V/I...: the browser's
      const code = ctrlCode(key, e.code);
      return code === null ? null : esc + code;
    }
    return esc + key;
  }

  _onPaste(e) {
    e.preventDefault();
    let text = e.clipboardData ? e.clipboardData.getData('text/plain') : '';
    if (!text) return;
    text = text.replace(/\r\n?|\n/g, '\r'); // a terminal sends Enter as CR
    if (this._bracketedPaste) {
      // The pasted text must not be able to end the bracket itself.
      text = '\x1b[200~' + text.replace(/\x1b\[20[01]~/g, '') + '\x1b[201~';
    }
    this._snapBack();
    this._emit(text);
  }

  _onCopy(e) {
    const sel = window.getSelection();
    if (!sel || sel.isCollapsed || !e.clipboardData) return;
    e.clipboardData.setData('text/plain', sel.toString().replace(/ +$/gm, ''));
    e.preventDefault();
  }
}

function ctrlCode(key, code) {
  let k = key.toLowerCase();
  if (!/^[a-z]$/.test(k)) {
    const m = /^Key([A-Z])$/.exec(code || ''); // non-Latin layouts
    if (m) k = m[1].toLowerCase();
  }
  if (/^[a-z]$/.test(k)) return String.fromCharCode(k.charCodeAt(0) - 96);
  const map = { ' ': '\x00', '@': '\x00', '[': '\x1b', '\\': '\x1c', ']': '\x1d', '^': '\x1e', '_': '\x1f', '/': '\x1f', '?': '\x7f' };
  return key in map ? map[key] : null;
}

function rgb(r, g, b) {
  if (!(r >= 0 && g >= 0 && b >= 0)) return null;
  return TRUE | ((r & 255) << 16) | ((g & 255) << 8) | (b & 255);
}

function clamp(v, lo, hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

function defaultTabs(cols) {
  const t = new Uint8Array(cols);
  for (let x = 8; x < cols; x += 8) t[x] = 1;
  return t;
}

function subscribe(list, cb) {
  list.push(cb);
  return () => {
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  };
}
