"""The asyncio example server against hostile HTTP: every malformed request gets an answer (never a dropped
connection with a task error logged), and a client that vanishes from a quiet stream frees its subscription."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest

from threadloom import GraphRuntime, SqliteCheckpointer
from threadloom.examples.sse_server import ECHO, SseServer


@pytest.fixture
def served(tmp_path):
    """The example server on its own loop thread; yields (port, server, loop, loop errors)."""
    store = SqliteCheckpointer.open(str(tmp_path / "sse.db"))
    runtime = GraphRuntime(store, node_id="sse-hostile")
    loop = asyncio.new_event_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(SseServer(runtime, {ECHO.graph_id: ECHO}).start(), loop).result(10)
    try:
        yield server.port, server, loop, errors
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        runtime.close()
        store.close()


def _raw(port: int, request: bytes) -> tuple[int, Any]:
    """Sends ``request`` as is; the status and JSON body of the answer (status 0: closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer = b"".join(chunks)
    if not answer:
        return 0, None
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else None


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n".encode() + extra + b"\r\n" + body


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (_post("/threads/t/runs", b'{"graph": []}'), 400),  # an unhashable graph name
        (_post("/threads/t/runs", b'{"graph": {"a": 1}}'), 400),
        (_post("/threads/t/runs", b'{"graph": "echo", "input": {"n": 1, "n": 2}}'), 400),  # a key named twice
        (b"POST /threads/t/runs HTTP/1.1\r\ncontent-length: \xb2\r\n\r\n", 400),  # a digit, not an ASCII one
        (b"POST /threads/t/runs HTTP/1.1\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n", 413),
        (b"GET /threads/t/events HTTP/1.1\r\nlast-event-id: \xb2\r\n\r\n", 400),
        (b"GET /threads/t/events?after=%C2%B2 HTTP/1.1\r\n\r\n", 400),
        (b"GET /threads/t/events?after=" + b"9" * 5000 + b" HTTP/1.1\r\n\r\n", 400),
        (b"GET /threads/t/events?after=99999999999999999999999 HTTP/1.1\r\n\r\n", 400),
        (b"GET /threads/t/events HTTP/1.1\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n", 431),  # huge headers
    ],
)
def test_a_malformed_request_is_answered_and_logs_no_task_error(served, request_bytes, status):
    port, _server, _loop, errors = served
    answered, body = _raw(port, request_bytes)
    assert answered == status, body
    assert isinstance(body["error"], str)
    assert errors == []


def _quiet_streams(server: SseServer, loop: asyncio.AbstractEventLoop) -> int:
    return int(asyncio.run_coroutine_threadsafe(_count(server), loop).result(10))


async def _count(server: SseServer) -> int:
    return len(server._clients)


def test_a_client_that_vanishes_from_a_quiet_stream_frees_it(served):
    port, server, loop, errors = served
    socks = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /threads/quiet/events HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        socks.append(sock)
    assert _quiet_streams(server, loop) == 3
    for sock in socks:
        sock.close()  # gone, and no event ever comes on the thread to find it out by writing
    deadline = time.monotonic() + 10
    while _quiet_streams(server, loop) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _quiet_streams(server, loop) == 0
    assert errors == []


def test_a_client_that_never_finishes_its_request_is_dropped(served, monkeypatch):
    import threadloom.examples.sse_server as example

    monkeypatch.setattr(example, "HEAD_TIMEOUT_S", 0.3)
    port, server, loop, errors = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /threads/t/events HTTP/1.1\r\n")  # and never the blank line
        status = sock.recv(4096)
    assert status.startswith(b"HTTP/1.1 408")
    assert _quiet_streams(server, loop) == 0
    assert errors == []
