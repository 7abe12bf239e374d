"""One long-lived git child started for one warm state: ``check-ignore`` and ``check-attr`` answer through it.

Both read rules (ignore, attribute) that hold as long as the warm state does:
any change of them makes the next capture a full scan, which makes a new warm
state. So the child is started lazily for a warm state, held by a weak
reference to it (an old warm state is not kept alive), and not started again
for a warm state it gave no answer for (its paths go to git's own commands, as
before). A full scan that proves the rules unchanged (the idle reconciliation,
``verify``, ``exact``: capture/warm.py, ``same_rules``) hands the child on to
the warm state it makes, with what it answered, unless the scan met anew a
folder whose rule files the child may have read. A child left unasked for
:data:`IDLE_S` is ended: 250 idle worktrees hold no process. It is used on a capture's worker
thread under the worktree's lock; :meth:`WarmChild.close` may come from the
loop at any time: it ends the child at once, or leaves that to the capture
using it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from snapshotd.errors import GitError
from snapshotd.git.process import GitTarget, start_git_session
from snapshotd.git.session import Session
from snapshotd.paths import folders_above

log = logging.getLogger(__name__)

IDLE_S = 60.0  # a child no capture asked anything for this long is ended (started anew when needed)


class WarmChild:
    """The lifecycle of one long-lived git child per warm state; subclasses talk to it."""

    def __init__(self, args: list[str]) -> None:
        self._args = args
        self._session: Session | None = None
        self._started_for: weakref.ref[object] | None = None  # the warm state, not kept alive by this
        self._failed_for: weakref.ref[object] | None = None  # the warm state a child gave no answer for
        self._lock = threading.Lock()
        self._retire = False
        self._looked_in: set[str] = set()  # the folders the child may have read rules in, and those above
        self.started = 0  # children started, ever: a capture counts its own from the difference
        self._used = 0.0  # when the child was last asked (monotonic)

    def _child(self, target: GitTarget, rules: object, index_file: str | None = None) -> Session | None:
        """The child answering under the rules of the warm state ``rules`` (started now if need be); None
        when one gave no answer for it, or none could start. Callers hold ``_lock``."""
        if self._failed_for is not None and self._failed_for() is rules:
            return None
        if self._session is None or self._started_for is None or self._started_for() is not rules:
            self._end()
            try:
                self._session = start_git_session(target, self._args, index_file=index_file)
            except GitError as exc:
                log.debug("git %s could not start in %s: %s", self._args[0], target.work_tree, exc)
                self._failed_for = weakref.ref(rules)
                return None
            self._started_for = weakref.ref(rules)
            self.started += 1
        self._used = time.monotonic()
        return self._session

    def _gave_no_answer(self, target: GitTarget, rules: object, exc: BaseException) -> None:
        """git stopped or answered out of turn: end it, and ask nothing more of one for these rules."""
        session = self._session
        log.debug("git %s in %s gave no answer: %s; %s", self._args[0], target.work_tree, exc,
                  session.stderr.decode("utf-8", "replace").strip() if session is not None else "")
        self._end()
        self._failed_for = weakref.ref(rules)

    def _looking_in(self, paths: list[str]) -> None:
        """Note the folders of ``paths``, whose rule files the child will read (callers hold ``_lock``)."""
        for path in paths:
            self._looked_in.update(folders_above(path))

    def met_anew(self, folder: str) -> None:
        """``folder`` is not the one the child may have looked in (moved in or out whole, no event names the
        rule files in it), and git keeps the rules of the folders it read: then the next question starts anew."""
        with self._lock:
            if folder in self._looked_in:
                self._started_for = None  # and with the child, what it answered goes (``_ended``)

    def carry(self, old: object, new: object, met_anew: set[str]) -> None:
        """The warm state ``new`` holds ``old``'s rules: the child answers for it too, unless a path in
        ``met_anew`` (changed since the child was last told) is a folder it may have read rules in."""
        if not self._lock.acquire(blocking=False):
            self.close()  # a capture is using it: not the one being replaced's
            return
        try:
            if self._started_for is None or self._started_for() is not old or not self._looked_in.isdisjoint(met_anew):
                self._end()
            else:
                self._started_for = weakref.ref(new)
        finally:
            self._lock.release()

    def end_if_idle(self) -> None:
        """End the child if no capture asked it anything for :data:`IDLE_S` (a worktree left alone holds none)."""
        if self._session is None or not self._lock.acquire(blocking=False):
            return  # none, or a capture is asking it now
        try:
            if time.monotonic() - self._used >= IDLE_S:
                self._end()
        finally:
            self._lock.release()

    def close(self) -> None:
        """End the child now, or, when a capture is using it, as that capture ends."""
        if self._lock.acquire(blocking=False):
            try:
                self._end()
            finally:
                self._lock.release()
        else:
            self._retire = True

    def _after_use(self) -> None:
        if self._retire:
            self._end()

    def _end(self) -> None:
        session, self._session, self._started_for, self._retire = self._session, None, None, False
        self._looked_in = set()
        self._ended()
        if session is not None:
            session.close(wait=0)

    def _ended(self) -> None:
        """What a subclass forgets with its child."""
