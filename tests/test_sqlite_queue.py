"""What is particular to the SQLite run queue (DESIGN §4; ``persistence/sqlite/queue.py``).

The queue contract itself runs over SQLite in ``test_queue_contract.py`` and the worker loop in
``test_runtime_serve.py``; these tests look at what only a file shared by several stores and processes shows:
concurrent leases never grant one entry twice, an expired lease is leased again and fences its old attempt
across stores, a file of the previous schema version migrates forward, the lease is answered through its
partial index at a cost that does not grow with the queue's history, and the queue agrees with the in-memory
reference on random sequences of calls.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

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
    MeteredCheckpointer,
    ProcessingError,
    RetentionPolicy,
    StaleLease,
    SweepPolicy,
    ThreadloomError,
    ValidationError,
)
from threadloom.persistence.sqlite import queue as sqlite_queue
from threadloom.persistence.sqlite import schema as sqlite_schema
from threadloom.persistence.sqlite import store as sqlite_store
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.harness import START
from threadloom.testing.sqlite_harness import VmSteps, query_plan

TTL = timedelta(seconds=30)
HOUR = timedelta(hours=1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "queue.db")


@pytest.fixture
def store(path: str, clock: ManualClock) -> Iterator[SqliteCheckpointer]:
    with SqliteCheckpointer.open(path, clock=clock) as opened:
        yield opened


def raw(path: str) -> sqlite3.Connection:
    """A plain sqlite3 connection to the store's file, outside the store."""
    return sqlite3.connect(path, isolation_level=None, timeout=10)


def _commit_run(store: SqliteCheckpointer, thread_id: str, run_id: str, parent: str | None, n: int) -> list[str]:
    claim = store.claim(thread_id, ClaimRequest(holder=run_id, ttl=TTL))
    ids = []
    for i in range(n):
        cp_id = f"{run_id}:{i}"
        cp = Checkpoint(
            id=cp_id,
            parent=parent,
            thread_id=thread_id,
            run_id=run_id,
            status=CheckpointStatus.RUNNING,
            created_at=START,
        )
        store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        parent = cp_id
        ids.append(cp_id)
    store.release(thread_id, claim.token)
    return ids


# -- several stores, several processes ---------------------------------------------------------------------------


def test_two_stores_leasing_from_many_threads_never_lease_an_entry_twice(path: str, clock: ManualClock) -> None:
    stores = [SqliteCheckpointer.open(path, clock=clock) for _ in range(2)]
    try:
        expected = {stores[0].queue.enqueue(f"t{i % 7}", graph_id="g").entry_id for i in range(120)}
        leased: list[tuple[int, int]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def worker(n: int) -> None:
            queue = stores[n % 2].queue
            try:
                start.wait()
                while True:
                    lease = queue.lease(f"w{n}", HOUR)  # the clock never moves: no lease ever expires
                    if lease is None:
                        with lock:
                            if len(leased) == len(expected):
                                return
                        continue  # entries queued behind a thread's head open up as heads finish
                    with lock:
                        leased.append((lease.entry_id, lease.attempt))
                    queue.record_run(lease.entry_id, lease.attempt, f"run-{n}-{lease.entry_id}")
                    queue.finish(lease.entry_id, lease.attempt)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert sorted(entry_id for entry_id, _attempt in leased) == sorted(expected)
        assert {attempt for _entry_id, attempt in leased} == {1}
        done = stores[1].queue.entries(limit=1000, status=EntryStatus.COMPLETED)
        assert len(done) == len(expected) and all(len(entry.run_ids) == 1 for entry in done)
    finally:
        for store in stores:
            store.close()


WORKER = r"""
import json, sys
from datetime import timedelta
from threadloom import SqliteCheckpointer

job = json.loads(sys.argv[1])
earlier = {int(k): v for k, v in job["earlier"].items()}  # entry -> the entries of its thread enqueued before it
store = SqliteCheckpointer.open(job["path"], busy_timeout=timedelta(seconds=60))
queue = store.queue
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
leased, out_of_order, idle = [], [], 0
while idle < 50:
    lease = queue.lease(job["tag"], timedelta(hours=1))
    if lease is None:
        idle += 1  # entries behind a thread's head open up as other processes finish the head
        continue
    idle = 0
    entry_id = lease.entry_id
    leased.append([entry_id, lease.attempt])
    if any(queue.entry(e).open for e in earlier[entry_id]):
        out_of_order.append(entry_id)
    queue.record_run(entry_id, lease.attempt, "%s-%d" % (job["tag"], entry_id))
    queue.finish(entry_id, lease.attempt)
store.close()
print(json.dumps({"leased": leased, "out_of_order": out_of_order}), flush=True)
"""


@pytest.mark.slow
def test_three_processes_leasing_one_file_never_lease_an_entry_twice(path: str) -> None:
    with SqliteCheckpointer.open(path) as store:
        by_thread: dict[str, list[int]] = {}
        for i in range(90):
            thread_id = f"t{i % 30}"
            by_thread.setdefault(thread_id, []).append(store.queue.enqueue(thread_id, graph_id="g").entry_id)
    earlier = {entry_id: ids[:n] for ids in by_thread.values() for n, entry_id in enumerate(ids)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps({"path": path, "tag": f"p{n}", "earlier": earlier})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready", process.stderr
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = []
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    leased = [tuple(pair) for result in results for pair in result["leased"]]
    assert sorted(entry_id for entry_id, _ in leased) == sorted(earlier)  # each entry once, none lost
    assert {attempt for _, attempt in leased} == {1}
    assert [result["out_of_order"] for result in results] == [[], [], []]
    with SqliteCheckpointer.open(path) as store:
        done = store.queue.entries(limit=1000, status=EntryStatus.COMPLETED)
        assert len(done) == len(earlier)
        owner = {entry_id: f"p{n}" for n, result in enumerate(results) for entry_id, _ in result["leased"]}
        assert all(entry.run_ids == (f"{owner[entry.entry_id]}-{entry.entry_id}",) for entry in done)
        assert store.queue.entries(limit=10, status=EntryStatus.OPEN) == []


CRASHER = r"""
import json, sys, time
from datetime import timedelta
from threadloom import SqliteCheckpointer

store = SqliteCheckpointer.open(sys.argv[1])
lease = store.queue.lease("crasher", timedelta(milliseconds=300))
store.queue.record_run(lease.entry_id, lease.attempt, "crashed-run")
print(json.dumps({"entry_id": lease.entry_id, "attempt": lease.attempt}), flush=True)
time.sleep(600)  # killed here, holding its lease
"""


@pytest.mark.slow
def test_a_lease_held_by_a_killed_process_expires_and_is_leased_again(path: str) -> None:
    with SqliteCheckpointer.open(path) as store:
        entry = store.queue.enqueue("t1", graph_id="g", input={"once": True})
        process = subprocess.Popen(
            [sys.executable, "-c", CRASHER, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line, process.stderr.read() if process.stderr else ""
            crashed = json.loads(line)
        finally:
            process.kill()  # SIGKILL: no release, no close
            process.wait()
        assert crashed == {"entry_id": entry.entry_id, "attempt": 1}
        deadline = time.monotonic() + 30
        lease = None
        while lease is None and time.monotonic() < deadline:
            lease = store.queue.lease("survivor", TTL)
            if lease is None:
                time.sleep(0.02)
        assert lease is not None, "the killed process's lease never expired"
        assert (lease.entry_id, lease.attempt, lease.taken_over_from) == (entry.entry_id, 2, "crasher")
        assert lease.entry.run_ids == ("crashed-run",) and lease.entry.input == {"once": True}
        with pytest.raises(StaleLease):
            store.queue.finish(entry.entry_id, 1)
        assert store.queue.finish(entry.entry_id, lease.attempt).status is EntryStatus.COMPLETED


def test_an_expired_lease_is_leased_again_by_another_store_and_fences_the_old_attempt(
    path: str, clock: ManualClock
) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as first, SqliteCheckpointer.open(path, clock=clock) as second:
        entry = first.queue.enqueue("t1", graph_id="g", input={"n": 1})
        old = first.queue.lease("w1", TTL)
        assert old.attempt == 1
        first.queue.record_run(entry.entry_id, old.attempt, "r1")
        clock.advance(TTL - timedelta(microseconds=1))
        assert second.queue.lease("w2", TTL) is None  # still live, by the store clock
        clock.advance(timedelta(microseconds=1))
        new = second.queue.lease("w2", TTL)
        assert (new.entry_id, new.attempt, new.taken_over_from) == (entry.entry_id, 2, "w1")
        assert new.expires_at == START + TTL * 2 and new.entry.run_ids == ("r1",)
        for call in (
            lambda: first.queue.renew_lease(entry.entry_id, old.attempt, TTL),
            lambda: first.queue.record_run(entry.entry_id, old.attempt, "r-late"),
            lambda: first.queue.finish(entry.entry_id, old.attempt),
        ):
            with pytest.raises(StaleLease) as caught:
                call()
            assert (caught.value.entry_id, caught.value.attempt, caught.value.current) == (entry.entry_id, 1, 2)
        first.queue.release_lease(entry.entry_id, old.attempt)  # stale: changes nothing
        second.queue.record_run(entry.entry_id, new.attempt, "r2")
        done = second.queue.finish(entry.entry_id, new.attempt, status=EntryStatus.FAILED, error="boom")
        assert done.run_ids == ("r1", "r2") and done.error == "boom" and done.attempts == 2
        assert first.queue.entry(entry.entry_id) == done


def test_the_queue_outlives_its_store_and_never_reuses_an_entry_id(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as store:
        ids = [store.queue.enqueue("t1", graph_id="g", input=i).entry_id for i in range(3)]
        lease = store.queue.lease("w", TTL)
    raw(path).execute("DELETE FROM run_queue WHERE entry_id = ?", (ids[-1],))  # the newest row gone
    with SqliteCheckpointer.open(path, clock=clock) as store:
        assert store.queue.entry(ids[0]).leased_by == "w"
        assert store.queue.renew_lease(ids[0], lease.attempt, TTL).attempt == 1
        assert store.queue.enqueue("t2", graph_id="g").entry_id > ids[-1]


# -- the schema and its migration ----------------------------------------------------------------------------------


def _tables(path: str) -> set[str]:
    return {name for (name,) in raw(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_file_of_the_previous_schema_version_migrates_forward(
    path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sqlite_store.SCHEMA_VERSION == 10 and sqlite_store.MIGRATIONS[1] is sqlite_queue.QUEUE_MIGRATION
    # This code as it was before the queue: schema version 1 (with version 3's claim column, version 5's access
    # stamp columns, version 7's metadata column and version 8's stamp column while it writes, which this code
    # needs, then dropped: the file is then as version 1 left it).
    stamp_columns = tuple(step for step in sqlite_schema.MIGRATIONS[4] if step.startswith("ALTER TABLE"))
    stamp_columns += sqlite_schema.MIGRATIONS[6]
    stamp_columns += tuple(step for step in sqlite_schema.MIGRATIONS[7] if step.startswith("ALTER TABLE"))
    with monkeypatch.context() as patch:
        patch.setattr(
            sqlite_schema, "MIGRATIONS", (sqlite_schema.MIGRATIONS[0] + sqlite_schema.MIGRATIONS[2] + stamp_columns,)
        )
        patch.setattr(sqlite_schema, "SCHEMA_VERSION", 1)
        with SqliteCheckpointer.open(path, clock=clock) as old:
            r1 = _commit_run(old, "t1", "r1", None, 2)
            later = _commit_run(old, "t1", "r2", r1[-1], 2)
    raw(path).execute("ALTER TABLE threads DROP COLUMN claim_stamped")
    for step in stamp_columns:
        raw(path).execute(step.replace("ADD COLUMN", "DROP COLUMN").removesuffix(" TEXT").removesuffix(" INTEGER"))
    assert "run_queue" not in _tables(path)
    assert raw(path).execute("SELECT max(version) FROM schema_version").fetchone() == (1,)

    clock.advance(timedelta(seconds=1))
    opened: list[SqliteCheckpointer] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(SqliteCheckpointer.open(path, clock=clock))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=open_one) for _ in range(4)]  # several openers migrate it once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    try:
        rows = raw(path).execute("SELECT version, applied_at FROM schema_version ORDER BY version").fetchall()
        now_us = sqlite_store.codec.to_micros(clock.now())
        assert rows == [(1, sqlite_store.codec.to_micros(START)), (2, now_us), (3, now_us), (4, now_us), (5, now_us),
                        (6, now_us), (7, now_us), (8, now_us), (9, now_us), (10, now_us)]
        assert {"run_queue", "run_queue_runs"} <= _tables(path)
        store = opened[0]
        assert [cp.id for cp in store.history("t1", limit=10)] == list(reversed(r1 + later))
        entry = store.queue.enqueue("t1", graph_id="g")
        lease = opened[1].queue.lease("w", TTL)
        assert lease.entry_id == entry.entry_id
        opened[2].queue.record_run(entry.entry_id, lease.attempt, "r1")
        store.prune("t1", RetentionPolicy(max_checkpoints=1))
        assert [cp.id for cp in store.history("t1", limit=10)] == [later[-1], r1[-1]]
    finally:
        for each in opened:
            each.close()


def test_a_file_of_version_3_migrates_its_open_entries_to_refunds(
    path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:  # the code before refunds: version 3, no refunded column
        patch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:3])
        patch.setattr(sqlite_schema, "SCHEMA_VERSION", 3)
        SqliteCheckpointer.open(path, clock=clock).close()
    conn = raw(path)
    conn.execute(
        "INSERT INTO run_queue (thread_id, graph_id, input, status, thread_head, attempts, available_at,"
        " enqueued_at) VALUES ('t1', 'g', 'null', 'open', 1, 2, 0, 0)"
    )
    conn.commit()
    with SqliteCheckpointer.open(path, clock=clock) as store:
        assert raw(path).execute("SELECT max(version) FROM schema_version").fetchone() == (10,)
        (entry,) = store.queue.entries()
        assert (entry.attempts, entry.refunded, entry.counted_attempts) == (2, 0, 2)
        lease = store.queue.lease("w", TTL)
        store.queue.release_lease(entry.entry_id, lease.attempt, refund=True)
        assert store.queue.entry(entry.entry_id).counted_attempts == 2


def test_a_file_of_version_9_migrates_its_failed_entries_to_retriable_once(
    path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:  # the code before retries were recorded: version 9, no retried_as
        patch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:9])
        patch.setattr(sqlite_schema, "SCHEMA_VERSION", 9)
        SqliteCheckpointer.open(path, clock=clock).close()
    conn = raw(path)
    conn.execute(
        "INSERT INTO run_queue (thread_id, graph_id, input, status, thread_head, attempts, available_at,"
        " enqueued_at, finished_at, error) VALUES ('t1', 'g', '{\"n\": 1}', 'failed', 0, 1, 0, 0, 0, 'boom')"
    )
    conn.commit()
    with SqliteCheckpointer.open(path, clock=clock) as store:
        assert raw(path).execute("SELECT max(version) FROM schema_version").fetchone() == (10,)
        (failed,) = store.queue.entries()
        assert failed.status is EntryStatus.FAILED and failed.retried_as is None
        new = store.queue.retry(failed.entry_id)
        assert new is not None and new.input == {"n": 1}
        assert store.queue.retry(failed.entry_id) is None
        assert store.queue.entry(failed.entry_id).retried_as == new.entry_id


def test_a_file_of_the_queue_version_is_refused_by_the_previous_code(
    path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    SqliteCheckpointer.open(path, clock=clock).close()
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:1])
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", 1)
    with pytest.raises(ProcessingError, match="newer"):
        SqliteCheckpointer.open(path, clock=clock)


# -- query plans and costs -----------------------------------------------------------------------------------------


def test_the_lease_query_reads_the_partial_index_alone(path: str, store: SqliteCheckpointer) -> None:
    conn = raw(path)
    sql = raw(path).execute("SELECT sql FROM sqlite_master WHERE name = 'run_queue_leasable'").fetchone()[0]
    assert sql.endswith("WHERE status = 'open' AND thread_head = 1")
    for name in ("_SQL_Q_NEXT", "_SQL_Q_NEXT_OF"):
        plan = query_plan(conn, sqlite_queue.STATEMENTS[name])
        assert plan[0] == "SCAN run_queue USING COVERING INDEX run_queue_leasable", plan
        assert not any("TEMP B-TREE" in line for line in plan), plan


def test_every_queue_statement_is_answered_through_an_index(path: str, store: SqliteCheckpointer) -> None:
    conn = raw(path)
    allowed = re.compile(
        r"^(SEARCH (?!.*\bUSING (TEMP|AUTOMATIC))|SCAN run_queue USING COVERING INDEX run_queue_leasable$"
        r"|(CORRELATED )?SCALAR SUBQUERY|LIST SUBQUERY|SCAN (j|json_each) VIRTUAL TABLE)"
    )
    statements = sqlite_queue.STATEMENTS
    assert len(statements) >= 18
    plans = {name: query_plan(conn, sql) for name, sql in statements.items()}
    bad = {name: plan for name, plan in plans.items() if any(not allowed.match(line) for line in plan)}
    assert not bad, bad
    expected = {
        "_SQL_Q_ENQUEUE": "run_queue_thread (thread_id=?)",
        "_SQL_Q_NEXT_HEAD": "run_queue_thread (thread_id=?)",
        "_SQL_Q_ENTRIES_OF": "run_queue_status (status=? AND entry_id>?)",
        "_SQL_Q_OPEN_RUNS": "run_queue_thread (thread_id=?)",
        "_SQL_Q_HAS_RUN": "run_queue_runs_run (entry_id=? AND run_id=?)",
        "_SQL_Q_DEPTH": "COVERING INDEX run_queue_status (status=?)",
    }
    for name, fragment in expected.items():
        assert any(fragment in line for line in query_plan(conn, statements[name])), (name, query_plan(conn, statements[name]))


def test_a_lease_costs_the_same_behind_a_long_history_and_a_long_thread_backlog(
    store: SqliteCheckpointer, clock: ManualClock
) -> None:
    queue = store.queue
    steps = VmSteps(store)

    def lease_cost() -> int:
        entry = queue.enqueue("fresh", graph_id="g")
        cost = steps(lambda: queue.lease("w", TTL))
        lease_now = queue.entry(entry.entry_id)
        assert lease_now.attempts == 1
        queue.finish(entry.entry_id, 1)
        return cost

    small = lease_cost()
    for _ in range(300):  # finished entries
        entry = queue.enqueue("old", graph_id="g")
        queue.finish(entry.entry_id, queue.lease("w", TTL).attempt)
    head = queue.enqueue("busy", graph_id="g")
    queue.lease("w", HOUR)  # a live head ...
    for _ in range(300):  # ... with a long backlog of its thread queued behind it
        queue.enqueue("busy", graph_id="g")
    large = lease_cost()
    assert queue.entry(head.entry_id).attempts == 1
    assert large <= small * 1.2 + 20, (small, large)


# -- the retention the queue protects, through every store over the file --------------------------------------


def test_prune_and_sweep_keep_what_an_entry_of_another_store_recorded(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as worker, SqliteCheckpointer.open(path, clock=clock) as ops:
        entry = worker.queue.enqueue("t1", graph_id="g")
        lease = worker.queue.lease("w", TTL)
        worker.queue.record_run(entry.entry_id, lease.attempt, "r1")
        r1 = _commit_run(worker, "t1", "r1", None, 3)
        later = _commit_run(worker, "t1", "r2", r1[-1], 3)
        ops.prune("t1", RetentionPolicy(max_checkpoints=1))
        assert [cp.id for cp in ops.history("t1", limit=10)] == [later[-1], r1[-1]]
        guard_answers = []
        probe = SqliteCheckpointer.open(path, clock=clock, busy_timeout=timedelta(milliseconds=200))

        class Guard:
            def protected(self, thread_ids):
                # Asked outside the sweep's write transaction: a write to the file from here goes through.
                probe.queue.enqueue("guard-probe", graph_id="g")
                guard_answers.append(tuple(thread_ids))
                return {}

        page = ops.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), Guard())
        assert guard_answers == [("t1",)] and page.pruned == ()
        assert worker.lookup_run("t1", ["r1"]).id == r1[-1]
        worker.queue.finish(entry.entry_id, lease.attempt)
        assert ops.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), Guard()).pruned == ("t1",)
        assert [cp.id for cp in worker.history("t1", limit=10)] == [later[-1]]
        probe.close()


def test_a_metered_sqlite_store_serves_its_queue(path: str, clock: ManualClock) -> None:
    inner = SqliteCheckpointer.open(path, clock=clock)
    with MeteredCheckpointer(inner) as metered:
        assert metered.queue.inner is inner.queue  # metered into the wrapper's meter
        entry = metered.queue.enqueue("t1", graph_id="g")
        lease = metered.queue.lease("w", TTL)
        metered.queue.record_run(entry.entry_id, lease.attempt, "r1")
        r1 = _commit_run(metered, "t1", "r1", None, 2)
        _commit_run(metered, "t1", "r2", r1[-1], 2)
        metered.prune("t1", RetentionPolicy(max_checkpoints=1))
        assert metered.lookup_run("t1", ["r1"]).id == r1[-1]
        snapshot = metered.meter.snapshot()
        assert snapshot.counter("threadloom_queue_calls_total") == 3
        assert snapshot.counter("threadloom_queue_leases_total", outcome="granted") == 1
    inner.close()
    assert inner.queue.closed


# -- errors ----------------------------------------------------------------------------------------------------------


def test_a_writer_holding_the_file_makes_a_lease_a_processing_error(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock, busy_timeout=timedelta(milliseconds=50)) as store:
        entry = store.queue.enqueue("t1", graph_id="g")
        blocker = raw(path)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(ProcessingError) as caught:
                store.queue.lease("w", TTL)
            assert caught.value.operation == "lease" and "busy timeout" in caught.value.message
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        finally:
            blocker.execute("ROLLBACK")
        assert store.queue.entry(entry.entry_id).attempts == 0  # nothing was leased
        assert store.queue.lease("w", TTL).attempt == 1


def test_a_damaged_entry_is_a_processing_error_naming_its_thread(path: str, store: SqliteCheckpointer) -> None:
    entry = store.queue.enqueue("t-damaged", graph_id="g")
    raw(path).execute("UPDATE run_queue SET input = '{' WHERE entry_id = ?", (entry.entry_id,))
    with pytest.raises(ProcessingError) as caught:
        store.queue.entry(entry.entry_id)
    assert caught.value.operation == "decode" and "t-damaged" in caught.value.message


def test_a_delay_past_the_largest_time_is_a_validation_error_and_writes_nothing(store: SqliteCheckpointer) -> None:
    with pytest.raises(ValidationError) as caught:
        store.queue.enqueue("t1", graph_id="g", delay=timedelta(days=3_000_000))
    assert caught.value.field == "delay"
    assert store.queue.entries(limit=10) == []


# -- the reference: random calls agree with the in-memory queue ------------------------------------------------------


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except ThreadloomError as error:
        return ("error", type(error).__name__, attrs.asdict(error) if attrs.has(type(error)) else str(error))


def _call(queue: Any, kind: str, a: dict[str, Any]) -> Any:
    """One queue call of the random test, with the arguments drawn in ``a``."""
    if kind == "enqueue":
        return queue.enqueue(a["thread_id"], graph_id=a["kind"], input={"step": a["step"]}, delay=a["delay"])
    if kind == "lease":
        return queue.lease(f"w{a['step'] % 3}", TTL)
    if kind == "lease_of":
        return queue.lease("w", TTL, graph_ids=[a["kind"]])
    if kind == "renew":
        return queue.renew_lease(a["entry_id"], a["attempt"], TTL)
    if kind == "record":
        return queue.record_run(a["entry_id"], a["attempt"], a["run_id"])
    if kind == "finish":
        return queue.finish(a["entry_id"], a["attempt"])
    if kind == "fail":
        return queue.finish(a["entry_id"], a["attempt"], status=EntryStatus.FAILED, error="e")
    if kind == "release":
        return queue.release_lease(a["entry_id"], a["attempt"], delay=a["delay"])
    if kind == "entries":
        return queue.entries(limit=5, after=a["entry_id"] - 1, status=a["status"])
    assert kind == "open_runs"
    return queue.open_runs(["t1", "t2", "t3", "t4"])


KINDS = ["enqueue", "enqueue", "lease", "lease", "lease_of", "renew", "record", "finish", "fail", "release", "tick",
         "entries", "open_runs"]  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_random_calls_agree_with_the_in_memory_reference(path: str, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(START)
    memory = InMemoryCheckpointer(clock)
    stores = [SqliteCheckpointer.open(path, clock=clock) for _ in range(2)]
    try:
        granted: list[tuple[int, int]] = []  # leases the reference granted: most fenced calls use one
        for step in range(300):
            if granted and rng.random() < 0.75:
                entry_id, attempt = rng.choice(granted[-4:])
            else:
                entry_id, attempt = rng.randint(1, 12), rng.randint(1, 4)
            kind = rng.choice(KINDS)
            if kind == "tick":
                clock.advance(timedelta(seconds=rng.choice([1, 5, 30, 31])))
                continue
            a = {
                "step": step,
                "entry_id": entry_id,
                "attempt": attempt,
                "thread_id": f"t{rng.randint(1, 4)}",
                "kind": rng.choice(["a", "b"]),
                "delay": timedelta(seconds=rng.choice([0, 0, 2])),
                "run_id": f"r{rng.randint(1, 3)}",
                "status": rng.choice([None, EntryStatus.OPEN, EntryStatus.COMPLETED]),
            }
            expected = _outcome(lambda: _call(memory.queue, kind, a))  # noqa: B023 - called at once
            got = _outcome(lambda: _call(stores[step % 2].queue, kind, a))  # noqa: B023 - called at once
            assert got == expected, (seed, step, kind)
            if expected[0] == "ok" and kind.startswith("lease") and expected[1] is not None:
                granted.append((expected[1].entry_id, expected[1].attempt))
        assert stores[0].queue.entries(limit=1000) == memory.queue.entries(limit=1000)
    finally:
        for store in stores:
            store.close()
