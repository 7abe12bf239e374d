"""A local mock model for the real Claude Code and Codex programs: it plays a script of tool calls.

One HTTP server on 127.0.0.1 answers Anthropic's Messages API (``POST
/v1/messages``, server-sent events, for ``claude`` with ``ANTHROPIC_BASE_URL``)
and OpenAI's Responses API (``POST /v1/responses``, for ``codex`` through a
custom model provider). A turn's script is a list of tool calls; the model asks
for the next one each time the tool results come back, then ends the turn
with a short text. Which call is next is read from the request itself (the
tool results since the turn's prompt), so retries and extra requests are safe.

At each main request the worktree is in the state the agent's last hook saw
(the prompt's hook, or the last tool's post-hook, runs before the request), so
the server records ``moment(prompt, step)`` = the oracle's tree then.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Call = tuple[str, dict[str, Any]]  # (tool name, input)


class Script:
    """The tool calls of each turn, keyed by (a part of) the turn's prompt, and what the worktree was at each step."""

    def __init__(self, turns: dict[str, list[Call]], observe: Callable[[], str]) -> None:
        self.turns = turns
        self.observe = observe
        self.moments: dict[tuple[str, int], str] = {}
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def step(self, prompt: str, done: int) -> Call | None:
        """The next call after ``done`` results of the turn opened by ``prompt`` (None: end the turn)."""
        key = next((key for key in self.turns if key in prompt), None)
        if key is None:
            return None
        with self.lock:
            self.moments.setdefault((key, done), self.observe())
        calls = self.turns[key]
        return calls[done] if done < len(calls) else None


def _sse(handler: BaseHTTPRequestHandler, events: list[tuple[str | None, dict[str, Any]]]) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.end_headers()
    for name, data in events:
        prefix = f"event: {name}\n" if name else ""
        handler.wfile.write(f"{prefix}data: {json.dumps(data)}\n\n".encode())
    handler.wfile.flush()
    handler.close_connection = True


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") in ("text", "input_text"))
    return ""


# --- Anthropic Messages ------------------------------------------------------


def _anthropic_turn(body: dict[str, Any]) -> tuple[str, int]:
    """The prompt of the current turn and how many tool results came back since it."""
    prompt, done = "", 0
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        results = sum(1 for part in parts if isinstance(part, dict) and part.get("type") == "tool_result")
        if results:
            done += results
        elif text := _text(content).strip():
            prompt, done = text, 0
    return prompt, done


def _anthropic_events(call: Call | None, model: str, index: int) -> list[tuple[str | None, dict[str, Any]]]:
    message = {"id": f"msg_{index}", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    events: list[tuple[str | None, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": message})]
    if call is None:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": "Done."}
        stop = "end_turn"
    else:
        block = {"type": "tool_use", "id": f"toolu_{index}", "name": call[0], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call[1])}
        stop = "tool_use"
    events += [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


# --- OpenAI Responses ---------------------------------------------------------


def _responses_turn(body: dict[str, Any]) -> tuple[str, int]:
    prompt, done = "", 0
    for item in body.get("input", []):
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            text = _text(item.get("content")).strip()
            if text and not text.startswith("<"):  # not the environment or instructions blocks
                prompt, done = text, 0
        elif kind in ("function_call_output", "custom_tool_call_output"):
            done += 1
    return prompt, done


def _responses_events(call: Call | None, index: int) -> list[tuple[str | None, dict[str, Any]]]:
    response = {"id": f"resp_{index}", "object": "response", "status": "in_progress", "output": []}
    if call is None:
        item: dict[str, Any] = {"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}
    elif call[0] == "apply_patch" and "input" in call[1]:
        item = {"type": "custom_tool_call", "id": f"ctc_{index}", "call_id": f"call_{index}", "name": "apply_patch",
                "input": call[1]["input"], "status": "completed"}
    else:
        item = {"type": "function_call", "id": f"fc_{index}", "call_id": f"call_{index}", "name": call[0],
                "arguments": json.dumps(call[1]), "status": "completed"}
    done = {**response, "status": "completed", "output": [item],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    return [
        (None, {"type": "response.created", "response": response}),
        (None, {"type": "response.output_item.added", "output_index": 0, "item": item}),
        (None, {"type": "response.output_item.done", "output_index": 0, "item": item}),
        (None, {"type": "response.completed", "response": done}),
    ]


class MockModel:
    """The server, on 127.0.0.1 at a free port, in a thread; ``url`` is its base."""

    def __init__(self, script: Script) -> None:
        self.script = script
        counter = iter(range(1, 1_000_000))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # model lists and the like: nothing to offer
                with outer.script.lock:
                    outer.script.requests.append({"path": "GET " + self.path, "body": {}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"data": [], "models": []}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                with outer.script.lock:
                    outer.script.requests.append({"path": path, "body": body})
                index = next(counter)
                if path.endswith("/messages/count_tokens"):
                    self._json({"input_tokens": 10})
                elif path.endswith("/messages"):
                    call = None
                    if body.get("tools"):  # the agent's own loop, not a title or a summary
                        call = outer.script.step(*_anthropic_turn(body))
                    events = _anthropic_events(call, body.get("model", "mock"), index)
                    if body.get("stream"):
                        _sse(self, events)
                    else:
                        self._json({**events[0][1]["message"], "content": [events[1][1]["content_block"]], "stop_reason": "end_turn"})
                elif path.endswith("/responses"):
                    call = outer.script.step(*_responses_turn(body)) if body.get("tools") else None
                    _sse(self, _responses_events(call, index))
                else:
                    self._json({})

            def _json(self, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MockModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
