"""The protocol layer without a socket: framing, messages, dispatch, validators."""

from __future__ import annotations

import itertools
import json
import logging
import os
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from snapshotd import errors
from snapshotd.contract.framing import (
    DEFAULT_LINE_LIMIT,
    LineBuffer,
    Notification,
    Response,
    decode_line,
    encode_message,
    error_response,
    is_blank,
    notification_message,
    parse_incoming,
    parse_request,
    request_message,
    result_response,
)
from snapshotd.contract.params import (
    optional_bool,
    optional_int,
    optional_str,
    optional_str_list,
    require_str,
)
from snapshotd.errors import (
    ERRORS_BY_CODE,
    ERRORS_BY_KIND,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    ParseError,
    SnapshotdError,
)
from snapshotd.server.dispatch import Session, dispatch, dispatch_message, reject
from snapshotd.settings import resolve_socket_path

CONTRACT_KINDS = {
    "not_found",
    "ambiguous",
    "not_a_directory",
    "worktree_mismatch",
    "path_outside_worktree",
    "git_error",
    "unsupported",
    "too_large",
    "untrusted",
    "busy",
    "shutting_down",
    # additions
    "state_unreadable",
    "needs_force",
    "filesystem",
}


class FakeService:
    """An in-memory service with a few methods that exercise every outcome."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], Session | None]] = []

    async def call(
        self, method: str, params: dict[str, Any], session: Session | None
    ) -> dict[str, Any]:
        self.calls.append((method, params, session))
        if method == "echo":
            return {"params": params}
        if method == "path":
            return {"path": require_str(params, "path")}
        if method == "fail":
            raise ERRORS_BY_KIND[params["kind"]]("The thing failed.", detail=1)
        if method == "boom":
            raise RuntimeError("kaboom\nwith a second line")
        if method == "not_a_dict":
            return [1, 2]  # type: ignore[return-value]
        if method == "unserialisable":
            return {"value": object()}
        if method == "nan":
            return {"value": float("nan")}
        raise MethodNotFound(f"There is no method {method!r}.")


async def ask(message: Any, service: FakeService | None = None) -> dict[str, Any] | None:
    """Dict in, dict out: what the daemon answers to one message."""
    return await dispatch_message(service or FakeService(), message, None)


async def ask_line(line: bytes, service: FakeService | None = None) -> dict[str, Any] | None:
    out = await dispatch(service or FakeService(), line, None)
    if out is None:
        return None
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    return json.loads(out)


def req(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def one_sentence(message: str) -> bool:
    return "\n" not in message and message[:1].isupper() and message.endswith(".")


# --------------------------------------------------------------------------
# The error table.


def test_error_codes_and_kinds_are_unique() -> None:
    classes = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, SnapshotdError) and obj is not SnapshotdError
    ]
    protocol_classes = [cls for cls in classes if cls.kind is None]
    application_classes = [cls for cls in classes if cls.kind is not None]
    codes = [cls.code for cls in protocol_classes]
    assert sorted(codes) == sorted(set(codes)) == [-32700, -32603, -32602, -32601, -32600]
    kinds = [cls.kind for cls in application_classes]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == CONTRACT_KINDS
    assert all(cls.code == -32000 for cls in application_classes)
    assert set(ERRORS_BY_KIND.values()) == set(application_classes)
    assert set(ERRORS_BY_CODE.values()) == set(protocol_classes)


@pytest.mark.parametrize("cls", [*ERRORS_BY_CODE.values(), *ERRORS_BY_KIND.values()])
def test_error_survives_the_wire(cls: type[SnapshotdError]) -> None:
    original = cls("Something went wrong.", path="/x")
    line = encode_message(error_response(3, original))
    incoming = parse_incoming(line)
    assert isinstance(incoming, Response) and incoming.id == 3
    rebuilt = incoming.error
    assert type(rebuilt) is cls
    assert rebuilt.message == "Something went wrong."
    assert rebuilt.data == {"path": "/x"}
    assert rebuilt.to_dict() == original.to_dict()


# --------------------------------------------------------------------------
# Dispatch: every error code.


async def test_result_is_wrapped_and_id_echoed() -> None:
    assert await ask(req("echo", {"a": [1, "b"]}, id="x1")) == {
        "jsonrpc": "2.0",
        "id": "x1",
        "result": {"params": {"a": [1, "b"]}},
    }


@pytest.mark.parametrize(
    "line",
    [b"{", b"not json", b'{"jsonrpc": "2.0",}', b"\xff\xfe{}", b'{"a": "\xc3\x28"}', b"[NaN]"],
)
async def test_parse_error(line: bytes) -> None:
    response = await ask_line(line)
    assert response is not None
    assert response["id"] is None
    assert response["error"]["code"] == -32700
    assert one_sentence(response["error"]["message"])


async def test_parse_error_for_deep_nesting_and_huge_numbers() -> None:
    for line in (b"[" * 100_000 + b"]" * 100_000, b"1" * 10_000):
        response = await ask_line(line)
        assert response is not None and response["error"]["code"] == -32700


@pytest.mark.parametrize(
    ("message", "echo_id"),
    [
        ([], None),
        ([req("echo")], None),
        ("text", None),
        (7, None),
        ({"id": 4, "method": "echo"}, 4),
        ({"jsonrpc": "1.0", "id": 4, "method": "echo"}, 4),
        ({"jsonrpc": 2.0, "id": 4, "method": "echo"}, 4),
        ({"jsonrpc": "2.0", "id": 4}, 4),
        ({"jsonrpc": "2.0", "id": 4, "method": 12}, 4),
        ({"jsonrpc": "2.0", "id": 4, "method": None}, 4),
        ({"jsonrpc": "2.0", "id": "a", "method": "echo", "params": [1]}, "a"),
        ({"jsonrpc": "2.0", "id": "a", "method": "echo", "params": "x"}, "a"),
        ({"jsonrpc": "2.0", "id": True, "method": "echo"}, None),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "echo"}, None),
        ({"jsonrpc": "2.0", "id": [1], "method": "echo"}, None),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "echo"}, None),
        ({"jsonrpc": "2.0", "method": 5}, None),  # invalid, even without an id
    ],
)
async def test_invalid_request(message: Any, echo_id: Any) -> None:
    service = FakeService()
    response = await ask(message, service)
    assert response is not None
    assert response["id"] == echo_id
    assert response["error"]["code"] == -32600
    assert one_sentence(response["error"]["message"])
    assert service.calls == []


async def test_method_not_found() -> None:
    response = await ask(req("no_such_method", id=9))
    assert response is not None and response["id"] == 9
    assert response["error"]["code"] == -32601


async def test_invalid_params() -> None:
    response = await ask(req("path", {"path": 3}))
    assert response is not None
    assert response["error"] == {
        "code": -32602,
        "message": "The parameter 'path' must be a string, not a number.",
        "data": {"param": "path"},
    }


async def test_internal_error_is_one_sentence_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        response = await ask(req("boom", id=5))
    assert response is not None and response["id"] == 5
    error = response["error"]
    assert error["code"] == -32603
    assert one_sentence(error["message"])
    assert "RuntimeError" in error["message"] and "kaboom" not in error["message"]
    assert any("boom" in record.getMessage() for record in caplog.records)
    assert any(record.exc_info for record in caplog.records)


@pytest.mark.parametrize("method", ["not_a_dict", "unserialisable", "nan"])
async def test_bad_results_become_internal_errors(
    method: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        response = await ask_line(json.dumps(req(method, id="r")).encode())
    assert response is not None and response["id"] == "r"
    assert response["error"]["code"] == -32603
    assert caplog.records


@pytest.mark.parametrize("kind", sorted(CONTRACT_KINDS))
async def test_application_errors(kind: str) -> None:
    response = await ask(req("fail", {"kind": kind}, id=2))
    assert response == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {
            "code": -32000,
            "message": "The thing failed.",
            "data": {"detail": 1, "kind": kind},
        },
    }


# --------------------------------------------------------------------------
# Dispatch: ids, notifications, shapes.


@pytest.mark.parametrize("request_id", ["abc", "", "ünï ☃", 0, -5, 2**70, None])
async def test_id_is_echoed_with_its_type(request_id: Any) -> None:
    response = await ask_line(json.dumps(req("echo", id=request_id)).encode())
    assert response is not None
    assert response["id"] == request_id
    assert type(response["id"]) is type(request_id)


async def test_notifications_get_no_response(caplog: pytest.LogCaptureFixture) -> None:
    service = FakeService()
    for method in ("echo", "no_such_method", "fail", "boom"):
        message = {"jsonrpc": "2.0", "method": method, "params": {"kind": "busy"}}
        with caplog.at_level(logging.CRITICAL):
            assert await ask(message, service) is None
            assert await ask_line(json.dumps(message).encode(), service) is None
    methods = [call[0] for call in service.calls]
    assert methods == [m for m in ("echo", "no_such_method", "fail", "boom") for _ in (1, 2)]


async def test_null_id_is_a_request_not_a_notification() -> None:
    response = await ask(req("echo", id=None))
    assert response is not None and response["id"] is None and "result" in response


async def test_absent_or_null_params_are_an_empty_object() -> None:
    service = FakeService()
    await ask({"jsonrpc": "2.0", "id": 1, "method": "echo"}, service)
    await ask({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": None}, service)
    assert [call[1] for call in service.calls] == [{}, {}]


async def test_session_is_passed_through() -> None:
    service = FakeService()
    marker = object()
    await dispatch(service, json.dumps(req("echo")).encode(), marker)  # type: ignore[arg-type]
    assert service.calls[0][2] is marker


async def test_blank_lines_are_skipped() -> None:
    service = FakeService()
    for line in (b"", b"   ", b"\t\r"):
        assert await dispatch(service, line, None) is None
    assert service.calls == []


async def test_output_is_ascii_even_for_lone_surrogates() -> None:
    service = FakeService()
    out = await dispatch(
        service, b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"p":"\\udcff\xc3\xa9"}}', None
    )
    assert out is not None
    out.decode("ascii")
    assert json.loads(out)["result"] == {"params": {"p": "\udcff\u00e9"}}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]) | json_values,
        "id": st.integers() | st.text() | st.none() | json_values,
        "method": st.sampled_from(["echo", "path", "boom", "nope"]) | json_values,
        "params": st.dictionaries(st.sampled_from(["path", "x"]), json_values) | json_values,
    },
)


@settings(max_examples=200, deadline=None)
@given(message=json_values | request_like)
async def test_any_json_gets_a_well_formed_answer(message: Any) -> None:
    line = json.dumps(message).encode()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logging.getLogger("snapshotd.server.dispatch"), "disabled", True)
        response = await ask_line(line)
    if response is None:
        assert isinstance(message, dict) and "id" not in message
        return
    assert response["jsonrpc"] == "2.0"
    assert ("result" in response) != ("error" in response)
    if "error" in response:
        assert response["error"]["code"] in {-32600, -32601, -32602, -32603, -32000}
        assert isinstance(response["error"]["message"], str)


# --------------------------------------------------------------------------
# Messages.


def test_message_builders() -> None:
    assert request_message("ping", {}, 1) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "ping",
        "params": {},
    }
    assert result_response(1, {}) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert notification_message("changed", {"paths": ["a"]}) == {
        "jsonrpc": "2.0",
        "method": "changed",
        "params": {"paths": ["a"]},
    }
    assert encode_message({"a": 1}) == b'{"a":1}\n'


def test_parse_request_shapes() -> None:
    assert parse_request(req("x", {"a": 1}, id=3)).id == 3
    note = parse_request({"jsonrpc": "2.0", "method": "x"})
    assert note.notification and note.params == {}


def test_parse_incoming() -> None:
    ok = parse_incoming(encode_message(result_response("a", {"x": 1})))
    assert ok == Response(id="a", result={"x": 1})
    failed = parse_incoming(encode_message(error_response(2, NotFound("No such checkpoint."))))
    assert isinstance(failed, Response) and isinstance(failed.error, NotFound)
    note = parse_incoming(encode_message(notification_message("changed", {"a": 1})))
    assert note == Notification("changed", {"a": 1})
    with pytest.raises(ParseError):
        parse_incoming(b"garbage")
    for bad in ([], {"jsonrpc": "2.0", "id": 1}, {"jsonrpc": "2.0", "id": 1, "error": 3}):
        with pytest.raises(InternalError):
            parse_incoming(json.dumps(bad).encode())
    unknown = parse_incoming(b'{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"Odd."}}')
    assert isinstance(unknown, Response) and isinstance(unknown.error, InternalError)


def test_reject() -> None:
    busy = errors.Busy("Too many requests.")
    out = reject(json.dumps(req("echo", id=7)).encode(), busy)
    assert out is not None
    assert json.loads(out) == {"jsonrpc": "2.0", "id": 7, "error": busy.to_dict()}
    assert reject(b'{"jsonrpc":"2.0","method":"echo"}', busy) is None
    assert reject(b"  ", busy) is None
    assert json.loads(reject(b"{", busy) or b"")["error"]["code"] == -32700
    assert json.loads(reject(b'{"id":3}', busy) or b"")["error"]["code"] == -32600


# --------------------------------------------------------------------------
# Framing.


def test_line_buffer_cuts_lines() -> None:
    buffer = LineBuffer(limit=100)
    assert buffer.feed(b"ab") == []
    assert buffer.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert len(buffer) == 1
    assert buffer.feed(b"g\n") == [b"fg"]
    assert buffer.finish() is None
    buffer.feed(b"tail")
    assert buffer.finish() == b"tail"


def test_line_buffer_limit_is_exact() -> None:
    buffer = LineBuffer(limit=4)
    assert buffer.feed(b"abcd\n") == [b"abcd"]
    assert buffer.overflow is None
    assert buffer.feed(b"abcd") == []
    assert buffer.feed(b"e") == []
    assert isinstance(buffer.overflow, InvalidRequest)
    assert one_sentence(buffer.overflow.message)
    assert buffer.overflow.data == {"limit": 4}
    assert len(buffer) == 0
    with pytest.raises(InvalidRequest):  # broken for good: the stream cannot be resynchronised
        buffer.feed(b"\n")
    assert buffer.finish() is None


def test_line_buffer_keeps_the_lines_before_a_long_one() -> None:
    buffer = LineBuffer(limit=4)
    assert buffer.feed(b"ok\nfine\n123456\nlost\n") == [b"ok", b"fine"]
    assert buffer.overflow is not None
    assert len(buffer) == 0


def test_line_buffer_default_limit() -> None:
    assert LineBuffer().limit == DEFAULT_LINE_LIMIT == 16 * 1024 * 1024


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=700), max_size=20),
)
def test_line_buffer_any_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    buffer = LineBuffer(limit=30)
    out: list[bytes] = []
    for start, end in itertools.pairwise(points):
        out.extend(buffer.feed(data[start:end]))
    assert out == lines
    assert buffer.finish() is None


@given(chunks=st.lists(st.binary(min_size=1, max_size=50), max_size=40))
def test_line_buffer_memory_is_bounded(chunks: list[bytes]) -> None:
    limit = 64
    buffer = LineBuffer(limit=limit)
    for chunk in chunks:
        buffer.feed(chunk)
        if buffer.overflow is not None:
            assert len(buffer) == 0
            return
        assert len(buffer) <= limit


def test_is_blank() -> None:
    assert is_blank(b"") and is_blank(b" \t\r\n")
    assert not is_blank(b"\x0b") and not is_blank(b"{}")


def test_decode_line_messages_are_one_sentence() -> None:
    for line in (b"\xff", b"{", b"[Infinity]", b"[" * 50_000):
        with pytest.raises(ParseError) as excinfo:
            decode_line(line)
        assert one_sentence(excinfo.value.message), excinfo.value.message


# --------------------------------------------------------------------------
# Settings and validators.


def test_resolve_socket_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SNAPSHOTD_SOCKET", "/env/s.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/42")
    assert resolve_socket_path("/explicit.sock") == "/explicit.sock"
    assert resolve_socket_path(None) == "/env/s.sock"
    monkeypatch.setenv("SNAPSHOTD_SOCKET", "")
    assert resolve_socket_path(None) == "/run/user/42/snapshotd/snapshotd.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")
    assert resolve_socket_path() == f"/tmp/snapshotd-{os.getuid()}/snapshotd.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert resolve_socket_path() == f"/tmp/snapshotd-{os.getuid()}/snapshotd.sock"


def _param_error(func: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidParams) as excinfo:
        func(*args, **kwargs)
    message = excinfo.value.message
    assert one_sentence(message), message
    assert excinfo.value.data["param"] in message
    return message


def test_require_str() -> None:
    assert require_str({"path": "/a"}, "path") == "/a"
    assert "required" in _param_error(require_str, {}, "path")
    assert "required" in _param_error(require_str, {"path": None}, "path")
    assert _param_error(require_str, {"path": ["a"]}, "path") == (
        "The parameter 'path' must be a string, not an array."
    )


def test_optional_str() -> None:
    assert optional_str({}, "label") is None
    assert optional_str({"label": None}, "label", "d") == "d"
    assert optional_str({"label": "x"}, "label") == "x"
    assert "a string" in _param_error(optional_str, {"label": 1}, "label")


def test_optional_int() -> None:
    assert optional_int({}, "limit") is None
    assert optional_int({}, "limit", 10) == 10
    assert optional_int({"limit": 3}, "limit", min=1) == 3
    assert optional_int({"limit": 3.0}, "limit") == 3
    assert "an integer" in _param_error(optional_int, {"limit": True}, "limit")
    assert "an integer" in _param_error(optional_int, {"limit": 2.5}, "limit")
    assert "an integer" in _param_error(optional_int, {"limit": "3"}, "limit")
    assert "at least 1" in _param_error(optional_int, {"limit": 0}, "limit", min=1)
    assert "at most 5" in _param_error(optional_int, {"limit": 6}, "limit", max=5)


def test_optional_bool() -> None:
    assert optional_bool({}, "dry_run") is False
    assert optional_bool({"dry_run": True}, "dry_run") is True
    assert optional_bool({}, "watch", default=True) is True
    assert "a boolean" in _param_error(optional_bool, {"dry_run": "yes"}, "dry_run")
    assert "a boolean" in _param_error(optional_bool, {"dry_run": 1}, "dry_run")


def test_optional_str_list() -> None:
    assert optional_str_list({}, "paths") is None
    assert optional_str_list({"paths": ["a", "b"]}, "paths") == ["a", "b"]
    assert optional_str_list({"paths": []}, "paths") == []
    assert "array of strings" in _param_error(optional_str_list, {"paths": "a"}, "paths")
    assert "array of strings" in _param_error(optional_str_list, {"paths": ["a", 1]}, "paths")
