"""PostgreSQL: what a walk's stamps cost live commits - a fenced stamp commits without waiting for its WAL flush,
in its own transaction only; its read is one prepared statement on the store's own pool and the usual read on a
caller's pool. Real server (``THREADLOOM_TEST_PG``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

psycopg = pytest.importorskip("psycopg")
psycopg_pool = pytest.importorskip("psycopg_pool")

from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit  # noqa: E402
from threadloom.persistence.postgres.store import PostgresCheckpointer  # noqa: E402
from threadloom.testing.contract.access import V2  # noqa: E402
from threadloom.testing.postgres_harness import PgHarness  # noqa: E402

pytestmark = pytest.mark.postgres

HOUR = timedelta(hours=1)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def harness():
    h = PgHarness()
    yield h
    h.cleanup()


def _written_by_v1(harness: PgHarness, thread_id: str) -> None:
    """``thread_id`` with two checkpoints of graph kind ``chat``, written by a store without declarations."""
    store = harness.open_pg()
    token = store.claim(thread_id, ClaimRequest(holder="v1", ttl=HOUR, tenant_id="acme")).token
    parent = None
    for cp_id in ("c1", "c2"):
        checkpoint = Checkpoint(
            id=cp_id, parent=parent, thread_id=thread_id, run_id="r", status=CheckpointStatus.RUNNING,
            created_at=T0, state={}, graph_id="chat", tenant_id="acme", metadata={"region": "eu", "plan": "gold"},
        )  # fmt: skip
        store.commit(thread_id, Commit(token=token, checkpoint=checkpoint))
        parent = cp_id
    store.release(thread_id, token)


def _stamps(harness: PgHarness, thread_id: str) -> list[tuple[str | None, str | None]]:
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT access_schema, access_tenant FROM "{harness.schema}".checkpoints WHERE thread_id = %s ORDER BY pos',
            (thread_id,),
        ).fetchall()
    return [tuple(row) for row in rows]


def _synchronous_commit_inside(harness: PgHarness, statement: str, params: tuple[object, ...]) -> tuple[str, str]:
    """``synchronous_commit`` within the transaction that ran ``statement``, and after it committed."""
    with psycopg.connect(harness.dsn) as conn:
        assert conn.execute(statement, params).fetchone()[0] == 0  # applied
        inside = conn.execute("SHOW synchronous_commit").fetchone()[0]
        conn.commit()
        after = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return inside, after


def test_a_walks_stamp_commits_without_its_flush_and_leaves_the_session_synchronous(harness: PgHarness) -> None:
    _written_by_v1(harness, "t")
    harness.access = V2
    store = harness.open_pg(max_size=1)  # one connection: every call below runs on the same session
    lease = store.claim("walk", ClaimRequest(holder="walker", ttl=HOUR))
    assert _stamps(harness, "t") != [(V2.for_graph("chat").hash, "acme")] * 2

    assert store.stamp_thread("t", fence=("walk", lease.token)) == 2
    assert _stamps(harness, "t") == [(V2.for_graph("chat").hash, "acme")] * 2
    # the session the walk's stamp ran on (the pool's only one) commits live writes synchronously again
    assert store._db.call("show", None, "SHOW synchronous_commit", (), write=False) == [("on",)]  # noqa: SLF001

    # the walk's statement turns synchronous_commit off for its own transaction only; an unfenced stamp (a
    # tenant read's, a log commit's) commits synchronously
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        (position,) = conn.execute(
            f'SELECT latest_pos FROM "{harness.schema}".threads WHERE thread_id = %s', ("t",)
        ).fetchone()
    nothing = (None, None, None)  # nothing to stamp: tl_stamp checks the fence and the position only
    walk = _synchronous_commit_inside(
        harness, store._sql["STAMP_WALK"], ("t", "walk", lease.token, position, *nothing)  # noqa: SLF001
    )
    plain = _synchronous_commit_inside(harness, store._sql["STAMP"], ("t", None, None, position, *nothing))  # noqa: SLF001
    assert walk == ("off", "on")
    assert plain == ("on", "on")


def test_stamps_over_a_callers_pool_read_and_write_as_its_other_calls_do(harness: PgHarness) -> None:
    harness.open_pg()  # creates the schema
    _written_by_v1(harness, "t1")
    _written_by_v1(harness, "t2")
    pool = psycopg_pool.ConnectionPool(harness.dsn, min_size=1, max_size=2, open=True)  # manual-commit connections
    try:
        store = PostgresCheckpointer.create(pool, harness.config(), access=V2)
        lease = store.claim("walk", ClaimRequest(holder="walker", ttl=HOUR))
        assert store.stamp_thread("t1", fence=("walk", lease.token)) == 2
        assert store.stamp_thread("t2") == 2
        assert _stamps(harness, "t1") == _stamps(harness, "t2") == [(V2.for_graph("chat").hash, "acme")] * 2
        store.close()
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        pool.close()
