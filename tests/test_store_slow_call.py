"""``store.call_slow``: a store call slower than the store's ``slow_call`` logs exactly one line with ``op``,
``thread_id`` and ``duration_ms``; a fast call logs none. The slow calls are real: a SQLite file whose write lock
another connection holds for a moment, a PostgreSQL table another session has locked."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import ClaimRequest, ValidationError, open_store

SLOW_CALL = timedelta(milliseconds=200)
HOLD_S = 0.6
"""How long the other connection holds its lock: longer than SLOW_CALL, far shorter than any busy timeout."""


def _slow_lines(logs: list[dict]) -> list[dict]:
    return [line for line in logs if line["event"] == "store.call_slow"]


@contextlib.contextmanager
def _write_locked(path) -> Iterator[None]:
    """Another connection holds the SQLite file's write lock for HOLD_S from now (the block runs meanwhile)."""
    locker = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(HOLD_S, lambda: locker.execute("ROLLBACK"))
    releaser.start()
    try:
        yield
    finally:
        releaser.join()
        locker.close()


def _request(holder: str = "run-1") -> ClaimRequest:
    return ClaimRequest(holder=holder, ttl=timedelta(seconds=30), tenant_id="acme")


def test_a_sqlite_call_blocked_by_another_connections_lock_logs_one_slow_line(tmp_path):
    path = tmp_path / "slow.db"
    with open_store(f"sqlite:///{path}", slow_call=SLOW_CALL) as store:
        assert store.slow_call == SLOW_CALL and store.queue is not None
        with capture_logs() as logs:
            store.claim("fast", _request())
            store.latest("fast")
            store.queue.enqueue("fast", graph_id="g")
        assert _slow_lines(logs) == []

        with _write_locked(path), capture_logs() as logs:
            claim = store.claim("t1", _request())
        assert claim.thread_id == "t1"
        slow = _slow_lines(logs)
        assert len(slow) == 1, logs
        assert slow[0]["op"] == "claim" and slow[0]["thread_id"] == "t1"
        assert slow[0]["duration_ms"] >= SLOW_CALL.total_seconds() * 1000
        assert slow[0]["log_level"] == "warning" and slow[0]["store"] == "SqliteCheckpointer"

        # The run queue shares the store's threshold.
        with _write_locked(path), capture_logs() as logs:
            store.queue.enqueue("t2", graph_id="g")
        assert [(line["op"], line["thread_id"]) for line in _slow_lines(logs)] == [("enqueue", "t2")]


def test_slow_call_none_or_zero_turns_the_line_off(tmp_path):
    path = tmp_path / "off.db"
    for off in (None, timedelta(0)):
        with open_store(f"sqlite:///{path}", slow_call=off) as store:
            assert store.slow_call is None
            with _write_locked(path), capture_logs() as logs:
                store.claim(f"t-{off}", _request())
            assert _slow_lines(logs) == []


def test_slow_call_defaults_to_one_second_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv("THREADLOOM_SLOW_CALL_MS", raising=False)
    with open_store("memory://") as store:
        assert store.slow_call == timedelta(seconds=1)
    monkeypatch.setenv("THREADLOOM_SLOW_CALL_MS", "250")
    with open_store("memory://") as store:
        assert store.slow_call == timedelta(milliseconds=250)
    with open_store("memory://", slow_call=timedelta(seconds=3)) as store:  # the option wins
        assert store.slow_call == timedelta(seconds=3)
    monkeypatch.setenv("THREADLOOM_SLOW_CALL_MS", "0")
    with open_store("memory://") as store:
        assert store.slow_call is None


@pytest.mark.parametrize("bad", [timedelta(seconds=-1), 5, "1s"])
def test_a_bad_slow_call_is_refused_naming_the_field(bad, tmp_path):
    path = tmp_path / "never.db"
    with pytest.raises(ValidationError) as caught:
        open_store(f"sqlite:///{path}", slow_call=bad)
    assert caught.value.field == "slow_call"
    assert not path.exists()  # refused before anything was opened


def test_a_bad_environment_value_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("THREADLOOM_SLOW_CALL_MS", "soon")
    with pytest.raises(ValidationError) as caught:
        open_store("memory://")
    assert caught.value.field == "THREADLOOM_SLOW_CALL_MS"


def test_a_postgres_call_waiting_on_another_sessions_lock_logs_one_slow_line():
    psycopg = pytest.importorskip("psycopg")
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        store = open_store(harness.dsn, config=harness.config(), slow_call=SLOW_CALL)
        try:
            store.claim("t1", _request())
            with capture_logs() as logs:
                store.latest("t1")
            assert _slow_lines(logs) == []
            locked = threading.Event()

            def hold() -> None:
                with psycopg.connect(harness.dsn, autocommit=False) as other:
                    other.execute(f'LOCK TABLE "{harness.schema}".threads IN ACCESS EXCLUSIVE MODE')
                    locked.set()
                    threading.Event().wait(HOLD_S)
                    other.rollback()

            holder = threading.Thread(target=hold)
            holder.start()
            assert locked.wait(30)
            try:
                with capture_logs() as logs:
                    store.latest("t1")
            finally:
                holder.join()
            slow = _slow_lines(logs)
            assert len(slow) == 1, logs
            assert (slow[0]["op"], slow[0]["thread_id"], slow[0]["store"]) == ("latest", "t1", "PostgresCheckpointer")
            assert slow[0]["duration_ms"] >= SLOW_CALL.total_seconds() * 1000
        finally:
            store.close()
    finally:
        harness.cleanup()
