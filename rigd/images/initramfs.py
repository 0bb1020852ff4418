"""The initramfs: busybox, the virtio/ext4 modules, and the stage-1 ``/init``.

Module loading: rather than ship ``modprobe`` and its index files, the
builder resolves each wanted module's dependencies from ``modules.dep`` (and
``pre:`` soft dependencies from ``modules.softdep``) at build time and writes
the load order to ``/etc/rigd-modules``; ``/init`` runs ``insmod`` on each
line. This is the fastest path under TCG (no index parsing in the guest) and
leaves nothing to resolve at boot. Wanted modules that are built into the
kernel (``modules.builtin``) are skipped.

The archive is written by :mod:`rigd.images.cpio` and left uncompressed: the
kernel image is loaded by QEMU (not decompressed by the guest), and an
uncompressed initramfs avoids an emulated gunzip at every boot (measured in
docs/images.md).
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import RigdError
from rigd.images import cpio, debs
from rigd.images.cache import READ_ONLY_MODE, Log, builder_sources, cached_build, recipe_key
from rigd.images.kernel import KernelAsset, kernel_key
from rigd.images.recipes import Recipes

#: Busybox applets /init calls by name (symlinks in /bin).
APPLETS = (
    "sh",
    "cat",
    "echo",
    "insmod",
    "mkdir",
    "mount",
    "umount",
    "poweroff",
    "reboot",
    "sleep",
    "switch_root",
    # the desktop init configures the rig's NIC before switch_root
    "ip",
    "rm",
    "test",
    "[",
)

#: Source date for the archive's timestamps when SOURCE_DATE_EPOCH is unset.
DEFAULT_EPOCH = 0


def norm(name: str) -> str:
    """Module names treat ``-`` and ``_`` alike (``virtio-rng`` is ``virtio_rng``)."""
    return name.replace("-", "_")


def module_name(relpath: str) -> str:
    base = relpath.rsplit("/", 1)[-1]
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            return norm(base[: -len(suffix)])
    raise RigdError(f"not a kernel module path: {relpath!r}")


@dataclass(frozen=True, slots=True)
class ModuleIndex:
    """What depmod knows: name → (path, direct deps), builtins, soft deps."""

    paths: dict[str, str]
    deps: dict[str, tuple[str, ...]]
    builtin: frozenset[str]
    softdep_pre: dict[str, tuple[str, ...]]

    @classmethod
    def parse(cls, modules_dep: str, modules_builtin: str = "", modules_softdep: str = "") -> ModuleIndex:
        paths: dict[str, str] = {}
        deps: dict[str, tuple[str, ...]] = {}
        for line in modules_dep.splitlines():
            if not line.strip():
                continue
            path, _, rest = line.partition(":")
            name = module_name(path)
            paths[name] = path
            deps[name] = tuple(module_name(d) for d in rest.split())
        builtin = frozenset(module_name(x) for x in modules_builtin.split())
        soft: dict[str, tuple[str, ...]] = {}
        for line in modules_softdep.splitlines():
            words = line.split()
            if len(words) < 3 or words[0] != "softdep":
                continue
            pre: list[str] = []
            mode = ""
            for w in words[2:]:
                if w in ("pre:", "post:"):
                    mode = w
                elif mode == "pre:":
                    pre.append(norm(w))
            soft[norm(words[1])] = tuple(pre)
        return cls(paths, deps, builtin, soft)

    def load_order(self, wanted: list[str]) -> list[str]:
        """Module paths to insmod, dependencies first, each once."""
        order: list[str] = []
        done: set[str] = set()
        active: set[str] = set()

        def visit(name: str, chain: tuple[str, ...]) -> None:
            if name in done or name in self.builtin:
                return
            if name not in self.paths:
                if chain:  # a soft dependency on something absent (e.g. an alias) is optional
                    return
                raise RigdError(
                    f"kernel module {name!r} is neither built in nor in modules.dep",
                    module=name,
                )
            if name in active:
                raise RigdError(f"module dependency cycle: {' -> '.join((*chain, name))}")
            active.add(name)
            for pre in self.softdep_pre.get(name, ()):
                visit(pre, (*chain, name))
            for dep in self.deps[name]:
                if dep not in self.paths and dep not in self.builtin:
                    raise RigdError(f"module {name!r} depends on unknown module {dep!r}")
                visit(dep, (*chain, name))
            active.discard(name)
            done.add(name)
            order.append(self.paths[name])

        for w in wanted:
            visit(norm(w), ())
        return order


def read_wanted(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        # busybox insmod cannot read compressed modules; decompress at build time.
        return lzma.decompress(data)
    if path.name.endswith((".ko.zst", ".ko.gz")):
        raise RigdError(f"compressed module {path.name} is not supported; only .ko and .ko.xz")
    return data


def initramfs_key(r: Recipes) -> str:
    files = [
        r.busybox_lock,
        *sorted(p for p in r.initramfs_dir.rglob("*") if p.is_file()),
        *builder_sources("initramfs", "cpio", "debs"),
    ]
    return recipe_key(files, root=r.root, extra=[f"kernel={kernel_key(r)}"])


def busybox_binary(r: Recipes, cache_dir: Path, work: Path, log: Log) -> bytes:
    lock = debs.load_lock(r.busybox_lock)
    (deb,) = debs.fetch([lock.get("busybox-static")], cache_dir, r.sources, log)
    debs.extract(deb, work)
    bb = work / "bin" / "busybox"
    if not bb.is_file():
        raise RigdError(f"{deb.name} has no bin/busybox")
    return bb.read_bytes()


def entries(*, init: bytes, busybox: bytes, modules: list[tuple[str, bytes]]) -> list[cpio.Entry]:
    """The archive's members (pure; ``modules`` is the load order of (name, bytes))."""
    out = [
        cpio.directory("bin"),
        cpio.directory("dev"),
        cpio.chardev("dev/console", 5, 1),  # the kernel opens it for init's stdio
        cpio.chardev("dev/null", 1, 3, 0o666),
        cpio.directory("etc"),
        cpio.directory("lib"),
        cpio.directory("lib/modules"),
        cpio.directory("newroot"),
        cpio.directory("proc"),
        cpio.directory("sys"),
        cpio.regular("bin/busybox", busybox, 0o755),
        cpio.regular("init", init, 0o755),
        cpio.regular("etc/rigd-modules", "".join(f"{name}\n" for name, _ in modules).encode()),
    ]
    out += [cpio.symlink(f"bin/{a}", "busybox") for a in APPLETS]
    out += [cpio.regular(f"lib/modules/{name}", data) for name, data in modules]
    return out


def _build(r: Recipes, kernel: KernelAsset, cache_dir: Path, out: Path, log: Log, epoch: int) -> None:
    md = kernel.modules_dir
    index = ModuleIndex.parse(
        (md / "modules.dep").read_text(),
        (md / "modules.builtin").read_text(),
        (md / "modules.softdep").read_text() if (md / "modules.softdep").is_file() else "",
    )
    order = index.load_order(read_wanted(r.initramfs_dir / "modules.txt"))
    modules: list[tuple[str, bytes]] = []
    for rel in order:
        name = module_name(rel) + ".ko"
        modules.append((name, _module_bytes(md / rel)))
    bb = busybox_binary(r, cache_dir, out / ".busybox", log)
    debs.remove_tree(out / ".busybox")
    members = entries(init=(r.initramfs_dir / "init").read_bytes(), busybox=bb, modules=modules)
    with (out / "initrd.img").open("wb") as f:
        cpio.write_newc(members, f, mtime=epoch)
    (out / "initrd.img").chmod(READ_ONLY_MODE)
    size = (out / "initrd.img").stat().st_size
    log(f"initramfs: {len(modules)} modules ({', '.join(n for n, _ in modules)}), {size >> 10} KiB")


def build_initramfs(
    r: Recipes, kernel: KernelAsset, cache_dir: Path, log: Log, epoch: int = DEFAULT_EPOCH
) -> Path:
    d = cached_build(
        cache_dir / "initrd",
        initramfs_key(r),
        "initramfs",
        lambda out: _build(r, kernel, cache_dir, out, log, epoch),
        log,
    )
    return d / "initrd.img"
