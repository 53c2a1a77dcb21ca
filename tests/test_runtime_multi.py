"""Several GraphRuntimes over one storage (DESIGN §5): claims refuse, renewals hold, takeovers fence, exactly one
of concurrent recoveries wins, subscriptions deliver every event once across runtimes and restarts, and close()
leaves no thread running and no claim held. Over memory (one store object shared) and SQLite (a store per
runtime over one file)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    BusyHolder,
    CancelledError,
    CheckpointStatus,
    ClaimPolicy,
    ClaimRequest,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    ManualClock,
    RetentionPolicy,
    StaleClaim,
    Step,
    SweepPolicy,
    SweepSchedule,
    TenantMismatch,
    ThreadBusy,
    ThreadQuery,
    ThreadStatus,
    WatchPolicy,
)
from threadloom.actors import graph as g
from threadloom.actors.supervisor import Registry, RuntimeGuard
from threadloom.testing.harness import START

WAIT = timedelta(seconds=10)
TTL = timedelta(seconds=30)
FAST_WATCH = WatchPolicy(poll_interval=timedelta(milliseconds=50))


class Storage:
    """Makes stores over one storage: memory shares one object, SQLite opens a store per call on one file."""

    def __init__(self, kind: str, tmp_path, clock) -> None:
        self.kind, self.clock, self._path = kind, clock, str(tmp_path / "multi.db")
        self._stores: list = []
        self._memory = InMemoryCheckpointer(clock) if kind == "memory" else None

    def store(self):
        if self._memory is not None:
            return self._memory
        from threadloom.persistence.sqlite.store import SqliteCheckpointer

        store = SqliteCheckpointer.open(self._path, clock=self.clock)
        self._stores.append(store)
        return store

    def close(self) -> None:
        for store in self._stores:
            store.close()
        if self._memory is not None:
            self._memory.close()


@pytest.fixture(params=["memory", "sqlite"])
def manual(request, tmp_path):
    """Stores whose clock is a ManualClock (claims expire when the test says so)."""
    storage = Storage(request.param, tmp_path, ManualClock(START))
    yield storage
    storage.close()


@pytest.fixture(params=["memory", "sqlite"])
def real(request, tmp_path):
    """Stores on the system clock (claims expire in real time)."""
    from threadloom import SystemClock

    storage = Storage(request.param, tmp_path, SystemClock())
    yield storage
    storage.close()


@pytest.fixture
def runtimes():
    """Makes runtimes and closes them all at the end."""
    made: list[GraphRuntime] = []

    def make(store, node_id: str, **options) -> GraphRuntime:
        options.setdefault("watch_policy", FAST_WATCH)
        runtime = GraphRuntime(store, node_id=node_id, **options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


class Nodes:
    """A three-node graph (a -> b -> c) whose node b blocks the runs of the runtimes ``blocked`` names (node-id
    prefixes) until released."""

    def __init__(self, blocked: str | tuple[str, ...] = "A") -> None:
        self.blocked = tuple(f"{prefix}" for prefix in ((blocked,) if isinstance(blocked, str) else blocked))
        self.gate = threading.Event()
        self.entered = threading.Event()
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def _hit(self, node: str, ctx) -> None:
        with self._lock:
            self.calls.append((node, ctx.run_id.split(":")[0]))

    def count(self, node: str) -> int:
        with self._lock:
            return sum(1 for name, _ in self.calls if name == node)

    def graph(self) -> Graph:
        def a(state, ctx):
            self._hit("a", ctx)
            charged = ctx.effect("charge", lambda: self._hit("charge", ctx) or "charged-once")
            return Step.to("b", {**state, "charged": charged, "path": ["a"]})

        def b(state, ctx):
            self._hit("b", ctx)
            if ctx.run_id.split(":")[0].startswith(self.blocked):
                self.entered.set()
                assert self.gate.wait(10), "the test never released node b"
            return Step.to("c", {**state, "path": state["path"] + ["b"]})

        def c(state, ctx):
            self._hit("c", ctx)
            return Step.end({**state, "path": state["path"] + ["c"]})

        return Graph("abc", {"a": a, "b": b, "c": c}, entry="a")


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        time.sleep(0.005)


# -- claims across runtimes ---------------------------------------------------------------------------------------


def test_a_live_run_refuses_the_other_runtimes_recover_and_delete_naming_the_holder(manual, runtimes):
    nodes = Nodes()
    a = runtimes(manual.store(), "A")
    b = runtimes(manual.store(), "B")
    handle = a.start("t1", nodes.graph(), {}, tenant_id="acme")
    assert nodes.entered.wait(10)
    try:
        with capture_logs() as logs:
            with pytest.raises(ThreadBusy) as recovering:
                b.recover("t1", nodes.graph(), tenant_id="acme")
            with pytest.raises(ThreadBusy) as deleting:
                b.delete_thread("t1", "acme")
            with pytest.raises(TenantMismatch) as other_tenant:
                b.delete_thread("t1", "evil")
        assert recovering.value.holder == BusyHolder.Run(handle.run_id)
        assert deleting.value.holder == BusyHolder.Run(handle.run_id)
        assert handle.run_id in str(deleting.value)
        # Another tenant's delete is refused before it claims: it learns nothing of the run, not even that one holds
        # the thread.
        assert handle.run_id not in str(other_tenant.value) and "held" not in str(other_tenant.value)
        busy = [entry for entry in logs if entry["event"] == "claim.busy"]
        assert len(busy) == 2 and all(entry["thread_id"] == "t1" and entry["node_id"] == "B" for entry in busy)
        assert b.threads(ThreadQuery(tenant_id="acme")).items[0].status is ThreadStatus.RUNNING
    finally:
        nodes.gate.set()
    assert handle.wait(WAIT).state["path"] == ["a", "b", "c"]


def test_renewals_keep_a_long_run_from_being_taken_over(real, runtimes):
    policy = ClaimPolicy(ttl=timedelta(milliseconds=800), renew_every=timedelta(milliseconds=100))
    nodes = Nodes()
    a = runtimes(real.store(), "A", claim_policy=policy)
    b = runtimes(real.store(), "B", claim_policy=policy)
    handle = a.start("t1", nodes.graph(), {})
    assert nodes.entered.wait(10)
    refusals = 0
    deadline = time.monotonic() + 1.7  # two ttls and more
    while time.monotonic() < deadline:
        with pytest.raises(ThreadBusy) as caught:
            b.recover("t1", nodes.graph())
        assert caught.value.holder == BusyHolder.Run(handle.run_id)
        refusals += 1
        time.sleep(0.05)
    nodes.gate.set()
    outcome = handle.wait(WAIT)
    assert outcome.state["path"] == ["a", "b", "c"] and refusals > 10
    assert nodes.count("b") == 1


def test_a_second_runtime_recovers_an_expired_run_and_fences_the_first(manual, runtimes):
    nodes = Nodes()
    a = runtimes(manual.store(), "A", clock=ManualClock(START))  # A's clock never moves: A never renews
    b = runtimes(manual.store(), "B")
    stuck = a.start("t1", nodes.graph(), {"x": 1}, tenant_id="acme")
    assert nodes.entered.wait(10)
    manual.clock.advance(TTL)  # A's claim expires (A is "paused" in node b)
    with capture_logs() as logs:
        recovered = b.recover("t1", nodes.graph(), tenant_id="acme")
        outcome = recovered.wait(WAIT)
        nodes.gate.set()  # A wakes up and tries to commit b's step
        with pytest.raises(StaleClaim) as lost:
            stuck.wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED
    assert outcome.state == {"x": 1, "charged": "charged-once", "path": ["a", "b", "c"]}
    assert outcome.steps == 2  # b and c: a had committed, so it was not run again
    assert nodes.count("a") == 1 and nodes.count("charge") == 1 and nodes.count("b") == 2
    assert lost.value.thread_id == "t1" and lost.value.token == stuck.token and lost.value.current is None
    assert "lost the thread" in str(lost.value)
    store = manual.store()
    history = store.history("t1", limit=10)
    assert {cp.run_id for cp in history} == {stuck.run_id, recovered.run_id}
    assert [cp.run_id for cp in history[:2]] == [recovered.run_id] * 2  # nothing of A's after the takeover
    taken = [e for e in logs if e["event"] == "claim.taken_over"]
    assert taken and taken[0]["taken_over_from"] == stuck.run_id and taken[0]["run_id"] == recovered.run_id
    assert any(e["event"] == "run.recovered" and e["from_run"] == stuck.run_id for e in logs)
    refused = [e for e in logs if e["event"] == "commit.refused" and e["run_id"] == stuck.run_id]
    assert refused and refused[0]["token"] == stuck.token
    assert any(e["event"] == "claim.lost" and e["run_id"] == stuck.run_id and e["op"] == "commit" for e in logs)
    assert any(
        e["event"] == "run.failed" and e["run_id"] == stuck.run_id and e["error_type"] == "StaleClaim" for e in logs
    )
    events = store.events_after("t1", 0, 50)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert g.EVENT_RUN_RECOVERED in [e.type for e in events]


def test_a_renewal_that_says_stale_claim_stops_the_run_at_its_next_step(manual, runtimes):
    nodes = Nodes()
    a_clock = ManualClock(START)
    a = runtimes(manual.store(), "A", clock=a_clock)
    b = runtimes(manual.store(), "B")
    stuck = a.start("t1", nodes.graph(), {})
    assert nodes.entered.wait(10)
    manual.clock.advance(TTL)
    b.recover("t1", nodes.graph()).wait(WAIT)
    with capture_logs() as logs:
        a_clock.advance(ClaimPolicy().renew_every)  # A's renewal timer fires: the store says StaleClaim
        _wait_for(lambda: any(e["event"] == "claim.lost" for e in logs))
        nodes.gate.set()
        with pytest.raises(StaleClaim):
            stuck.wait(WAIT)
    lost = [e for e in logs if e["event"] == "claim.lost"]
    assert lost[0]["op"] == "renew" and lost[0]["run_id"] == stuck.run_id and lost[0]["token"] == stuck.token
    assert not any(e["event"] == "commit.refused" for e in logs)  # it never tried to write again


def test_exactly_one_of_four_concurrent_recoveries_is_admitted(manual, runtimes):
    nodes = Nodes(blocked=("A", "R"))  # the winner holds the thread until every recovery has answered
    a = runtimes(manual.store(), "A", clock=ManualClock(START))
    stuck = a.start("t1", nodes.graph(), {}, tenant_id="acme")
    assert nodes.entered.wait(10)
    manual.clock.advance(TTL)
    rescuers = [runtimes(manual.store(), f"R{i}") for i in range(4)]
    barrier = threading.Barrier(4)
    results: list = [None] * 4

    def recover(index: int) -> None:
        barrier.wait()
        try:
            results[index] = rescuers[index].recover("t1", nodes.graph(), tenant_id="acme")
        except Exception as error:  # anything but ThreadBusy fails the count below, with the error shown
            results[index] = error

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    admitted = [r for r in results if not isinstance(r, ThreadBusy)]
    refused = [r for r in results if isinstance(r, ThreadBusy)]
    assert len(admitted) == 1 and len(refused) == 3, results
    winner = admitted[0]
    assert all(error.holder == BusyHolder.Run(winner.run_id) for error in refused)
    nodes.gate.set()
    assert winner.wait(WAIT).state["path"] == ["a", "b", "c"]
    with pytest.raises(StaleClaim):
        stuck.wait(WAIT)
    assert nodes.count("c") == 1


# -- subscriptions across runtimes --------------------------------------------------------------------------------


def ticker(steps: int, per_step: int, pace: threading.Semaphore) -> Graph:
    """A graph that emits ``per_step`` events a step for ``steps`` steps, one step per ``pace`` release."""

    def tick(state, ctx):
        assert pace.acquire(timeout=10), "the test stopped pacing"
        for i in range(per_step):
            ctx.emit("tick", {"step": state["n"], "i": i})
        n = state["n"] + 1
        return Step.to("tick", {"n": n}) if n < steps else Step.end({"n": n})

    return Graph("ticker", {"tick": tick}, entry="tick")


def _collect(subscription, until_type: str = g.EVENT_RUN_COMPLETED, limit: int = 10_000) -> list:
    out = []
    while len(out) < limit:
        event = subscription.get(WAIT)
        assert event is not None, f"no event after seq {out[-1].seq if out else subscription.after_seq}"
        out.append(event)
        if event.type == until_type:
            return out
    return out


def test_subscriptions_across_runtimes_deliver_every_event_once_in_order(manual, runtimes):
    pace = threading.Semaphore(0)
    writer = runtimes(manual.store(), "W")
    reader = runtimes(manual.store(), "R")
    handle = writer.start("t1", ticker(10, 3, pace), {"n": 0}, tenant_id="acme")
    early = reader.subscribe("t1", tenant_id="acme")  # from the start
    for _ in range(3):
        pace.release()
    _wait_for(lambda: len(manual.store().events_after("t1", 0, 100)) >= 10)
    joined = reader.subscribe("t1", tenant_id="acme")  # mid-run: replays, then watches
    late = reader.subscribe("t1", after_seq=5, tenant_id="acme")
    for _ in range(7):
        pace.release()
    handle.wait(WAIT)
    total = 1 + 10 * 3 + 1
    for subscription, start in ((early, 1), (joined, 1), (late, 6)):
        events = _collect(subscription)
        assert [e.seq for e in events] == list(range(start, total + 1))
        assert subscription.last_seq == total
        assert subscription.get(timedelta(milliseconds=100)) is None  # nothing more, nothing twice
        subscription.cancel()


def test_a_subscription_resumes_after_a_restart_without_gap_or_duplicate(manual, runtimes):
    pace = threading.Semaphore(0)
    writer = runtimes(manual.store(), "W")
    handle = writer.start("t1", ticker(6, 2, pace), {"n": 0})
    first = runtimes(manual.store(), "R1")
    subscription = first.subscribe("t1")
    for _ in range(3):
        pace.release()
    seen = [subscription.get(WAIT) for _ in range(5)]
    first.close()  # the reader's process "restarts": its subscription ends with it
    assert subscription.get(timedelta(milliseconds=50)) is None
    for _ in range(3):
        pace.release()
    handle.wait(WAIT)
    second = runtimes(manual.store(), "R2")
    resumed = second.subscribe("t1", after_seq=subscription.last_seq)
    rest = _collect(resumed)
    seqs = [e.seq for e in seen + rest]
    assert seqs == list(range(1, 1 + 6 * 2 + 2))
    resumed.cancel()


def test_nothing_is_delivered_after_cancel(manual, runtimes):
    pace = threading.Semaphore(0)
    writer = runtimes(manual.store(), "W")
    reader = runtimes(manual.store(), "R")
    handle = writer.start("t1", ticker(4, 2, pace), {"n": 0})
    subscription = reader.subscribe("t1")
    pace.release()
    assert subscription.get(WAIT) is not None
    _wait_for(lambda: len(manual.store().events_after("t1", 0, 100)) >= 3)  # more are queued, unread
    subscription.cancel()
    assert not subscription.active
    for _ in range(3):
        pace.release()
    handle.wait(WAIT)
    assert subscription.get(timedelta(milliseconds=200)) is None
    assert list(subscription) == []


def test_a_subscription_ends_with_thread_deleted_when_the_thread_is_deleted(manual, runtimes):
    runtime = runtimes(manual.store(), "A")
    graph = Graph("one", {"x": lambda state, ctx: Step.end(state)}, entry="x")
    runtime.start("t1", graph, {}).wait(WAIT)
    subscription = runtime.subscribe("t1")
    events = _collect(subscription)
    runtime.delete_thread("t1")
    runtime.start("t1", graph, {}).wait(WAIT)  # a new incarnation numbers past the deleted log
    from threadloom import ThreadDeleted

    with pytest.raises(ThreadDeleted):
        subscription.get(WAIT)
    fresh = runtime.subscribe("t1")
    assert fresh.get(WAIT).seq == events[-1].seq + 2


def test_a_disabled_watch_replays_and_ends(manual, runtimes):
    runtime = runtimes(manual.store(), "A", watch_policy=WatchPolicy(enabled=False))
    graph = Graph("one", {"x": lambda state, ctx: Step.end(state)}, entry="x")
    runtime.start("t1", graph, {}).wait(WAIT)
    assert [e.seq for e in runtime.subscribe("t1")] == [1, 2]


# -- shutdown -----------------------------------------------------------------------------------------------------


def test_close_stops_every_thread_and_releases_every_claim(manual, runtimes):
    before = set(threading.enumerate())
    nodes = Nodes()
    store = manual.store()
    runtime = GraphRuntime(
        store,
        node_id="A",
        watch_policy=FAST_WATCH,
        sweep=SweepSchedule(policy=SweepPolicy(), every=timedelta(milliseconds=10)),
    )
    handle = runtime.start("t1", nodes.graph(), {})
    quick = runtime.start("t2", Graph("one", {"x": lambda s, c: Step.end(s)}, entry="x"), {})
    quick.wait(WAIT)
    subscription = runtime.subscribe("t1")
    server = runtime.serve([nodes.graph()], block=False, concurrency=2) if runtime.queue is not None else None
    assert nodes.entered.wait(10)
    opener = threading.Timer(0.2, nodes.gate.set)
    opener.start()
    with capture_logs() as logs:
        runtime.close()
    opener.join()
    with pytest.raises(CancelledError):
        handle.wait(WAIT)
    assert (server is None or server.stopped) and not subscription.active
    leftover = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leftover == []
    # b's step was committed at the step boundary, then the claim released: the thread is incomplete and free.
    latest = store.latest("t1").checkpoint
    assert latest.status is CheckpointStatus.RUNNING and latest.metadata[g.NEXT_KEY] == "c"
    assert store.claim("t1", ClaimRequest(holder="probe", ttl=TTL)).taken_over_from is None
    assert any(e["event"] == "claim.released" and e["run_id"] == handle.run_id for e in logs)
    runtime.close()  # twice does nothing
    with pytest.raises(Exception, match="closed"):
        runtime.start("t3", nodes.graph(), {})


def test_a_closed_runtime_recovers_on_another_runtime(manual, runtimes):
    first = runtimes(manual.store(), "A")
    gate = threading.Event()

    def slow(state, ctx):
        gate.wait(10)
        return Step.to("done", state)

    graph = Graph("slow", {"slow": slow, "done": lambda s, c: Step.end({**s, "done": True})}, entry="slow")
    first.start("t1", graph, {})
    threading.Timer(0.1, gate.set).start()
    first.close()
    assert [s.thread_id for s in first.store.incomplete(None, limit=10).items] == ["t1"]
    second = runtimes(manual.store(), "B")
    assert second.recover("t1", graph).wait(WAIT).state == {"done": True}


# -- the sweep ----------------------------------------------------------------------------------------------------


def test_the_runtime_sweep_logs_pages_and_reclaimed_tombstones(manual, runtimes):
    runtime = runtimes(manual.store(), "A")
    graph = Graph("one", {"x": lambda state, ctx: Step.to("y", state), "y": lambda s, c: Step.end(s)}, entry="x")
    for i in range(3):
        runtime.start(f"t{i}", graph, {}).wait(WAIT)
    runtime.delete_thread("t0")
    manual.clock.advance(timedelta(hours=2))
    policy = SweepPolicy(retention=RetentionPolicy(max_checkpoints=1), batch_size=2, tombstone_age=timedelta(hours=1))
    with capture_logs() as logs:
        pages = runtime.sweep(policy)
    assert [page.visited for page in pages] == [("t0", "t1"), ("t2",)]
    assert pages[0].reclaimed == ("t0",)
    assert len(manual.store().history("t1", limit=10)) == 1
    assert [e["event"] for e in logs if e["event"].startswith(("sweep", "tombstone"))] == [
        "sweep.page",
        "tombstone.reclaimed",
        "sweep.page",
    ]
    assert next(e for e in logs if e["event"] == "tombstone.reclaimed")["thread_id"] == "t0"


def test_the_periodic_sweep_runs_on_its_schedule(manual, runtimes):
    with capture_logs() as logs:
        runtimes(manual.store(), "A", sweep=SweepSchedule(policy=SweepPolicy(), every=timedelta(milliseconds=20)))
        _wait_for(lambda: sum(1 for e in logs if e["event"] == "sweep.page") >= 2)


def test_the_guard_protects_live_runs_and_open_entries():
    store = InMemoryCheckpointer()
    registry = Registry()
    guard = RuntimeGuard(registry, store.queue)
    entry = store.queue.enqueue("t2", graph_id="g")
    lease = store.queue.lease("w", TTL)
    store.queue.record_run(entry.entry_id, lease.attempt, "r-queued")

    class _Handle:
        def done(self) -> bool:
            return False

    from threadloom.actors.supervisor import LiveRun

    registry.add(LiveRun("r-live", "t1", None, _Handle(), None))
    assert guard.protected(("t1", "t2", "t3")) == {"t1": frozenset({"r-live"}), "t2": frozenset({"r-queued"})}
