"""Cache keys and atomic builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigd.images.cache import cached_build, recipe_key


def test_key_changes_with_content_and_presence(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1")
    k1 = recipe_key([a, b], root=tmp_path)
    a.write_text("2")
    k2 = recipe_key([a, b], root=tmp_path)
    b.write_text("")
    k3 = recipe_key([a, b], root=tmp_path)
    assert len({k1, k2, k3}) == 3
    assert recipe_key([b, a], root=tmp_path) == k3  # order does not matter


def test_failed_build_leaves_nothing_and_a_later_build_is_cached(tmp_path: Path) -> None:
    logs: list[str] = []

    def boom(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cached_build(tmp_path / "kind", "k1", "thing", boom, logs.append)
    assert [p.name for p in (tmp_path / "kind").iterdir()] == [".lock"]

    calls: list[Path] = []

    def ok(out: Path) -> None:
        calls.append(out)
        (out / "result").write_text("done")

    d1 = cached_build(tmp_path / "kind", "k1", "thing", ok, logs.append)
    d2 = cached_build(tmp_path / "kind", "k1", "thing", ok, logs.append)
    assert d1 == d2 == tmp_path / "kind" / "k1"
    assert (d1 / "result").read_text() == "done" and len(calls) == 1
    assert logs[-1].startswith("thing: cached")
