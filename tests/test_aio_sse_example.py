"""The asyncio example server (``threadloom.examples.sse_server``) served to real HTTP clients, several at once."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from threadloom import Graph, GraphRuntime, SqliteCheckpointer, Step
from threadloom.examples.sse_server import ECHO, SseServer

CLIENTS = 8


def _messages(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The server-sent events of a streamed response, as {"id", "event", "data"}."""
    message: dict[str, Any] = {}
    for raw in response:
        line = raw.decode().rstrip("\n")
        if not line:
            if message:
                yield message
            message = {}
            continue
        name, _, value = line.partition(": ")
        message[name] = json.loads(value) if name == "data" else value


def _post(port: int, path: str, document: Any) -> tuple[int, list[dict[str, Any]] | Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(document), headers={"content-type": "application/json"})
        response = conn.getresponse()
        if response.getheader("content-type") == "text/event-stream":
            return response.status, list(_messages(response))
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, list(_messages(response))
    finally:
        conn.close()


@pytest.fixture
def served(tmp_path):
    """The example server on a runtime over SQLite, its loop on a thread of its own; yields (port, gate)."""
    store = SqliteCheckpointer.open(str(tmp_path / "sse.db"))
    runtime = GraphRuntime(store, node_id="sse")
    gate = threading.Event()

    async def held(state, ctx):
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
        return Step.end(state)

    graphs = {ECHO.graph_id: ECHO, "held": Graph("held", {"held": held}, entry="held")}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(SseServer(runtime, graphs).start(), loop).result(10)
    try:
        yield server.port, gate, store
    finally:
        gate.set()
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        runtime.close()
        store.close()


def test_concurrent_clients_each_get_their_runs_events_in_order_and_the_stream_ends_with_the_run(served):
    port, _gate, _store = served
    texts = {f"t{i}": " ".join(f"w{i}-{j}" for j in range(4)) for i in range(CLIENTS)}
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = dict(
            zip(
                texts,
                pool.map(
                    lambda item: _post(port, f"/threads/{item[0]}/runs", {"graph": "echo", "input": {"text": item[1]}}),
                    texts.items(),
                ),
                strict=True,
            )
        )
    for thread_id, (status, messages) in answers.items():
        assert status == 200
        assert [m["event"] for m in messages] == [
            "threadloom.run_started",
            *["token"] * 4,
            "threadloom.run_completed",
        ]
        assert [m["data"]["payload"]["text"] for m in messages if m["event"] == "token"] == texts[thread_id].split()
        assert [int(m["id"]) for m in messages] == list(range(1, 7))
        assert len({m["data"]["run_id"] for m in messages}) == 1
    # A reconnecting client resumes after the last event it saw (Last-Event-ID), up to the run's end.
    run_id = answers["t0"][1][0]["data"]["run_id"]
    status, rest = _get(port, f"/threads/t0/events?until_run={run_id}", {"Last-Event-ID": "3"})
    assert status == 200 and [int(m["id"]) for m in rest] == [4, 5, 6]


def test_errors_are_answered_before_any_stream(served):
    port, gate, store = served
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(_post, port, "/threads/busy/runs", {"graph": "held", "input": {}})
        deadline = time.monotonic() + 30
        while store.current_claim("busy") is None:  # until the held run holds the thread
            assert time.monotonic() < deadline
            threading.Event().wait(0.01)
        status, body = _post(port, "/threads/busy/runs", {"graph": "held", "input": {}})
        assert status == 409 and "busy" in body["error"]
        gate.set()
        assert holding.result(30)[0] == 200
    assert _post(port, "/threads/x/runs", {"graph": "nosuch"})[0] == 404
    assert _post(port, "/threads/x/runs", {"graph": "echo", "input": {"bad": float("nan")}})[0] == 400
    assert _post(port, "/threads/" + "x" * 300 + "/runs", {"graph": "echo", "input": {}})[0] == 400  # not an id
    assert _get(port, "/threads/t/events?after=soon")[0] == 400
    assert _post(port, "/nowhere", {})[0] == 404


def test_a_stream_of_a_thread_not_yet_started_answers_200_and_gets_the_run_that_starts_after(served):
    """Found by a new user: an unknown thread answers 200 and an open stream. That is so a client can subscribe
    before it starts the run; every event of that run then reaches it."""
    port, _gate, store = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/threads/early/events")
        response = conn.getresponse()  # the head is written once the subscription exists
        assert response.status == 200 and store.latest("early") is None
        status, run = _post(port, "/threads/early/runs", {"graph": "echo", "input": {"text": "a b"}})
        assert status == 200
        seen = []
        for message in _messages(response):
            seen.append(message)
            if message["event"] == "threadloom.run_completed":
                break
        assert [m["id"] for m in seen] == [m["id"] for m in run] and len(seen) == 4
    finally:
        conn.close()


def test_the_example_run_as_a_program_prints_only_its_own_lines_on_stdout(tmp_path) -> None:
    """Found by a user: run as a program, the example printed the runtime's structlog info lines on stdout."""
    import subprocess
    import sys

    server = subprocess.Popen(
        [sys.executable, "-m", "threadloom.examples.sse_server", f"sqlite:///{tmp_path / 'x.db'}", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("listening on http://127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1])
        status, messages = _post(port, "/threads/t/runs", {"graph": "echo", "input": {"text": "a b"}})
        assert status == 200 and messages, messages
    finally:
        server.terminate()
        out, _err = server.communicate(timeout=30)
    assert out == "", out  # nothing after the "listening" line: the run's log lines went to stderr
