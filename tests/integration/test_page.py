"""The settings page in a real browser: Playwright for Python driving Debian's
``chromium`` (``executable_path``; never ``playwright install``) against a real
``rigd serve`` with real rigs under TCG.

One browser for the module, on the run's shared desktop server (tests
conftest ``desktop_server``: its desktops start warm); each test has its own
browser context (its own cookies). Every request a page makes is recorded: all of
them go to rigd itself. Screenshots of the page are kept as test artifacts
(``evidence.keep``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright_sync

from tests.integration.conftest import ARTIFACTS, Server, make_data_dir, serving

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

CHROMIUM = "/usr/bin/chromium"
HOME = "/settings/server/rigs"
#: Playwright's own waits (ms): generous, a rig boots under TCG.
BOOT_MS = 300_000
UI_MS = 30_000


@dataclass
class Site:
    srv: Server
    browser: Any
    requests: list[str] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)

    def context(self) -> Any:
        ctx = self.browser.new_context(viewport={"width": 1280, "height": 800}, base_url=self.srv.url)
        ctx.set_default_timeout(UI_MS)

        def on_request(req: Any) -> None:
            self.requests.append(req.url)

        def on_response(res: Any) -> None:
            path = res.url.split(self.srv.url, 1)[-1].split("?", 1)[0]
            if path.startswith("/static/") or path.startswith(HOME):
                with contextlib.suppress(Exception):  # a redirect or an aborted load has no body
                    self.weights[path if path.startswith("/static/") else "shell"] = len(res.body())

        ctx.on("request", on_request)
        ctx.on("response", on_response)
        return ctx


@pytest.fixture(scope="module")
def site(desktop_server: Server) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/install-deps.sh installs Debian's chromium")
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield Site(desktop_server, browser)
        finally:
            browser.close()


def sign_in(page: Any, token: str, path: str = HOME) -> None:
    page.goto(path)
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()


def person(site: Site, name: str, kind: str = "person", member: bool = False) -> str:
    user = site.srv.call("user.create", {"name": name, "kind": kind})
    if member:
        site.srv.call("member.add", {"workspace": "default", "user": user["id"]})
    return str(site.srv.call("token.create", {"user": user["id"]})["token"])


def exec_text(srv: Server, rig: str, command: str, token: str | None = None) -> dict[str, Any]:
    return dict(srv.call("rig.act", {"rigId": rig, "tool": "terminal_use",
                                     "action": {"action": "exec", "command": command, "timeoutS": 60,
                                                "user": "root"}}, token=token))


def wait_exec(srv: Server, rig: str, command: str, deadline_s: float = 120, token: str | None = None) -> str:
    end = time.monotonic() + deadline_s
    while True:
        out = exec_text(srv, rig, command, token)
        if out["exitCode"] == 0:
            return str(out["stdout"]["text"])
        assert time.monotonic() < end, f"{command!r} never succeeded: {out}"
        time.sleep(1)


def open_from_page(page: Any, surface: str) -> str:
    """Open a rig with the page's own form; the row appears at once, before the rig is ready
    (issue 28: the page opens without waiting), and reaches ready without a reload."""
    before = set(page.locator("#rigs-body tr[data-rig]").evaluate_all("rs => rs.map(r => r.dataset.rig)"))
    # Every phase each row shows, in order, as the page renders it.
    page.evaluate("""() => {
      window.__phases = {};
      const seen = () => { for (const r of document.querySelectorAll('#rigs-body tr[data-rig]')) {
        const p = (window.__phases[r.dataset.rig] ||= []);
        if (p[p.length - 1] !== r.dataset.phase) p.push(r.dataset.phase); } };
      window.__phasesObserver?.disconnect();
      window.__phasesObserver = new MutationObserver(seen);
      window.__phasesObserver.observe(document.querySelector('#rigs-body'),
        { subtree: true, childList: true, attributes: true, attributeFilter: ['data-phase'] });
    }""")
    page.get_by_label("Surface").select_option(surface)
    page.get_by_role("button", name="Open rig").click()
    row = page.locator("#rigs-body tr[data-rig][data-phase=ready]")
    page.wait_for_function(
        "before => [...document.querySelectorAll('#rigs-body tr[data-rig][data-phase=ready]')]"
        ".some(r => !before.includes(r.dataset.rig))", arg=list(before), timeout=BOOT_MS)
    ids = [r for r in row.evaluate_all("rs => rs.map(r => r.dataset.rig)") if r not in before]
    assert len(ids) == 1, ids
    phases = page.evaluate("id => window.__phases[id]", ids[0])
    assert phases[0] == "provisioning" and phases[-1] == "ready", phases
    return str(ids[0])


# -- sign-in and its refusals ---------------------------------------------------------


def test_sign_in_refuses_wrong_and_agent_tokens_and_sets_no_cookie(site: Site) -> None:
    ctx = site.context()
    page = ctx.new_page()
    sign_in(page, "not-a-token")
    page.get_by_text("unknown or revoked token").wait_for()
    assert ctx.cookies() == []
    agent = person(site, "page-agent", kind="agent")
    page.get_by_label("Token").fill(agent)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("an agent token cannot sign in").wait_for()
    assert ctx.cookies() == []
    # The admin signs in; the cookie is HttpOnly and SameSite=Strict.
    page.get_by_label("Token").fill(site.srv.token)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#rigs-title").wait_for()
    [cookie] = ctx.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["name"] == "rigd_session"
    assert site.srv.token not in json.dumps(ctx.cookies())
    # The header shows the accelerator, the network mode and the memory budget.
    facts = page.locator("#server-facts").inner_text()
    assert "tcg" in facts and "Network" in facts and "MB" in facts
    assert "not a security boundary" in facts
    # A browser rig is opened with its engine: one choice per engine the server starts. The
    # choices come from the server's info after sign-in: wait until they are there.
    page.locator("#open-surface option[value='terminal']").wait_for(state="attached")
    choices = page.locator("#open-surface option").evaluate_all("os => os.map(o => [o.value, o.textContent])")
    assert ["browser:firefox", "browser (firefox)"] in choices and ["terminal", "terminal"] in choices, choices
    # A forged cross-origin POST with the person's cookie is refused, naming Origin.
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "rig.open", "params": {"workspace": "default", "surface": "terminal"}}
    forged = ctx.request.post(site.srv.url + "/rpc", data=json.dumps(rpc),
                              headers={"Origin": "http://evil.example", "Content-Type": "application/json"})
    assert forged.status == 403
    assert forged.json()["error"]["data"]["field"] == "Origin"
    assert site.srv.call("rig.list", {"workspace": "default"}) == []
    # Sign-out ends the session: the next call is refused and the page asks again.
    page.get_by_role("button", name="Sign out").click()
    page.get_by_label("Token").wait_for()
    whoami = ctx.request.post(site.srv.url + "/rpc", data=json.dumps({**rpc, "method": "whoami", "params": {}}),
                              headers={"Origin": site.srv.url, "Content-Type": "application/json"})
    assert whoami.status == 401
    ctx.close()


def test_a_person_without_membership_sees_no_rigs(site: Site) -> None:
    token = person(site, "outsider")
    ctx = site.context()
    page = ctx.new_page()
    sign_in(page, token)
    page.get_by_text("not a member of any workspace").wait_for()
    assert page.locator("#rigs-body tr[data-rig]").count() == 0
    ctx.close()


def test_server_panel_import_names_the_digest_it_got_and_clipboard_choices_stick(site: Site, tmp_path: Path) -> None:
    srv = site.srv
    source = tmp_path / "not-an-image.qcow2"
    source.write_bytes(b"QFI\xfb" + bytes(4 << 20))
    actual = hashlib.sha256(source.read_bytes()).hexdigest()
    ctx = site.context()
    page = ctx.new_page()
    sign_in(page, srv.token)
    page.locator("#images-title").wait_for()
    page.get_by_label("URL or path").fill(str(source))
    page.get_by_label("sha256").fill("0" * 64)
    page.get_by_role("button", name="Import", exact=True).click()
    status = page.locator("#import-status")
    page.wait_for_function("() => document.querySelector('#import-status').dataset.kind === 'error'",
                           timeout=60_000)
    text = status.inner_text()
    assert actual in text and "0" * 64 in text, text
    assert not page.locator("#import-progress").is_visible()
    # A field error names the field before any job starts.
    page.get_by_label("URL or path").fill(str(source))
    page.get_by_label("sha256").evaluate("i => { i.removeAttribute('pattern'); i.value = 'xyz'; }")
    page.get_by_role("button", name="Import", exact=True).click()
    page.wait_for_function("() => document.querySelector('#import-status').textContent.includes('sha256')")
    # The person's clipboard choices are theirs and persist.
    page.get_by_label("Copy from rigs to this computer").select_option("deny")
    page.get_by_text("Saved.").wait_for()
    assert srv.call("clipboard.policy.get")["rigToHost"] == "deny"
    page.reload()
    page.locator("#images-title").wait_for()
    page.wait_for_function("() => document.querySelector('#clip-rig-to-host').value === 'deny'")
    page.get_by_label("Copy from rigs to this computer").select_option("ask")
    page.get_by_text("Saved.").wait_for()
    assert srv.call("clipboard.policy.get")["rigToHost"] == "ask"
    # The admin sees everyone's choices.
    assert "admin" in page.locator("#clip-everyone").inner_text()
    ctx.close()


def test_a_fresh_server_lists_the_built_desktop_image_before_any_import(site: Site) -> None:
    """Right after `make run` built the desktop image (and before a desktop opened), the panel
    lists it as built and imported on first use — never "no desktop image yet"."""
    from rigd.images.cache import sha256_file
    from rigd.images.desktop import find_desktop

    digest = sha256_file(find_desktop().manifest_path)
    with serving(make_data_dir()) as srv:
        rows = srv.call("image.list")
        assert [(r["sha256"], r["state"], r["boots"], r["importedAt"]) for r in rows] == [
            (digest, "built", True, None)], rows
        fresh = Site(srv, site.browser)
        ctx = fresh.context()
        page = ctx.new_page()
        sign_in(page, srv.token)
        row = page.locator(f"#images-body tr[data-sha256='{digest}']")
        row.wait_for()
        assert "built, imported on first use" in row.inner_text()
        assert "No desktop image yet" not in page.locator("#images-body").inner_text()
        ctx.close()


# -- a terminal rig, from the page ---------------------------------------------------


def test_terminal_rig_from_open_to_close(site: Site) -> None:
    srv = site.srv
    ctx = site.context()
    page = ctx.new_page()
    sign_in(page, srv.token)
    page.locator("#rigs-title").wait_for()
    rig = open_from_page(page, "terminal")
    row = page.locator(f"#rigs-body tr[data-rig={rig}]")
    assert "terminal" in row.inner_text() and "not a security boundary" in row.inner_text()

    # Fork and Snapshot (issue 29) are on the row: a copy shows up forked from it; a snapshot
    # is listed with the workspace's, opens no rig until asked, and goes when removed.
    row.get_by_role("button", name=f"Fork {rig}").click()
    copy_row = page.locator("#rigs-body tr", has_text=f"forked from {rig}")
    copy_row.wait_for(timeout=120_000)
    copy = copy_row.get_attribute("data-rig")
    assert copy and copy != rig and copy_row.get_attribute("data-phase") == "ready"
    page.once("dialog", lambda d: d.accept("page-snap"))
    row.get_by_role("button", name=f"Snapshot {rig}").click()
    snap = page.locator("#snapshots-body tr[data-snapshot='page-snap']")
    snap.wait_for(timeout=60_000)
    assert "terminal" in snap.inner_text() and rig in snap.inner_text()
    snap.get_by_role("button", name="Remove snapshot page-snap").click()
    snap.wait_for(state="detached")
    copy_row.get_by_role("button", name=f"Close {copy}").click()
    copy_row.wait_for(state="detached")
    # Volumes: made from the page, listed, removed (attaching one is rig.open's: test_fork).
    page.get_by_label("Name", exact=True).fill("page-vol")
    page.get_by_label("Size (MB)").fill("32")
    page.get_by_role("button", name="Make volume").click()
    vol = page.locator("#volumes-body tr[data-volume='page-vol']")
    vol.wait_for(timeout=60_000)
    assert "32 MB" in vol.inner_text()
    assert [v["name"] for v in srv.call("volume.list", {"workspace": "default"})] == ["page-vol"]
    vol.get_by_role("button", name="Remove volume page-vol").click()
    vol.wait_for(state="detached")
    # Seats: a seat's row (its rig still coming up is enough), handed to the person and back;
    # closing its rig frees it for removal, its volume with it.
    seat_rig = srv.call("rig.open", {"workspace": "default", "surface": "terminal", "seat": "page-seat",
                                     "wait": False})
    page.reload()
    seat = page.locator("#seats-body tr[data-seat='page-seat']")
    seat.wait_for(timeout=30_000)
    assert "seat.page-seat at /workspace" in seat.inner_text()
    seat.get_by_role("button", name="Hand seat page-seat to me").click()
    seat.get_by_role("button", name="Hand seat page-seat back").wait_for(timeout=30_000)
    assert "you" in seat.inner_text()
    [listed] = srv.call("seat.list", {"workspace": "default"})
    assert listed["handedTo"]["id"] == srv.call("whoami")["id"], listed
    seat.get_by_role("button", name="Hand seat page-seat back").click()
    seat.get_by_role("button", name="Hand seat page-seat to me").wait_for(timeout=30_000)
    srv.call("rig.close", {"rigId": seat_rig["id"]})
    page.reload()
    seat.get_by_role("button", name="Remove seat page-seat").click()
    seat.wait_for(state="detached")
    assert srv.call("volume.list", {"workspace": "default"}) == []

    # Logins (issue 30): saved from the page (an http:// site is refused naming the field), listed
    # without the password, which leaves the form once saved; removed again.
    page.fill("#login-site", "http://app.test")
    page.fill("#login-account", "ada")
    page.fill("#login-password", "rgt-page-pw-7c1d")
    page.get_by_role("button", name="Save login").click()
    page.locator("#rigs-status").filter(has_text="https:// origin").wait_for(timeout=30_000)
    assert srv.call("login.list", {"workspace": "default"}) == []
    page.fill("#login-site", "https://App.test")
    page.get_by_role("button", name="Save login").click()
    login = page.locator("#logins-body tr[data-account='ada']")
    login.wait_for(timeout=30_000)
    assert "https://app.test" in login.inner_text() and page.input_value("#login-password") == ""
    assert "rgt-page-pw-7c1d" not in page.content()
    assert [(x["site"], x["account"]) for x in srv.call("login.list", {"workspace": "default"})] == [
        ("https://app.test", "ada")]
    login.get_by_role("button", name="Remove the login ada at https://app.test").click()
    login.wait_for(state="detached")
    assert srv.call("login.list", {"workspace": "default"}) == []

    # Its tab is an interactive terminal over the PTY WebSocket.
    row.get_by_role("link", name=f"Open the tab of {rig}").click()
    page.wait_for_url(f"**{HOME}/{rig}")
    term = page.get_by_role("textbox", name="Terminal")
    page.get_by_text("Connected: this terminal is a shell").wait_for(timeout=60_000)
    term.click()
    # é and 世界 have no key on Playwright's US layout: inserted as text, as a layout or an IME does.
    page.keyboard.type("echo page-$((6*7)) héllo 世界 > /root/page.txt; echo done-$((6*7))")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#terminal').textContent.includes('done-42')",
                           timeout=60_000)
    assert exec_text(srv, rig, "cat /root/page.txt")["stdout"]["text"].strip() == "page-42 héllo 世界"
    # The tab forks too; the copy has what was typed, and its tab says whose copy it is.
    page.get_by_role("button", name="Fork", exact=True).click()
    forked = page.locator("#tab-status a").first
    forked.wait_for(timeout=120_000)
    tab_copy = (forked.text_content() or "").split()[0]
    assert exec_text(srv, tab_copy, "cat /root/page.txt")["stdout"]["text"].strip() == "page-42 héllo 世界"
    srv.call("rig.close", {"rigId": tab_copy})

    # Files: pick two, they land in ~/drops with a progress bar; one comes back out.
    page.locator("#drop-pick").set_input_files([
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello from the page\n"},
        {"name": "blob.bin", "mimeType": "application/octet-stream", "buffer": bytes(range(256)) * 4096},
    ])
    page.get_by_text("Saved /root/drops/notes.txt").wait_for(timeout=60_000)
    assert page.locator("#drop-progress").evaluate("p => p.value === p.max && p.max > 1000000")
    assert exec_text(srv, rig, "sha256sum /root/drops/blob.bin")["stdout"]["text"].split()[0] == \
        hashlib.sha256(bytes(range(256)) * 4096).hexdigest()
    with page.expect_download() as got:
        page.get_by_label("Download a guest path").fill("/root/drops/notes.txt")
        page.get_by_role("button", name="Download").click()
    assert Path(got.value.path()).read_bytes() == b"hello from the page\n"

    # The audit log shows the drop by shape.
    page.get_by_role("button", name="Refresh").click()
    page.locator("#log-body").get_by_text("drop_files").first.wait_for()

    # A server the agent starts in the rig appears as a link, and so does its dev domain.
    exec_text(srv, rig, "mkdir -p /srv/p && echo from-the-rig > /srv/p/index.html && cd /srv/p && "
                        "(setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &)")
    forwarded = page.locator("#rig-ports li[data-guest-port='8000'] a")
    forwarded.wait_for(timeout=60_000)
    url = forwarded.get_attribute("href")
    assert url is not None and url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.read() == b"from-the-rig\n"
    srv.call("rig.domain.set", {"rigId": rig, "name": "page.localhost", "guestPort": 8000})
    page.locator("#rig-ports li[data-domain='page.localhost'] a").first.wait_for(timeout=30_000)

    # An expired session sends the person to sign-in, then back to this tab.
    ended = ctx.request.post(srv.url + "/session/end", headers={"Origin": srv.url})
    assert ended.ok
    # The tab's next call (its heartbeat, within two seconds) finds the session gone.
    page.get_by_text("Your session ended").wait_for()
    page.get_by_label("Token").fill(srv.token)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#rig-title").wait_for()
    assert page.url.endswith(f"{HOME}/{rig}")

    # Closed elsewhere while the tab is open: the tab says how it ended.
    srv.call("rig.close", {"rigId": rig})
    page.get_by_text("This rig has closed").wait_for()
    assert "requested" in page.locator("#rig-banner").inner_text()
    _shot(page, "terminal-closed")
    ctx.close()


def _shot(page: Any, name: str) -> Path:
    """A screenshot of the page, kept in the test artifacts whether or not the test fails."""
    path = ARTIFACTS / "page" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    return path


def test_every_request_went_to_rigd_and_the_page_is_light(site: Site) -> None:
    assert site.requests, "the other tests made no requests"
    base = site.srv.url
    ws_base = base.replace("http://", "ws://")
    outside = [u for u in site.requests if not (u.startswith(base) or u.startswith(ws_base)
                                               or u.startswith("blob:") or u.startswith("data:"))]
    assert outside == []
    assert "shell" in site.weights and "/static/app.js" in site.weights
    assert sum(site.weights.values()) < 300 * 1024, site.weights



# -- a desktop rig: the live view, control, the lanes ------------------------------------


def canvas_variance(page: Any) -> float:
    """The variance of the canvas's grey levels, sampled (a blank canvas is 0)."""
    return float(page.locator("#screen").evaluate("""c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0, s = 0, s2 = 0;
        for (let i = 0; i < d.length; i += 4 * 97) { const g = (d[i] + d[i+1] + d[i+2]) / 3; n++; s += g; s2 += g * g; }
        return s2 / n - (s / n) ** 2; }"""))


def click_guest(page: Any, x: int, y: int, display: tuple[int, int] = (1280, 800)) -> None:
    """Click the canvas where guest pixel (x, y) is drawn."""
    box = page.locator("#screen").bounding_box()
    page.mouse.click(box["x"] + (x + 0.5) * box["width"] / display[0],
                     box["y"] + (y + 0.5) * box["height"] / display[1])


def test_desktop_live_view_control_drop_and_copy(site: Site) -> None:
    from rigd.client.lanes import LaneClient


    srv = site.srv
    # A person of the workspace (not the admin): the clipboard grants checked below are theirs alone.
    token = person(site, "desk-person", member=True)
    ctx = site.context()
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=srv.url)
    page = ctx.new_page()
    sign_in(page, token)
    page.locator("#rigs-title").wait_for()
    rig = open_from_page(page, "computer")
    page.locator(f"#rigs-body tr[data-rig={rig}]").get_by_role("link", name=f"Open the tab of {rig}").click()
    page.wait_for_url(f"**{HOME}/{rig}")
    page.wait_for_function("() => Number(document.querySelector('#screen')?.dataset.frames || 0) >= 1",
                           timeout=120_000)
    # The desktop is drawn (not a blank canvas), and the page is kept as an artifact.
    wait_exec(srv, rig, f"{SESSION} xdotool search --class xfce4-panel", token=token)
    deadline = time.monotonic() + 60
    while canvas_variance(page) < 50:
        assert time.monotonic() < deadline, "the canvas never showed the desktop"
        page.wait_for_timeout(500)
    _shot(page, "desktop-view")
    # View-only until the person takes control.
    page.get_by_role("button", name="Take control").click()
    page.get_by_role("button", name="Hand back").wait_for()
    assert "lease" in page.locator("#lease").inner_text()
    _shot(page, "desktop-control")

    # Click the panel's terminal launcher through the canvas (the hypervisor path).
    x, y = terminal_launcher(srv, rig, token)
    click_guest(page, x, y)
    wait_exec(srv, rig, f"{SESSION} xdotool getactivewindow getwindowname | grep -E '^Terminal'",
              token=token)
    # ... it has the keyboard (X focus; "active" is the window manager's word and can come first),
    # and its shell's readline is reading (the pty out of canonical mode): a key sent before
    # either can be lost, and a lost "e" of "echo" leaves an empty file (seen in CI).
    wait_exec(srv, rig, f"{SESSION} xdotool getwindowfocus getwindowname | grep -E '^Terminal'",
              token=token)
    wait_exec(srv, rig, "p=$(pgrep -u rig -n -x bash -P \"$(pgrep -d, -u rig -x xfce4-terminal)\") && "
                        "stty -a -F /proc/$p/fd/0 | grep -q -- -icanon", token=token)
    # é and 世界 have no key on Playwright's US layout: it inserts them as text (beforeinput),
    # as a layout or an IME does, and the view types them through the hypervisor.
    page.keyboard.type("echo viewed-$((6*7)) héllo 世界 > ~/view.txt")
    page.keyboard.press("Enter")
    # The shell opens the file before echo writes its line (in one write): wait for the line.
    assert wait_exec(srv, rig, "grep -q . /home/rig/view.txt && cat /home/rig/view.txt",
                     token=token).strip() == "viewed-42 héllo 世界"

    # Drop a file onto the view: it lands in ~/Drops, with a progress bar.
    box = page.locator("#screen").bounding_box()
    page.locator("#screen").evaluate("""(c, at) => {
        const dt = new DataTransfer();
        dt.items.add(new File(["dropped through the page\\n"], "dropped.txt", {type: "text/plain"}));
        for (const type of ["dragenter", "dragover", "drop"])
          c.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true,
                                              clientX: at.x, clientY: at.y}));
    }""", {"x": box["x"] + box["width"] / 2, "y": box["y"] + box["height"] / 2})
    page.get_by_text("Saved /home/rig/Drops/dropped.txt").wait_for(timeout=60_000)
    assert exec_text(srv, rig, "cat /home/rig/Drops/dropped.txt", token)["stdout"]["text"] == \
        "dropped through the page\n"
    rows = srv.call("rig.log", {"rigId": rig, "beforeSeq": 2**53 - 1, "limit": 20})
    drop = next(r for r in rows if r["verb"] == "drop_files")
    assert abs(drop["args"]["x"] - 640) <= 2 and abs(drop["args"]["y"] - 400) <= 2  # the centre, in guest pixels

    # Copy rig → host asks first (the default): allow for ten minutes, and the text comes out.
    LaneClient(srv.url, token, timeout=60).clip_set(rig, b"copied out of the rig", "text/plain; charset=utf-8")
    page.get_by_role("button", name="Copy from rig").click()
    page.get_by_role("dialog").get_by_text("Copy the rig's clipboard to this computer?").wait_for()
    page.get_by_role("button", name="Allow for ten minutes").click()
    assert page.get_by_label("Copied from the rig").input_value(timeout=UI_MS) == "copied out of the rig"
    assert page.evaluate("navigator.clipboard.readText()") == "copied out of the rig"
    policy = srv.call("clipboard.policy.get", token=token)
    assert [g["rigId"] for g in policy["grants"]] == [rig]

    # Typed text is masked in the audit log the page shows.
    page.get_by_role("button", name="Refresh").click()
    log_text = page.locator("#log-body").inner_text()
    assert "viewed-42" not in log_text and "drop_files" in log_text

    # Hand back; the rig is view-only again, then close it from the table and see it leave.
    page.get_by_role("button", name="Hand back").click()
    page.get_by_role("button", name="Take control").wait_for()
    assert srv.call("rig.get", {"rigId": rig})["controller"] is None or \
        srv.call("rig.get", {"rigId": rig})["controller"]["kind"] != "person"
    page.get_by_role("link", name="← All rigs").click()
    page.locator(f"#rigs-body tr[data-rig={rig}]").wait_for()
    page.get_by_role("button", name=f"Close {rig}").click()
    page.locator(f"#rigs-body tr[data-rig={rig}]").wait_for(state="detached", timeout=120_000)
    assert srv.call("rig.get", {"rigId": rig})["phase"] == "closed"
    ctx.close()


SESSION = "DISPLAY=:0 XAUTHORITY=/home/rig/.Xauthority"


def terminal_launcher(srv: Server, rig: str, token: str | None = None) -> tuple[int, int]:
    """Where the bottom panel's terminal launcher is: XFCE's default dock (show desktop,
    a separator, then the terminal emulator) sits centred at the bottom; its window's
    geometry comes from the guest, the launcher's place in it from the default layout."""
    out = wait_exec(srv, rig, f"for w in $({SESSION} xdotool search --onlyvisible --class xfce4-panel); do "
                              f"{SESSION} xdotool getwindowgeometry --shell $w; done", token=token)
    panels = []
    for block in out.split("WINDOW=")[1:]:
        v = dict(line.split("=", 1) for line in block.strip().splitlines()[1:] if "=" in line)
        panels.append({k: int(v[k]) for k in ("X", "Y", "WIDTH", "HEIGHT")})
    dock = max(panels, key=lambda p: p["Y"])
    assert dock["Y"] > 600, panels
    return dock["X"] + round(dock["WIDTH"] * 0.26), dock["Y"] + dock["HEIGHT"] // 2
