"""A plan made ready to apply: validated, journaled and staged before the worktree is touched.

Everything that can fail without touching the worktree happens when the plan
is prepared, so a caller can check the disk and record a safety checkpoint
knowing the plan is ready, and only then apply it. Applying returns a
:class:`~snapshotd.restore.outcome.RestoreOutcome`; the plan itself is never
changed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import Callable, Iterator

import pygit2

from snapshotd.errors import (
    InvalidParams,
    NotADirectory,
    NotFound,
    SnapshotdError,
    filesystem_error,
)
from snapshotd.git.modes import MODE_GITLINK, MODE_LINK, is_file_mode
from snapshotd.git.repository import Repository
from snapshotd.restore.apply import Applier, folders_to_prune
from snapshotd.restore.backups import BACKUP_PREFIX, Backups
from snapshotd.restore.fileops import TEMP_PREFIX, remove_temp, split_path
from snapshotd.restore.journal import STAGE_PREFIX, make_journal_durable, write_journal
from snapshotd.restore.outcome import RestoreOutcome
from snapshotd.restore.plan import Plan
from snapshotd.restore.stage import GitCheckout, Stage
from snapshotd.restore.writes import write_planned

__all__ = ["PreparedPlan", "apply_plan", "prepared_plan"]


def _validate(repo: Repository, plan: Plan) -> dict[str, bytes]:
    """Check every path and object of the plan before anything is touched.

    Returns the link targets (small) by path. Raises NotFound for a missing or
    wrong object, InvalidParams for an unsafe path or an unknown mode.
    """
    links: dict[str, bytes] = {}
    for path in plan.deletes:
        split_path(path)
    for path, entry in plan.writes:
        split_path(path)
        if entry.mode == MODE_GITLINK:
            continue
        if not (is_file_mode(entry.mode) or entry.mode == MODE_LINK):
            raise InvalidParams(f"Cannot write {path!r} with mode {entry.mode:06o}.", path=path)
        try:
            kind, _ = repo.odb.read_header(entry.oid)
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise NotFound(
                f"The object {entry.oid} for {path!r} is not in the repository.",
                oid=entry.oid,
                path=path,
            ) from exc
        if kind != pygit2.enums.ObjectType.BLOB:
            raise NotFound(f"The object {entry.oid} for {path!r} is not a blob.", oid=entry.oid)
        if entry.mode == MODE_LINK:
            target = repo.odb.read(entry.oid)[1]
            if not target or b"\0" in target:
                raise InvalidParams(f"The symlink {path!r} has an invalid target.", path=path)
            links[path] = target
    return links



class PreparedPlan:
    """A plan ready to apply: :meth:`stale` checks the disk against the safety checkpoint, :meth:`apply` applies."""

    def __init__(
        self,
        plan: Plan,
        applier: Applier,
        temps: dict[str, str],
        links: dict[str, bytes],
        journal_durable: Callable[[], None],
    ) -> None:
        self.plan = plan
        self._applier = applier
        self._temps = temps
        self._links = links
        self._journal_durable = journal_durable

    def stale(self, fence_ns: int | None = None) -> list[str]:
        """The paths to touch that no longer hold what the safety checkpoint recorded; ``fence_ns``, the
        racy-timestamp fence taken just before, spares a second read of those older than it (:meth:`Applier.stale`)."""
        return self._applier.stale(fence_ns)

    def apply(self) -> RestoreOutcome:
        """Carry out the plan and say what was done; on a failure put back everything done so far and re-raise.

        The journal is made durable first (on a journaled file system the
        safety checkpoint's flush just before has carried it: one flush, not
        two). The error then says that nothing was changed, or names exactly
        the paths that could not be put back.
        """
        applier = self._applier
        try:
            self._journal_durable()
        except OSError as exc:
            error = filesystem_error(exc, applier.backups.journal_dir, "prepare the restore in")
            raise type(error)(f"{error.message} Nothing was changed.", **error.data) from exc
        try:
            for path in self.plan.deletes:
                applier.delete(path)
            applier.prune_folders(folders_to_prune(self.plan))
            write_planned(applier, self.plan.writes, self._temps, self._links)
        except SnapshotdError as exc:
            unrestored = applier.roll_back()
            if unrestored:
                raise type(exc)(
                    f"{exc.message} These paths could not be put back as they were (the safety checkpoint "
                    f"holds them): {', '.join(unrestored)}.",
                    **exc.data,
                    unrestored=unrestored,
                ) from exc
            raise type(exc)(f"{exc.message} Nothing was changed: every path already updated was put back.", **exc.data) from exc
        except BaseException:
            applier.roll_back()
            raise
        applier.undo.clear()
        return RestoreOutcome.of_plan(self.plan, applier.skipped)


@contextlib.contextmanager
def prepared_plan(
    repo: Repository,
    workdir: str,
    plan: Plan,
    journal_dir: str,
    checkout: GitCheckout | None = None,
    defer: Callable[[Callable[[], None]], None] | None = None,
) -> Iterator[PreparedPlan]:
    """Get ready to carry out ``plan`` in ``workdir``.

    Everything that can fail without touching the worktree happens on entry:
    the whole plan is validated (NotFound for a missing object, InvalidParams
    for an unsafe path), the journal is written, and with ``checkout`` the
    content of every file is prepared as ``git checkout`` would write it (a
    failing filter raises GitError). So a caller can check the disk and record
    a safety checkpoint inside the block, knowing the plan is ready, and then
    apply. See :func:`apply_plan` for what applying does. Temporary files,
    backups, staged content and the journal are gone on exit, whatever happened,
    and the folders an apply changed are synced first (:func:`_finish`); after a
    block that ended without an error, ``defer`` (when given) is handed that
    sync and removal instead, to run once the caller has answered. The journal
    stays locked until then, and a crash meanwhile leaves it for
    :func:`~snapshotd.restore.journal.recover`.
    """
    links = _validate(repo, plan)
    try:
        root_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFound(f"The worktree {workdir} does not exist.", path=workdir) from exc
    except NotADirectoryError as exc:
        raise NotADirectory(f"The worktree {workdir} is not a folder.", path=workdir) from exc

    token = secrets.token_hex(8)
    stage = Stage(repo, os.path.join(journal_dir, f"{STAGE_PREFIX}{token}"), checkout, workdir)
    applier = Applier(repo, root_fd, plan, stage, Backups(journal_dir, f"{BACKUP_PREFIX}{token}"))
    temps: dict[str, str] = {}
    for path, entry in plan.writes:
        if entry.mode != MODE_GITLINK:
            folder, _, _ = path.rpartition("/")
            temp_name = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
            temps[path] = f"{folder}/{temp_name}" if folder else temp_name

    journal: str | None = None
    journal_fd: int | None = None
    succeeded = False
    try:
        if plan.writes or plan.deletes:
            try:
                journal, journal_fd = write_journal(
                    journal_dir,
                    token,
                    os.path.abspath(workdir),
                    temps,
                    os.path.basename(stage.directory) if checkout is not None else None,
                    applier.backups.name,
                    folders_to_prune(plan),
                )
                stage.keep_attributes(root_fd, plan)
                stage.prepare(root_fd, plan)
            except OSError as exc:
                error = filesystem_error(exc, journal_dir, "prepare the restore in")
                raise type(error)(f"{error.message} Nothing was changed.", **error.data) from exc
        durable = functools.partial(make_journal_durable, journal_dir, journal_fd) if journal_fd is not None else _nothing
        yield PreparedPlan(plan, applier, temps, links, durable)
        succeeded = True
    finally:
        for path, temp in temps.items():
            if path not in applier.placed:  # (a name renamed into place is gone: no walk to look for it)
                remove_temp(root_fd, temp)
        leftovers = functools.partial(_finish, applier, root_fd, stage.directory, journal, journal_fd, succeeded)
        if succeeded and defer is not None:
            defer(leftovers)
        else:
            leftovers()


def _nothing() -> None:
    """No journal to make durable: a plan with nothing to write or delete."""


def _finish(
    applier: Applier, root_fd: int, stage_dir: str, journal: str | None, journal_fd: int | None, finished: bool
) -> None:
    """After the block: the renames of its apply made durable (unless it failed), then its backups, staged content
    and journal removed, the journal last, and its lock let go.

    The folders are synced here, not before the answer: until the journal is
    removed, a crash that loses a rename leaves a temporary file the journal
    names, for :func:`~snapshotd.restore.journal.recover`. A sync that fails
    keeps the journal and the backups for it.
    """
    for_recovery = True
    try:
        if finished:
            applier.sync()
        for_recovery = False
    finally:
        applier.close()
        os.close(root_fd)
        if for_recovery:
            applier.backups.let_go()
        else:
            applier.backups.close()
            shutil.rmtree(stage_dir, ignore_errors=True)
            if journal is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(journal)
        if journal_fd is not None:
            os.close(journal_fd)


def apply_plan(
    repo: Repository,
    workdir: str,
    plan: Plan,
    journal_dir: str,
    checkout: GitCheckout | None = None,
) -> RestoreOutcome:
    """Carry out ``plan`` in ``workdir``: deletes (deepest first), then atomic writes.

    The whole plan is validated first (NotFound for a missing object,
    InvalidParams for an unsafe path), so a bad plan touches nothing. With
    ``checkout``, files are written as ``git checkout`` would write them (line
    endings, filters), their content prepared before anything is touched (a
    failing filter raises GitError and changes nothing). What turns out to be
    unsafe on disk while applying (a symlink or a foreign file where the plan
    expected otherwise) is skipped and listed in the outcome's ``conflicts``
    instead of ``written``/``deleted``, as is a path that no longer holds what
    ``plan.expected`` records (someone wrote it meanwhile), so the outcome
    tells what was done. A filesystem error (FilesystemError for a full, read-only or
    forbidden disk) is raised after every step taken was undone; no temporary
    file or backup is left behind.
    """
    with prepared_plan(repo, workdir, plan, journal_dir, checkout) as prepared:
        return prepared.apply()

