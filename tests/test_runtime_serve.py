"""``GraphRuntime.serve``: the run-queue worker loop (DESIGN §4) over every store that has a run queue.

Entries run to their end; a crashed attempt's admitted input is recovered, never admitted twice; an attempt that
finds its input admitted and the thread past it only finishes the entry; a busy thread hands the entry back;
failures finish it FAILED.

Memory and SQLite stores take a ManualClock in the tests that let leases and claims expire; PostgreSQL's database
decides time, so there those tests run with short lease and claim ttls (``Timing.span``) and wait in real time.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import attrs
import pytest
from structlog.testing import capture_logs

from threadloom import (
    CancelledError,
    CheckpointStatus,
    ClaimPolicy,
    EntryStatus,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    ManualClock,
    RunQueue,
    ServePolicy,
    Step,
    ValidationError,
)
from threadloom.testing.harness import START

WAIT = timedelta(seconds=10)
FAST = ServePolicy(poll_interval=timedelta(milliseconds=20), busy_delay=timedelta(milliseconds=50))


def _memory(request, tmp_path, clock):
    return [InMemoryCheckpointer(clock)] * 2


def _sqlite(request, tmp_path, clock):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = str(tmp_path / "serve.db")
    return [SqliteCheckpointer.open(path, clock=clock) for _ in range(2)]


def _postgres(request, tmp_path, clock):
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()  # skips loudly without a server (fails under CI=true); the database decides time
    request.addfinalizer(harness.cleanup)
    return [harness.open(), harness.sibling()]


BACKENDS = dict(
    params=[_memory, _sqlite, pytest.param(_postgres, marks=pytest.mark.postgres)], ids=["memory", "sqlite", "postgres"]
)


def _open(request, tmp_path, clock):
    stores = request.param(request, tmp_path, clock)
    if not isinstance(getattr(stores[0], "queue", None), RunQueue):
        for store in stores:
            store.close()
        pytest.skip(f"{type(stores[0]).__name__} has no run queue yet (store.queue)")
    return stores


@attrs.define
class Timing:
    """The stores' clock as the expiry tests see it: a ManualClock, or the database's (``clock`` None).

    Attributes:
        span: the ttl of the leases and claims the tests let expire.
        past: how far :meth:`advance` moves to expire them.
    """

    clock: ManualClock | None
    span: timedelta = timedelta(seconds=30)
    past: timedelta = timedelta(seconds=31)

    def advance(self, delta: timedelta) -> None:
        """Moves the stores' clock forward by ``delta`` (a real wait for a database clock)."""
        if self.clock is None:
            time.sleep(delta.total_seconds())
        else:
            self.clock.advance(delta)

    @property
    def claim_policy(self) -> ClaimPolicy | None:
        """The runtimes' claim policy: the default, or claims of ``span`` on a database clock."""
        return None if self.clock is not None else ClaimPolicy(ttl=self.span, renew_every=self.span / 4)

    def serve(self, policy: ServePolicy) -> ServePolicy:
        """``policy`` with leases of ``span`` on a database clock."""
        if self.clock is not None:
            return policy
        return attrs.evolve(policy, lease_ttl=self.span, renew_every=self.span / 4)


@pytest.fixture(**BACKENDS)
def stores(request, tmp_path):
    """Two stores over one storage, on the system clock."""
    stores = _open(request, tmp_path, None)
    yield stores
    for store in stores:
        store.close()


@pytest.fixture(**BACKENDS)
def manual(request, tmp_path):
    """Two stores over one storage and their Timing (a ManualClock, or short real ttls on PostgreSQL)."""
    postgres = request.param is _postgres
    clock = None if postgres else ManualClock(START)
    stores = _open(request, tmp_path, clock)
    timing = Timing(clock) if not postgres else Timing(None, timedelta(seconds=1), timedelta(milliseconds=1300))
    yield stores, timing
    for store in stores:
        store.close()


@pytest.fixture
def runtimes():
    made: list[GraphRuntime] = []

    def make(store, node_id: str, **options) -> GraphRuntime:
        runtime = GraphRuntime(store, node_id=node_id, **options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


class Steps:
    """A graph a -> b -> c that records executions of a and b; node b of runtime ``blocked`` waits for ``gate``."""

    def __init__(self, blocked: str = "nobody") -> None:
        self.blocked = blocked
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def graph(self, graph_id: str = "job") -> Graph:
        def a(state, ctx):
            with self.lock:
                self.calls.append(("a", ctx.thread_id))
            ctx.effect("once", lambda: self.calls.append(("effect", ctx.thread_id)) or True)
            return Step.to("b", {**state, "seen": state.get("seen", []) + [state.get("input")]})

        def b(state, ctx):
            with self.lock:
                self.calls.append(("b", ctx.thread_id))
            if ctx.run_id.startswith(f"{self.blocked}:"):
                self.entered.set()
                assert self.gate.wait(10), "the test never released node b"
            return Step.to("c", state)

        def c(state, ctx):
            return Step.end(state)

        return Graph(graph_id, {"a": a, "b": b, "c": c}, entry="a")

    def count(self, node: str, thread_id: str | None = None) -> int:
        with self.lock:
            return sum(1 for n, t in self.calls if n == node and (thread_id is None or t == thread_id))


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        time.sleep(0.01)


def _finished(queue, entry_id: int) -> bool:
    return not queue.entry(entry_id).open


def test_serve_runs_every_entry_once_and_one_thread_in_enqueue_order(stores, runtimes):
    steps = Steps()
    runtime = runtimes(stores[0], "W")
    queue = runtime.queue
    entries = [
        runtime.enqueue("t1", "job", {"input": "first"}, tenant_id="acme"),
        runtime.enqueue("t2", "job", {"input": "x"}, tenant_id="acme"),
        runtime.enqueue("t1", "job", {"input": "second"}, tenant_id="acme"),
        runtime.enqueue("t3", "job", {"input": "y"}),
    ]
    server = runtime.serve([steps.graph()], concurrency=2, policy=FAST, block=False)
    _wait_for(lambda: all(_finished(queue, e.entry_id) for e in entries))
    for entry in entries:
        done = queue.entry(entry.entry_id)
        assert done.status is EntryStatus.COMPLETED and len(done.run_ids) == 1 and done.attempts == 1
    latest = stores[1].latest("t1").checkpoint
    assert latest.status is CheckpointStatus.COMPLETED and latest.tenant_id == "acme"
    assert latest.state["seen"] == ["first", "second"]
    assert stores[1].lookup_run("t1", queue.entry(entries[0].entry_id).run_ids) is not None
    assert steps.count("a") == 4 and steps.count("effect") == 4  # one effect per turn: t1's second entry is a new turn
    assert server.completed == 4 and server.failed == 0
    server.stop()
    server.join(WAIT)


def test_a_crashed_attempt_is_recovered_by_the_next_without_admitting_its_input_twice(manual, runtimes):
    (store_a, store_b), clock = manual
    steps = Steps(blocked="A")
    # Its clock never moves: no renewals at all.
    crashed = runtimes(store_a, "A", clock=ManualClock(START), claim_policy=clock.claim_policy)
    entry = crashed.enqueue("t1", "job", {"input": "once"})
    crashed.serve([steps.graph()], policy=clock.serve(FAST), block=False)
    assert steps.entered.wait(10)  # admitted, node a committed, stuck in node b
    clock.advance(clock.past)  # the lease and the claim both expire
    rescuer = runtimes(store_b, "B", claim_policy=clock.claim_policy)
    with capture_logs() as logs:
        server = rescuer.serve([steps.graph()], policy=clock.serve(FAST), block=False)
        _wait_for(lambda: _finished(rescuer.queue, entry.entry_id))
        steps.gate.set()  # the crashed attempt wakes: its commit is fenced, and it cannot finish the entry
        _wait_for(lambda: any(e["event"] == "run.failed" and e["error_type"] == "StaleClaim" for e in logs))
    done = rescuer.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.COMPLETED and done.attempts == 2
    assert [run.split(":")[0] for run in done.run_ids] == ["A", "B"]
    latest = store_b.latest("t1").checkpoint
    assert latest.status is CheckpointStatus.COMPLETED and latest.state["seen"] == ["once"]
    assert steps.count("a") == 1 and steps.count("effect") == 1 and steps.count("b") == 2
    leased = next(e for e in logs if e["event"] == "queue.leased")
    assert leased["taken_over_from"] == "A#0" and leased["attempt"] == 2
    assert any(e["event"] == "queue.recovering" for e in logs)
    assert any(e["event"] == "claim.taken_over" for e in logs)
    assert rescuer.queue.entry(entry.entry_id).status is EntryStatus.COMPLETED
    server.stop()


def test_an_attempt_that_finds_its_input_admitted_and_done_only_finishes_the_entry(manual, runtimes):
    (store, _), clock = manual
    steps = Steps()
    runtime = runtimes(store, "W")
    queue = runtime.queue
    entry = runtime.enqueue("t1", "job", {"input": "x"})
    lease = queue.lease("ghost", clock.span)
    queue.record_run(entry.entry_id, lease.attempt, "ghost:run-1")
    runtime.start("t1", steps.graph(), {"input": "x"}, run_id="ghost:run-1").wait(WAIT)  # then "dies"
    history = len(store.history("t1", limit=100))
    clock.advance(clock.past)
    runtime.serve([steps.graph()], policy=FAST, block=False)
    _wait_for(lambda: _finished(queue, entry.entry_id))
    assert queue.entry(entry.entry_id).status is EntryStatus.COMPLETED
    assert steps.count("a") == 1 and len(store.history("t1", limit=100)) == history


def test_a_busy_thread_hands_the_entry_back_until_the_thread_is_free(stores, runtimes):
    steps = Steps(blocked="D")
    direct = runtimes(stores[0], "D")
    worker = runtimes(stores[1], "W")
    running = direct.start("t1", steps.graph(), {"input": "direct"})
    assert steps.entered.wait(10)
    entry = worker.enqueue("t1", "job", {"input": "queued"})
    with capture_logs() as logs:
        worker.serve([steps.graph()], policy=FAST, block=False)
        _wait_for(lambda: any(e["event"] == "queue.handed_back" for e in logs))
        steps.gate.set()
        running.wait(WAIT)
        _wait_for(lambda: _finished(worker.queue, entry.entry_id))
    assert worker.queue.entry(entry.entry_id).status is EntryStatus.COMPLETED
    assert stores[0].latest("t1").checkpoint.state["seen"] == ["direct", "queued"]


def test_an_incomplete_run_left_by_another_caller_is_recovered_before_the_input(stores, runtimes):
    steps = Steps(blocked="D")
    direct = runtimes(stores[0], "D")
    handle = direct.start("t1", steps.graph(), {"input": "direct"})
    assert steps.entered.wait(10)
    handle.cancel()
    steps.gate.set()
    with pytest.raises(CancelledError):
        handle.wait(WAIT)
    worker = runtimes(stores[1], "W")
    entry = worker.enqueue("t1", "job", {"input": "queued"})
    worker.serve([steps.graph()], policy=FAST, block=False)
    _wait_for(lambda: _finished(worker.queue, entry.entry_id))
    assert worker.queue.entry(entry.entry_id).status is EntryStatus.COMPLETED
    latest = stores[1].latest("t1").checkpoint
    assert latest.status is CheckpointStatus.COMPLETED and latest.state["seen"] == ["direct", "queued"]


def test_a_failing_run_finishes_its_entry_failed(stores, runtimes):
    runtime = runtimes(stores[0], "W")

    def boom(state, ctx):
        raise ValueError("no good")

    entry = runtime.enqueue("t1", "bad", {})
    runtime.serve({"bad": Graph("bad", {"boom": boom}, entry="boom")}, policy=FAST, block=False)
    _wait_for(lambda: _finished(runtime.queue, entry.entry_id))
    done = runtime.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.FAILED and "no good" in done.error


def test_an_input_the_graphs_merge_refuses_finishes_its_entry_failed_at_once(stores, runtimes):
    """A merge that raises refuses the input (ValidationError): retrying cannot help, so the first attempt
    finishes the entry FAILED and nothing is written to the thread (found by the simulation: the entry was handed
    back until max_attempts)."""
    runtime = runtimes(stores[0], "W")

    def picky(state, update):
        raise ValueError("no such customer")

    graph = Graph("picky", {"a": lambda state, ctx: Step.end(state)}, entry="a", merge=picky)
    entry = runtime.enqueue("t1", "picky", {"customer": 7})
    runtime.serve([graph], policy=FAST, block=False)
    _wait_for(lambda: _finished(runtime.queue, entry.entry_id))
    done = runtime.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.FAILED and done.attempts == 1
    assert "merge refused it: ValueError: no such customer" in done.error
    assert stores[0].latest("t1") is None and stores[0].events_after("t1", 0, 10) == []
    with pytest.raises(ValidationError, match="input.*merge refused it"):
        runtime.start("t1", graph, {"customer": 8})
    assert stores[0].latest("t1") is None


def test_an_entry_leased_too_often_is_given_up(manual, runtimes):
    (store, _), clock = manual
    runtime = runtimes(store, "W")
    entry = runtime.enqueue("t1", "job", {})
    for _ in range(2):
        assert runtime.queue.lease("crashy", clock.span) is not None
        clock.advance(clock.past)
    runtime.serve(
        [Steps().graph()], policy=ServePolicy(max_attempts=2, poll_interval=timedelta(milliseconds=20)), block=False
    )
    _wait_for(lambda: _finished(runtime.queue, entry.entry_id))
    done = runtime.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.FAILED and "gave up after 2 attempts" in done.error
    assert store.latest("t1") is None


def test_a_queued_input_resumes_a_suspended_thread(stores, runtimes):
    runtime = runtimes(stores[0], "W")

    def ask(state, ctx):
        return Step.suspend("answer", state)

    def answer(state, ctx):
        return Step.end({**state, "answered": state["reply"]})

    graph = Graph("chat", {"ask": ask, "answer": answer}, entry="ask")
    first = runtime.enqueue("t1", "chat", {"q": 1})
    second = runtime.enqueue("t1", "chat", {"reply": "yes"})
    runtime.serve([graph], policy=FAST, block=False)
    _wait_for(lambda: _finished(runtime.queue, second.entry_id))
    assert runtime.queue.entry(first.entry_id).status is EntryStatus.COMPLETED
    assert stores[0].latest("t1").checkpoint.state == {"q": 1, "reply": "yes", "answered": "yes"}


def test_a_blocking_serve_returns_when_stopped(stores, runtimes):
    runtime = runtimes(stores[0], "W")
    done = threading.Event()
    servers = []

    def serve() -> None:
        servers.append(runtime.serve([Steps().graph()], policy=FAST, concurrency=2))
        done.set()

    thread = threading.Thread(target=serve)
    thread.start()
    _wait_for(lambda: runtime._servers)
    runtime._servers[0].stop()
    assert done.wait(10)
    thread.join(10)
    assert servers[0].stopped


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_sigterm_sent_as_serve_announces_itself_stops_it_cleanly(stores, runtimes):
    """Found by a flaky CI run: ``threadloom serve`` printed its "serving" line before the runtime handled
    signals, and a SIGTERM sent on reading it was sometimes lost, so the worker never stopped. ``on_started``
    runs once the handlers are in place: a signal sent from it stops every worker, and ``serve`` returns with the
    caller's handlers put back."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled on the main thread only")
    runtime = runtimes(stores[0], "W")
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def announce(server) -> None:
        seen.append((server.stopped, len(server._tasks), signal.getsignal(signal.SIGTERM) is not before))
        os.kill(os.getpid(), signal.SIGTERM)

    server = runtime.serve([Steps().graph()], policy=FAST, concurrency=2, on_started=announce)
    assert seen == [(False, 2, True)]  # called once, workers running, our handler not the one in place
    assert server.stopped and not server._alive()
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_error_in_on_started_stops_the_workers_and_propagates(stores, runtimes):
    runtime = runtimes(stores[0], "W")
    servers = []

    def fail(server) -> None:
        servers.append(server)
        raise RuntimeError("announcing failed")

    for block in (True, False):
        with pytest.raises(RuntimeError, match="announcing failed"):
            runtime.serve([Steps().graph()], policy=FAST, concurrency=2, block=block, on_started=fail)
        assert servers[-1].stopped and not servers[-1]._alive()
    thread_errors: list[BaseException] = []

    def off_main() -> None:  # block on another thread: no signals, one worker on the calling thread
        try:
            runtime.serve([Steps().graph()], policy=FAST, concurrency=2, on_started=fail)
        except RuntimeError as error:
            thread_errors.append(error)

    worker = threading.Thread(target=off_main)
    worker.start()
    worker.join(10)
    assert [str(e) for e in thread_errors] == ["announcing failed"]
    assert servers[-1].stopped and not servers[-1]._alive()


def test_serve_validates_its_graphs(stores, runtimes):
    runtime = runtimes(stores[0], "W")
    graph = Steps().graph()
    with pytest.raises(ValidationError):
        runtime.serve([], block=False)
    with pytest.raises(ValidationError):
        runtime.serve({"other": graph}, block=False)
    with pytest.raises(ValidationError):
        runtime.serve([graph], concurrency=0, block=False)
    runtime_without_queue = runtimes(stores[0], "X", queue=None)
    assert runtime_without_queue.queue is stores[0].queue


def test_a_fenced_attempt_hands_its_entry_back_and_the_next_attempt_finds_it_done(manual, runtimes):
    (store_a, store_b), clock = manual
    steps = Steps(blocked="A")
    crashed = runtimes(store_a, "A", clock=ManualClock(START), claim_policy=clock.claim_policy)
    entry = crashed.enqueue("t1", "job", {"input": "x"})
    crashed.serve([steps.graph()], policy=clock.serve(FAST), block=False)
    assert steps.entered.wait(10)
    clock.advance(clock.past)
    # Another runtime recovers the thread directly (not through the queue) and completes it.
    other = runtimes(store_b, "B", claim_policy=clock.claim_policy)
    other.recover("t1", steps.graph()).wait(WAIT)
    with capture_logs() as logs:
        steps.gate.set()
        _wait_for(lambda: _finished(crashed.queue, entry.entry_id))
        # The worker logs queue.finished after the store call that finished the entry returned: wait for the line.
        _wait_for(lambda: any(e["event"] == "queue.finished" for e in list(logs)))
    done = crashed.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.COMPLETED and done.attempts == 2
    handed = [e for e in logs if e["event"] == "queue.handed_back"]
    assert handed and handed[0]["attempt"] == 1 and "StaleClaim" in handed[0]["error"]
    finished = [e for e in logs if e["event"] == "queue.finished"]
    assert [e["attempt"] for e in finished] == [2]
    assert steps.count("a") == 1 and steps.count("b") == 2  # the second attempt ran nothing
