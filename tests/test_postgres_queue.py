"""What is particular to the PostgreSQL run queue (DESIGN §4; ``persistence/postgres/queue.py``, migration 2: ``0002_run_queue.sql``).

The queue contract itself runs over PostgreSQL in ``test_queue_contract.py`` and the worker loop in
``test_runtime_serve.py``; these tests look at what only a schema shared by several stores and processes shows:
concurrent leases (``FOR UPDATE SKIP LOCKED``) never grant one entry twice, while enqueues and finishes race on the
same threads each thread keeps exactly one head; an expired lease - also one a killed process held - is leased
again with the next attempt and fences the old one; a schema at the previous version migrates forward under the
advisory lock; the lease is answered through its partial index in one round trip; prune and sweep keep open
entries' runs in their own transaction; driver failures surface through the store's one mapping function; and
the queue agrees with the in-memory reference on random sequences of calls.

Everything runs against the real server named by THREADLOOM_TEST_PG (skipped loudly when unreachable, failed
under CI=true).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import psycopg
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
    OutcomeUnknown,
    PostgresCheckpointer,
    ProcessingError,
    QueueEntry,
    RetentionPolicy,
    StaleLease,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
    SweepPolicy,
    ThreadloomError,
    ValidationError,
)
from threadloom.persistence.postgres import schema as postgres_schema
from threadloom.testing.harness import START
from threadloom.testing.postgres_harness import (
    PgCallerPoolHarness,
    PgHarness,
    StallingProxy,
    drop_schema,
    new_schema_name,
)

pytestmark = pytest.mark.postgres

TTL = timedelta(seconds=30)
HOUR = timedelta(hours=1)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def harness() -> Iterator[PgHarness]:
    harness = PgHarness()
    try:
        yield harness
    finally:
        harness.cleanup()


@pytest.fixture
def store(harness: PgHarness) -> PostgresCheckpointer:
    return harness.open()


def raw(harness: PgHarness) -> psycopg.Connection:
    """A plain autocommit connection to the test server, outside the store."""
    return psycopg.connect(harness.dsn, autocommit=True, connect_timeout=5)


def _commit_run(store: Any, thread_id: str, run_id: str, parent: str | None, n: int) -> list[str]:
    claim = store.claim(thread_id, ClaimRequest(holder=run_id, ttl=TTL))
    ids = []
    for i in range(n):
        cp_id = f"{run_id}:{i}"
        cp = Checkpoint(
            id=cp_id, parent=parent, thread_id=thread_id, run_id=run_id, status=CheckpointStatus.RUNNING,
            created_at=NOW,
        )  # fmt: skip
        store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        parent = cp_id
        ids.append(cp_id)
    store.release(thread_id, claim.token)
    return ids


def _heads_are_the_oldest_open_entries(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    """Threads whose open entries do not have exactly one head, their oldest (one consistent snapshot)."""
    return conn.execute(
        f"""SELECT thread_id, count(*) FILTER (WHERE thread_head), min(entry_id),
                   min(entry_id) FILTER (WHERE thread_head)
            FROM "{schema}".run_queue WHERE status = 'open' GROUP BY thread_id
            HAVING count(*) FILTER (WHERE thread_head) <> 1
                OR min(entry_id) <> min(entry_id) FILTER (WHERE thread_head)"""
    ).fetchall()


# -- several stores, several processes ---------------------------------------------------------------------------


def test_two_stores_lease_concurrently_while_enqueues_and_finishes_race_on_the_same_threads(
    harness: PgHarness,
) -> None:
    stores = [harness.open(), harness.sibling()]
    threads = [f"t{i}" for i in range(5)]
    expected: set[int] = {stores[0].queue.enqueue(threads[i % 5], graph_id="g").entry_id for i in range(40)}
    leased: list[tuple[int, int, str]] = []
    errors: list[BaseException] = []
    bad_heads: list[Any] = []
    lock = threading.Lock()
    enqueuing = threading.Event()
    enqueuing.set()
    start = threading.Barrier(9)
    deadline = time.monotonic() + 60

    def enqueuer(n: int) -> None:
        try:
            start.wait()
            for i in range(40):
                entry = stores[n % 2].queue.enqueue(threads[(i + n) % 5], graph_id="g")
                with lock:
                    expected.add(entry.entry_id)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    def worker(n: int) -> None:
        queue = stores[n % 2].queue
        try:
            start.wait()
            while time.monotonic() < deadline:
                lease = queue.lease(f"w{n}", HOUR)  # nothing expires during the test
                if lease is None:
                    with lock:
                        if not enqueuing.is_set() and len(leased) == len(expected):
                            return
                    continue  # entries queued behind a thread's head open up as heads finish
                entry = lease.entry
                with lock:
                    leased.append((entry.entry_id, lease.attempt, entry.thread_id))
                queue.record_run(entry.entry_id, lease.attempt, f"run-{n}-{entry.entry_id}")
                queue.finish(entry.entry_id, lease.attempt)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    def monitor() -> None:
        with raw(harness) as conn:
            start.wait()
            while enqueuing.is_set() or len(leased) < len(expected):
                bad_heads.extend(_heads_are_the_oldest_open_entries(conn, harness.schema))
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)

    enqueuers = [threading.Thread(target=enqueuer, args=(n,)) for n in range(2)]
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    watcher = threading.Thread(target=monitor)
    for thread in [*enqueuers, *workers, watcher]:
        thread.start()
    for thread in enqueuers:
        thread.join(60)
    enqueuing.clear()
    for thread in [*workers, watcher]:
        thread.join(70)
    assert not errors, errors
    assert not bad_heads, bad_heads[:5]
    assert sorted(entry_id for entry_id, _, _ in leased) == sorted(expected)  # each entry once, none stranded
    assert {attempt for _, attempt, _ in leased} == {1}
    for thread_id in threads:  # one thread's entries were leased in enqueue order
        order = [entry_id for entry_id, _, t in leased if t == thread_id]
        assert order == sorted(order), thread_id
    done = stores[1].queue.entries(limit=1000, status=EntryStatus.COMPLETED)
    assert len(done) == len(expected) and all(len(entry.run_ids) == 1 for entry in done)
    assert stores[0].queue.entries(limit=10, status=EntryStatus.OPEN) == []


@pytest.mark.parametrize("first", ["enqueue", "finish"])
def test_an_enqueue_and_a_finish_on_one_thread_wait_for_each_other_so_no_entry_loses_its_turn(
    harness: PgHarness, store: PostgresCheckpointer, first: str
) -> None:
    """One of the two runs in a transaction held open outside the store; the other waits for its thread's lock.

    Without that wait the enqueue would see the old head still open (not a head itself) while the finish would
    not see the new entry (no next head): the entry would never be leased.
    """
    head = store.queue.enqueue("t1", graph_id="g")
    lease = store.queue.lease("w", TTL)
    s = f'"{harness.schema}"'
    outcome: dict[str, Any] = {}
    with raw(harness) as held:
        with held.transaction():
            if first == "enqueue":
                (held_id,) = held.execute(
                    f"SELECT entry_id FROM {s}.tl_q_enqueue('t1', 'g', 'null', NULL, 0)"
                ).fetchone()
                call = lambda: store.queue.finish(head.entry_id, lease.attempt)  # noqa: E731
            else:
                held.execute(f"SELECT code FROM {s}.tl_q_finish(%s, %s, 'completed', NULL)", (head.entry_id, 1))
                call = lambda: store.queue.enqueue("t1", graph_id="g")  # noqa: E731
            thread = threading.Thread(target=lambda: outcome.setdefault("value", call()))
            thread.start()
            thread.join(0.3)
            assert thread.is_alive(), "the call did not wait for the thread's queue lock"
        thread.join(10)
    assert "value" in outcome
    waiting_id = held_id if first == "enqueue" else outcome["value"].entry_id
    with raw(harness) as conn:
        assert _heads_are_the_oldest_open_entries(conn, harness.schema) == []
    assert store.queue.entry(head.entry_id).status is EntryStatus.COMPLETED
    assert store.queue.lease("w", TTL).entry_id == waiting_id


WORKER = textwrap.dedent(
    r"""
    import json, sys, threading
    from datetime import timedelta
    from threadloom import PostgresCheckpointer, PostgresCheckpointerConfig

    job = json.loads(sys.argv[1])
    earlier = {int(k): v for k, v in job["earlier"].items()}  # entry -> the entries of its thread enqueued before
    store = PostgresCheckpointer.open(job["dsn"], PostgresCheckpointerConfig(schema=job["schema"], max_size=3))
    queue = store.queue
    leased, out_of_order, lock = [], [], threading.Lock()
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"

    def work(name):
        idle = 0
        while idle < 200:
            lease = queue.lease(name, timedelta(hours=1))
            if lease is None:
                idle += 1  # entries behind a thread's head open up as other workers finish the head
                continue
            idle = 0
            entry_id = lease.entry_id
            if any(queue.entry(e).open for e in earlier[entry_id]):
                out_of_order.append(entry_id)
            with lock:
                leased.append([entry_id, lease.attempt])
            queue.record_run(entry_id, lease.attempt, "%s-%d" % (name, entry_id))
            queue.finish(entry_id, lease.attempt)

    threads = [threading.Thread(target=work, args=("%s.%d" % (job["tag"], n),)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    print(json.dumps({"leased": leased, "out_of_order": out_of_order}), flush=True)
    """
)


@pytest.mark.slow
def test_two_processes_leasing_one_schema_never_lease_an_entry_twice(harness: PgHarness, store) -> None:
    by_thread: dict[str, list[int]] = {}
    for i in range(90):
        thread_id = f"t{i % 30}"
        by_thread.setdefault(thread_id, []).append(store.queue.enqueue(thread_id, graph_id="g").entry_id)
    earlier = {entry_id: ids[:n] for ids in by_thread.values() for n, entry_id in enumerate(ids)}
    job = {"dsn": harness.dsn, "schema": harness.schema, "earlier": earlier}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps({**job, "tag": f"p{n}"})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for n in range(2)
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready", process.stderr
        for process in processes:  # both start leasing at once
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
    assert [result["out_of_order"] for result in results] == [[], []]
    assert all(result["leased"] for result in results), "both processes leased"
    done = store.queue.entries(limit=1000, status=EntryStatus.COMPLETED)
    assert len(done) == len(earlier)
    owner = {entry_id: f"p{n}" for n, result in enumerate(results) for entry_id, _ in result["leased"]}
    assert all(entry.run_ids[0].startswith(owner[entry.entry_id] + ".") for entry in done)


# -- expiry and fencing -----------------------------------------------------------------------------------------


def test_an_expired_lease_is_leased_again_by_another_store_and_fences_the_old_attempt(harness: PgHarness) -> None:
    first, second = harness.open(), harness.sibling()
    entry = first.queue.enqueue("t1", graph_id="g", input={"n": 1})
    old = first.queue.lease("w1", timedelta(milliseconds=400))
    assert old.attempt == 1
    first.queue.record_run(entry.entry_id, old.attempt, "r1")
    assert second.queue.lease("w2", TTL) is None  # still live, by the database's clock
    time.sleep(0.6)
    new = second.queue.lease("w2", TTL)
    assert (new.entry_id, new.attempt, new.taken_over_from) == (entry.entry_id, 2, "w1")
    assert new.expires_at >= old.expires_at + TTL - timedelta(milliseconds=400) and new.entry.run_ids == ("r1",)
    for call in (
        lambda: first.queue.renew_lease(entry.entry_id, old.attempt, TTL),
        lambda: first.queue.record_run(entry.entry_id, old.attempt, "r-late"),
        lambda: first.queue.finish(entry.entry_id, old.attempt),
    ):
        with pytest.raises(StaleLease) as caught:
            call()
        assert (caught.value.entry_id, caught.value.attempt, caught.value.current) == (entry.entry_id, 1, 2)
    first.queue.release_lease(entry.entry_id, old.attempt)  # stale: changes nothing
    assert second.queue.entry(entry.entry_id).leased_by == "w2"
    second.queue.record_run(entry.entry_id, new.attempt, "r2")
    done = second.queue.finish(entry.entry_id, new.attempt, status=EntryStatus.FAILED, error="boom")
    assert done.run_ids == ("r1", "r2") and done.error == "boom" and done.attempts == 2
    assert first.queue.entry(entry.entry_id) == done
    assert first.queue.finish(entry.entry_id, new.attempt, status=EntryStatus.FAILED, error="boom") == done


CRASHER = textwrap.dedent(
    r"""
    import json, sys, time
    from datetime import timedelta
    from threadloom import PostgresCheckpointer, PostgresCheckpointerConfig

    store = PostgresCheckpointer.open(sys.argv[1], PostgresCheckpointerConfig(schema=sys.argv[2]))
    lease = store.queue.lease("crasher", timedelta(milliseconds=500))
    store.queue.record_run(lease.entry_id, lease.attempt, "crashed-run")
    print(json.dumps({"entry_id": lease.entry_id, "attempt": lease.attempt}), flush=True)
    time.sleep(600)  # killed here, holding its lease
    """
)


@pytest.mark.slow
def test_a_lease_held_by_a_killed_process_expires_and_is_leased_again(harness: PgHarness, store) -> None:
    entry = store.queue.enqueue("t1", graph_id="g", input={"once": True})
    process = subprocess.Popen(
        [sys.executable, "-c", CRASHER, harness.dsn, harness.schema],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
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


def test_the_queue_outlives_its_store_and_never_reuses_an_entry_id(harness: PgHarness, store) -> None:
    ids = [store.queue.enqueue("t1", graph_id="g", input=i).entry_id for i in range(3)]
    lease = store.queue.lease("w", TTL)
    store.close()
    with raw(harness) as conn:
        conn.execute(f'DELETE FROM "{harness.schema}".run_queue WHERE entry_id = %s', (ids[-1],))  # the newest gone
    again = harness.sibling()
    assert again.queue.entry(ids[0]).leased_by == "w"
    assert again.queue.renew_lease(ids[0], lease.attempt, TTL).attempt == 1
    assert again.queue.enqueue("t2", graph_id="g").entry_id > ids[-1]


# -- the schema and its migration ----------------------------------------------------------------------------------


def _tables(harness: PgHarness, schema: str) -> set[str]:
    with raw(harness) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
    return {name for (name,) in rows}


def test_a_schema_at_the_previous_version_migrates_forward(harness: PgHarness, monkeypatch) -> None:
    steps = postgres_schema.migrations()
    latest = [step.version for step in steps]
    assert latest[:2] == [1, 2] and steps[1].name == "0002_run_queue.sql"
    with monkeypatch.context() as patch:  # this code as it was before the queue: schema version 1
        patch.setattr(postgres_schema, "migrations", lambda: steps[:1])
        old = harness.open()
        with raw(harness) as conn:  # this code's commit function writes the access stamps (version 7); the
            for table in ("threads", "checkpoints", "pending_writes", "events", "effects"):  # version-1 one did not
                conn.execute(
                    f'ALTER TABLE "{harness.schema}".{table} ADD COLUMN access_schema text,'
                    " ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb"
                )
            conn.execute(f'ALTER TABLE "{harness.schema}".checkpoints ADD COLUMN metadata jsonb')  # and (10) metadata
            conn.execute(f'CREATE TABLE "{harness.schema}".listeners (pid integer PRIMARY KEY,'  # and (13) listeners
                         " since timestamptz NOT NULL DEFAULT clock_timestamp())")
        r1 = _commit_run(old, "t1", "r1", None, 2)
        later = _commit_run(old, "t1", "r2", r1[-1], 2)
        with pytest.raises(StoreCorrupt) as caught:  # the previous code's schema has no queue functions
            old.queue.enqueue("t1", graph_id="g")
        assert caught.value.operation == "enqueue" and "do not match this version" in caught.value.message
        old.close()
    assert "run_queue" not in _tables(harness, harness.schema)

    opened: list[PostgresCheckpointer] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(harness.open())
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=open_one) for _ in range(4)]  # several openers migrate it once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    with raw(harness) as conn:
        versions = conn.execute(f'SELECT version FROM "{harness.schema}".schema_version ORDER BY 1').fetchall()
    assert versions == [(version,) for version in latest]  # each applied once
    assert {"run_queue", "run_queue_runs"} <= _tables(harness, harness.schema)
    store = opened[0]
    assert [cp.id for cp in store.history("t1", limit=10)] == list(reversed(r1 + later))
    entry = store.queue.enqueue("t1", graph_id="g")
    lease = opened[1].queue.lease("w", TTL)
    assert lease.entry_id == entry.entry_id
    opened[2].queue.record_run(entry.entry_id, lease.attempt, "r1")
    opened[3].prune("t1", RetentionPolicy(max_checkpoints=1))  # the migrated tl_prune_row keeps r1's newest
    assert [cp.id for cp in store.history("t1", limit=10)] == [later[-1], r1[-1]]


def test_a_schema_of_version_13_migrates_its_failed_entries_to_retriable_once(harness: PgHarness, monkeypatch) -> None:
    steps = postgres_schema.migrations()
    assert steps[13].name == "0014_queue_retries.sql"
    with monkeypatch.context() as patch:  # the schema before retries were recorded: version 13
        patch.setattr(postgres_schema, "migrations", lambda: steps[:13])
        harness.open().close()
    with raw(harness) as conn:
        conn.execute(  # an entry the earlier code finished FAILED
            f'INSERT INTO "{harness.schema}".run_queue (thread_id, graph_id, input, status, thread_head, attempts,'
            " available_at, enqueued_at, finished_at, error)"
            " VALUES ('t1', 'g', '{\"n\": 1}', 'failed', false, 1, now(), now(), now(), 'boom')"
        )
    with harness.open() as store:
        (failed,) = store.queue.entries()
        assert failed.status is EntryStatus.FAILED and failed.retried_as is None
        new = store.queue.retry(failed.entry_id)
        assert new is not None and new.input == {"n": 1} and new.status is EntryStatus.OPEN
        assert store.queue.retry(failed.entry_id) is None
        assert store.queue.entry(failed.entry_id).retried_as == new.entry_id
        assert store.queue.lease("w", TTL).entry_id == new.entry_id


def test_a_schema_of_version_5_migrates_its_open_entries_to_refunds(harness: PgHarness, monkeypatch) -> None:
    steps = postgres_schema.migrations()
    assert steps[5].name == "0006_queue_refunds.sql"
    with monkeypatch.context() as patch:  # the schema before refunds: version 5
        patch.setattr(postgres_schema, "migrations", lambda: steps[:5])
        harness.open().close()
    s = harness.schema
    with raw(harness) as conn:
        conn.execute(  # an entry the earlier code enqueued and leased twice, and its release function
            f'INSERT INTO "{s}".run_queue (thread_id, graph_id, input, status, thread_head, attempts, available_at,'
            " enqueued_at) VALUES ('t1', 'g', 'null', 'open', true, 2, now(), now())"
        )
        conn.execute(
            f'CREATE OR REPLACE FUNCTION "{s}".tl_q_release(bigint, bigint, bigint) RETURNS integer'
            " LANGUAGE sql AS 'SELECT 1'"
        )
        conn.execute(  # tl_q_row as version 2 made it: the entry without refunded
            f'CREATE OR REPLACE FUNCTION "{s}".tl_q_row(p_entry bigint, p_code integer, p_previous text)'
            f' RETURNS "{s}".tl_q_result LANGUAGE sql AS $fn$'
            " SELECT p_code, NULL::bigint, p_previous, q.entry_id, q.thread_id, q.graph_id, q.input, q.tenant_id,"
            " q.status, q.attempts, q.leased_by, q.lease_expires_at, q.available_at, q.enqueued_at, q.finished_at,"
            f' q.error, ARRAY[]::text[] FROM "{s}".run_queue q WHERE q.entry_id = p_entry $fn$'
        )
    with harness.open() as store:
        (entry,) = store.queue.entries()
        assert (entry.attempts, entry.refunded, entry.counted_attempts) == (2, 0, 2)
        lease = store.queue.lease("w", TTL)
        assert (lease.attempt, lease.entry.refunded) == (3, 0)
        store.queue.release_lease(entry.entry_id, lease.attempt, refund=True)
        assert store.queue.entry(entry.entry_id).counted_attempts == 2
    with raw(harness) as conn:
        forms = conn.execute(
            "SELECT pg_get_function_identity_arguments(p.oid) FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = 'tl_q_release'",
            (s,),
        ).fetchall()
    assert forms == [("p_entry bigint, p_attempt bigint, p_delay_us bigint, p_refund boolean",)]


def test_a_schema_with_the_queue_is_refused_by_the_previous_code(harness: PgHarness, monkeypatch) -> None:
    harness.open().close()
    steps = postgres_schema.migrations()
    monkeypatch.setattr(postgres_schema, "migrations", lambda: steps[:1])
    with pytest.raises(StoreCorrupt, match="newer"):
        harness.open_pg()


# -- plans: the lease reads its partial index, in one round trip --------------------------------------------------


def _explained(harness: PgHarness, statement: str, params: tuple[Any, ...], *, analyze: bool = False) -> list[str]:
    """The plans of the statements a call runs, nested ones included (``auto_explain`` notices), rolled back."""
    notes: list[str] = []
    with raw(harness) as conn:
        conn.add_notice_handler(lambda diag: notes.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        settings = {
            "auto_explain.log_min_duration": "0",
            "auto_explain.log_nested_statements": "on",
            "auto_explain.log_level": "notice",
            "auto_explain.log_analyze": "on" if analyze else "off",
            "auto_explain.log_buffers": "on" if analyze else "off",
            "client_min_messages": "notice",
        }
        for name, value in settings.items():
            conn.execute(f"SET {name} = {value}")
        with conn.transaction(force_rollback=True):
            conn.execute(statement, params)
    return notes


def _lease_plans(harness: PgHarness, kinds: list[str] | None, **options: Any) -> list[str]:
    sql = f'SELECT * FROM "{harness.schema}".tl_q_lease(%s, %s, %s)'
    plans = _explained(harness, sql, ("probe", 1_000_000, kinds), **options)
    return [plan for plan in plans if "SKIP LOCKED" in plan]


def _fill(harness: PgHarness, store: PostgresCheckpointer) -> None:
    """A queue with a long history: 3000 finished entries, a live head with a backlog of 500, open heads."""
    with raw(harness) as conn:
        s = f'"{harness.schema}"'
        conn.execute(
            f"""INSERT INTO {s}.run_queue (thread_id, graph_id, input, status, thread_head, attempts,
                    available_at, enqueued_at, finished_at)
                SELECT 'old' || i, 'g', 'null', 'completed', false, 1, now(), now(), now()
                FROM generate_series(1, 3000) i"""
        )
    head = store.queue.enqueue("busy", graph_id="g")
    store.queue.lease("w", HOUR)  # a live head ...
    with raw(harness) as conn:  # ... with a long backlog of its thread queued behind it
        conn.execute(
            f"""INSERT INTO {s}.run_queue (thread_id, graph_id, input, status, thread_head, available_at, enqueued_at)
                SELECT 'busy', 'g', 'null', 'open', false, now(), now() FROM generate_series(1, 500)"""
        )
    for i in range(5):
        store.queue.enqueue(f"fresh{i}", graph_id="h")
    with raw(harness) as conn:
        conn.execute(f"ANALYZE {s}.run_queue; ANALYZE {s}.run_queue_runs")
    assert store.queue.entry(head.entry_id).attempts == 1


def test_the_lease_reads_the_partial_index_of_leasable_heads(harness: PgHarness, store) -> None:
    for kinds in (None, ["h"]):
        (plan,) = _lease_plans(harness, kinds)  # a fresh, empty schema
        assert "Index Scan using run_queue_leasable" in plan, plan
    _fill(harness, store)
    with raw(harness) as conn:
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = 'run_queue_leasable'",
            (harness.schema,),
        ).fetchone()
    assert definition.endswith("WHERE ((status = 'open'::text) AND thread_head)"), definition
    for kinds in (None, ["h"]):
        (plan,) = _lease_plans(harness, kinds, analyze=True)
        assert "Index Scan using run_queue_leasable" in plan, plan
        assert "Sort" not in plan and "Seq Scan" not in plan, plan
        # The walk passes the live head only: never a finished entry, never the backlog behind the head.
        assert re.search(r"Index Scan using run_queue_leasable .*actual time=\S+ rows=1 ", plan), plan
        assert re.findall(r"Rows Removed by Filter: (\d+)", plan) == ["1"], plan


def test_each_queue_call_is_one_round_trip(store: PostgresCheckpointer) -> None:
    calls: list[str] = []
    original = store._db.call  # noqa: SLF001

    def counting(operation, *args, **kwargs):
        calls.append(operation)
        return original(operation, *args, **kwargs)

    store._db.call = counting  # noqa: SLF001
    queue = store.queue
    entry = queue.enqueue("t1", graph_id="g")
    lease = queue.lease("w", TTL, graph_ids=["g"])
    queue.renew_lease(entry.entry_id, lease.attempt, TTL)
    queue.record_run(entry.entry_id, lease.attempt, "r1")
    queue.release_lease(entry.entry_id, lease.attempt)
    lease = queue.lease("w", TTL)
    queue.finish(entry.entry_id, lease.attempt)
    assert queue.lease("w", TTL) is None
    queue.entry(entry.entry_id)
    queue.entries(limit=5, status=EntryStatus.COMPLETED)
    queue.open_runs(["t1"])
    store._db.call = original  # noqa: SLF001
    assert calls == [
        "enqueue", "lease", "renew_lease", "record_run", "release_lease", "lease", "finish", "lease", "entry",
        "entries", "open_runs",
    ]  # fmt: skip


def test_every_queue_read_is_answered_through_an_index(harness: PgHarness, store) -> None:
    _fill(harness, store)
    queue = store.queue
    captured: list[tuple[str, str, list[Any]]] = []
    original = store._db.call  # noqa: SLF001

    def capture(operation, thread_id, statement, params, **kwargs):
        if not kwargs.get("write"):
            captured.append((operation, statement, list(params)))
        return original(operation, thread_id, statement, params, **kwargs)

    store._db.call = capture  # noqa: SLF001
    queue.entry(1500)
    queue.entries(limit=10, after=1500)
    queue.entries(limit=10, after=1500, status=EntryStatus.OPEN)
    queue.open_runs(["busy", "old7"])
    queue.depth()
    store._db.call = original  # noqa: SLF001
    with raw(harness) as conn:
        conn.execute("SET enable_seqscan = off")
        cursor = psycopg.ClientCursor(conn)
        for operation, statement, params in captured:
            plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + cursor.mogrify(statement, params)))
            assert "Seq Scan" not in plan, f"{operation} scans a table:\n{plan}"
    plans = {operation: None for operation, _, _ in captured}
    assert set(plans) == {"entry", "entries", "open_runs", "depth"}


# -- the retention the queue protects, through every store over the schema --------------------------------------


def test_prune_and_sweep_keep_what_an_entry_of_another_store_recorded(harness: PgHarness) -> None:
    worker, ops = harness.open(), harness.sibling()
    probe = harness.open_pg(call_timeout=timedelta(milliseconds=500))
    entry = worker.queue.enqueue("t1", graph_id="g")
    lease = worker.queue.lease("w", TTL)
    worker.queue.record_run(entry.entry_id, lease.attempt, "r1")
    r1 = _commit_run(worker, "t1", "r1", None, 3)
    later = _commit_run(worker, "t1", "r2", r1[-1], 3)
    ops.prune("t1", RetentionPolicy(max_checkpoints=1))
    assert [cp.id for cp in ops.history("t1", limit=10)] == [later[-1], r1[-1]]
    guard_answers = []

    class Guard:
        def protected(self, thread_ids):
            # Asked outside the sweep's write transaction: claiming t1 here locks its row without waiting.
            token = probe.claim("t1", ClaimRequest(holder="guard", ttl=TTL)).token
            probe.release("t1", token)
            guard_answers.append(tuple(thread_ids))
            return {}

    policy = SweepPolicy(retention=RetentionPolicy(max_checkpoints=1))
    page = ops.sweep(policy, Guard())
    assert guard_answers == [("t1",)] and page.pruned == ()
    assert worker.lookup_run("t1", ["r1"]).id == r1[-1]
    worker.queue.finish(entry.entry_id, lease.attempt)
    assert ops.sweep(policy, Guard()).pruned == ("t1",)
    assert [cp.id for cp in worker.history("t1", limit=10)] == [later[-1]]
    assert worker.lookup_run("t1", ["r1"]) is None


def test_a_sweep_keeps_the_guards_runs_and_the_queues_together(harness: PgHarness, store) -> None:
    entry = store.queue.enqueue("t1", graph_id="g")
    lease = store.queue.lease("w", TTL)
    store.queue.record_run(entry.entry_id, lease.attempt, "r1")
    r1 = _commit_run(store, "t1", "r1", None, 2)
    r2 = _commit_run(store, "t1", "r2", r1[-1], 2)
    r3 = _commit_run(store, "t1", "r3", r2[-1], 2)

    class Guard:
        def protected(self, thread_ids):
            return {"t1": frozenset({"r2"})}

    page = store.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), Guard())
    assert page.pruned == ("t1",)
    assert [cp.id for cp in store.history("t1", limit=10)] == [r3[-1], r2[-1], r1[-1]]


def test_a_metered_postgres_store_serves_its_queue(harness: PgHarness) -> None:
    inner = harness.open()
    with MeteredCheckpointer(inner) as metered:
        assert metered.queue.inner is inner.queue  # metered into the wrapper's meter
        entry = metered.queue.enqueue("t1", graph_id="g")
        lease = metered.queue.lease("w", TTL)
        metered.queue.record_run(entry.entry_id, lease.attempt, "r1")
        r1 = _commit_run(metered, "t1", "r1", None, 2)
        _commit_run(metered, "t1", "r2", r1[-1], 2)
        metered.prune("t1", RetentionPolicy(max_checkpoints=1))
        assert metered.lookup_run("t1", ["r1"]).id == r1[-1]
        assert metered.meter.snapshot().counter("threadloom_queue_calls_total") == 3
    inner.close()
    assert inner.queue.closed
    for call in (lambda: inner.queue.lease("w", TTL), lambda: inner.queue.entry(entry.entry_id)):
        with pytest.raises(StoreClosed) as caught:  # not retryable on this store: open a new one
            call()
        assert "closed" in caught.value.message and not caught.value.retryable


# -- errors ----------------------------------------------------------------------------------------------------------


def test_a_locked_entry_is_skipped_by_a_lease_and_bounds_a_fenced_call(harness: PgHarness) -> None:
    store = harness.open_pg(call_timeout=timedelta(milliseconds=400))
    first = store.queue.enqueue("t1", graph_id="g")
    second = store.queue.enqueue("t2", graph_id="g")
    lease = store.queue.lease("w", TTL)
    assert lease.entry_id == first.entry_id
    store.queue.release_lease(first.entry_id, lease.attempt)
    with raw(harness) as blocker:
        with blocker.transaction():
            blocker.execute(
                f'SELECT 1 FROM "{harness.schema}".run_queue WHERE entry_id = %s FOR UPDATE', (first.entry_id,)
            )
            skipped = store.queue.lease("w2", TTL)  # SKIP LOCKED: the next head, without waiting
            assert skipped.entry_id == second.entry_id
            with pytest.raises(ProcessingError) as caught:  # waits for the row lock only within the bound
                store.queue.renew_lease(first.entry_id, lease.attempt, TTL)
            assert type(caught.value) is StoreUnavailable and caught.value.operation == "renew_lease"
            assert "0.4 s" in caught.value.message
    assert store.queue.entry(first.entry_id).attempts == 1  # nothing changed by the refused call
    assert store.queue.lease("w3", TTL).entry_id == first.entry_id


def test_a_stalled_network_makes_a_lease_an_unknown_outcome(harness: PgHarness) -> None:
    proxy = StallingProxy(harness.dsn)
    try:
        store = PostgresCheckpointer.open(
            proxy.dsn,
            harness.config(min_size=1, max_size=2, call_timeout=timedelta(milliseconds=500),
                           connect_timeout=timedelta(seconds=2)),
        )  # fmt: skip
        try:
            entry = store.queue.enqueue("t1", graph_id="g")
            proxy.stall()
            with pytest.raises(OutcomeUnknown) as caught:  # the client's deadline: its connection discarded
                store.queue.lease("w", TTL)
            assert caught.value.operation == "lease"
            proxy.resume()
            time.sleep(0.3)
            after = store.queue.entry(entry.entry_id)
            assert after.attempts in (0, 1)  # the stalled lease may or may not have landed
        finally:
            proxy.resume()
            store.close()
    finally:
        proxy.close()


def test_a_dropped_queue_table_is_a_processing_error(harness: PgHarness, store) -> None:
    store.queue.enqueue("t1", graph_id="g")
    with raw(harness) as conn:
        conn.execute(f'DROP TABLE "{harness.schema}".run_queue CASCADE')
    for call in (lambda: store.queue.lease("w", TTL), lambda: store.queue.entries(limit=5)):
        with pytest.raises(StoreCorrupt) as caught:
            call()
        assert "missing" in caught.value.message


def test_a_damaged_entry_is_a_processing_error_naming_its_thread(harness: PgHarness, store) -> None:
    entry = store.queue.enqueue("t-damaged", graph_id="g")
    with raw(harness) as conn:
        conn.execute(f"""UPDATE "{harness.schema}".run_queue SET input = '{{' WHERE entry_id = %s""", (entry.entry_id,))
    with pytest.raises(StoreCorrupt) as caught:
        store.queue.entry(entry.entry_id)
    assert caught.value.operation == "decode" and "t-damaged" in caught.value.message


def test_the_largest_numbers_and_durations_a_store_takes_name_nothing_and_write_nothing(
    store: PostgresCheckpointer,
) -> None:
    from threadloom.domain.validation import MAX_DURATION, MAX_INT  # bigint and 100 years: what every store takes

    entry = store.queue.enqueue("t1", graph_id="g", delay=MAX_DURATION)
    assert entry.available_at - entry.enqueued_at == MAX_DURATION
    assert store.queue.lease("w", TTL) is None
    other = store.queue.enqueue("t2", graph_id="g")
    lease = store.queue.lease("w", MAX_DURATION)
    assert lease.entry_id == other.entry_id and lease.expires_at - MAX_DURATION >= other.enqueued_at
    assert store.queue.entry(MAX_INT) is None and store.queue.entries(after=MAX_INT) == []
    with pytest.raises(StaleLease) as stale:
        store.queue.finish(MAX_INT, MAX_INT)
    assert (stale.value.entry_id, stale.value.attempt, stale.value.current) == (MAX_INT, MAX_INT, None)
    with pytest.raises(StaleLease) as stale:
        store.queue.record_run(other.entry_id, MAX_INT, "r1")
    assert stale.value.current == lease.attempt
    store.queue.release_lease(MAX_INT, 1)  # changes nothing
    for call, field in (
        (lambda: store.queue.enqueue("t3", graph_id="g", delay=MAX_DURATION + timedelta(days=1)), "delay"),
        (lambda: store.queue.renew_lease(other.entry_id, MAX_INT + 1, TTL), "attempt"),
        (lambda: store.queue.entry(MAX_INT + 1), "entry_id"),
    ):
        with pytest.raises(ValidationError) as caught:
            call()
        assert caught.value.field == field
    assert [e.entry_id for e in store.queue.entries(limit=10)] == [entry.entry_id, other.entry_id]
    assert store.queue.entry(other.entry_id) == lease.entry


# -- the reference: random calls agree with the in-memory queue ------------------------------------------------------


def _timeless(value: Any) -> Any:
    """``value`` with every store time blanked: the database's clock and the reference's differ."""
    if isinstance(value, QueueEntry):
        return attrs.evolve(value, enqueued_at=START, available_at=START, lease_expires_at=None, finished_at=None)
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    if hasattr(value, "entry") and hasattr(value, "expires_at"):
        return attrs.evolve(value, entry=_timeless(value.entry), expires_at=START)
    return value


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", _timeless(call()))
    except ThreadloomError as error:
        return ("error", type(error).__name__, attrs.asdict(error) if attrs.has(type(error)) else str(error))


def _call(queue: Any, kind: str, a: dict[str, Any]) -> Any:
    """One queue call of the random test, with the arguments drawn in ``a`` (no lease ever expires)."""
    if kind == "enqueue":
        return queue.enqueue(a["thread_id"], graph_id=a["kind"], input={"step": a["step"]})
    if kind == "lease":
        return queue.lease(f"w{a['step'] % 3}", HOUR)
    if kind == "lease_of":
        return queue.lease("w", HOUR, graph_ids=[a["kind"]])
    if kind == "renew":
        return queue.renew_lease(a["entry_id"], a["attempt"], HOUR)
    if kind == "record":
        return queue.record_run(a["entry_id"], a["attempt"], a["run_id"])
    if kind == "finish":
        return queue.finish(a["entry_id"], a["attempt"])
    if kind == "fail":
        return queue.finish(a["entry_id"], a["attempt"], status=EntryStatus.FAILED, error="e")
    if kind == "release":
        return queue.release_lease(a["entry_id"], a["attempt"])
    if kind == "entries":
        return queue.entries(limit=5, after=a["entry_id"] - 1, status=a["status"])
    assert kind == "open_runs"
    return queue.open_runs(["t1", "t2", "t3", "t4"])


KINDS = ["enqueue", "enqueue", "lease", "lease", "lease_of", "renew", "record", "finish", "fail", "release",
         "entries", "open_runs"]  # fmt: skip


@pytest.mark.parametrize("seed", range(2))
def test_random_calls_agree_with_the_in_memory_reference(harness: PgHarness, seed: int) -> None:
    rng = random.Random(seed)
    memory = InMemoryCheckpointer(ManualClock(START))
    stores = [harness.open(), harness.sibling()]
    granted: list[tuple[int, int]] = []  # leases the reference granted: most fenced calls use one
    for step in range(200):
        if granted and rng.random() < 0.75:
            entry_id, attempt = rng.choice(granted[-4:])
        else:
            entry_id, attempt = rng.randint(1, 12), rng.randint(1, 4)
        kind = rng.choice(KINDS)
        a = {
            "step": step,
            "entry_id": entry_id,
            "attempt": attempt,
            "thread_id": f"t{rng.randint(1, 4)}",
            "kind": rng.choice(["a", "b"]),
            "run_id": f"r{rng.randint(1, 3)}",
            "status": rng.choice([None, EntryStatus.OPEN, EntryStatus.COMPLETED]),
        }
        expected = _outcome(lambda: _call(memory.queue, kind, a))  # noqa: B023 - called at once
        got = _outcome(lambda: _call(stores[step % 2].queue, kind, a))  # noqa: B023 - called at once
        assert got == expected, (seed, step, kind)
        if expected[0] == "ok" and kind.startswith("lease") and expected[1] is not None:
            granted.append((expected[1].entry_id, expected[1].attempt))
    memory.close()


def test_a_store_over_the_callers_pool_serves_its_queue() -> None:
    """Over a caller's pool the calls carry their limits per transaction (client-side binding): same queue."""
    caller = PgCallerPoolHarness()
    try:
        store, other = caller.open(), caller.open()
        assert store.queue.lease("w", TTL) is None
        entry = store.queue.enqueue("t1", graph_id="g", input={"x": [1, None]}, tenant_id="acme")
        queued = other.queue.enqueue("t1", graph_id="g")
        lease = other.queue.lease("w", TTL, graph_ids=["g", "h"])
        assert (lease.entry_id, lease.attempt, lease.entry.input) == (entry.entry_id, 1, {"x": [1, None]})
        assert store.queue.renew_lease(entry.entry_id, lease.attempt, TTL).attempt == 1
        assert store.queue.record_run(entry.entry_id, lease.attempt, "r1").run_ids == ("r1",)
        assert other.queue.open_runs(["t1", "t2"]) == {"t1": frozenset({"r1"})}
        with pytest.raises(StaleLease):
            store.queue.finish(entry.entry_id, lease.attempt + 1)
        store.queue.release_lease(entry.entry_id, lease.attempt)
        again = store.queue.lease("w", TTL)
        done = other.queue.finish(entry.entry_id, again.attempt, status=EntryStatus.FAILED, error="no")
        assert done.attempts == 2 and done.error == "no"
        assert [e.entry_id for e in store.queue.entries(limit=5, status=EntryStatus.OPEN)] == [queued.entry_id]
        assert store.queue.lease("w", TTL).entry_id == queued.entry_id  # the next head of t1
    finally:
        caller.cleanup()


def test_a_second_schema_has_a_queue_of_its_own(harness: PgHarness, store) -> None:
    other_schema = new_schema_name()
    try:
        other = harness.open_pg(schema=other_schema)
        store.queue.enqueue("t1", graph_id="g")
        assert other.queue.lease("w", TTL) is None
        assert other.queue.enqueue("t1", graph_id="g").entry_id == 1  # ids are per schema
        other.close()
    finally:
        drop_schema(harness.dsn, other_schema)
