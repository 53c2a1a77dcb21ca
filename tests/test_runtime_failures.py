"""The runtime acts on the kind of store failure: it retries what may pass and fails loudly on the rest.

A damaged store (``StoreCorrupt``: here a row of a real SQLite file overwritten with sqlite3) and a store closed
under a running runtime (``StoreClosed``) end runs at once, finish or stop queue work instead of retrying it,
end subscriptions and stop the periodic sweep, each with a line at error level. An unavailable store
(``StoreUnavailable``: a real in-memory store whose chosen calls fail for a while, before touching anything) is
retried and the work completes.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    CheckpointStatus,
    ClaimPolicy,
    EntryStatus,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    OutcomeUnknown,
    ProcessingError,
    RunFailed,
    ServePolicy,
    StaleClaim,
    Step,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
    SweepPolicy,
    ThreadBusy,
    ValidationError,
    WatchPolicy,
)
from threadloom.actors._failures import can_repeat, error_kind, is_fatal, is_transient, retry_pause
from threadloom.actors.policies import SweepSchedule
from threadloom.domain.values import BusyHolder
from threadloom.persistence.sqlite.store import SqliteCheckpointer

WAIT = timedelta(seconds=10)
PROMPT = 5.0  # seconds: "at once" for a run that meets a fatal failure (it never waits out a retry budget)
FAST = ServePolicy(poll_interval=timedelta(milliseconds=20), busy_delay=timedelta(milliseconds=50))
QUICK_CLAIMS = ClaimPolicy(ttl=timedelta(seconds=2), renew_every=timedelta(milliseconds=100))
QUICK_WATCH = WatchPolicy(poll_interval=timedelta(milliseconds=50))

pytestmark = pytest.mark.timeout(60)


class FlakyStore(InMemoryCheckpointer):
    """A real in-memory store whose chosen calls fail with ``StoreUnavailable`` before touching anything.

    ``fail(op, n)`` makes the next ``n`` calls of ``op`` fail (``n=None``: until ``heal(op)``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._faults_lock = threading.Lock()
        self._outages: dict[str, int | None] = {}
        self.failed: dict[str, int] = {}

    def fail(self, op: str, n: int | None) -> None:
        with self._faults_lock:
            self._outages[op] = n

    def heal(self, op: str) -> None:
        with self._faults_lock:
            self._outages.pop(op, None)

    def _fault(self, op: str) -> None:
        with self._faults_lock:
            if op not in self._outages:
                return
            left = self._outages[op]
            if left is not None:
                if left <= 1:
                    del self._outages[op]
                else:
                    self._outages[op] = left - 1
            self.failed[op] = self.failed.get(op, 0) + 1
        raise StoreUnavailable(op, f"injected outage: the storage did not answer {op}")

    def commit(self, thread_id, commit):
        self._fault("commit")
        return super().commit(thread_id, commit)

    def events_after(self, thread_id, after_seq, limit):
        self._fault("events_after")
        return super().events_after(thread_id, after_seq, limit)

    def await_events_after(self, thread_id, after_seq, limit, timeout, *, cancel=None):
        self._fault("await_events_after")
        return super().await_events_after(thread_id, after_seq, limit, timeout, cancel=cancel)

    def sweep(self, policy, guard, *, after=None):
        self._fault("sweep")
        return super().sweep(policy, guard, after=after)


class Gated:
    """A graph a -> b -> c: a records effect "k"; b waits for ``gate`` (once ``hold`` is set), then reads "k"."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.calls: list[str] = []

    def graph(self) -> Graph:
        def a(state, ctx):
            self._note("a")
            value = ctx.effect("k", lambda: 7)
            return Step.to("b", {**state, "k": value})

        def b(state, ctx):
            self._note("b")
            if self.hold.is_set():
                self.entered.set()
                assert self.gate.wait(30), "the test never opened the gate"
            again = ctx.effect("k", lambda: -1)  # recorded by a's step: read back from the store
            return Step.to("c", {**state, "again": again})

        def c(state, ctx):
            self._note("c")
            return Step.end({**state, "done": True})

        return Graph("gated", {"a": a, "b": b, "c": c}, entry="a")

    def _note(self, node: str) -> None:
        with self.lock:
            self.calls.append(node)


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        time.sleep(0.01)


def _raised_within(handle, seconds: float) -> BaseException:
    """The error ``handle`` ended with, asserting it ended within ``seconds``."""
    started = time.monotonic()
    error = handle.exception(timedelta(seconds=seconds))
    assert error is not None, "the run ended well"
    assert time.monotonic() - started < seconds
    return error


def _damage(path, sql: str, *args) -> None:
    """Overwrites rows of a real SQLite store file with sqlite3, as a damaged disk or a bad tool would."""
    conn = sqlite3.connect(str(path), timeout=10)
    try:
        changed = conn.execute(sql, args).rowcount
        conn.commit()
    finally:
        conn.close()
    assert changed > 0, f"nothing matched: {sql}"


def _errors(logs, event: str) -> list[dict]:
    return [e for e in logs if e["event"] == event and e["log_level"] == "error"]


@pytest.fixture
def sqlite_path(tmp_path):
    return tmp_path / "store.db"


@pytest.fixture
def runtimes():
    made: list[GraphRuntime] = []

    def make(store, **options) -> GraphRuntime:
        runtime = GraphRuntime(store, node_id=f"n{len(made) + 1}", **options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


# -- the decision -------------------------------------------------------------------------------------------------


def test_the_decision_follows_the_kind_of_error_and_a_closed_store():
    transient = [
        StoreUnavailable("commit", "x"),
        OutcomeUnknown("commit", "x"),
        ProcessingError("commit", "a failure of unknown kind"),
        ThreadBusy("t", None, BusyHolder.UNNAMED),
        StaleClaim("t", 1, 2),
    ]
    fatal = [StoreCorrupt("decode", "x"), StoreClosed("commit", "x")]
    neither = [RunFailed("t", "r", "a", "boom"), ValidationError("input", ("bad",)), RuntimeError("bug")]
    assert [is_transient(e) for e in transient] == [True] * 5
    assert [is_fatal(e) for e in transient] == [False] * 5
    assert [is_transient(e) for e in fatal] == [False] * 2 and [is_fatal(e) for e in fatal] == [True] * 2
    assert [is_transient(e) or is_fatal(e) for e in neither] == [False] * 3
    closed = InMemoryCheckpointer()
    closed.close()
    # A store that says it is closed: any of its ProcessingErrors is fatal, whatever its kind.
    assert is_fatal(ProcessingError("commit", "x"), closed) and is_fatal(StoreUnavailable("commit", "x"), closed)
    assert not is_fatal(ThreadBusy("t", None, BusyHolder.UNNAMED), closed)
    assert can_repeat(StoreUnavailable("commit", "x")) and not can_repeat(OutcomeUnknown("commit", "x"))
    assert not can_repeat(StoreUnavailable("commit", "x"), closed)
    assert error_kind(StoreCorrupt("decode", "x")) == "store_corrupt"
    pauses = [retry_pause(n).total_seconds() for n in (1, 2, 3, 10, 100)]
    assert pauses == [0.05, 0.1, 0.2, 2.0, 2.0]


# -- a damaged store ----------------------------------------------------------------------------------------------


def test_a_run_meeting_a_damaged_row_raises_store_corrupt_at_once_and_is_recovered_after_repair(
    sqlite_path, runtimes
):
    store = SqliteCheckpointer.open(str(sqlite_path))
    try:
        runtime = runtimes(store)
        nodes = Gated()
        with capture_logs() as logs:
            handle = runtime.start("t", nodes.graph(), {"x": 1})
            assert nodes.entered.wait(10)  # a committed its step and effect "k"; b waits
            good = sqlite3.connect(str(sqlite_path)).execute("SELECT key, body FROM effects").fetchall()
            _damage(sqlite_path, "UPDATE effects SET body = ? WHERE thread_id = ?", "{not json", "t")
            nodes.gate.set()  # b reads "k" back: the row does not decode
            error = _raised_within(handle, PROMPT)
        assert isinstance(error, StoreCorrupt) and "does not decode" in str(error)
        with pytest.raises(StoreCorrupt):
            handle.wait(timedelta(0))
        # No FAILED checkpoint (the node did nothing wrong), the claim released, the thread as a's step left it.
        latest = store.latest("t").checkpoint
        assert latest.status is CheckpointStatus.RUNNING and latest.metadata["threadloom.next"] == "b"
        failed = _errors(logs, "run.failed")
        assert len(failed) == 1 and failed[0]["error_kind"] == "store_corrupt" and failed[0]["run_id"] == handle.run_id
        assert not any(e["event"] == "run.interrupted" for e in logs)
        # Repaired: any runtime recovers the thread and finishes it without running a again.
        conn = sqlite3.connect(str(sqlite_path))
        conn.executemany("UPDATE effects SET body = ? WHERE thread_id = 't' AND key = ?", [(b, k) for k, b in good])
        conn.commit()
        conn.close()
        nodes.hold.clear()
        outcome = runtime.recover("t", nodes.graph()).wait(WAIT)
        assert outcome.status is CheckpointStatus.COMPLETED
        assert outcome.state == {"x": 1, "k": 7, "again": 7, "done": True}
        assert nodes.calls.count("a") == 1
    finally:
        store.close()


def test_a_start_on_a_damaged_thread_is_refused_with_store_corrupt_and_logged_at_error_level(sqlite_path, runtimes):
    store = SqliteCheckpointer.open(str(sqlite_path))
    try:
        runtime = runtimes(store)
        graph = Graph("one", {"only": lambda state, ctx: Step.end({"n": 1})}, entry="only")
        runtime.start("t", graph, {}).wait(WAIT)
        _damage(sqlite_path, "UPDATE checkpoints SET body = ? WHERE thread_id = ?", "[1, 2", "t")
        with capture_logs() as logs:
            started = time.monotonic()
            with pytest.raises(StoreCorrupt):
                runtime.start("t", graph, {})
            assert time.monotonic() - started < PROMPT
        failed = _errors(logs, "run.failed")
        assert len(failed) == 1 and failed[0]["error_kind"] == "store_corrupt"
        assert runtime.live_runs() == {}
    finally:
        store.close()


def test_a_queue_entry_on_a_damaged_thread_is_finished_failed_once_and_the_worker_goes_on(sqlite_path, runtimes):
    store = SqliteCheckpointer.open(str(sqlite_path))
    try:
        runtime = runtimes(store)
        graph = Graph("job", {"only": lambda state, ctx: Step.end({**state, "n": 1})}, entry="only")
        runtime.start("bad", graph, {}).wait(WAIT)
        _damage(sqlite_path, "UPDATE checkpoints SET body = ? WHERE thread_id = ?", "{", "bad")
        damaged = runtime.enqueue("bad", "job", {"input": 1})
        healthy = runtime.enqueue("good", "job", {"input": 2})
        with capture_logs() as logs:
            server = runtime.serve([graph], policy=FAST, block=False)
            _wait_for(lambda: not runtime.queue.entry(healthy.entry_id).open)
            time.sleep(0.3)  # long enough for several polls: a retried entry would be leased again
        entry = runtime.queue.entry(damaged.entry_id)
        assert entry.status is EntryStatus.FAILED and entry.attempts == 1
        assert entry.error.startswith("StoreCorrupt: ") and "does not decode" in entry.error
        assert runtime.queue.entry(healthy.entry_id).status is EntryStatus.COMPLETED
        assert server.error is None and not server.stopped and server.failed == 1 and server.completed == 1
        failed = _errors(logs, "queue.entry_failed")
        assert len(failed) == 1 and failed[0]["entry_id"] == damaged.entry_id
        assert failed[0]["error_kind"] == "store_corrupt"
        assert not any(e["event"] == "queue.handed_back" for e in logs)
        server.stop()
        server.join(WAIT)
    finally:
        store.close()


def test_a_subscription_meeting_a_damaged_event_ends_with_store_corrupt(sqlite_path, runtimes):
    store = SqliteCheckpointer.open(str(sqlite_path))
    try:
        runtime = runtimes(store, watch_policy=QUICK_WATCH)

        def emit(state, ctx):
            ctx.emit("hello", {"i": 1})
            return Step.end(state)

        runtime.start("t", Graph("e", {"emit": emit}, entry="emit"), {}).wait(WAIT)
        subscription = runtime.subscribe("t")
        assert subscription.get(WAIT).type == "threadloom.run_started"
        assert subscription.get(WAIT).type == "hello"
        assert subscription.get(WAIT).type == "threadloom.run_completed"
        with capture_logs() as logs:
            # The watch waits after seq 3; the next event lands damaged.
            runtime.start("t", Graph("e", {"emit": emit}, entry="emit"), {}).wait(WAIT)
            _damage(sqlite_path, "UPDATE events SET body = ? WHERE thread_id = ? AND seq = 5", "{", "t")
            fresh = runtime.subscribe("t", after_seq=3)
            started = time.monotonic()
            with pytest.raises(StoreCorrupt):
                fresh.get(WAIT)
            assert time.monotonic() - started < PROMPT and not fresh.active
            assert isinstance(fresh.error, StoreCorrupt)
        ended = _errors(logs, "subscription.ended")
        assert ended and all(e["error_kind"] == "store_corrupt" for e in ended)
        subscription.cancel()
    finally:
        store.close()


# -- a store closed under a running runtime -----------------------------------------------------------------------


def _memory(_path):
    return InMemoryCheckpointer()


def _sqlite(path):
    return SqliteCheckpointer.open(str(path))


@pytest.fixture(params=[_memory, _sqlite], ids=["memory", "sqlite"])
def store(request, sqlite_path):
    store = request.param(sqlite_path)
    yield store
    store.close()


def test_a_run_whose_store_is_closed_at_a_step_raises_store_closed_naming_the_run(store, runtimes):
    runtime = runtimes(store)
    nodes = Gated()
    with capture_logs() as logs:
        handle = runtime.start("t", nodes.graph(), {})
        assert nodes.entered.wait(10)
        store.close()
        nodes.gate.set()  # b's effect read, or its commit, meets the closed store
        error = _raised_within(handle, PROMPT)
    assert isinstance(error, StoreClosed)
    assert f"run {handle.run_id!r} of thread 't'" in str(error) and "open store" in str(error)
    assert isinstance(error.__cause__, ProcessingError)
    failed = _errors(logs, "run.failed")
    assert len(failed) == 1 and failed[0]["error_kind"] == "store_closed"
    assert not any(e["event"] == "claim.release_failed" for e in logs)  # nothing asked of a closed store
    assert runtime.live_runs() == {}


def test_a_run_whose_store_is_closed_during_a_long_node_ends_at_its_next_renewal(store, runtimes):
    runtime = runtimes(store, claim_policy=QUICK_CLAIMS)
    nodes = Gated()
    handle = runtime.start("t", nodes.graph(), {})
    assert nodes.entered.wait(10)
    try:
        store.close()
        error = _raised_within(handle, PROMPT)  # the node still runs: the renewal notices
        assert isinstance(error, StoreClosed) and handle.run_id in str(error)
    finally:
        nodes.gate.set()


def test_a_queue_worker_whose_store_is_closed_stops_the_server_instead_of_polling(store, runtimes):
    runtime = runtimes(store)
    with capture_logs() as logs:
        server = runtime.serve([Gated().graph()], concurrency=2, policy=FAST, block=False)
        time.sleep(0.1)
        store.close()
        _wait_for(lambda: server.stopped, PROMPT)
        server.join(WAIT)
    assert isinstance(server.error, StoreClosed) and "queue worker" in str(server.error)
    assert all(not task.alive for task in server._tasks)
    stopped = _errors(logs, "queue.worker_stopped")
    assert 1 <= len(stopped) <= 2 and stopped[0]["error_kind"] == "store_closed"
    assert not any(e["event"] == "queue.lease_failed" for e in logs)


def test_a_blocking_serve_on_a_closed_store_raises_store_closed(store, runtimes):
    runtime = runtimes(store)
    store.close()
    started = time.monotonic()
    with pytest.raises(StoreClosed):
        runtime.serve([Gated().graph()], policy=FAST)
    assert time.monotonic() - started < PROMPT


def test_a_queue_run_whose_store_is_closed_under_it_stops_the_worker_and_keeps_the_lease(store, runtimes):
    runtime = runtimes(store)
    nodes = Gated()
    entry = runtime.enqueue("t", "gated", {})
    server = runtime.serve([nodes.graph()], policy=FAST, block=False)
    assert nodes.entered.wait(10)
    store.close()
    nodes.gate.set()
    _wait_for(lambda: server.stopped, PROMPT)
    server.join(WAIT)
    assert isinstance(server.error, StoreClosed)
    # Nothing could be written: the entry is neither finished nor handed back; its lease expires by itself.
    assert server.completed == 0 and server.failed == 0 and server.handed_back == 0
    assert entry.status is EntryStatus.OPEN


def test_a_subscription_whose_store_is_closed_ends_with_store_closed(store, runtimes):
    runtime = runtimes(store, watch_policy=QUICK_WATCH)
    subscription = runtime.subscribe("t")
    time.sleep(0.1)  # the watch is waiting for events
    store.close()
    started = time.monotonic()
    with pytest.raises(StoreClosed) as info:
        subscription.get(WAIT)
    assert time.monotonic() - started < PROMPT
    assert "subscription to thread 't'" in str(info.value) and "after seq 0" in str(info.value)
    assert not subscription.active


def test_the_periodic_sweep_stops_once_its_store_is_closed(store, runtimes):
    with capture_logs() as logs:
        runtimes(store, sweep=SweepSchedule(policy=SweepPolicy(), every=timedelta(milliseconds=20)))
        _wait_for(lambda: any(e["event"] == "sweep.page" for e in logs))
        store.close()
        _wait_for(lambda: any(e["event"] == "sweep.stopped" for e in logs), PROMPT)
        time.sleep(0.3)  # ~15 intervals: a sweep that went on would fail again and again
    stopped = [e for e in logs if e["event"] == "sweep.stopped"]
    assert len(stopped) == 1 and stopped[0]["log_level"] == "error" and stopped[0]["error_kind"] == "store_closed"
    assert not any(e["event"] == "sweep.failed" for e in logs)


# -- an unavailable store: retried ----------------------------------------------------------------------------------


def test_a_step_commit_the_store_could_not_take_is_repeated_and_the_run_completes(runtimes):
    store = FlakyStore()
    runtime = runtimes(store)
    nodes = Gated()
    with capture_logs() as logs:
        handle = runtime.start("t", nodes.graph(), {"x": 1})
        assert nodes.entered.wait(10)
        store.fail("commit", 3)
        nodes.gate.set()
        outcome = handle.wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED
    assert outcome.state == {"x": 1, "k": 7, "again": 7, "done": True}
    assert store.failed["commit"] == 3
    retries = [e for e in logs if e["event"] == "commit.retrying"]
    assert [e["attempt"] for e in retries] == [2, 3, 4] and [e["pause_ms"] for e in retries] == [50.0, 100.0, 200.0]
    assert all(e["error_kind"] == "store_unavailable" and e["log_level"] == "warning" for e in retries)
    history = list(reversed(store.history("t", limit=10)))
    assert [cp.metadata["threadloom.node"] for cp in history] == ["", "a", "b", "c"]  # each step once
    assert [e.seq for e in store.events_after("t", 0, 100)] == [1, 2]
    assert nodes.calls == ["a", "b", "c"]


def test_an_outage_longer_than_the_claim_ttl_ends_the_run_recoverable(runtimes):
    store = FlakyStore()
    claims = ClaimPolicy(ttl=timedelta(milliseconds=600), renew_every=timedelta(milliseconds=200))
    runtime = runtimes(store, claim_policy=claims)
    nodes = Gated()
    handle = runtime.start("t", nodes.graph(), {})
    assert nodes.entered.wait(10)
    store.fail("commit", None)
    nodes.gate.set()
    error = _raised_within(handle, PROMPT)
    assert isinstance(error, StoreUnavailable)
    assert store.failed["commit"] >= 3  # tried again, with pauses, for the claim's ttl
    assert store.latest("t").checkpoint.metadata["threadloom.next"] == "b"  # b's step never applied
    store.heal("commit")
    nodes.hold.clear()
    outcome = runtime.recover("t", nodes.graph()).wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED and nodes.calls.count("a") == 1


def test_cancelling_a_run_while_its_commit_waits_for_a_retry_ends_it_at_once(runtimes):
    store = FlakyStore()
    runtime = runtimes(store)
    nodes = Gated()
    handle = runtime.start("t", nodes.graph(), {})
    assert nodes.entered.wait(10)
    store.fail("commit", None)
    nodes.gate.set()
    _wait_for(lambda: store.failed.get("commit", 0) >= 2)
    handle.cancel()
    error = _raised_within(handle, PROMPT)
    assert type(error).__name__ == "CancelledError"
    failed_then = store.failed["commit"]
    time.sleep(0.3)
    assert store.failed["commit"] == failed_then  # no commit tried after the cancel


def test_a_queued_run_whose_store_is_unavailable_at_first_is_handed_back_and_completes(runtimes):
    store = FlakyStore()
    runtime = runtimes(store)
    nodes = Gated()
    nodes.hold.clear()
    entry = runtime.enqueue("t", "gated", {"x": 1})
    store.fail("commit", 2)  # the first attempt's admission, then the second's
    with capture_logs() as logs:
        server = runtime.serve([nodes.graph()], policy=FAST, block=False)
        _wait_for(lambda: not runtime.queue.entry(entry.entry_id).open)
    done = runtime.queue.entry(entry.entry_id)
    assert done.status is EntryStatus.COMPLETED and done.attempts == 3
    assert store.latest("t").checkpoint.state == {"x": 1, "k": 7, "again": 7, "done": True}
    handed = [e for e in logs if e["event"] == "queue.handed_back"]
    assert len(handed) == 2 and all(e["error"].startswith("StoreUnavailable") for e in handed)
    assert not _errors(logs, "queue.worker_stopped") and server.error is None
    server.stop()
    server.join(WAIT)


def test_a_subscription_reads_again_through_an_outage_and_misses_nothing(runtimes):
    store = FlakyStore()
    runtime = runtimes(store, watch_policy=QUICK_WATCH)
    graph = Graph("one", {"only": lambda state, ctx: Step.end(state)}, entry="only")
    runtime.start("t", graph, {}).wait(WAIT)
    subscription = runtime.subscribe("t")
    assert [subscription.get(WAIT).seq for _ in range(2)] == [1, 2]
    with capture_logs() as logs:
        store.fail("await_events_after", 4)
        _wait_for(lambda: store.failed.get("await_events_after", 0) >= 1)  # the watch is in the outage
        runtime.start("t", graph, {}).wait(WAIT)
        got = [subscription.get(WAIT) for _ in range(2)]
    assert [e.seq for e in got] == [3, 4] and subscription.active and subscription.error is None
    retrying = [e for e in logs if e["event"] == "subscription.retrying"]
    assert len(retrying) == 4 and all(e["error_kind"] == "store_unavailable" for e in retrying)
    subscription.cancel()


def test_the_periodic_sweep_tries_again_after_an_unavailable_store(runtimes):
    store = FlakyStore()
    store.fail("sweep", 2)
    with capture_logs() as logs:
        runtimes(store, sweep=SweepSchedule(policy=SweepPolicy(), every=timedelta(milliseconds=20)))
        _wait_for(lambda: any(e["event"] == "sweep.page" for e in logs))
    assert [e["event"] for e in logs if e["event"].startswith("sweep.")][:3] == [
        "sweep.failed",
        "sweep.failed",
        "sweep.page",
    ]
    assert not any(e["event"] == "sweep.stopped" for e in logs)
