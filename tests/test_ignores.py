"""New paths are settled by one long-lived ``git check-ignore``, and its answers are kept.

A warm capture started ``git ls-files`` for every path it had not met: one
process per capture that followed a new file, and one per capture, forever,
after any write to an ignored file (a log, a build's output). Now check-ignore
answers (capture/ignores.py); ``ls-files`` still lists new folders and what
check-ignore cannot settle. Every tree is git's own (``oracle_tree``).
"""

from __future__ import annotations

import os
from pathlib import Path

from oracle import oracle_tree
from repo_helpers import git, init_repo
from test_warm import checkpoint, warm_up

from snapshotd.capture.ignores import IgnoreOracle
from snapshotd.git.process import GitTarget


async def checked(engine, repo: Path) -> tuple[dict, set[str]]:
    """A checkpoint, its tree checked against git's own, and the paths that tree holds."""
    result = await checkpoint(engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    return result, set(git(repo, "ls-tree", "-r", "--name-only", result["checkpoint"]["id"]).splitlines())


def make_repo(root: Path, ignore: str = "build/\n*.log\n!keep.log\nout/\n") -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text(ignore)
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("a = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


async def test_writes_to_ignored_files_start_no_process_once_answered(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "build").mkdir()
    await warm_up(watched_engine, repo)
    (repo / "src" / "run.log").write_text("first\n")
    (repo / "build" / "out.o").write_text("o\n")
    first = await checkpoint(watched_engine, repo)
    assert first["stats"]["scan"] == "watch" and first["stats"]["processes"] == 1  # check-ignore starts
    assert first["checkpoint"]["tree"] == oracle_tree(repo)
    for index in range(3):
        (repo / "src" / "run.log").write_text(f"again {index}\n")
        (repo / "build" / "out.o").write_text(f"o {index}\n")
        (repo / "build" / f"more{index}.o").write_text("more\n")  # new, in a folder git ignores
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["processes"] == 0, index
        assert result["checkpoint"]["changed"] is False
        assert result["checkpoint"]["tree"] == first["checkpoint"]["tree"] == oracle_tree(repo)


async def test_new_files_in_known_folders_need_no_process_after_the_first(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    processes = []
    for index in range(4):
        (repo / "src" / f"new{index}.py").write_text(f"n = {index}\n")
        (repo / f"top{index}.md").write_text("top\n")
        result = await checkpoint(watched_engine, repo)
        processes.append(result["stats"]["processes"])
        assert result["checkpoint"]["tree"] == oracle_tree(repo), index
    assert processes == [1, 0, 0, 0]


async def test_negations_and_folder_only_rules_are_git_s(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "src" / "keep.log").write_text("kept: !keep.log\n")
    (repo / "src" / "drop.log").write_text("dropped\n")
    (repo / "src" / "out").write_text("a file named out: out/ matches folders only\n")
    (repo / "out").mkdir()
    (repo / "out" / "x").write_text("in a folder named out\n")
    os.symlink("a.py", repo / "src" / "link.log")  # a link named like an ignored file
    _, listed = await checked(watched_engine, repo)
    assert "src/keep.log" in listed and "src/out" in listed
    assert "src/drop.log" not in listed and "out/x" not in listed and "src/link.log" not in listed


async def test_a_changed_ignore_rule_ends_the_answers(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "src" / "run.log").write_text("one\n")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / ".gitignore").write_text("build/\n")  # *.log no longer ignored
    rescanned = await checkpoint(watched_engine, repo)
    assert rescanned["stats"]["scan"] == "full"
    (repo / "src" / "other.log").write_text("new under the new rules\n")
    (repo / "src" / "run.log").write_text("two\n")
    result, listed = await checked(watched_engine, repo)
    assert result["stats"]["scan"] == "watch"
    assert "src/other.log" in listed and "src/run.log" in listed


async def test_a_tracked_file_in_an_ignored_folder_moved_in_anew(watched_engine, tmp_path):
    """An ignored folder that holds tracked files goes to ls-files: what is tracked inside may have changed."""
    repo = make_repo(tmp_path / "r")
    (repo / "build").mkdir()
    (repo / "build" / "tracked.txt").write_text("tracked\n")
    git(repo, "add", "-f", "build/tracked.txt")
    git(repo, "commit", "-qm", "tracked in an ignored folder")
    await warm_up(watched_engine, repo)
    for round in range(3):  # asked about the folder, then its answer kept
        other = tmp_path / f"build{round}"
        other.mkdir()
        (other / "tracked.txt").write_text(f"build number {round}\n")
        (other / "junk.o").write_text("junk\n")
        os.rename(repo / "build", tmp_path / f"old{round}")  # one event each: the folder, not its files
        os.rename(other, repo / "build")
        result = await checkpoint(watched_engine, repo)
        assert result["stats"]["scan"] == "watch"
        assert result["checkpoint"]["tree"] == oracle_tree(repo), round
        assert git(repo, "show", f"{result['checkpoint']['id']}:build/tracked.txt") == f"build number {round}"
    os.rename(repo / "build", tmp_path / "away")  # the tracked file leaves the tree, and comes back with its folder
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    os.rename(tmp_path / "away", repo / "build")
    back = await checkpoint(watched_engine, repo)
    assert back["checkpoint"]["tree"] == oracle_tree(repo)
    assert git(repo, "show", f"{back['checkpoint']['id']}:build/tracked.txt") == "build number 2"


async def test_a_folder_that_becomes_a_nested_repository(watched_engine, tmp_path):
    """A file's folder must be one git walks for a "not ignored" to count: not a nested repository."""
    repo = make_repo(tmp_path / "r")
    (repo / "lib").mkdir()
    (repo / "lib" / "one.c").write_text("one\n")
    await warm_up(watched_engine, repo)
    (repo / "lib" / "two.c").write_text("two\n")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    init_repo(repo / "lib", ("lib.c", "inner\n"))  # and what it held
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "lib" / "three.c").write_text("inside the nested repository\n")
    (repo / "src" / "b.py").write_text("b = 1\n")
    _, listed = await checked(watched_engine, repo)
    assert "lib/three.c" not in listed and "src/b.py" in listed


async def test_odd_names_are_settled_as_git_settles_them(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", "*.log\n:*.tmp\n")
    await warm_up(watched_engine, repo)
    names = ["src/new\nline.py", ":colon.py", ":x.tmp", "src/:y.tmp", "src/caf\xe9.log", "src/sp ace.py"]
    for name in names:
        (repo / name).write_text("odd\n")
    (repo / "src" / os.fsdecode(b"\xff\xfe.py")).write_text("not UTF-8\n")
    result = await checkpoint(watched_engine, repo)
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    for name in names:
        (repo / name).write_text("odd again\n")
    again = await checkpoint(watched_engine, repo)
    assert again["checkpoint"]["tree"] == oracle_tree(repo)


class Rules:
    """Stands for a warm state: what the oracle's answers hold for."""

    kept: Rules


Rules.kept = Rules()


def test_the_oracle_answers_restarts_and_ends(tmp_path):
    repo = make_repo(tmp_path / "r")
    (repo / "src" / "x.log").write_text("x\n")
    (repo / "build").mkdir()
    (repo / "out").write_text("a file: out/ matches folders only\n")
    os.symlink("src", repo / "link")
    target = GitTarget(git_dir=str(repo / ".git"), work_tree=str(repo))
    oracle, rules = IgnoreOracle(), Rules()
    answers = oracle.ask(target, rules, ["src/x.log", "src/keep.log", "build", "src/b.py"])
    assert oracle.started == 1
    assert answers == {"src/x.log": True, "src/keep.log": False, "build": True, "src/b.py": False}
    assert oracle.ask(target, rules, ["out"]) == {"out": False} and oracle.started == 1  # the same child
    assert oracle.ask(target, rules, ["link/x.py"]) is None  # git stops: a path beyond a link
    assert oracle.ask(target, rules, ["src/y.log"]) is None and oracle.started == 1  # not again for these rules
    assert oracle.ask(target, Rules(), ["src/y.log"]) == {"src/y.log": True} and oracle.started == 2  # new rules
    oracle.met_anew("build")  # never looked inside it: the same child
    assert oracle.ask(target, Rules.kept, ["src/z.log"]) is not None and oracle.started == 3
    oracle.met_anew("build")
    assert oracle.ask(target, Rules.kept, ["src/z.log"]) is not None and oracle.started == 3
    oracle.met_anew("src")  # it read src's rules: started anew
    assert oracle.ask(target, Rules.kept, ["src/z.log"]) is not None and oracle.started == 4
    child = oracle._session
    assert child is not None
    oracle.close()
    assert child.closed and child.returncode is not None


async def test_a_gitlink_in_an_ignored_folder_follows_its_commits(watched_engine, tmp_path):
    """A folder git ignores may still be a tracked gitlink: its answer never hides the commit it moves to."""
    repo = make_repo(tmp_path / "r", "deps/\n")
    inner = init_repo(repo / "deps" / "lib", ("lib.c", "inner\n"))
    git(repo, "add", "-f", "deps/lib")
    git(repo, "commit", "-qm", "a gitlink in an ignored folder")
    await warm_up(watched_engine, repo)
    for round in range(3):
        (inner / "lib.c").write_text(f"round {round}\n")
        git(inner, "commit", "-qam", f"round {round}")
        result = await checkpoint(watched_engine, repo)
        assert result["checkpoint"]["tree"] == oracle_tree(repo), round
        assert git(repo, "rev-parse", f"{result['checkpoint']['id']}:deps/lib") == git(inner, "rev-parse", "HEAD")


async def test_a_folder_moved_in_whole_brings_its_own_rules(watched_engine, tmp_path):
    """A folder moved in comes as one event, its ``.gitignore`` with it: answers below it are asked again."""
    repo = make_repo(tmp_path / "r", "build/\n")
    (repo / "lib").mkdir()
    (repo / "lib" / ".gitignore").write_text("*.tmp\n")
    (repo / "lib" / "a.c").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "lib")
    await warm_up(watched_engine, repo)
    (repo / "lib" / "x.tmp").write_text("ignored by lib/.gitignore\n")
    (repo / "lib" / "b.c").write_text("b\n")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    other = tmp_path / "other-lib"
    other.mkdir()
    (other / "a.c").write_text("another a, and no .gitignore\n")
    os.rename(repo / "lib", tmp_path / "old-lib")
    os.rename(other, repo / "lib")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    (repo / "lib" / "x.tmp").write_text("no rule ignores it now\n")
    (repo / "lib" / "y.tmp").write_text("nor this one\n")
    result, listed = await checked(watched_engine, repo)
    assert result["stats"]["scan"] == "watch"
    assert "lib/x.tmp" in listed and "lib/y.tmp" in listed


def git_children(kind: bytes) -> set[int]:
    """The pids of this process's children that run ``git <kind>``."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and kind in argv:
            found.add(int(entry))
    return found


def check_ignore_children() -> int:
    """This process's children that are a ``git check-ignore``."""
    return len(git_children(b"check-ignore"))


async def test_a_new_folder_is_walked_and_settled_without_ls_files(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "src" / "started.py").write_text("starts check-ignore\n")
    assert (await checkpoint(watched_engine, repo))["stats"]["processes"] == 1
    feature = repo / "src" / "feature"
    (feature / "deep" / "deeper").mkdir(parents=True)
    (feature / "empty").mkdir()
    (feature / "build").mkdir()
    (feature / "build" / "out.o").write_text("a folder git ignores: never entered\n")
    (feature / "__init__.py").write_text("\n")
    (feature / "run.log").write_text("ignored\n")
    (feature / "keep.log").write_text("kept: !keep.log\n")
    (feature / "deep" / ".gitignore").write_text("*.py\n!wanted.py\n")
    (feature / "deep" / "unwanted.py").write_text("ignored by deep/.gitignore\n")
    (feature / "deep" / "wanted.py").write_text("kept\n")
    (feature / "deep" / "deeper" / "x.txt").write_text("x\n")
    os.symlink("../__init__.py", feature / "deep" / "link")
    os.mkfifo(feature / "fifo")  # git lists no special file
    result, listed = await checked(watched_engine, repo)
    assert result["stats"]["processes"] == 0
    assert {"src/feature/__init__.py", "src/feature/keep.log", "src/feature/deep/wanted.py",
            "src/feature/deep/deeper/x.txt", "src/feature/deep/link"} <= listed
    (feature / "deep" / "deeper" / "x.txt").write_text("an edit: known now\n")
    (feature / "run.log").write_text("still ignored\n")
    again = await checkpoint(watched_engine, repo)
    assert again["stats"]["processes"] == 0 and again["checkpoint"]["tree"] == oracle_tree(repo)


async def test_new_folders_git_must_list(watched_engine, tmp_path):
    """A ``.git`` inside (a nested repository, maybe) or too many paths: ``ls-files`` lists the folder."""
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    (repo / "src" / "started.py").write_text("starts check-ignore\n")
    await checkpoint(watched_engine, repo)
    init_repo(repo / "vendor" / "lib", ("lib.c", "inner\n"))
    (repo / "vendor" / "notes.md").write_text("beside it\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["processes"] == 1
    assert result["checkpoint"]["tree"] == oracle_tree(repo)
    wide = repo / "wide"
    wide.mkdir()
    for index in range(2001):
        (wide / f"f{index}.txt").write_text(f"{index}\n")
    result = await checkpoint(watched_engine, repo)
    assert result["stats"]["processes"] == 1
    assert result["checkpoint"]["tree"] == oracle_tree(repo)


async def test_a_folder_of_ignored_files_replaced_by_one_with_its_own_rules(watched_engine, tmp_path):
    repo = make_repo(tmp_path / "r", "*.log\n")
    (repo / "logs").mkdir()
    await warm_up(watched_engine, repo)
    (repo / "logs" / "a.log").write_text("ignored by the root's rules\n")
    assert (await checkpoint(watched_engine, repo))["checkpoint"]["tree"] == oracle_tree(repo)
    other = tmp_path / "other-logs"
    other.mkdir()
    (other / ".gitignore").write_text("!*.log\n")
    (other / "b.log").write_text("taken back in by logs/.gitignore\n")
    os.rename(repo / "logs", tmp_path / "old-logs")
    os.rename(other, repo / "logs")
    _, listed = await checked(watched_engine, repo)
    assert "logs/b.log" in listed


async def test_a_check_ignore_that_cannot_answer_leaves_the_paths_to_ls_files(watched_engine, tmp_path, monkeypatch):
    """A git that stops at once (here an option it refuses) is started once per warm state; ls-files answers."""
    monkeypatch.setattr("snapshotd.capture.ignores.CHECK_IGNORE", ["check-ignore", "--stdin", "--no-such-option"])
    repo = make_repo(tmp_path / "r")
    await warm_up(watched_engine, repo)
    processes = []
    for index in range(3):
        (repo / "src" / f"new{index}.py").write_text("new\n")
        (repo / "src" / f"run{index}.log").write_text("ignored\n")
        result = await checkpoint(watched_engine, repo)
        processes.append(result["stats"]["processes"])
        assert result["checkpoint"]["tree"] == oracle_tree(repo), index
    assert processes == [2, 1, 1]


async def test_a_gitignore_git_reads_from_the_index_keeps_ls_files(watched_engine, tmp_path):
    """A skip-worktree ``.gitignore`` not on disk still rules (git reads the index's copy); check-ignore
    ``--no-index`` would not see it, so it is not asked."""
    repo = make_repo(tmp_path / "r")
    (repo / "sub").mkdir()
    (repo / "sub" / ".gitignore").write_text("*.tmp\n")
    (repo / "sub" / "kept.txt").write_text("kept\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "sub")
    git(repo, "update-index", "--skip-worktree", "sub/.gitignore")
    (repo / "sub" / ".gitignore").unlink()
    await warm_up(watched_engine, repo)
    (repo / "sub" / "x.tmp").write_text("ignored by the index's sub/.gitignore\n")
    (repo / "sub" / "y.txt").write_text("not ignored\n")
    result, listed = await checked(watched_engine, repo)
    assert result["stats"]["scan"] == "watch" and result["stats"]["processes"] == 1  # ls-files, no check-ignore
    assert "sub/y.txt" in listed and "sub/x.tmp" not in listed
