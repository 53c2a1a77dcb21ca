"""What is particular to the SQLite store (DESIGN §3 "Stores"): its file, schema, errors, threads and indexes.

The contract itself is checked by ``test_sqlite_contract.py`` and ``test_sqlite_differential.py``; these tests
look at the file through a raw sqlite3 connection, damage it, lock it, open bad paths, and read the query plans.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, timedelta
from typing import Any

import attrs
import pytest

import threadloom
from threadloom import open_store
from threadloom.domain import rules
from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import (
    OutcomeUnknown,
    ProcessingError,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence import codec
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.sqlite import connection
from threadloom.persistence.sqlite import schema as sqlite_schema
from threadloom.persistence.sqlite import store as sqlite_store
from threadloom.persistence.sqlite.store import SYNCHRONOUS, SqliteCheckpointer
from threadloom.testing.harness import START
from threadloom.testing.sqlite_harness import VmSteps, query_plan

LONG = timedelta(hours=1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def path(tmp_path: pathlib.Path) -> str:
    return str(tmp_path / "store.db")


@pytest.fixture
def store(path: str, clock: ManualClock) -> Iterator[SqliteCheckpointer]:
    with SqliteCheckpointer.open(path, clock=clock) as opened:
        yield opened


def raw(path: str) -> sqlite3.Connection:
    """A plain sqlite3 connection to the store's file, outside the store."""
    return sqlite3.connect(path, isolation_level=None, timeout=10)


class Thread:
    """Claims a thread of ``store`` and commits steps to it."""

    def __init__(self, store: SqliteCheckpointer, clock: ManualClock, thread_id: str, **claim: Any) -> None:
        self.store, self.clock, self.thread_id = store, clock, thread_id
        self.token = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=LONG, **claim)).token
        self.latest: str | None = None
        self.count = 0

    def step(
        self,
        *,
        events: int = 1,
        run_id: str = "run-1",
        status: CheckpointStatus = CheckpointStatus.RUNNING,
        origin: str | None = None,
        tenant_id: str | None = None,
        **extra: Any,
    ) -> str:
        self.count += 1
        cid = f"{self.thread_id}-c{self.count}"
        cp = Checkpoint(
            id=cid,
            parent=self.latest,
            thread_id=self.thread_id,
            run_id=run_id,
            status=status,
            created_at=self.clock.now(),
            state={"n": self.count},
            tenant_id=tenant_id,
            origin=CheckpointOrigin(parent_thread=origin) if origin else None,
        )
        drafts = [EventDraft(run_id=run_id, type="e", timestamp=self.clock.now(), payload=i) for i in range(events)]
        self.store.commit(self.thread_id, Commit(token=self.token, checkpoint=cp, events=drafts, **extra))
        self.latest = cid
        return cid


# -- the file ----------------------------------------------------------------------------------------------------


def test_file_is_in_wal_mode_with_the_chosen_synchronous(path: str, store: SqliteCheckpointer) -> None:
    assert raw(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert SYNCHRONOUS == "NORMAL"
    store.latest("t")  # a connection in the pool
    levels = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}
    assert [conn.execute("PRAGMA synchronous").fetchone()[0] for conn in store._db.idle] == [levels[SYNCHRONOUS]]
    with SqliteCheckpointer.open(path, synchronous="full") as durable:
        durable.latest("t")
        assert [conn.execute("PRAGMA synchronous").fetchone()[0] for conn in durable._db.idle] == [2]


def test_schema_version_is_recorded_once(path: str, clock: ManualClock) -> None:
    for _ in range(3):
        SqliteCheckpointer.open(path, clock=clock).close()
    rows = raw(path).execute("SELECT version, applied_at FROM schema_version ORDER BY version").fetchall()
    assert rows == [(version, codec.to_micros(START)) for version in range(1, sqlite_store.SCHEMA_VERSION + 1)]


def test_a_file_of_a_newer_schema_is_refused(path: str, clock: ManualClock) -> None:
    SqliteCheckpointer.open(path, clock=clock).close()
    raw(path).execute("INSERT INTO schema_version VALUES (?, 0)", (sqlite_store.SCHEMA_VERSION + 1,))
    with pytest.raises(ProcessingError) as info:
        SqliteCheckpointer.open(path, clock=clock)
    assert type(info.value) is StoreCorrupt
    assert info.value.operation == "open"
    assert "newer" in info.value.message


def test_times_are_integer_microseconds_of_the_store_clock(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")
    clock.advance(timedelta(seconds=3, microseconds=7))
    thread.step(effects=[EffectRecord(key="k", run_id="run-1", recorded_at=clock.now())])
    now = codec.to_micros(clock.now())
    conn = raw(path)
    assert conn.execute("SELECT typeof(committed_at), committed_at FROM checkpoints").fetchall() == [("integer", now)]
    assert conn.execute("SELECT typeof(committed_at), committed_at FROM events").fetchall() == [("integer", now)]
    assert conn.execute("SELECT typeof(updated_at), updated_at, typeof(claim_expires), claim_expires FROM threads").fetchall() == [
        ("integer", now, "integer", codec.to_micros(START + LONG))
    ]
    store.delete_thread("t", thread.token)
    assert conn.execute("SELECT typeof(deleted_at), deleted_at FROM threads").fetchall() == [("integer", now)]
    # Every time column of every table holds integers or NULL, never text.
    for table, column in [("threads", "claim_expires"), ("threads", "updated_at"), ("threads", "deleted_at"),
                          ("checkpoints", "committed_at"), ("events", "committed_at"), ("schema_version", "applied_at")]:
        kinds = {kind for (kind,) in conn.execute(f"SELECT DISTINCT typeof({column}) FROM {table}")}
        assert kinds <= {"integer", "null"}, (table, column, kinds)


def test_counter_mark_claims_and_places_live_in_the_file(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as first:
        child = Thread(first, clock, "kid")
        child.step(events=3, origin="parent")
        first.delete_thread("kid", child.token)
        clock.advance(timedelta(minutes=5))
        page = first.sweep(SweepPolicy(tombstone_age=timedelta(minutes=1)), None)
        assert page.reclaimed == ("kid",)
        other = Thread(first, clock, "other")
        other.step(origin="parent")
    with SqliteCheckpointer.open(path, clock=clock) as second:
        assert raw(path).execute("SELECT last_token, mark FROM store").fetchone() == (other.token, 5)
        assert second.claim("third", ClaimRequest(holder="r", ttl=LONG)).token == other.token + 1
        assert second.commit("other", Commit(token=other.token, events=[
            EventDraft(run_id="r", type="e", timestamp=clock.now())]))[0].seq == 6
        assert second.children("parent", limit=10) == ["other"]
        with pytest.raises(threadloom.ThreadDeleted):
            second.events_after("kid", 2, 10)


def test_closing_every_store_closes_every_connection(path: str, clock: ManualClock) -> None:
    stores = [SqliteCheckpointer.open(path, clock=clock) for _ in range(2)]
    threads = [Thread(stores[0], clock, f"t{i}") for i in range(8)]

    def work(index: int) -> None:
        for _ in range(5):
            threads[index].step()
            stores[index % 2].history(f"t{index}", limit=5)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for opened in stores:
        opened.close()
    # SQLite removes the write-ahead log when the file's last connection closes.
    assert not os.path.exists(path + "-wal")


def test_the_log_is_copied_back_into_the_file_off_the_commit_path(path: str, clock: ManualClock) -> None:
    # Far fewer frames than wal_autocheckpoint: only the store's checkpointer thread copies them into the file.
    store = SqliteCheckpointer.open(path, clock=clock)
    thread = Thread(store, clock, "t")
    size_before = os.path.getsize(path)
    for _ in range(connection.CHECKPOINT_EVERY):
        thread.step()
    checkpointer = store._db.checkpointer
    for _ in range(1000):  # bounded: the checkpointer was poked by the last commit
        if checkpointer.passes:
            break
        threading.Event().wait(0.01)
    assert checkpointer.passes >= 1
    assert os.path.getsize(path) > size_before  # the checkpoints' pages are in the file itself now
    names = {t.name for t in threading.enumerate()}
    assert any(name.startswith("threadloom-sqlite-checkpoint-") for name in names)
    store.close()
    assert not any(t.name.startswith("threadloom-sqlite-checkpoint-") for t in threading.enumerate())
    with SqliteCheckpointer.open(path, clock=clock) as again:
        assert [cp.id for cp in again.history("t", limit=2)] == [thread.latest, f"t-c{thread.count - 1}"]


# -- opening bad paths ---------------------------------------------------------------------------------------------


def test_a_directory_is_refused_as_a_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValidationError) as info:
        SqliteCheckpointer.open(tmp_path)
    assert info.value.field == "path"
    assert "directory" in str(info.value)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_missing_directory_is_a_validation_error_naming_it_and_nothing_is_created(
    tmp_path: pathlib.Path, read_only: bool
) -> None:
    """Found by a user: a missing directory was ``StoreUnavailable`` (retryable), but no retry creates it."""
    target = tmp_path / "missing" / "store.db"
    with pytest.raises(ValidationError) as info:
        SqliteCheckpointer.open(target, read_only=read_only)
    error = info.value
    assert error.field == "path" and not error.retryable
    assert f"the directory {str(tmp_path / 'missing')!r}" in str(error) and "does not exist" in str(error)
    assert not (tmp_path / "missing").exists()
    with pytest.raises(ValidationError) as through_url:
        open_store(f"sqlite:///{target}", read_only=read_only)
    assert through_url.value.field == "path" and "does not exist" in str(through_url.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["dangling-symlink", "symlink-loop", "name-too-long"])
def test_a_path_no_retry_can_open_is_a_validation_error(tmp_path: pathlib.Path, kind: str) -> None:
    """Found by hostile testing: these were ``StoreUnavailable`` (retryable), which no retry heals."""
    if kind == "dangling-symlink":  # a link to a file in a missing directory
        target = tmp_path / "link.db"
        target.symlink_to(tmp_path / "missing" / "store.db")
        says = f"the directory {str(tmp_path / 'missing')!r}"
    elif kind == "symlink-loop":
        target = tmp_path / "loop.db"
        target.symlink_to(target)
        says = "cannot name a file"
    else:
        target = tmp_path / ("a" * 300 + ".db")
        says = "cannot name a file"
    with pytest.raises(ValidationError) as info:
        SqliteCheckpointer.open(target)
    assert info.value.field == "path" and not info.value.retryable and says in str(info.value)
    assert not (tmp_path / "missing").exists()


def test_a_file_in_place_of_the_directory_is_a_validation_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "plain").write_text("a file, not a directory")
    for target in (tmp_path / "plain" / "store.db", tmp_path / "plain" / "sub" / "store.db"):
        with pytest.raises(ValidationError) as info:
            SqliteCheckpointer.open(target)
        assert info.value.field == "path" and str(tmp_path / "plain") in str(info.value)
    assert (tmp_path / "plain").read_text() == "a file, not a directory"


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 200
    target.write_bytes(content)
    with pytest.raises(ProcessingError) as info:
        SqliteCheckpointer.open(target)
    assert type(info.value) is StoreCorrupt and not info.value.retryable
    assert info.value.operation == "open"
    assert "not a SQLite database" in info.value.message
    assert info.value.__cause__ is None
    assert target.read_bytes() == content


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"path": 3}, "path"),
        ({"path": None}, "path"),
        ({"path": b"store.db"}, "path"),
        ({"path": ""}, "path"),
        ({"path": ":memory:"}, "path"),
        ({"path": "file:store.db?mode=memory"}, "path"),
        ({"path": "a\x00b.db"}, "path"),
        ({"busy_timeout": timedelta(0)}, "busy_timeout"),
        ({"busy_timeout": 5}, "busy_timeout"),
        ({"clock": object()}, "clock"),
        ({"synchronous": "SOMETIMES"}, "synchronous"),
        ({"synchronous": 1}, "synchronous"),
    ],
)
def test_bad_open_arguments_are_validation_errors(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any], field: str
) -> None:
    monkeypatch.chdir(tmp_path)
    options = {"path": str(tmp_path / "store.db"), **arguments}
    with pytest.raises(ValidationError) as info:
        SqliteCheckpointer.open(options.pop("path"), **options)
    assert info.value.field == field
    assert os.listdir(tmp_path) == []  # nothing created


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError):
        SqliteCheckpointer("x.db", ManualClock(START), timedelta(seconds=1), "NORMAL", None)  # type: ignore[arg-type]


def test_open_store_builds_a_sqlite_store(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    clock = ManualClock(START)
    with open_store("sqlite:///relative.db", clock=clock) as relative:
        assert isinstance(relative, SqliteCheckpointer)
        assert relative.path == str(tmp_path / "relative.db")
    with open_store(f"sqlite:///{tmp_path / 'absolute.db'}", busy_timeout=timedelta(seconds=1)) as absolute:
        assert absolute.path == str(tmp_path / "absolute.db")
    with open_store("sqlite://") as default:
        assert default.path == str(tmp_path / "threadloom.db")
    assert threadloom.SqliteCheckpointer is SqliteCheckpointer and "SqliteCheckpointer" in threadloom.__all__


# -- damaged rows --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "call"),
    [
        ("UPDATE checkpoints SET body = '{not json'", lambda s: s.latest("victim")),
        ("UPDATE checkpoints SET body = '{not json'", lambda s: s.history("victim", limit=10)),
        ("UPDATE checkpoints SET body = '[1, 2]'", lambda s: s.checkpoint("victim", "victim-c1")),
        ("UPDATE checkpoints SET body = '{\"id\": 1}'", lambda s: s.lookup_run("victim", ["run-1"])),
        ("UPDATE pending SET body = 'null'", lambda s: s.latest("victim")),
        ("UPDATE events SET body = '{'", lambda s: s.events_after("victim", 0, 10)),
        ("UPDATE effects SET body = '\"text\"'", lambda s: s.effect("victim", "k")),
        ("UPDATE threads SET metadata = '{' WHERE thread_id = 'victim'", lambda s: s.threads(ThreadQuery(tenant_id=None))),
        ("UPDATE threads SET metadata = '[1]' WHERE thread_id = 'victim'", lambda s: s.commit(
            "victim", Commit(token=1, metadata={"x": "y"}))),
        ("UPDATE threads SET latest_status = 'sleepy' WHERE thread_id = 'victim'",
         lambda s: s.threads(ThreadQuery(tenant_id=None))),
    ],
)
def test_a_damaged_row_is_a_processing_error_naming_the_thread(
    path: str, store: SqliteCheckpointer, clock: ManualClock, damage: str, call: Callable[[Any], Any]
) -> None:
    victim = Thread(store, clock, "victim")
    assert victim.token == 1
    victim.step(
        pending_writes=[PendingWrite(checkpoint_id="victim-c1", task_id="t", node_id="n")],
        effects=[EffectRecord(key="k", run_id="run-1", recorded_at=clock.now())],
        metadata={"m": "1"},
    )
    raw(path).execute(damage)
    with pytest.raises(ProcessingError) as info:
        call(store)
    assert "'victim'" in info.value.message
    assert type(info.value) is StoreCorrupt  # a damaged row: not retryable


# -- driver errors, mapped in one place ------------------------------------------------------------------------------


def test_a_writer_holding_the_file_past_the_busy_timeout_is_a_processing_error(
    path: str, clock: ManualClock
) -> None:
    with SqliteCheckpointer.open(path, clock=clock, busy_timeout=timedelta(milliseconds=200)) as store:
        thread = Thread(store, clock, "t")
        thread.step(events=2)
        holder = raw(path)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(ProcessingError) as info:
                store.claim("u", ClaimRequest(holder="r", ttl=LONG))
            assert type(info.value) is StoreUnavailable  # nothing was in flight: not OutcomeUnknown
            assert info.value.retryable
            assert info.value.operation == "claim"
            assert "'u'" in info.value.message and "busy timeout" in info.value.message
            # Readers never wait for a writer (WAL): one snapshot, the last committed state.
            assert [e.seq for e in store.events_after("t", 0, 10)] == [1, 2]
            assert store.latest("t").checkpoint.id == thread.latest  # type: ignore[union-attr]
        finally:
            holder.execute("ROLLBACK")
        assert store.claim("u", ClaimRequest(holder="r", ttl=LONG)).token == thread.token + 1


def _arm_on(conn: sqlite3.Connection, statement: str) -> dict[str, bool]:
    """Makes ``conn`` fail with SQLITE_INTERRUPT once it starts running ``statement``: a real driver failure."""
    armed = {"on": False}

    def trace(sql: str) -> None:
        if sql.strip().upper().startswith(statement):
            armed["on"] = True

    conn.set_trace_callback(trace)
    conn.set_progress_handler(lambda: 1 if armed["on"] else 0, 1)
    return armed


def test_a_commit_statement_that_failed_with_its_transaction_still_open_did_not_apply(
    store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")
    (conn,) = store._db.idle
    armed = _arm_on(conn, "COMMIT")
    with pytest.raises(ProcessingError) as info:
        store.commit("t", Commit(token=thread.token, events=[EventDraft(run_id="r", type="e", timestamp=clock.now())]))
    # SQLite kept the transaction open: the rollback discards it, so the error says it did not apply.
    assert type(info.value) is ProcessingError and "interrupted" in info.value.message
    assert info.value.operation == "commit" and "'t'" in info.value.message
    armed["on"] = False
    assert store._db.idle == []  # the failed connection was not pooled again
    assert store.events_after("t", 0, 10) == []
    assert len(store.commit("t", Commit(token=thread.token, events=[
        EventDraft(run_id="r", type="e", timestamp=clock.now())]))) == 1


def test_a_failed_commit_is_known_unapplied_only_while_its_transaction_is_open_or_the_disk_was_full(
    tmp_path: pathlib.Path,
) -> None:
    from threadloom.persistence.sqlite.errors import not_applied

    conn = raw(str(tmp_path / "n.db"))
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA max_page_count = 2")
    try:
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))")
        raise AssertionError("the insert should have filled the file")
    except sqlite3.OperationalError as error:
        full = error
    conn.set_progress_handler(lambda: 1, 1)
    try:
        conn.execute("SELECT count(*) FROM t")
        raise AssertionError("the progress handler should have interrupted the query")
    except sqlite3.OperationalError as error:
        interrupted = error
    conn.set_progress_handler(None, 1)
    assert not conn.in_transaction
    assert not_applied(conn, full)  # SQLITE_FULL: SQLite could not write the commit, and rolled back
    assert not not_applied(conn, interrupted)  # rolled back by SQLite after some other failure: unknown
    conn.execute("BEGIN")
    assert not_applied(conn, interrupted)  # still open: the rollback that follows discards it
    conn.execute("ROLLBACK")
    conn.close()
    assert not not_applied(conn, full)  # a closed connection tells nothing


def test_a_failure_before_the_commit_statement_is_a_plain_processing_error(
    store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")
    (conn,) = store._db.idle
    _arm_on(conn, "INSERT INTO EVENTS")
    with pytest.raises(ProcessingError) as info:
        store.commit("t", Commit(token=thread.token, events=[EventDraft(run_id="r", type="e", timestamp=clock.now())]))
    assert type(info.value) is ProcessingError
    assert store.events_after("t", 0, 10) == []


def test_a_read_only_connection_is_a_processing_error(store: SqliteCheckpointer, clock: ManualClock) -> None:
    store.latest("t")
    (conn,) = store._db.idle
    conn.execute("PRAGMA query_only = ON")
    with pytest.raises(ProcessingError) as info:
        store.claim("t", ClaimRequest(holder="r", ttl=LONG))
    assert type(info.value) is StoreUnavailable and "read-only" in info.value.message


def test_the_error_mapping_classifies_real_driver_errors(tmp_path: pathlib.Path, store: SqliteCheckpointer) -> None:
    def caught(call: Callable[[], Any]) -> sqlite3.Error:
        with pytest.raises(sqlite3.Error) as info:
            call()
        return info.value

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"x" * 4096)
    locked = raw(str(tmp_path / "locked.db"))
    locked.execute("PRAGMA journal_mode = WAL")
    locked.execute("CREATE TABLE t (x)")
    locked.execute("BEGIN IMMEDIATE")
    waiter = sqlite3.connect(str(tmp_path / "locked.db"), timeout=0, isolation_level=None)
    read_only = raw(str(tmp_path / "ro.db"))
    read_only.execute("PRAGMA query_only = ON")
    cases = {
        "not a SQLite database": (StoreCorrupt, caught(lambda: sqlite3.connect(garbage).execute("SELECT * FROM sqlite_master"))),
        "directory exists": (StoreUnavailable, caught(lambda: sqlite3.connect(tmp_path / "no" / "such.db"))),
        "busy timeout": (StoreUnavailable, caught(lambda: waiter.execute("BEGIN IMMEDIATE"))),
        "read-only": (StoreUnavailable, caught(lambda: read_only.execute("CREATE TABLE t (x)"))),
        "SQLite failed": (ProcessingError, caught(lambda: read_only.execute("SELECT * FROM no_such_table"))),
    }
    for expected, (kind, error) in cases.items():
        mapped = store._db.failure(error, "claim", "t")
        assert type(mapped) is kind and expected in mapped.message and "'t'" in mapped.message, mapped
        assert mapped.retryable is (kind is StoreUnavailable)
        in_flight = store._db.failure(error, "commit", "t", committing=True)
        assert type(in_flight) is OutcomeUnknown and in_flight.operation == "commit"
    locked.execute("ROLLBACK")


def test_a_full_disk_is_store_unavailable_and_the_retry_applies(store: SqliteCheckpointer, clock: ManualClock) -> None:
    thread = Thread(store, clock, "t")
    thread.step(events=1)
    (conn,) = store._db.idle
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: SQLITE_FULL, a real driver error
    cid = f"t-c{thread.count + 1}"
    big = Commit(
        token=thread.token,
        checkpoint=Checkpoint(id=cid, parent=thread.latest, thread_id="t", run_id="run-1",
                              status=CheckpointStatus.RUNNING, created_at=clock.now(), state={"blob": "x" * 50_000}),
        events=[EventDraft(run_id="run-1", type="e", timestamp=clock.now())],
    )
    with pytest.raises(ProcessingError) as info:
        store.commit("t", big)
    assert type(info.value) is StoreUnavailable and info.value.retryable
    assert "full" in info.value.message and "'t'" in info.value.message and "nothing was written" in info.value.message
    assert [cp.id for cp in store.history("t", limit=5)] == [thread.latest]
    assert [e.seq for e in store.events_after("t", 0, 10)] == [1]
    assert [r.seq for r in store.commit("t", big)] == [2]  # the connection that failed was dropped
    assert store.latest("t").checkpoint.id == cid  # type: ignore[union-attr]


def test_a_closed_store_and_its_queue_refuse_with_store_closed(store: SqliteCheckpointer, clock: ManualClock) -> None:
    Thread(store, clock, "t")
    (conn,) = store._db.idle
    store.close()
    with pytest.raises(sqlite3.ProgrammingError) as info:  # close() closed the idle connection
        conn.execute("SELECT 1")
    assert type(store._db.failure(info.value, "latest", "t")) is StoreClosed
    for call in (lambda: store.latest("t"), lambda: store.queue.entry(1), lambda: store.queue.lease("w", LONG)):
        with pytest.raises(StoreClosed) as refused:
            call()
        assert not refused.value.retryable and "closed" in refused.value.message


# -- the statements of a commit ----------------------------------------------------------------------------------------


def test_a_step_commit_runs_five_statements_in_its_transaction(store: SqliteCheckpointer, clock: ManualClock) -> None:
    """A checkpoint, a pending write and an event: the thread's row read, the checkpoint's insert (also the
    duplicate check), the pending write put in place of the old one, the event's insert, the thread's row update."""
    thread = Thread(store, clock, "t")

    def write(n: int) -> PendingWrite:
        return PendingWrite(checkpoint_id=f"t-c{n}", task_id="task", node_id="n", payload=n)

    thread.step(pending_writes=[write(1)])
    (conn,) = store._db.idle
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    thread.step(pending_writes=[write(2)])
    conn.set_trace_callback(None)
    assert [" ".join(statement.split()[:3]) for statement in seen] == [
        "BEGIN IMMEDIATE",
        "SELECT claim_token, next_seq,",
        "INSERT INTO checkpoints",
        "INSERT INTO pending",
        "INSERT INTO events",
        "UPDATE threads SET",
        "COMMIT",
    ]
    assert store.latest("t").pending_writes == (write(2),)  # type: ignore[union-attr]


def test_a_new_checkpoint_leaves_exactly_its_own_pending_writes_in_the_file(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")

    def writes(n: int, count: int) -> list[PendingWrite]:
        return [PendingWrite(checkpoint_id=f"t-c{n}", task_id=f"task{i}", node_id="n", payload=[n, i]) for i in range(count)]

    for n, count in enumerate([3, 1, 2, 0, 2], start=1):
        thread.step(pending_writes=writes(n, count))
        rows = raw(path).execute("SELECT idx FROM pending WHERE thread_id = 't' ORDER BY idx").fetchall()
        assert rows == [(i,) for i in range(count)], (n, rows)
        assert store.latest("t").pending_writes == tuple(writes(n, count))  # type: ignore[union-attr]
    store.commit("t", Commit(token=thread.token, pending_writes=writes(5, 3)[2:]))  # appended after the two
    assert store.latest("t").pending_writes == (*writes(5, 2), writes(5, 3)[2])  # type: ignore[union-attr]


def test_a_duplicate_id_is_found_before_a_misdirected_write_and_before_a_retract_cut(
    store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")
    thread.step(status=CheckpointStatus.COMPLETED)
    thread.step(events=2)
    thread.step(events=0)

    def checkpoint(cid: str, parent: str | None) -> Checkpoint:
        return Checkpoint(id=cid, parent=parent, thread_id="t", run_id="run-1", status=CheckpointStatus.RUNNING,
                          created_at=clock.now())

    misdirected = [PendingWrite(checkpoint_id="elsewhere", task_id="task", node_id="n")]
    for commit in (
        Commit(token=thread.token, checkpoint=checkpoint("t-c1", "t-c3"), pending_writes=misdirected),
        # the retract turn would cut t-c2, but the history holds it when the commit is checked
        Commit(token=thread.token, checkpoint=checkpoint("t-c2", "t-c3"), retract_turn=True, pending_writes=misdirected),
    ):
        with pytest.raises(threadloom.InvalidCommit) as info:
            store.commit("t", commit)
        assert "already in the history" in info.value.reason
        assert [cp.id for cp in store.history("t", limit=5)] == ["t-c3", "t-c2", "t-c1"]
        assert [e.seq for e in store.events_after("t", 0, 10)] == [1, 2, 3]


# -- threads of one process ------------------------------------------------------------------------------------------


def test_eight_threads_commit_through_two_stores_with_contiguous_numbers(path: str, clock: ManualClock) -> None:
    stores = [SqliteCheckpointer.open(path, clock=clock) for _ in range(2)]
    shared = stores[0].claim("shared", ClaimRequest(holder="r", ttl=LONG)).token
    own = [Thread(stores[i % 2], clock, f"own{i}") for i in range(8)]
    returned: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            seqs = []
            for n in range(25):
                own[index].step(events=2)
                records = stores[index % 2].commit("shared", Commit(token=shared, events=[
                    EventDraft(run_id="r", type="e", timestamp=clock.now(), payload=[index, n, k]) for k in range(1 + n % 3)
                ]))
                seqs += [record.seq for record in records]
            returned[index] = seqs
        except BaseException as error:  # reported below
            errors.append(error)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    read = [record.seq for record in stores[1].events_after("shared", 0, 10_000)]
    assert read == list(range(1, len(read) + 1)) == sorted(itertools.chain(*returned.values()))
    for seqs in returned.values():
        assert seqs == sorted(seqs)
    for index, thread in enumerate(own):
        assert [r.seq for r in stores[index % 2].events_after(thread.thread_id, 0, 1000)] == list(range(1, 51))
        assert len(stores[0].history(thread.thread_id, limit=1000)) == 25
    for opened in stores:
        opened.close()


# -- indexes (DESIGN §3 rule 9) ------------------------------------------------------------------------------------

_ALLOWED_PLAN = re.compile(
    r"^(SEARCH (?!.*\bUSING (TEMP|AUTOMATIC))"
    r"|COMPOUND QUERY|LEFT-MOST SUBQUERY|UNION ALL|CO-ROUTINE|SCAN \(subquery-\d+\)|SCAN CONSTANT ROW"
    r"|MERGE \(UNION ALL\)$|LEFT$|RIGHT$"
    r"|(CORRELATED )?SCALAR SUBQUERY|LIST SUBQUERY|SCAN (j|f|m|json_each) VIRTUAL TABLE)"
)


def _registry_statements() -> Iterator[str]:
    """Every shape of the registry's queries: each combination of ``threads``' options, ``incomplete`` with and
    without a cursor."""
    cursor = ThreadCursor(updated_at=START, thread_id="t")
    for after, since, graph, statuses in itertools.product([False, True], repeat=4):
        query = ThreadQuery(
            tenant_id="tenant",
            after=cursor if after else None,
            updated_since=START if since else None,
            graph_id="g" if graph else None,
            statuses=frozenset({ThreadStatus.IDLE, ThreadStatus.RUNNING}) if statuses else None,
        )
        statement = sqlite_schema.threads_statement(query, 0)
        assert statement is not None
        yield statement[0]
    for after in (None, cursor):
        yield sqlite_schema.incomplete_statement("tenant", 10, after, 0)[0]


def test_every_statement_is_answered_through_an_index(path: str, store: SqliteCheckpointer) -> None:
    conn = raw(path)
    statements = dict(sqlite_schema.STATEMENTS)
    statements.update({f"registry{i}": sql for i, sql in enumerate(_registry_statements())})
    assert len(statements) > 60
    bad = {}
    for name, sql in statements.items():
        plan = query_plan(conn, sql)
        wrong = [line for line in plan if not _ALLOWED_PLAN.match(line)]
        if wrong:
            bad[name] = plan
    assert not bad, bad
    expected = {
        "HISTORY": "USING PRIMARY KEY (thread_id=?)",
        "HISTORY_BEFORE": "USING PRIMARY KEY (thread_id=? AND position<?)",
        "SEARCH_HISTORY": "USING PRIMARY KEY (thread_id=? AND position<?)",
        "LATEST": "USING PRIMARY KEY (thread_id=?)",
        "CHECKPOINT": "checkpoints_id (thread_id=? AND id=?)",
        "LOOKUP_RUN": "checkpoints_run (thread_id=? AND run_id=?)",
        "CHILDREN": "children_listed (parent=? AND place>?)",
        "EVENTS": "events USING PRIMARY KEY (thread_id=? AND seq>?)",
        "SWEEP_PAGE": "threads USING PRIMARY KEY (thread_id>?)",
        "AGE_CUTOFF": "checkpoints USING PRIMARY KEY (thread_id=?)",
        "NEWEST_EXPIRED_EVENT": "events USING PRIMARY KEY (thread_id=? AND seq<?)",
        "NEWEST_SETTLED": "checkpoints_settled (thread_id=?)",
        "TENANTS": "threads_registry (latest_tenant>?)",
        "TENANTLESS": "threads_registry (latest_tenant=?)",
        "registry0": "threads_registry (latest_tenant=? AND <expr>=?)",
        "registry15": "threads_registry (latest_tenant=?",
        "registry16": "threads_registry (latest_tenant=? AND <expr>=?)",
        "registry17": "threads_registry (latest_tenant=? AND <expr>=? AND (updated_at,thread_id)>(?,?))",
        "GRAPH_THREADS": "threads_graph (latest_graph_id=? AND thread_id>?)",
        "TENANT_THREADS": "threads_tenant (latest_tenant=? AND thread_id>?)",
        "RESTAMP_EVENTS": "events USING PRIMARY KEY (thread_id=?)",
        "MEMBERS": "access_members USING PRIMARY KEY (grp=?)",
    }
    for name, fragment in expected.items():
        assert any(fragment in line for line in query_plan(conn, statements[name])), (name, query_plan(conn, statements[name]))


def test_reads_of_a_long_history_cost_what_they_cost_on_a_short_one(store: SqliteCheckpointer, clock: ManualClock) -> None:
    short, long = Thread(store, clock, "short"), Thread(store, clock, "long")
    for thread, size in ((short, 150), (long, 3000)):
        for n in range(size):
            thread.step(run_id=f"run-{n % 7}", events=1, status=CheckpointStatus.COMPLETED if n % 50 == 0 else CheckpointStatus.RUNNING,
                        effects=[EffectRecord(key=f"k{n}", run_id="r", recorded_at=clock.now())] if n % 10 == 0 else ())
    steps = VmSteps(store)
    calls: dict[str, Callable[[str, Thread], Any]] = {
        "latest": lambda t, th: store.latest(t),
        "checkpoint": lambda t, th: store.checkpoint(t, f"{t}-c{th.count - 120}"),
        "history": lambda t, th: store.history(t, limit=100),
        "history before": lambda t, th: store.history(t, limit=20, before=f"{t}-c{th.count - 100}"),
        "search_history matching nothing": lambda t, th: store.search_history(t, metadata={"no": "x"}, limit=10, scan=100),
        "search_history before": lambda t, th: store.search_history(
            t, metadata={}, limit=10, before=f"{t}-c{th.count - 100}", scan=100
        ),
        "lookup_run": lambda t, th: store.lookup_run(t, ["run-3", "run-5", "nobody"]),
        "events_after": lambda t, th: store.events_after(t, th.count - 100, 100),
        "effect": lambda t, th: store.effect(t, "k100"),
        "commit": lambda t, th: th.step(events=2),
        "retract commit": lambda t, th: (th.step(status=CheckpointStatus.COMPLETED), th.step(retract_turn=True)),
        "prune that keeps all": lambda t, th: store.prune(t, RetentionPolicy(max_checkpoints=1_000_000)),
        "prune by an age nothing has": lambda t, th: store.prune(t, RetentionPolicy(max_age=timedelta(days=365))),
        "prune by event count": lambda t, th: store.prune(t, RetentionPolicy(max_events=th.count)),
    }
    for name, call in calls.items():
        cost = {thread.thread_id: steps(lambda: call(thread.thread_id, thread)) for thread in (short, long)}
        assert cost["long"] <= cost["short"] * 1.5 + 200, (name, cost)


def test_registry_sweep_and_children_pages_cost_the_same_over_many_threads(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    def populate(prefix: str, count: int, tenant: str) -> None:
        for n in range(count):
            thread = Thread(store, clock, f"{prefix}{n:05d}", tenant_id=tenant)
            thread.step(tenant_id=tenant, status=CheckpointStatus.RUNNING if n % 2 else CheckpointStatus.COMPLETED)
            store.release(thread.thread_id, thread.token)
            kid = Thread(store, clock, f"{prefix}{n:05d}-kid")
            kid.step(origin=f"{prefix}-parent")
            if n % 4:
                store.delete_thread(kid.thread_id, kid.token)  # tombstoned children keep their place, unlisted
            clock.advance(timedelta(seconds=1))

    populate("few", 20, "few")
    populate("many", 1000, "many")
    steps = VmSteps(store)
    for name, call in {
        "threads": lambda p: store.threads(ThreadQuery(tenant_id=p, limit=10)),
        "threads by status": lambda p: store.threads(ThreadQuery(tenant_id=p, limit=5, statuses=frozenset({ThreadStatus.IDLE}))),
        "threads after": lambda p: store.threads(ThreadQuery(tenant_id=p, limit=10, after=store.threads(
            ThreadQuery(tenant_id=p, limit=10)).next)),
        "incomplete": lambda p: store.incomplete(p, limit=5),
        "children": lambda p: store.children(f"{p}-parent", limit=3),
        "sweep page": lambda p: store.sweep(SweepPolicy(batch_size=10, retention=RetentionPolicy(max_checkpoints=1)), None, after=p),
    }.items():
        cost = {p: steps(lambda: call(p)) for p in ("few", "many")}
        assert cost["many"] <= cost["few"] * 1.5 + 300, (name, cost)


# -- group commit ------------------------------------------------------------------------------------------------


def _batched(store: SqliteCheckpointer, calls: list[Callable[[], Any]]) -> tuple[list[Any], Callable[[], None]]:
    """Queues ``calls`` on threads so that the first runs alone and the rest share the next batch.

    Returns the outcome slots (filled once ``finish`` has been called) and ``finish``, which lets them run and
    waits for them.
    """
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            outcomes[index] = ("ok", calls[index]())
        except Exception as error:  # the outcome under test
            outcomes[index] = ("error", error)

    def wait_until(condition: Callable[[], bool]) -> None:
        for _ in range(10_000):
            if condition():
                return
            threading.Event().wait(0.001)
        raise AssertionError("the writes did not queue up")

    store._db.write_lock.acquire()  # holds every batch of this store at its start
    workers = [threading.Thread(target=run, args=(0,))]
    workers[0].start()
    wait_until(lambda: store._db.leading and not store._db.waiting)  # the first leads a batch of its own
    for index in range(1, len(calls)):
        workers.append(threading.Thread(target=run, args=(index,)))
        workers[-1].start()
    wait_until(lambda: len(store._db.waiting) == len(calls) - 1)

    def finish() -> None:
        store._db.write_lock.release()
        for worker in workers:
            worker.join(timeout=60)

    return outcomes, finish


def test_a_refused_write_in_a_batch_rolls_back_alone(store: SqliteCheckpointer, clock: ManualClock) -> None:
    threads = [Thread(store, clock, f"t{i}") for i in range(4)]
    for thread in threads:
        thread.step(events=0)

    def commit(index: int, token: int) -> Callable[[], Any]:
        return lambda: store.commit(f"t{index}", Commit(token=token, events=[
            EventDraft(run_id="r", type="e", timestamp=clock.now())] * 2, metadata={"i": str(index)}))

    outcomes, finish = _batched(store, [
        commit(0, threads[0].token), commit(1, threads[1].token), commit(2, 999), commit(3, threads[3].token)])
    finish()
    assert [kind for kind, _ in outcomes] == ["ok", "ok", "error", "ok"]
    assert isinstance(outcomes[2][1], threadloom.StaleClaim)
    for index in (0, 1, 3):
        assert [r.seq for r in store.events_after(f"t{index}", 0, 10)] == [1, 2]
    assert store.events_after("t2", 0, 10) == []
    assert [s.metadata for s in store.threads(ThreadQuery(tenant_id=None)).items if s.thread_id == "t2"] == [{}]


def test_a_failed_commit_of_a_batch_fails_each_write_it_held_as_not_applied(
    store: SqliteCheckpointer, clock: ManualClock
) -> None:
    threads = [Thread(store, clock, f"t{i}") for i in range(4)]
    (conn,) = store._db.idle
    commits = {"seen": 0}

    def trace(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            commits["seen"] += 1

    conn.set_trace_callback(trace)
    conn.set_progress_handler(lambda: 1 if commits["seen"] == 2 else 0, 1)  # the second COMMIT fails

    def commit(index: int, token: int) -> Callable[[], Any]:
        return lambda: store.commit(f"t{index}", Commit(token=token, events=[
            EventDraft(run_id="r", type="e", timestamp=clock.now())]))

    outcomes, finish = _batched(store, [
        commit(0, threads[0].token), commit(1, threads[1].token), commit(2, 999), commit(3, threads[3].token)])
    finish()
    assert outcomes[0][0] == "ok"
    # The interrupted COMMIT left the transaction open, and the rollback discarded it: each write it held says
    # it failed (not OutcomeUnknown), and none applied.
    assert type(outcomes[1][1]) is ProcessingError and "'t1'" in outcomes[1][1].message
    assert isinstance(outcomes[2][1], threadloom.StaleClaim)  # refused before the COMMIT: its own outcome
    assert type(outcomes[3][1]) is ProcessingError and "'t3'" in outcomes[3][1].message
    assert [len(store.events_after(f"t{i}", 0, 10)) for i in range(4)] == [1, 0, 0, 0]


def test_a_commit_changed_after_construction_is_refused_alone_while_others_commit(tmp_path) -> None:
    """Hostile finding: a commit whose values were changed after it was built poisoned a whole group commit."""
    import concurrent.futures

    from threadloom import Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft, SqliteCheckpointer
    from threadloom.domain.errors import ValidationError

    store = SqliteCheckpointer.open(tmp_path / "poison.db")
    from datetime import datetime

    now = store_now = datetime.now(UTC)
    claims = {f"t{i}": store.claim(f"t{i}", ClaimRequest(holder="r", ttl=timedelta(minutes=5))) for i in range(4)}

    def good(thread_id: str) -> int:
        done = 0
        for n in range(30):
            store.commit(thread_id, Commit(token=claims[thread_id].token,
                                           events=[EventDraft(run_id="r", type="e", timestamp=store_now, payload=n)]))
            done += 1
        return done

    def poisoned() -> int:
        refused = 0
        for n in range(30):
            cp = Checkpoint(id=f"p{n}", parent=None, thread_id="t0", run_id="r", status=CheckpointStatus.RUNNING,
                            created_at=now, state={"n": n})
            object.__setattr__(cp, "run_id", None)
            try:
                store.commit("t0", Commit(token=claims["t0"].token, checkpoint=cp))
            except ValidationError as error:
                assert error.field == "checkpoint.run_id"
                refused += 1
        return refused

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        goods = [pool.submit(good, f"t{i}") for i in range(1, 4)]
        bad = pool.submit(poisoned)
        assert [f.result() for f in goods] == [30, 30, 30]
        assert bad.result() == 30
    for i in range(1, 4):
        assert [e.seq for e in store.events_after(f"t{i}", 0, 100)] == list(range(1, 31))
    assert store.latest("t0") is None
    store.close()


def test_the_tenant_indexes_hold_stamped_rows_only_and_a_graph_change_still_moves_the_thread(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    """Migration 6: unstamped rows (no access schema) add no tenant index entry, and a step's commit leaves the
    thread's graph and tenant entries alone, while a commit that changes the graph still moves them."""
    definitions = dict(raw(path).execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'").fetchall())
    for table in ("checkpoints", "pending", "events", "effects"):
        assert definitions[f"{table}_access_tenant"].endswith("WHERE access_tenant IS NOT NULL"), table
    assert definitions["threads_tenant"].endswith("WHERE latest_graph_id IS NOT NULL")
    token = store.claim("t", ClaimRequest(holder="run-1", ttl=LONG)).token
    parent = None
    for number, graph_id in enumerate(("g1", "g2", "g2"), start=1):
        cp = Checkpoint(
            id=f"c{number}", parent=parent, thread_id="t", run_id="run-1", status=CheckpointStatus.RUNNING,
            created_at=clock.now(), state={"n": number}, graph_id=graph_id,
        )
        store.commit("t", Commit(token=token, checkpoint=cp, events=[EventDraft(run_id="run-1", type="e",
                                                                                 timestamp=clock.now())]))
        parent = cp.id
        assert store.graph_threads(graph_id, limit=10) == ["t"]
        assert store.graph_threads("g1" if graph_id == "g2" else "g2", limit=10) == []
        assert [entry.thread_id for entry in store.export_tenant(None, limit=10).threads] == ["t"]
    stamped = raw(path).execute("SELECT count(*) FROM events WHERE access_tenant IS NOT NULL").fetchone()
    assert stamped == (0,)


# -- checkpoint metadata column (migration 7) ------------------------------------------------------------------------


def test_search_history_reads_the_metadata_of_rows_written_before_migration_7(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    token = store.claim("t", ClaimRequest(holder="r", ttl=LONG)).token
    parent = None
    for index, metadata in enumerate([{"k": "a"}, {"k": "b"}, {}, {"k": "a", "j": "x"}]):
        cp = Checkpoint(id=f"c{index}", parent=parent, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING,
                        created_at=clock.now(), metadata=metadata)  # fmt: skip
        store.commit("t", Commit(token=token, checkpoint=cp))
        parent = cp.id
    conn = raw(path)
    columns = conn.execute("SELECT id, metadata FROM checkpoints ORDER BY position").fetchall()
    assert [(cp_id, json.loads(text)) for cp_id, text in columns] == [
        ("c0", {"k": "a"}), ("c1", {"k": "b"}), ("c2", {}), ("c3", {"k": "a", "j": "x"})
    ]  # fmt: skip
    with conn:  # as a file migrated from version 6 holds them: no column value, the metadata in the body only
        conn.execute("UPDATE checkpoints SET metadata = NULL WHERE id IN ('c0', 'c2', 'c3')")
    assert [cp.id for cp in store.search_history("t", metadata={"k": "a"}, limit=10).items] == ["c3", "c0"]
    assert [cp.id for cp in store.search_history("t", metadata={"k": "a", "j": "x"}, limit=10).items] == ["c3"]
    assert [cp.id for cp in store.search_history("t", metadata={"k": "b"}, limit=10).items] == ["c1"]
    assert len(store.search_history("t", metadata={}, limit=10).items) == 4


# -- non-decreasing commit stamps (migration 8) ---------------------------------------------------------------------


def _stamps(path: str) -> tuple[list[tuple[str, int]], list[tuple[int, int]]]:
    conn = raw(path)
    checkpoints = conn.execute("SELECT id, committed_at FROM checkpoints ORDER BY position").fetchall()
    events = conn.execute("SELECT seq, committed_at FROM events ORDER BY seq").fetchall()
    return checkpoints, events


def test_a_clock_that_steps_back_stamps_the_threads_last_stamp_again(
    path: str, store: SqliteCheckpointer, clock: ManualClock
) -> None:
    thread = Thread(store, clock, "t")
    first = codec.to_micros(clock.now())
    thread.step()
    clock.advance(-timedelta(seconds=10))
    thread.step()
    store.commit("t", Commit(token=thread.token, events=(EventDraft(run_id="run-1", type="log", timestamp=clock.now()),)))
    clock.advance(timedelta(seconds=30))
    thread.step()
    later = codec.to_micros(clock.now())
    checkpoints, events = _stamps(path)
    assert [at for _id, at in checkpoints] == [first, first, later]
    assert [at for _seq, at in events] == [first, first, first, later]
    (updated,) = raw(path).execute("SELECT updated_at FROM threads").fetchone()
    assert updated == later  # the registry's time is the clock's, as before


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_max_age_removes_the_prefix_a_clock_that_stepped_back_left(
    kind: str, path: str, clock: ManualClock
) -> None:
    """c1 was committed while the clock read 10 s before c0's commit: it is stamped as c0, so whatever max_age
    removes is a prefix of the history and of the log; both stores agree."""
    opened = InMemoryCheckpointer(clock) if kind == "memory" else SqliteCheckpointer.open(path, clock=clock)
    with opened as store:
        token = store.claim("t", ClaimRequest(holder="r", ttl=LONG)).token
        parent = None
        for index, step_back in enumerate((0, -10, 30, 0)):
            clock.advance(timedelta(seconds=step_back))
            cp = Checkpoint(id=f"c{index}", parent=parent, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING,
                            created_at=clock.now())  # fmt: skip
            store.commit("t", Commit(token=token, checkpoint=cp,
                                     events=(EventDraft(run_id="r", type="step", timestamp=clock.now()),)))  # fmt: skip
            parent = cp.id
        # Stamps: c0 at START, c1 at START (the clock read START - 10 s), c2 and c3 at START + 20 s, the clock's time
        # now. Stamped by the clock alone, c1 would expire before c0 (a hole in the history); it does not.
        store.prune("t", RetentionPolicy(max_age=timedelta(seconds=25)))
        assert [cp.id for cp in store.history("t", limit=10)] == ["c3", "c2", "c1", "c0"]
        assert [event.seq for event in store.events_after("t", 0, limit=10)] == [1, 2, 3, 4]
        store.prune("t", RetentionPolicy(max_age=timedelta(seconds=19)))
        assert [cp.id for cp in store.history("t", limit=10)] == ["c3", "c2"]
        assert [event.seq for event in store.events_after("t", 2, limit=10)] == [3, 4]


def test_a_file_of_version_7_migrates_to_8_and_keeps_its_data(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as store:
        thread = Thread(store, clock, "t")
        ids = [thread.step(run_id=run) for run in ("r1", "r2", "r2", "r1", "r1", "r3")]
    conn = raw(path)
    with conn:  # as version 7 left a file: the age indexes, every checkpoint in the runs' index, no new column
        conn.execute("CREATE INDEX checkpoints_age ON checkpoints (thread_id, committed_at, position)")
        conn.execute("CREATE INDEX events_age ON events (thread_id, committed_at, seq)")
        conn.execute("ALTER TABLE threads DROP COLUMN stamped_at")
        conn.execute("DROP INDEX checkpoints_run")
        conn.execute("DROP INDEX checkpoints_start")
        conn.execute("ALTER TABLE checkpoints DROP COLUMN run_start")
        conn.execute("CREATE INDEX checkpoints_run ON checkpoints (thread_id, run_id, position)")
        _undo_migration_9(conn)
        conn.execute("DELETE FROM schema_version WHERE version = 8")
    before = _stamps(path)
    clock.advance(timedelta(seconds=1))
    with SqliteCheckpointer.open(path, clock=clock) as store:
        assert raw(path).execute("SELECT max(version) FROM schema_version").fetchone() == (sqlite_store.SCHEMA_VERSION,)
        indexes = {name for (name,) in raw(path).execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert not {"checkpoints_age", "events_age"} & indexes
        assert _stamps(path) == before
        assert [cp.id for cp in store.history("t", limit=10)] == list(reversed(ids))
        assert raw(path).execute("SELECT stamped_at FROM threads").fetchone() == (None,)
        starts = raw(path).execute("SELECT id FROM checkpoints WHERE run_start = 1 ORDER BY position").fetchall()
        assert [cp_id for (cp_id,) in starts] == [ids[0], ids[1], ids[3], ids[5]]
        for runs, newest in (({"r1"}, ids[4]), ({"r2"}, ids[2]), ({"r1", "r2"}, ids[4]), ({"r3", "r2"}, ids[5])):
            found = store.lookup_run("t", runs)
            assert found is not None and found.id == newest
        thread.store = store
        clock.advance(-timedelta(seconds=5))  # no stamp recorded yet: the first commit stamps the clock's time
        ids.append(thread.step())
        assert _stamps(path)[0][-1] == (ids[-1], codec.to_micros(clock.now()))
        clock.advance(timedelta(seconds=10))
        store.prune("t", RetentionPolicy(max_age=timedelta(seconds=5)))
        assert [cp.id for cp in store.history("t", limit=10)] == [ids[-1]]


# -- one registry index (migration 9) --------------------------------------------------------------------------------


def _undo_migration_10(conn: sqlite3.Connection) -> None:
    """Puts the run queue back as version 9 left it (no ``retried_as``)."""
    conn.execute("ALTER TABLE run_queue DROP COLUMN retried_as")
    conn.execute("DELETE FROM schema_version WHERE version = 10")


def _undo_migration_9(conn: sqlite3.Connection) -> None:
    """Puts the registry's indexes back as version 8 left them (two, both keyed by ``updated_at``), and the
    migrations after it undone first."""
    _undo_migration_10(conn)
    conn.execute("DROP INDEX threads_registry")
    for statement in sqlite_schema.MIGRATIONS[0]:
        if statement.startswith(("CREATE INDEX threads_registry", "CREATE INDEX threads_incomplete")):
            conn.execute(statement)
    conn.execute("DELETE FROM schema_version WHERE version = 9")


def _registry(store: SqliteCheckpointer) -> dict[str, Any]:
    """Every registry answer the tests compare: threads() of each tenant and status, paged; incomplete(); tenants()."""
    found: dict[str, Any] = {"tenants": store.tenants(limit=10)}
    for tenant in (None, "acme", "other"):
        for statuses in (None, *({status} for status in ThreadStatus)):
            query = ThreadQuery(tenant_id=tenant, limit=2, statuses=None if statuses is None else frozenset(statuses))
            pages = [store.threads(query)]
            while pages[-1].next is not None:
                pages.append(store.threads(attrs.evolve(query, after=pages[-1].next)))
            found[f"threads {tenant} {statuses}"] = [[s.thread_id for s in page.items] for page in pages]
        pages = [store.incomplete(tenant, limit=2)]
        while pages[-1].next is not None:
            pages.append(store.incomplete(tenant, limit=2, after=pages[-1].next))
        found[f"incomplete {tenant}"] = [[s.thread_id for s in page.items] for page in pages]
    return found


def test_a_file_of_version_8_migrates_to_9_and_its_registry_answers_the_same(path: str, clock: ManualClock) -> None:
    with SqliteCheckpointer.open(path, clock=clock) as store:
        threads = []
        for n in range(12):
            tenant = (None, "acme", "other")[n % 3]
            thread = Thread(store, clock, f"t{n:02d}", tenant_id=tenant)
            status = (CheckpointStatus.RUNNING, CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)[n % 4 % 3]
            thread.step(tenant_id=tenant, status=status)
            if n % 5 != 4:  # a live claim: status running whatever the checkpoint's
                store.release(thread.thread_id, thread.token)
            threads.append(thread)
            clock.advance(timedelta(seconds=1))
        Thread(store, clock, "kid").step(origin="t00")  # not a root: listed by neither call
        store.commit("t04", Commit(token=threads[4].token, metadata={rules.DELETING_KEY: "true"}))
        expected = _registry(store)
    with raw(path) as conn:
        _undo_migration_9(conn)
    with SqliteCheckpointer.open(path, clock=clock) as store:
        conn = raw(path)
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (sqlite_store.SCHEMA_VERSION,)
        indexes = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'threads'"))
        assert "threads_incomplete" not in indexes
        assert "(latest_status = 'running' AND deleting = 0)" in indexes["threads_registry"]
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert _registry(store) == expected
        assert expected["incomplete None"] and expected["threads acme None"]  # the comparison compared something
        threads[6].token = store.claim("t06", ClaimRequest(holder="run-2", ttl=LONG)).token
        threads[6].store = store
        threads[6].step(status=CheckpointStatus.RUNNING)  # newest now, and incomplete again once released
        store.release("t06", threads[6].token)
        assert store.threads(ThreadQuery(tenant_id=None, limit=1)).items[0].thread_id == "t06"
        assert "t06" in [s.thread_id for s in store.incomplete(None, limit=10).items]


def _frames_by_tree(path: str, call: Callable[[], Any]) -> dict[str, int]:
    """The WAL frames ``call`` appends, counted by the b-tree their page belongs to (``dbstat``'s name), the log
    emptied first (SQLite's WAL format: a 32-byte header, then per frame a 24-byte header that starts with the page
    number, then the page)."""
    conn = raw(path)
    try:
        conn.execute("SELECT 1 FROM dbstat LIMIT 1")
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    call()
    owners = dict(conn.execute("SELECT pageno, name FROM dbstat"))
    data = pathlib.Path(path + "-wal").read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    counts: dict[str, int] = {}
    for offset in range(32, len(data) - 23, 24 + page_size):
        owner = owners.get(int.from_bytes(data[offset : offset + 4], "big"), "other")
        counts[owner] = counts.get(owner, 0) + 1
    return counts


def test_a_step_commit_writes_one_registry_index_page(path: str, store: SqliteCheckpointer, clock: ManualClock) -> None:
    """A step moves ``updated_at``: the thread's one registry index entry moves (one page), nothing else of the
    registry; a commit without a checkpoint leaves the registry index alone."""
    thread = Thread(store, clock, "t", tenant_id="acme")
    for _ in range(5):
        thread.step(tenant_id="acme")
    clock.advance(timedelta(seconds=1))
    written = _frames_by_tree(path, lambda: thread.step(tenant_id="acme"))
    assert written.get("threads_registry") == 1, written
    assert {name for name in written if name.startswith("threads_")} == {"threads_registry"}, written
    clock.advance(timedelta(seconds=1))
    write = PendingWrite(checkpoint_id=thread.latest or "", task_id="x", node_id="n", payload={"v": 1})
    written = _frames_by_tree(path, lambda: store.commit("t", Commit(token=thread.token, pending_writes=[write])))
    assert "threads_registry" not in written, written
    (summary,) = store.threads(ThreadQuery(tenant_id="acme")).items
    assert summary.latest_checkpoint_id == thread.latest


# -- the runs' index holds the start of each run's stretch (migration 8) ----------------------------------------------


def _check_run_starts(path: str) -> None:
    """``run_start`` is 1 exactly on the checkpoints whose predecessor in their history is of another run, or
    that have none."""
    rows = raw(path).execute(
        "SELECT thread_id, position, run_id, run_start FROM checkpoints ORDER BY thread_id, position"
    ).fetchall()
    before: dict[str, str] = {}
    for thread_id, position, run_id, run_start in rows:
        expected = None if before.get(thread_id) == run_id else 1
        assert run_start == expected, (thread_id, position, run_id, run_start)
        before[thread_id] = run_id


class _Protect:
    def __init__(self, runs: frozenset[str]) -> None:
        self.runs = runs

    def protected(self, thread_ids: tuple[str, ...]) -> dict[str, frozenset[str]]:
        return dict.fromkeys(thread_ids, self.runs)


def test_lookup_run_through_the_stretches_of_runs_answers_as_the_reference(path: str, clock: ManualClock) -> None:
    runs = ["r1", "r2", "r3", "r4"]
    subsets = [frozenset(c) for n in (1, 2, 3) for c in itertools.combinations(runs, n)]
    with InMemoryCheckpointer(clock) as reference, SqliteCheckpointer.open(path, clock=clock) as store:
        threads = [Thread(each, clock, "t") for each in (reference, store)]  # type: ignore[arg-type]

        def step(run_id: str, status: CheckpointStatus = CheckpointStatus.RUNNING) -> None:
            for thread in threads:
                thread.step(run_id=run_id, status=status)

        def compare() -> None:
            for subset in subsets:
                expected, found = reference.lookup_run("t", subset), store.lookup_run("t", subset)
                assert (found and found.id) == (expected and expected.id), subset
            _check_run_starts(path)

        for run_id in ["r1", "r1", "r2", "r2", "r1", "r3", "r3", "r1", "r2", "r4", "r4", "r4"]:
            step(run_id)
        compare()
        policy = SweepPolicy(retention=RetentionPolicy(max_checkpoints=3))
        for each in (reference, store):  # keeps r3's and r2's newest below the newest three (all r4)
            each.sweep(policy, _Protect(frozenset({"r3", "r2"})))
        assert [cp.id for cp in store.history("t", limit=10)] == ["t-c12", "t-c11", "t-c10", "t-c9", "t-c7"]
        compare()
        for run_id in ["r3", "r3", "r2", "r1"]:
            step(run_id)
        compare()
        for each in (reference, store):  # the oldest kept is now a stretch's middle: it starts one
            each.prune("t", RetentionPolicy(max_checkpoints=2))
        compare()
        clock.advance(timedelta(seconds=5))
        step("r1")
        step("r4")
        for each in (reference, store):
            each.prune("t", RetentionPolicy(max_age=timedelta(seconds=4)))
        compare()
        assert [cp.id for cp in store.history("t", limit=10)] == ["t-c18", "t-c17"]
        step("r2", CheckpointStatus.COMPLETED)
        step("r3")
        step("r3")
        for thread in threads:  # cuts back to the settled checkpoint: the new one continues its stretch
            thread.step(run_id="r2", retract_turn=True)
        assert [cp.id for cp in store.history("t", limit=10)] == ["t-c22", "t-c19", "t-c18", "t-c17"]
        compare()
