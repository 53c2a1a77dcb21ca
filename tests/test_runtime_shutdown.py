"""Worker shutdown with real signals: a process serving the run queue over a real SQLite file is sent SIGINT or
SIGTERM while a node runs. It must exit cleanly (no traceback, status 0), commit or drop the node in flight, and
hand the thread's claim and the entry's lease back at once, so another worker takes the entry up long before the
lease would have expired. A second signal abandons the node in flight."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from threadloom import CheckpointStatus, ClaimRequest, Commit, EntryStatus, EventDraft, SqliteCheckpointer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

LEASE_TTL = timedelta(seconds=120)
"""The worker's lease: far longer than any bound below, so an entry leased again was handed back, not expired."""
PROMPT_S = 20.0
"""A generous bound on how long a clean stop may take (the node in flight sleeps NODE_S of it)."""
NODE_S = 2.0

WORKER = textwrap.dedent(
    """
    import sys, time
    from datetime import UTC, datetime, timedelta
    from threadloom import ClaimPolicy, Graph, GraphRuntime, ServePolicy, SqliteCheckpointer, Step

    def slow(state, ctx):
        print("NODE-STARTED", flush=True)
        time.sleep(float(sys.argv[2]))
        return Step.to("after", {**state, "slow": True})

    def after(state, ctx):
        return Step.end({**state, "after": True})

    graph = Graph("slow", {"slow": slow, "after": after}, entry="slow")
    store = SqliteCheckpointer.open(sys.argv[1])
    policy = ServePolicy(lease_ttl=timedelta(seconds=120), renew_every=timedelta(seconds=1),
                         poll_interval=timedelta(milliseconds=50))
    claims = ClaimPolicy(ttl=timedelta(seconds=120), renew_every=timedelta(seconds=1))
    with GraphRuntime(store, node_id="w1", claim_policy=claims) as runtime:
        server = runtime.serve([graph], policy=policy)
    store.close()
    print("STOPPED", server.handed_back, flush=True)
    """
)


class Worker:
    """A worker process serving the queue of ``db``; its stdout lines arrive on ``lines``."""

    def __init__(self, db: str, tmp_path, node_s: float, script: str = WORKER) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, db, str(node_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: [self.lines.put(line) for line in stdout], daemon=True).start()

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.process.poll() is not None and self.lines.empty():
                raise AssertionError(f"no {text!r} from the worker; it printed {self.seen}")
            try:
                self.seen.append(self.lines.get(timeout=min(remaining, 0.5)))
            except queue.Empty:
                continue

    def finish(self, timeout: float) -> tuple[int, str]:
        status = self.process.wait(timeout=timeout)
        assert self.process.stderr is not None
        return status, self.process.stderr.read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "serve.db")
    with SqliteCheckpointer.open(path) as store:
        store.queue.enqueue("t1", graph_id="slow", input={"q": 1}, tenant_id="acme")
    return path


def _entry_and_claim_are_free(db: str) -> None:
    """Another worker leases the entry at once, and the thread's claim is free (not ThreadBusy)."""
    with SqliteCheckpointer.open(db) as store:
        lease = store.queue.lease("w2", LEASE_TTL, graph_ids=["slow"])
        assert lease is not None, "the entry is still leased by the stopped worker"
        assert lease.entry.thread_id == "t1" and lease.attempt == 2 and lease.taken_over_from is None
        claim = store.claim("t1", ClaimRequest(holder="w2-run", ttl=timedelta(seconds=5), tenant_id="acme"))
        assert claim.taken_over_from is None  # released, not expired


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_finishes_the_node_in_flight_and_hands_claim_and_lease_back(db, tmp_path, signum):
    worker = Worker(db, tmp_path, NODE_S)
    try:
        worker.wait_for("NODE-STARTED")
        sent = time.monotonic()
        os.kill(worker.process.pid, signum)
        status, stderr = worker.finish(PROMPT_S)
        worker.wait_for("STOPPED")
        assert time.monotonic() - sent < PROMPT_S
    finally:
        worker.kill()
    assert status == 0, stderr
    assert "Traceback" not in stderr
    assert any(line.startswith("STOPPED 1") for line in worker.seen)  # serve returned, the entry handed back
    with SqliteCheckpointer.open(db) as store:
        latest = store.latest("t1").checkpoint
        # The node in flight finished and its step was committed; the run stopped there, incomplete.
        assert latest.status is CheckpointStatus.RUNNING and latest.state == {"q": 1, "slow": True}
    _entry_and_claim_are_free(db)


def test_a_second_sigint_abandons_the_node_in_flight_and_exits_130(db, tmp_path):
    worker = Worker(db, tmp_path, 600.0)
    try:
        worker.wait_for("NODE-STARTED")
        os.kill(worker.process.pid, signal.SIGINT)
        worker.wait_for("queue.serve_interrupted")
        os.kill(worker.process.pid, signal.SIGINT)
        status, stderr = worker.finish(PROMPT_S)
    finally:
        worker.kill()
    assert status in (130, -signal.SIGINT), stderr  # Python ends an uncaught KeyboardInterrupt by SIGINT
    worker.wait_for("queue.serve_abandoned")
    assert not any("STOPPED" in line for line in worker.seen)  # serve raised KeyboardInterrupt
    with SqliteCheckpointer.open(db) as store:
        latest = store.latest("t1").checkpoint
        assert latest.status is CheckpointStatus.RUNNING and latest.state == {"q": 1}  # the node's step dropped
    _entry_and_claim_are_free(db)


TWO_WORKERS = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    from threadloom import Graph, GraphRuntime, ServePolicy, SqliteCheckpointer, Step

    def node(name, then):
        def run(state, ctx):
            sys.stdout.write(f"NODE-STARTED {ctx.thread_id} {name}\\n")  # one write: two nodes print at once
            sys.stdout.flush()
            time.sleep(float(sys.argv[2]))
            state = {**state, name: True}
            return Step.to(then, state) if then else Step.end(state)
        return run

    graph = Graph("slow", {"a": node("a", "b"), "b": node("b", "c"), "c": node("c", None)}, entry="a")
    store = SqliteCheckpointer.open(sys.argv[1])
    policy = ServePolicy(lease_ttl=timedelta(seconds=120), renew_every=timedelta(seconds=1),
                         poll_interval=timedelta(milliseconds=50), max_attempts=1)
    with GraphRuntime(store) as runtime:
        server = runtime.serve({"slow": graph}, concurrency=2, policy=policy)
    store.close()
    print("STOPPED", server.handed_back, server.failed, flush=True)
    """
)
"""A worker of two concurrent runs of a three-node graph whose every node sleeps, allowed one attempt per entry."""


def _finished(db: str, entries: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        with SqliteCheckpointer.open(db) as store:
            found = store.queue.entries(limit=10)
        if all(not entry.open for entry in found) and len(found) == entries or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_graceful_stop_spends_no_attempt_so_the_next_worker_finishes_every_entry(tmp_path):
    db = str(tmp_path / "attempts.db")
    with SqliteCheckpointer.open(db) as store:
        for thread_id in ("t1", "t2"):
            store.queue.enqueue(thread_id, graph_id="slow", input={"q": thread_id})
    first = Worker(db, tmp_path, 3.0, TWO_WORKERS)
    try:
        first.wait_for("NODE-STARTED t1 a")
        first.wait_for("NODE-STARTED t2 a")
        os.kill(first.process.pid, signal.SIGINT)
        status, stderr = first.finish(PROMPT_S)
        first.wait_for("STOPPED")
    finally:
        first.kill()
    assert status == 0, stderr
    assert any(line.startswith("STOPPED 2 0") for line in first.seen), first.seen  # both handed back, none failed
    logged = [line for line in first.seen + stderr.splitlines() if "[" in line]
    assert not [line for line in logged if "[warning" in line or "[error" in line], logged  # a stop is no failure
    assert sum("run.stopped" in line for line in logged) == 2
    assert sum("queue.handed_back" in line and "refund=True" in line for line in logged) == 2
    second = Worker(db, tmp_path, 0.5, TWO_WORKERS)
    try:
        entries = _finished(db, 2, 60.0)
        os.kill(second.process.pid, signal.SIGINT)
        second.finish(PROMPT_S)
    finally:
        second.kill()
    assert [(entry.status, entry.error) for entry in entries] == [(EntryStatus.COMPLETED, None)] * 2
    assert [(entry.attempts, entry.counted_attempts) for entry in entries] == [(2, 1)] * 2
    with SqliteCheckpointer.open(db) as store:
        for thread_id in ("t1", "t2"):
            latest = store.latest(thread_id).checkpoint
            assert latest.status is CheckpointStatus.COMPLETED
            assert latest.state == {"q": thread_id, "a": True, "b": True, "c": True}


def test_events_follow_ends_cleanly_on_sigterm(tmp_path):
    path = str(tmp_path / "follow.db")
    with SqliteCheckpointer.open(path) as store:
        claim = store.claim("t1", ClaimRequest(holder="run-1", ttl=timedelta(minutes=5)))
        hello = EventDraft(run_id="run-1", type="hello", timestamp=datetime.now(UTC))
        store.commit("t1", Commit(token=claim.token, events=[hello]))
    follower = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", f"sqlite:///{path}", "--json", "events", "t1", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert follower.stdout is not None
        assert '"hello"' in follower.stdout.readline()  # printed the first event: now it waits for more
        time.sleep(0.2)
        follower.send_signal(signal.SIGTERM)
        status = follower.wait(timeout=PROMPT_S)
        assert follower.stderr is not None
        stderr = follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert status == 0, stderr  # today: 143, killed by the signal
    assert "Traceback" not in stderr
