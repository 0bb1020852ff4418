"""Browser profiles: sealed at rest, scoped to owner, engine and name, and parsed as guest data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rigd.browser.profiles import (
    MAX_TABS,
    ProfileRef,
    ProfileState,
    ProfileStore,
    cookie_param,
    parse_profile_name,
    parse_state,
)
from rigd.errors import FieldError, RigdError
from rigd.rigs.params import parse_open

COOKIE = {"name": "session", "value": "s3cr3t-cookie-value", "domain": "pages.test", "path": "/",
          "expires": 1893456000.5, "size": 30, "httpOnly": True, "secure": False, "session": False,
          "sameSite": "Lax", "priority": "Medium", "sameParty": False, "sourceScheme": "NonSecure",
          "sourcePort": 80}


def _state() -> ProfileState:
    return parse_state({"cookies": [COOKIE], "tabs": ["http://pages.test/a", "file:///etc/passwd"],
                        "storage": {"http://pages.test": {"k": "v"}}})


def test_a_profile_round_trips_sealed_and_private(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    ref = ProfileRef("user_1", "work")
    assert store.load(ref, "chromium") is None
    store.save(ref, "chromium", _state())
    path = store.path(ref, "chromium")
    raw = path.read_bytes()
    assert b"s3cr3t" not in raw and b"pages.test" not in raw  # encrypted at rest
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "profiles" / "key").stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    got = store.load(ref, "chromium")
    assert got is not None and got.to_json() == _state().to_json()
    assert got.tabs == ["http://pages.test/a"]  # file: tabs are never kept
    assert got.cookies[0]["value"] == "s3cr3t-cookie-value" and "size" not in got.cookies[0]
    # A save replaces the file whole (no temp file left).
    store.save(ref, "chromium", ProfileState())
    assert [p.name for p in path.parent.iterdir()] == ["work.rprof"]


def test_a_file_moved_to_another_owner_or_name_or_tampered_does_not_open(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    mine, theirs = ProfileRef("user_1", "work"), ProfileRef("user_2", "work")
    store.save(mine, "chromium", _state())
    target = store.path(theirs, "chromium")
    target.parent.mkdir(parents=True)
    target.write_bytes(store.path(mine, "chromium").read_bytes())
    with pytest.raises(RigdError, match="does not open"):
        store.load(theirs, "chromium")
    data = bytearray(store.path(mine, "chromium").read_bytes())
    data[-1] ^= 1
    store.path(mine, "chromium").write_bytes(bytes(data))
    with pytest.raises(RigdError, match="does not open"):
        store.load(mine, "chromium")
    store.path(mine, "chromium").write_bytes(b"garbage")
    with pytest.raises(RigdError, match="not a rigd profile"):
        store.load(mine, "chromium")


def test_names_and_paths_are_checked() -> None:
    for good in ("work", "a", "Work.2-x_y", "x" * 64):
        assert parse_profile_name(good) == good
    for bad in ("", ".hidden", "../x", "a/b", "x" * 65, 7, None, "é"):
        with pytest.raises(FieldError) as exc:
            parse_profile_name(bad)
        assert exc.value.field == "profile"
    store = ProfileStore(Path("/nonexistent"))
    for ref, engine in ((ProfileRef("../u", "w"), "chromium"), (ProfileRef("u", "w"), "../e")):
        with pytest.raises(RigdError):
            store.path(ref, engine)


def test_what_a_guest_says_is_parsed_and_capped() -> None:
    assert cookie_param({"name": "a"}) is None  # no value, no domain
    assert cookie_param({"name": "a", "value": "b", "domain": "x.test", "sameSite": "Bogus",
                         "httpOnly": "yes", "expires": True})  == {"name": "a", "value": "b", "domain": "x.test"}
    assert cookie_param({"name": "a", "value": "x" * 9000, "domain": "x.test"}) is None
    session = cookie_param({**COOKIE, "session": True})
    assert session is not None and "expires" not in session
    state = parse_state({"cookies": [COOKIE, 5, {"name": []}], "tabs": ["javascript:alert(1)"]
                         + [f"https://t{i}.test/" for i in range(100)],
                         "storage": {"http://x.test": {"k": "v", "n": 3}, "not an origin": {"k": "v"},
                                     "https://y.test:8443": {}}})
    assert len(state.cookies) == 1 and len(state.tabs) == MAX_TABS
    assert state.storage == {"http://x.test": {"k": "v"}}
    with pytest.raises(RigdError):
        parse_state([1, 2])
    assert json.loads(json.dumps(state.to_json())) == state.to_json()


def test_only_browser_rigs_take_a_profile() -> None:
    p = parse_open({"workspace": "w", "surface": "browser", "profile": "work"})
    assert p.profile == "work"
    assert parse_open({"workspace": "w", "surface": "browser"}).profile is None
    for params, fragment in (({"surface": "terminal", "profile": "work"}, "only browser rigs"),
                             ({"surface": "browser", "profile": "../x"}, "letters")):
        with pytest.raises(FieldError) as exc:
            parse_open({"workspace": "w", **params})
        assert exc.value.field == "profile" and fragment in exc.value.message


def test_two_stores_on_one_data_dir_share_one_key(tmp_path: Path) -> None:
    a, b = ProfileStore(tmp_path), ProfileStore(tmp_path)
    a.save(ProfileRef("u", "p"), "chromium", _state())
    assert b.load(ProfileRef("u", "p"), "chromium") is not None
    assert oct(os.stat(tmp_path / "profiles").st_mode & 0o777) == "0o700"
