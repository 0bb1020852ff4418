"""Registry pulls against ``skopeo copy``, and a freshly pulled image's first rig, measured in one run.

Issue 14's bench, against Debian's ``docker-registry`` on loopback holding the
built terminal image with one small layer on top (so it has its own digest and
pack; pushed once by ``skopeo``, before any clock starts):

- **pull throughput**: rigd's registry client (:meth:`RegistryClient.pull`
  into an empty store: manifest, config and every layer, each verified) against
  the peer ``skopeo copy docker://… oci:…`` of the same image from the same
  registry into an empty layout on the same disk. ``--rounds`` interleaved
  rounds (the order alternates); the medians in MB/s and rigd's as a ratio of
  skopeo's. Target: ≥ 0.8.
- **time to the first rig of a freshly pulled image**: a workspace whose
  ``rigs.smolvm.execImage`` names the image opens a terminal rig on a server
  whose store and packs are empty (pull + pack + cold boot + the contract
  check), against a rig of the built image whose pack already exists (a cold
  boot: warm starts are off on this server). Both as seconds, and the ratio.

A missed target is printed "not met", never tuned away; exit 0 unless
``--strict``. Every process started here (the registry, the server, its QEMU)
is killed by pid on the way out, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from _common import REAPER, BenchError, med, start_server, stop_server

from rigd.images import find_assets
from rigd.images.blobs import BlobStore
from rigd.images.registry import RegistryClient, parse_reference
from tests.integration.local_registry import SKOPEO, Entry, Layout, LocalRegistry, layer_tar

TARGET = 0.8
REPO_NAME = "bench/terminal"
TAG = "1"


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def pull_rigd(host: str, dest: Path) -> float:
    ref = parse_reference(f"{host}/{REPO_NAME}:{TAG}")
    client = RegistryClient(insecure=[host])
    t0 = time.monotonic()
    trio.run(client.pull, ref, BlobStore(dest))
    return time.monotonic() - t0


def pull_skopeo(host: str, dest: Path) -> float:
    argv = [SKOPEO, "--insecure-policy", "copy", "--src-tls-verify=false",
            f"docker://{host}/{REPO_NAME}:{TAG}", f"oci:{dest}:{TAG}"]
    t0 = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    if out.returncode != 0:
        raise BenchError(f"skopeo copy failed: {out.stderr.strip()[-800:]}")
    return took


def throughput(args: argparse.Namespace, host: str, workdir: Path, image_bytes: int) -> float:
    times: dict[str, list[float]] = {"rigd": [], "skopeo": []}
    sides = [("rigd", pull_rigd), ("skopeo", pull_skopeo)]
    for r in range(args.rounds + 1):
        for name, pull in (sides if r % 2 == 0 else sides[::-1]):
            dest = workdir / f"pull-{name}"
            shutil.rmtree(dest, ignore_errors=True)
            took = pull(host, dest)
            if r > 0:  # round 0 warms the registry's page cache for both
                times[name].append(took)
            shutil.rmtree(dest, ignore_errors=True)
    rate = {n: image_bytes / med(ts) / 1e6 for n, ts in times.items()}
    ratio = rate["rigd"] / rate["skopeo"]
    print(f"pull of {image_bytes / 1e6:.1f} MB ({args.rounds} rounds, medians): "
          f"rigd {rate['rigd']:.1f} MB/s, skopeo copy {rate['skopeo']:.1f} MB/s")
    print(f"  rigd / skopeo = {ratio:.2f}x (target >= {TARGET}: {'met' if ratio >= TARGET else 'not met'})")
    return ratio


def first_rig(args: argparse.Namespace, host: str, workdir: Path) -> None:
    data_dir = workdir / "data"
    data_dir.mkdir(mode=0o711)
    srv = start_server(args, "images", data_dir, warm=False,
                       extra=["--insecure-registry", host, "--network", "none"])
    try:
        client = srv.client
        ref = f"{host}/{REPO_NAME}:{TAG}"
        ws = client.call("workspace.create", {"name": "custom"})["id"]
        client.call("workspace.settings.set", {"workspace": ws, "key": "rigs.smolvm.execImage", "value": ref})
        # The built image's pack first (not timed), so its rig below is "already packed".
        t0 = time.monotonic()
        warmup = client.call("rig.open", {"workspace": "default", "surface": "terminal"})
        client.call("rig.close", {"rigId": warmup["id"]})
        print(f"built image's pack ready and a first rig booted in {time.monotonic() - t0:.1f} s (not timed)")
        t0 = time.monotonic()
        built = client.call("rig.open", {"workspace": "default", "surface": "terminal"})
        built_s = time.monotonic() - t0
        client.call("rig.close", {"rigId": built["id"]})
        t0 = time.monotonic()
        fresh = client.call("rig.open", {"workspace": ws, "surface": "terminal"})
        fresh_s = time.monotonic() - t0
        if fresh.get("imageRef") != ref:
            raise BenchError(f"the custom rig did not boot {ref}: {fresh}")
        client.call("rig.close", {"rigId": fresh["id"]})
        t0 = time.monotonic()
        again = client.call("rig.open", {"workspace": ws, "surface": "terminal"})
        again_s = time.monotonic() - t0
        client.call("rig.close", {"rigId": again["id"]})
        print("first rig of a freshly pulled image (pull + pack + cold boot + contract check): "
              f"{fresh_s:.1f} s")
        print(f"  rig of the built, already-packed image (cold boot): {built_s:.1f} s "
              f"-> {fresh_s / built_s:.2f}x")
        print(f"  second rig of the pulled image (packed, contract passed; cold): {again_s:.1f} s "
              f"-> {again_s / built_s:.2f}x")
    finally:
        stop_server(srv)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3, help="measured pull rounds per side (default 3)")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    assets = find_assets()
    with tempfile.TemporaryDirectory(prefix="rigd-bench-images-", dir="/var/tmp") as tmp:
        workdir = Path(tmp).resolve()
        os.chmod(workdir, 0o711)  # per-rig QEMU uids traverse it
        reg = LocalRegistry(workdir / "registry").start()
        assert reg.proc is not None
        REAPER.add(reg.proc.pid, "docker-registry")
        try:
            # The built image plus one small layer: its own digest, so its own (fresh) pack.
            layout = Layout(workdir / "layout")
            desc = layout.extend(assets.oci_layout, assets.image_digest, [layer_tar([
                Entry("etc", kind="dir"), Entry("etc/rigd-bench", b"bench/images.py\n")])])
            layout.tag(desc, TAG)
            reg.push(layout.root, TAG, REPO_NAME)
            image_bytes = tree_bytes(reg.storage / "docker" / "registry" / "v2" / "blobs")
            ratio = throughput(args, reg.host, workdir, image_bytes)
            first_rig(args, reg.host, workdir)
            return 1 if args.strict and ratio < TARGET else 0
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        finally:
            reg.stop()
            REAPER.kill_all()


if __name__ == "__main__":
    raise SystemExit(main())
