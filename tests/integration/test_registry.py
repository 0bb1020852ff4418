"""rigd's registry client against a real registry on loopback (Debian's ``docker-registry``),
with images written here as OCI layouts and pushed by ``skopeo``: pulls by tag and digest,
a multi-arch index, shared layers fetched once, a tampered blob refused and not kept, an
interrupted pull resumed, basic auth and the bearer-token dance, and layers with ``../``,
absolute paths, symlinked parents and whiteouts applied safely. No VM is booted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from rigd.errors import RigdError
from rigd.images import oci
from rigd.images.blobs import BlobStore
from rigd.images.pack import unpack_layers
from rigd.images.registry import (
    Credentials,
    Progress,
    RegistryClient,
    RegistryError,
    parse_reference,
)
from tests.integration.conftest import REPO, Server, make_data_dir, remove_tree, serving
from tests.integration.local_registry import (
    PASSWORD,
    SKOPEO,
    USER,
    Entry,
    Layout,
    LocalRegistry,
    layer_tar,
    running,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not (shutil.which("docker-registry") and shutil.which("skopeo")),
                       reason="needs docker-registry and skopeo (make test installs them)"),
]

BASE = layer_tar([Entry("etc", kind="dir"), Entry("etc/os-release", b'ID=rigdtest\nNAME="rigd test"\n'),
                  Entry("bin", kind="dir"), Entry("bin/hello", b"#!/bin/sh\necho hi\n", mode=0o755)])
APP = layer_tar([Entry("app", kind="dir"), Entry("app/one.txt", b"one\n")])
OTHER = layer_tar([Entry("app", kind="dir"), Entry("app/two.txt", b"two\n")])
BIG = layer_tar([Entry("big.bin", os.urandom(24 << 20))])


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    lay = Layout(tmp_path_factory.mktemp("layout"))
    lay.tag(lay.image([BASE, APP]), "app")
    lay.tag(lay.image([BASE, OTHER]), "other")
    amd = lay.image([BASE, APP], arch="amd64", label="amd64")
    arm = lay.image([BASE, OTHER], arch="arm64", label="arm64")
    lay.tag(lay.index([arm, amd]), "multi")
    lay.tag(lay.image([BASE, BIG]), "big")
    return lay


@pytest.fixture(scope="module")
def plain(layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(tmp_path_factory.mktemp("plain")) as reg:
        for tag in ("app", "other", "big"):
            reg.push(layout.root, tag, "t/img")
        reg.push(layout.root, "multi", "t/img", all_platforms=True)
        yield reg.host


def store_at(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "oci")


def client(host: str, creds: Credentials | None = None, *also_plain: str) -> RegistryClient:
    return RegistryClient(insecure=[host, *also_plain], credentials={host: creds} if creds else None)


def realm(reg: LocalRegistry) -> str:
    """The token server's host:port: plain HTTP on loopback, so named insecure like the registry."""
    assert reg.token is not None
    return reg.token.realm.split("/")[2]


def skopeo_digest(host: str, ref: str, *, creds: bool = False) -> str:
    argv = [SKOPEO, "inspect", "--tls-verify=false", "--raw", f"docker://{host}/{ref}"]
    if creds:
        argv.insert(2, f"--creds={USER}:{PASSWORD}")
    raw = subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout
    return "sha256:" + hashlib.sha256(raw).hexdigest()


async def test_a_tag_is_pinned_to_the_digest_and_a_digest_pull_fetches_nothing_again(
        plain: str, tmp_path: Path) -> None:
    store = store_at(tmp_path)
    seen: list[dict[str, object]] = []
    pulled = await client(plain).pull(parse_reference(f"{plain}/t/img:app"), store,
                                      lambda p: seen.append(p.to_json()))
    assert pulled.digest == skopeo_digest(plain, "t/img:app")
    assert str(pulled.reference) == f"{plain}/t/img:app@{pulled.digest}"
    manifest = oci.load_manifest(store.root, pulled.digest)
    assert len(pulled.fetched) == 3 and set(pulled.fetched) == {manifest.config.digest,
                                                                *(layer.digest for layer in manifest.layers)}
    for desc in (manifest.config, *manifest.layers):
        oci.verify_blob(store.root, desc)
        assert oct(store.path(desc.digest).stat().st_mode & 0o777) == "0o444"
    assert seen[0]["phase"] == "resolving" and seen[-1]["phase"] == "done"
    assert seen[-1]["doneBytes"] == seen[-1]["totalBytes"] == pulled.total_bytes
    again = await client(plain).pull(parse_reference(f"{plain}/t/img@{pulled.digest}"), store)
    assert again.digest == pulled.digest and again.fetched == () and again.fetched_bytes == 0
    listed = {i["reference"]: i for i in store.images()}
    assert listed[f"{plain}/t/img:app"]["digest"] == pulled.digest
    assert listed[f"{plain}/t/img@{pulled.digest}"]["digest"] == pulled.digest
    assert list(store.partial.iterdir()) == []


async def test_a_second_image_fetches_only_its_own_layers(plain: str, tmp_path: Path) -> None:
    store = store_at(tmp_path)
    first = await client(plain).pull(parse_reference(f"{plain}/t/img:app"), store)
    second = await client(plain).pull(parse_reference(f"{plain}/t/img:other"), store)
    base = oci.load_manifest(store.root, first.digest).layers[0]
    other = oci.load_manifest(store.root, second.digest)
    assert other.layers[0] == base and base.digest not in second.fetched
    assert set(second.fetched) == {other.config.digest, other.layers[1].digest}
    assert second.reused_bytes == base.size


async def test_an_index_picks_the_hosts_platform(plain: str, tmp_path: Path) -> None:
    store = store_at(tmp_path)
    pulled = await client(plain).pull(parse_reference(f"{plain}/t/img:multi"), store)
    assert pulled.index_digest == skopeo_digest(plain, "t/img:multi")
    config = oci.load_config(store.root, oci.load_manifest(store.root, pulled.digest))
    assert config["architecture"] == "amd64" and config["config"]["Labels"] == {"test": "amd64"}
    # The layout resolves the index the same way (what a pack is built from).
    assert oci.load_manifest(store.root, pulled.index_digest).digest == pulled.digest


async def test_a_tampered_blob_is_refused_and_nothing_is_kept(layout: Layout, tmp_path: Path) -> None:
    with running(tmp_path / "reg") as reg:
        reg.push(layout.root, "app", "t/img")
        ref = parse_reference(f"{reg.host}/t/img:app")
        store = store_at(tmp_path)
        body, _media, _digest = await client(reg.host).manifest(ref, "app")
        layer = json.loads(body)["layers"][1]["digest"]
        data = bytearray(reg.blob_file(layer).read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes
        reg.blob_file(layer).write_bytes(bytes(data))
        with pytest.raises(RegistryError, match="does not match its descriptor"):
            await client(reg.host).pull(ref, store)
        # The bad blob is neither kept nor left to resume (blobs cancelled beside it may be).
        assert not store.path(layer).exists() and not (store.partial / layer[7:]).exists()
        assert store.images() == []


class Interrupt(Exception):
    pass


async def test_an_interrupted_pull_resumes_without_refetching_finished_blobs(plain: str, tmp_path: Path) -> None:
    store = store_at(tmp_path)
    ref = parse_reference(f"{plain}/t/img:big")

    def stop_midway(p: Progress) -> None:
        if p.fetched_bytes >= 8 << 20:
            raise Interrupt

    with pytest.raises(BaseExceptionGroup) as err:
        await client(plain).pull(ref, store, stop_midway)
    assert err.group_contains(Interrupt)
    partial = {p.name: p.stat().st_size for p in store.partial.iterdir()}
    finished = {f"sha256:{p.name}" for p in store.blobs.iterdir() if p.is_file()}
    assert partial and all(n > 0 for n in partial.values()), partial
    pulled = await client(plain).pull(ref, store)
    assert not finished & set(pulled.fetched)  # what was finished is not fetched again
    big = max(oci.load_manifest(store.root, pulled.digest).layers, key=lambda d: d.size)
    # What the first pull left is kept and only the rest asked for (Range).
    assert pulled.fetched_bytes + pulled.reused_bytes == pulled.total_bytes
    assert pulled.reused_bytes >= sum(partial.values())
    oci.verify_blob(store.root, big)
    assert list(store.partial.iterdir()) == []


async def test_basic_auth_is_answered_with_the_credentials_only(layout: Layout, tmp_path: Path) -> None:
    with running(tmp_path / "reg", "basic") as reg:
        reg.push(layout.root, "app", "t/img")
        ref = parse_reference(f"{reg.host}/t/img:app")
        with pytest.raises(RegistryError, match="needs a username and password"):
            await client(reg.host).pull(ref, store_at(tmp_path / "a"))
        with pytest.raises(RegistryError, match="401"):
            await client(reg.host, Credentials(USER, "wrong")).pull(ref, store_at(tmp_path / "b"))
        pulled = await client(reg.host, Credentials(USER, PASSWORD)).pull(ref, store_at(tmp_path / "c"))
        assert pulled.digest == skopeo_digest(reg.host, "t/img:app", creds=True)
        # A registry not named insecure is reached over HTTPS only: the credentials never go in clear.
        strict = RegistryClient(credentials={reg.host: Credentials(USER, PASSWORD)})
        with pytest.raises(RegistryError, match="TLS with"):
            await strict.pull(ref, store_at(tmp_path / "d"))


async def test_the_bearer_dance_gets_a_token_for_the_scope(layout: Layout, tmp_path: Path) -> None:
    with running(tmp_path / "reg", "token") as reg:
        reg.push(layout.root, "app", "t/img")
        assert reg.token is not None
        reg.token.requests.clear()
        ref = parse_reference(f"{reg.host}/t/img:app")
        with pytest.raises(RegistryError, match="refused a token"):
            await client(reg.host, None, realm(reg)).pull(ref, store_at(tmp_path / "a"))
        pulled = await client(reg.host, Credentials(USER, PASSWORD), realm(reg)).pull(ref, store_at(tmp_path / "b"))
        asked = [r for r in reg.token.requests if r["user"] == USER]  # before skopeo asks for its own
        assert asked and {r["scope"] for r in asked} == {"repository:t/img:pull"}, reg.token.requests
        # One token serves the whole pull (manifest and blobs): it is kept for its lifetime.
        assert len(asked) == 1, reg.token.requests
        assert pulled.digest == skopeo_digest(reg.host, "t/img:app", creds=True)


async def test_anonymous_pulls_get_an_anonymous_token(layout: Layout, tmp_path: Path) -> None:
    with running(tmp_path / "reg", "token", anonymous_pull=True) as reg:
        reg.push(layout.root, "app", "t/img")
        assert reg.token is not None
        pulled = await client(reg.host, None, realm(reg)).pull(parse_reference(f"{reg.host}/t/img:app"),
                                                              store_at(tmp_path))
        assert pulled.fetched and reg.token.requests[-1]["user"] is None


async def test_a_missing_tag_or_repository_is_a_readable_error(plain: str, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="HTTP 404") as err:
        await client(plain).pull(parse_reference(f"{plain}/t/img:nope"), store_at(tmp_path))
    assert "MANIFEST_UNKNOWN" in str(err.value) or "manifest unknown" in str(err.value).lower()
    with pytest.raises(RegistryError, match="cannot reach"):
        await client("127.0.0.1:9").pull(parse_reference("127.0.0.1:9/t/img:app"), store_at(tmp_path))


# --- layers applied safely ----------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="unpacks as root (numeric owners)")
async def test_layers_apply_whiteouts_and_absolute_paths_and_refuse_escapes(tmp_path: Path) -> None:
    lay = Layout(tmp_path / "layout")
    base = layer_tar([Entry("etc", kind="dir"), Entry("etc/a", b"a"), Entry("etc/b", b"b"),
                      Entry("opt", kind="dir"), Entry("opt/old", b"old"),
                      Entry("evil", kind="symlink", link=str(tmp_path / "outside"))])
    upper = layer_tar([Entry("etc/.wh.a"), Entry("opt/.wh..wh..opq"), Entry("opt/new", b"new"),
                       Entry("/abs.txt", b"absolute")])
    through = layer_tar([Entry("evil/x", b"escaped")])
    dotdot = layer_tar([Entry("../escape.txt", b"escaped")])
    good = lay.image([base, upper])
    bad_link = lay.image([base, through])
    bad_dots = lay.image([base, dotdot])
    (tmp_path / "outside").mkdir()

    def unpack(desc: dict[str, object], name: str) -> Path:
        tree = tmp_path / name
        tree.mkdir()
        unpack_layers(lay.root, oci.load_manifest(lay.root, str(desc["digest"])), tree, tmp_path / f"{name}.fr")
        return tree

    tree = await trio.to_thread.run_sync(unpack, good, "good")
    assert sorted(p.name for p in (tree / "etc").iterdir()) == ["b"]  # .wh.a removed a
    assert sorted(p.name for p in (tree / "opt").iterdir()) == ["new"]  # the opaque dir hid old
    assert (tree / "abs.txt").read_bytes() == b"absolute"  # under the root, not at /
    assert not Path("/abs.txt").exists()
    assert not any(p.name.startswith(".wh.") for p in tree.rglob("*"))
    with pytest.raises(RigdError, match="through the symlink"):
        await trio.to_thread.run_sync(unpack, bad_link, "link")
    with pytest.raises(RigdError, match="escapes the root"):
        await trio.to_thread.run_sync(unpack, bad_dots, "dots")
    assert list((tmp_path / "outside").iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


# --- through the server ----------------------------------------------------------------------


def pull_through(srv: Server, ref: str, deadline_s: float = 60) -> dict[str, Any]:
    """``image.pull`` on the server, then its job once it is no longer running."""
    job = srv.call("image.pull", {"ref": ref})
    deadline = time.monotonic() + deadline_s
    while job["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
        job = srv.call("image.pullStatus", {"pullId": job["pullId"]})
    return dict(job)


def test_the_server_pulls_lists_and_removes_through_the_rpc_and_the_cli(plain: str, tmp_path: Path) -> None:
    with serving(make_data_dir(), "--no-warm-starts", "--network", "none", "--insecure-registry", plain) as srv:
        env = {**os.environ, "PYTHONPATH": str(REPO), "RIGD_URL": srv.url, "RIGD_TOKEN": srv.token}
        cli = [sys.executable, "-m", "rigd", "images"]
        out = subprocess.run([*cli, "pull", f"{plain}/t/img:app"], capture_output=True, text=True,
                             timeout=120, env=env, cwd=REPO)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith(f"{plain}/t/img:app@sha256:"), out.stdout
        # A second image sharing the base fetches only its own blobs; the job says so.
        job = pull_through(srv, f"{plain}/t/img:other")
        assert job["state"] == "done" and job["image"]["reusedBytes"] > 0, job
        listed = srv.call("image.list", {"source": "registry"})
        assert {row["reference"] for row in listed} == {f"{plain}/t/img:app", f"{plain}/t/img:other"}
        assert [i for i in srv.call("image.list") if i["state"] == "imported"] == []  # desktop imports, as before
        # Bad input names the field; nothing reaches a registry.
        for bad in ("/etc/passwd", "docker-archive:x.tar", "--help", "img.tar"):
            assert srv.error("image.pull", {"ref": bad})["data"]["field"] == "ref"
        assert srv.error("image.list", {"source": "disk"})["data"]["field"] == "source"
        assert srv.error("image.rm", {"ref": "nope:1"})["data"]["field"] == "ref"
        failed = pull_through(srv, "127.0.0.1:9/t/img:app")  # refused: not insecure → TLS
        assert failed["state"] == "failed" and "cannot reach" in failed["error"]["message"], failed
        # rm deletes what only that image used; the shared base stays for the other.
        removed = subprocess.run([*cli, "rm", f"{plain}/t/img:other"], capture_output=True, text=True,
                                 timeout=60, env=env, cwd=REPO)
        assert removed.returncode == 0 and "3 blobs deleted" in removed.stdout, removed.stdout + removed.stderr
        shown = subprocess.run([*cli, "list"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
        assert shown.returncode == 0 and f"{plain}/t/img:app" in shown.stdout and ":other" not in shown.stdout
        store = BlobStore(srv.data_dir / "rigs" / "oci")
        [app] = store.images()
        manifest = oci.load_manifest(store.root, str(app["digest"]))
        for desc in (manifest.config, *manifest.layers):
            oci.verify_blob(store.root, desc)


async def test_an_https_registry_is_verified_and_gets_the_credentials(layout: Layout, tmp_path: Path) -> None:
    """Over HTTPS (a trustme CA the client is given) basic credentials are sent; a client that
    does not trust the CA refuses the registry before sending anything."""
    ca = trustme.CA()
    with running(tmp_path / "reg", "basic", tls=ca) as reg:
        reg.push(layout.root, "app", "t/img")
        ref = parse_reference(f"{reg.host}/t/img:app")
        trusted = ssl.create_default_context()
        ca.configure_trust(trusted)
        secure = RegistryClient(credentials={reg.host: Credentials(USER, PASSWORD)}, ssl_context=trusted)
        pulled = await secure.pull(ref, store_at(tmp_path / "a"))
        assert pulled.fetched and pulled.digest.startswith("sha256:")
        stranger = RegistryClient(credentials={reg.host: Credentials(USER, PASSWORD)})
        with pytest.raises(RegistryError, match="TLS with"):
            await stranger.pull(ref, store_at(tmp_path / "b"))


def test_the_server_pulls_with_the_credentials_file_it_was_given(layout: Layout, tmp_path: Path) -> None:
    with running(tmp_path / "reg", "basic") as reg:
        reg.push(layout.root, "app", "t/img")
        auth = tmp_path / "auth.json"
        auth.write_text(json.dumps({"auths": {reg.host: {"username": USER, "password": PASSWORD}}}))
        auth.chmod(0o644)
        # Readable by others: the server refuses to start, naming the file and the fix.
        refused = make_data_dir()
        try:
            out = subprocess.run([sys.executable, "-m", "rigd", "serve", "--data-dir", str(refused),
                                  "--port", "0", "--accel", "tcg", "--registry-auth", str(auth)],
                                 capture_output=True, text=True, timeout=120, cwd=REPO)
        finally:
            remove_tree(refused)
        assert out.returncode == 2 and "chmod 600" in out.stderr and str(auth) in out.stderr, out.stderr
        auth.chmod(0o600)
        with serving(make_data_dir(), "--no-warm-starts", "--network", "none", "--insecure-registry", reg.host,
                     "--registry-auth", str(auth)) as srv:
            job = pull_through(srv, f"{reg.host}/t/img:app")
            assert job["state"] == "done", job
            assert job["image"]["digest"] == skopeo_digest(reg.host, "t/img:app", creds=True)
            assert PASSWORD not in srv.log()  # the secret never reaches the log
