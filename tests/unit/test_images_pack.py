"""Packs: OCI verification, whiteouts and layer application (GNU tar, no VMs)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from rigd.errors import RigdError
from rigd.images import oci
from rigd.images.pack import (
    apply_whiteouts,
    check_no_symlink_parents,
    normalize_member,
    plan_whiteouts,
    unpack_layers,
)


def make_tar(members: dict[str, bytes | str | None]) -> bytes:
    """name -> bytes (file), None (directory) or 'link:<target>' (symlink)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            if body is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            elif isinstance(body, str):
                info.type, info.linkname = tarfile.SYMTYPE, body.removeprefix("link:")
                t.addfile(info)
            else:
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_plan_whiteouts_finds_removals_and_opaque_dirs() -> None:
    plan = plan_whiteouts(["./etc/", "etc/.wh.passwd", "usr/lib/.wh..wh..opq", "usr/lib/new", ".wh.top"])
    assert plan.remove == ("etc/passwd", "top")
    assert plan.opaque == ("usr/lib",)


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "a/.wh.", "a/.wh.."])
def test_escaping_or_malformed_names_are_refused(bad: str) -> None:
    with pytest.raises(RigdError):
        plan_whiteouts([bad])


def test_normalize_member_strips_leading_slash_and_dots() -> None:
    assert normalize_member("/./usr//bin/") == "usr/bin"


def test_apply_whiteouts_deletes_and_empties(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("x")
    (tmp_path / "etc/keep").write_text("x")
    (tmp_path / "usr/lib/sub").mkdir(parents=True)
    (tmp_path / "usr/lib/old").write_text("x")
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone/deep").write_text("x")
    apply_whiteouts(
        tmp_path, plan_whiteouts(["etc/.wh.passwd", "usr/lib/.wh..wh..opq", ".wh.gone", ".wh.never-there"])
    )
    assert not (tmp_path / "etc/passwd").exists()
    assert (tmp_path / "etc/keep").exists()
    assert (tmp_path / "usr/lib").is_dir() and not any((tmp_path / "usr/lib").iterdir())
    assert not (tmp_path / "gone").exists()


def test_whiteout_through_a_symlink_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    root = tmp_path / "root"
    root.mkdir()
    (root / "etc").symlink_to(outside)
    with pytest.raises(RigdError, match="symlink"):
        apply_whiteouts(root, plan_whiteouts(["etc/.wh.precious"]))
    assert (outside / "precious").read_text() == "keep me"
    with pytest.raises(RigdError, match="symlink"):
        check_no_symlink_parents(root, ["etc/new-file"])


def write_layout(tmp_path: Path, layers: list[bytes]) -> tuple[Path, str]:
    """An OCI layout with plain-tar layers (written by hand, like a registry would)."""
    layout = tmp_path / "layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        import hashlib

        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return "sha256:" + h

    cfg = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    manifest = {
        "schemaVersion": 2,
        "mediaType": oci.MT_MANIFEST,
        "config": {"mediaType": oci.MT_CONFIG, "digest": put(cfg), "size": len(cfg)},
        "layers": [{"mediaType": oci.MT_LAYER_TAR, "digest": put(x), "size": len(x)} for x in layers],
    }
    return layout, put(json.dumps(manifest).encode())


def test_layers_apply_in_order_with_whiteouts(tmp_path: Path) -> None:
    base = make_tar(
        {"etc": None, "etc/passwd": b"root", "etc/motd": b"hi", "opt": None, "opt/a": b"a", "opt/b": b"b"}
    )
    top = make_tar(
        {
            "etc": None,
            "etc/.wh.motd": b"",
            "etc/passwd": b"root2",
            "opt": None,
            "opt/.wh..wh..opq": b"",
            "opt/c": b"c",
        }
    )
    layout, digest = write_layout(tmp_path, [base, top])
    manifest = oci.load_manifest(layout, digest)
    tree = tmp_path / "tree"
    tree.mkdir()
    unpack_layers(layout, manifest, tree, tmp_path / "fakeroot.state")
    assert (tree / "etc/passwd").read_bytes() == b"root2"
    assert not (tree / "etc/motd").exists()
    assert sorted(p.name for p in (tree / "opt").iterdir()) == ["c"]
    assert not list(tree.rglob(".wh.*"))


def test_a_later_layer_may_not_write_through_a_symlink(tmp_path: Path) -> None:
    escape = tmp_path / "escape"
    escape.mkdir()
    base = make_tar({"evil": f"link:{escape}"})
    top = make_tar({"evil/pwned": b"x"})
    layout, digest = write_layout(tmp_path, [base, top])
    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(RigdError, match="symlink"):
        unpack_layers(layout, oci.load_manifest(layout, digest), tree, tmp_path / "s")
    assert not (escape / "pwned").exists()


def test_tampered_blobs_and_bad_digests_are_caught(tmp_path: Path) -> None:
    layout, digest = write_layout(tmp_path, [make_tar({"f": b"1"})])
    manifest = oci.load_manifest(layout, digest)
    blob = oci.blob_path(layout, manifest.layers[0].digest)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[600] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(RigdError, match="corrupt"):
        oci.verify_blob(layout, manifest.layers[0])
    blob.write_bytes(bytes(data) + b"x")
    with pytest.raises(RigdError, match="bytes"):
        oci.verify_blob(layout, manifest.layers[0])
    with pytest.raises(RigdError, match="not a sha256 digest"):
        oci.load_manifest(layout, "sha256:../../etc/passwd")
    # A manifest whose bytes do not hash to the digest asked for.
    mpath = oci.blob_path(layout, digest)
    mpath.write_bytes(mpath.read_bytes() + b" ")
    with pytest.raises(RigdError):
        oci.load_manifest(layout, digest)


def test_written_layout_is_reproducible_and_loads(tmp_path: Path) -> None:
    tar = tmp_path / "root.tar"
    tar.write_bytes(make_tar({"bin": None, "bin/sh": b"#!"}))
    d1 = oci.write_layout(tmp_path / "a", tar, epoch=1700000000, config={"Cmd": ["/bin/sh"]})
    d2 = oci.write_layout(tmp_path / "b", tar, epoch=1700000000, config={"Cmd": ["/bin/sh"]})
    assert d1 == d2
    m = oci.load_manifest(tmp_path / "a", d1)
    assert m.layers[0].media_type == oci.MT_LAYER_GZIP
    cfg = oci.load_config(tmp_path / "a", m)
    assert cfg["rootfs"]["diff_ids"][0].startswith("sha256:")
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == d1
