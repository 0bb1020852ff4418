"""``python -m rigd.images``: build, find, pack and re-pin the terminal assets.

build [--cache-dir DIR]                 build what is missing (a no-op when cached)
find  [--cache-dir DIR]                 print the built assets as JSON, or fail
pack  --data-dir DIR [--cache-dir DIR]  make the warm pack of the default image
pin   [--cache-dir DIR]                 re-resolve every lock file to today's archive
desktop [--cache-dir DIR] [--find]      build the computer (desktop) image, or only find it
import SOURCE --sha256 HEX --data-dir DIR   import a computer image (path or URL) if its digest matches
browser [--engine E] [--find] [--offline] [--data-dir DIR]
                                        build (or find) one engine's browser image; with a data
                                        directory also its pack; prints the assets as JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from rigd.errors import RigdError
from rigd.images import build_all, find_assets
from rigd.images.cache import default_cache_dir
from rigd.images.debs import PrivateApt, load_lock, resolve_pins, write_lock
from rigd.images.pack import ensure_pack
from rigd.images.recipes import Recipes


def _log(msg: str) -> None:
    print(msg, flush=True)


def _pin(cache: Path) -> None:
    r = Recipes.find()
    apt = PrivateApt(cache, r.sources)
    for path, follow in r.locks():
        old = load_lock(path)
        pins = resolve_pins(old, apt, _log, follow)
        write_lock(path, old.suite, list(old.requested), pins)
        before = {p.name: p.version for p in old.packages}
        for p in pins:
            was = before.get(p.name)
            mark = "unchanged" if was == p.version else f"was {was or 'absent'}"
            _log(f"pin: {path.relative_to(r.root)}: {p.name} {p.version} ({mark})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rigd.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "find", "pack", "pin", "desktop", "import", "browser"):
        p = sub.add_parser(name)
        p.add_argument(
            "--cache-dir", type=Path, default=None, help="default: $RIGD_CACHE_DIR or ~/.cache/rigd"
        )
        if name in ("pack", "import"):
            p.add_argument("--data-dir", type=Path, required=True)
        if name == "desktop":
            p.add_argument("--find", action="store_true", help="only find the built image; never build")
        if name == "browser":
            p.add_argument("--engine", default="chromium",
                           help="chromium (default), firefox-esr, webkit2gtk-driver")
            p.add_argument("--find", action="store_true", help="only find the built image; never build")
            p.add_argument("--offline", action="store_true",
                           help="rebuild from the .debs an earlier build kept")
            p.add_argument("--data-dir", type=Path, default=None,
                           help="also make the pack in this data directory")
        if name == "import":
            p.add_argument("source", help="a path, file:// or http(s):// URL of a qcow2 or a rigd-image.json")
            p.add_argument("--sha256", required=True, help="the digest the source must have")
    args = ap.parse_args(argv)
    cache: Path = args.cache_dir or default_cache_dir()
    try:
        if args.cmd == "build":
            build_all(cache, log=_log)
        elif args.cmd == "find":
            assets = find_assets(cache)
            print(json.dumps({k: str(v) for k, v in dataclasses.asdict(assets).items()}, indent=1))
        elif args.cmd == "pack":
            t0 = time.monotonic()
            rootfs = ensure_pack(find_assets(cache), args.data_dir, lambda step: _log(f"pack: {step}"))
            _log(f"pack: {rootfs} ({time.monotonic() - t0:.1f} s)")
        elif args.cmd == "pin":
            _pin(cache)
        elif args.cmd == "desktop":
            from rigd.images.desktop import build_desktop, find_desktop

            img = find_desktop(cache) if args.find else build_desktop(cache, log=_log)
            print(img.manifest_path)
        elif args.cmd == "browser":
            from rigd.images.browser import build_browser, ensure_browser_pack, find_browser, parse_engine

            engine = parse_engine(args.engine)
            b = find_browser(engine, cache) if args.find else build_browser(engine, cache, log=_log,
                                                                            offline=args.offline)
            doc = {"engine": b.engine.value, "revision": b.revision,
                   **{k: str(v) for k, v in dataclasses.asdict(b.boot).items()}}
            if args.data_dir is not None:
                t0 = time.monotonic()
                doc["pack"] = str(ensure_browser_pack(b, args.data_dir, lambda step: _log(f"pack: {step}")))
                _log(f"pack: {doc['pack']} ({time.monotonic() - t0:.1f} s)")
            print(json.dumps(doc, indent=1))
        elif args.cmd == "import":
            from rigd.images.importer import import_image

            done = import_image(
                args.source, args.sha256, args.data_dir, progress=lambda m: _log(f"import: {m}")
            )
            print(done.dir)
    except RigdError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.data:
            print(f"       {json.dumps(exc.data)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
