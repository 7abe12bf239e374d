"""libgit2's diff told where two trees differ gives exactly the diff of the whole trees.

Random pairs of trees are written with pygit2 (no worktree): names that
share a prefix with a folder ("a", "a-b", "a.b", "a/"), folders becoming
files and back, links and gitlinks, renames. The whole diff reads every
tree; the limited one is what ``diff`` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pygit2
from hypothesis import HealthCheck, given, settings, strategies as st
from pygit2.enums import DiffFind, DiffOption

from snapshotd.git import treediff
from snapshotd.git.modes import MODE_EXEC, MODE_FILE, MODE_GITLINK, MODE_LINK, MODE_TREE

NAMES = ["a", "a-b", "a.b", "a b", "ab", "b", "a0"]
TEXTS = ["one\n", "one\ntwo\n", "".join(f"line {i}\n" for i in range(30)), "".join(f"line {i}\n" for i in range(31))]
GITLINK_IDS = ["1" * 40, "2" * 40]

leaves = st.one_of(
    st.tuples(st.sampled_from([MODE_FILE, MODE_EXEC, MODE_LINK]), st.sampled_from(TEXTS)),
    st.tuples(st.just(MODE_GITLINK), st.sampled_from(GITLINK_IDS)),
)
trees = st.recursive(
    leaves,
    lambda children: st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=4),
    max_leaves=14,
).filter(lambda tree: isinstance(tree, dict))


def write(repo: pygit2.Repository, tree: dict[str, Any]) -> pygit2.Oid:
    builder = repo.TreeBuilder()
    for name, value in tree.items():
        if isinstance(value, dict):
            builder.insert(name, write(repo, value), MODE_TREE)
        elif value[0] == MODE_GITLINK:
            builder.insert(name, pygit2.Oid(hex=value[1]), MODE_GITLINK)
        else:
            builder.insert(name, repo.create_blob(value[1].encode()), value[0])
    return builder.write()


def shape(diff: pygit2.Diff | None) -> list[tuple[Any, ...]]:
    if diff is None:
        return []
    diff.find_similar(flags=DiffFind.FIND_RENAMES)
    return [
        (d.status, d.old_file.raw_path, d.new_file.raw_path, d.old_file.mode, d.new_file.mode,
         str(d.old_file.id), str(d.new_file.id), d.similarity)
        for d in diff.deltas
    ] + [diff.patch]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.one_of(st.none(), trees), new=st.one_of(st.none(), trees))
def test_the_limited_diff_is_the_whole_diff(tmp_path: Path, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
    repo = pygit2.init_repository(str(tmp_path / "store"), bare=True)
    sides = [None if side is None else repo[write(repo, side)] for side in (old, new)]
    if sides[0] is not None and sides[1] is not None and sides[0].id == sides[1].id:
        return
    for flags in (DiffOption.INCLUDE_TYPECHANGE, DiffOption.NORMAL):
        whole = None if sides == [None, None] else treediff._whole_diff(sides[0], sides[1], flags, 3)
        assert shape(treediff.tree_diff(repo, sides[0], sides[1], flags, 3)) == shape(whole)
