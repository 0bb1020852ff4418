"""Custom terminal images (rigd.backends.smolvm, rigd.server.pulls): the recipe of a registry
image, the terminal contract read from the guest's answer, and pulls joined or skipped."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.base import ExecResult, MachineSpec
from rigd.backends.browser import BROWSER_CONTRACT
from rigd.backends.qemu import QemuConfig
from rigd.backends.recipe import NoScreen
from rigd.backends.smolvm import (
    CONTRACT_SCRIPT,
    ContractCheck,
    TerminalImages,
    contract_problem,
    contract_script,
)
from rigd.errors import BackendError, RigdError
from rigd.images import TerminalAssets
from rigd.images.browser import add_browser_user
from rigd.images.registry import RegistryError, parse_reference
from rigd.model import Accel, Surface
from rigd.server.pulls import PullJobs
from tests.unit.test_pulls import DIGEST, ScriptedClient

pytestmark = pytest.mark.timeout(30)

BUILT = "sha256:" + "0" * 64
REF = "127.0.0.1:5000/team/runner:24.04"


def assets(tmp: Path) -> TerminalAssets:
    f = tmp / "f"
    f.write_bytes(b"x")
    return TerminalAssets(kernel=f, initrd=f, tools=f, oci_layout=tmp, image_digest=BUILT,
                          kernel_release="6.1")


def spec(image: str | None) -> MachineSpec:
    return MachineSpec(rig_id="rig_t", surface=Surface.TERMINAL, memory_mb=512, vcpus=1, image=image)


class Packer:
    def __init__(self, rootfs: Path) -> None:
        self.rootfs = rootfs
        self.asked: list[str] = []

    async def __call__(self, reference: str, progress: Any) -> tuple[str, Path]:
        self.asked.append(reference)
        progress("pulling image")
        return DIGEST, self.rootfs


class Guest:
    """A machine whose exec answers the contract check with a planned report."""

    def __init__(self, report: str, exit_code: int = 0) -> None:
        self.report, self.exit_code = report, exit_code
        self.argv: list[str] = []

    async def exec(self, argv: list[str], **_: Any) -> ExecResult:
        self.argv = list(argv)
        return ExecResult(self.exit_code, None, False, self.report.encode(), b"boom", False, False, 1)


async def test_a_custom_image_is_its_own_pack_booted_cold_and_checked_once(tmp_path: Path) -> None:
    pack = tmp_path / "pack"
    pack.mkdir()
    rootfs = pack / "rootfs.img"
    rootfs.write_bytes(b"ext4")
    packer = Packer(rootfs)
    config = QemuConfig(data_dir=tmp_path, accel=Accel.TCG, warm_starts=True)
    images = TerminalImages(config, assets(tmp_path), lambda _p: tmp_path / "built.img", packer)
    steps: list[str] = []
    built = await images.recipe(spec(None), steps.append)
    assert built.backing == tmp_path / "built.img" and built.identity(spec(None)).image == BUILT
    assert built.warm_eligible(spec(None)) and packer.asked == []
    custom = await images.recipe(spec(REF), steps.append)
    assert packer.asked == [REF] and "pulling image" in steps
    assert custom.backing == rootfs and custom.identity(spec(REF)).image == DIGEST
    assert not custom.warm_eligible(spec(REF))  # no snapshots of an admin-replaceable image
    guest = Guest("os Ubuntu 24.04 LTS\napt\n")
    driver = custom.driver(guest)  # type: ignore[arg-type]
    assert isinstance(driver, ContractCheck)
    await driver.ready(steps.append, warm=False, left_s=60)
    assert guest.argv == ["/.rigd/bin/busybox", "sh", "-c", CONTRACT_SCRIPT]
    assert (pack / "contract.json").is_file()
    # Passed once: later rigs of this pack skip the check.
    later = custom.driver(Guest("missing bash\n"))  # type: ignore[arg-type]
    assert type(later) is NoScreen


async def test_a_failed_contract_names_what_is_missing_and_is_not_recorded(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.img"
    rootfs.write_bytes(b"ext4")
    config = QemuConfig(data_dir=tmp_path, accel=Accel.TCG, warm_starts=False)
    images = TerminalImages(config, assets(tmp_path), lambda _p: rootfs, Packer(rootfs))
    recipe = await images.recipe(spec(REF), lambda _s: None)
    driver = recipe.driver(Guest("missing git\nmissing socat\nos Alpine Linux v3.20\n"))  # type: ignore[arg-type]
    with pytest.raises(BackendError) as exc:
        await driver.ready(lambda _s: None, warm=False, left_s=60)
    assert "lacks git, socat" in exc.value.message and "Alpine Linux v3.20" in exc.value.message
    assert not (tmp_path / "contract.json").exists()
    broken = recipe.driver(Guest("", exit_code=127))  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="could not run"):
        await broken.ready(lambda _s: None, warm=False, left_s=60)


def test_contract_problem_says_apt_is_not_an_install_yet() -> None:
    assert contract_problem(REF, "apt\nos Debian GNU/Linux 12 (bookworm)\n") is None
    text = contract_problem(REF, "missing curl\napt\n")
    assert text is not None and "lacks curl" in text and "apt-get" in text
    assert "apt-get" not in (contract_problem(REF, "missing bash\n") or "")


async def test_a_server_without_pulls_refuses_a_custom_image(tmp_path: Path) -> None:
    config = QemuConfig(data_dir=tmp_path, accel=Accel.TCG, warm_starts=False)
    images = TerminalImages(config, assets(tmp_path), lambda _p: tmp_path / "x")
    with pytest.raises(BackendError, match="cannot boot registry images"):
        await images.recipe(spec(REF), lambda _s: None)


async def test_ensure_pulls_once_then_finds_the_pinned_image(tmp_path: Path) -> None:
    client = ScriptedClient()
    client.hold = True
    jobs = PullJobs(tmp_path, client)  # type: ignore[arg-type]
    ref = parse_reference(REF)
    seen: list[list[str]] = [[], []]
    got: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(jobs.run)

        async def want(i: int) -> None:
            got.append(await jobs.ensure(ref, seen[i].append))

        async def watchers(n: int) -> None:
            with trio.fail_after(5):
                while sum(len(j.watchers) for j in jobs.running()) < n:
                    await trio.sleep(0.01)

        nursery.start_soon(want, 0)
        await watchers(1)
        nursery.start_soon(want, 1)  # the same reference while it is pulled: joins the pull
        await watchers(2)
        assert len(jobs.running()) == 1
        client.release.set()
        with trio.fail_after(5):
            while len(got) < 2:
                await trio.sleep(0.01)
        assert got == [DIGEST, DIGEST]
        assert any("400" in line or "0.0 MB" in line for line in seen[0])
        # Once recorded in the store, a tag is not resolved again: no new pull starts.
        manifest = b'{"schemaVersion": 2}'
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        await jobs.store.put_document(manifest, digest)
        jobs.store.record(ref, digest, None)
        assert await jobs.ensure(ref, lambda _s: None) == digest
        assert [j.state.value for j in jobs._jobs.values()] == ["done"]
        client.fail = RegistryError("manifest unknown", status=404)
        other = parse_reference("127.0.0.1:5000/team/other:1")
        with pytest.raises(RigdError, match=re.escape("pulling 127.0.0.1:5000/team/other:1 failed: manifest unknown")):
            await jobs.ensure(other, lambda _s: None)
        nursery.cancel_scope.cancel()


def _tree(tmp: Path, passwd: str, group: str = "root:x:0:\n") -> tuple[Path, Path]:
    tree = tmp / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "passwd").write_text(passwd)
    (tree / "etc" / "group").write_text(group)
    (tree / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    return tree, tmp / "fakeroot.state"


def test_a_custom_browser_image_gets_rigds_browser_user_once(tmp_path: Path) -> None:
    tree, state = _tree(tmp_path, "root:x:0:0:root:/root:/bin/bash\n")
    add_browser_user(tree, state)
    passwd = (tree / "etc" / "passwd").read_text().splitlines()
    assert passwd[-1] == "browser:x:1000:1000:rigd browser:/home/browser:/usr/sbin/nologin"
    assert (tree / "etc" / "group").read_text().splitlines()[-1] == "browser:x:1000:"
    assert (tree / "etc" / "shadow").read_text().splitlines()[-1].startswith("browser:!:")
    home = tree / "home" / "browser"
    assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
    if os.geteuid() == 0:
        assert (home.stat().st_uid, home.stat().st_gid) == (1000, 1000)
    add_browser_user(tree, state)  # an image that has the user keeps it as it is
    assert [u for u in (tree / "etc" / "passwd").read_text().splitlines() if u.startswith("browser:")] == [
        passwd[-1]]


@pytest.mark.parametrize(("passwd", "says"), [
    ("root:x:0:0::/root:/bin/sh\nubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n", "uid 1000 is 'ubuntu'"),
    ("browser:x:1001:1001::/home/browser:/bin/sh\n", "has uid 1001"),
])
def test_a_custom_browser_image_whose_uid_1000_is_taken_is_refused(tmp_path: Path, passwd: str,
                                                                    says: str) -> None:
    tree, state = _tree(tmp_path, passwd)
    with pytest.raises(RigdError, match=re.escape(says)):
        add_browser_user(tree, state)
    assert (tree / "etc" / "passwd").read_text() == passwd  # nothing written


def test_a_custom_browser_image_never_edits_through_a_symlink(tmp_path: Path) -> None:
    tree, state = _tree(tmp_path, "root:x:0:0::/root:/bin/sh\n")
    outside = tmp_path / "outside-passwd"
    outside.write_text("root:x:0:0::/root:/bin/sh\n")
    (tree / "etc" / "passwd").unlink()
    (tree / "etc" / "passwd").symlink_to(outside)
    with pytest.raises(RigdError, match="symlink"):
        add_browser_user(tree, state)
    assert outside.read_text() == "root:x:0:0::/root:/bin/sh\n"
    tree2, state2 = _tree(tmp_path / "b", "root:x:0:0::/root:/bin/sh\n")
    (tree2 / "home").symlink_to(tmp_path)
    with pytest.raises(RigdError, match="/home is a symlink"):
        add_browser_user(tree2, state2)


def test_the_browser_contract_checks_chromium_by_path_and_the_launch_tools() -> None:
    script = contract_script(BROWSER_CONTRACT)
    assert "[ -x /usr/bin/chromium ] || echo 'missing /usr/bin/chromium'" in script
    assert "command -v setpriv >/dev/null 2>&1 || echo 'missing setpriv'" in script
    text = contract_problem(REF, "missing /usr/bin/chromium\napt\n", BROWSER_CONTRACT, "browser")
    assert text is not None and "not a browser image" in text and "lacks /usr/bin/chromium" in text
