"""``snapshotd ui`` in a real headless Chromium: the timeline, a turn's diff, revert, undo, live checkpoints, refusals.

A real daemon records real turns (``snapshotd hook claude-code`` fed Claude
Code's recorded payloads), a real ``snapshotd ui`` process serves the page,
and Debian's Chromium, driven by Playwright, clicks through it; the files on
disk are the oracle for revert and undo. With ``SNAPSHOTD_UI_SCREENSHOTS``
set to a folder, the test saves the timeline and a turn's diff there (the
README's pictures come from this run).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import Daemon, call, child_env
from hook_helpers import claude_hook, recorded_claude_turn
from repo_helpers import git, init_repo, write
from ui_helpers import Page, status, ui_process

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
WAIT_MS = 15_000

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
)

OLD_GREET = '''"""Greetings."""


def greet(name):
    return "Hello " + name
'''
GREET = '''"""Greetings, in the user's own words."""

GREETING = "Hello, {name}!"


def greet(name: str) -> str:
    # Say hello, politely, and never to nobody.
    if not name:
        raise ValueError("greet needs a name")
    return GREETING.format(name=name)
'''
TEST_GREET = '''from greet import greet


def test_greet() -> None:
    assert greet("Ada") == "Hello, Ada!"
'''


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock, SNAPSHOTD_HOOK_BUDGET="60", SNAPSHOTD_HOOK_START_BUDGET="60")


def two_turns(repo: Path, env: dict[str, str]) -> None:
    """Turn 1 as recorded (CHANGES added, a.txt edited); turn 2 rewrites greet.py and adds test_greet.py."""
    recorded_claude_turn(repo, env)
    claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Add a greeting helper\nin Python")
    write(repo / "greet.py", GREET)
    write(repo / "test_greet.py", TEST_GREET)
    claude_hook(repo, env, "4-post-tool-use-edit.json")
    claude_hook(repo, env, "5-stop.json")


@pytest.fixture
def ui(daemon: Daemon, env: dict[str, str], repo: Path) -> Iterator[Page]:
    with ui_process(env, repo) as page:
        yield page


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "project", ("a.txt", "alpha\n"), ("greet.py", OLD_GREET))


def test_the_page_shows_turns_reverts_undoes_and_hears_new_checkpoints(
    ui: Page, env: dict[str, str], repo: Path, tmp_path: Path
) -> None:
    two_turns(repo, env)
    shots = Path(os.environ.get("SNAPSHOTD_UI_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    info = os.stat(ui.token_file)
    assert stat.S_IMODE(info.st_mode) == 0o600 and json.loads(ui.token_file.read_text())["token"] == ui.token

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(ui.url)
            assert page.url == ui.base + "/"  # the token went into a cookie and out of the address bar

            # The timeline: both turns, newest first, with git's own counts of what each changed.
            entries = page.locator("#entries > li")
            sync_api.expect(entries).to_have_count(2)
            sync_api.expect(entries.nth(0)).to_contain_text("Add a greeting helper")
            sync_api.expect(entries.nth(0)).not_to_contain_text("in Python")  # the prompt's first line only
            sync_api.expect(entries.nth(0)).to_contain_text(_counts(ui, repo, "Add a greeting helper"))
            sync_api.expect(entries.nth(1)).to_contain_text("Add a CHANGES file")
            sync_api.expect(entries.nth(1)).to_contain_text(_counts(ui, repo, "Add a CHANGES file and fix the greeting in a.txt"))
            page.screenshot(path=str(shots / "ui-timeline.png"))

            # A turn's diff, opened from the keyboard: its files, the first one's lines coloured by
            # Pygments, unified then side by side.
            page.get_by_role("button", name="Open turn 2: Add a greeting helper").focus()
            page.keyboard.press("Enter")
            sync_api.expect(page.locator("#files > li")).to_have_count(2)
            sync_api.expect(page.locator("#files > li").nth(1)).to_contain_text("test_greet.py")
            added, removed = _numstat(repo, _turn(ui, "Add a greeting helper"), "greet.py")
            table = page.get_by_role("table", name="Diff of greet.py, unified")
            sync_api.expect(table.locator("tr.plus")).to_have_count(added)
            sync_api.expect(table.locator("tr.minus")).to_have_count(removed)
            sync_api.expect(table.locator("tr.plus .k", has_text="def")).to_have_count(1)
            page.locator("#detail").scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "ui-diff.png"), full_page=True)
            page.get_by_label("Side by side").check()
            split = page.get_by_role("table", name="Diff of greet.py, side by side")
            sync_api.expect(split.locator("tbody tr").nth(1).locator("td")).to_have_count(6)
            page.emulate_media(color_scheme="dark")
            page.screenshot(path=str(shots / "ui-diff-split-dark.png"), full_page=True)
            page.emulate_media(color_scheme="light")
            page.get_by_label("Unified").check()

            # Revert the turn: a preview (Escape cancels it, changing nothing), then the explicit
            # confirm; the files change on disk.
            page.get_by_role("button", name="Revert this turn").click()
            dialog = page.get_by_role("dialog")
            sync_api.expect(dialog).to_contain_text("Will delete (1)test_greet.py")
            sync_api.expect(page.get_by_role("button", name="Cancel")).to_be_focused()
            page.keyboard.press("Escape")
            sync_api.expect(page.locator("#toast")).to_contain_text("Nothing changed.")
            assert (repo / "test_greet.py").read_text() == TEST_GREET
            page.get_by_role("button", name="Revert this turn").click()
            sync_api.expect(dialog).to_contain_text("Will write (1)greet.py")
            sync_api.expect(dialog).to_contain_text("Will delete (1)test_greet.py")
            assert (repo / "greet.py").read_text() == GREET  # the preview changed nothing
            dialog.get_by_role("button", name="Confirm").click()
            sync_api.expect(page.locator("#toast")).to_contain_text("Revert: 1 file written, 1 deleted")
            assert (repo / "greet.py").read_text() == OLD_GREET
            assert not (repo / "test_greet.py").exists()
            assert (repo / "a.txt").read_text() == "hello\n"  # the other turn's work is left alone
            sync_api.expect(page.locator("#entries > li").first).to_contain_text("before revert")

            # Undo: the same preview and confirm; the files are back as the turn left them.
            page.get_by_role("button", name="Undo last restore").click()
            sync_api.expect(dialog).to_contain_text("Will write (2)")
            dialog.get_by_role("button", name="Confirm").click()
            sync_api.expect(page.locator("#toast")).to_contain_text("Undo the last restore: 2 files written")
            assert (repo / "greet.py").read_text() == GREET
            assert (repo / "test_greet.py").read_text() == TEST_GREET

            # A checkpoint taken elsewhere arrives live, without a reload.
            page.evaluate("window.__same_page = true")
            claude_hook(repo, env, "1-user-prompt-submit.json", prompt="Now tidy up")
            sync_api.expect(page.locator("#entries > li").first).to_contain_text("Now tidy up")
            assert page.evaluate("window.__same_page") is True

            # A page of another origin cannot make a change, even with the cookie in the browser:
            # the very revert the page made above, sent from there, deletes nothing.
            revert = _turn_revert(ui, "Add a greeting helper")
            foreign = _foreign_site()
            try:
                other = context.new_page()
                other.goto(foreign.url)
                answer = other.evaluate(
                    """async ([base, body]) => {
                        const r = await fetch(base + "/api/action", {method: "POST", mode: "no-cors",
                            credentials: "include", body});
                        return r.type;
                    }""",
                    [ui.base, json.dumps(revert)],
                )
                assert answer == "opaque"
            finally:
                foreign.close()
            assert (repo / "greet.py").read_text() == GREET
        finally:
            browser.close()

    # Without the token, or from a foreign origin or host, every request is refused.
    cookie = {"Cookie": f"snapshotd_ui={ui.token}"}
    assert status(ui.base + "/api/worktrees", cookie) == 200
    assert status(ui.base + "/api/worktrees") == 403
    assert status(ui.base + "/") == 403
    assert status(ui.base + "/api/worktrees", {"Cookie": "snapshotd_ui=wrong"}) == 403
    assert status(ui.base + "/api/worktrees", {**cookie, "Origin": "http://evil.example"}) == 403
    assert status(ui.base + "/api/worktrees", {**cookie, "Host": f"evil.example:{ui.port}"}) == 403
    body = json.dumps(revert).encode()
    assert status(ui.base + "/api/action", {**cookie, "Content-Type": "text/plain"}, body) == 403
    assert status(ui.base + "/api/action", {**cookie, "Content-Type": "application/json",
                                            "Origin": foreign.url.rstrip("/")}, body) == 403
    assert foreign.requests >= 1
    assert (repo / "greet.py").read_text() == GREET


def test_a_restored_submodule_is_a_folder_made_not_a_file_written(daemon: Daemon, env: dict[str, str], tmp_path: Path) -> None:
    """The dialog and the toast say what the restore did for a deleted submodule: its folder made, no file written."""
    repo = init_repo(tmp_path / "super", ("a.txt", "alpha\n"))
    init_repo(repo / "sub", ("inner.txt", "inside\n"))
    git(repo, "add", "sub")
    git(repo, "commit", "-q", "-m", "a submodule")
    taken = call(env["SNAPSHOTD_SOCKET"], "checkpoint", {"path": str(repo), "label": "with its submodule"})["checkpoint"]
    shutil.rmtree(repo / "sub")
    with ui_process(env, repo) as ui, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(ui.url)
            page.get_by_role("button", name="Open checkpoint: with its submodule").click()
            restore = page.get_by_role("button", name=f"Restore to this checkpoint ({taken['id'][:12]})")
            restore.click()
            dialog = page.get_by_role("dialog")
            sync_api.expect(dialog).to_contain_text("Will make a submodule's folder only (1)sub: submodule: would make")
            sync_api.expect(dialog).not_to_contain_text("Will write")
            dialog.get_by_role("button", name="Confirm").click()
            sync_api.expect(page.locator("#toast")).to_contain_text("Restore: 0 files written, 0 deleted, 1 submodule folder made.")
            assert (repo / "sub").is_dir()
            restore.click()  # once made, the folder is the checkpoint's: nothing to do
            sync_api.expect(dialog).to_contain_text("No file would change.")
            sync_api.expect(dialog.get_by_role("button", name="Confirm")).to_be_disabled()
        finally:
            browser.close()


def _turn(ui: Page, title: str) -> dict[str, str]:
    """The worktree, first and last checkpoint of the turn called ``title``, as the page's server lists it."""
    cookie = {"Cookie": f"snapshotd_ui={ui.token}"}
    with urllib.request.urlopen(urllib.request.Request(ui.base + "/api/worktrees", headers=cookie)) as answer:
        worktree = json.load(answer)["worktrees"][0]["id"]
    url = f"{ui.base}/api/timeline?worktree={worktree}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=cookie)) as answer:
        entry = next(e for e in json.load(answer)["entries"] if e["title"] == title)
    return {"worktree": worktree, "from": entry["source"], "to": entry["target"]}


def _numstat(repo: Path, turn: dict[str, str], path: str | None = None) -> tuple[int, int]:
    """Lines added and removed from the turn's first checkpoint to its last, as git counts them."""
    rows = [line.split("\t") for line in git(repo, "diff", "--numstat", turn["from"], turn["to"]).splitlines()]
    chosen = [row for row in rows if path is None or row[2] == path]
    return sum(int(row[0]) for row in chosen), sum(int(row[1]) for row in chosen)


def _counts(ui: Page, repo: Path, title: str) -> str:
    """The counts the timeline should show for the turn: files, +added, -removed (git's numbers)."""
    turn = _turn(ui, title)
    files = len(git(repo, "diff", "--name-only", turn["from"], turn["to"]).splitlines())
    added, removed = _numstat(repo, turn)
    return f"{files} file{'s' if files != 1 else ''} +{added} -{removed}"


def _turn_revert(ui: Page, title: str) -> dict[str, object]:
    """The confirmed revert of the turn called ``title``, as the page sends it."""
    return {"action": "revert", **_turn(ui, title), "confirm": True}


class _Foreign:
    def __init__(self, server: http.server.HTTPServer) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}/"
        self.requests = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _foreign_site() -> _Foreign:
    """A page on another origin (another port) for the browser to visit."""
    holder: list[_Foreign] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            holder[0].requests += 1
            body = b"<!doctype html><title>elsewhere</title><p>another site</p>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    holder.append(_Foreign(server))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return holder[0]
