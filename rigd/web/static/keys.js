// KeyboardEvent.code (the physical key) → the X11 keysym name the live view
// sends. Physical keys, not characters: the rig's US layout turns them into
// characters, so shortcuts (ctrl+c, alt+tab, shift+arrows) arrive as keys.

const NAMED = {
  Enter: "Return", NumpadEnter: "KP_Enter", Tab: "Tab", Escape: "Escape", Backspace: "BackSpace",
  Delete: "Delete", Insert: "Insert", Home: "Home", End: "End", PageUp: "Prior", PageDown: "Next",
  ArrowUp: "Up", ArrowDown: "Down", ArrowLeft: "Left", ArrowRight: "Right", Space: "space",
  PrintScreen: "Print", Pause: "Pause", ContextMenu: "Menu", CapsLock: "Caps_Lock",
  NumLock: "Num_Lock", ScrollLock: "Scroll_Lock", ControlLeft: "Control_L", ControlRight: "Control_R",
  ShiftLeft: "Shift_L", ShiftRight: "Shift_R", AltLeft: "Alt_L", AltRight: "Alt_R",
  MetaLeft: "Super_L", MetaRight: "Super_R", OSLeft: "Super_L", OSRight: "Super_R",
  Minus: "minus", Equal: "equal", BracketLeft: "bracketleft", BracketRight: "bracketright",
  Backslash: "backslash", IntlBackslash: "backslash", Semicolon: "semicolon", Quote: "apostrophe",
  Backquote: "grave", Comma: "comma", Period: "period", Slash: "slash",
  NumpadAdd: "KP_Add", NumpadSubtract: "KP_Subtract", NumpadMultiply: "KP_Multiply",
  NumpadDivide: "KP_Divide", NumpadDecimal: "KP_Decimal", NumpadEqual: "KP_Equal",
  AudioVolumeMute: "XF86AudioMute", AudioVolumeDown: "XF86AudioLowerVolume", AudioVolumeUp: "XF86AudioRaiseVolume",
};

export function keysymOf(code) {
  if (NAMED[code]) return NAMED[code];
  let m = /^Key([A-Z])$/.exec(code);
  if (m) return m[1].toLowerCase();
  m = /^Digit([0-9])$/.exec(code);
  if (m) return m[1];
  m = /^Numpad([0-9])$/.exec(code);
  if (m) return `KP_${m[1]}`;
  m = /^F([1-9]|1[0-2])$/.exec(code);
  if (m) return code;
  return null;
}
