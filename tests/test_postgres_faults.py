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

from threadloom import (
    CancelledError,
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    OutcomeUnknown,
    ProcessingError,
    StaleClaim,
    StoreCorrupt,
    StoreUnavailable,
    ThreadloomError,
)
from threadloom.testing.postgres_harness import (
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
            assert conn.execute(f'SELECT version FROM "{schema}".schema_version').fetchall() == [
                (1,), (2,), (3,), (4,)
            ]
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
    from threadloom import ThreadQuery

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
