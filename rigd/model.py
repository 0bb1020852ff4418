"""The rig model: surfaces, phases, close reasons, engines, backends, and the
defaults-and-ceilings table of RIGS.md §7. Data only, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Surface(enum.StrEnum):
    TERMINAL = "terminal"
    BROWSER = "browser"
    COMPUTER = "computer"
    ANDROID = "android"
    IOS = "ios"


class Phase(enum.StrEnum):
    PROVISIONING = "provisioning"
    READY = "ready"
    PARKED = "parked"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


class CloseReason(enum.StrEnum):
    REQUESTED = "requested"
    IDLE_TIMEOUT = "idleTimeout"
    TTL_EXPIRED = "ttlExpired"
    CONVERSATION_ENDED = "conversationEnded"
    WORKSPACE_GONE = "workspaceGone"
    SERVER_SHUTDOWN = "serverShutdown"
    BACKEND_FAILURE = "backendFailure"


class Engine(enum.StrEnum):
    CHROMIUM = "chromium"
    FIREFOX = "firefox"
    WEBKIT = "webkit"


class Backend(enum.StrEnum):
    SMOLVM = "smolvm"
    QEMU_KVM = "qemu-kvm"
    QEMU_HVF = "qemu-hvf"
    QEMU_TCG = "qemu-tcg"
    ANDROID_EMULATOR = "android-emulator"
    IOS_SIMULATOR = "ios-simulator"


class Accel(enum.StrEnum):
    KVM = "kvm"
    HVF = "hvf"
    TCG = "tcg"


#: The accelerator each computer backend runs on, and back.
ACCEL_OF: dict[Backend, Accel] = {
    Backend.QEMU_KVM: Accel.KVM, Backend.QEMU_HVF: Accel.HVF, Backend.QEMU_TCG: Accel.TCG,
}
BACKEND_OF: dict[Accel, Backend] = {a: b for b, a in ACCEL_OF.items()}


class Tool(enum.StrEnum):
    TERMINAL_USE = "terminal_use"
    COMPUTER_USE = "computer_use"
    BROWSER_USE = "browser_use"
    MOBILE_USE = "mobile_use"
    IOS_USE = "ios_use"


class ActionClass(enum.StrEnum):
    """Guard classes a tool declares (RIGS.md §11)."""

    ENCLOSURE_CONTROL = "enclosureControl"
    NETWORK_EGRESS = "networkEgress"
    PROCESS_SPAWN = "processSpawn"
    PACKAGE_INSTALL = "packageInstall"


TOOL_SURFACES: dict[Tool, frozenset[Surface]] = {
    Tool.TERMINAL_USE: frozenset({Surface.TERMINAL, Surface.BROWSER, Surface.COMPUTER}),
    Tool.COMPUTER_USE: frozenset({Surface.COMPUTER}),
    Tool.BROWSER_USE: frozenset({Surface.BROWSER}),
    Tool.MOBILE_USE: frozenset({Surface.ANDROID}),
    Tool.IOS_USE: frozenset({Surface.IOS}),
}

TOOL_ACTION_CLASSES: dict[str, tuple[ActionClass, ...]] = {
    "rig_list": (),
    "rig_close": (ActionClass.ENCLOSURE_CONTROL,),
    Tool.TERMINAL_USE: (
        ActionClass.ENCLOSURE_CONTROL,
        ActionClass.NETWORK_EGRESS,
        ActionClass.PROCESS_SPAWN,
    ),
    Tool.COMPUTER_USE: (
        ActionClass.ENCLOSURE_CONTROL,
        ActionClass.NETWORK_EGRESS,
        ActionClass.PROCESS_SPAWN,
    ),
    Tool.BROWSER_USE: (
        ActionClass.ENCLOSURE_CONTROL,
        ActionClass.NETWORK_EGRESS,
        ActionClass.PROCESS_SPAWN,
    ),
    Tool.MOBILE_USE: (
        ActionClass.ENCLOSURE_CONTROL,
        ActionClass.NETWORK_EGRESS,
        ActionClass.PROCESS_SPAWN,
        ActionClass.PACKAGE_INSTALL,
    ),
    Tool.IOS_USE: (
        ActionClass.ENCLOSURE_CONTROL,
        ActionClass.NETWORK_EGRESS,
        ActionClass.PROCESS_SPAWN,
        ActionClass.PACKAGE_INSTALL,
    ),
}


@dataclass(frozen=True, slots=True)
class Display:
    width: int
    height: int

    def to_json(self) -> dict[str, int]:
        return {"width": self.width, "height": self.height}


@dataclass(frozen=True, slots=True)
class Limits:
    """Defaults and ceilings for one surface (RIGS.md §7).

    A default is what a rig gets when the caller does not ask; a ceiling is the
    largest value a caller may ask for. Floors keep a machine bootable.
    """

    memory_mb: int
    memory_mb_max: int
    vcpus: int
    vcpus_max: int
    ttl_s: int
    ttl_s_max: int
    idle_s: int
    idle_s_max: int
    display: Display | None
    display_max: Display | None
    memory_mb_min: int = 256
    vcpus_min: int = 1
    ttl_s_min: int = 60
    idle_s_min: int = 10


HOUR = 3600
MINUTE = 60

#: RIGS.md §7. The defaults are the table's values; the ceilings equal them
#: for TTL and idle (the table names the hard lifetime) and allow up to twice
#: the memory and vCPUs for callers that need a bigger machine.
LIMITS: dict[Surface, Limits] = {
    Surface.TERMINAL: Limits(
        memory_mb=512, memory_mb_max=4096, vcpus=2, vcpus_max=4,
        ttl_s=8 * HOUR, ttl_s_max=8 * HOUR, idle_s=45 * MINUTE, idle_s_max=45 * MINUTE,
        display=None, display_max=None,
    ),
    Surface.BROWSER: Limits(
        memory_mb=2048, memory_mb_max=4096, vcpus=2, vcpus_max=4,
        ttl_s=2 * HOUR, ttl_s_max=2 * HOUR, idle_s=15 * MINUTE, idle_s_max=15 * MINUTE,
        display=Display(1280, 800), display_max=Display(2560, 1600), memory_mb_min=1024,
    ),
    Surface.COMPUTER: Limits(
        memory_mb=4096, memory_mb_max=8192, vcpus=4, vcpus_max=8,
        ttl_s=2 * HOUR, ttl_s_max=2 * HOUR, idle_s=15 * MINUTE, idle_s_max=15 * MINUTE,
        display=Display(1280, 800), display_max=Display(2560, 1600), memory_mb_min=1024,
    ),
    Surface.ANDROID: Limits(
        memory_mb=4096, memory_mb_max=8192, vcpus=4, vcpus_max=8,
        ttl_s=2 * HOUR, ttl_s_max=2 * HOUR, idle_s=15 * MINUTE, idle_s_max=15 * MINUTE,
        display=Display(1080, 1920), display_max=Display(1600, 2560), memory_mb_min=2048,
    ),
    Surface.IOS: Limits(
        memory_mb=4096, memory_mb_max=8192, vcpus=4, vcpus_max=8,
        ttl_s=2 * HOUR, ttl_s_max=2 * HOUR, idle_s=15 * MINUTE, idle_s_max=15 * MINUTE,
        display=None, display_max=None, memory_mb_min=2048,
    ),
}

#: Browser engines other than Chromium need more memory (RIGS.md §7).
ENGINE_MEMORY_MB: dict[Engine, int] = {
    Engine.CHROMIUM: 2048,
    Engine.FIREFOX: 2560,
    Engine.WEBKIT: 2560,
}

#: The desktop image's session user (images/desktop/customize.sh, lightdm autologin): who runs
#: a computer rig's ``exec`` unless it asks for root.
DESKTOP_SESSION_USER = "rig"

#: Agent-lane stills are capped at this size; people may get up to the ceiling.
AGENT_STILL_MAX = Display(1280, 800)
HUMAN_STILL_MAX = Display(2560, 1600)

#: Surfaces this build of rigd can boot. Others parse and validate but are
#: refused at ``rig.open`` with an error that says so.
BUILT_SURFACES: frozenset[Surface] = frozenset({Surface.TERMINAL, Surface.BROWSER, Surface.COMPUTER})

#: Browser engines this build starts (the others parse, and are refused at ``rig.open``
#: naming ``engine``: their automation clients are not built yet).
BUILT_ENGINES: frozenset[Engine] = frozenset({Engine.CHROMIUM, Engine.FIREFOX, Engine.WEBKIT})
DEFAULT_ENGINE = Engine.CHROMIUM

#: The revision of the terminal toolkit baked into packs; part of the pack key.
TOOLS_REVISION = "tools-v1"
