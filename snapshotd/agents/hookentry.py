"""The agent's hook program: ``python -I -S <this file> TOOL``, the command ``integrate`` writes.

The agent starts it at every event and waits for it, so it loads only what a
hook needs: no site-packages (``-S``: click, pygit2 and trio are out of reach),
no environment's Python settings (``-I``), and the package from beside this
file. The calls go on one connection (:class:`snapshotd.client.onecall.Connection`); when
that is not the ordinary case (no daemon yet, a busy one), the child restores
site-packages and takes the full launcher, which starts a daemon and waits
for room. ``snapshotd hook TOOL`` runs the same :func:`main`.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # run by path: the package is three folders up, this folder is not a package root
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _here]
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

from snapshotd.agents.hooks import report, run_hook
from snapshotd.agents.hookstate import note_silence, silent_lately
from snapshotd.settings import connect_timeout, hook_budget, resolve_socket_path

TYPE_CHECKING = False  # as typing's, without importing typing: each agent hook's start-up imports this module
if TYPE_CHECKING:
    from typing import Any

SILENT_PING_S = 2.0
"""How long a hook waits for the ping of a daemon another hook found silent lately."""

PROGRAM = os.path.abspath(__file__)
"""This file: what the agent's settings run, with this interpreter."""


class Calls:
    """The calls of one hook run to the daemon: on one connection by the fast path when it runs, else
    by the full launcher (for this call and the run's next ones)."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path
        self.fast: Any = None
        self.runner: Any = None

    def __call__(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        # Imported here, in the hook's child: the agent waits for none of it after a tool or a turn.
        from snapshotd.client import onecall

        path = os.path.abspath(resolve_socket_path(self.socket_path))
        if self.runner is None:
            was_silent = False
            if self.fast is None:
                # A daemon busy with a burst answers late, one stopped never: both wait as long as for room,
                # unless a hook found it silent lately (a stopped `snapshotd serve`): then only briefly.
                was_silent = silent_lately(path)
                self.fast = onecall.Connection(path, min(SILENT_PING_S, connect_timeout()) if was_silent else connect_timeout())
            try:
                result: dict[str, Any] = self.fast.call(method, params)
            except onecall.Unusual:
                self.runner = self._runner(path)
            except onecall.Silent:
                note_silence(path, True)
                raise
            else:
                if was_silent:
                    note_silence(path, False)
                return result
        return self.runner.call(method, params)  # type: ignore[no-any-return]

    @staticmethod
    def _runner(path: str) -> Any:
        if sys.flags.no_site:  # in the hook's child, off the agent's wait: the launcher needs site-packages
            import site

            site.main()
        from snapshotd.client.launcher import Runner

        return Runner(path, embedded=False, json_output=True)


def main(argv: list[str], socket_path: str | None = None, budget: float | None = None) -> int:
    """Run one hook of the tool named by ``argv[0]`` on the payload on stdin; always 0."""
    tool = argv[0] if argv else ""
    run_hook(
        tool,
        Calls(socket_path),
        lambda before: hook_budget(budget, before=before),
        lambda outcome: report(tool, outcome, sys.stdout, sys.stderr),
    )
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: the agent waits for this process's exit
