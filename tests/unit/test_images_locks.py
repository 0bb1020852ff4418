"""Lock files and verified downloads: a wrong byte never gets a final name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rigd.errors import RigdError
from rigd.images import debs
from rigd.images.recipes import Recipes

GOOD = {
    "suite": "bookworm",
    "requested": ["busybox-static"],
    "packages": [
        {
            "name": "busybox-static",
            "version": "1:1.35.0-4+deb12u1+b1",
            "architecture": "amd64",
            "sha256": "a" * 64,
        },
    ],
}


def parse(doc: object) -> debs.Lock:
    return debs.parse_lock(json.dumps(doc), Path("test.lock"))


def test_a_good_lock_parses() -> None:
    lock = parse(GOOD)
    pin = lock.get("busybox-static")
    assert pin.spec() == "busybox-static=1:1.35.0-4+deb12u1+b1"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["packages"][0].update(sha256="abc"), "packages[0].sha256"),
        (lambda d: d["packages"][0].update(sha256="A" * 64), "packages[0].sha256"),
        (lambda d: d["packages"][0].update(version="1 2"), "packages[0].version"),
        (lambda d: d["packages"][0].update(name="../x"), "packages[0].name"),
        (lambda d: d["packages"][0].update(architecture="arm64"), "packages[0].architecture"),
        (lambda d: d["packages"].append(dict(d["packages"][0])), "packages[1].name"),
        (lambda d: d.update(packages=[]), "packages"),
        (lambda d: d.pop("suite"), "suite"),
    ],
)
def test_bad_locks_name_the_field(mutate: object, field: str) -> None:
    doc = json.loads(json.dumps(GOOD))
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(RigdError) as err:
        parse(doc)
    assert err.value.data["field"] == field
    assert "test.lock" in err.value.message


def test_not_json_is_reported_with_the_path() -> None:
    with pytest.raises(RigdError, match=r"test\.lock: not valid JSON"):
        debs.parse_lock("{", Path("test.lock"))


def test_sha256_mismatch_names_both_hashes(tmp_path: Path) -> None:
    f = tmp_path / "x.deb"
    f.write_bytes(b"hello")
    pin = debs.DebPin("x", "1", "0" * 64)
    with pytest.raises(RigdError) as err:
        debs.verify_sha256(f, pin)
    assert err.value.data["expected"] == "0" * 64
    assert err.value.data["actual"] == hashlib.sha256(b"hello").hexdigest()
    debs.verify_sha256(f, debs.DebPin("x", "1", hashlib.sha256(b"hello").hexdigest()))


def test_fetch_with_a_wrong_hash_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # apt is replaced by a stub that "downloads" bytes that do not match the pin.
    def fake_run(self: debs.PrivateApt, tool: str, *args: str, cwd: Path | None = None) -> str:
        assert tool == "apt-get" and args[0] == "download" and cwd is not None
        (cwd / "x_1_amd64.deb").write_bytes(b"tampered")
        return ""

    monkeypatch.setattr(debs.PrivateApt, "run", fake_run)
    monkeypatch.setattr(debs.PrivateApt, "has_lists", lambda self: True)
    pin = debs.DebPin("x", "1", hashlib.sha256(b"genuine").hexdigest())
    with pytest.raises(RigdError, match="sha256 mismatch"):
        debs.fetch([pin], tmp_path, tmp_path / "sources", print)
    assert list((tmp_path / "debs").iterdir()) == []


def test_fetch_stores_a_verified_download_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_run(self: debs.PrivateApt, tool: str, *args: str, cwd: Path | None = None) -> str:
        calls.append(args[1])
        assert cwd is not None
        (cwd / "x_1_amd64.deb").write_bytes(b"genuine")
        return ""

    monkeypatch.setattr(debs.PrivateApt, "run", fake_run)
    monkeypatch.setattr(debs.PrivateApt, "has_lists", lambda self: True)
    pin = debs.DebPin("x", "1:2", hashlib.sha256(b"genuine").hexdigest())
    (a,) = debs.fetch([pin], tmp_path, tmp_path / "sources", print)
    (b,) = debs.fetch([pin], tmp_path, tmp_path / "sources", print)
    assert a == b and a.read_bytes() == b"genuine" and calls == ["x=1:2"]


def test_the_repository_lock_files_are_valid() -> None:
    r = Recipes.find()
    for path, _follow in r.locks():
        lock = debs.load_lock(path)
        assert lock.packages
    assert debs.load_lock(r.kernel_lock).packages[0].name.startswith("linux-image-")
