"""The computer backends (``qemu-kvm``, ``qemu-hvf``, ``qemu-tcg``): X11 desktops on q35.

A computer rig boots a thin qcow2 overlay (``<dataDir>/rigs/run/<rigId>.qcow2``)
of an imported desktop image (``<dataDir>/rigs/images/sha256-<hex>/``) with the
image's own kernel and our initramfs (:mod:`rigd.backends.desktop_argv`). The
machine is the terminal rig's machine in every other respect — confinement,
per-rig uid, QMP, console, agent channel, egress gateway, teardown; what a
desktop adds:

- **Input through the hypervisor.** Every mouse and keyboard event is a QMP
  ``input-send-event`` to the virtio tablet and keyboard; the plans come from
  :mod:`rigd.protocols.input` (pure). The guest cannot tell these from a
  person's hands, cannot block them, and its agent is not involved.
- **Frames through the agent.** Guest protocol 2's ``screen`` grabs, scales
  and encodes in the guest; when the agent is absent or older, QMP
  ``screendump`` writes the framebuffer as PNG and the host scales and
  encodes it (:mod:`rigd.frames`).
- **The live view's frames from the lane measured fastest** on this
  machine: at a view's first frames the agent's grab is timed against QMP
  ``screendump`` to PPM (raw pixels) with the pointer marked and the JPEG
  encoded on the host; the faster one serves every view of the machine
  (:meth:`DesktopDriver.live_still`). Under TCG the host lane wins by ~10x:
  the guest's grab and encode run emulated. A view grabs only on a change
  notice: the agent's X DAMAGE watch (``damage_watch``), or a pointer move
  the host sent (:meth:`DesktopDriver.open_changes`).
- **Every character is typed through the hypervisor**, in order: the US map
  as keys (``\\n`` is Return, ``\\t`` Tab), any other character (``é``,
  ``世``) on a spare keycode the agent binds to its keysym (``keymap_bind``,
  as xdotool does) before the host presses it. The bindings are cached per
  machine and never restored. Only an image whose agent cannot bind keys
  pastes instead (CLIPBOARD and PRIMARY, then shift+Insert), and says so.
- Modes (``set_display``, xrandr in the guest), selections (read and write)
  and the pointer position come from the agent.

The machine is :class:`rigd.backends.qemu.QemuMachine`, as for every QEMU
surface; this module is the desktop's :class:`DesktopRecipe` (the q35 argv
over an imported image) and its :class:`DesktopDriver` (readiness, verbs,
frames, input). A recipe is bound to the image its open found, so a newer
import never swaps the image under a rig or its snapshot build.

Phases while a rig comes up: ``creating disk overlay``, ``booting kernel``,
``waiting for the guest agent``, ``waiting for the desktop`` (until the X
server answers the agent, a window manager has claimed the screen and the
screen is drawn — so a snapshot, and a model's first still, show a desktop).

Why one module of this size: :class:`DesktopDriver` is one surface's driver — the
agent lane, the display, stills, the live view, the clipboard and drops of one X session,
sharing one connection and one display state; its pure helpers (stills cropped, measured,
answered) stay beside the verbs that use them.
"""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from PIL import Image

from rigd.backends import desktop_marks
from rigd.backends.base import Frame, MachineSpec
from rigd.backends.confine import UidPool
from rigd.backends.desktop_argv import desktop_argv
from rigd.backends.gates import net_argv
from rigd.backends.guest_client import MAX_STILL_BYTES, request_screen
from rigd.backends.host import QemuBackend
from rigd.backends.lanes import Clip, DropTarget, write_selection
from rigd.backends.layout import Layout
from rigd.backends.qemu import QemuConfig
from rigd.backends.recipe import PLACEHOLDER_PATHS, Identity, RigPaths
from rigd.backends.warm import SnapshotService
from rigd.errors import BackendError, FieldError, GuestError, GuestRefused
from rigd.frames import Changes, Lane, Still, encode_still
from rigd.framing import untrusted_bytes
from rigd.images.importer import ImportedImage
from rigd.marks import MARKS_MAX, Located, MarkBook, acted, annotate, located
from rigd.model import AGENT_STILL_MAX, BACKEND_OF, DESKTOP_SESSION_USER, Accel, Backend, Display, Surface
from rigd.protocols import input as qin
from rigd.protocols.guest import PROTO_DESKTOP, DamageNotice, Stream
from rigd.verbs import computer as cv
from rigd.verbs._args import is_int
from rigd.verbs.keys import KeyCombo

if TYPE_CHECKING:
    from rigd.backends.qemu import QemuMachine
    from rigd.verbs import Action

#: Under TCG a cold desktop needs 25-90 s to reach the agent and about a minute
#: more to draw XFCE on a loaded 2-core host (HOST-NOTES); the deadline only
#: bounds a hung boot.
DESKTOP_BOOT_S = {Accel.TCG: 420.0}
DESKTOP_BOOT_S_ACCEL = 120.0
#: How long a click or drag waits after its last button event (libinput debounces
#: buttons on a timer; a move sent at once could be applied before them).
BUTTON_SETTLE_S = 0.1
#: How long a scroll waits before the next action may move the pointer.
SCROLL_SETTLE_S = 0.5
#: How long mouse_move waits for the X server to report the pointer where it was sent.
POINTER_SETTLE_S = 3.0
#: A screen with at most this many colours is a blank, not a desktop yet.
DRAWN_MIN_COLOURS = 8
#: A restored desktop is already drawn; its agent only has to answer.
RESTORED_DESKTOP_S = 60.0
#: The keyboard the recipe's argv gives the guest (``desktop_argv``'s default).
KEYBOARD = "virtio"
#: How long after a paste key the text must stay the selection's (the client
#: asks the owner for it asynchronously).
PASTE_SETTLE_S = 0.3
#: The most damage notices per second a live view asks of the agent.
DAMAGE_RATE = 30
#: Grabs per lane timed at a machine's first live frames.
LANE_TRIALS = 2
#: JPEG quality of the ``screenshot`` verb's image.
SHOT_QUALITY = 75


@dataclass(frozen=True, slots=True)
class DesktopRecipe:
    """Computer machines booting one imported desktop image."""

    config: QemuConfig
    image: ImportedImage
    #: The server's tools disk (the guest agent), attached read-only as ``vdb``; None for an
    #: image that carries its own agent (images built before the agent moved there).
    tools: Path | None = None
    surface: Surface = Surface.COMPUTER
    backing_format: str = "qcow2"
    volume_bus: str = "pci"
    volume_owner: str | None = DESKTOP_SESSION_USER

    @property
    def backing(self) -> Path:
        return self.image.disk

    @property
    def default_display(self) -> tuple[int, int]:
        manifest = self.image.manifest
        return manifest.width or 1280, manifest.height or 800

    def _accel(self, spec: MachineSpec) -> Accel:
        return spec.accel or self.config.accel

    def identity(self, spec: MachineSpec) -> Identity:
        accel = self._accel(spec)
        return Identity(BACKEND_OF[accel], accel, f"sha256:{self.image.sha256}")

    def boot_deadline_s(self, spec: MachineSpec) -> float:
        return DESKTOP_BOOT_S.get(self._accel(spec), DESKTOP_BOOT_S_ACCEL)

    def argv(self, spec: MachineSpec, at: RigPaths, *, mac: str | None, incoming: bool,
             tap_fd: int | str | None, accel: Accel | None = None,
             kernel: Path | None = None, initrd: Path | None = None, tools: Path | None = None) -> list[str]:
        net = net_argv(self.config.network, at.rig_dir, tap_fd)
        width, height = spec.display or self.default_display
        return desktop_argv(
            qemu=self.config.qemu, accel=str(accel or self._accel(spec)), memory_mb=spec.memory_mb,
            vcpus=spec.vcpus, disk_overlay=at.overlay, kernel=kernel or self.image.kernel,
            initrd=initrd or self.image.initrd,
            cmdline_extra=[*self.image.manifest.cmdline, *net.get("cmdline_extra", [])],
            qmp_socket=at.qmp, agent_socket=at.agent, console_socket=at.console,
            tools_disk=(tools or self.tools) if self.tools is not None else None,
            width=width, height=height, incoming="defer" if incoming else None,
            mac=mac if "netdev" in net else None, netdev=net.get("netdev"),
            tcg_threads=self.config.tcg_threads,
            **({"sandbox_opts": net["sandbox_opts"]} if "sandbox_opts" in net else {}),
        )

    #: The snapshot holds the running X session (a desktop has no per-rig secret state in it).
    snapshot_at_hello: bool = False

    def warm_eligible(self, spec: MachineSpec) -> bool:
        """Warm starts for the usual shape: the server's accelerator, the image's boot mode, no
        volumes (no snapshot has those disks)."""
        return (spec.accel in (None, self.config.accel)
                and spec.display in (None, self.default_display) and not spec.volumes)

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        usual = MachineSpec(rig_id=spec.rig_id, surface=spec.surface, memory_mb=spec.memory_mb,
                            vcpus=spec.vcpus)
        shape = self.argv(usual, PLACEHOLDER_PATHS, mac="02:00:00:00:00:00", incoming=False,
                          tap_fd="@fd", accel=self.config.accel, kernel=Path("/@kernel"),
                          initrd=Path("/@initrd"), tools=Path("/@tools"))
        assets = {
            name: {"key": self.image.sha256, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", self.image.kernel), ("initrd", self.image.initrd))
        }
        if self.tools is not None:
            # A snapshot holds the running agent: a new tools disk (a changed agent) needs a new one.
            assets["tools"] = {"key": self.tools.parent.name, "file": self.tools.name,
                               "size": self.tools.stat().st_size}
        return shape, assets

    def driver(self, machine: QemuMachine) -> DesktopDriver:
        return DesktopDriver(machine, spec_display=machine.spec.display or self.default_display)


class DesktopImages:
    """The recipe source of computer rigs: the newest imported desktop image
    (the built one is imported on first use; see ``rigd.server.main``)."""

    def __init__(self, config: QemuConfig,
                 image: Callable[[Callable[[str], None]], ImportedImage | None],
                 tools: Path | None = None) -> None:
        self.config = config
        self._image = image
        self._tools = tools
        self._lock = trio.Lock()

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> DesktopRecipe:
        async with self._lock:
            image = await trio.to_thread.run_sync(self._image, progress)
        if image is None:
            raise BackendError(
                "no desktop image is imported on this server: build one (`make images-desktop`) "
                "or import one (`rigd images import <path or URL> --sha256 <digest>`)"
            )
        return DesktopRecipe(self.config, image, self._tools)


def desktop_backend(
    config: QemuConfig, image: Callable[[Callable[[str], None]], ImportedImage | None], *,
    tools: Path | None = None, layout: Layout | None = None, uids: UidPool | None = None,
    snapshots: SnapshotService | None = None,
) -> QemuBackend:
    """One backend serves all three ``qemu-*`` backends (the spec's ``accel`` says which).

    ``tools`` is the server's tools disk (the guest agent every rig of ours runs)."""
    return QemuBackend(Backend.QEMU_TCG, config, DesktopImages(config, image, tools),
                       layout=layout, uids=uids, snapshots=snapshots)


class DesktopDriver:
    """The desktop half of a running machine: readiness, frames, input, the verbs."""

    def __init__(self, machine: QemuMachine, *, spec_display: tuple[int, int],
                 keyboard: str = KEYBOARD) -> None:
        self.m = machine
        #: The screen's mode as last learned (boot size, then the agent's or a still's word).
        self.display: tuple[int, int] = spec_display
        #: Where the pointer is, as far as the host knows (it moved it).
        self.pointer: tuple[int, int] = (spec_display[0] // 2, spec_display[1] // 2)
        self.features: frozenset[str] = frozenset()
        self.proto = 0
        #: The session user's ~/Drops; the files' URIs go on CLIPBOARD.
        self.drop_target = DropTarget(dir="~/Drops", owner=SESSION_USER, told="clipboard")
        #: One input plan at a time: an agent's drag and a person's click never interleave.
        self.input_lock = trio.Lock()
        #: The spare keys bound so far (read and replaced under ``input_lock`` only).
        self.keymap = qin.Keymap(qin.SPARE_KEYS_BY_INPUT[keyboard])
        #: The agent's ``ready`` count when the keymap was last used: a restarted
        #: agent may come with a restarted X server, whose map is its own again.
        self._keymap_agent: int | None = None
        #: The live views' change notices (pointer moves the host sends wake them).
        self._watchers: set[Changes] = set()
        #: The live view's lane, measured at the first live frames of this machine.
        self.live_lane: Lane | None = None
        self._lane_lock = trio.Lock()
        #: The ids drawn on the agent's marked stills, and each one's widget (its path in the
        #: accessibility tree, its role and name as the guest gave them).
        self.marks = MarkBook()
        self._mark_widgets: dict[int, tuple[list[int], str, str]] = {}
        #: Verb -> handler: the dispatch table (a test proves it covers every computer_use verb).
        self.verbs: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
            "screenshot": self._do_screenshot, "cursor_position": self._do_cursor_position,
            "zoom": self._do_zoom,
            "mouse_move": self._do_mouse_move, "left_click": self._click, "right_click": self._click,
            "middle_click": self._click, "double_click": self._click, "triple_click": self._click,
            "left_mouse_down": self._do_left_mouse_down, "left_mouse_up": self._do_left_mouse_up,
            "left_click_drag": self._do_left_click_drag, "scroll": self._do_scroll,
            "key": self._do_key, "hold_key": self._do_hold_key, "type": self._do_type,
            "wait": self._do_wait, "set_display": self._do_set_display,
            "clipboard_read": self._do_clipboard_read, "clipboard_write": self._do_clipboard_write,
        }

    # -- readiness -----------------------------------------------------------------

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        """Learn what the agent can do, then wait for X and a window manager."""
        left = RESTORED_DESKTOP_S if warm else left_s
        hello = self.m.hello
        proto = hello.get("proto")
        self.proto = proto if isinstance(proto, int) and not isinstance(proto, bool) else 1
        feats = hello.get("features")
        if isinstance(feats, list):
            self.features = frozenset(f for f in feats if isinstance(f, str))
        if self.proto < PROTO_DESKTOP or "display" not in self.features:
            self.m.log.warning("the image's agent is older than protocol 2: frames come from QMP "
                               "screendump; no modes, selections or pasted text")
            return
        progress("waiting for the desktop")
        with trio.move_on_after(max(left, 1.0)) as deadline:
            while True:
                try:
                    body = await self.m.channel().request("display", timeout=self.m.grace)
                except GuestRefused:
                    await trio.sleep(1.0)
                    continue
                self._note_display(body)
                break
            # Then the session: a window manager on the root (EWMH). An image
            # without xprop is taken as ready once X answers.
            while not await self._session_up():  # noqa: ASYNC110 - the guest has no event to wait on
                await trio.sleep(1.0)
        if deadline.cancelled_caught:
            raise BackendError(
                f"the desktop (X server) did not come up within {int(self.m.boot_deadline)} s",
                console=self.m.console_tail(2048),
            )

    async def _session_up(self) -> bool:
        """A window manager has claimed the root (EWMH) and the screen is drawn
        (a small still has more than a handful of colours: not a blank)."""
        try:
            result = await self.m.exec(
                ["/bin/sh", "-c", "command -v xprop >/dev/null || exit 0; "
                                  "xprop -root _NET_SUPPORTING_WM_CHECK | grep -q 'window id'"],
                cwd=None, env=None, stdin=None, timeout_s=20, max_output=4096,
            )
        except FieldError:  # no /bin/sh: nothing to ask
            return True
        if result.exit_code != 0:
            return False
        frame = await self.still(max_w=160, max_h=100, fmt="png", mark_cursor=False)
        return await trio.to_thread.run_sync(colours_over, frame.still.data, DRAWN_MIN_COLOURS)

    def _note_display(self, body: dict[str, Any]) -> None:
        w, h = body.get("width"), body.get("height")
        if is_int(w) and is_int(h) and 1 <= w <= 16384 and 1 <= h <= 16384:
            self.display = (w, h)

    # -- input through QMP ---------------------------------------------------------------

    async def send_input(self, steps: Sequence[qin.Step]) -> None:
        """Send an input plan: each event list is one QMP ``input-send-event``;
        a :class:`~rigd.protocols.input.Text` is planned against the keymap here,
        under the input lock, so two texts never plan against the same bindings."""
        if self.m.qmp is None:
            raise BackendError("the machine is not running")
        async with self.input_lock:
            for step in steps:
                await self._send_step(step)

    async def _send_step(self, step: qin.Step) -> None:
        if isinstance(step, qin.Pause):
            await trio.sleep(step.seconds)
        elif isinstance(step, qin.Bind):
            await self._bind(step)
        elif isinstance(step, qin.Text):
            await self._type_text(step)
        elif step:
            if self.m.qmp is None:
                raise BackendError("the machine is not running")
            await self.m.qmp.execute("input-send-event", {"events": step}, timeout=self.m.grace)
            self._note_pointer(step)

    def _note_pointer(self, events: Sequence[dict[str, Any]]) -> None:
        """Follow absolute moves (whoever sent them: a verb or a person's live
        view), so the host lane marks the pointer where it is, and wake the
        live views: a pointer move damages nothing in X."""
        x, y = self.pointer
        moved = False
        w, h = self.display
        for event in events:
            data = event.get("data") if event.get("type") == "abs" else None
            if isinstance(data, dict) and is_int(data.get("value")):
                value = data["value"]
                if data.get("axis") == "x":
                    x, moved = min(w - 1, value * (w - 1) // qin.AXIS_MAX), True
                elif data.get("axis") == "y":
                    y, moved = min(h - 1, value * (h - 1) // qin.AXIS_MAX), True
        if moved:
            self.pointer = (x, y)
            for changes in self._watchers:
                changes.pointer()

    def can_bind_keys(self) -> bool:
        """Whether characters outside the US map can be typed (agent ``keymap``, spare keys)."""
        return self._agent_has("keymap") and bool(self.keymap.pool)

    async def _type_text(self, step: qin.Text) -> None:
        """Type a text, every character through QMP (the input lock is held)."""
        text = step.text
        bad = qin.untypeable(text)
        if bad:
            what = _at(bad, "is a control character", "are control characters")
            raise FieldError(step.field, f"{what}, which no key types (send Escape, BackSpace and the "
                                         "like with the key action); nothing was typed")
        if not qin.needs_keymap(text):
            for s in qin.plan_text(text, qin.Keymap(())).steps:
                await self._send_step(s)
            return
        if not self.can_bind_keys():
            what = _at(qin.off_map(text), "has", "have")
            raise FieldError(step.field, f"{what} no key on the rig's keyboard and this image's agent "
                                         "cannot bind one (guest protocol 2 with keymap is needed: "
                                         "rebuild the image); nothing was typed")
        ready = self.m.channel().stats.ready_lines
        if self._keymap_agent is not None and ready != self._keymap_agent and self.keymap.bound:
            self.keymap = self.keymap.unsure()
        self._keymap_agent = ready
        before = self.keymap
        plan = qin.plan_text(text, before)
        done = False
        try:
            for s in plan.steps:
                await self._send_step(s)
            done = True
        finally:
            # A plan cut short leaves its keys in a state the host cannot know:
            # each is rebound (after the settle) before it is pressed again.
            self.keymap = plan.keymap if done else before.unsure()

    async def _bind(self, step: qin.Bind) -> None:
        n = len(step.pairs)
        try:
            body = await self.m.channel().request(
                "keymap_bind", timeout=self.m.grace + 5, bind=[[code, sym] for code, sym in step.pairs])
        except GuestRefused:
            # Not chained, and the agent's reason is not quoted: an X error names
            # the value it refused, and that value is a typed character's keysym.
            raise GuestError(f"the guest agent could not bind keys for the text (keymap_bind refused); "
                             f"the first {step.typed_before} keys of it were typed") from None
        if not (is_int(body.get("bound")) and body["bound"] == n):
            raise GuestError(f"the guest agent bound {str(body.get('bound'))[:20]} of {n} keys; "
                             f"the first {step.typed_before} keys of the text were typed")

    def _check_point(self, point: tuple[int, int], field: str) -> None:
        w, h = self.display
        if not (0 <= point[0] < w and 0 <= point[1] < h):
            raise FieldError(field, f"must be two integers inside the {w}x{h} display")

    def _moved(self, point: tuple[int, int] | None) -> None:
        if point is not None:
            self.pointer = point

    # -- frames ----------------------------------------------------------------------

    def _agent_has(self, feature: str) -> bool:
        return self.proto >= PROTO_DESKTOP and feature in self.features

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        """A still from the agent's lane, else from QMP ``screendump``."""
        if self._agent_has("screen"):
            try:
                return await self._agent_still(max_w, max_h, fmt, quality, mark_cursor)
            except GuestRefused as exc:
                self.m.log.info("agent screen refused; using QMP", extra={"reason": exc.reason[:200]})
        return Frame(await self._qmp_still(max_w, max_h, fmt, quality), "qmp", None, False)

    async def _agent_still(self, max_w: int, max_h: int, fmt: str, quality: int,
                           mark: bool) -> Frame:
        got = await request_screen(self.m.channel(), timeout=30 + self.m.grace, max_w=max_w, max_h=max_h,
                                   quality=quality, format=fmt, markCursor=mark)
        self.display = (got.display_w, got.display_h)
        media = "image/png" if fmt == "png" else "image/jpeg"
        still = Still(got.data, media, got.display_w, got.display_h, got.image_w, got.image_h, got.scale)
        return Frame(still, "agent", got.cursor, got.cursor_marked)

    async def _qmp_still(self, max_w: int, max_h: int, fmt: str, quality: int, *,
                         dump: str = "png", cursor: tuple[int, int] | None = None) -> Still:
        """QMP ``screendump`` (``dump``: png, or ppm — raw, far cheaper for QEMU
        to write), scaled, marked at ``cursor`` and encoded on the host."""
        still, _marked_at = await self._qmp_frame(max_w, max_h, fmt, quality, dump=dump, cursor=cursor)
        return still

    async def _qmp_frame(self, max_w: int, max_h: int, fmt: str, quality: int, *, dump: str,
                         cursor: tuple[int, int] | None = None,
                         locate: Callable[[], Awaitable[tuple[int, int] | None]] | None = None,
                         ) -> tuple[Still, tuple[int, int] | None]:
        """:meth:`_qmp_still`, and where the pointer was marked. ``locate``, when
        given, asks where the pointer is while QEMU dumps: its answer, if it comes
        before the dump is read, replaces ``cursor`` (else the ask is dropped and
        ``cursor`` — where rigd last put the pointer — is marked), so a still never
        waits on the guest longer than on QEMU (issue 28, item 3)."""
        if self.m.qmp is None:
            raise BackendError("the machine is not running")
        qmp = self.m.qmp
        path = self.m.rig_dir / f"frame-{trio.current_time():.6f}.{dump}"
        where = [cursor]

        async def ask() -> None:
            assert locate is not None
            with contextlib.suppress(GuestError):
                where[0] = await locate() or where[0]

        try:
            async with trio.open_nursery() as nursery:
                if locate is not None:
                    nursery.start_soon(ask)
                await qmp.execute("screendump", {"filename": str(path), "format": dump},
                                  timeout=30 + self.m.grace)
                raw = await trio.Path(path).read_bytes()
                nursery.cancel_scope.cancel()
        finally:
            await trio.Path(path).unlink(missing_ok=True)
        cursor = where[0]
        if len(raw) > MAX_STILL_BYTES * 4:  # a 16384x16384 PPM is 768 MB; QEMU's displays stop far below
            raise BackendError(f"QEMU's screendump is {len(raw)} bytes")
        still = await trio.to_thread.run_sync(
            lambda: encode_still(raw, max_w=max_w, max_h=max_h, fmt=fmt, quality=quality, cursor=cursor)
        )
        self.display = (still.display_w, still.display_h)
        return still, cursor

    # -- the live view ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def open_changes(self) -> AsyncIterator[Changes | None]:
        """Change notices for one live view: the agent's X DAMAGE watch (a
        ``damage_watch`` request that streams ``damage`` events until
        ``damage_stop``) and the pointer moves the host sends. None when the
        agent has no ``damage`` feature: the view polls, as before."""
        if not self._agent_has("damage"):
            yield None
            return
        changes = Changes()
        chan = self.m.channel()

        def on_stream(event: Stream) -> None:
            notice = event.body.get("notice")
            if isinstance(notice, DamageNotice):
                changes.damage(notice.rects)

        try:
            pending = await chan.send("damage_watch", timeout=self.m.grace, on_stream=on_stream,
                                      on_reply=changes.end, maxRate=DAMAGE_RATE)
        except GuestError:
            # The channel is down (the agent restarting): an ended watch, so
            # the view grabs once and asks again a second later.
            changes.end()
            yield changes
            return
        self._watchers.add(changes)
        try:
            yield changes
        finally:
            self._watchers.discard(changes)
            answered = pending.answered
            pending.forget()
            if not answered:
                with trio.CancelScope(shield=True), trio.move_on_after(self.m.grace), \
                        contextlib.suppress(GuestError):
                    await chan.request("damage_stop", timeout=self.m.grace, watch=pending.id)

    async def live_still(self, *, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        """A still for a person's live view, the pointer marked, from the lane
        measured fastest on this machine (measured once, at its first live frames)."""
        if self.live_lane is None:
            async with self._lane_lock:
                if self.live_lane is None:
                    return await self._measure_lanes(max_w, max_h, quality)
        lane = self.live_lane
        return await self._lane_still(lane.source, max_w, max_h, quality), lane

    async def measured_lane(self, max_w: int, max_h: int, quality: int) -> Lane:
        """The lane measured fastest on this machine (measured now if nobody has yet):
        the live view and the ``screenshot`` verb share it."""
        if self.live_lane is None:
            async with self._lane_lock:
                if self.live_lane is None:
                    await self._measure_lanes(max_w, max_h, quality)
        assert self.live_lane is not None
        return self.live_lane

    async def _lane_still(self, source: str, max_w: int, max_h: int, quality: int) -> Frame:
        if source == "agent":
            try:
                return await self._agent_still(max_w, max_h, "jpeg", quality, True)
            except GuestRefused as exc:
                self.m.log.info("agent screen refused; using QMP", extra={"reason": exc.reason[:200]})
        still = await self._qmp_still(max_w, max_h, "jpeg", quality, dump="ppm", cursor=self.pointer)
        return Frame(still, "qmp", self.pointer, True)

    async def _measure_lanes(self, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        """Time each lane ``LANE_TRIALS`` times (interleaved), keep the faster.
        Returns the last frame the winner grabbed (the view's first frame)."""
        lanes = ["qmp", "agent"] if self._agent_has("screen") else ["qmp"]
        times: dict[str, list[float]] = {lane: [] for lane in lanes}
        last: dict[str, Frame] = {}
        for _ in range(LANE_TRIALS if len(lanes) > 1 else 1):
            for lane in lanes:
                t0 = trio.current_time()
                try:
                    frame = await self._lane_still(lane, max_w, max_h, quality)
                except GuestError:
                    times.pop(lane, None)
                    continue
                if lane in times and frame.source == lane:
                    times[lane].append(trio.current_time() - t0)
                    last[lane] = frame
        ms = {lane: round(1000 * sum(v) / len(v), 1) for lane, v in times.items() if v}
        if not ms:
            raise BackendError("no lane gave the live view a frame")
        best = min(ms, key=lambda lane: ms[lane])
        names = {"agent": "the agent's grab", "qmp": "QMP screendump (PPM) + host JPEG"}
        others = ", ".join(f"{names[k]} {v} ms" for k, v in ms.items() if k != best)
        why = f"measured: {names[best]} {ms[best]} ms per frame" + (f" vs {others}" if others else "")
        self.live_lane = Lane(best, why, ms)
        self.m.log.info("live view lane", extra={"lane": best, "measured_ms": ms})
        return last[best], self.live_lane

    # -- the verbs ------------------------------------------------------------------------

    async def perform(self, action: Action) -> dict[str, Any]:
        handler = self.verbs.get(action.verb)
        if handler is None:
            raise FieldError("action.action", f"a computer rig does not answer {action.verb}")
        return await handler(action)

    async def _do_screenshot(self, a: cv.ComputerScreenshot) -> dict[str, Any]:
        if not a.marks:
            return await self._plain_screenshot()
        display = Display(*self.display)
        items, covered, truncated = await desktop_marks.find(self._run_as_session, SESSION_USER, display)
        _generation, first = self.marks.begin()
        marks, more = self.marks.issue({"items": items}, display)
        self._mark_widgets = {first + n: (i["path"], i["role"], i["name"])
                              for n, i in enumerate(items[:MARKS_MAX])}
        out = await annotate(await self._plain_screenshot(), marks, more)
        notes = ["marks come from the accessibility tree (AT-SPI): windows that expose none (X "
                 "programs without a toolkit, canvases) take coordinates"]
        if covered:
            notes.append(f"{covered} widgets under another window were not marked")
        if truncated:
            notes.append("the tree was too large to walk in time; some widgets may be missing")
        out["note"] = "; ".join([out["note"], *notes])
        return out

    async def _run_as_session(self, argv: list[str], timeout_s: float,
                              stdin: bytes | None) -> tuple[int | None, bytes]:
        result = await self.m.exec(argv, cwd=f"/home/{SESSION_USER}", env=None, stdin=stdin,
                                   timeout_s=timeout_s, max_output=desktop_marks.OUTPUT_MAX)
        return result.exit_code, result.stdout

    async def _mark_point(self, mark: int, *, wait_enabled: bool) -> tuple[tuple[int, int], float]:
        """Where mark ``mark``'s widget is now, and how long it was waited for to enable."""
        known = self.marks.live(mark)
        path, role, name = self._mark_widgets[mark]

        async def locate() -> Located:
            return await desktop_marks.target(self._run_as_session, SESSION_USER, path, role, name,
                                              Display(*self.display))

        return await located(mark, known, locate, wait_enabled=wait_enabled, poll_s=0.5)

    async def _plain_screenshot(self) -> dict[str, Any]:
        cap = AGENT_STILL_MAX
        lane = await self.measured_lane(cap.width, cap.height, SHOT_QUALITY)
        cursor: tuple[int, int] | None
        if lane.source == "qmp":
            # The host lane: QMP screendump (PPM), scaled and encoded on the host, the
            # pointer marked where the guest says it is (else where rigd last put it).
            # The guest is asked where its pointer is while QEMU dumps the screen.
            still, cursor = await self._qmp_frame(cap.width, cap.height, "jpeg", SHOT_QUALITY, dump="ppm",
                                                  cursor=self.pointer, locate=self._guest_pointer)
            source, marked = "qmp", True
        else:
            still, source, cursor, marked = await self.still(max_w=cap.width, max_h=cap.height,
                                                             quality=SHOT_QUALITY)
        out = still_json(still, source)
        out["lane"] = {"source": lane.source, "why": lane.why}
        out["cursor"] = list(cursor) if cursor is not None else None
        out["cursorMarked"] = marked
        return out

    async def _do_zoom(self, a: cv.ComputerZoom) -> dict[str, Any]:
        """The region at the display's own resolution: a full-size still, cut on the host
        (scaled down only when the region is larger than an agent still)."""
        x1, y1, x2, y2 = a.region
        dw, dh = self.display
        if x2 > dw or y2 > dh:
            raise FieldError("action.region", f"reaches outside the {dw}x{dh} display")
        still, source, _cursor, _marked = await self.still(max_w=dw, max_h=dh, quality=ZOOM_QUALITY,
                                                           mark_cursor=False)
        data, iw, ih = await trio.to_thread.run_sync(crop_still, still, a.region, AGENT_STILL_MAX)
        return {
            "image": {"mediaType": "image/jpeg", "data": base64.b64encode(data).decode()},
            "region": list(a.region),
            "display": {"width": still.display_w, "height": still.display_h},
            "imageSize": {"width": iw, "height": ih},
            "scale": round((x2 - x1) / iw, 6),
            "source": source,
            "note": "scale is display pixels per image pixel: image point (x, y) is display point "
                    f"({x1} + x*scale, {y1} + y*scale)",
        }

    async def _guest_pointer(self) -> tuple[int, int] | None:
        """Where the guest's X server has the pointer (the agent's ``cursor``), or None."""
        if not self._agent_has("cursor"):
            return None
        body = await self.m.channel().request("cursor", timeout=self.m.grace)
        cur = body.get("cursor")
        if isinstance(cur, list) and len(cur) == 2 and all(is_int(c) for c in cur):
            self._note_display({"width": body.get("displayWidth"), "height": body.get("displayHeight")})
            x, y = int(cur[0]), int(cur[1])
            if 0 <= x < self.display[0] and 0 <= y < self.display[1]:
                return x, y
        return None

    async def _do_cursor_position(self, _a: cv.ComputerCursorPosition) -> dict[str, Any]:
        point = await self._guest_pointer()
        if point is not None:
            return {"coordinate": list(point), "source": "agent", **self._display_json()}
        x, y = self.pointer
        return {"coordinate": [x, y], "source": "host", **self._display_json()}

    def _display_json(self) -> dict[str, Any]:
        return {"display": {"width": self.display[0], "height": self.display[1]}}

    async def _do_mouse_move(self, a: cv.ComputerMouseMove) -> dict[str, Any]:
        self._check_point(a.coordinate, "action.coordinate")
        await self.send_input([qin.move(*a.coordinate, *self.display)])
        self._moved(a.coordinate)
        return {"coordinate": list(a.coordinate), "settled": await self._pointer_settled(a.coordinate)}

    async def _pointer_settled(self, point: tuple[int, int]) -> bool | None:
        """Wait (briefly) until the X server has the pointer at ``point``, so the
        next observation sees the move; None when the agent cannot tell."""
        if not self._agent_has("cursor"):
            return None
        with trio.move_on_after(POINTER_SETTLE_S):
            while True:
                body = await self.m.channel().request("cursor", timeout=self.m.grace)
                if body.get("cursor") == list(point):
                    return True
                await trio.sleep(0.02)
        return False

    async def _move_first(self, point: tuple[int, int] | None, field: str) -> None:
        """Put the pointer at ``point`` and wait until X has it there, so buttons
        pressed next are pressed *there* even when the guest runs behind."""
        if point is None:
            return
        self._check_point(point, field)
        await self.send_input([qin.move(*point, *self.display)])
        self._moved(point)
        await self._pointer_settled(point)

    async def _input_processed(self) -> None:
        """Let X deliver the buttons just sent before anything moves the pointer.

        Xorg's input thread moves the pointer as soon as it reads a motion,
        while the main thread stamps button events with the pointer's position
        when it gets to them; a guest running behind would report a click at
        the *next* action's point. A request to X (the agent's ``cursor``)
        makes the main thread process the input queued before it."""
        await trio.sleep(BUTTON_SETTLE_S)
        if self._agent_has("cursor"):
            with contextlib.suppress(GuestError):
                await self.m.channel().request("cursor", timeout=self.m.grace)

    async def _click(self, a: cv.ComputerClick) -> dict[str, Any]:
        point, waited = a.coordinate, 0.0
        if a.mark is not None:
            point, waited = await self._mark_point(a.mark, wait_enabled=True)
        await self._move_first(point, "action.coordinate")
        await self.send_input(qin.plan_click(None, self.display, button_name=a.button,
                                            clicks=a.clicks, modifiers=a.modifiers))
        await self._input_processed()
        return {"coordinate": list(self.pointer), "button": a.button, "clicks": a.clicks,
                **acted(a.mark, waited)}

    async def _do_left_mouse_down(self, _a: cv.ComputerLeftMouseDown) -> dict[str, Any]:
        await self.send_input([[qin.button("left", True)]])
        return {"coordinate": list(self.pointer), "button": "left", "down": True}

    async def _do_left_mouse_up(self, _a: cv.ComputerLeftMouseUp) -> dict[str, Any]:
        await self.send_input([[qin.button("left", False)]])
        return {"coordinate": list(self.pointer), "button": "left", "down": False}

    async def _do_left_click_drag(self, a: cv.ComputerLeftClickDrag) -> dict[str, Any]:
        self._check_point(a.end, "action.coordinate")
        await self._move_first(a.start, "action.start_coordinate")
        await self.send_input(qin.plan_drag(a.start, a.end, self.display))
        self._moved(a.end)
        await self._pointer_settled(a.end)
        await self._input_processed()
        return {"from": list(a.start), "to": list(a.end)}

    async def _do_scroll(self, a: cv.ComputerScroll) -> dict[str, Any]:
        point = a.coordinate
        if a.mark is not None:
            point, _ = await self._mark_point(a.mark, wait_enabled=False)
        await self._move_first(point, "action.coordinate")
        await self.send_input(qin.plan_scroll(None, self.display, str(a.direction),
                                             a.amount, a.modifiers))
        # libinput holds wheel events back a moment (its wheel state machine);
        # a pointer move sent meanwhile would overtake them and the scroll
        # would land where the next action points.
        await trio.sleep(SCROLL_SETTLE_S)
        await self._input_processed()
        out: dict[str, Any] = {"direction": str(a.direction), "amount": a.amount,
                               "coordinate": list(self.pointer), **acted(a.mark, 0.0)}
        if str(a.direction) in qin.SHIFT_WHEEL:
            out["note"] = "sent as shift + the vertical wheel (the rig's tablet has no horizontal wheel)"
        return out

    async def _do_key(self, a: cv.ComputerKey) -> dict[str, Any]:
        try:
            plan = qin.plan_combos(a.combos)
        except qin.UnknownKey as exc:
            raise FieldError("action.text", str(exc)) from exc
        await self.send_input(plan)
        return {"keys": [str(c) for c in a.combos]}

    async def _do_hold_key(self, a: cv.ComputerHoldKey) -> dict[str, Any]:
        try:
            plan = qin.plan_hold(a.combo, a.duration_s)
        except qin.UnknownKey as exc:
            raise FieldError("action.text", str(exc)) from exc
        await self.send_input(plan)
        return {"key": str(a.combo), "heldS": a.duration_s}

    async def _do_type(self, a: cv.ComputerType) -> dict[str, Any]:
        if a.mark is not None:  # typing into a widget: a click on it first gives it the focus
            await self._click(cv.ComputerLeftClick(mark=a.mark))
        text = a.text
        chars = len(text)
        keymap = qin.needs_keymap(text)
        if not keymap or self.can_bind_keys():
            await self.send_input([qin.Text(text, field="action.text")])
            return {"characters": chars, "dropped": 0, "via": "keys+keymap" if keymap else "keys"}
        if not self._agent_has("clipboard_write"):
            what = _at(qin.off_map(text), "has", "have")
            raise FieldError(
                "action.text",
                f"{what} no key on the rig's keyboard and this image's agent can "
                "neither bind one nor paste (guest protocol 2 with keymap is needed: rebuild the "
                "image); nothing was typed",
            )
        # An image that predates keymap_bind: the whole text travels as one
        # paste, so no later key or paste can overtake it (the client fetches
        # the selection asynchronously).
        async with self.input_lock:
            for selection in ("clipboard", "primary"):
                await self._write_selection(selection, text)
        await self.send_input(qin.plan_combos([_SHIFT_INSERT]))
        await trio.sleep(PASTE_SETTLE_S)
        return {
            "characters": chars, "dropped": 0, "via": "clipboard",
            "note": "this image's agent cannot bind keys (no keymap feature: rebuild the image), so "
                    "the text was pasted through the guest's CLIPBOARD and PRIMARY selections "
                    "(shift+Insert), which now hold it; a newline in pasted text is not Enter",
        }

    async def _write_selection(self, selection: str, text: str) -> int:
        return await write_selection(self.m.channel(), selection, Clip("text/plain", text.encode()),
                                     self.m.grace + 10)

    async def _do_wait(self, a: cv.ComputerWait) -> dict[str, Any]:
        await trio.sleep(a.duration_s)
        return {"waitedS": a.duration_s}

    async def _do_set_display(self, a: cv.ComputerSetDisplay) -> dict[str, Any]:
        if not self._agent_has("set_display"):
            raise FieldError("action.action", "this image's agent cannot change the display mode "
                                              "(guest protocol 2 with xrandr is needed)")
        body = await self.m.channel().request("set_display", timeout=60 + self.m.grace,
                                           width=a.width, height=a.height)
        self._note_display(body)
        if self.display != (a.width, a.height):
            raise BackendError(f"the guest kept {self.display[0]}x{self.display[1]} after "
                               f"set_display {a.width}x{a.height}")
        self.pointer = (min(self.pointer[0], a.width - 1), min(self.pointer[1], a.height - 1))
        return {**self._display_json(), "changed": body.get("changed") is True}

    async def _do_clipboard_read(self, a: cv.ComputerClipboardRead) -> dict[str, Any]:
        if not self._agent_has("clipboard_read"):
            raise FieldError("action.action", "this image's agent cannot read selections "
                                              "(guest protocol 2 is needed)")
        parts: list[bytes] = []

        def on_stream(event: Stream) -> None:
            if event.name == "data":
                parts.append(event.data)

        body = await self.m.channel().request("clipboard_read", timeout=self.m.grace + 10,
                                           on_stream=on_stream, selection=str(a.selection))
        text = body.get("text")
        raw = text.encode("utf-8") if isinstance(text, str) else b"".join(parts)
        truncated = body.get("truncated") is True
        return {"selection": str(a.selection),
                "content": untrusted_bytes(raw, truncated=truncated, limit=len(raw))}

    async def _do_clipboard_write(self, a: cv.ComputerClipboardWrite) -> dict[str, Any]:
        if not self._agent_has("clipboard_write"):
            raise FieldError("action.action", "this image's agent cannot write selections "
                                              "(guest protocol 2 is needed)")
        async with self.input_lock:
            written = await self._write_selection("clipboard", a.text)
        return {"selection": "clipboard", "bytes": written}


#: A zoom's full-size still (its detail is the point).
ZOOM_QUALITY = 90


def crop_still(still: Still, region: tuple[int, int, int, int], cap: Display) -> tuple[bytes, int, int]:
    """``region`` (display pixels) of a still, as a JPEG at the display's resolution, scaled down
    to fit ``cap`` only when larger. The still's size is checked before anything is decoded.
    Blocking (Pillow)."""
    x1, y1, x2, y2 = region
    sx, sy = still.image_w / still.display_w, still.image_h / still.display_h
    box = (int(x1 * sx), int(y1 * sy), max(int(x1 * sx) + 1, round(x2 * sx)),
           max(int(y1 * sy) + 1, round(y2 * sy)))
    try:
        with Image.open(io.BytesIO(still.data)) as img:
            if img.size != (still.image_w, still.image_h):
                raise BackendError(f"the still is {img.size[0]}x{img.size[1]}, not the "
                                   f"{still.image_w}x{still.image_h} it claims")
            part = img.convert("RGB").crop(box)
    except (OSError, Image.DecompressionBombError) as exc:
        raise BackendError(f"zoom: the still does not decode: {exc}") from exc
    w, h = x2 - x1, y2 - y1
    scale = min(1.0, cap.width / w, cap.height / h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    if part.size != size:
        part = part.resize(size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    part.save(buf, "JPEG", quality=ZOOM_QUALITY)
    return buf.getvalue(), part.width, part.height


#: The desktop image's session user (images/desktop/customize.sh, lightdm autologin).
SESSION_USER = DESKTOP_SESSION_USER

_SHIFT_INSERT = KeyCombo(("Shift_L",), "Insert")


def _at(positions: Sequence[int], one: str, many: str) -> str:
    """Where refused characters are ("the characters at 3, 7 <many>"), never what
    they are: a refusal reaches the audit log, where typed text is masked."""
    where = ", ".join(str(i) for i in positions[:5])
    if len(positions) > 5:
        where += f" and {len(positions) - 5} more"
    return f"the character at {where} {one}" if len(positions) == 1 else f"the characters at {where} {many}"


def colours_over(image: bytes, limit: int) -> bool:
    """Whether an encoded image has more than ``limit`` distinct colours."""
    with Image.open(io.BytesIO(image)) as img:
        return img.convert("RGB").getcolors(limit) is None


def still_json(still: Still, source: str) -> dict[str, Any]:
    """The RPC shape of a still: the image and the sizes that map it to the screen."""
    return {
        "image": {"mediaType": still.media_type, "data": base64.b64encode(still.data).decode()},
        "display": {"width": still.display_w, "height": still.display_h},
        "imageSize": {"width": still.image_w, "height": still.image_h},
        "scale": round(still.scale, 6),
        "source": source,
        "note": "scale is display pixels per image pixel: image point (x, y) is display point "
                "(x*scale, y*scale)",
    }


__all__ = ["DesktopDriver", "DesktopImages", "DesktopRecipe", "desktop_backend", "still_json"]
