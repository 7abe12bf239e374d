"""What a restore or revert reports: the RestoreOutcome the apply step returns, and its wire shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from repo_helpers import init_repo, write
from restore_helpers import capture

from snapshotd.engine.core import Engine
from snapshotd.git.repository import open_repository
from snapshotd.restore.outcome import RestoreOutcome
from snapshotd.restore.plan import REASON_IN_THE_WAY, REASON_SYMLINK, Plan, plan_restore
from snapshotd.restore.prepared import apply_plan
from snapshotd.restore.trees import Entry


def test_apply_returns_what_it_did_and_leaves_the_plan_as_planned(tmp_path: Path) -> None:
    wt = init_repo(tmp_path / "wt", ("d/victim.txt", "v1\n"), ("ok.txt", "ok at A\n"), commit=False)
    tree_a = capture(wt)
    write(wt / "d" / "victim.txt", "v2\n")
    write(wt / "ok.txt", "ok edited\n")
    repo = open_repository(str(wt / ".git"))
    plan = plan_restore(repo, capture(wt), tree_a, None, str(wt))
    planned = (list(plan.writes), list(plan.deletes), list(plan.conflicts), set(plan.chmod_only))
    shutil.rmtree(wt / "d")
    (wt / "d").symlink_to(tmp_path)  # swapped for a symlink after planning

    outcome = apply_plan(repo, str(wt), plan, str(tmp_path / "journal"))

    assert outcome == RestoreOutcome(
        written=["ok.txt"], deleted=[], conflicts=[{"path": "d/victim.txt", "reason": REASON_SYMLINK}]
    )
    assert (plan.writes, plan.deletes, plan.conflicts, plan.chmod_only) == planned
    assert (wt / "ok.txt").read_text() == "ok at A\n"


def test_of_plan_merges_what_was_skipped_in_path_order() -> None:
    entry = Entry("0" * 40, 0o100644)
    plan = Plan(
        writes=[("a.txt", entry), ("m.txt", entry), ("z.txt", entry)],
        deletes=["b.txt", "y.txt"],
        conflicts=[{"path": "k.txt", "reason": REASON_IN_THE_WAY}],
    )
    outcome = RestoreOutcome.of_plan(plan, {"z.txt": REASON_SYMLINK, "b.txt": REASON_SYMLINK, "k.txt": "other"})
    assert outcome.written == ["a.txt", "m.txt"] and outcome.deleted == ["y.txt"]
    assert outcome.conflicts == [
        {"path": "b.txt", "reason": REASON_SYMLINK},
        {"path": "k.txt", "reason": REASON_IN_THE_WAY},  # the planned reason stands
        {"path": "z.txt", "reason": REASON_SYMLINK},
    ]
    assert RestoreOutcome.of_plan(plan, dry_run=True).dry_run


def test_wire_shapes_of_restore_and_revert() -> None:
    conflict = {"path": "a", "reason": REASON_IN_THE_WAY}
    restore = RestoreOutcome(written=["w"], deleted=["d"], conflicts=[conflict], kept=[])
    assert json.dumps(restore.to_wire()) == json.dumps(
        {"safety_checkpoint": None, "written": ["w"], "deleted": ["d"], "kept": [], "skipped": [conflict]}
    )
    clean = RestoreOutcome(written=[], deleted=[], conflicts=[], kept=[])
    assert list(clean.to_wire()) == ["safety_checkpoint", "written", "deleted", "kept"]
    revert = RestoreOutcome(written=[], deleted=[], conflicts=[])
    assert json.dumps(revert.to_wire()) == json.dumps(
        {"safety_checkpoint": None, "written": [], "deleted": [], "conflicts": []}
    )


async def test_results_through_the_engine_keep_their_keys_in_order(engine: Engine, tmp_path: Path) -> None:
    wt = init_repo(tmp_path / "wt", ("a.txt", "a at A\n"), ("b.txt", "b at A\n"))
    first = (await engine.call("checkpoint", {"path": str(wt), "session": "s"}))["checkpoint"]
    write(wt / "a.txt", "a edited\n")
    write(wt / "new.txt", "new\n")
    second = (await engine.call("checkpoint", {"path": str(wt), "session": "s"}))["checkpoint"]

    restored = await engine.call("restore", {"checkpoint": first["id"], "path": str(wt)})
    assert list(restored) == ["safety_checkpoint", "written", "deleted", "kept"]
    assert (restored["written"], restored["deleted"]) == (["a.txt"], ["new.txt"])
    assert restored["safety_checkpoint"]["tree"] == second["tree"]

    reverted = await engine.call("revert", {"from": first["id"], "to": second["id"], "path": str(wt)})
    assert list(reverted) == ["safety_checkpoint", "written", "deleted", "conflicts"]
    assert reverted["safety_checkpoint"] is None and reverted["conflicts"] == []
