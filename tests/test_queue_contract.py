"""The run-queue contract (DESIGN §4; ``persistence/queue.py`` rules 1-5) over every store that has a queue.

Each backend builds a store over fresh storage; a store without ``store.queue`` yet is skipped with the reason
shown. Memory and SQLite take a ManualClock; PostgreSQL's database decides time (``QueueEnv.database_clock``), so
time-dependent cases use durations made of ``env.tick``, wait in real time, and check a time the store returns
between two readings of the store's clock taken around the call (equal readings for a ManualClock: an exact
check there). The retention tests check that ``prune`` and ``sweep`` keep the newest checkpoint of every run an
open entry records, and stop keeping it once the entry is finished.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import attrs
import pytest

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EntryStatus,
    InMemoryCheckpointer,
    ManualClock,
    ProcessingError,
    PurgePage,
    RetentionPolicy,
    RunQueue,
    StaleLease,
    SweepPolicy,
    ValidationError,
)
from threadloom.domain.access import WALK_GRAPH_ID
from threadloom.persistence.forwarding import ForwardingCheckpointer, ForwardingRunQueue
from threadloom.persistence.queue import cancel_entry, queue_of
from threadloom.testing.harness import START

TTL = timedelta(seconds=30)
"""A lease that stays live for the whole test (also in real time)."""


@attrs.define
class QueueEnv:
    """One store with a queue, and how the test reads and moves the store's clock.

    Attributes:
        database_clock: True when the store reads the database's clock: :meth:`advance` then waits in real time.
        tick: the unit of the durations whose expiry a test waits for.
    """

    store: object
    clock: ManualClock | None
    database_clock: bool = False
    tick: timedelta = timedelta(seconds=1)
    server_now: object = None  # () -> datetime: the database's clock

    @property
    def queue(self) -> RunQueue:
        return self.store.queue

    def now(self) -> datetime:
        """The store's clock now."""
        return self.server_now() if self.database_clock else self.clock.now()

    def advance(self, delta: timedelta) -> None:
        """Moves the store's clock forward by ``delta`` (a real wait for a database clock)."""
        if self.database_clock:
            time.sleep(delta.total_seconds())
        else:
            self.clock.advance(delta)

    def unpack(self) -> tuple[object, RunQueue, QueueEnv]:
        return self.store, self.queue, self


def _memory(tmp_path, request):
    clock = ManualClock(START)
    return QueueEnv(InMemoryCheckpointer(clock), clock)


class _ForwardedQueue(ForwardingCheckpointer):
    """A bare wrapper whose run queue is a bare ForwardingRunQueue over the inner store's."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self._queue = ForwardingRunQueue(inner.queue)

    @property
    def queue(self) -> RunQueue:  # type: ignore[override]
        return self._queue


def _forwarding_memory(tmp_path, request):
    clock = ManualClock(START)
    return QueueEnv(_ForwardedQueue(InMemoryCheckpointer(clock)), clock)


def _sqlite(tmp_path, request):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    clock = ManualClock(START)
    return QueueEnv(SqliteCheckpointer.open(str(tmp_path / "queue.db"), clock=clock), clock)


def _postgres(tmp_path, request):
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()  # skips loudly without a server (fails under CI=true)
    request.addfinalizer(harness.cleanup)
    store = harness.open()

    def server_now() -> datetime:
        import psycopg

        with psycopg.connect(harness.dsn, autocommit=True, connect_timeout=5) as conn:
            return conn.execute("SELECT clock_timestamp()").fetchone()[0]

    return QueueEnv(store, None, database_clock=True, tick=timedelta(milliseconds=200), server_now=server_now)


@pytest.fixture(
    params=[_memory, _forwarding_memory, _sqlite, pytest.param(_postgres, marks=pytest.mark.postgres)],
    ids=["memory", "forwarding-memory", "sqlite", "postgres"],
)
def env(request, tmp_path):
    """``(store, queue, env)``: the tests call the third ``clock`` (its ``now``, ``advance`` and ``tick``)."""
    made = request.param(tmp_path, request)
    store = made.store
    if not isinstance(getattr(store, "queue", None), RunQueue):
        store.close()
        pytest.skip(f"{type(store).__name__} has no run queue yet (store.queue)")
    yield made.unpack()
    store.close()


def _commit_run(store, thread_id, run_id, parent, n):
    """Commits ``n`` RUNNING checkpoints of ``run_id`` on the thread (claiming and releasing it)."""
    claim = store.claim(thread_id, ClaimRequest(holder=run_id, ttl=TTL))
    ids = []
    for i in range(n):
        cp_id = f"{run_id}:{i}"
        store.commit(
            thread_id,
            Commit(
                token=claim.token,
                checkpoint=Checkpoint(
                    id=cp_id,
                    parent=parent,
                    thread_id=thread_id,
                    run_id=run_id,
                    status=CheckpointStatus.RUNNING,
                    created_at=START,
                ),
            ),
        )
        parent = cp_id
        ids.append(cp_id)
    store.release(thread_id, claim.token)
    return ids


# -- entries ------------------------------------------------------------------------------------------------------


def test_enqueue_numbers_entries_in_order_and_keeps_the_input(env):
    store, queue, clock = env
    payload = {"q": [1, 2, {"x": None}]}
    before = clock.now()
    first = queue.enqueue("t1", graph_id="g", input=payload, tenant_id="acme")
    after = clock.now()
    payload["q"].append(99)  # the stored input is not aliased
    second = queue.enqueue("t2", graph_id="g")
    assert first.entry_id < second.entry_id
    assert first.status is EntryStatus.OPEN and first.open
    assert first.attempts == 0 and first.run_ids == () and first.leased_by is None
    assert first.enqueued_at == first.available_at
    assert before <= first.enqueued_at <= after  # the store's clock: exactly START for a ManualClock
    got = queue.entry(first.entry_id)
    assert got.input == {"q": [1, 2, {"x": None}]}
    assert got.tenant_id == "acme" and got.graph_id == "g" and got.thread_id == "t1"
    got.input["q"].append(5)
    assert queue.entry(first.entry_id).input == {"q": [1, 2, {"x": None}]}
    assert queue.entry(10_000) is None
    assert queue_of(store) is queue


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda q: q.enqueue("", graph_id="g"), "thread_id"),
        (lambda q: q.enqueue("t", graph_id="g", input={"x": float("nan")}), "input"),
        (lambda q: q.enqueue("t", graph_id="g", input={1: 2}), "input"),
        (lambda q: q.enqueue("t", graph_id="g", delay=timedelta(seconds=-1)), "delay"),
        (lambda q: q.enqueue("t", graph_id=WALK_GRAPH_ID), "graph_id"),  # reserved for the walks
        (lambda q: q.lease("w", timedelta(0)), "ttl"),
        (lambda q: q.lease("w", TTL, graph_ids=[]), "graph_ids"),
        (lambda q: q.lease("w", TTL, graph_ids="g"), "graph_ids"),
        (lambda q: q.renew_lease(0, 1, TTL), "entry_id"),
        (lambda q: q.record_run(1, 0, "r"), "attempt"),
        (lambda q: q.finish(1, 1, status=EntryStatus.OPEN), "status"),
        (lambda q: q.finish(1, 1, error="bad\x00"), "error"),
        (lambda q: q.entries(limit=0), "limit"),
        (lambda q: q.release_lease(1, 1, refund=1), "refund"),
        (lambda q: q.open_runs("t1"), "thread_ids"),
        (lambda q: q.take_lease(0, "w", TTL), "entry_id"),
        (lambda q: q.take_lease(1, "", TTL), "holder"),
        (lambda q: q.take_lease(1, "w", timedelta(0)), "ttl"),
        (lambda q: q.take_lease(1, "w", TTL, force="yes"), "force"),
        (lambda q: q.purge(timedelta(0)), "older_than"),
        (lambda q: q.purge(TTL, limit=0), "limit"),
        (lambda q: q.purge(TTL, after=-1), "after"),
    ],
)
def test_bad_input_is_a_validation_error_naming_the_field(env, call, field):
    store, queue, _clock = env
    with pytest.raises(ValidationError) as caught:
        call(queue)
    assert caught.value.field == field
    assert queue.entries(limit=10) == []


def test_a_closed_store_refuses_queue_calls(env):
    store, queue, _clock = env
    entry = queue.enqueue("t1", graph_id="g")
    store.close()
    assert queue.closed
    with pytest.raises(ProcessingError, match="closed"):
        queue.lease("w", TTL)
    with pytest.raises(ProcessingError, match="closed"):
        queue.entry(entry.entry_id)


# -- leases -------------------------------------------------------------------------------------------------------


def test_lease_grants_the_oldest_available_entry_and_numbers_attempts(env):
    store, queue, clock = env
    assert queue.lease("w1", TTL) is None
    a = queue.enqueue("t1", graph_id="g")
    b = queue.enqueue("t2", graph_id="g")
    before = clock.now()
    lease = queue.lease("w1", TTL)
    after = clock.now()
    assert lease.entry_id == a.entry_id and lease.attempt == 1 and lease.holder == "w1"
    assert before + TTL <= lease.expires_at <= after + TTL and lease.taken_over_from is None
    assert lease.entry.lease_expires_at == lease.expires_at
    assert lease.entry.leased_by == "w1" and lease.entry.attempts == 1
    second = queue.lease("w2", TTL)
    assert second.entry_id == b.entry_id
    assert queue.lease("w3", TTL) is None  # both live


def test_lease_filters_by_graph_kind(env):
    _store, queue, _clock = env
    queue.enqueue("t1", graph_id="a")
    b = queue.enqueue("t2", graph_id="b")
    lease = queue.lease("w", TTL, graph_ids={"b", "c"})
    assert lease.entry_id == b.entry_id
    assert queue.lease("w", TTL, graph_ids=["c"]) is None


def test_one_thread_runs_its_entries_in_enqueue_order(env):
    _store, queue, _clock = env
    first = queue.enqueue("t1", graph_id="g")
    second = queue.enqueue("t1", graph_id="g")
    other = queue.enqueue("t2", graph_id="g")
    lease = queue.lease("w", TTL)
    assert lease.entry_id == first.entry_id
    assert queue.lease("w", TTL).entry_id == other.entry_id  # t1's second waits for its first
    assert queue.lease("w", TTL) is None
    queue.finish(lease.entry_id, lease.attempt)
    assert queue.lease("w", TTL).entry_id == second.entry_id


def test_delay_keeps_an_entry_back_by_the_store_clock(env):
    _store, queue, clock = env
    delay = clock.tick * 5
    entry = queue.enqueue("t1", graph_id="g", delay=delay)
    assert entry.available_at == entry.enqueued_at + delay
    assert queue.lease("w", TTL) is None
    clock.advance(delay)
    assert queue.lease("w", TTL).entry_id == entry.entry_id


def test_an_expired_lease_is_taken_over_and_fences_its_holder(env):
    _store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    short = clock.tick * 2
    first = queue.lease("w1", short)
    if clock.database_clock:
        assert queue.lease("w2", TTL) is None  # still live
        clock.advance(clock.tick * 3)
    else:
        clock.advance(short - timedelta(microseconds=1))
        assert queue.lease("w2", TTL) is None  # still live
        clock.advance(timedelta(microseconds=1))  # at exactly expires_at it has expired
    second = queue.lease("w2", TTL)
    assert second.entry_id == entry.entry_id and second.attempt == 2 and second.taken_over_from == "w1"
    for call in (
        lambda: queue.renew_lease(entry.entry_id, first.attempt, TTL),
        lambda: queue.record_run(entry.entry_id, first.attempt, "r1"),
        lambda: queue.finish(entry.entry_id, first.attempt),
    ):
        with pytest.raises(StaleLease) as caught:
            call()
        assert (caught.value.entry_id, caught.value.attempt, caught.value.current) == (entry.entry_id, 1, 2)
    queue.release_lease(entry.entry_id, first.attempt)  # a stale release changes nothing
    assert queue.entry(entry.entry_id).leased_by == "w2"


def test_renew_extends_a_lease_even_after_expiry_while_nobody_replaced_it(env):
    _store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    short = clock.tick * 2
    lease = queue.lease("w1", short)
    clock.advance(short * 2)
    before = clock.now()
    renewed = queue.renew_lease(entry.entry_id, lease.attempt, TTL)
    after = clock.now()
    assert before + TTL <= renewed.expires_at <= after + TTL and renewed.attempt == 1
    assert queue.entry(entry.entry_id).lease_expires_at == renewed.expires_at
    assert queue.lease("w2", TTL) is None


def test_record_run_appends_each_run_once(env):
    _store, queue, _clock = env
    entry = queue.enqueue("t1", graph_id="g")
    lease = queue.lease("w", TTL)
    queue.record_run(entry.entry_id, lease.attempt, "r1")
    again = queue.record_run(entry.entry_id, lease.attempt, "r1")
    assert again.run_ids == ("r1",)
    queue.release_lease(entry.entry_id, lease.attempt)
    lease2 = queue.lease("w", TTL)
    assert lease2.attempt == 2 and lease2.taken_over_from is None
    assert queue.record_run(entry.entry_id, lease2.attempt, "r2").run_ids == ("r1", "r2")


def test_finish_closes_the_entry_and_a_retry_by_the_same_attempt_is_quiet(env):
    _store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    short = clock.tick * 2
    lease = queue.lease("w", short)
    clock.advance(clock.tick)
    before = clock.now()
    done = queue.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="boom")
    after = clock.now()
    assert done.status is EntryStatus.FAILED and done.error == "boom" and not done.open
    assert before <= done.finished_at <= after and done.leased_by is None and done.lease_expires_at is None
    assert queue.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="boom") == done
    with pytest.raises(StaleLease):
        queue.finish(entry.entry_id, lease.attempt, status=EntryStatus.COMPLETED)
    clock.advance(short * 2)
    assert queue.lease("w", TTL) is None  # a finished entry never opens again
    assert queue.entries(status=EntryStatus.OPEN) == []
    assert [e.entry_id for e in queue.entries(status=EntryStatus.FAILED)] == [entry.entry_id]


def test_release_hands_the_entry_back_after_its_delay(env):
    _store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    lease = queue.lease("w1", TTL)
    delay = clock.tick * 5
    before = clock.now()
    queue.release_lease(entry.entry_id, lease.attempt, delay=delay)
    after = clock.now()
    released = queue.entry(entry.entry_id)
    assert released.leased_by is None and released.lease_expires_at is None
    assert before + delay <= released.available_at <= after + delay
    with pytest.raises(StaleLease) as caught:
        queue.finish(entry.entry_id, lease.attempt)
    assert caught.value.current is None
    assert queue.lease("w2", TTL) is None
    clock.advance(delay)
    again = queue.lease("w2", TTL)
    assert again.attempt == 2 and again.taken_over_from is None


def test_a_refunded_release_does_not_count_the_lease_as_a_try_and_keeps_the_fence(env):
    _store, queue, _clock = env
    entry = queue.enqueue("t1", graph_id="g")
    assert (entry.refunded, entry.counted_attempts) == (0, 0)
    first = queue.lease("w1", TTL)
    assert (first.entry.attempts, first.entry.counted_attempts) == (1, 1)
    queue.release_lease(entry.entry_id, first.attempt, refund=True)
    refunded = queue.entry(entry.entry_id)
    assert (refunded.attempts, refunded.refunded, refunded.counted_attempts) == (1, 1, 0)
    assert refunded.leased_by is None
    second = queue.lease("w2", TTL)
    # The attempt number never goes back: the refunded lease stays fenced out.
    assert second.attempt == 2 and (second.entry.refunded, second.entry.counted_attempts) == (1, 1)
    queue.release_lease(entry.entry_id, first.attempt, refund=True)  # stale: changes nothing
    with pytest.raises(StaleLease):
        queue.renew_lease(entry.entry_id, first.attempt, TTL)
    assert queue.entry(entry.entry_id).refunded == 1
    queue.release_lease(entry.entry_id, second.attempt)  # a plain release counts the lease
    third = queue.lease("w3", TTL)
    assert (third.attempt, third.entry.refunded, third.entry.counted_attempts) == (3, 1, 2)
    assert queue.entries(limit=10)[0].refunded == 1  # every read carries it
    done = queue.finish(entry.entry_id, third.attempt)
    assert (done.refunded, done.counted_attempts) == (1, 2)


def test_entries_page_by_id(env):
    _store, queue, _clock = env
    ids = [queue.enqueue(f"t{i}", graph_id="g").entry_id for i in range(5)]
    first = queue.entries(limit=2)
    assert [e.entry_id for e in first] == ids[:2]
    rest = queue.entries(limit=10, after=first[-1].entry_id)
    assert [e.entry_id for e in rest] == ids[2:]


def test_depth_counts_open_entries_and_dates_the_oldest_by_the_store_clock(env):
    _store, queue, env = env
    empty = queue.depth()
    assert empty.open == 0 and empty.oldest_enqueued_at is None and empty.oldest_age is None
    a = queue.enqueue("t1", graph_id="g")
    env.advance(env.tick)
    b = queue.enqueue("t2", graph_id="g")
    queue.enqueue("t3", graph_id="g", delay=env.tick * 100)  # waiting for its delay: open all the same
    lease = queue.lease("w", TTL)
    assert lease is not None and lease.entry.entry_id == a.entry_id
    env.advance(env.tick)
    depth = queue.depth()
    assert depth.open == 3  # a leased entry is open until finished
    assert depth.oldest_enqueued_at == a.enqueued_at
    assert depth.oldest_age is not None and depth.oldest_age >= env.tick * 2
    if env.clock is not None:
        assert depth.read_at == env.clock.now() and depth.oldest_age == env.tick * 2
    queue.finish(a.entry_id, lease.attempt)
    after = queue.depth()
    assert after.open == 2 and after.oldest_enqueued_at == b.enqueued_at


def test_open_runs_names_the_runs_of_open_entries_only(env):
    _store, queue, _clock = env
    a = queue.enqueue("t1", graph_id="g")
    b = queue.enqueue("t2", graph_id="g")
    la, lb = queue.lease("w", TTL), queue.lease("w", TTL)
    queue.record_run(a.entry_id, la.attempt, "ra")
    queue.record_run(b.entry_id, lb.attempt, "rb")
    assert queue.open_runs(["t1", "t2", "t3"]) == {"t1": frozenset({"ra"}), "t2": frozenset({"rb"})}
    queue.finish(b.entry_id, lb.attempt)
    assert queue.open_runs(["t1", "t2"]) == {"t1": frozenset({"ra"})}
    assert queue.open_runs([]) == {}


# -- retention (rule 4) -------------------------------------------------------------------------------------------


def test_prune_keeps_the_newest_checkpoint_of_every_run_an_open_entry_names(env):
    store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    lease = queue.lease("w", TTL)
    queue.record_run(entry.entry_id, lease.attempt, "r1")
    r1 = _commit_run(store, "t1", "r1", None, 2)
    later = _commit_run(store, "t1", "r2", r1[-1], 3)
    store.prune("t1", RetentionPolicy(max_checkpoints=1))
    kept = [cp.id for cp in store.history("t1", limit=10)]
    assert kept == [later[-1], r1[-1]]
    assert store.lookup_run("t1", ["r1"]).id == r1[-1]
    queue.finish(entry.entry_id, lease.attempt)
    store.prune("t1", RetentionPolicy(max_checkpoints=1))
    assert [cp.id for cp in store.history("t1", limit=10)] == [later[-1]]
    assert store.lookup_run("t1", ["r1"]) is None


def test_sweep_keeps_them_too_whatever_the_guard_says(env):
    store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    lease = queue.lease("w", TTL)
    queue.record_run(entry.entry_id, lease.attempt, "r1")
    r1 = _commit_run(store, "t1", "r1", None, 2)
    later = _commit_run(store, "t1", "r2", r1[-1], 2)
    _commit_run(store, "t2", "r9", None, 3)
    policy = SweepPolicy(retention=RetentionPolicy(max_checkpoints=1))
    page = store.sweep(policy, None)
    assert set(page.pruned) == {"t1", "t2"}
    assert [cp.id for cp in store.history("t1", limit=10)] == [later[-1], r1[-1]]
    assert len(store.history("t2", limit=10)) == 1
    queue.finish(entry.entry_id, lease.attempt)
    store.sweep(policy, None)
    assert [cp.id for cp in store.history("t1", limit=10)] == [later[-1]]


# -- operators (rule 6) -------------------------------------------------------------------------------------------


def test_take_lease_leases_the_named_entry_and_leaves_a_live_lease_alone_unless_forced(env):
    _store, queue, clock = env
    first = queue.enqueue("t1", graph_id="g")
    behind = queue.enqueue("t1", graph_id="g", delay=clock.tick * 50)  # queued behind t1's head, and delayed
    taken = queue.take_lease(behind.entry_id, "op", TTL)
    assert taken.entry_id == behind.entry_id and taken.attempt == 1 and taken.holder == "op"
    assert taken.taken_over_from is None
    assert queue.take_lease(behind.entry_id, "op2", TTL) is None  # live: left alone
    assert queue.entry(behind.entry_id).leased_by == "op"
    forced = queue.take_lease(behind.entry_id, "op2", TTL, force=True)
    assert forced.attempt == 2 and forced.taken_over_from == "op"
    with pytest.raises(StaleLease):  # the replaced holder is fenced
        queue.renew_lease(behind.entry_id, taken.attempt, TTL)
    assert queue.take_lease(10_000, "op", TTL) is None  # unknown
    lease = queue.lease("w", TTL)
    assert lease.entry_id == first.entry_id
    queue.finish(first.entry_id, lease.attempt)
    assert queue.take_lease(first.entry_id, "op", TTL, force=True) is None  # finished: nothing changes
    assert queue.entry(first.entry_id).status is EntryStatus.COMPLETED


def test_take_lease_replaces_an_expired_lease_without_force(env):
    _store, queue, clock = env
    entry = queue.enqueue("t1", graph_id="g")
    short = clock.tick * 2
    queue.lease("w1", short)
    clock.advance(short * 2 if clock.database_clock else short)
    taken = queue.take_lease(entry.entry_id, "op", TTL)
    assert taken.attempt == 2 and taken.taken_over_from == "w1"


def test_cancel_entry_finishes_it_failed_and_fences_the_worker_when_forced(env):
    _store, queue, _clock = env
    idle = queue.enqueue("t1", graph_id="g")
    done = cancel_entry(queue, idle.entry_id, holder="op", reason="cancelled by op")
    assert done.status is EntryStatus.FAILED and done.error == "cancelled by op" and done.attempts == 1
    busy = queue.enqueue("t2", graph_id="g")
    after_busy = queue.enqueue("t2", graph_id="g")
    lease = queue.lease("w", TTL)
    assert lease.entry_id == busy.entry_id
    assert cancel_entry(queue, busy.entry_id, holder="op") is None  # a live lease: refused, nothing changed
    assert queue.entry(busy.entry_id) == lease.entry
    cancelled = cancel_entry(queue, busy.entry_id, holder="op", force=True)
    assert cancelled.status is EntryStatus.FAILED and cancelled.attempts == 2
    for call in (
        lambda: queue.renew_lease(busy.entry_id, lease.attempt, TTL),
        lambda: queue.record_run(busy.entry_id, lease.attempt, "r"),
        lambda: queue.finish(busy.entry_id, lease.attempt),
    ):
        with pytest.raises(StaleLease):
            call()
    assert queue.lease("w", TTL).entry_id == after_busy.entry_id  # the thread's next entry is its head now
    assert cancel_entry(queue, cancelled.entry_id, holder="op", force=True) is None  # finished already


def test_purge_deletes_finished_entries_old_enough_page_by_page(env):
    _store, queue, clock = env
    entries = [queue.enqueue(f"t{i}", graph_id="g") for i in range(5)]
    for entry in entries[:3]:  # t0..t2 finished (one FAILED), t3 leased, t4 open
        lease = queue.lease("w", TTL)
        queue.record_run(entry.entry_id, lease.attempt, f"r{entry.entry_id}")
        queue.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED if entry is entries[1] else EntryStatus.COMPLETED)
    queue.lease("w", TTL)
    keep = clock.tick * 3
    first = queue.purge(keep, limit=2)  # nothing old enough yet
    assert first.purged == () and first.visited == 2 and first.next == entries[1].entry_id
    assert len(queue.entries(limit=10)) == 5
    clock.advance(keep)
    late = queue.enqueue("t9", graph_id="g")
    lease = queue.lease("w", TTL, graph_ids=["g"])
    assert lease.entry_id == entries[4].entry_id
    lease9 = queue.lease("w", TTL)
    queue.finish(late.entry_id, lease9.attempt)  # finished just now: kept
    page = queue.purge(keep, limit=2)
    assert page.purged == (entries[0].entry_id, entries[1].entry_id) and page.next == entries[1].entry_id
    page = queue.purge(keep, limit=2, after=page.next)
    assert page.purged == (entries[2].entry_id,) and page.visited == 2
    page = queue.purge(keep, limit=2, after=page.next)
    assert page.purged == () and page.visited == 2
    page = queue.purge(keep, limit=2, after=page.next)
    assert page == PurgePage(visited=0, purged=(), next=None)
    assert [e.entry_id for e in queue.entries(limit=10)] == [entries[3].entry_id, entries[4].entry_id, late.entry_id]
    assert queue.entry(entries[0].entry_id) is None
    assert queue.open_runs(["t0", "t3"]) == {}
    again = queue.enqueue("t0", graph_id="g")
    assert again.entry_id > late.entry_id  # ids are never reused


def _failed(queue, thread_id, *, graph_id="g", input=None, tenant_id=None):
    """A new entry of ``thread_id``, leased and finished FAILED."""
    entry = queue.enqueue(thread_id, graph_id=graph_id, input=input, tenant_id=tenant_id)
    lease = queue.lease("w", TTL)
    assert lease.entry_id == entry.entry_id
    queue.record_run(entry.entry_id, lease.attempt, f"r{entry.entry_id}")
    return queue.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="boom")


def test_retry_refuses_an_entry_of_the_walks_reserved_graph_id(env, monkeypatch):
    """An entry enqueued before ``enqueue`` refused the walks' graph id is not enqueued again by a retry (found by
    hostile testing)."""
    _store, queue, _clock = env
    monkeypatch.setattr("threadloom.persistence.queue.WALK_GRAPH_ID", "not-reserved")  # as before the refusal
    failed = _failed(queue, "t1", graph_id=WALK_GRAPH_ID)
    monkeypatch.undo()
    before = queue.entries(limit=10)
    with pytest.raises(ValidationError) as caught:
        queue.retry(failed.entry_id)
    assert caught.value.field == "graph_id"
    assert queue.entries(limit=10) == before


def test_retry_enqueues_a_failed_entry_once_and_names_the_new_entry_on_it(env):
    _store, queue, _clock = env
    failed = _failed(queue, "t1", graph_id="g2", input={"n": [1, 2]}, tenant_id="acme")
    assert failed.retried_as is None
    new = queue.retry(failed.entry_id)
    assert new is not None and new.entry_id > failed.entry_id and new.status is EntryStatus.OPEN
    assert (new.thread_id, new.graph_id, new.input, new.tenant_id) == ("t1", "g2", {"n": [1, 2]}, "acme")
    assert new.attempts == 0 and new.run_ids == () and new.retried_as is None
    assert queue.entry(failed.entry_id).retried_as == new.entry_id
    assert [e.retried_as for e in queue.entries(limit=10, status=EntryStatus.FAILED)] == [new.entry_id]
    before = queue.entries(limit=10)
    assert queue.retry(failed.entry_id) is None  # retried already: nothing written
    assert queue.entries(limit=10) == before
    lease = queue.lease("w", TTL)
    assert lease.entry_id == new.entry_id  # the new entry runs like any other
    queue.finish(new.entry_id, lease.attempt, status=EntryStatus.FAILED, error="again")
    assert queue.retry(new.entry_id).entry_id > new.entry_id  # the retry, failed, is retried once in its turn


def test_retry_refuses_unknown_open_and_completed_entries(env):
    _store, queue, _clock = env
    assert queue.retry(99) is None
    open_entry = queue.enqueue("t1", graph_id="g")
    assert queue.retry(open_entry.entry_id) is None
    lease = queue.lease("w", TTL)
    assert queue.retry(open_entry.entry_id) is None  # leased: still open
    queue.finish(open_entry.entry_id, lease.attempt)
    assert queue.retry(open_entry.entry_id) is None  # completed
    assert [e.entry_id for e in queue.entries(limit=10)] == [open_entry.entry_id]
    with pytest.raises(ValidationError):
        queue.retry(0)


def test_concurrent_retries_of_one_entry_enqueue_exactly_one(env):
    import threading

    _store, queue, _clock = env
    failed = _failed(queue, "t1")
    callers = 8
    barrier = threading.Barrier(callers)
    results: list[object] = []
    errors: list[BaseException] = []

    def retry() -> None:
        barrier.wait()
        try:
            results.append(queue.retry(failed.entry_id))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=retry) for _ in range(callers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    made = [r for r in results if r is not None]
    assert len(made) == 1 and len(results) == callers
    assert [e.entry_id for e in queue.entries(limit=10)] == [failed.entry_id, made[0].entry_id]
    assert queue.entry(failed.entry_id).retried_as == made[0].entry_id
