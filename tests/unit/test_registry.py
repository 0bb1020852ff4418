"""The registry client's pure parts: references, challenges, URLs, progress."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from rigd.errors import FieldError
from rigd.images.registry import (
    Credentials,
    Progress,
    Reference,
    Url,
    load_registry_auth,
    parse_challenge,
    parse_reference,
    parse_registry_auth,
)

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("raw", "want"), [
    ("ubuntu", Reference("docker.io", "library/ubuntu", "latest")),
    ("ubuntu:24.04", Reference("docker.io", "library/ubuntu", "24.04")),
    ("team/app:v1", Reference("docker.io", "team/app", "v1")),
    ("ghcr.io/org/app@" + D, Reference("ghcr.io", "org/app", None, D)),
    ("ghcr.io/org/app:1.2@" + D, Reference("ghcr.io", "org/app", "1.2", D)),
    ("127.0.0.1:5000/t/img:v1", Reference("127.0.0.1:5000", "t/img", "v1")),
    ("localhost/img", Reference("localhost", "img", "latest")),
    ("registry.gitlab.com/a/b/c.d-e__f:tag_1", Reference("registry.gitlab.com", "a/b/c.d-e__f", "tag_1")),
])
def test_references_parse_as_the_registries_name_them(raw: str, want: Reference) -> None:
    got = parse_reference(raw)
    assert got == want
    assert parse_reference(str(got)) == got  # the printed form reads back the same


def test_docker_hub_is_reached_at_its_api_host() -> None:
    assert parse_reference("debian").api_host == "registry-1.docker.io"
    assert parse_reference("quay.io/x/y").api_host == "quay.io"


@pytest.mark.parametrize(("raw", "words"), [
    ("", "image reference"),
    (5, "a string"),
    ("/srv/images/app.tar", "local path"),
    ("./app", "local path"),
    ("~/app", "local path"),
    ("-rf", "option"),
    ("--insecure", "option"),
    ("docker-archive:app.tar", "transport"),
    ("oci:/tmp/layout:tag", "transport"),
    ("oci-archive:x.tar", "transport"),
    ("docker://debian", "transport"),
    ("https://ghcr.io/org/app", "transport"),
    ("app.tar", "archive"),
    ("team/app:image.tar.gz", "archive"),
    ("Ubuntu", "repository name"),
    ("ubuntu:", "not a tag"),
    ("ubuntu:" + "x" * 129, "not a tag"),
    ("ubuntu@sha256:xyz", "sha256 digest"),
    ("ubuntu@" + D.upper(), "sha256 digest"),
    ("host:99x/app", "registry host"),
    ("ubuntu latest", "spaces"),
    ("ubuntu\n", "spaces"),
    ("a//b", "repository name"),
    ("x" * 600, "longer than"),
])
def test_anything_but_a_registry_reference_is_refused_naming_the_field(raw: object, words: str) -> None:
    with pytest.raises(FieldError) as err:
        parse_reference(raw, "value")
    assert err.value.field == "value" and words in err.value.reason, err.value.reason


def test_challenges_are_read_as_the_registries_send_them() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/ubuntu:pull"')
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                      "scope": "repository:library/ubuntu:pull"}
    assert parse_challenge('Basic realm="Registry Realm"') == ("basic", {"realm": "Registry Realm"})
    assert parse_challenge('Bearer realm="a\\"b", error=insufficient_scope')[1] == {
        "realm": 'a"b', "error": "insufficient_scope"}
    assert parse_challenge("Negotiate") == ("negotiate", {})


def test_urls_join_redirects_and_keep_default_ports_out_of_the_authority() -> None:
    u = Url.parse("https://ghcr.io/v2/org/app/blobs/" + D)
    assert (u.port, u.authority) == (443, "ghcr.io")
    cdn = u.join("https://pkg-containers.githubusercontent.com/ghcr1/blobs/x?sig=1")
    assert cdn.authority == "pkg-containers.githubusercontent.com" and cdn.target == "/ghcr1/blobs/x?sig=1"
    assert u.join("/v2/other").target == "/v2/other"
    assert Url.parse("http://127.0.0.1:5000/v2/").authority == "127.0.0.1:5000"


def test_progress_states_rate_and_eta() -> None:
    p = Progress("r", total_bytes=100, done_bytes=40, fetched_bytes=40, started=0.0)
    out = p.to_json()
    assert out["totalBytes"] == 100 and out["doneBytes"] == 40 and out["etaSeconds"] is not None
    assert Progress("r").to_json()["etaSeconds"] is None


# --- credentials for the server's pulls ---------------------------------------------------


def test_a_docker_config_json_gives_credentials_per_registry_host() -> None:
    text = json.dumps({"auths": {
        "https://index.docker.io/v1/": {"auth": base64.b64encode(b"hubuser:hub:pass").decode()},
        "ghcr.io": {"username": "me", "password": "ghp_secret"},
        "127.0.0.1:5000": {"auth": base64.b64encode(b"u:p").decode(), "email": "x@y"},
    }, "credsStore": "ignored"})
    creds = parse_registry_auth(text)
    assert creds["docker.io"] == Credentials("hubuser", "hub:pass")  # a password may hold ':'
    assert creds["ghcr.io"] == Credentials("me", "ghp_secret")
    assert creds["127.0.0.1:5000"] == Credentials("u", "p")
    assert "ghp_secret" not in repr(creds)


@pytest.mark.parametrize(("text", "says"), [
    ("{", "is not JSON"),
    ('{"auths": []}', '"auths"'),
    ('{"auths": {"ghcr.io": "token"}}', "auths['ghcr.io']"),
    ('{"auths": {"ghcr.io": {"auth": "!!!"}}}', "not base64"),
    ('{"auths": {"ghcr.io": {"auth": "' + base64.b64encode(b"nocolon").decode() + '"}}}', "not base64"),
    ('{"auths": {"ghcr.io": {"username": "me"}}}', 'needs "auth"'),
    ('{"auths": {"bad host": {"username": "me", "password": "pw-secret"}}}', "not a registry host"),
])
def test_a_bad_credentials_file_names_the_entry_and_never_the_secret(text: str, says: str) -> None:
    with pytest.raises(FieldError) as exc:
        parse_registry_auth(text, "auth.json")
    assert says in exc.value.message and "auth.json" in exc.value.message
    assert "pw-secret" not in exc.value.message


def test_a_credentials_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry-auth.json"
    path.write_text('{"auths": {"ghcr.io": {"username": "me", "password": "pw"}}}')
    path.chmod(0o644)
    with pytest.raises(FieldError, match="chmod 600"):
        load_registry_auth(path)
    path.chmod(0o600)
    assert load_registry_auth(path)["ghcr.io"].username == "me"
    with pytest.raises(FieldError, match="cannot be read"):
        load_registry_auth(tmp_path / "absent.json")
