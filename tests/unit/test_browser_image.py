"""The browser image recipe, its keys and packs, the engine's launch and the DevTools
answer parser — everything that needs no build and no VM (the real boot is
tests/integration/test_browser_image.py)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rigd.backends.browser import IMAGE_ENGINE
from rigd.backends.browser_scripts import (
    FIREFOX_SEED,
    chromium_launch_script,
    devtools_probe_script,
    engine_watch_script,
    firefox_launch_script,
    relay_script,
    webkit_launch_script,
)
from rigd.backends.microvm_argv import microvm_argv
from rigd.errors import FieldError, RigdError
from rigd.images.browser import Engine, browser_image, find_browser, parse_engine
from rigd.images.pack import pack_dir
from rigd.images.recipes import Recipes
from rigd.images.terminal import (
    OciImage,
    deb_identity,
    image_key,
    local_repository,
    mmdebstrap_argv,
    terminal_image,
    terminal_key,
)
from rigd.protocols.devtools import MAX_VERSION_BYTES, parse_version

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def r() -> Recipes:
    return Recipes.find()


def copy_recipes(r: Recipes, tmp_path: Path) -> Recipes:
    """A checkout of just what the keys hash (images/ and the agent)."""
    shutil.copytree(r.images, tmp_path / "images")
    shutil.copytree(r.agent, tmp_path / "guest-agent" / r.agent.name, ignore=shutil.ignore_patterns("__pycache__"))
    return Recipes(tmp_path)


def test_every_engine_has_its_own_image_with_the_shared_packages(r: Recipes, tmp_path: Path) -> None:
    images = {e: browser_image(r, e, tmp_path) for e in Engine}
    keys = {image_key(r, i) for i in images.values()}
    assert len(keys) == 3  # never shared between engines
    for engine, img in images.items():
        assert img.kind == f"browser-{engine.value}"
        assert {"pulseaudio", "ffmpeg", "curl", engine.value} <= set(img.packages)
        assert not ({e.value for e in Engine} - {engine.value}) & set(img.packages)
        # the engine, then the builder's own interpreter (firefox_seed.py runs on it)
        assert img.hook_args == (engine.value, shlex.quote(sys.executable))
        assert img.recipe["config"]["Labels"]["dev.rigd.engine"] == engine.value
        assert img.debs_dir == tmp_path / "browser-debs" / engine.value


def test_an_engine_list_changes_only_that_engines_key(r: Recipes, tmp_path: Path) -> None:
    c = copy_recipes(r, tmp_path / "co")
    before = {e: image_key(c, browser_image(c, e, tmp_path)) for e in Engine}
    term = terminal_key(c)
    with (c.browser_dir / "engines" / "firefox-esr.txt").open("a") as f:
        f.write("fonts-noto-core\n")
    after = {e: image_key(c, browser_image(c, e, tmp_path)) for e in Engine}
    assert after[Engine.FIREFOX_ESR] != before[Engine.FIREFOX_ESR]
    assert after[Engine.CHROMIUM] == before[Engine.CHROMIUM]
    assert after[Engine.WEBKIT] == before[Engine.WEBKIT]
    (c.browser_dir / "packages.txt").write_text((c.browser_dir / "packages.txt").read_text() + "jq\n")
    assert all(image_key(c, browser_image(c, e, tmp_path)) != after[e] for e in Engine)
    assert terminal_key(c) == term  # the terminal image does not hash the browser recipe


def test_the_firefox_seed_script_is_in_firefoxs_key_only(r: Recipes, tmp_path: Path) -> None:
    c = copy_recipes(r, tmp_path / "co")
    before = {e: image_key(c, browser_image(c, e, tmp_path)) for e in Engine}
    with (c.browser_dir / "firefox_seed.py").open("a") as f:
        f.write("# changed\n")
    after = {e: image_key(c, browser_image(c, e, tmp_path)) for e in Engine}
    assert after[Engine.FIREFOX_ESR] != before[Engine.FIREFOX_ESR]
    assert after[Engine.CHROMIUM] == before[Engine.CHROMIUM] and after[Engine.WEBKIT] == before[Engine.WEBKIT]


def test_a_firefox_profile_starts_from_the_images_seed_then_rigds_prefs() -> None:
    lines = firefox_launch_script().splitlines()
    copy = next(i for i, line in enumerate(lines) if FIREFOX_SEED in line)
    assert lines[copy] == f'if [ -d {FIREFOX_SEED} ]; then cp -R {FIREFOX_SEED}/. "$p/profile/"; fi'
    # rigd's user.js is written after the copy (a seed never overrides it), then all is the user's.
    assert copy < next(i for i, line in enumerate(lines) if 'user.js"' in line)
    assert copy < next(i for i, line in enumerate(lines) if line.startswith("chown -R"))


def test_an_unknown_engine_is_a_field_error_never_the_default() -> None:
    assert parse_engine("firefox-esr") is Engine.FIREFOX_ESR
    for bad in ("chrome", "", None, 3, "Chromium"):
        with pytest.raises(FieldError) as info:
            parse_engine(bad)
        assert info.value.field == "engine"


def test_packs_are_keyed_by_image_engine_and_audio_lane(tmp_path: Path) -> None:
    assert pack_dir(tmp_path, DIGEST) == tmp_path / "rigs/smolvm-packs" / ("ab" * 32 + "-tools-v1")
    p = pack_dir(tmp_path, DIGEST, revision="chromium-audio-v1-chromium", kind="browser-packs")
    assert p == tmp_path / "rigs/browser-packs" / ("ab" * 32 + "-chromium-audio-v1-chromium")


def test_find_browser_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(RigdError) as info:
        find_browser(Engine.CHROMIUM, tmp_path)
    assert "python -m rigd.images browser --engine chromium" in info.value.message


def test_mmdebstrap_keeps_debs_runs_the_hook_with_the_engine_and_terminal_is_unchanged(
    r: Recipes, tmp_path: Path
) -> None:
    img = browser_image(r, Engine.CHROMIUM, tmp_path)
    argv = mmdebstrap_argv(r, img, tmp_path / "x.tar", debs_in=tmp_path / "in", debs_out=tmp_path / "out")
    hooks = [a for a in argv if a.startswith(("--setup-hook", "--customize-hook"))]
    assert hooks[1] == f"--setup-hook=sync-in {tmp_path / 'in'} /var/cache/apt/archives/"
    assert hooks[-2] == f"--customize-hook=sync-out /var/cache/apt/archives {tmp_path / 'out'}"
    assert hooks[-1].endswith(f'customize.sh "$1" chromium {shlex.quote(sys.executable)}')
    assert argv[-1] == str(r.sources)
    # The terminal's command line is what it was before images learned engines.
    t = mmdebstrap_argv(r, terminal_image(r), tmp_path / "t.tar")
    assert [a for a in t if "hook" in a] == [f'--customize-hook=sh {r.terminal_dir / "customize.sh"} "$1"']


def test_offline_builds_use_the_kept_debs_and_give_the_image_the_archives_sources(
    r: Recipes, tmp_path: Path
) -> None:
    debs = tmp_path / "debs"
    debs.mkdir()
    with pytest.raises(RigdError, match="none"):
        local_repository(debs, tmp_path)
    if shutil.which("dpkg-scanpackages") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-scanpackages and dpkg-deb")
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: rigd-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n")
    subprocess.run(["dpkg-deb", "-Zgzip", "--build", str(pkg), str(debs / "rigd-hello_1.0_all.deb")],
                   check=True, capture_output=True, timeout=30)
    src = local_repository(debs, tmp_path)
    assert src.name == "debian.sources"  # so mmdebstrap names it as it names the archive's
    assert f"URIs: file://{debs}" in src.read_text() and "Trusted: yes" in src.read_text()
    assert "Package: rigd-hello" in (debs / "Packages").read_text()
    img = browser_image(r, Engine.CHROMIUM, tmp_path)
    fake_src = tmp_path / "debian.sources"
    argv = mmdebstrap_argv(r, img, tmp_path / "x.tar", sources=fake_src)
    assert argv[-1] == str(fake_src)
    assert f'--customize-hook=cp {r.sources} "$1"/etc/apt/sources.list.d/0000debian.sources' in argv


def test_deb_file_names_give_package_and_version() -> None:
    assert deb_identity("libc6_2.36-9+deb12u14_amd64.deb") == ("libc6", "2.36-9+deb12u14")
    assert deb_identity("zlib1g_1%3a1.2.13.dfsg-1_amd64.deb") == ("zlib1g", "1:1.2.13.dfsg-1")
    assert deb_identity("Packages") is None
    assert deb_identity("odd_name.deb") is None


def test_chromium_starts_unprivileged_headless_on_guest_loopback_with_a_fresh_profile() -> None:
    s = chromium_launch_script()
    assert "--headless=new" in s and "--remote-debugging-port=9223" in s
    assert "--remote-debugging-address=127.0.0.1" in s
    assert "setpriv --reuid=browser --regid=browser" in s and "--inh-caps=-all" in s
    assert 'mktemp -d /tmp/rigd-profile.' in s and '--user-data-dir="$p"' in s
    assert "env -i" in s and "--no-sandbox" not in s
    assert "--no-sandbox" in chromium_launch_script(sandbox=False)
    # Readiness asks through the loopback relay the launch script starts beside the engine.
    assert "TCP-LISTEN:9222,bind=127.0.0.1," in s and "TCP:127.0.0.1:9223" in s
    assert s.index("TCP-LISTEN:9222") < s.rindex('printf "%s\\n" "$p"')
    assert "http://127.0.0.1:9222/json/version" in devtools_probe_script()
    assert "/run/rigd-relay.pid" in devtools_probe_script() and "exit 4" in devtools_probe_script()


def _version(**over: object) -> bytes:
    doc: dict[str, object] = {
        "Browser": "Chrome/156.0.8078.114", "Protocol-Version": "1.3",
        "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/156.0.0.0 Safari/537.36",
        "V8-Version": "15.6", "WebKit-Version": "537.36",
        "webSocketDebuggerUrl": "ws://127.0.0.1:9223/devtools/browser/1c4b",
    }
    doc.update(over)
    return json.dumps(doc).encode()


def test_devtools_version_is_parsed_and_a_hostile_answer_refused() -> None:
    v = parse_version(_version())
    assert v.product == "Chrome" and v.protocol == "1.3"
    assert v.websocket_url.startswith("ws://127.0.0.1:9223/")
    for bad in (
        b"", b"\xff\xfe", b"[]", b"null", _version(Browser=7), _version(Browser=""),
        _version(webSocketDebuggerUrl="http://evil/"), _version(Browser="x" * 2000),
        b" " * (MAX_VERSION_BYTES + 1),
    ):
        with pytest.raises(RigdError):
            parse_version(bad)


def test_oci_image_defaults_are_the_terminals(r: Recipes) -> None:
    t = terminal_image(r)
    assert isinstance(t, OciImage) and t.kind == "terminal" and t.debs_dir is None
    assert t.builders == ("terminal", "oci", "recipes") and t.hook_args == ()


def test_the_relays_reach_the_engine_only_from_the_rigs_own_port() -> None:
    # guest loopback 9222 → the engine's 9223 (started with every engine); the virtio-serial
    # port (found by name) → 9222 (started once DevTools answers).
    for launch in (chromium_launch_script(), firefox_launch_script(), webkit_launch_script()):
        assert "TCP-LISTEN:9222,bind=127.0.0.1,reuseaddr,fork TCP:127.0.0.1:9223" in launch
    s = relay_script()
    assert "TCP-LISTEN" not in s
    assert '= rigd.devtools ]' in s and 'GOPEN:"$dev" TCP:127.0.0.1:9222' in s
    # It returns only once the port relay holds the device (no fixed sleep stands in for it).
    assert '/proc/$pid/fd' in s
    assert "tail --pid=" in engine_watch_script() and "/run/rigd-browser.log" in engine_watch_script()


def test_a_browser_machine_has_the_devtools_port_and_a_terminal_does_not(tmp_path: Path) -> None:
    common = dict(qemu="qemu-system-x86_64", accel="tcg", memory_mb=2048, vcpus=2, kernel=tmp_path / "k",
                  initrd=tmp_path / "i", root_disk=tmp_path / "d", tools_disk=tmp_path / "t",
                  qmp_socket=tmp_path / "q", agent_socket=tmp_path / "a", console_socket=tmp_path / "c",
                  tsc_khz=None)
    plain = microvm_argv(**common)  # type: ignore[arg-type]
    assert "virtio-serial-device,max_ports=2" in plain and not any("rigd.devtools" in a for a in plain)
    port = microvm_argv(**common, extra_ports=[("rigd.devtools", tmp_path / "dev,tools.sock")])  # type: ignore[arg-type]
    assert "virtio-serial-device,max_ports=3" in port
    assert f"socket,id=port0,path={tmp_path}/dev,,tools.sock,server=on,wait=off" in port
    assert "virtserialport,chardev=port0,name=rigd.devtools" in port
    for bad in ("rigd.agent", "Rigd", "a,b", "", "x" * 40):
        with pytest.raises(RigdError):
            microvm_argv(**common, extra_ports=[(bad, tmp_path / "s")])  # type: ignore[arg-type]


def test_the_host_connects_to_the_browser_path_never_to_the_guests_address() -> None:
    good = "ws://127.0.0.1:9223/devtools/browser/b1b69db3-c41a-4d1b-9492-ffd11b3d1847"
    assert parse_version(_version(webSocketDebuggerUrl=good)).browser_path == (
        "/devtools/browser/b1b69db3-c41a-4d1b-9492-ffd11b3d1847")
    for bad in ("ws://127.0.0.1:9223/devtools/page/b1b69db3-c41a-4d1b-9492-ffd11b3d1847",
                "ws://127.0.0.1:9223/devtools/browser/../../x",
                "ws://127.0.0.1:9223/devtools/browser/b1b69db3-c41a-4d1b-9492-ffd11b3d1847/x"):
        with pytest.raises(RigdError):
            _ = parse_version(_version(webSocketDebuggerUrl=bad)).browser_path


def test_every_api_engine_maps_to_its_own_image_engine() -> None:
    assert {k.value: v.value for k, v in IMAGE_ENGINE.items()} == {
        "chromium": "chromium", "firefox": "firefox-esr", "webkit": "webkit2gtk-driver"}
