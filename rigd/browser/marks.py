"""The page side of marks (:mod:`rigd.marks`), written once for every engine: two page
functions run through the driver's ``_value`` hook (rigd's world of the page on Chromium and
Firefox, the page's realm on WebKit).

- :data:`FIND_MARKS` ``(generation, limit, nameMax)``: the elements a person could act on
  that are in the viewport and on top at their centre (links, buttons, form controls,
  ARIA widgets, ``onclick``/``tabindex`` elements, editable regions and canvases — a canvas
  is marked so the model knows to use raw coordinates inside it), each
  ``{role, name, box, disabled}``. The elements are kept in the document's global
  (``__rigdMarks``, not enumerable) under the still's generation, for :data:`MARK_TARGET`;
  a navigation replaces the document and with it every mark (stale, as they should be).
- :data:`MARK_TARGET` ``(generation, index)``: the element's centre now (scrolled into view
  if it moved out), whether it is disabled, or why it is gone.

Names never include a field's value (a password field's name is its label), only what a
person reads on the page: ``aria-label``, the label, ``alt``/``title``/``placeholder``, a
button's caption or the element's text.
"""

from __future__ import annotations

import json

from rigd.model import Display

FIND_MARKS = """(generation, limit, nameMax) => {
  const vw = window.innerWidth, vh = window.innerHeight;
  const pick = 'a[href],button,input:not([type=hidden]),select,textarea,summary,canvas,' +
    '[contenteditable=""],[contenteditable=true],[onclick],[tabindex]:not([tabindex="-1"]),' +
    '[role=button],[role=link],[role=checkbox],[role=radio],[role=tab],[role=menuitem],' +
    '[role=option],[role=switch],[role=textbox],[role=combobox],[role=slider],[role=searchbox]';
  const norm = s => (s || '').replace(/\\s+/g, ' ').trim();
  const inputRoles = {checkbox: 'checkbox', radio: 'radio', button: 'button', submit: 'button',
    reset: 'button', image: 'button', file: 'button', color: 'button', range: 'slider',
    search: 'searchbox'};
  const roleOf = el => {
    const given = norm(el.getAttribute('role')).split(' ')[0];
    if (given) return given;
    const tag = el.tagName.toLowerCase();
    if (tag === 'a') return 'link';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'select') return 'combobox';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'canvas') return 'canvas';
    if (tag === 'input') return inputRoles[(el.type || 'text').toLowerCase()] || 'textbox';
    if (el.isContentEditable) return 'textbox';
    return 'generic';
  };
  const nameOf = el => {
    const label = el.getAttribute('aria-label');
    if (norm(label)) return label;
    const by = el.getAttribute('aria-labelledby');
    if (by) {
      const t = by.split(/\\s+/).map(id => { const e = document.getElementById(id);
        return e ? e.textContent : ''; }).join(' ');
      if (norm(t)) return t;
    }
    if (el.labels && el.labels.length && norm(el.labels[0].textContent)) return el.labels[0].textContent;
    for (const a of ['alt', 'title', 'placeholder']) {
      const v = el.getAttribute(a);
      if (norm(v)) return v;
    }
    if (el.tagName === 'INPUT' && ['button', 'submit', 'reset'].includes(el.type)) return el.value;
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') return '';
    return el.innerText || el.textContent || '';
  };
  const disabled = el => el.matches(':disabled') || el.getAttribute('aria-disabled') === 'true';
  const onTop = (el, x, y) => {
    const top = document.elementFromPoint(x, y);
    if (!top) return false;
    if (top === el || el.contains(top)) return true;
    const label = top.closest && top.closest('label');
    return !!(label && label.control === el);
  };
  const els = [], items = [];
  let more = 0;
  for (const el of document.querySelectorAll(pick)) {
    const r = el.getBoundingClientRect();
    const x0 = Math.max(0, r.left), y0 = Math.max(0, r.top);
    const x1 = Math.min(vw, r.right), y1 = Math.min(vh, r.bottom);
    if (x1 - x0 < 1 || y1 - y0 < 1) continue;
    const style = getComputedStyle(el);
    if (style.visibility !== 'visible' || parseFloat(style.opacity) === 0) continue;
    if (!onTop(el, (x0 + x1) / 2, (y0 + y1) / 2)) continue;
    if (items.length >= limit) { more++; continue; }
    els.push(el);
    items.push({role: roleOf(el), name: norm(nameOf(el)).slice(0, nameMax),
                box: [x0, y0, x1 - x0, y1 - y0], disabled: disabled(el)});
  }
  Object.defineProperty(window, '__rigdMarks', {value: {generation, els}, configurable: true,
                                             writable: true, enumerable: false});
  return {items, more};
}"""

MARK_TARGET = """(generation, index) => {
  const kept = window.__rigdMarks;
  if (!kept || kept.generation !== generation) return {stale: 'navigated'};
  const el = kept.els[index];
  if (!el || !el.isConnected) return {stale: 'gone'};
  let r = el.getBoundingClientRect();
  if (r.bottom <= 0 || r.right <= 0 || r.top >= window.innerHeight || r.left >= window.innerWidth) {
    el.scrollIntoView({block: 'nearest', inline: 'nearest'});
    r = el.getBoundingClientRect();
  }
  const x0 = Math.max(0, r.left), y0 = Math.max(0, r.top);
  const x1 = Math.min(window.innerWidth, r.right), y1 = Math.min(window.innerHeight, r.bottom);
  if (x1 - x0 < 1 || y1 - y0 < 1) return {stale: 'hidden'};
  return {x: Math.floor((x0 + x1) / 2), y: Math.floor((y0 + y1) / 2),
          disabled: el.matches(':disabled') || el.getAttribute('aria-disabled') === 'true'};
}"""

#: A saved login into the page's form (issue 30; the driver has checked the page's origin):
#: the first visible, enabled password field, and the user-name field of its form (one marked
#: ``autocomplete=username``/``email``, else the last text-like field before the password).
#: Values are set through the input's own setter with input/change events, as typing would;
#: the answer says what was found, never a value.
LOGIN_FILL = """(account, password) => {
  const usable = el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility === 'visible' && !el.disabled && !el.readOnly; };
  const pw = Array.from(document.querySelectorAll('input[type=password]')).find(usable);
  if (!pw) return {found: false};
  const scope = pw.form || document;
  const texts = Array.from(scope.querySelectorAll('input')).filter(e => usable(e)
    && ['', 'text', 'email', 'tel'].includes((e.getAttribute('type') || '').toLowerCase()));
  const hinted = texts.find(e => /username|email/.test(e.getAttribute('autocomplete') || ''));
  const before = texts.filter(e => e.compareDocumentPosition(pw) & Node.DOCUMENT_POSITION_FOLLOWING);
  const user = hinted || before[before.length - 1] || null;
  const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
  const put = (el, v) => { el.focus(); setter.call(el, v);
    el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true})); };
  if (user) put(user, account);
  put(pw, password);
  return {found: true, username: !!user, form: !!pw.form};
}"""

#: Why a mark's element cannot be acted on, by the page script's word.
STALE = {
    "navigated": "the page navigated (or reloaded) since the still it was drawn on",
    "gone": "its element has left the page",
    "hidden": "its element is no longer rendered (it has no box)",
}


def call(function: str, *args: object) -> str:
    """An expression calling a page function with JSON arguments."""
    return f"({function})({', '.join(json.dumps(a) for a in args)})"


def parse_target(got: object, display: Display) -> tuple[tuple[int, int], bool] | str:
    """:data:`MARK_TARGET`'s answer: (the centre, disabled), or why the mark is stale."""
    if isinstance(got, dict) and isinstance(got.get("stale"), str):
        return STALE.get(got["stale"], "its element cannot be found")
    if not isinstance(got, dict):
        return "the page's answer is not a point"
    x, y = got.get("x"), got.get("y")
    if not (isinstance(x, int) and isinstance(y, int) and not isinstance(x, bool) and not isinstance(y, bool)
            and 0 <= x < display.width and 0 <= y < display.height):
        return "the page's answer is not a point in the viewport"
    return (x, y), got.get("disabled") is True


__all__ = ["FIND_MARKS", "LOGIN_FILL", "MARK_TARGET", "call", "parse_target"]
