"""``show`` as ``git show`` reads, and file names quoted as git quotes them, checked against git itself.

Checkpoints are real commits, so ``git diff --name-status A B`` on the same
two checkpoints is the oracle for the names the command line prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import Daemon, child_env, cli
from repo_helpers import git, git_bytes, git_run, init_repo, write

from snapshotd.paths import quote_path

ODD_NAMES = [
    b"plain.txt",
    b"with space.txt",
    b"tab\there",
    b"new\nline",
    b'quo"te',
    b"back\\slash",
    "ünïcödé".encode(),
    b"caf\xe9-latin1",
    b"del\x7f",
    b"esc\x1b[31m",
    b"dir/inner\tname",
]


@pytest.fixture
def env(sock: Path) -> dict[str, str]:
    return child_env(sock)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return init_repo(tmp_path / "repo", ("a.txt", "alpha\n"))


def checkpoint(repo: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    return cli("checkpoint", "--json", str(repo), *args, env=env).json()["checkpoint"]


def test_names_are_quoted_as_git_diff_quotes_them(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    before = checkpoint(repo, env)["id"]
    for name in ODD_NAMES:
        path = os.fsencode(repo) + b"/" + name
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(b"x\n")
    after = checkpoint(repo, env)["id"]
    # git's own lines: "A\t<name as core.quotePath writes it>".
    git_lines = git_bytes(repo, "-c", "core.quotePath=true", "diff", "--name-status", before, after).decode()
    git_names = sorted(line.split("\t", 1)[1] for line in git_lines.splitlines())
    ours = cli("diff", before, after, cwd=repo, env=env).stdout.splitlines()
    assert all(line.startswith("A  ") for line in ours), ours
    assert sorted(line[3:] for line in ours) == git_names
    assert len(git_names) == len(ODD_NAMES)
    stat = cli("diff", "--stat", before, after, cwd=repo, env=env).stdout
    assert stat == git_bytes(repo, "-c", "core.quotePath=true", "diff", "--stat", before, after).decode()
    # The same quoting in show's list and in restore's plan.
    shown = cli("show", after, env=env).stdout
    assert '"new\\nline"' in shown and "\x1b" not in shown
    plan = cli("restore", before, "--dry-run", cwd=repo, env=env).stdout
    assert 'D  "caf\\351-latin1"' in plan and 'D  "esc\\033[31m"' in plan


def test_diff_stat_is_git_s_at_any_width(daemon: Daemon, env: dict[str, str], repo: Path) -> None:
    write(repo / "src" / "module" / "renamed_but_same.py", "".join(f"line {n}\n" for n in range(40)))
    write(repo / "docs" / "guide.md", "".join(f"para {n}\n" for n in range(300)))
    write(repo / "tools" / "run.sh", "echo run\n")
    (repo / "assets").mkdir()
    (repo / "assets" / "logo.png").write_bytes(b"\x89PNG\0" + bytes(range(256)) * 3)
    (repo / "assets" / "same-size.bin").write_bytes(b"\0" * 64)
    before = checkpoint(repo, env)["id"]
    (repo / "src" / "module" / "renamed_but_same.py").rename(repo / "src" / "module" / "moved_name.py")
    write(repo / "docs" / "guide.md", "".join(f"para {n}\n" for n in range(0, 300, 3)) + "tail\n")
    os.chmod(repo / "tools" / "run.sh", 0o755)
    (repo / "assets" / "logo.png").write_bytes(b"\x89PNG\0" + bytes(range(256)) * 5)
    (repo / "assets" / "same-size.bin").write_bytes(b"\1" * 64)
    (repo / "assets" / "new.bin").write_bytes(b"\0\1\2")
    deep = repo / "a_rather_long_folder_name" / "with_another_level_below_it" / "and_a_file_whose_name_goes_on.txt"
    write(deep, "".join(f"{n}\n" for n in range(1000)))
    write(repo / "a.txt", "alpha\nbeta\n")
    after = checkpoint(repo, env)["id"]
    for columns in ("30", "80", "120", "300"):
        sized = {**env, "COLUMNS": columns}
        ours = cli("diff", "--stat", before, after, cwd=repo, env=sized).stdout
        assert ours == git_bytes(repo, "diff", "--stat", before, after, env=sized).decode(), columns
    assert " src/module/{renamed_but_same.py => moved_name.py} " in ours and "Bin 773 -> 1285 bytes" in ours


@pytest.mark.parametrize(
    ("name", "quoted"),
    [("a.txt", "a.txt"), ("sp ace", "sp ace"), ("é", '"\\303\\251"'), ("x\ty", '"x\\ty"'), ('q"', '"q\\""')],
)
def test_quote_path_alone(name: str, quoted: str) -> None:
    assert quote_path(name) == quoted


def test_show_prints_a_header_and_the_files_changed_against_the_previous_checkpoint(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    first = checkpoint(repo, env, "--session", "s", "-m", "before turn 1")
    write(repo / "a.txt", "alpha\nmore\n")
    write(repo / "new.txt", "new\n")
    second = checkpoint(repo, env, "--session", "s", "-m", "after turn 1")
    text = cli("show", second["id"][:10], env=env).stdout
    head, _, files = text.partition("\n\n")
    lines = head.splitlines()
    assert lines[0] == f"checkpoint {second['id']}"
    fields = dict(line.split(":", 1) for line in lines[1:])
    fields = {key: value.strip() for key, value in fields.items()}
    assert fields["Session"] == "s, #2" and fields["Label"] == "after turn 1"
    assert fields["Date"] == second["created_at"].replace("T", " ").removesuffix("Z") + " UTC"
    assert fields["Base"] == git(repo, "rev-parse", "HEAD") and fields["Previous"] == first["id"]
    assert fields["Tree"] == second["tree"] and fields["Worktree"] == second["worktree"]
    assert files.splitlines() == ["M  a.txt", "A  new.txt"]
    patched = cli("show", "--patch", "s@", cwd=repo, env=env).stdout
    assert "diff --git a/a.txt b/a.txt" in patched and "+more" in patched.splitlines()
    assert "no previous checkpoint" in cli("show", "s@~1", cwd=repo, env=env).stdout
    # --json stays the method's result.
    assert cli("show", "--json", second["id"], env=env).json() == {"checkpoint": second}


def test_a_listing_keeps_its_columns_past_seq_9999() -> None:
    from snapshotd.cli.output import checkpoint_line

    def line(seq: int, width: int) -> str:
        cp = {"id": "ab" * 20, "seq": seq, "created_at": "2026-12-07T18:00:00Z", "session": "s", "label": "turn"}
        return checkpoint_line(cp, 12, width)

    short, long = line(7, 5), line(12000, 5)
    assert short.index("2026-") == long.index("2026-") and short.index("turn") == long.index("turn")
    assert line(7, 4).index("2026-") == short.index("2026-") - 1


def test_a_patch_abbreviates_ids_as_git_does_in_a_repository_of_many_objects(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    # 16,384 packed objects and more: git prints 8 digits in its "index" lines (core.abbrev's auto), libgit2 7.
    stream = b"".join(b"blob\ndata %d\n%s\n" % (len(body), body) for body in (b"object %d" % n for n in range(16_500)))
    git_run(repo, "fast-import", "--quiet", input=stream)
    before = checkpoint(repo, env)["id"]
    write(repo / "a.txt", "alpha\nbeta\n")
    write(repo / "new.txt", "new\n")
    after = checkpoint(repo, env)["id"]
    ours = cli("diff", "--patch", before, after, cwd=repo, env=env).stdout
    assert ours == git_bytes(repo, "diff", before, after).decode()
    assert "\nindex " in ours and len(ours.split("\nindex ", 1)[1].split("..", 1)[0]) == 8
    git(repo, "config", "core.abbrev", "9")  # a length set: libgit2 follows it as git does
    assert cli("diff", "--patch", before, after, cwd=repo, env=env).stdout == git_bytes(repo, "diff", before, after).decode()


def test_a_patch_keeps_carriage_returns_form_feeds_and_unicode_separators_in_their_lines(
    daemon: Daemon, env: dict[str, str], repo: Path
) -> None:
    (repo / "a.c").write_bytes(b"one\n\x0c\ntwo\r\nthree\n")
    before = checkpoint(repo, env)["id"]
    (repo / "a.c").write_bytes("one\nsec\x0ction\ntwo\r\nthree\nfour\u2028five\x1cend\x85\n".encode())
    (repo / "b.txt").write_bytes(b"crlf\r\nline\r\n")
    after = checkpoint(repo, env)["id"]
    ours = subprocess.run(
        [sys.executable, "-m", "snapshotd", "diff", "--patch", before, after],
        cwd=repo, env=env, capture_output=True, check=True,
    ).stdout
    assert ours == git_bytes(repo, "diff", before, after)
    patch = repo.parent / "ours.patch"
    patch.write_bytes(ours)
    (repo / "a.c").write_bytes(b"one\n\x0c\ntwo\r\nthree\n")  # as before: the patch applies there
    (repo / "b.txt").unlink()
    git(repo, "apply", str(patch))
    assert (repo / "a.c").read_bytes() == "one\nsec\x0ction\ntwo\r\nthree\nfour\u2028five\x1cend\x85\n".encode()


def test_a_patch_longer_than_a_reply_is_fetched_page_by_page(
    daemon: Daemon, env: dict[str, str], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapshotd.cli import options

    monkeypatch.setattr(options, "MAX_PATCH_BYTES", 3_000)  # a reply's most, as 32 MiB is the daemon's
    before = checkpoint(repo, env)["id"]
    for n in range(5):
        write(repo / f"f{n}.txt", f"line {n}\n" * 200)  # about 1,700 bytes of patch each
    after = checkpoint(repo, env)["id"]
    paged = cli("diff", "--patch", before, after, cwd=repo, env=env).stdout
    assert paged == git_bytes(repo, "diff", before, after).decode()
    write(repo / "huge.txt", "h" * 4_000 + "\n")
    largest = checkpoint(repo, env)["id"]
    refused = cli("diff", "-p", after, largest, cwd=repo, env=env, code=1)
    assert f"git shows it: git diff {after} {largest} -- huge.txt." in refused.stderr, refused


def test_a_paged_patch_of_the_worktree_is_one_capture_though_a_file_changes_between_pages(
    daemon: Daemon, env: dict[str, str], repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapshotd.cli import options
    from snapshotd.client.launcher import Runner

    monkeypatch.setattr(options, "MAX_PATCH_BYTES", 3_000)
    before = checkpoint(repo, env)["id"]
    for n in range(5):
        write(repo / f"f{n}.txt", f"line {n}\n" * 200)
    expected = git_bytes(repo, "diff", before, checkpoint(repo, env)["id"]).decode()  # the worktree now, as git shows it
    real_call = Runner.call
    pages: list[dict[str, Any]] = []

    def a_writer_between_pages(self: Runner, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method != "diff":
            return real_call(self, method, params)
        pages.append(params)
        if len(pages) == 2:  # another process writes the worktree after the first page was answered
            write(repo / "f4.txt", "rewritten between the pages\n")
        return real_call(self, method, params)

    monkeypatch.setattr(Runner, "call", a_writer_between_pages)
    paged = cli("diff", "--patch", before, cwd=repo, env=env).stdout
    assert paged == expected  # every page of the first capture: f4.txt as it was, not half of each
    assert len(pages) > 2 and all(page.get("worktree_tree") == pages[1]["worktree_tree"] for page in pages[1:])
