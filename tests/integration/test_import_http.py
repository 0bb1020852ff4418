"""Importing a computer image over HTTP, from a server on loopback.

The only socket is the test's own HTTP server on 127.0.0.1 (in-process, a
thread); the bind step is overridden so that no reverse DNS lookup can hang
it (HOST-NOTES, Networks).
"""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from rigd.errors import RigdError
from rigd.images.importer import images_dir, import_image
from tests.unit.test_images_vmlinux import fake_elf
from tests.unit.test_import import make_qcow2, write_manifest

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img"),
]


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:  # no getfqdn(): it can hang without DNS
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    pub = tmp_path / "pub"
    pub.mkdir()
    make_qcow2(pub / "desktop.qcow2")
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"070701" + b"0" * 100)
    write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    srv = _Server(("127.0.0.1", 0), partial(_Quiet, directory=str(pub)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", pub
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_import_a_manifest_and_its_files_over_http(served: tuple[str, Path], tmp_path: Path) -> None:
    url, pub = served
    data = tmp_path / "data"
    img = import_image(f"{url}/desktop.rigd-image.json", sha(pub / "desktop.rigd-image.json"), data)
    assert img.guest_protocol == 2
    assert img.disk.read_bytes() == (pub / "desktop.qcow2").read_bytes()
    assert img.kernel.read_bytes() == (pub / "vmlinux").read_bytes()


def test_import_a_bare_qcow2_url_with_a_wrong_digest_leaves_nothing(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, pub = served
    data = tmp_path / "data"
    wrong = "f" * 64
    with pytest.raises(RigdError) as exc:
        import_image(f"{url}/desktop.qcow2", f"sha256:{wrong}", data)
    assert exc.value.data == {
        "source": f"{url}/desktop.qcow2",
        "expected": wrong,
        "actual": sha(pub / "desktop.qcow2"),
    }
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []


def test_http_errors_are_reported_and_leave_nothing(served: tuple[str, Path], tmp_path: Path) -> None:
    url, pub = served
    data = tmp_path / "data"
    with pytest.raises(RigdError, match="HTTP 404"):
        import_image(f"{url}/missing.qcow2", "a" * 64, data)
    # a manifest whose disk is gone from the server
    (pub / "desktop.qcow2").unlink()
    with pytest.raises(RigdError, match="HTTP 404"):
        import_image(f"{url}/desktop.rigd-image.json", sha(pub / "desktop.rigd-image.json"), data)
    assert [p.name for p in images_dir(data).iterdir() if p.name != ".lock"] == []
