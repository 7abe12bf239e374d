"""``snapshotd mcp``: snapshotd's checkpoints as MCP tools, on stdio, with the official SDK.

An agent can list the checkpoints of its worktree and session, look at what
one turn changed, take a checkpoint, and restore or revert a turn. Whatever
changes files is a preview until called again with ``confirm: true``, and
every applied restore or revert is preceded by the daemon's safety checkpoint.

Each tool answers with a few lines of text for the model and the daemon's
result as structured content (each tool declares its output schema); a
failure is an MCP tool error (``isError``) carrying one sentence: the
daemon's, or which argument is wrong. The worktree is the server's current
folder (agents start MCP servers in the project) unless ``path`` is given;
the session is ``$SNAPSHOTD_SESSION``, else the calling agent's own: the
agent process that started this server, whose hooks recorded its session
(:func:`~snapshotd.agents.hookstate.agent_session`). A checkpoint is named
by id (7+ hex digits) or as ``@`` (the session's newest), ``@~N`` (N before
it) or ``#N`` (its seq N).

The agent is confined to its project: the worktree holding the folder the
server was started in. A ``path`` outside it, or a checkpoint of another
worktree, is refused, since the agent may be steered by what it reads;
``snapshotd mcp --any-worktree`` lets it reach every repository of the user.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from snapshotd.agents import hookstate
from snapshotd.agents.mcpstdio import AnsweringWriter, DrainingReader, Unanswered
from snapshotd.client.launcher import Runner
from snapshotd.contract.refs import is_relative, needs_session
from snapshotd.errors import InvalidParams, SnapshotdError, Untrusted
from snapshotd.settings import VERSION, resolve_socket_path
from snapshotd.store.identity import locate
from snapshotd.turns import turn_end
from snapshotd.wording import one_line, plural, submodule_note

PATCH_LIMIT_CHARS = 20_000
"""The default bound on a patch returned to the model; longer ones are cut and say so."""

_LIST_LIMIT = 20


def _line(cp: dict[str, Any], with_session: bool = False) -> str:
    """One checkpoint as a line of plain text; ``with_session`` names its session (a seq counts in its own)."""
    unchanged = "" if cp.get("changed", True) else " (unchanged)"
    seq = f"{one_line(cp.get('session') or '(default)')} #{cp['seq']}" if with_session else f"#{cp['seq']:<4}"
    return f"{cp['id'][:12]}  {seq} {cp['created_at'][:19].replace('T', ' ')}  {one_line(cp.get('label') or '-')}{unchanged}"


def _result(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _error(error: SnapshotdError) -> CallToolResult:
    message = " ".join(error.message.split())
    return CallToolResult(
        content=[TextContent(type="text", text=message)], structured_content={"error": error.to_dict()}, is_error=True
    )


def _changes_text(result: dict[str, Any], applied: bool) -> str:
    """What a restore or revert wrote and deleted (or would), with the way back."""
    verb = "" if applied else "would "
    submodules = set(result.get("submodules") or [])
    lines = [f"S  {submodule_note(one_line(p), not applied)}" if p in submodules else f"W  {one_line(p)}" for p in result.get("written", [])]
    lines += [f"D  {one_line(p)}" for p in result.get("deleted", [])]
    lines += [f"!  {one_line(c['path'])}: {c['reason']}" for c in result.get("conflicts", []) + result.get("skipped", [])]
    lines.append(f"{verb}write {len(result.get('written', []))}, {verb}delete {len(result.get('deleted', []))}")
    safety = result.get("safety_checkpoint")
    if applied and safety:
        lines.append(f"undo with: restore checkpoint {safety['id'][:12]} (confirm: true)")
    elif not applied and (result.get("written") or result.get("deleted")):
        lines.append("nothing changed yet; call again with confirm: true to apply")
    return "\n".join(lines)


def project_root(folder: str) -> str:
    """The root of the worktree holding ``folder`` (the folder itself when it is in none that can be used)."""
    from snapshotd.store.identity import locate  # pygit2 comes with it

    try:
        return locate(folder).root
    except SnapshotdError:
        return os.path.realpath(folder)


_WIDER = "start it with 'snapshotd mcp --any-worktree' to let it reach your other repositories"


class Tools:
    """The tools' work, done through one :class:`~snapshotd.client.launcher.Runner` (the daemon, started if needed).

    ``root`` is the project the tools are confined to; None: every worktree of the user.
    """

    def __init__(self, runner: Runner, root: str | None = None) -> None:
        self.runner = runner
        self.root = root
        self._ids: dict[str, str] = {}

    def _worktree(self, path: str | None) -> str:
        folder = os.path.abspath(path or os.getcwd())
        if self.root is not None:
            real = os.path.realpath(folder)
            if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
                raise Untrusted(f"The path {path} is outside this MCP server's project {self.root}; {_WIDER}.", path=folder)
        return folder

    def _own(self, checkpoint: dict[str, Any], folder: str) -> dict[str, Any]:
        """``checkpoint``, once it is known to be of the worktree at ``folder`` (when confined)."""
        if self.root is not None:
            if folder not in self._ids:
                self._ids[folder] = self.runner.call("open", {"path": folder})["worktree"]["id"]
            if checkpoint["worktree"] != self._ids[folder]:
                raise Untrusted(
                    f"Checkpoint {checkpoint['id'][:12]} is of another worktree than {folder}; "
                    f"this MCP server works only in its project; {_WIDER}."
                )
        return checkpoint

    def _show(self, checkpoint: str, folder: str) -> dict[str, Any]:
        """The checkpoint a reference names; ``@``, ``@~N`` and ``#N`` count in the agent's session."""
        params = {"checkpoint": checkpoint, "path": folder}
        if needs_session(checkpoint):
            params["session"] = self._need_session(folder, checkpoint)
        return self._own(self.runner.call("show", params)["checkpoint"], folder)

    def _session(self, path: str, session: str | None) -> str | None:
        """The session asked for, else ``$SNAPSHOTD_SESSION``, else the calling agent's (None: not known)."""
        if session or os.environ.get("SNAPSHOTD_SESSION"):
            return session or os.environ["SNAPSHOTD_SESSION"]
        agent = hookstate.agent_session(os.getppid())
        return agent["session"] if agent else None

    def _need_session(self, path: str, reference: str) -> str:
        session = self._session(path, None)
        if session is None:
            raise InvalidParams(
                f"{reference!r} counts in the agent's session, which this MCP server does not know (no snapshotd "
                "hook has run for its agent): name the checkpoint by id, or run 'snapshotd integrate' for the agent."
            )
        return session

    def list_checkpoints(self, session: str | None, all_sessions: bool, limit: int, path: str | None) -> CallToolResult:
        folder = self._worktree(path)
        chosen = None if all_sessions else self._session(folder, session)
        params = {"path": folder, "limit": limit, **({"session": chosen} if chosen else {})}
        checkpoints = self.runner.call("list", params)["checkpoints"]
        heading = f"{plural(len(checkpoints), 'checkpoint')} of {one_line(folder)}" + (f", session {one_line(chosen)}" if chosen else ", every session")
        text = "\n".join([heading + ", newest first:", *(_line(cp, chosen is None) for cp in checkpoints)])
        return _result(text, {"worktree": folder, "session": chosen, "checkpoints": checkpoints})

    def _turn(self, checkpoint: str, to: str | None, path: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(start, end) of the turn ``checkpoint`` opens, or up to ``to`` when given."""
        folder = self._worktree(path)
        start = self._show(checkpoint, folder)
        if to is not None:
            return start, self._show(to, folder)
        params = {"worktree": start["worktree"], **({"session": start["session"]} if start["session"] else {})}
        return start, turn_end(self.runner.call("list", params)["checkpoints"], start)

    def show_turn(self, checkpoint: str, to: str | None, patch: bool, max_patch_chars: int, path: str | None) -> CallToolResult:
        start, end = self._turn(checkpoint, to, path)
        result = self.runner.call("diff", {"from": start["id"], "to": end["id"], "patch": patch or None})
        files = result["files"]
        names = {f["path"]: one_line(f["path"]) for f in files}
        width = max(map(len, names.values()), default=0)
        lines = [f"{_line(start)}\n..{_line(end)}", f"{plural(len(files), 'file')} changed"]
        lines += [
            f"{names[f['path']].ljust(width)}  {'bin' if f['binary'] else '+{} -{}'.format(f['additions'], f['deletions'])}  {f['status']}"
            for f in files
        ]
        structured: dict[str, Any] = {"from": start, "to": end, "files": files}
        if patch:
            text = result.get("patch", "")
            structured["truncated"] = len(text) > max_patch_chars
            structured["patch"] = text[:max_patch_chars]
            lines.append(structured["patch"])
            if structured["truncated"]:
                lines.append(f"[patch cut at {max_patch_chars} of {len(text)} characters; ask for fewer files]")
        return _result("\n".join(lines), structured)

    def checkpoint(self, label: str | None, session: str | None, path: str | None) -> CallToolResult:
        folder = self._worktree(path)
        params = {"path": folder, "label": label, "session": self._session(folder, session)}
        result = self.runner.call("checkpoint", {k: v for k, v in params.items() if v is not None})
        return _result(_line(result["checkpoint"]), result)

    def _paths(self, paths: list[str] | None, path: str | None) -> list[str] | None:
        """``paths`` as the schema takes them, relative to the worktree's top (a plain folder: its own)."""
        if not paths:
            return None
        folder = self._worktree(path)
        try:
            top = locate(folder).root
        except SnapshotdError:
            top = folder
        return [os.path.join(top, p) for p in paths]

    def restore(self, checkpoint: str, paths: list[str] | None, confirm: bool, path: str | None) -> CallToolResult:
        folder = self._worktree(path)
        if self.root is not None or is_relative(checkpoint):
            checkpoint = self._show(checkpoint, folder)["id"]  # what is checked is what is restored
        params = {"checkpoint": checkpoint, "path": folder, "dry_run": not confirm}
        if paths:
            params["paths"] = self._paths(paths, path)
        result = self.runner.call("restore", params)
        return _result(_changes_text(result, confirm), {**result, "applied": confirm})

    def revert_turn(
        self, checkpoint: str, to: str | None, paths: list[str] | None, force: bool, confirm: bool, path: str | None
    ) -> CallToolResult:
        start, end = self._turn(checkpoint, to, path)
        if start["id"] == end["id"]:
            raise InvalidParams(f"Checkpoint {start['id'][:12]} has no later checkpoint in its turn, so there is nothing to revert.")
        params: dict[str, Any] = {"from": start["id"], "to": end["id"], "dry_run": not confirm, "force": force}
        if paths:
            params["paths"] = self._paths(paths, path)
        result = self.runner.call("revert", params)
        text = f"turn {_line(start)}\n  .. {_line(end)}\n" + _changes_text(result, confirm)
        return _result(text, {**result, "from": start, "to": end, "applied": confirm})


async def _answer(work: Callable[..., CallToolResult], *args: Any) -> CallToolResult:
    """Run a blocking tool in a thread; a snapshotd error becomes an MCP tool error."""
    try:
        return await anyio.to_thread.run_sync(work, *args)
    except SnapshotdError as error:
        return _error(error)


def _wrong_arguments(tool: str, error: ValidationError) -> str:
    """One sentence for arguments the tool's input schema refuses (the SDK would dump pydantic's report)."""
    problems = []
    for item in error.errors()[:3]:
        where = ".".join(str(part) for part in item["loc"]) or "the arguments"
        problems.append(f"{where!r} {str(item['msg'])[:1].lower()}{str(item['msg'])[1:]}")
    return f"The arguments of {tool} are wrong: {'; '.join(problems)}; see the tool's input schema."


class _Server(MCPServer):
    """The SDK's server, with wrong arguments said in one sentence, answering every call read before stdin closed."""

    async def run_stdio_async(self) -> None:
        async with stdio_server() as (read_stream, write_stream):
            unanswered = Unanswered()
            server = self._lowlevel_server  # as the SDK's own run_stdio_async, with the streams wrapped
            reader, writer = DrainingReader(read_stream, unanswered), AnsweringWriter(write_stream, unanswered)
            await server.run(reader, writer, server.create_initialization_options())

    async def call_tool(self, name: str, arguments: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        tool = self._tool_manager.get_tool(name)
        known = tool.parameters.get("properties", {}) if tool is not None else {}
        unknown = sorted(set(arguments or {}) - set(known)) if tool is not None else []
        if unknown:  # a misspelt argument would otherwise be dropped, and its tool run without it
            raise ToolError(
                f"The arguments of {name} are wrong: {unknown[0]!r} is not one of them ({', '.join(known)}); "
                "see the tool's input schema."
            )
        try:
            return await super().call_tool(name, arguments, *args, **kwargs)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(_wrong_arguments(name, exc.__cause__)) from exc.__cause__
            raise


# What each tool's structured content holds (its output schema); a daemon checkpoint is an object.
Checkpoint = dict[str, Any]


class ListOutput(TypedDict):
    worktree: Annotated[str, Field(description="The worktree's folder.")]
    session: Annotated[str | None, Field(description="The session listed; null: every session.")]
    checkpoints: Annotated[list[Checkpoint], Field(description="The checkpoints, newest first (id, seq, label, created_at, tree, session, ...).")]


class TurnOutput(TypedDict, total=False):
    from_: Annotated[Checkpoint, Field(alias="from", description="The checkpoint the turn starts at.")]
    to: Annotated[Checkpoint, Field(description="The turn's last checkpoint.")]
    files: Annotated[list[dict[str, Any]], Field(description="Each file changed: path, status, additions, deletions, binary.")]
    patch: Annotated[str, Field(description="The patch, when asked for, cut at max_patch_chars.")]
    truncated: Annotated[bool, Field(description="Whether the patch was cut.")]


class CheckpointOutput(TypedDict, total=False):
    checkpoint: Annotated[Checkpoint, Field(description="The checkpoint taken.")]


class ChangeOutput(TypedDict, total=False):
    applied: Annotated[bool, Field(description="Whether files were changed (confirm: true) or this is a preview.")]
    written: Annotated[list[str], Field(description="Files written (or that would be).")]
    deleted: Annotated[list[str], Field(description="Files deleted (or that would be).")]
    conflicts: Annotated[list[dict[str, Any]], Field(description="Files left alone: changed since, or in the way.")]
    safety_checkpoint: Annotated[Checkpoint | None, Field(description="The checkpoint taken first, to undo this.")]


_PATH = Field(description="A folder of the worktree to act on; default: the folder the server started in.")
_REF = "an id (7+ hex digits), '@' (the session's newest), '@~N' (N before it) or '#N' (its seq N)"
_CONFIRM = Field(description="true: apply. false (default): only preview what would change.", strict=True)
_PATHS = Field(description="Only these files or folders, relative to the worktree (default: all).")


def _note_socket(socket_path: str | None) -> None:
    """Keep which socket this server uses, for ``snapshotd doctor`` (an agent may not pass SNAPSHOTD_SOCKET on)."""
    try:
        path = os.path.join(hookstate.hooks_folder(), "mcp.json")
        entry = {"socket": resolve_socket_path(socket_path), "pid": os.getpid(), "time": time.time(), "cwd": os.getcwd()}
        with open(path + f".{os.getpid()}", "w", encoding="utf-8") as handle:
            handle.write(json.dumps(entry))
        os.replace(path + f".{os.getpid()}", path)
    except (OSError, SnapshotdError):
        pass


def build_server(runner: Runner, *, any_worktree: bool = False) -> MCPServer:
    """The MCP server with snapshotd's tools, confined to the project of its folder unless ``any_worktree``."""
    tools = Tools(runner, None if any_worktree else project_root(os.getcwd()))
    server = _Server(name="snapshotd", version=VERSION, instructions=__doc__.split("\n\n")[1])
    reading = ToolAnnotations(read_only_hint=True)

    @server.tool(annotations=reading)
    async def list_checkpoints(
        session: Annotated[str | None, Field(description="The session to list; default: the calling agent's.")] = None,
        all_sessions: Annotated[bool, Field(description="true: every session of the worktree.")] = False,
        limit: Annotated[int, Field(description="At most this many, newest first.", ge=1, le=1000)] = _LIST_LIMIT,
        path: Annotated[str | None, _PATH] = None,
    ) -> Annotated[CallToolResult, ListOutput]:
        """List the checkpoints of this worktree and session, newest first (labels such as 'before: <prompt>', 'after turn')."""
        return await _answer(tools.list_checkpoints, session, all_sessions, limit, path)

    @server.tool(annotations=reading)
    async def show_turn(
        checkpoint: Annotated[str, Field(description=f"The turn's 'before:' checkpoint: {_REF}.")],
        to: Annotated[str | None, Field(description=f"Show up to this checkpoint instead of the turn's end: {_REF}.")] = None,
        patch: Annotated[bool, Field(description="true: add the patch to the lines per file.")] = False,
        max_patch_chars: Annotated[int, Field(description="Cut the patch at this many characters.", ge=1)] = PATCH_LIMIT_CHARS,
        path: Annotated[str | None, _PATH] = None,
    ) -> Annotated[CallToolResult, TurnOutput]:
        """Show what one turn changed: from CHECKPOINT (a turn's 'before:' checkpoint) to the turn's end, or to TO. Lines per file by default; patch=true adds the patch, cut at max_patch_chars."""
        return await _answer(tools.show_turn, checkpoint, to, patch, max_patch_chars, path)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
    async def checkpoint(
        label: Annotated[str | None, Field(description="What the checkpoint is for, shown in lists.")] = None,
        session: Annotated[str | None, Field(description="The session to record it in; default: the calling agent's.")] = None,
        path: Annotated[str | None, _PATH] = None,
    ) -> Annotated[CallToolResult, CheckpointOutput]:
        """Take a checkpoint of the worktree now (a git commit of every file as it is; nothing of yours is touched)."""
        return await _answer(tools.checkpoint, label, session, path)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def restore(
        checkpoint: Annotated[str, Field(description=f"The checkpoint to make the files equal: {_REF}.")],
        paths: Annotated[list[str] | None, _PATHS] = None,
        confirm: Annotated[bool, _CONFIRM] = False,
        path: Annotated[str | None, _PATH] = None,
    ) -> Annotated[CallToolResult, ChangeOutput]:
        """Make the worktree (or PATHS) equal CHECKPOINT. Without confirm=true it only previews; applying takes a safety checkpoint first."""
        return await _answer(tools.restore, checkpoint, paths, confirm, path)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def revert_turn(
        checkpoint: Annotated[str, Field(description=f"The turn's 'before:' checkpoint: {_REF}.")],
        to: Annotated[str | None, Field(description=f"Undo up to this checkpoint instead of the turn's end: {_REF}.")] = None,
        paths: Annotated[list[str] | None, _PATHS] = None,
        force: Annotated[bool, Field(description="true: also overwrite files changed since the turn.", strict=True)] = False,
        confirm: Annotated[bool, _CONFIRM] = False,
        path: Annotated[str | None, _PATH] = None,
    ) -> Annotated[CallToolResult, ChangeOutput]:
        """Undo one turn (from CHECKPOINT to the turn's end, or to TO), leaving later work alone; files changed since are reported, not touched, unless force=true. Without confirm=true it only previews."""
        return await _answer(tools.revert_turn, checkpoint, to, paths, force, confirm, path)

    return server


def serve_stdio(runner: Runner, *, any_worktree: bool = False) -> None:
    """Serve the tools on stdin/stdout until the client closes them."""
    _note_socket(runner.socket_path)
    build_server(runner, any_worktree=any_worktree).run("stdio")
