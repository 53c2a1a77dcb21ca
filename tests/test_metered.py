"""MeteredCheckpointer over the in-memory store: delegation, every metric, waits, close, meter failures."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
import structlog

import threadloom
from threadloom import (
    CancelledError,
    Checkpoint,
    Checkpointer,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    InMemoryCheckpointer,
    InMemoryMeter,
    ManualClock,
    Meter,
    MeteredCheckpointer,
    ProcessingError,
    RetentionPolicy,
    StaleClaim,
    SweepPolicy,
    ThreadBusy,
    ThreadQuery,
    ValidationError,
)
from threadloom.persistence.metrics.metered import OPERATIONS, STORE_METRICS

START = datetime(2026, 1, 1, tzinfo=UTC)
TTL = timedelta(seconds=30)
CALLS = "threadloom_store_calls_total"
ERRORS = "threadloom_store_errors_total"
LATENCY = "threadloom_store_call_seconds"
CLAIMS = "threadloom_claims_total"
WAITS = "threadloom_waits_total"


def checkpoint(thread_id: str, cp_id: str, parent: str | None, *, run_id: str = "run-1", status=None) -> Checkpoint:
    return Checkpoint(
        id=cp_id,
        parent=parent,
        thread_id=thread_id,
        run_id=run_id,
        status=status or CheckpointStatus.RUNNING,
        created_at=START,
        state={"step": cp_id},
    )


def draft(kind: str = "step") -> EventDraft:
    return EventDraft(run_id="run-1", type=kind, timestamp=START, payload={"k": kind})


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def store(clock: ManualClock):
    wrapped = MeteredCheckpointer(InMemoryCheckpointer(clock))
    yield wrapped
    wrapped.close()


def snap(store: MeteredCheckpointer):
    return store.meter.snapshot()


# -- shape -------------------------------------------------------------------------------------------------------


def test_is_a_checkpointer_exported_from_the_root_and_owns_a_default_meter():
    inner = InMemoryCheckpointer()
    wrapped = MeteredCheckpointer(inner)
    assert isinstance(wrapped, Checkpointer)
    assert wrapped.inner is inner
    assert isinstance(wrapped.meter, InMemoryMeter) and isinstance(wrapped.meter, Meter)
    for name in ("MeteredCheckpointer", "InMemoryMeter", "Meter", "PrometheusMeter", "OpenTelemetryMeter"):
        assert name in threadloom.__all__
        assert getattr(threadloom, name) is not None
    from threadloom.persistence.metrics.otel import OpenTelemetryMeter
    from threadloom.persistence.metrics.prometheus import PrometheusMeter

    assert threadloom.PrometheusMeter is PrometheusMeter and threadloom.OpenTelemetryMeter is OpenTelemetryMeter
    assert "InMemoryCheckpointer" in repr(wrapped)
    wrapped.close()


def test_rejects_what_is_not_a_store_or_a_meter():
    with pytest.raises(ValidationError) as caught:
        MeteredCheckpointer("memory://")  # type: ignore[arg-type]
    assert caught.value.field == "inner"
    inner = InMemoryCheckpointer()
    with pytest.raises(ValidationError) as caught:
        MeteredCheckpointer(inner, object())  # type: ignore[arg-type]
    assert caught.value.field == "meter"


def test_a_duck_typed_meter_without_describe_is_accepted():
    class Tally:
        """Has counter() and histogram() but does not subclass Meter, and has no describe()."""

        def __init__(self) -> None:
            self.bound: list[tuple[str, tuple]] = []
            self.recorded: list[tuple[str, tuple, float]] = []

        def _series(self, name, labels=()):
            self.bound.append((name, labels))
            tally = self

            class Series:
                def add(self, amount=1):
                    tally.recorded.append((name, labels, amount))

                observe = add

            return Series()

        counter = histogram = _series

    tally = Tally()
    wrapped = MeteredCheckpointer(InMemoryCheckpointer(), tally)  # type: ignore[arg-type]
    assert (CALLS, (("op", "latest"),)) in tally.bound and (LATENCY, (("op", "commit"),)) in tally.bound
    wrapped.latest("t")
    assert [(name, labels) for name, labels, _ in tally.recorded] == [
        (CALLS, (("op", "latest"),)),
        (LATENCY, (("op", "latest"),)),
    ]
    assert tally.recorded[0][2] == 1 and tally.recorded[1][2] >= 0


def test_every_metric_is_described_and_every_operation_is_a_public_method():
    meter = InMemoryMeter()
    MeteredCheckpointer(InMemoryCheckpointer(), meter)
    names = {spec.name for spec in STORE_METRICS}
    assert {CALLS, ERRORS, LATENCY, CLAIMS, WAITS, "threadloom_events_committed_total"} <= names
    assert "threadloom_sweep_pages_total" in names and "threadloom_sweep_reclaimed_total" in names
    for op in OPERATIONS:
        assert getattr(MeteredCheckpointer, op) is not getattr(Checkpointer, op), op
    # describing the same specs again (a second wrapper sharing the meter) is fine
    MeteredCheckpointer(InMemoryCheckpointer(), meter)


# -- delegation and the per-operation metrics ------------------------------------------------------------------------


def test_every_operation_delegates_and_is_counted_with_its_latency(store: MeteredCheckpointer, clock: ManualClock):
    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    store.renew("t", claim.token, TTL)
    assert store.current_claim("t").token == claim.token
    records = store.commit(
        "t",
        Commit(
            token=claim.token,
            checkpoint=checkpoint("t", "c1", None),
            events=(draft("a"), draft("b")),
            effects=(EffectRecord(key="k", run_id="run-1", recorded_at=START, result=7),),
        ),
    )
    assert [r.seq for r in records] == [1, 2]
    store.commit("t", Commit(token=claim.token, checkpoint=checkpoint("t", "c2", "c1"), events=(draft("c"),)))
    assert store.latest("t").checkpoint.id == "c2"
    assert store.checkpoint("t", "c1").id == "c1"
    assert [c.id for c in store.history("t", limit=10)] == ["c2", "c1"]
    assert store.search_history("t", metadata={}, limit=1).next == "c2"
    assert store.children("t", limit=10) == []
    assert [e.seq for e in store.events_after("t", 0, 10)] == [1, 2, 3]
    assert [e.seq for e in store.await_events_after("t", 1, 10, timedelta(seconds=0))] == [2, 3]
    store.compact_events("t", 2)
    assert store.effect("t", "k").result == 7
    assert store.lookup_run("t", ["run-1"]).id == "c2"
    store.prune("t", RetentionPolicy(max_checkpoints=1))
    assert [c.id for c in store.history("t", limit=10)] == ["c2"]
    page = store.sweep(SweepPolicy(), None)
    assert page.visited == ("t",)
    assert [s.thread_id for s in store.threads(ThreadQuery(tenant_id=None)).items] == ["t"]
    assert [(row.tenant_id, row.threads) for row in store.tenants().items] == [(None, 1)]
    assert store.incomplete(None, limit=10).items == ()  # held by a live claim: RUNNING, not IDLE
    store.release("t", claim.token)
    assert [s.thread_id for s in store.incomplete(None, limit=10).items] == ["t"]
    assert store.stamp_thread("t") == 0  # stamped at commit
    assert store.graph_threads("default", limit=10) == ["t"]
    assert store.token_high_water() == claim.token
    store.heartbeat("g#access", "node", ["default@a1"], TTL)
    assert [m.member for m in store.members("g#access")] == ["node"]
    assert [c.id for c in store.tenant_history("t", None, limit=10)] == ["c2"]
    assert [e.seq for e in store.tenant_events_after("t", None, 2, 10)] == [3]
    assert [t.thread_id for t in store.export_tenant(None, limit=10).threads] == ["t"]
    claim2 = store.claim("t", ClaimRequest(holder="run-2", ttl=TTL))
    store.delete_thread("t", claim2.token)
    assert store.latest("t") is None

    s = snap(store)
    expected = {
        "claim": 2, "renew": 1, "release": 1, "current_claim": 1, "commit": 2, "latest": 2, "checkpoint": 1, "history": 2,
        "search_history": 1, "children": 1, "events_after": 1, "await_events_after": 1, "compact_events": 1, "delete_thread": 1,
        "effect": 1, "lookup_run": 1, "prune": 1, "sweep": 1, "threads": 1, "incomplete": 2,
        "tenants": 1,
        "stamp_thread": 1, "graph_threads": 1, "token_high_water": 1, "heartbeat": 1, "members": 1,
        "tenant_history": 1, "tenant_events_after": 1, "export_tenant": 1,
    }
    assert set(expected) == set(OPERATIONS)
    for op, count in expected.items():
        assert s.counter(CALLS, op=op) == count, op
        latency = s.histogram(LATENCY, op=op)
        assert latency is not None and latency.count == count and latency.sum >= 0, op
    assert s.counter(CALLS) == sum(expected.values())
    assert s.counter(ERRORS) == 0
    assert s.counter("threadloom_events_committed_total") == 3
    assert s.counter(CLAIMS, outcome="granted") == 2
    assert s.counter(WAITS, outcome="woken") == 1
    assert s.counter("threadloom_sweep_pages_total") == 1
    assert s.counter("threadloom_sweep_visited_total") == 1


def test_results_and_errors_are_the_inner_stores_unchanged(clock: ManualClock):
    inner = InMemoryCheckpointer(clock)
    wrapped = MeteredCheckpointer(inner)
    claim = wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL, tenant_id="acme"))
    with pytest.raises(ThreadBusy) as busy:
        wrapped.claim("t", ClaimRequest(holder="run-2", ttl=TTL, tenant_id="acme"))
    assert busy.value.thread_id == "t" and busy.value.holder == threadloom.BusyHolder.Run("run-1")
    with pytest.raises(StaleClaim) as stale:
        wrapped.commit("t", Commit(token=claim.token + 1))
    assert (stale.value.thread_id, stale.value.token, stale.value.current) == ("t", claim.token + 1, claim.token)
    # what one store wrote the other reads: the wrapper holds no state of its own
    wrapped.commit("t", Commit(token=claim.token, checkpoint=checkpoint("t", "c1", None), events=(draft(),)))
    assert inner.latest("t") == wrapped.latest("t")
    assert inner.events_after("t", 0, 10) == wrapped.events_after("t", 0, 10)


def test_errors_are_counted_by_operation_and_class(store: MeteredCheckpointer):
    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    with pytest.raises(ThreadBusy):
        store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    with pytest.raises(StaleClaim):
        store.renew("t", claim.token + 5, TTL)
    with pytest.raises(StaleClaim):
        store.commit("t", Commit(token=claim.token + 5))
    with pytest.raises(StaleClaim):
        store.delete_thread("t", claim.token, fence=("other", 99))
    with pytest.raises(ValidationError):
        store.latest("")  # the inner store's own validation runs
    with pytest.raises(threadloom.CheckpointNotFound):
        store.history("t", limit=5, before="nope")
    s = snap(store)
    assert s.counter(ERRORS, op="claim", error="ThreadBusy") == 1
    assert s.counter(ERRORS, op="renew", error="StaleClaim") == 1
    assert s.counter(ERRORS, op="commit", error="StaleClaim") == 1
    assert s.counter(ERRORS, op="delete_thread", error="StaleClaim") == 1
    assert s.counter(ERRORS, op="latest", error="ValidationError") == 1
    assert s.counter(ERRORS, op="history", error="CheckpointNotFound") == 1
    assert s.counter(ERRORS) == 6
    assert s.counter(ERRORS, error="StaleClaim") == 3
    # failed calls are calls, with a latency
    assert s.counter(CALLS, op="claim") == 2 and s.histogram(LATENCY, op="claim").count == 2
    assert s.counter(CLAIMS, outcome="busy") == 1
    assert s.counter(CLAIMS, outcome="stale") == 3
    assert s.counter(CLAIMS, outcome="granted") == 1
    assert s.counter("threadloom_events_committed_total") == 0
    assert store.latest("t") is None  # nothing was written by the refused calls


def test_claim_outcomes_granted_taken_over_and_cross_tenant_takeover(store: MeteredCheckpointer, clock: ManualClock):
    store.claim("a", ClaimRequest(holder="run-1", ttl=TTL, tenant_id="acme"))
    clock.advance(TTL)  # at exactly expires_at the claim has expired
    taken = store.claim("a", ClaimRequest(holder="run-2", ttl=TTL, tenant_id="acme"))
    assert taken.taken_over_from == "run-1"
    store.claim("b", ClaimRequest(holder="run-3", ttl=TTL, tenant_id="acme"))
    clock.advance(TTL)
    hidden = store.claim("b", ClaimRequest(holder="run-4", ttl=TTL, tenant_id="other"))
    assert hidden.taken_over_from is None  # another tenant's takeover is not revealed, so it counts as granted
    s = snap(store)
    assert s.counter(CLAIMS, outcome="granted") == 3
    assert s.counter(CLAIMS, outcome="taken_over") == 1
    assert s.counter(CLAIMS) == 4


def test_sweep_pages_pruned_and_reclaimed(store: MeteredCheckpointer, clock: ManualClock):
    for thread_id in ("a", "b", "c"):
        claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=TTL))
        first = checkpoint(thread_id, "c1", None)
        store.commit(thread_id, Commit(token=claim.token, checkpoint=first, events=(draft(),)))
        store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint(thread_id, "c2", "c1")))
        if thread_id == "c":
            store.delete_thread(thread_id, claim.token)
        else:
            store.release(thread_id, claim.token)
    clock.advance(timedelta(hours=2))
    policy = SweepPolicy(
        retention=RetentionPolicy(max_checkpoints=1), batch_size=2, tombstone_age=timedelta(hours=1)
    )
    first = store.sweep(policy, None)
    assert first.visited == ("a", "b") and first.pruned == ("a", "b") and first.next == "b"
    second = store.sweep(policy, None, after=first.next)
    assert second.visited == ("c",) and second.reclaimed == ("c",) and second.next is None
    s = snap(store)
    assert s.counter("threadloom_sweep_pages_total") == 2
    assert s.counter("threadloom_sweep_visited_total") == 3
    assert s.counter("threadloom_sweep_pruned_total") == 2
    assert s.counter("threadloom_sweep_reclaimed_total") == 1


def test_a_failed_sweep_counts_no_page(store: MeteredCheckpointer):
    class Refuses:
        def protected(self, thread_ids):
            raise RuntimeError("guard down")

    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    store.commit("t", Commit(token=claim.token, checkpoint=checkpoint("t", "c1", None)))
    with pytest.raises(ProcessingError):
        store.sweep(SweepPolicy(), Refuses())
    s = snap(store)
    assert s.counter("threadloom_sweep_pages_total") == 0
    assert s.counter(ERRORS, op="sweep", error="ProcessingError") == 1


# -- waiting for events -----------------------------------------------------------------------------------------


def _commit_soon(store: Checkpointer, thread_id: str, token: int, ready: threading.Event) -> threading.Thread:
    def run() -> None:
        ready.wait(5)
        store.commit(thread_id, Commit(token=token, events=(draft("late"),)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_waiter_on_the_wrapped_store_wakes_on_a_commit_through_it(store: MeteredCheckpointer):
    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    store.commit("t", Commit(token=claim.token, checkpoint=checkpoint("t", "c1", None), events=(draft(),)))
    ready = threading.Event()
    committer = _commit_soon(store, "t", claim.token, ready)
    result: list = []

    def wait() -> None:
        ready.set()
        result.append(store.await_events_after("t", 1, 10, timedelta(seconds=60)))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(30)  # far below the 60 s timeout: only a wake-up ends it in time
    committer.join(5)
    assert not waiter.is_alive()
    assert [(e.seq, e.type) for e in result[0]] == [(2, "late")]
    s = snap(store)
    assert s.counter(WAITS, outcome="woken") == 1
    assert s.counter(WAITS, outcome="timed_out") == 0


class CountingMemory(InMemoryCheckpointer):
    """The in-memory store, counting how its wait and its read hooks are reached."""

    def __init__(self, clock) -> None:
        super().__init__(clock)
        self.awaits = 0
        self.reads = 0

    def _await_events_after(self, *args):
        self.awaits += 1
        return super()._await_events_after(*args)

    def _events_after(self, *args):
        self.reads += 1
        return super()._events_after(*args)


def test_the_wrapper_runs_the_inner_stores_own_wait_not_the_polling_default(clock: ManualClock):
    inner = CountingMemory(clock)
    inner.poll_interval = timedelta(milliseconds=1)  # were the polling default used, it would read very often
    wrapped = MeteredCheckpointer(inner)
    claim = wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    ready = threading.Event()
    committer = _commit_soon(wrapped, "t", claim.token, ready)
    ready.set()
    found = wrapped.await_events_after("t", 0, 10, timedelta(seconds=60))
    committer.join(5)
    assert [e.type for e in found] == ["late"]
    assert inner.awaits == 1  # the inner store's override ran once ...
    assert inner.reads == 0  # ... and never fell back to polling events_after
    wrapped.close()


def test_a_wait_times_out_empty_and_a_cancelled_wait_raises(store: MeteredCheckpointer):
    assert store.await_events_after("t", 0, 10, timedelta(milliseconds=20)) == []
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CancelledError):
        store.await_events_after("t", 0, 10, timedelta(seconds=60), cancel=cancel)
    late = threading.Event()
    threading.Timer(0.05, late.set).start()
    with pytest.raises(CancelledError):
        store.await_events_after("t", 0, 10, timedelta(seconds=60), cancel=late)
    s = snap(store)
    assert s.counter(WAITS, outcome="timed_out") == 1
    assert s.counter(WAITS, outcome="cancelled") == 2
    assert s.counter(ERRORS, op="await_events_after", error="CancelledError") == 2
    assert s.counter(CALLS, op="await_events_after") == 3


# -- lifecycle -------------------------------------------------------------------------------------------------------


def test_close_closes_the_inner_store_and_later_calls_are_refused_and_counted(clock: ManualClock):
    inner = InMemoryCheckpointer(clock)
    with MeteredCheckpointer(inner) as wrapped:
        wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    assert wrapped.closed and inner.closed
    wrapped.close()  # twice does nothing
    with pytest.raises(ProcessingError) as caught:
        wrapped.latest("t")
    assert "closed" in str(caught.value)
    assert snap(wrapped).counter(ERRORS, op="latest", error="StoreClosed") == 1


def test_closing_the_inner_store_shows_through_the_wrapper():
    inner = InMemoryCheckpointer()
    wrapped = MeteredCheckpointer(inner)
    inner.close()
    assert wrapped.closed
    with pytest.raises(ProcessingError):
        wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL))


def test_a_waiter_ends_when_the_wrapper_is_closed():
    wrapped = MeteredCheckpointer(InMemoryCheckpointer())
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            wrapped.await_events_after("t", 0, 10, timedelta(seconds=60))
        except ProcessingError as error:
            errors.append(error)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    threading.Timer(0.05, wrapped.close).start()
    waiter.join(30)
    assert not waiter.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])


def test_wrappers_sharing_a_meter_add_up():
    meter = InMemoryMeter()
    one = MeteredCheckpointer(InMemoryCheckpointer(), meter)
    two = MeteredCheckpointer(InMemoryCheckpointer(), meter)
    one.latest("t")
    two.latest("t")
    two.latest("u")
    assert meter.snapshot().counter(CALLS, op="latest") == 3


# -- a meter that fails --------------------------------------------------------------------------------------------


class BrokenSeries:
    def add(self, amount=1):
        raise RuntimeError("exporter down")

    def observe(self, value):
        raise RuntimeError("exporter down")


class BrokenMeter(Meter):
    """Binds series fine, but every recording raises (an exporter that went away)."""

    def counter(self, name, labels=()):
        return BrokenSeries()

    def histogram(self, name, labels=()):
        return BrokenSeries()


def test_a_failing_meter_never_changes_a_calls_outcome(clock: ManualClock):
    wrapped = MeteredCheckpointer(InMemoryCheckpointer(clock), BrokenMeter())
    with structlog.testing.capture_logs() as logs:
        claim = wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        records = wrapped.commit("t", Commit(token=claim.token, events=(draft(),)))
        with pytest.raises(ThreadBusy):
            wrapped.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        assert wrapped.await_events_after("t", 0, 10, timedelta(0))[0].seq == records[0].seq
    assert [r.seq for r in records] == [1]
    assert wrapped.meter_failures >= 4
    failed = [entry for entry in logs if entry["event"] == "metrics.failed"]
    assert len(failed) == 1  # logged once, counted always
    assert failed[0]["log_level"] == "warning" and "exporter down" in failed[0]["error"]


def test_every_queue_call_is_metered_with_its_outcome(store: MeteredCheckpointer, clock: ManualClock):
    from threadloom import EntryStatus, StaleLease
    from threadloom.persistence.metrics.metered_queue import QUEUE_METRICS
    from threadloom.persistence.queue import QUEUE_OPERATIONS, cancel_entry

    queue = store.queue
    assert queue is not None and queue.inner is store.inner.queue
    assert queue.lease("w", TTL) is None
    a = queue.enqueue("t1", graph_id="g")
    b = queue.enqueue("t2", graph_id="g")
    lease = queue.lease("w", TTL)
    queue.renew_lease(a.entry_id, lease.attempt, TTL)
    queue.record_run(a.entry_id, lease.attempt, "r1")
    queue.finish(a.entry_id, lease.attempt)
    with pytest.raises(StaleLease):
        queue.finish(a.entry_id, lease.attempt, status=EntryStatus.FAILED)
    short = queue.lease("w", timedelta(seconds=1))
    clock.advance(timedelta(seconds=2))
    assert cancel_entry(queue, b.entry_id, holder="op").status is EntryStatus.FAILED  # took the expired lease over
    queue.release_lease(b.entry_id, short.attempt)
    queue.entry(a.entry_id)
    queue.entries(limit=5)
    queue.open_runs(["t1"])
    assert queue.retry(a.entry_id) is None  # completed: not retried, nothing enqueued
    assert queue.depth().open == 0
    clock.advance(timedelta(hours=1))
    assert queue.purge(timedelta(minutes=1)).purged == (a.entry_id, b.entry_id)
    s = snap(store)
    for op in QUEUE_OPERATIONS:
        assert s.counter("threadloom_queue_calls_total", op=op) >= 1, op
        assert s.histogram("threadloom_queue_call_seconds", op=op).count >= 1, op
    assert s.counter("threadloom_queue_calls_total", op="finish") == 3
    assert s.counter("threadloom_queue_errors_total", op="finish", error="StaleLease") == 1
    assert s.counter("threadloom_queue_leases_total", outcome="none") == 1
    assert s.counter("threadloom_queue_leases_total", outcome="granted") == 2
    assert s.counter("threadloom_queue_leases_total", outcome="taken_over") == 1
    assert s.counter("threadloom_queue_finished_total", status="completed") == 1
    assert s.counter("threadloom_queue_finished_total", status="failed") == 1
    assert s.counter("threadloom_queue_purged_total") == 2
    assert s.counter(CALLS) == 0  # queue calls are not counted as store calls
    assert {spec.name for spec in QUEUE_METRICS} >= {"threadloom_queue_calls_total", "threadloom_queue_purged_total"}


# -- the in-memory meter -------------------------------------------------------------------------------------------


def test_in_memory_meter_is_thread_safe():
    meter = InMemoryMeter()
    labels = (("op", "x"),)

    def hammer() -> None:
        for _ in range(2000):
            meter.add("n_total", 1, labels)
            meter.observe("h_seconds", 0.001, labels)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    s = meter.snapshot()
    assert s.counter("n_total", op="x") == 16000
    histogram = s.histogram("h_seconds", op="x")
    assert histogram.count == 16000 and histogram.buckets[-1] == (float("inf"), 16000)
    assert histogram.sum == pytest.approx(16.0)


def test_histogram_buckets_are_cumulative_with_inclusive_upper_bounds():
    from threadloom.persistence.metrics.meter import MetricSpec

    meter = InMemoryMeter()
    meter.describe(MetricSpec(name="size", kind="histogram", help="sizes", buckets=(1, 5, 10)))
    for value in (0.5, 1, 3, 5, 7, 11, 100):
        meter.observe("size", value)
    h = meter.snapshot().histogram("size")
    assert h.count == 7 and h.sum == pytest.approx(127.5)
    assert h.buckets == ((1, 2), (5, 4), (10, 5), (float("inf"), 7))


def test_snapshot_is_plain_data_a_copy_and_label_order_does_not_matter():
    meter = InMemoryMeter()
    meter.add("e_total", 2, (("op", "commit"), ("error", "X")))
    meter.add("e_total", 1, (("error", "X"), ("op", "commit")))
    meter.observe("lat_seconds", 0.002, (("op", "commit"),))
    s = meter.snapshot()
    assert s.counters == {("e_total", (("error", "X"), ("op", "commit"))): 3}
    meter.add("e_total", 10, (("error", "X"), ("op", "commit")))
    assert s.counter("e_total") == 3  # the snapshot did not change
    assert meter.snapshot().counter("e_total", op="commit") == 13
    assert s.counter("missing_total") == 0 and s.histogram("missing") is None
    data = json.loads(json.dumps(s.to_dict()))
    assert data["counters"] == [{"name": "e_total", "labels": {"error": "X", "op": "commit"}, "value": 3}]
    assert data["histograms"][0]["count"] == 1 and data["histograms"][0]["buckets"][-1] == ["+Inf", 1]
    meter.reset()
    assert meter.snapshot().counters == {}


def test_describe_refuses_a_conflicting_spec():
    from threadloom.persistence.metrics.meter import MetricSpec

    meter = InMemoryMeter()
    meter.describe(MetricSpec(name="x_total", kind="counter", help="x"))
    meter.describe(MetricSpec(name="x_total", kind="counter", help="x"))
    with pytest.raises(ValidationError):
        meter.describe(MetricSpec(name="x_total", kind="histogram", help="x"))
    with pytest.raises(ValidationError) as caught:
        MetricSpec(name="y", kind="summary", help="y")  # type: ignore[arg-type]
    assert caught.value.field == "spec.kind"
    with pytest.raises(ValidationError):  # a name is one kind
        meter.gauge("x_total")
    with pytest.raises(ValidationError):
        MetricSpec(name="y", kind="histogram", help="y", buckets=(5, 1))


def test_a_timer_counts_and_observes_together_and_quantiles_are_bucket_bounds():
    meter = InMemoryMeter()
    timer = meter.timer("jobs_total", "job_seconds", (("queue", "a"),))
    for seconds in (0.0002, 0.0002, 0.003, 0.2):
        timer.record(seconds)
    s = meter.snapshot()
    assert s.counter("jobs_total", queue="a") == 4
    h = s.histogram("job_seconds", queue="a")
    assert h.count == 4 and h.mean == pytest.approx(0.2034 / 4)
    assert h.quantile(0.5) == 0.00025 and h.quantile(0.75) == 0.005 and h.quantile(1) == 0.25
    meter.timer("slow_total", "slow_seconds").record(99.0)
    assert meter.snapshot().histogram("slow_seconds").quantile(0.5) == float("inf")
    with pytest.raises(ValidationError):
        h.quantile(0)
    with pytest.raises(ValidationError):
        meter.counter("job_seconds")  # a histogram is not a counter
