"""PostgresCheckpointer under real faults: lock waits past the call timeout, a killed backend, a stalled network,
cancellation in the middle of a read, concurrent fenced commits, and several OS processes on one schema
(seeds 003: "Every call returns within a bound", "Interrupts", "Fencing tokens"; DESIGN §3 rules 2–4, 9, 11).

Faults are injected for real: ``pg_terminate_backend``, a row lock held by another transaction, a TCP proxy on
loopback that stalls (``StallingProxy``), real subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from threadloom import (
    CancelledError,
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    OutcomeUnknown,
    ProcessingError,
    RetentionPolicy,
    StaleClaim,
    StoreCorrupt,
    StoreUnavailable,
    SweepPolicy,
    ThreadloomError,
    ThreadQuery,
)
from threadloom.persistence.postgres.schema import migrations
from threadloom.testing.postgres_harness import (
    FaultProxy,
    PgHarness,
    StallingProxy,
    drop_schema,
    new_schema_name,
)

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def harness():
    harness = PgHarness()
    try:
        yield harness
    finally:
        harness.cleanup()


@pytest.fixture
def proxy(harness: PgHarness):
    proxy = StallingProxy(harness.dsn)
    try:
        yield proxy
    finally:
        proxy.close()


def event(kind: str = "step") -> EventDraft:
    return EventDraft(run_id="run-1", type=kind, timestamp=NOW)


def checkpoint(thread_id: str, cp_id: str, parent: str | None) -> Checkpoint:
    return Checkpoint(
        id=cp_id, parent=parent, thread_id=thread_id, run_id="run-1", status=CheckpointStatus.RUNNING, created_at=NOW
    )


def claim(store, thread_id: str, holder: str = "run-1") -> int:
    return store.claim(thread_id, ClaimRequest(holder=holder, ttl=timedelta(minutes=5))).token


def in_thread(fn):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except ThreadloomError as error:
            box["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, box


def hold_row_lock(harness: PgHarness, thread_id: str) -> psycopg.Connection:
    """A transaction of another client that holds ``thread_id``'s row lock until rolled back."""
    conn = psycopg.connect(harness.dsn)
    conn.execute(f'SELECT 1 FROM "{harness.schema}".threads WHERE thread_id = %s FOR UPDATE', (thread_id,))
    return conn


# -- bounded calls ------------------------------------------------------------------------------------------------


def test_a_call_blocked_on_a_lock_fails_within_about_call_timeout(harness: PgHarness) -> None:
    store = harness.open_pg(call_timeout=timedelta(milliseconds=600))
    token = claim(store, "t")
    holder = hold_row_lock(harness, "t")
    try:
        worker, box = in_thread(
            lambda: store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
        )
        worker.join(10)  # the lock stays held all along: the call can only end by its own bound
        assert not worker.is_alive(), "the call kept waiting on the lock past its call_timeout"
        error = box.get("error")
        assert type(error) is StoreUnavailable, f"the server's lock_timeout answers, nothing written: {box}"
        assert "'t'" in error.message and error.operation == "commit"
    finally:
        holder.rollback()
        holder.close()
    assert store.latest("t") is None and store.events_after("t", 0, 10) == []
    records = store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
    assert [r.seq for r in records] == [1], "the refused call spent no event number"


def test_a_backend_killed_mid_call_leaves_nothing_half_written(harness: PgHarness) -> None:
    store = harness.open_pg(max_size=2)
    token = claim(store, "t")
    store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event("first")]))
    holder = hold_row_lock(harness, "t")
    try:
        worker, box = in_thread(
            lambda: store.commit(
                "t", Commit(token=token, checkpoint=checkpoint("t", "c2", "c1"), events=[event("a"), event("b")])
            )
        )
        with psycopg.connect(harness.dsn, autocommit=True) as admin:
            pid = None
            deadline = time.monotonic() + 10
            while pid is None and time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    (f'%"{harness.schema}".tl_commit%',),
                ).fetchone()
                pid = row[0] if row else None
                time.sleep(0.02)
            assert pid is not None, "the commit never waited on the row lock"
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        worker.join(15)
    finally:
        holder.rollback()
        holder.close()
    assert isinstance(box.get("error"), ProcessingError), box  # ProcessingError or OutcomeUnknown
    assert box["error"].operation == "commit"
    assert store.latest("t").checkpoint.id == "c1"
    assert [e.type for e in store.events_after("t", 0, 10)] == ["first"]
    records = store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c2", "c1"), events=[event("a")]))
    assert [r.seq for r in records] == [2]


def _hold_migration_lock(harness: PgHarness, schema: str, seconds: float | None) -> psycopg.Connection:
    """Another session takes the migration lock of ``schema`` and, unless ``seconds`` is None, lets go after that."""
    from threadloom.persistence.postgres import sql as q

    locker = psycopg.connect(harness.dsn)
    locker.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (q.SCHEMA_LOCK_CLASS, schema))
    if seconds is not None:
        threading.Timer(seconds, locker.rollback).start()
    return locker


def test_a_migration_waiting_past_the_call_bound_rolls_back_and_tries_again(harness: PgHarness) -> None:
    """A lock wait longer than call_timeout ends the try (live traffic never queues long behind the migration's
    locks); the next try migrates once the lock is free, and the try that failed is logged."""
    from structlog.testing import capture_logs

    from threadloom.persistence.postgres.store import PostgresCheckpointer

    schema = new_schema_name()
    locker = _hold_migration_lock(harness, schema, seconds=0.5)
    try:
        with capture_logs() as logs:
            store = PostgresCheckpointer.open(
                harness.dsn, harness.config(schema=schema, call_timeout=timedelta(milliseconds=300))
            )
        try:
            assert store.latest("t") is None
        finally:
            store.close()
    finally:
        time.sleep(0.6)  # the timer has let go
        locker.close()
    drop_schema(harness.dsn, schema)
    retries = [line for line in logs if line["event"] == "store.migrate_retry"]
    assert retries and retries[0]["attempt"] == 1 and retries[0]["schema"] == schema, logs
    assert [line["version"] for line in logs if line["event"] == "store.migrated"] == [migrations()[-1].version]


def test_a_migration_that_never_gets_its_lock_fails_after_three_tries_with_nothing_applied(
    harness: PgHarness,
) -> None:
    from structlog.testing import capture_logs

    from threadloom.persistence.postgres.schema import MIGRATE_TRIES
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    schema = new_schema_name()
    locker = _hold_migration_lock(harness, schema, seconds=None)
    try:
        with capture_logs() as logs, pytest.raises(StoreUnavailable) as caught:
            PostgresCheckpointer.open(harness.dsn, harness.config(schema=schema, call_timeout=timedelta(milliseconds=200)))
    finally:
        locker.rollback()
        locker.close()
    assert caught.value.operation == "open"
    assert [line["attempt"] for line in logs if line["event"] == "store.migrate_retry"] == list(range(1, MIGRATE_TRIES))
    with psycopg.connect(harness.dsn, autocommit=True) as admin:  # every try rolled back whole: no schema at all
        assert admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None


def test_a_failed_migration_leaves_the_pool_silent_and_a_callers_pool_its_connection(
    harness: PgHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an operator: after the tries of a migration failed, psycopg_pool warned "discarding closed
    connection" (the open closed a healthy connection and handed it back): the open's error is the only report,
    and a caller's pool gets its connection back open."""
    from psycopg_pool import ConnectionPool

    from threadloom.persistence.postgres.store import PostgresCheckpointer

    schema = new_schema_name()
    locker = _hold_migration_lock(harness, schema, seconds=None)
    pool = ConnectionPool(harness.dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True)
    try:
        with caplog.at_level("DEBUG", logger="psycopg"):
            with pytest.raises(StoreUnavailable):
                PostgresCheckpointer.open(
                    harness.dsn, harness.config(schema=schema, call_timeout=timedelta(milliseconds=200))
                )
            with pytest.raises(StoreUnavailable):
                PostgresCheckpointer.create(pool, harness.config(schema=schema, call_timeout=timedelta(milliseconds=200)))
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg") and r.levelname == "WARNING"]
        assert warned == []
        assert pool.get_stats().get("returns_bad", 0) == 0  # the connection came back healthy
        with pool.connection(timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()
        locker.rollback()
        locker.close()


def test_a_migration_statement_longer_than_the_call_bound_completes(harness: PgHarness, monkeypatch) -> None:
    """Found by hostile testing: a migration's statement (an index built over a large store) ran under the call
    bound, so a large store could never be migrated; it may now run MIGRATE_STATEMENT_TIMEOUT (locks are still
    waited for at most the call bound per try)."""
    from structlog.testing import capture_logs

    from threadloom.persistence.postgres import schema as postgres_schema
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    steps = postgres_schema.migrations()
    slow = postgres_schema.Migration(steps[-1].version + 1, "slow.sql", "SELECT pg_sleep(0.6);")
    monkeypatch.setattr(postgres_schema, "migrations", lambda: (*steps, slow))
    schema = new_schema_name()
    with capture_logs() as logs:
        store = PostgresCheckpointer.open(harness.dsn, harness.config(schema=schema, call_timeout=timedelta(milliseconds=200)))
    try:
        assert store.latest("t") is None
    finally:
        store.close()
    drop_schema(harness.dsn, schema)
    assert [line["version"] for line in logs if line["event"] == "store.migrated"] == [slow.version]
    assert not [line for line in logs if line["event"] == "store.migrate_retry"]


def test_a_backend_killed_while_open_migrates_is_a_processing_error(harness: PgHarness) -> None:
    """Found by hostile testing: open reported a failed migration as an unknown outcome; it is not a write."""
    from threadloom.persistence.postgres import sql as q
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    schema = new_schema_name()
    locker = psycopg.connect(harness.dsn)  # holds the migration lock of the new schema: open waits on it
    locker.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (q.SCHEMA_LOCK_CLASS, schema))
    try:
        worker, box = in_thread(lambda: PostgresCheckpointer.open(harness.dsn, harness.config(schema=schema)))
        with psycopg.connect(harness.dsn, autocommit=True) as admin:
            pid = None
            deadline = time.monotonic() + 10
            while pid is None and time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    ("%pg_advisory_xact_lock%",),
                ).fetchone()
                pid = row[0] if row and row[0] != locker.info.backend_pid else None
                time.sleep(0.02)
            assert pid is not None, "open never waited on the migration lock"
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        worker.join(15)
    finally:
        locker.rollback()
        locker.close()
    error = box.get("error")
    assert type(error) is StoreUnavailable, f"a failed open is StoreUnavailable (retrying is safe): {box}"
    assert error.operation == "open" and "lost" in error.message
    store = PostgresCheckpointer.open(harness.dsn, harness.config(schema=schema))  # a retry migrates
    try:
        assert store.latest("t") is None
    finally:
        store.close()
        drop_schema(harness.dsn, schema)


def test_a_stalled_network_hits_the_client_deadline(harness: PgHarness, proxy: StallingProxy) -> None:
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    store = PostgresCheckpointer.open(
        proxy.dsn,
        harness.config(min_size=2, max_size=2, call_timeout=timedelta(milliseconds=600),
                       connect_timeout=timedelta(seconds=2)),
    )
    try:
        token = claim(store, "t")
        proxy.stall()  # the network stays stalled until both calls have ended by the client's deadline
        reader, read = in_thread(lambda: store.latest("t"))
        reader.join(10)
        assert not reader.is_alive() and type(read.get("error")) is StoreUnavailable, read
        writer, write = in_thread(
            lambda: store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
        )
        writer.join(10)
        assert not writer.is_alive() and type(write.get("error")) is OutcomeUnknown, write
        assert write["error"].operation == "commit" and "'t'" in write["error"].message
        assert store.pool.get_stats().get("returns_bad", 0) >= 2, "both aborted connections were discarded"
        proxy.resume()
        time.sleep(0.3)
        latest = store.latest("t")  # all or nothing: the stalled commit may have landed after all
        events = store.events_after("t", 0, 10)
        assert (latest is None and events == []) or (latest.checkpoint.id == "c1" and [e.seq for e in events] == [1])
        parent = latest.checkpoint.id if latest else None
        store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c2", parent)))
        assert store.latest("t").checkpoint.id == "c2"
    finally:
        proxy.resume()
        store.close()


def test_cancel_during_a_stalled_read_discards_its_connection(harness: PgHarness, proxy: StallingProxy) -> None:
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    store = PostgresCheckpointer.open(
        proxy.dsn, harness.config(min_size=1, max_size=2, connect_timeout=timedelta(seconds=2))
    )
    try:
        store.latest("warm")
        proxy.stall()
        cancel = threading.Event()
        worker, box = in_thread(lambda: store.await_events_after("t", 0, 10, timedelta(seconds=30), cancel=cancel))
        time.sleep(0.4)
        cancel.set()
        worker.join(10)
        assert isinstance(box.get("error"), CancelledError), box
        assert store.pool.get_stats().get("returns_bad", 0) >= 1, "the interrupted connection was discarded"
        proxy.resume()  # the pool's replacement connection can now finish connecting
        assert settled(store.pool), f"a connection leaked: {store.pool.get_stats()}"
        token = claim(store, "t")  # the store keeps working
        assert [r.seq for r in store.commit("t", Commit(token=token, events=[event()]))] == [1]
    finally:
        proxy.resume()
        store.close()


def settled(pool, timeout_s: float = 10.0) -> bool:
    """True once every connection of ``pool`` is back in it (none checked out, none being made)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = pool.get_stats()
        if stats.get("pool_size", 0) == stats.get("pool_available", 0):
            return True
        time.sleep(0.02)
    return False


# -- concurrency --------------------------------------------------------------------------------------------


def test_fenced_commits_across_two_threads_never_deadlock(harness: PgHarness) -> None:
    """Each commit to one thread is fenced by the other's claim: rows are locked in id order, so no deadlock."""
    store, other = harness.open_pg(max_size=3), harness.sibling()
    tokens = {name: claim(store, name) for name in ("a", "b")}
    errors: list[BaseException] = []

    def write(own: str, fence: str) -> None:
        try:
            for _ in range(40):
                target = store if own == "a" else other
                target.commit(own, Commit(token=tokens[own], events=[event(own)], fence=(fence, tokens[fence])))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=write, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == []
    assert [e.seq for e in store.events_after("a", 0, 100)] == list(range(1, 41))
    assert [e.seq for e in store.events_after("b", 0, 100)] == list(range(1, 41))


COMMITTER = textwrap.dedent(
    """
    import json, sys
    from datetime import datetime, timezone
    from threadloom import Commit, EventDraft, PostgresCheckpointer, PostgresCheckpointerConfig
    dsn, schema, token, count, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    store = PostgresCheckpointer.open(dsn, PostgresCheckpointerConfig(schema=schema, min_size=1, max_size=1))
    now = datetime.now(timezone.utc)
    numbers = []
    for index in range(count):
        drafts = [EventDraft(run_id="run-1", type=f"{tag}-{index}-{k}", timestamp=now) for k in range(2)]
        numbers.append([record.seq for record in store.commit("shared", Commit(token=token, events=drafts))])
    store.close()
    print("RESULT " + json.dumps(numbers))
    """
)


def result_of(process: subprocess.Popen) -> object:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    line = [text for text in out.splitlines() if text.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_two_processes_committing_under_one_token_number_contiguously(harness: PgHarness) -> None:
    store = harness.open()
    token = claim(store, "shared")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", COMMITTER, harness.dsn, harness.schema, str(token), "60", tag],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for tag in ("p", "q")
    ]
    numbers = [result_of(process) for process in processes]
    for per_process in numbers:
        for pair in per_process:
            assert pair[1] == pair[0] + 1, "one commit's events are numbered contiguously"
    every = sorted(seq for per_process in numbers for pair in per_process for seq in pair)
    assert every == list(range(1, 241)), "no number is skipped or given twice"
    stored = store.events_after("shared", 0, 1000)
    assert [e.seq for e in stored] == every and {e.token for e in stored} == {token}


MIGRATOR = textwrap.dedent(
    """
    import json, sys, time
    from datetime import timedelta
    from threadloom import ClaimRequest, PostgresCheckpointer, PostgresCheckpointerConfig
    dsn, schema, start_at, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    time.sleep(max(0.0, start_at - time.time()))
    store = PostgresCheckpointer.open(dsn, PostgresCheckpointerConfig(schema=schema, min_size=1, max_size=1))
    token = store.claim(name, ClaimRequest(holder=name, ttl=timedelta(minutes=1))).token
    store.close()
    print("RESULT " + json.dumps(token))
    """
)


def test_four_processes_open_one_new_schema_at_once(harness: PgHarness) -> None:
    schema = new_schema_name()
    start_at = time.time() + 2.0  # every process imports first, then all open at once
    try:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", MIGRATOR, harness.dsn, schema, str(start_at), f"p{index}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for index in range(4)
        ]
        tokens = [result_of(process) for process in processes]
        assert sorted(tokens) == [1, 2, 3, 4], "one token sequence, every process migrated or found it migrated"
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            versions = conn.execute(f'SELECT version FROM "{schema}".schema_version ORDER BY 1').fetchall()
        assert versions == [(step.version,) for step in migrations()]  # each applied once
    finally:
        drop_schema(harness.dsn, schema)


def test_a_stale_token_from_another_process_is_refused(harness: PgHarness) -> None:
    """A run that lost its claim in one store cannot write through another store on the schema."""
    first, second = harness.open(), harness.sibling()
    old = claim(first, "t", "run-1")
    first.release("t", old)
    new = claim(second, "t", "run-2")
    with pytest.raises(StaleClaim) as info:
        first.commit("t", Commit(token=old, events=[event()]))
    assert (info.value.token, info.value.current) == (old, new)
    assert new > old


# -- client-side errors: a value the driver cannot convert is not a lost connection --------------------------------


def test_a_stored_value_the_driver_cannot_read_is_a_processing_error(harness: PgHarness) -> None:
    """Found by hostile testing: psycopg's DataError while loading a timestamp after year 9999 (no SQLSTATE: the
    client raised it) was reported as a lost connection; the connection is sound and the store goes on."""
    store = harness.open_pg()
    token = claim(store, "t")
    store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(
            f"""UPDATE "{harness.schema}".threads SET updated_at = '20000-01-01 00:00:00+00' WHERE thread_id = 't'"""
        )
    with pytest.raises(ProcessingError) as caught:
        store.threads(ThreadQuery(tenant_id=None))
    assert type(caught.value) is StoreCorrupt and caught.value.operation == "threads"
    assert "could not be read" in caught.value.message and "lost" not in caught.value.message
    assert "DataError" in caught.value.message
    assert store.latest("t").checkpoint.id == "c1"  # the store keeps working
    assert settled(store.pool), f"a connection leaked: {store.pool.get_stats()}"


@pytest.mark.parametrize("caller_pool", [False, True], ids=["own-pool", "caller-pool"])
def test_a_write_the_driver_refuses_to_send_is_a_processing_error(harness: PgHarness, caller_pool: bool) -> None:
    """A write whose value the driver cannot convert never left the client: ProcessingError, not an unknown
    outcome; a write whose answer cannot be read did apply: OutcomeUnknown. Both through the store's one bounded
    call (``Database.call``), on both of its paths (prepared binary statements on its own pool, client-side binding on
    a caller's pool), with values the public methods refuse (so the driver is reached only this way)."""
    import psycopg_pool

    from threadloom.persistence.postgres.store import PostgresCheckpointer

    pool = None
    if caller_pool:
        pool = psycopg_pool.ConnectionPool(harness.dsn, min_size=1, max_size=2, open=True)
        store = PostgresCheckpointer.create(pool, harness.config())
    else:
        store = harness.open_pg()
    try:
        token = claim(store, "t")
        with pytest.raises(ProcessingError) as refused:
            store._db.call("release", "t", store._sql["RELEASE"], ("t\ud800", token), write=True)
        assert type(refused.value) is ProcessingError, refused.value
        assert "nothing was sent" in refused.value.message and "UnicodeEncodeError" in refused.value.message
        with pytest.raises(OutcomeUnknown) as unread:
            store._db.call("release", "t", "SELECT '20000-01-01 00:00:00+00'::timestamptz", (), write=True)
        assert "applied" in unread.value.message and "could not be read" in unread.value.message
        store.commit("t", Commit(token=token, events=[event()]))  # the claim was never released
        assert settled(store.pool), f"a connection leaked: {store.pool.get_stats()}"
    finally:
        store.close()
        if pool is not None:
            pool.close()


def test_an_undefined_function_is_a_version_mismatch_not_a_dropped_schema(harness: PgHarness) -> None:
    store = harness.open_pg()
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(f'DROP FUNCTION "{harness.schema}".tl_release')
    with pytest.raises(ProcessingError) as caught:
        store.release("t", 1)
    assert type(caught.value) is StoreCorrupt
    assert "do not match this version" in caught.value.message and "dropped" not in caught.value.message
    assert store.latest("t") is None  # the schema itself is there


# -- faults at every point of every call (issue 12, finding 7) ----------------------------------------------------
#
# For every store and queue operation, a loopback proxy (FaultProxy) breaks the call's connection while it sits idle
# in the pool, before the request reaches the server, while the server works on it (every table of the schema
# locked by another transaction), or after the server committed but before its answer arrives - by a stall or a
# reset. Each call must end within the documented bound with a threadloom error (or succeed, for a fault between
# calls), leave the schema either untouched or exactly as the same call leaves it without a fault, leak no
# connection, and a retry of a write must be refused by the contract or apply once.

FAULT_CALL = timedelta(milliseconds=300)
FAULT_CONNECT = timedelta(seconds=2)
FAULT_BOUND_S = FAULT_CONNECT.total_seconds() + FAULT_CALL.total_seconds() + 0.25  # the documented bound
FAULT_SLACK_S = 1.5  # scheduling on a loaded machine; a call that waited for a timeout would exceed it by seconds
TTL = timedelta(minutes=5)
VOLATILE = ("claim_token", "entry_id", "place")  # drawn from sequences: a failed attempt may use a number


def fault_setup(store) -> dict:
    """One claimed thread with two checkpoints, events and an effect; a leased and an open queue entry."""
    token = claim(store, "t")
    store.commit(
        "t",
        Commit(
            token=token, checkpoint=checkpoint("t", "c1", None), events=[event("a"), event("b")],
            effects=[EffectRecord(key="k", run_id="run-1", recorded_at=NOW, result={"n": 1}, checkpoint_id="c1")],
        ),
    )  # fmt: skip
    store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c2", "c1"), events=[event("c")]))
    store.queue.enqueue("q1", graph_id="g1", input={"x": 1})
    lease = store.queue.lease("w1", TTL, graph_ids=["g1"])
    store.queue.enqueue("q2", graph_id="g2")
    return {"token": token, "entry": lease.entry.entry_id, "attempt": lease.attempt}


FAULT_OPS: dict[str, tuple[bool, object]] = {
    # name: (writes, call)
    "claim": (True, lambda s, c: s.claim("u", ClaimRequest(holder="run-2", ttl=TTL))),
    "renew": (True, lambda s, c: s.renew("t", c["token"], TTL)),
    "release": (True, lambda s, c: s.release("t", c["token"])),
    "commit": (True, lambda s, c: s.commit(
        "t", Commit(token=c["token"], checkpoint=checkpoint("t", "c3", "c2"), events=[event("d")]))),
    "compact_events": (True, lambda s, c: s.compact_events("t", 3)),
    "delete_thread": (True, lambda s, c: s.delete_thread("t", c["token"])),
    "prune": (True, lambda s, c: s.prune("t", RetentionPolicy(max_checkpoints=1))),
    "sweep": (True, lambda s, c: s.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), None)),
    "enqueue": (True, lambda s, c: s.queue.enqueue("q3", graph_id="g3")),
    "lease": (True, lambda s, c: s.queue.lease("w2", TTL, graph_ids=["g2"])),
    "renew_lease": (True, lambda s, c: s.queue.renew_lease(c["entry"], c["attempt"], TTL)),
    "record_run": (True, lambda s, c: s.queue.record_run(c["entry"], c["attempt"], "run-9")),
    "finish": (True, lambda s, c: s.queue.finish(c["entry"], c["attempt"])),
    "release_lease": (True, lambda s, c: s.queue.release_lease(c["entry"], c["attempt"])),
    "latest": (False, lambda s, c: s.latest("t")),
    "checkpoint": (False, lambda s, c: s.checkpoint("t", "c1")),
    "history": (False, lambda s, c: s.history("t", limit=10)),
    "children": (False, lambda s, c: s.children("t", limit=10)),
    "events_after": (False, lambda s, c: s.events_after("t", 0, 10)),
    "await_events_after": (False, lambda s, c: s.await_events_after("t", 3, 10, timedelta(milliseconds=50))),
    "effect": (False, lambda s, c: s.effect("t", "k")),
    "lookup_run": (False, lambda s, c: s.lookup_run("t", ["run-1"])),
    "threads": (False, lambda s, c: s.threads(ThreadQuery(tenant_id=None))),
    "incomplete": (False, lambda s, c: s.incomplete(None, limit=10)),
    "entry": (False, lambda s, c: s.queue.entry(c["entry"])),
    "entries": (False, lambda s, c: s.queue.entries(limit=10)),
    "open_runs": (False, lambda s, c: s.queue.open_runs(["q1", "q2"])),
}  # fmt: skip

FAULT_RETRIES = {
    # enqueue has no idempotency key (its docstring says so): after a failure, look before enqueueing again
    "enqueue": lambda s, c: (
        None if any(e.thread_id == "q3" for e in s.queue.entries(limit=10)) else s.queue.enqueue("q3", graph_id="g3")
    ),
}

FAULTS = [
    ("idle", "reset"),  # the connection ended between calls: the call must simply work
    ("request", "reset"), ("request", "stall"),  # before the request reaches the server
    ("working", "reset"), ("working", "stall"),  # sent: the server is working on it
    ("answer", "reset"), ("answer", "stall"),  # the server committed; its answer does not arrive
]  # fmt: skip


class FaultBench:
    """One schema for every fault case, a store on it without faults, and one admin connection that empties the
    schema (:meth:`reset`), reads it (:meth:`digest`) and watches the faulted store's backends."""

    def __init__(self) -> None:
        from psycopg import sql

        self.harness = PgHarness()
        self.store = self.harness.open_pg()
        self.controls: dict[str, dict] = {}
        self.admin = psycopg.connect(self.harness.dsn, autocommit=True)
        schema = self.harness.schema
        self.reads = []
        for table, names in self.admin.execute(
            "SELECT table_name, array_agg(column_name::text ORDER BY ordinal_position) FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name NOT IN ('schema_version', 'listeners')"
            " AND data_type NOT LIKE 'timestamp%%'"
            " AND column_name <> ALL(%s) GROUP BY table_name",
            (schema, list(VOLATILE)),
        ).fetchall():
            columns = sql.SQL(", ").join(map(sql.Identifier, names))
            self.reads.append((table, sql.SQL("SELECT {} FROM {}").format(columns, sql.Identifier(schema, table))))
        tables = [row[0] for row in self.admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename NOT IN ('schema_version', 'meta')",
            (schema,)).fetchall()]  # fmt: skip
        sequences = [row[0] for row in self.admin.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (schema,)).fetchall()]  # fmt: skip
        self.empty = [
            sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(sql.Identifier(schema, name) for name in tables)),
            sql.SQL("UPDATE {} SET mark = 0").format(sql.Identifier(schema, "meta")),
            *[sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(schema, name)) for name in sequences],
        ]  # fmt: skip
        self.lock = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.SQL(", ").join(sql.Identifier(schema, name) for name in tables + ["meta"]))  # fmt: skip

    def reset(self) -> None:
        """Empties the schema as a new one is: no rows but its version and mark, every sequence restarted."""
        with self.admin.transaction():
            for statement in self.empty:
                self.admin.execute(statement)

    def digest(self) -> dict[str, list]:
        """Every row of every table, without times and the numbers drawn from sequences."""
        return {table: sorted(self.admin.execute(query).fetchall(), key=repr) for table, query in self.reads}

    def control(self, op: str) -> dict:
        """The schema as the call ``op`` leaves it after :func:`fault_setup`, without any fault (computed once)."""
        if op not in self.controls:
            self.reset()
            FAULT_OPS[op][1](self.store, fault_setup(self.store))
            self.controls[op] = self.digest()
        return self.controls[op]

    def backends(self, app: str) -> list[tuple[str, str | None]]:
        """(state, wait_event_type) of every backend of the application ``app``."""
        return self.admin.execute(
            "SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()

    def listening(self, app: str) -> bool:
        """Whether the store of the application ``app`` has its listener's ``LISTEN`` done."""
        return bool(self.admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle' AND query LIKE 'LISTEN%%'",
            (app,)).fetchall())  # fmt: skip

    def lock_every_table(self) -> psycopg.Connection:
        """Another client's transaction that holds every table of the schema in ACCESS EXCLUSIVE mode."""
        conn = psycopg.connect(self.harness.dsn)
        conn.execute(self.lock)
        return conn

    def close(self) -> None:
        self.admin.close()
        self.harness.cleanup()


@pytest.fixture(scope="module")
def bench():
    bench = FaultBench()
    try:
        yield bench
    finally:
        bench.close()


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


@pytest.mark.parametrize("point,action", FAULTS, ids=[f"{p}-{a}" for p, a in FAULTS])
@pytest.mark.parametrize("op", list(FAULT_OPS))
def test_a_fault_at_any_point_of_any_call_is_bounded_and_all_or_nothing(
    bench: FaultBench, op: str, point: str, action: str
) -> None:
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    harness, direct = bench.harness, bench.store
    writes, call = FAULT_OPS[op]
    expected = bench.control(op)
    bench.reset()
    context = fault_setup(direct)
    before = bench.digest()
    proxy = FaultProxy(harness.dsn)
    app = f"tlfault_{harness.schema}"
    store = PostgresCheckpointer.open(
        make_conninfo(proxy.dsn, application_name=app),
        harness.config(min_size=2, max_size=2, call_timeout=FAULT_CALL, connect_timeout=FAULT_CONNECT),
    )
    locker = None
    try:
        store.latest("t")
        store.await_events_after("t", 99, 1, timedelta(milliseconds=10))  # starts the listener
        assert settled(store.pool)
        assert wait_for(lambda: bench.backends(app) == [("idle", "Client")] * 3 and bench.listening(app)), "idle"
        if point == "idle":
            proxy.reset_all()
            time.sleep(0.05)  # the pool's connections are now closed on the client's side
        elif point in ("request", "answer"):
            proxy.arm(point, action)
        else:
            locker = bench.lock_every_table()
        started = time.monotonic()
        worker, box = in_thread(lambda: call(store, context))
        if point == "working":
            assert wait_for(lambda: ("active", "Lock") in bench.backends(app), 5), "the call never waited"
            proxy.reset_all() if action == "reset" else proxy.stall_all()
        worker.join(FAULT_BOUND_S + 10)
        elapsed = time.monotonic() - started
        assert not worker.is_alive() and elapsed <= FAULT_BOUND_S + FAULT_SLACK_S, f"{op} took {elapsed:.2f} s"
        if locker is not None:
            locker.rollback()
        proxy.heal()
        error = box.get("error")
        print(f"FAULTCASE {op} {point}-{action} {elapsed:.3f}s {type(error).__name__ if error else 'ok'}")
        if point == "idle":
            assert error is None, f"a connection ended between calls failed {op}: {error!r}"
        else:
            assert point == "working" or proxy.fired.is_set(), "the armed fault never hit"
            allowed = (OutcomeUnknown, StoreUnavailable) if writes else (StoreUnavailable,)
            assert type(error) in allowed, f"{op}: {box}"
            assert error.operation == op or op == "await_events_after", error
        # every backend of the faulted store has finished what it was doing
        assert wait_for(lambda: ("active", "Lock") not in bench.backends(app)
                        and sum(state == "active" for state, _ in bench.backends(app)) == 0), "a call still runs"  # fmt: skip
        after = bench.digest()
        assert after in (before, expected), f"{op} left the schema half-written"
        if not writes:
            assert after == before
        if error is not None:
            try:
                FAULT_RETRIES.get(op, call)(store, context)  # a retry on the healed path: applies once, or the contract refuses it
            except ProcessingError as retry_error:
                pytest.fail(f"the retry of {op} failed: {retry_error!r}")
            except ThreadloomError:
                assert after == expected, f"{op}: the retry was refused although the first call did not apply"
            assert bench.digest() == expected, f"{op} applied twice or not at all"
        assert settled(store.pool), f"a connection leaked: {store.pool.get_stats()}"
        assert store.pool.get_stats()["pool_size"] <= 2
        assert wait_for(lambda: len(bench.backends(app)) <= 3), "a backend of the store was left behind"
    finally:
        if locker is not None and not locker.closed:
            locker.rollback()
            locker.close()
        proxy.heal()
        store.close()
        proxy.close()


# -- connections that cannot be opened (issue 12, finding 6) ------------------------------------------------------

SECRET = "pw-never-shown-7f3a"


def free_port() -> int:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]  # closed again: nothing listens there


@pytest.mark.parametrize(
    "where,kind,cause",
    [
        ("127.0.0.1:{port}/tl_no_such_database", ProcessingError, 'database "tl_no_such_database" does not exist'),
        ("127.0.0.1:{port}/{db}", ProcessingError, 'role "tl_no_such_role" does not exist'),
        ("127.0.0.1:{closed}/{db}", StoreUnavailable, "Connection refused"),
        ("no-such-host.invalid:5432/{db}", ProcessingError, "no-such-host.invalid"),
    ],
    ids=["no-database", "no-role", "closed-port", "unknown-host"],
)
def test_a_connection_that_cannot_be_opened_says_why_at_once(where: str, kind: type, cause: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig
    from threadloom.testing.postgres_harness import postgres_dsn

    parts = conninfo_to_dict(postgres_dsn())
    user = "tl_no_such_role" if "role" in cause else parts.get("user", "postgres")
    url = f"postgresql://{user}:{SECRET}@" + where.format(
        port=parts.get("port") or 5432, db=parts.get("dbname") or "postgres", closed=free_port()
    )
    started = time.monotonic()
    with pytest.raises(ProcessingError) as caught:
        PostgresCheckpointer.open(url, PostgresCheckpointerConfig(connect_timeout=timedelta(seconds=20)))
    elapsed = time.monotonic() - started
    assert type(caught.value) is kind, caught.value
    assert cause in caught.value.message and "pool initialization" not in caught.value.message
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert caught.value.operation == "open"
    assert elapsed < 10, f"open waited {elapsed:.1f} s for an answer it had at once (connect_timeout is 20 s)"


@pytest.fixture(scope="module")
def private_server():
    from threadloom.testing.postgres_harness import PrivateServer

    server = PrivateServer()
    try:
        yield server
    finally:
        server.destroy()


def test_a_refused_password_is_reported_at_once_and_never_shown(private_server) -> None:
    from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig

    url = private_server.dsn.replace(private_server.password, SECRET)
    started = time.monotonic()
    with pytest.raises(ProcessingError) as caught:
        PostgresCheckpointer.open(url, PostgresCheckpointerConfig(connect_timeout=timedelta(seconds=20)))
    assert time.monotonic() - started < 10
    assert type(caught.value) is ProcessingError and not caught.value.retryable
    assert 'password authentication failed for user "postgres"' in caught.value.message
    assert SECRET not in str(caught.value) and private_server.password not in str(caught.value)


# -- ended sessions and restarts (issue 12, finding 7) ------------------------------------------------------------


def test_every_call_after_pg_terminate_backend_of_all_the_stores_connections_succeeds(bench: FaultBench) -> None:
    """Before each call of every operation, PostgreSQL ends every connection of the store (pool and listener)."""
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    app = f"tlkill_{bench.harness.schema}"
    store = PostgresCheckpointer.open(
        make_conninfo(bench.harness.dsn, application_name=app), bench.harness.config(min_size=3, max_size=3)
    )
    try:
        for op, (_writes, call) in FAULT_OPS.items():
            bench.reset()
            context = fault_setup(bench.store)
            store.await_events_after("t", 99, 1, timedelta(milliseconds=10))  # the listener is up, to be ended too
            assert wait_for(lambda: len(bench.backends(app)) == 4), bench.backends(app)
            pids = [row[0] for row in bench.admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchall()]  # fmt: skip
            assert len(pids) == 4, pids
            bench.admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
            assert wait_for(lambda: not bench.admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall())  # fmt: skip
            try:
                call(store, context)
            except ThreadloomError as error:
                pytest.fail(f"{op} failed after its connections were ended between calls: {error!r}")
            assert bench.digest() == bench.control(op) if op != "await_events_after" else True
            assert settled(store.pool) and store.pool.get_stats()["pool_size"] <= 3
    finally:
        store.close()


STEPS = 40


def test_a_server_restart_while_runs_are_live_loses_nothing_acknowledged(private_server) -> None:
    from threadloom import CheckpointStatus, Graph, GraphRuntime, Step
    from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig

    def tick(state, ctx):
        time.sleep(0.02)
        ctx.emit("tick", {"i": state["i"]})
        if state["i"] + 1 == STEPS:
            return Step.end({"i": STEPS})
        return Step.to("tick", {"i": state["i"] + 1})

    graph = Graph("count", {"tick": tick}, entry="tick")
    config = PostgresCheckpointerConfig(schema="restart", min_size=2, max_size=6, call_timeout=timedelta(seconds=5))
    store = PostgresCheckpointer.open(private_server.dsn, config)
    threads = [f"run-{index}" for index in range(6)]
    recovered = 0
    try:
        with GraphRuntime(store) as runtime:
            handles = {thread: runtime.start(thread, graph, {"i": 0}) for thread in threads}
            assert wait_for(lambda: all(len(store.events_after(t, 0, 100)) >= 3 for t in threads), 60)
            private_server.stop()  # every session ends, as in a restart; the runs keep trying
            time.sleep(0.5)
            private_server.start()
            for thread in threads:
                handle = handles[thread]
                for _attempt in range(5):
                    try:
                        outcome = handle.wait(timedelta(seconds=120))
                        break
                    except ProcessingError:  # a step the store refused while down: recover, as README says
                        recovered += 1
                        handle = runtime.recover(thread, graph)
                else:
                    pytest.fail(f"{thread} never finished")
                assert outcome.status is CheckpointStatus.COMPLETED and outcome.state == {"i": STEPS}
        for thread in threads:
            ticks = [e.payload["i"] for e in store.events_after(thread, 0, 1000) if e.type == "tick"]
            assert ticks == list(range(STEPS)), f"{thread}: every step's event once, in order: {ticks}"
        print(f"RESTART runs={len(threads)} steps={STEPS} recovered={recovered}")
    finally:
        store.close()
