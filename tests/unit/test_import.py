"""Importing a computer image into a data directory, pinned by sha256.

Uses small real files: a qcow2 made by ``qemu-img``, a raw ext4 made by
``mke2fs -d`` (no mounts) for the bare-qcow2 case, a synthetic PVH ELF as
the kernel. The HTTP cases are in test_import_http.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rigd.errors import FieldError, RigdError
from rigd.images.importer import (
    FORMAT,
    MANIFEST_NAME,
    MARKER_FORMAT,
    FileRef,
    ImageManifest,
    images_dir,
    import_image,
    list_imported,
    normalise_sha256,
    parse_manifest,
    parse_marker,
)
from tests.unit.test_images_vmlinux import fake_elf

needs_tools = pytest.mark.skipif(
    shutil.which("qemu-img") is None or (shutil.which("mke2fs") is None and not Path("/usr/sbin/mke2fs").exists()),
    reason="needs qemu-img and mke2fs",
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_qcow2(path: Path, *, backing: Path | None = None, raw: Path | None = None) -> bytes:
    if raw is not None:
        cmd = ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(path)]
    elif backing is not None:
        cmd = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(backing), str(path)]
    else:
        cmd = ["qemu-img", "create", "-q", "-f", "qcow2", str(path), "16M"]
    subprocess.run(cmd, check=True, capture_output=True)
    return path.read_bytes()


def write_manifest(d: Path, *, disk: Path, kernel: Path, initrd: Path, proto: int = 2, **over: object) -> Path:
    def ref(p: Path) -> FileRef:
        data = p.read_bytes()
        return FileRef(p.name, sha(data), len(data))

    m = ImageManifest(
        surface="computer",
        guest_protocol=proto,
        kernel_release="6.1.0-57-amd64",
        cmdline=("rw", "fsck.mode=skip"),
        width=1280,
        height=800,
        disk=ref(disk),
        kernel=ref(kernel),
        initrd=ref(initrd),
    )
    doc = m.to_json()
    doc.update(over)
    path = d / "desktop.rigd-image.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A directory as a publisher would serve it: manifest, qcow2, kernel, initramfs."""
    pub = tmp_path / "pub"
    pub.mkdir()
    make_qcow2(pub / "desktop.qcow2")
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"070701" + b"0" * 200)
    write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    return pub


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


def leftovers(data_dir: Path) -> list[str]:
    base = images_dir(data_dir)
    if not base.exists():
        return []
    return sorted(p.name for p in base.iterdir() if p.name != ".lock")


# --------------------------------------------------------------------------- manifest


def test_manifest_round_trip() -> None:
    ref = FileRef("d.qcow2", "a" * 64, 10)
    m = ImageManifest("computer", 2, "6.1.0-57-amd64", ("rw",), 1280, 800, ref, FileRef("k", "b" * 64, 1),
                      FileRef("i", "c" * 64, 1))
    assert parse_manifest(m.dumps()) == m
    assert json.loads(m.dumps())["format"] == FORMAT


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "rigd.image/v9"}, "format"),
        ({"surface": "terminal"}, "surface"),
        ({"guest_protocol": "2"}, "guest_protocol"),
        ({"guest_protocol": True}, "guest_protocol"),
        ({"cmdline": ["two words"]}, "cmdline"),
        ({"display": {"width": 1280}}, "display.height"),
        ({"disk": {"file": "../etc/passwd", "sha256": "a" * 64, "size": 1}}, "disk.file"),
        ({"disk": {"file": "sub/disk.qcow2", "sha256": "a" * 64, "size": 1}}, "disk.file"),
        ({"disk": {"file": "/abs", "sha256": "a" * 64, "size": 1}}, "disk.file"),
        ({"kernel": {"file": "vmlinux", "sha256": "A" * 64, "size": 1}}, "kernel.sha256"),
        ({"initrd": {"file": "initrd.img", "sha256": "c" * 64, "size": 0}}, "initrd.size"),
    ],
)
def test_manifest_errors_name_the_field(change: dict[str, object], field: str) -> None:
    ref = {"file": "d.qcow2", "sha256": "a" * 64, "size": 10}
    doc: dict[str, object] = {
        "format": FORMAT, "surface": "computer", "guest_protocol": 2, "kernel_release": "6.1.0",
        "cmdline": [], "display": {"width": 1280, "height": 800},
        "disk": ref, "kernel": {**ref, "file": "vmlinux"}, "initrd": {**ref, "file": "initrd.img"},
    }
    doc.update(change)
    with pytest.raises(RigdError) as exc:
        parse_manifest(json.dumps(doc))
    assert exc.value.data["field"] == field


def test_marker_paths_must_be_absolute_and_normalised() -> None:
    doc = {"format": MARKER_FORMAT, "surface": "computer", "guest_protocol": 2, "kernel_release": "6.1.0",
           "cmdline": [], "display": {"width": 1280, "height": 800},
           "kernel": "/boot/vmlinuz", "initrd": "/boot/rigd/initrd.img"}
    assert parse_marker(json.dumps(doc)).kernel_path == "/boot/vmlinuz"
    for bad in ("boot/vmlinuz", "/boot/../etc/shadow", "/boot/a b"):
        with pytest.raises(RigdError):
            parse_marker(json.dumps({**doc, "kernel": bad}))


def test_sha256_forms() -> None:
    h = "ab" * 32
    assert normalise_sha256(h) == h
    assert normalise_sha256("sha256:" + h.upper()) == h
    with pytest.raises(FieldError):
        normalise_sha256("abc")


# --------------------------------------------------------------------------- import from a manifest


@needs_tools
def test_import_from_a_manifest_path(published: Path, data_dir: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    img = import_image(manifest, sha(manifest.read_bytes()), data_dir)
    assert img.guest_protocol == 2 and not img.already_present
    assert img.dir == images_dir(data_dir) / f"sha256-{sha(manifest.read_bytes())}"
    assert img.disk.read_bytes() == (published / "desktop.qcow2").read_bytes()
    assert img.kernel.read_bytes() == (published / "vmlinux").read_bytes()
    assert img.initrd.read_bytes() == (published / "initrd.img").read_bytes()
    stored = json.loads((img.dir / MANIFEST_NAME).read_text())
    assert stored["guest_protocol"] == 2 and stored["disk"]["file"] == "disk.qcow2"
    # Rig uids open the files by name: 0444 files in a 0711 directory.
    for f in (img.disk, img.kernel, img.initrd, img.dir / MANIFEST_NAME):
        assert f.stat().st_mode & 0o777 == 0o444
    assert img.dir.stat().st_mode & 0o777 == 0o711
    assert leftovers(data_dir) == [img.dir.name]
    assert [i.dir for i in list_imported(data_dir)] == [img.dir]


@needs_tools
def test_import_again_finds_the_first_one(published: Path, data_dir: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    digest = "sha256:" + sha(manifest.read_bytes())
    first = import_image(f"file://{manifest}", digest, data_dir)
    again = import_image(manifest, digest, data_dir)
    assert again.already_present and again.dir == first.dir


@needs_tools
def test_wrong_checksum_names_both_and_leaves_nothing(published: Path, data_dir: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    wrong = "0" * 64
    with pytest.raises(RigdError) as exc:
        import_image(manifest, wrong, data_dir)
    actual = sha(manifest.read_bytes())
    assert wrong in exc.value.message and actual in exc.value.message
    assert exc.value.data["expected"] == wrong and exc.value.data["actual"] == actual
    assert leftovers(data_dir) == []


@needs_tools
def test_a_file_that_differs_from_its_manifest_leaves_nothing(published: Path, data_dir: Path) -> None:
    manifest = published / "desktop.rigd-image.json"
    kernel = bytearray((published / "vmlinux").read_bytes())
    kernel[-1] ^= 1  # changed after publishing, same size
    (published / "vmlinux").write_bytes(bytes(kernel))
    with pytest.raises(RigdError) as exc:
        import_image(manifest, sha(manifest.read_bytes()), data_dir)
    assert "vmlinux" in exc.value.message and "mismatch" in exc.value.message
    assert exc.value.data["actual"] == sha(bytes(kernel))
    assert leftovers(data_dir) == []

    (published / "vmlinux").write_bytes(fake_elf(size=8192))  # larger than the manifest says
    with pytest.raises(RigdError, match="larger than"):
        import_image(manifest, sha(manifest.read_bytes()), data_dir)
    assert leftovers(data_dir) == []


@needs_tools
def test_a_disk_with_a_backing_file_is_refused(tmp_path: Path, data_dir: Path) -> None:
    pub = tmp_path / "pub"
    pub.mkdir()
    make_qcow2(tmp_path / "secret.qcow2")
    make_qcow2(pub / "desktop.qcow2", backing=tmp_path / "secret.qcow2")
    (pub / "vmlinux").write_bytes(fake_elf())
    (pub / "initrd.img").write_bytes(b"x")
    m = write_manifest(pub, disk=pub / "desktop.qcow2", kernel=pub / "vmlinux", initrd=pub / "initrd.img")
    with pytest.raises(RigdError, match="backing file"):
        import_image(m, sha(m.read_bytes()), data_dir)
    assert leftovers(data_dir) == []


def test_a_manifest_cannot_name_a_path_outside_its_directory(tmp_path: Path, data_dir: Path) -> None:
    pub = tmp_path / "pub"
    pub.mkdir()
    doc = {"format": FORMAT, "surface": "computer", "guest_protocol": 2, "kernel_release": "6.1.0",
           "cmdline": [], "display": {"width": 1280, "height": 800},
           "disk": {"file": "../../etc/hostname", "sha256": "a" * 64, "size": 5},
           "kernel": {"file": "vmlinux", "sha256": "a" * 64, "size": 5},
           "initrd": {"file": "initrd.img", "sha256": "a" * 64, "size": 5}}
    m = pub / "m.json"
    m.write_text(json.dumps(doc))
    with pytest.raises(RigdError) as exc:
        import_image(m, sha(m.read_bytes()), data_dir)
    assert exc.value.data["field"] == "disk.file"
    assert leftovers(data_dir) == []


def test_images_dir_that_is_a_symlink_is_refused(published: Path, tmp_path: Path, data_dir: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data_dir / "rigs").mkdir()
    (data_dir / "rigs" / "images").symlink_to(elsewhere)
    m = published / "desktop.rigd-image.json"
    with pytest.raises(RigdError, match="symlink"):
        import_image(m, sha(m.read_bytes()), data_dir)
    assert list(elsewhere.iterdir()) == []


def test_neither_qcow2_nor_manifest(tmp_path: Path, data_dir: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_bytes(b"hello")
    with pytest.raises(RigdError, match="neither a qcow2"):
        import_image(f, sha(b"hello"), data_dir)
    assert leftovers(data_dir) == []


def test_unsupported_scheme_and_missing_file(data_dir: Path) -> None:
    with pytest.raises(FieldError, match="scheme"):
        import_image("ftp://example.org/x.qcow2", "a" * 64, data_dir)
    with pytest.raises(FieldError, match="not a file"):
        import_image("/nonexistent/x.qcow2", "a" * 64, data_dir)


# --------------------------------------------------------------------------- a bare qcow2


@needs_tools
def test_import_a_bare_qcow2_reads_its_boot_files_from_inside(tmp_path: Path, data_dir: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc/rigd").mkdir(parents=True)
    (tree / "boot/rigd").mkdir(parents=True)
    kernel = fake_elf()
    (tree / "boot/vmlinuz-6.1.0-57-amd64").write_bytes(kernel)
    (tree / "boot/rigd/initrd.img").write_bytes(b"initramfs bytes")
    marker = {"format": MARKER_FORMAT, "surface": "computer", "guest_protocol": 2,
              "kernel_release": "6.1.0-57-amd64", "cmdline": ["rw"],
              "display": {"width": 1280, "height": 800},
              "kernel": "/boot/vmlinuz-6.1.0-57-amd64", "initrd": "/boot/rigd/initrd.img"}
    (tree / "etc/rigd/image.json").write_text(json.dumps(marker))
    raw = tmp_path / "disk.raw"
    with raw.open("wb") as f:
        f.truncate(32 << 20)
    mke2fs = shutil.which("mke2fs") or "/usr/sbin/mke2fs"
    subprocess.run([mke2fs, "-q", "-F", "-t", "ext4", "-d", str(tree), str(raw)], check=True)
    disk = tmp_path / "desktop.qcow2"
    data = make_qcow2(disk, raw=raw)

    img = import_image(disk, sha(data), data_dir)
    assert img.guest_protocol == 2
    assert img.manifest.cmdline == ("rw",)
    assert img.kernel.read_bytes() == kernel
    assert img.initrd.read_bytes() == b"initramfs bytes"
    assert img.disk.read_bytes() == data
    assert img.manifest.disk.sha256 == sha(data)
    # no temporary raw copy is left anywhere
    assert leftovers(data_dir) == [img.dir.name]
    assert sorted(p.name for p in img.dir.iterdir()) == ["disk.qcow2", "initrd.img", MANIFEST_NAME, "vmlinux"]


@needs_tools
def test_a_bare_qcow2_without_marker_is_refused(tmp_path: Path, data_dir: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    raw = tmp_path / "disk.raw"
    with raw.open("wb") as f:
        f.truncate(16 << 20)
    mke2fs = shutil.which("mke2fs") or "/usr/sbin/mke2fs"
    subprocess.run([mke2fs, "-q", "-F", "-t", "ext4", "-d", str(tree), str(raw)], check=True)
    disk = tmp_path / "plain.qcow2"
    data = make_qcow2(disk, raw=raw)
    with pytest.raises(RigdError, match=r"/etc/rigd/image\.json"):
        import_image(disk, sha(data), data_dir)
    assert leftovers(data_dir) == []
    assert not any(p.name.endswith(".raw") for p in data_dir.rglob("*"))
    assert os.listdir(tmp_path / "tree") == ["etc"]
