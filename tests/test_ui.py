"""The page's server without a browser: timeline entries, patch layout, the guard, paging and bad requests.

The entries and patches are checked as functions; the guard, paging and
error answers against a real ``snapshotd ui`` process talking to a real
daemon (the browser's side is tests/test_ui_browser.py).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from daemon_helpers import Daemon, call, child_env, running_daemon
from repo_helpers import git, init_repo, write
from ui_helpers import request, status, ui_process

from snapshotd.settings import SAFETY_SESSION
from snapshotd.ui.patches import parse_patch
from snapshotd.ui.timeline import entries_of
from snapshotd.wording import submodule_note


def cp(seq: int, label: str | None, session: str | None = "s", at: str | None = None) -> dict[str, Any]:
    return {"id": f"{session}-{seq:040d}", "seq": seq, "session": session, "label": label,
            "created_at": at or f"2026-12-01T10:00:{seq:02d}.000Z"}


def test_entries_are_turns_and_the_checkpoints_no_turn_holds_newest_first() -> None:
    checkpoints = [
        cp(1, "by hand"),
        cp(2, "before: fix the parser\nand its tests"),
        cp(3, "before tool"),
        cp(4, "after turn"),
        cp(5, None),
        cp(1, "before revert a..b", SAFETY_SESSION, "2026-12-01T10:00:30.000Z"),
    ]
    entries = entries_of(checkpoints)
    shown = [(e.kind, e.session, e.title, e.first_seq, e.last_seq) for e in entries]
    assert shown == [
        ("checkpoint", SAFETY_SESSION, "before revert a..b", 1, 1),
        ("checkpoint", "s", "checkpoint #5", 5, 5),
        ("turn", "s", "fix the parser", 2, 4),
        ("checkpoint", "s", "by hand", 1, 1),
    ]
    turn = entries[2]
    assert (turn.source, turn.target, turn.turn, turn.open) == (checkpoints[1]["id"], checkpoints[3]["id"], 1, False)
    assert entries[1].source == checkpoints[3]["id"]  # a lone checkpoint spans from the one before it
    assert entries[3].source is None  # the first of its session: nothing before it


def test_a_label_with_control_characters_is_one_line() -> None:
    (entry,) = entries_of([cp(1, "before: \x1b[31mred\x1b[0m\ttab")])
    assert entry.title == "\\x1b[31mred\\x1b[0m\\ttab"


PATCH = '''diff --git a/x.py b/x.py
index 1111111..2222222 100644
--- a/x.py
+++ b/x.py
@@ -1,4 +1,4 @@ def f():
 s = """one
-two <b>
+deux &
 three"""
 x = 1
\\ No newline at end of file
'''


def test_a_patch_is_laid_out_with_numbers_and_each_side_coloured_as_a_whole() -> None:
    laid = parse_patch("x.py", PATCH)
    assert laid["headers"][0] == "diff --git a/x.py b/x.py"
    (hunk,) = laid["hunks"]
    lines = hunk["lines"]
    assert [(line["kind"], line["old"], line["new"]) for line in lines] == [
        (" ", 1, 1), ("-", 2, None), ("+", None, 2), (" ", 3, 3), (" ", 4, 4), ("\\", None, None),
    ]
    # Inside the triple-quoted string on both sides: Pygments saw the string open on the line above.
    assert 'class="s2"' in lines[1]["html"] and 'class="s2"' in lines[2]["html"]
    assert "&lt;b&gt;" in lines[1]["html"] and "&amp;" in lines[2]["html"]  # escaped, never raw HTML
    assert "<b>" not in lines[1]["html"]
    assert lines[5]["html"] == "No newline at end of file"


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


def test_the_guard_refuses_without_token_and_from_foreign_hosts_and_origins(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    with ui_process(env) as page:
        assert stat.S_IMODE(os.stat(page.token_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(page.token_file.parent).st_mode) == 0o700
        assert json.loads(page.token_file.read_text())["url"] == page.url
        assert status(page.base + "/api/worktrees", page.cookie) == 200
        code, body = request(page.base + "/api/worktrees")
        assert code == 403 and b"token" in body
        assert status(page.base + "/assets/app.js") == 403
        assert status(page.base + "/api/worktrees?token=" + "x" * 43) == 403
        assert status(page.base + "/api/worktrees", {"Cookie": "snapshotd_ui=" + page.token[:-1]}) == 403
        assert status(page.base + "/api/worktrees", {**page.cookie, "Origin": "http://127.0.0.1:1"}) == 403
        assert status(page.base + "/api/worktrees", {**page.cookie, "Host": f"attacker.example:{page.port}"}) == 403
        assert status(page.base + "/api/worktrees", {**page.cookie, "Origin": page.base}) == 200
        action = json.dumps({"action": "undo", "worktree": "wt_x"}).encode()
        assert status(page.base + "/api/action", {**page.cookie, "Content-Type": "text/plain"}, action) == 403
        # The first visit trades the token for a cookie and drops it from the address.
        connection = http.client.HTTPConnection("127.0.0.1", page.port, timeout=10)
        try:
            connection.request("GET", f"/?token={page.token}")
            answer = connection.getresponse()
            assert (answer.status, answer.getheader("location")) == (303, "/")
            cookie = answer.getheader("set-cookie")
            assert cookie == f"snapshotd_ui={page.token}; Path=/; HttpOnly; SameSite=Strict"
        finally:
            connection.close()
        code, body = request(page.base + "/", page.cookie)
        assert code == 200 and b"<title>snapshotd timeline</title>" in body


def test_lists_are_paged_and_bad_requests_get_one_sentence(daemon: Daemon, env: dict[str, str], tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "wide", ("keep.txt", "k\n"))
    sock = env["SNAPSHOTD_SOCKET"]
    first = call(sock, "checkpoint", {"path": str(repo), "session": "s", "label": "before: add many files"})
    for number in range(450):
        write(repo / "many" / f"f{number:03d}.txt", f"{number}\n")
    write(repo / "odd\tname.txt", "odd\n")
    last = call(sock, "checkpoint", {"path": str(repo), "session": "s", "label": "after turn"})
    for number in range(60):
        write(repo / "keep.txt", f"{number}\n")
        call(sock, "checkpoint", {"path": str(repo), "session": "t"})
    worktree = first["checkpoint"]["worktree"]
    source, target = first["checkpoint"]["id"], last["checkpoint"]["id"]
    with ui_process(env, repo) as page:
        def get(path: str) -> Any:
            code, body = request(page.base + path, page.cookie)
            assert code == 200, body
            return json.loads(body)

        listing = get("/api/worktrees")
        assert listing["focus"] == worktree
        (shown,) = listing["worktrees"]
        assert {s["name"]: s["entries"] for s in shown["sessions"]} == {"s": 1, "t": 60}
        top = get(f"/api/timeline?worktree={worktree}")
        assert (len(top["entries"]), top["total"], top["next_offset"]) == (50, 61, 50)
        rest = get(f"/api/timeline?worktree={worktree}&offset=50")
        assert (len(rest["entries"]), rest["next_offset"]) == (11, None)
        turn = get(f"/api/timeline?worktree={worktree}&session=s")["entries"][0]
        assert (turn["kind"], turn["title"], turn["files"], turn["additions"]) == ("turn", "add many files", 451, 451)

        sides = f"worktree={worktree}&from={source}&to={target}"
        files = get(f"/api/files?{sides}")
        assert (len(files["files"]), files["total"], files["next_offset"]) == (200, 451, 200)
        last_page = get(f"/api/files?{sides}&offset=400")
        assert (len(last_page["files"]), last_page["next_offset"]) == (51, None)
        names = git(repo, "diff", "--name-only", source, target).splitlines()
        assert [f["display"] for f in files["files"] + get(f"/api/files?{sides}&offset=200")["files"]
                + last_page["files"]] == names  # git's order and git's quoting ("odd\tname.txt")
        odd = get(f"/api/patch?{sides}&path={quote('odd' + chr(9) + 'name.txt')}")
        assert odd["shown"] == "patch" and [line["kind"] for line in odd["hunks"][0]["lines"]] == ["+"]

        code, body = request(page.base + f"/api/patch?{sides}&path=nowhere.txt", page.cookie)
        assert code == 404 and json.loads(body)["error"]["message"].startswith("nowhere.txt did not change")
        code, body = request(page.base + "/api/timeline", page.cookie)
        assert code == 400 and json.loads(body)["error"]["message"] == "The parameter 'worktree' is required."
        code, body = request(page.base + f"/api/timeline?worktree={worktree}&offset=-1", page.cookie)
        assert code == 400 and "whole number" in json.loads(body)["error"]["message"]
        bad = json.dumps({"action": "revert", "worktree": worktree, "from": source}).encode()
        code, body = request(page.base + "/api/action", {**page.cookie, "Content-Type": "application/json"}, bad)
        assert code == 400 and json.loads(body)["error"]["message"] == "A revert needs 'from' and 'to'."
        preview = json.dumps({"action": "restore", "worktree": worktree, "checkpoint": source}).encode()
        code, body = request(page.base + "/api/action", {**page.cookie, "Content-Type": "application/json"}, preview)
        assert code == 200 and len(json.loads(body)["deleted"]) == 451
        assert (repo / "odd\tname.txt").exists()  # a preview changes nothing


class ListingDaemon:
    """The two methods the timeline asks of the daemon, answered from a list; counts the ``list`` calls."""

    def __init__(self, checkpoints: list[dict[str, Any]]) -> None:
        self.checkpoints = checkpoints
        self.lists = 0

    async def watch(self, worktree_id: str) -> None:
        pass

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert method == "list", method
        self.lists += 1
        return {"checkpoints": list(self.checkpoints)}


def test_an_announced_checkpoint_joins_the_timeline_without_listing_again() -> None:
    import asyncio

    from snapshotd.ui.timeline import Timeline

    daemon = ListingDaemon([cp(2, "after turn"), cp(1, "before: one")])
    timeline = Timeline(daemon)  # type: ignore[arg-type]

    async def run() -> list[list[tuple[str, int, int]]]:
        seen = [[(e.title, e.first_seq, e.last_seq) for e in await timeline.entries("wt_a")]]
        for announced in (cp(3, "before: two"), cp(4, "after turn"), cp(4, "after turn"), cp(2, "after turn")):
            timeline.recorded("wt_a", announced)
            seen.append([(e.title, e.first_seq, e.last_seq) for e in await timeline.entries("wt_a")])
        return seen

    seen = asyncio.run(run())
    assert seen[0] == [("one", 1, 2)]
    assert seen[1] == [("two", 3, 3), ("one", 1, 2)]
    assert seen[2] == seen[3] == seen[4] == [("two", 3, 4), ("one", 1, 2)]  # each checkpoint counted once
    assert daemon.lists == 1


def test_a_revert_shows_its_conflicts_and_leaves_them_alone_unless_forced(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    repo = init_repo(tmp_path / "shared", ("mine.txt", "mine\n"), ("theirs.txt", "theirs\n"))
    sock = env["SNAPSHOTD_SOCKET"]
    before = call(sock, "checkpoint", {"path": str(repo), "session": "s", "label": "before: edit both"})
    write(repo / "mine.txt", "mine, edited\n")
    write(repo / "theirs.txt", "theirs, edited\n")
    after = call(sock, "checkpoint", {"path": str(repo), "session": "s", "label": "after turn"})
    write(repo / "theirs.txt", "theirs, edited again by someone else\n")  # changed since the turn
    with ui_process(env, repo) as page:
        headers = {**page.cookie, "Content-Type": "application/json"}
        body = {"action": "revert", "worktree": before["checkpoint"]["worktree"],
                "from": before["checkpoint"]["id"], "to": after["checkpoint"]["id"]}

        def act(**extra: Any) -> Any:
            code, answer = request(page.base + "/api/action", headers, json.dumps({**body, **extra}).encode())
            assert code == 200, answer
            return json.loads(answer)

        preview = act()
        assert (preview["dry_run"], preview["written"], preview["shown"]["conflicts"]) == (
            True, ["mine.txt"], ["theirs.txt (changed since the checkpoint)"]
        )
        done = act(confirm=True)
        assert done["safety_checkpoint"]["session"] == SAFETY_SESSION
        assert (repo / "mine.txt").read_text() == "mine\n"
        assert (repo / "theirs.txt").read_text() == "theirs, edited again by someone else\n"
        forced = act(confirm=True, force=True)
        assert forced["written"] == ["theirs.txt"] and (repo / "theirs.txt").read_text() == "theirs\n"


def test_a_restored_submodule_is_said_as_a_folder_made_and_then_as_nothing_to_do(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    """As the command line says it: a submodule's folder made (no file written), and once made, nothing to do."""
    repo = init_repo(tmp_path / "super", ("a.txt", "a\n"))
    init_repo(repo / "sub", ("inner.txt", "inside\n"))
    git(repo, "add", "sub")
    git(repo, "commit", "-q", "-m", "a submodule")
    taken = call(env["SNAPSHOTD_SOCKET"], "checkpoint", {"path": str(repo)})["checkpoint"]
    shutil.rmtree(repo / "sub")
    with ui_process(env, repo) as page:
        headers = {**page.cookie, "Content-Type": "application/json"}

        def act(**extra: Any) -> Any:
            body = {"action": "restore", "worktree": taken["worktree"], "checkpoint": taken["id"], **extra}
            code, answer = request(page.base + "/api/action", headers, json.dumps(body).encode())
            assert code == 200, answer
            return json.loads(answer)

        preview = act()
        assert preview["written"] == preview["submodules"] == ["sub"]  # the wire's result, as the daemon gave it
        assert preview["shown"] == {"written": [], "deleted": [], "submodules": [submodule_note("sub", True)],
                                    "conflicts": [], "kept": []}
        done = act(confirm=True)
        assert done["shown"]["submodules"] == [submodule_note("sub", False)] and done["shown"]["written"] == []
        assert (repo / "sub").is_dir() and not any((repo / "sub").iterdir())
        again = act()
        assert again["shown"] == {"written": [], "deleted": [], "submodules": [], "conflicts": [], "kept": []}
        assert again["written"] == [] and "submodules" not in again


def test_the_page_stopped_by_sigterm_removes_its_token_file_as_on_ctrl_c(daemon: Daemon, env: dict[str, str]) -> None:
    with ui_process(env, stop=signal.SIGTERM) as page:  # ui_process checks: exit 0, no traceback, no token file
        assert status(page.base + "/api/worktrees", page.cookie) == 200


def test_a_restarted_daemons_page_still_lists_every_recorded_worktree_with_its_checkpoints(
    daemon: Daemon, env: dict[str, str], tmp_path: Path
) -> None:
    sock = env["SNAPSHOTD_SOCKET"]
    ids = {}
    for name in ("one", "two", "deleted"):
        repo = init_repo(tmp_path / name, ("a.txt", f"{name}\n"))
        ids[name] = call(sock, "checkpoint", {"path": str(repo), "session": name})["checkpoint"]["worktree"]
        write(repo / "a.txt", f"{name} again\n")
        call(sock, "checkpoint", {"path": str(repo), "session": name})
    git(tmp_path / "one", "worktree", "add", "-q", "--detach", str(tmp_path / "linked"))
    ids["linked"] = call(sock, "checkpoint", {"path": str(tmp_path / "linked")})["checkpoint"]["worktree"]
    assert daemon.terminate() == 0, daemon.log_text()
    shutil.rmtree(tmp_path / "deleted")
    git(tmp_path / "one", "worktree", "remove", "--force", str(tmp_path / "linked"))
    with running_daemon(sock, tmp_path / "second.log"):
        assert call(sock, "worktrees")["worktrees"] == []  # the plain method is as it was
        known = {wt["id"]: wt for wt in call(sock, "worktrees", {"known": True})["worktrees"]}
        assert set(known) == set(ids.values())
        assert {known[ids[name]]["path"] for name in ("one", "two")} == {str(tmp_path / "one"), str(tmp_path / "two")}
        assert [(wt["open"], wt["presence"], wt["kind"]) for wt in known.values()].count((False, "here", "git")) == 2
        gone = known[ids["deleted"]]
        assert (gone["open"], gone["presence"], gone["path"]) == (False, "gone", str(tmp_path / "deleted"))
        assert "snapshotd forget" in gone["problem"]
        assert call(sock, "worktrees")["worktrees"] == []  # listing the records opened none
        with ui_process(env) as page:
            code, body = request(page.base + "/api/worktrees", page.cookie)
            assert code == 200, body
            shown = {wt["id"]: wt for wt in json.loads(body)["worktrees"]}
        assert set(shown) == set(ids.values())
        for name in ("one", "two"):
            listed = shown[ids[name]]
            assert "error" not in listed, listed
            assert (listed["entries"], [s["name"] for s in listed["sessions"]]) == (2, [name])
        assert (shown[ids["deleted"]]["presence"], shown[ids["deleted"]]["entries"]) == ("gone", 0)
        assert "error" not in shown[ids["deleted"]]
        assert (shown[ids["linked"]]["presence"], shown[ids["linked"]]["entries"]) == ("removed", 0)
        assert "error" not in shown[ids["linked"]]
