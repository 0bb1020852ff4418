"""Custom terminal images per workspace (RIGS.md §3) on real rigs: an admin names a registry
image in ``rigs.smolvm.execImage`` and the workspace's terminal rigs boot it (pulled on the
host from Debian's ``docker-registry`` on loopback, packed, checked against the terminal
contract at its first boot); an image without the contract's tools fails naming them; a
value that is not a registry reference is refused at the field, and one planted in the store
is ignored visibly while the built-in image boots."""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.images import find_assets
from rigd.images.browser import Engine, build_browser
from tests.integration.conftest import SHARED_PACKS, ClientError, Server, exec_, make_data_dir, serving
from tests.integration.local_registry import Entry, Layout, LocalRegistry, layer_tar, running

pytestmark = [pytest.mark.timeout(900)]

KEY = "rigs.smolvm.execImage"
OS_RELEASE = (b'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
              b'VERSION="24.04.1 LTS (Noble Numbat)"\nID=ubuntu\nID_LIKE=debian\n')
TOOLKIT = ("bash", "git", "curl", "socat", "vi", "nano", "less", "file", "unzip", "ps")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalRegistry, dict[str, str]]]:
    """The registry with two images: the built terminal image with an Ubuntu os-release on
    top ("ubuntu-like"), and one with nothing but an os-release ("tiny")."""
    work = tmp_path_factory.mktemp("custom-image")
    assets = find_assets()
    layout = Layout(work / "layout")
    like = layout.extend(assets.oci_layout, assets.image_digest, [layer_tar([
        Entry("etc", kind="dir"), Entry("etc/os-release", OS_RELEASE),
        Entry("etc/lsb-release", b"DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE=24.04\n")])])
    layout.tag(like, "24.04")
    tiny = layout.image([layer_tar([Entry("etc", kind="dir"),
                                    Entry("etc/os-release", b'PRETTY_NAME="Tiny 1"\nID=tiny\n')])])
    layout.tag(tiny, "1")
    with running(work) as reg:
        reg.push(layout.root, "24.04", "team/ubuntu-like")
        reg.push(layout.root, "1", "team/tiny")
        yield reg, {"like": like["digest"], "tiny": tiny["digest"]}


def settled(srv: Server, rig_id: str, deadline_s: float = 600) -> dict[str, Any]:
    """The rig once it is ready or failed (a first boot pulls and packs the image first)."""
    deadline = time.monotonic() + deadline_s
    while True:
        rig = srv.call("rig.get", {"rigId": rig_id})
        if rig["phase"] in ("ready", "failed"):
            return dict(rig)
        assert time.monotonic() < deadline, rig
        time.sleep(0.5)


def open_in(srv: Server, workspace: str) -> dict[str, Any]:
    rig = srv.call("rig.open", {"workspace": workspace, "surface": "terminal", "wait": False})
    return settled(srv, rig["id"])


@pytest.fixture(scope="module")
def custom_server(registry: tuple[LocalRegistry, dict[str, str]]) -> Iterator[Server]:
    """One server for the module's tests (the flags are the same for both)."""
    reg, _ = registry
    with serving(make_data_dir(), "--no-warm-starts", "--network", "none", "--insecure-registry", reg.host) as srv:
        yield srv


def test_a_workspace_boots_its_registry_image_and_bad_values_never_boot(
        registry: tuple[LocalRegistry, dict[str, str]], custom_server: Server) -> None:
    reg, digests = registry
    ref = f"{reg.host}/team/ubuntu-like:24.04"
    # The contract check runs at a pack's first boot: forget a pass recorded by an earlier run.
    (SHARED_PACKS / f"{digests['like'].removeprefix('sha256:')}-tools-v1" / "contract.json").unlink(missing_ok=True)
    srv = custom_server
    opened: list[str] = []
    try:
        # Not a registry reference: refused at the field, nothing stored.
        for bad in ("/var/tmp/ubuntu.qcow2", "oci-archive:u.tar", "--privileged", "ubuntu.tar"):
            err = srv.error("workspace.settings.set", {"workspace": "default", "key": KEY, "value": bad})
            assert err["data"]["field"] == "value", err
        assert srv.call("workspace.settings.get", {"workspace": "default"})["settings"][KEY] is None
        srv.call("workspace.settings.set", {"workspace": "default", "key": KEY, "value": ref})

        rig = open_in(srv, "default")
        opened.append(rig["id"])
        assert rig["phase"] == "ready", rig
        assert (rig["imageRef"], rig["image"]) == (ref, digests["like"])
        shown = exec_(srv, rig["id"], argv=["cat", "/etc/os-release"])
        assert shown["exitCode"] == 0 and 'PRETTY_NAME="Ubuntu 24.04.1 LTS"' in shown["stdout"]["text"], shown
        tools = exec_(srv, rig["id"], argv=["bash", "-c", "for t in " + " ".join(TOOLKIT)
                                            + "; do command -v $t >/dev/null || echo missing $t; done"])
        assert tools["exitCode"] == 0 and tools["stdout"]["text"] == "", tools
        pack = srv.data_dir / "rigs" / "smolvm-packs" / f"{digests['like'].removeprefix('sha256:')}-tools-v1"
        assert json.loads((pack / "contract.json").read_text())["digest"] == digests["like"]
        pulled = srv.call("image.list", {"source": "registry"})
        assert [(i["reference"], i["digest"]) for i in pulled] == [(ref, digests["like"])]
        # The image is in use: not removed from under the rig.
        err = srv.error("image.rm", {"ref": ref})
        assert rig["id"] in err["message"], err

        # An image without the contract's tools fails, naming what it lacks.
        tiny_ws = srv.call("workspace.create", {"name": "tiny"})["id"]
        srv.call("workspace.settings.set", {"workspace": tiny_ws, "key": KEY,
                                            "value": f"{reg.host}/team/tiny:1"})
        failed = open_in(srv, tiny_ws)
        opened.append(failed["id"])
        assert failed["phase"] == "failed", failed
        assert "lacks bash, git, curl, socat" in failed["failure"] and "Tiny 1" in failed["failure"], failed

        # A value planted in the store (never through the field): ignored, visibly; the default boots.
        planted_ws = srv.call("workspace.create", {"name": "planted"})["id"]
        with sqlite3.connect(srv.data_dir / "server.db") as db:
            admin = db.execute("SELECT id FROM users ORDER BY created_at LIMIT 1").fetchone()[0]
            db.execute("INSERT INTO workspace_settings VALUES (?, ?, ?, ?, ?)",
                       (planted_ws, KEY, json.dumps("docker-archive:/tmp/evil.tar"), "2026-12-02T00:00:00Z",
                        admin))
        got = srv.call("workspace.settings.get", {"workspace": planted_ws})
        assert got["settings"][KEY] is None and "docker-archive" in got["ignored"][KEY], got
        plain = open_in(srv, planted_ws)
        opened.append(plain["id"])
        assert plain["phase"] == "ready", plain
        assert plain["imageRef"] is None and plain["image"] == find_assets().image_digest
        assert any(KEY in n and "built-in image boots" in n for n in plain["notes"]), plain["notes"]
        built = exec_(srv, plain["id"], argv=["cat", "/etc/os-release"])
        assert built["exitCode"] == 0 and "Ubuntu" not in built["stdout"]["text"], built
    finally:  # idle guests would only compete with the next test's boot
        for rig_id in opened:
            with contextlib.suppress(ClientError):
                srv.call("rig.close", {"rigId": rig_id})


BROWSER_KEY = "rigs.smolvm.browserImage"


def files_of(layout: Path, digest: str, names: set[str]) -> dict[str, bytes]:
    """The newest content of ``names`` across an image's layers (no whiteouts in ours)."""
    def blob(d: str) -> Path:
        return layout / "blobs" / "sha256" / d.removeprefix("sha256:")

    out: dict[str, bytes] = {}
    for layer in json.loads(blob(digest).read_bytes())["layers"]:
        with gzip.open(blob(layer["digest"])) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if name in names and member.isfile():
                    got = tar.extractfile(member)
                    assert got is not None
                    out[name] = got.read()
    return out


@pytest.fixture(scope="module")
def chromium_image(registry: tuple[LocalRegistry, dict[str, str]],
                   tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The built Chromium image **without** rigd's browser user (its passwd, group and shadow
    lines and its home removed) and with its own os-release: what an image from elsewhere
    looks like to rigd. Pushed as team/chromium:1; (reference, digest)."""
    reg, _ = registry
    built = build_browser(Engine.CHROMIUM, log=lambda m: print(f"[images] {m}")).boot  # cached: a hash
    etc = files_of(built.oci_layout, built.image_digest, {"etc/passwd", "etc/group", "etc/shadow"})
    assert b"browser:" in etc["etc/passwd"]

    def without_browser(text: bytes) -> bytes:
        return b"".join(line for line in text.splitlines(keepends=True) if not line.startswith(b"browser:"))

    layout = Layout(tmp_path_factory.mktemp("chromium-layout"))
    desc = layout.extend(built.oci_layout, built.image_digest, [layer_tar([
        Entry("etc", kind="dir"),
        Entry("etc/os-release", b'PRETTY_NAME="Custom Chromium 1"\nID=custom\nID_LIKE=debian\n'),
        Entry("etc/passwd", without_browser(etc["etc/passwd"])),
        Entry("etc/group", without_browser(etc["etc/group"])),
        Entry("etc/shadow", without_browser(etc["etc/shadow"]), mode=0o640),
        Entry("home", kind="dir"), Entry("home/.wh.browser")])])
    layout.tag(desc, "1")
    reg.push(layout.root, "1", "team/chromium")
    return f"{reg.host}/team/chromium:1", desc["digest"]


def test_a_workspace_boots_its_registry_chromium_image(chromium_image: tuple[str, str],
                                                      custom_server: Server) -> None:
    ref, digest = chromium_image
    packs = SHARED_PACKS / "rigs" / "browser-packs" / f"{digest.removeprefix('sha256:')}-custom-v1-chromium"
    (packs / "contract.json").unlink(missing_ok=True)
    srv = custom_server
    ws = srv.call("workspace.create", {"name": "browsers"})["id"]
    srv.call("workspace.settings.set", {"workspace": ws, "key": BROWSER_KEY, "value": ref})
    opened = srv.call("rig.open", {"workspace": ws, "surface": "browser", "wait": False})
    rig = settled(srv, opened["id"], 900)
    assert rig["phase"] == "ready", rig
    assert (rig["engine"], rig["imageRef"], rig["image"]) == ("chromium", ref, digest)

    def sh(command: str) -> str:
        out = srv.call("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                   "action": {"action": "exec", "command": command}})
        assert out["exitCode"] == 0, out
        return str(out["stdout"]["text"])

    assert 'PRETTY_NAME="Custom Chromium 1"' in sh("cat /etc/os-release")
    # rigd added its user to the pack (the image had none), and the engine runs as it.
    assert sh("id -u browser; stat -c %u:%a /home/browser").split() == ["1000", "1000:700"]
    assert sh("ps -o user= -p $(cat /run/rigd-browser.pid)").strip() == "browser"
    dom = srv.call("rig.act", {"rigId": rig["id"], "tool": "browser_use",
                               "action": {"action": "extract", "kind": "dom"}})
    assert "rigd browser rig" in dom["content"]["text"], dom
    assert json.loads((packs / "contract.json").read_text())["digest"] == digest
