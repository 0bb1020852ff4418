"""The tools disk: the server's own read-only ext4 mounted at ``/.rigd`` in a rig.

It never comes from the image, so the agent runs in any image — one with no
Python and even no libc. Layout (paths inside the disk; ``/.rigd/...`` in the
guest)::

    bin/busybox                    static; stage-2 init and the fallback shell
    init                           stage-2 init (busybox sh script)
    agent/rigd_agent.pyz           the guest agent, one zipapp (rigd.images.agent_app)
    agent/rigd_agent.py            its launcher: runs the agent from the zipapp
    agent/rigd_mux.py              the port multiplexer's (terminal rigs; started by the host)
    lib/x86_64-linux-gnu/...       libc6, libgcc-s1 and the loader
    usr/bin/python3.11             Debian's interpreter
    usr/lib/python3.11/...         its stdlib, precompiled to .pyc
    usr/lib/x86_64-linux-gnu/...   libssl3, libffi8, libsqlite3-0, ...
    VERSION                        JSON: pins and the agent's hash

The interpreter is started through the disk's own loader with
``--library-path``, so nothing of the image's libc is used by the agent, and
nothing of ours leaks to the processes it spawns.

The stdlib is byte-compiled at build time with the same interpreter and
``unchecked-hash`` pycs: the disk is read-only in the guest, so Python could
never write its caches there, and compiling every import at each boot would
cost seconds under TCG.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import RigdError
from rigd.images import agent_app, debs
from rigd.images.cache import READ_ONLY_MODE, Log, builder_sources, cached_build, recipe_key
from rigd.images.ext4 import MiB, make_ext4, tree_usage
from rigd.images.initramfs import busybox_binary
from rigd.images.recipes import Recipes

#: Trimmed from the unpacked debs: never used by the agent, and they cost disk
#: and build time (gconv: Python's codecs do not use glibc's iconv modules).
PRUNE = (
    "usr/share",
    "usr/lib/python3.11/test",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/turtledemo",
    "usr/lib/python3.11/ensurepip",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/pydoc_data",
    "usr/lib/x86_64-linux-gnu/gconv",
    "usr/lib/x86_64-linux-gnu/audit",
    "lib64",  # its loader link is absolute, i.e. the *image's* loader
    "sbin",
    "etc",
    "var",
    "usr/sbin",
)

LOADER = "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
LIBRARY_PATH = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")


@dataclass(frozen=True, slots=True)
class ToolsAsset:
    image: Path
    agent_is_real: bool


def tools_key(r: Recipes) -> str:
    real = r.agent_is_real()
    files = [
        r.runtime_lock,
        r.busybox_lock,
        r.sources,
        r.tools_dir / "init",
        *(agent_app.package_files(r.agent) if real else [r.standin_agent]),
        *builder_sources("tools", "debs", "ext4", "initramfs", "agent_app"),
    ]
    return recipe_key(files, root=r.root, extra=[f"agent-real={real}"])


def python_command(root: Path, *args: str) -> list[str]:
    """Run the runtime unpacked at ``root`` (on the host, for byte-compiling)."""
    libs = ":".join(str(root / p) for p in LIBRARY_PATH)
    return [str(root / LOADER), "--library-path", libs, str(root / "usr/bin/python3.11"), *args]


def _unpack_runtime(r: Recipes, cache_dir: Path, tree: Path, log: Log) -> list[debs.DebPin]:
    lock = debs.load_lock(r.runtime_lock)
    paths = debs.fetch(lock.packages, cache_dir, r.sources, log)
    for deb in paths:
        debs.extract(deb, tree)
    for rel in PRUNE:
        debs.remove_tree(tree / rel)
    bindir = tree / "usr" / "bin"
    for f in bindir.iterdir():
        if f.name != "python3.11":
            f.unlink()
    if not (tree / LOADER).is_file() or not (bindir / "python3.11").is_file():
        raise RigdError(f"{r.runtime_lock}: the pinned debs lack the loader or python3.11")
    return list(lock.packages)


def _byte_compile(tree: Path) -> None:
    cmd = python_command(
        tree,
        "-I",
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",
        "--invalidation-mode",
        "unchecked-hash",
        "-s",
        str(tree / "usr"),
        "-p",
        "/.rigd/usr",
        str(tree / "usr/lib/python3.11"),
    )
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # compileall exits 1 when a file fails; a few stdlib files for other
    # platforms never compile, and that is fine, but a broken interpreter is not.
    if res.returncode not in (0, 1) or not any((tree / "usr/lib/python3.11").rglob("*.pyc")):
        raise RigdError(f"byte-compiling the tools disk's stdlib failed: {res.stderr[-2000:]}")
    check = subprocess.run(
        python_command(
            tree,
            "-I",
            "-c",
            "import json, socket, ssl, sqlite3, pty, subprocess, "
            "select, signal, ctypes, hashlib, zlib, lzma, bz2, decimal, uuid; "
            "print('ok')",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if check.stdout.strip() != "ok":
        raise RigdError(f"the tools disk's Python runtime is incomplete: {check.stderr[-2000:]}")


def _build(r: Recipes, cache_dir: Path, out: Path, log: Log, epoch: int) -> None:
    tree = out / ".tree"
    tree.mkdir()
    pins = _unpack_runtime(r, cache_dir, tree, log)
    _byte_compile(tree)
    (tree / "bin").mkdir(exist_ok=True)
    bb = busybox_binary(r, cache_dir, out / ".busybox", log)
    debs.remove_tree(out / ".busybox")
    (tree / "bin" / "busybox").write_bytes(bb)
    (tree / "bin" / "busybox").chmod(0o755)
    shutil.copyfile(r.tools_dir / "init", tree / "init")
    (tree / "init").chmod(0o755)
    real = r.agent_is_real()
    if real:
        agent = agent_app.write_app(r.agent, tree / "agent")
    else:
        (tree / "agent").mkdir()
        agent = tree / "agent" / "rigd_agent.py"
        shutil.copyfile(r.standin_agent, agent)
        log(f"tools: WARNING guest-agent/rigd_agent/ is missing; using the stand-in {r.standin_agent}")
    version = {
        "packages": [p.to_json() for p in pins],
        "agent": {
            "source": f"guest-agent/rigd_agent/ as {agent_app.APP}" if real else "stand-in",
            "sha256": hashlib.sha256(agent.read_bytes()).hexdigest(),
        },
    }
    (tree / "VERSION").write_text(json.dumps(version, indent=1) + "\n")
    for dirpath, _dirnames, _files in os.walk(tree):
        os.utime(dirpath, (epoch, epoch))
    used, inodes = tree_usage(tree)
    make_ext4(
        tree,
        out / "tools.img",
        size_bytes=used + used // 4 + 16 * MiB,
        label="rigd-tools",
        journal=False,
        inodes=inodes + 1024,
        seed=f"tools:{out.name}",
        epoch=epoch,
    )
    (out / "tools.img").chmod(READ_ONLY_MODE)
    (out / "VERSION").write_text(json.dumps(version, indent=1) + "\n")
    debs.remove_tree(tree)
    log(
        f"tools: disk {(out / 'tools.img').stat().st_size >> 20} MiB "
        f"({used >> 20} MiB used), agent {'real' if real else 'STAND-IN'}"
    )


def build_tools(r: Recipes, cache_dir: Path, log: Log, epoch: int = 0) -> ToolsAsset:
    key = tools_key(r)
    d = cached_build(
        cache_dir / "tools", key, "tools disk", lambda out: _build(r, cache_dir, out, log, epoch), log
    )
    return ToolsAsset(d / "tools.img", r.agent_is_real())
