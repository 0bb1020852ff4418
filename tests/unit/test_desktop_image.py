"""The desktop image recipe and builder pieces that need no build (no mmdebstrap run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rigd.errors import RigdError
from rigd.images.debs import load_lock
from rigd.images.desktop import NOT_BUILT, desktop_key, find_desktop, load_recipe, mmdebstrap_argv
from rigd.images.initramfs import initramfs_key
from rigd.images.manifest import parse_marker
from rigd.images.recipes import Recipes, read_packages
from rigd.images.terminal import terminal_key


@pytest.fixture
def r() -> Recipes:
    return Recipes.find()


def test_recipe_declares_a_protocol_2_computer_image_at_1280x800(r: Recipes) -> None:
    recipe = load_recipe(r)
    assert recipe["guest_protocol"] == 2 and recipe["surface"] == "computer"
    assert recipe["display"] == {"width": 1280, "height": 800}
    assert 'APT::Install-Recommends "false"' in recipe["apt_options"]
    assert any(o.startswith("path-exclude=/usr/share/man") for o in recipe["dpkg_options"])
    assert any(o.startswith("path-exclude=/usr/share/locale") for o in recipe["dpkg_options"])


def test_packages_cover_the_issue(r: Recipes) -> None:
    pkgs = set(read_packages(r.desktop_dir / "packages.txt"))
    wanted = {
        "xserver-xorg-core", "xfce4-session", "xfwm4", "xfce4-panel", "lightdm",
        "chromium", "firefox-esr", "epiphany-browser", "webkit2gtk-driver",
        "at-spi2-core", "python3-pyatspi", "xclip", "xdotool", "python3-pil", "python3-xlib",
        "x11-xserver-utils", "qemu-guest-agent",
    }
    assert wanted <= pkgs
    # The CLI toolkit of the terminal image is baked in too (RIGS.md §3).
    assert set(read_packages(r.terminal_dir / "packages.txt")) <= pkgs
    # The kernel comes from the pinned .deb, never from today's archive.
    assert not any(p.startswith("linux-image") for p in pkgs)


def test_kernel_is_the_pinned_generic_kernel(r: Recipes) -> None:
    lock = load_lock(r.desktop_kernel_lock)
    (pin,) = lock.packages
    assert pin.name.startswith("linux-image-") and pin.name.endswith("-amd64")
    assert "cloud" not in pin.name  # the cloud kernel has no DRM and no USB/virtio HID
    assert (r.desktop_kernel_lock, "linux-image-") in r.locks()  # `pin` re-pins it


@pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="needs mmdebstrap")
def test_mmdebstrap_argv_pins_the_kernel_and_orders_the_hooks(r: Recipes, tmp_path: Path) -> None:
    deb = tmp_path / "linux-image-6.1.0-57-amd64_6.1.192-3_abc.deb"
    argv = mmdebstrap_argv(
        r, load_recipe(r), tmp_path / "root", deb, debs_in=tmp_path / "in", debs_out=tmp_path / "out",
    )
    assert "--mode=root" in argv and "--format=directory" in argv and "--variant=minbase" in argv
    include = next(a for a in argv if a.startswith("--include="))
    assert include.endswith("," + str(deb))
    hooks = [a for a in argv if a.startswith("--customize-hook=")]
    assert "autoclean" in hooks[0] and "sync-out" in hooks[1] and "customize.sh" in hooks[2]
    assert argv[-3:] == ["bookworm", str(tmp_path / "root"), str(r.sources)]


def test_shell_scripts_parse(r: Recipes) -> None:
    for script in (r.desktop_dir / "customize.sh", r.desktop_dir / "initramfs" / "init"):
        subprocess.run(["sh", "-n", str(script)], check=True)


def test_agent_unit_gets_the_session_environment(r: Recipes) -> None:
    unit = (r.desktop_dir / "rootfs/etc/systemd/system/rigd-agent.service").read_text()
    # The agent is the tools disk's (mounted at /.rigd by the initramfs), run by the image's python3.
    assert "ExecStart=/usr/bin/python3 -I /.rigd/agent/rigd_agent.py --port auto" in unit
    assert "ConditionPathExists=/.rigd/agent/rigd_agent.py" in unit
    init = (r.desktop_dir / "initramfs" / "init").read_text()
    assert "rigd.tools=1" in init and "/dev/vdb /newroot/.rigd" in init
    assert "EnvironmentFile=/etc/rigd/session.env" in unit
    env = (r.desktop_dir / "rootfs/etc/rigd/session.env").read_text()
    assert "DISPLAY=:0" in env and "XAUTHORITY=/var/run/lightdm/root/:0" in env
    lightdm = (r.desktop_dir / "rootfs/etc/lightdm/lightdm.conf.d/50-rigd.conf").read_text()
    assert "autologin-user=rig" in lightdm and "-s 0 -dpms" in lightdm


def test_recipe_cmdline_is_a_valid_marker_cmdline(r: Recipes) -> None:
    recipe = load_recipe(r)
    marker = parse_marker(
        '{"format": "rigd.image-marker/v1", "surface": "computer", "guest_protocol": 2,'
        ' "kernel_release": "6.1.0-57-amd64", "display": {"width": 1280, "height": 800},'
        ' "kernel": "/boot/vmlinuz-6.1.0-57-amd64", "initrd": "/boot/rigd/initrd.img",'
        f' "cmdline": {list(recipe["cmdline"])!r}}}'.replace("'", '"')
    )
    assert "rw" in marker.cmdline


def test_keys_are_separate_from_the_terminal_assets(r: Recipes) -> None:
    key = desktop_key(r)
    assert len(key) == 20 and key not in (terminal_key(r), initramfs_key(r))


def test_find_without_a_build_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(RigdError) as exc:
        find_desktop(tmp_path)
    assert exc.value.message == NOT_BUILT
