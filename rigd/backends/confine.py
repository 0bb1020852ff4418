"""How QEMU processes are confined (RIGS.md §1).

Every QEMU runs under ``-sandbox on,obsolete=deny,elevateprivileges=deny,
spawn=deny,resourcecontrol=deny``. When the server runs as root, each rig's
QEMU also runs as its **own** unprivileged uid (from a high range that no
account uses), and everything the rig owns — its runtime directory, sockets
and disk overlay — belongs to that uid with mode 0700/0600. A compromised QEMU
therefore cannot open another rig's disk or sockets, nor anything of the
server's. Shared read-only inputs (kernel, initramfs, tools disk, pack root
images) are mode 0444 in directories that are traversable but not listable.

When the server is not root it cannot switch uids; QEMU then runs as the
server's own user, and the Rig's ``confinement`` says so.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import RigdError

#: Rig uids/gids start here: far above any normal account or subuid range.
UID_BASE = 1_900_000_000
UID_SLOTS = 65_536

SANDBOX_OPTS = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    extra_groups: tuple[int, ...]
    per_rig: bool

    def describe(self) -> dict[str, object]:
        return {
            "uid": self.uid,
            "perRigUid": self.per_rig,
            "seccomp": SANDBOX_OPTS,
        }


class UidPool:
    """Hands out one uid per live rig; a uid is reused only after its rig is gone."""

    def __init__(self) -> None:
        self._used: set[int] = set()
        self._next = 0

    def can_switch(self) -> bool:
        return os.geteuid() == 0

    def acquire(self) -> Identity:
        if not self.can_switch():
            return Identity(os.getuid(), os.getgid(), (), per_rig=False)
        for _ in range(UID_SLOTS):
            slot = self._next
            self._next = (self._next + 1) % UID_SLOTS
            uid = UID_BASE + slot
            if uid not in self._used:
                self._used.add(uid)
                return Identity(uid, uid, _kvm_groups(), per_rig=True)
        raise RigdError("no free rig uid (65536 rigs live?)")

    def release(self, identity: Identity) -> None:
        self._used.discard(identity.uid)


def _kvm_groups() -> tuple[int, ...]:
    """Supplementary group for /dev/kvm, when the device grants its group access."""
    try:
        st = os.stat("/dev/kvm")
    except OSError:
        return ()
    if st.st_mode & stat.S_IRWXG and st.st_gid != 0:
        return (st.st_gid,)
    return ()


def make_private_dir(path: Path, identity: Identity) -> None:
    """Create ``path`` (mode 0700) owned by the rig's identity."""
    path.mkdir(mode=0o700, parents=False, exist_ok=False)
    if identity.per_rig:
        os.chown(path, identity.uid, identity.gid)


def give(path: Path, identity: Identity, mode: int = 0o600) -> None:
    os.chmod(path, mode)
    if identity.per_rig:
        os.chown(path, identity.uid, identity.gid)


def make_shared_dir(path: Path) -> None:
    """A directory rig uids may traverse but not list (0711)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o711)  # noqa: S103 - rig uids traverse, never list


def check_reachable(path: Path) -> None:
    """Refuse a data directory that per-rig uids could not traverse.

    Only matters when running as root: e.g. ``/root/...`` is 0700, so a QEMU
    running as a rig uid could not open its own overlay there.
    """
    if os.geteuid() != 0:
        return
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & stat.S_IXOTH:
            raise RigdError(
                f"data directory {path} is not reachable by the unprivileged QEMU users: "
                f"{parent} is not traversable (mode {stat.filemode(mode)}). Choose a data "
                "directory outside a private home (the default for root is /var/lib/rigd) "
                f"or `chmod o+x {parent}`."
            )
