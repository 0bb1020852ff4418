"""The registry client's pure parts: references, challenges, URLs, progress."""

from __future__ import annotations

import pytest

from rigd.errors import FieldError
from rigd.images.registry import Progress, Reference, Url, parse_challenge, parse_reference

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
