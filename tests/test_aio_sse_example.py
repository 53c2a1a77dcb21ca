"""The asyncio example server (``threadloom.examples.sse_server``) served to real HTTP clients, several at once."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
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


def _program(*args: str, cwd: Any = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "threadloom.examples.sse_server", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
    )  # fmt: skip


def _listening(server: subprocess.Popen[str], url: str) -> int:
    """The port of the program's one line, ``listening on http://127.0.0.1:PORT (store URL)``."""
    assert server.stdout is not None
    first = server.stdout.readline()
    matched = re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+) \(store (.*)\)\n", first)
    assert matched is not None and matched.group(2) == url, first
    return int(matched.group(1))


def test_the_example_run_as_a_program_prints_only_its_own_lines_on_stdout(tmp_path) -> None:
    """Found by a user: run as a program, the example printed the runtime's structlog info lines on stdout."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    server = _program(url, "0")
    try:
        port = _listening(server, url)
        status, messages = _post(port, "/threads/t/runs", {"graph": "echo", "input": {"text": "a b"}})
        assert status == 200 and messages, messages
    finally:
        server.terminate()
        out, _err = server.communicate(timeout=30)
    assert out == "", out  # nothing after the "listening" line: the run's log lines went to stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_program_stops_on_sigterm_or_ctrl_c_with_status_0_and_releases_what_it_held(tmp_path, sig) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    server = _program(url, "0")
    try:
        port = _listening(server, url)
        status, _messages = _post(port, "/threads/t/runs", {"graph": "echo", "input": {"text": "a"}})
        assert status == 200
        server.send_signal(sig)
        _out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0 and "Traceback" not in err, err
    with SqliteCheckpointer.open(str(tmp_path / "x.db")) as store:
        assert store.current_claim("t") is None  # the runtime was closed: no claim left to expire


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sqlite:/bad.db", "8081"], "bad store URL: invalid url: 'sqlite:/bad.db' is not of the form"),
        (["nosuchstore://x", "0"], "bad store URL: invalid url:"),
        (["sqlite:///missing/x.db", "0"], "bad store URL: invalid path: the directory"),
        (["sqlite:///x.db", "http"], "PORT must be a number from 0 to 65535, got 'http'"),
        (["sqlite:///x.db", "65536"], "PORT must be a number from 0 to 65535"),
        (["sqlite:///x.db", "0", "more"], "at most two arguments, got 3"),
    ],
    ids=["sqlite-url", "scheme", "missing-dir", "port-text", "port-range", "three-args"],
)
def test_a_bad_argument_is_one_line_on_stderr_and_exit_status_2(tmp_path, args, says) -> None:
    """Found by a user: a bad store URL printed a traceback from ``open_store`` (exit status 1)."""
    program = _program(*args, cwd=tmp_path)
    out, err = program.communicate(timeout=60)
    assert program.returncode == 2, err
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("sse_server: error: ") and says in err, err
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_store_that_cannot_be_opened_and_a_port_in_use_are_one_line_and_exit_status_1(tmp_path) -> None:
    (tmp_path / "notes.db").write_bytes(b"not a database " * 500)
    program = _program(f"sqlite:///{tmp_path / 'notes.db'}", "0")
    _out, err = program.communicate(timeout=60)
    assert program.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("sse_server: error: cannot open the store:") and "not a SQLite database" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        program = _program(f"sqlite:///{tmp_path / 'x.db'}", str(port))
        _out, err = program.communicate(timeout=60)
    assert program.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"sse_server: error: cannot listen on port {port}:") and "in use" in err, err
