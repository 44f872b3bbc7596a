"""The server against hostile HTTP, over raw sockets: every refusal is a 4xx (or a 503 for
a full server) with an OpenAI error object, logged as one line without a traceback, and
the connection limits (idle connections, slow bodies, bytes in flight, open connections)
hold.  One server with small limits serves the module."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from serve_helpers import MODEL_NAME, RunningServer, start_server

from infbench.serve import limits as limits_module
from infbench.serve.limits import ServerLimits

LIMITS = ServerLimits(max_body_bytes=1 << 20, max_body_bytes_in_flight=2 << 20,
                      max_connections=12, header_timeout_s=0.5, keepalive_timeout_s=1.0,
                      body_timeout_s=0.5)


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    server = start_server(limits=LIMITS)
    yield server
    server.stop()


def port_of(srv: RunningServer) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def connect(srv: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port_of(srv)), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, json.loads(body) if body else None


def exchange(srv: RunningServer, data: bytes) -> tuple[int, dict[str, str], Any]:
    with connect(srv) as sock:
        sock.sendall(data)
        return parse(read_all(sock))


def post(path: str, body: bytes, content_type: str | None = "application/json",
         host: str = "127.0.0.1", extra: str = "") -> bytes:
    ctype = f"Content-Type: {content_type}\r\n" if content_type is not None else ""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{ctype}Content-Length: {len(body)}\r\n"
            f"Connection: close\r\n{extra}\r\n").encode() + body


def assert_error(status: int, body: Any, expected: int, code: str | None = None,
                 param: str | None = None) -> None:
    assert status == expected, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and "trouble" not in body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    assert body["error"]["param"] == param, body


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog
    records = [r for r in caplog.records
               if r.name.startswith(("aiohttp", "infbench.serve", "asyncio"))]
    assert all(r.exc_info is None and "Traceback" not in r.getMessage() for r in records), \
        [r.getMessage() for r in records]


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        b"X-H%d: 1\r\n" % i for i in range(300)) + b"\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: -5\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: localhost\r\nBad Header: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),  # a TLS hello
]


@pytest.mark.parametrize("data", MALFORMED, ids=["request-line", "huge-header",
                                                 "many-headers", "huge-uri", "negative-length",
                                                 "bad-chunk", "space-in-name", "tls"])
def test_malformed_http_is_a_400_json_without_traceback(
        srv: RunningServer, data: bytes, logs: pytest.LogCaptureFixture) -> None:
    status, headers, body = exchange(srv, data)
    assert 400 <= status < 500
    assert_error(status, body, status)
    assert headers["server"] == "infbench" and "Python" not in headers["server"]


@pytest.mark.parametrize(("path", "raw", "code", "param"), [
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, "too_deep", None),
    ("/v1/completions", b'{"prompt": [1], "max_tokens": ' + b"1" * 5000 + b"}",
     "number_too_long", None),
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "invalid_string", "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "invalid_string", "messages[0].content"),
    ("/v1/completions", b'{"prompt": [1], "min_p": 0.05}', "unsupported_parameter", "min_p"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"response_format": {"type": "json_object"}}',
     "unsupported_parameter", "response_format"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], '
                             b'"tool_choice": "auto"}', "unsupported_parameter", "tool_choice"),
])
def test_hostile_json_bodies_are_400s(srv: RunningServer, path: str, raw: bytes,
                                      code: str, param: str | None,
                                      logs: pytest.LogCaptureFixture) -> None:
    status, _, body = exchange(srv, post(path, raw))
    assert_error(status, body, 400, code, param)


@pytest.mark.parametrize(("content_type", "expected"), [
    ("text/plain", 415), (None, 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), ("application/json; charset=latin-1", 415),
    ("application/json; charset=utf-8", 200), ("Application/JSON", 200),
])
def test_only_json_bodies_are_accepted(srv: RunningServer, content_type: str | None,
                                       expected: int) -> None:
    body = json.dumps({"prompt": [1, 2], "max_tokens": 1}).encode()
    status, _, answer = exchange(srv, post("/v1/completions", body, content_type))
    if expected == 200:
        assert status == 200 and answer["usage"]["completion_tokens"] == 1
    else:
        assert_error(status, answer, expected, "unsupported_media_type")


@pytest.mark.parametrize(("host", "allowed"), [
    ("127.0.0.1", True), ("localhost:8000", True), ("LOCALHOST.", True), ("[::1]:80", True),
    ("127.0.0.2", True), ("evil.example", False), ("evil.example:8000", False),
    ("10.0.0.1", False), ("localhost.evil.example", False),
])
def test_host_header_must_name_this_server(srv: RunningServer, host: str,
                                           allowed: bool) -> None:
    data = f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    status, _, body = exchange(srv, data)
    if allowed:
        assert status == 200 and body["data"][0]["id"] == MODEL_NAME
    else:
        assert_error(status, body, 400, "host_not_allowed")


def test_unknown_routes_and_methods_are_json(srv: RunningServer,
                                             logs: pytest.LogCaptureFixture) -> None:
    get = b"GET /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    status, headers, body = exchange(srv, get)
    assert_error(status, body, 405, "method_not_allowed")
    assert headers["server"] == "infbench"
    status, _, body = exchange(srv, get.replace(b"/v1/completions", b"/v2/nothing"))
    assert_error(status, body, 404, "not_found")


def test_oversize_bodies_are_413_before_they_are_read(srv: RunningServer) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            f"application/json\r\nContent-Length: {(1 << 20) + 1}\r\n\r\n").encode()
    status, headers, body = exchange(srv, head)  # the body is never sent
    assert_error(status, body, 413, "request_too_large")
    assert headers.get("connection", "").lower() == "close"
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
               b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"%x\r\n" % (256 << 10) + b" " * (256 << 10) + b"\r\n"
    with connect(srv) as sock:
        sock.sendall(chunked)
        try:
            for _ in range(6):  # 1.5 MiB in chunks: refused once past 1 MiB
                sock.sendall(piece)
        except OSError:
            pass  # the server closed it after answering
        status, _, body = parse(read_all(sock))
    assert_error(status, body, 413, "request_too_large")


def test_idle_and_slow_connections_are_closed(srv: RunningServer,
                                              logs: pytest.LogCaptureFixture) -> None:
    t0 = time.monotonic()
    with connect(srv) as idle, connect(srv) as partial:
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # never finished
        assert idle.recv(10) == b"" and partial.recv(10) == b""
    assert time.monotonic() - t0 < 5
    with connect(srv) as slow:  # the headers and part of the body, then nothing: 408
        slow.sendall(post("/v1/completions", b'{"prompt": [1], "max_tokens": 1}')[:-10])
        status, _, body = parse(read_all(slow))
    assert_error(status, body, 408, "body_timeout")


def test_bodies_in_flight_are_capped(srv: RunningServer) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            f"application/json\r\nContent-Length: {1 << 20}\r\nConnection: close"
            "\r\n\r\n").encode()
    held = [connect(srv), connect(srv)]
    try:
        for sock in held:
            sock.sendall(head)  # 1 MiB each, announced and not sent: 2 MiB reserved
        deadline = time.monotonic() + 5
        while srv.server.budget.in_use < (2 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)
        status, _, body = exchange(srv, head + b" " * 16)
        assert_error(status, body, 429, "too_many_request_bytes")
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while srv.server.budget.in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.server.budget.in_use == 0


def test_open_connections_are_capped() -> None:
    # Its own server, whose idle connections are not closed during the test.
    srv = start_server(limits=dataclasses.replace(LIMITS, header_timeout_s=60,
                                                  keepalive_timeout_s=60))
    health = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    socks: list[socket.socket] = []
    try:
        socks = [connect(srv) for _ in range(LIMITS.max_connections)]
        deadline = time.monotonic() + 5
        while (answer := exchange(srv, health))[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the server has accepted all of them
        status, headers, body = answer
        assert_error(status, body, 503, "too_many_connections")
        assert headers["retry-after"] == "1"
        socks.pop().close()
        deadline = time.monotonic() + 5  # a slot comes back once one is closed
        while (status := exchange(srv, health)[0]) == 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert status == 200
    finally:
        for sock in socks:
            sock.close()
        srv.stop()


def test_large_bodies_are_parsed_off_the_event_loop(srv: RunningServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real = limits_module.parse_json

    def spy(data: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(limits_module, "parse_json", spy)
    small = json.dumps({"prompt": [1], "max_tokens": 1}).encode()
    large = json.dumps({"prompt": [1], "max_tokens": 1, "user": "u" * (300 << 10)}).encode()
    for body in (small, large):
        status, _, _ = exchange(srv, post("/v1/completions", body))
        assert status == 200
    loop_thread = threads[0]
    assert threads[1] != loop_thread  # the large one ran in an executor thread
