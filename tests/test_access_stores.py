"""Access stamps in the durable stores beyond the contract (README "Access schemas"): the stamp columns as a
database sees them, a commit and a ``stamp_thread`` racing from two OS processes on one SQLite file, a PostgreSQL
row-level-security policy on ``access_tenant``, and a PostgreSQL commit without a checkpoint re-stamping a thread
an older schema stamped in its own transaction."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from threadloom.domain.access import AccessSchema, AccessSchemas
from threadloom.domain.errors import StoreUnavailable
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft
from threadloom.persistence import codec
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.contract.access import REGION, V2

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def step(
    store, thread_id: str, token: int, cp_id: str, parent: str | None, tenant: str, region: str, graph: str = "chat"
) -> None:
    store.commit(
        thread_id,
        Commit(
            token=token,
            checkpoint=Checkpoint(
                id=cp_id, parent=parent, thread_id=thread_id, run_id="run", status=CheckpointStatus.RUNNING,
                created_at=NOW, state={"account": {"plan": "gold"}}, graph_id=graph, tenant_id=tenant,
                metadata={"region": region},
            ),
            events=[EventDraft(run_id="run", type="step", timestamp=NOW, payload={"cp": cp_id})],
        ),
    )


def test_sqlite_stamp_columns_hold_the_derived_stamp(tmp_path) -> None:
    path = str(tmp_path / "store.db")
    with SqliteCheckpointer.open(path, access=V2) as store:
        token = store.claim("t", ClaimRequest(holder="run", ttl=HOUR)).token
        step(store, "t", token, "c1", None, "acme", "eu")
    conn = sqlite3.connect(path)
    schema = V2.for_graph("chat").hash
    expected = (schema, "acme", '{"plan":"gold","region":"eu"}')
    assert conn.execute("SELECT access_schema, access_tenant, access_attrs FROM checkpoints").fetchall() == [expected]
    assert conn.execute("SELECT access_schema, access_tenant, access_attrs FROM events").fetchall() == [expected]
    plan = " ".join(row[3] for row in conn.execute(
        "EXPLAIN QUERY PLAN SELECT thread_id FROM events WHERE access_tenant = 'acme'"))
    assert "events_access_tenant" in plan
    conn.close()


STAMPER = r"""
import json, os, sys
from datetime import timedelta
from threadloom import SqliteCheckpointer
from threadloom.testing.contract.access import REGION, V2

path, stop = sys.argv[1], sys.argv[2]
store = SqliteCheckpointer.open(path, busy_timeout=timedelta(seconds=60), access=V2)
print("ready", flush=True)
calls = changed = 0
while not os.path.exists(stop):
    changed += store.stamp_thread("t")
    calls += 1
store.close()
print(json.dumps({"calls": calls, "changed": changed}), flush=True)
"""


@pytest.mark.slow
def test_sqlite_a_commit_racing_a_stamp_in_another_process_keeps_its_newer_stamp(tmp_path) -> None:
    path, stop = str(tmp_path / "store.db"), str(tmp_path / "stop")
    store = SqliteCheckpointer.open(path, busy_timeout=timedelta(seconds=60), access=V2)
    token = store.claim("t", ClaimRequest(holder="run", ttl=HOUR)).token
    step(store, "t", token, "c0", None, "a", "r0")
    stamper = subprocess.Popen(
        [sys.executable, "-c", STAMPER, path, stop], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert stamper.stdout is not None and stamper.stdout.readline().strip() == "ready"
        for n in range(1, 41):
            tenant = "a" if n % 2 == 0 else "b"
            step(store, "t", token, f"c{n}", f"c{n - 1}", tenant, f"r{n}")
            # the newest checkpoint and event carry their own commit's stamp, whatever the other process stamped
            assert [cp.id for cp in store.tenant_history("t", tenant, limit=1)] == [f"c{n}"]
            assert [e.payload for e in store.tenant_events_after("t", tenant, n, 1)] == [{"cp": f"c{n}"}]
    finally:
        open(stop, "w").close()
        out, err = stamper.communicate(timeout=60)
    assert stamper.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["calls"] > 0 and report["changed"] > 0  # the other process really stamped while commits ran
    conn = sqlite3.connect(path)
    latest = conn.execute(
        "SELECT access_tenant, access_attrs FROM checkpoints WHERE thread_id = 't' ORDER BY position DESC LIMIT 1"
    ).fetchone()
    assert latest == ("a", '{"plan":"gold","region":"r40"}')
    conn.close()
    # older rows carry older regions unless the other process stamped after the last commit; once stamped, none
    assert store.stamp_thread("t") in (0, 80) and store.stamp_thread("t") == 0
    store.close()


@pytest.mark.postgres
def test_postgres_row_level_security_on_access_tenant_hides_other_tenants_rows() -> None:
    psycopg = pytest.importorskip("psycopg")
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    role = f"tl_rls_{uuid.uuid4().hex[:12]}"
    try:
        harness.access = V2
        store = harness.open()
        for thread_id, tenant in (("t1", "acme"), ("t2", "globex")):
            token = store.claim(thread_id, ClaimRequest(holder="run", ttl=HOUR)).token
            step(store, thread_id, token, "c1", None, tenant, "eu")
        s = f'"{harness.schema}"'
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            # an unstamped row, as an earlier version wrote it: RLS keeps it invisible
            conn.execute(
                f"INSERT INTO {s}.events (thread_id, seq, committed_at, body) VALUES ('t9', 1, now(), '{{}}')"
            )
            attrs = conn.execute(f"SELECT access_attrs FROM {s}.checkpoints WHERE thread_id = 't1'").fetchone()[0]
            assert attrs == {"plan": "gold", "region": "eu"}  # jsonb: usable by a policy or an index expression
            try:
                conn.execute(f"CREATE ROLE {role} NOLOGIN")
            except psycopg.errors.InsufficientPrivilege:
                pytest.skip("the test server refuses CREATE ROLE")
            try:
                conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")
                for table in ("checkpoints", "events"):
                    conn.execute(f"GRANT SELECT ON {s}.{table} TO {role}")
                    conn.execute(f"ALTER TABLE {s}.{table} ENABLE ROW LEVEL SECURITY")
                    conn.execute(
                        f"CREATE POLICY tenant_rows ON {s}.{table} TO {role}"
                        " USING (access_tenant = current_setting('threadloom.tenant', true))"
                    )
                for tenant, threads in (("acme", ["t1"]), ("globex", ["t2"]), ("nobody", [])):
                    with conn.transaction():
                        conn.execute(f"SET LOCAL ROLE {role}")
                        conn.execute("SELECT set_config('threadloom.tenant', %s, true)", (tenant,))
                        seen = conn.execute(f"SELECT thread_id FROM {s}.checkpoints ORDER BY thread_id").fetchall()
                        events = conn.execute(f"SELECT thread_id FROM {s}.events ORDER BY thread_id").fetchall()
                    assert [row[0] for row in seen] == threads
                    assert [row[0] for row in events] == threads
                # the owner (not subject to the policy) still sees every row
                assert len(conn.execute(f"SELECT 1 FROM {s}.events").fetchall()) == 3
            finally:
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")
    finally:
        harness.cleanup()



def test_sqlite_a_read_only_store_reads_stamped_rows_and_refuses_to_show_unchecked_ones(tmp_path) -> None:
    from threadloom.domain.errors import ProcessingError

    path = str(tmp_path / "store.db")
    with SqliteCheckpointer.open(path, access=V2) as store:
        token = store.claim("t", ClaimRequest(holder="run", ttl=HOUR)).token
        step(store, "t", token, "c1", None, "acme", "eu")
    with SqliteCheckpointer.open(path, read_only=True, access=V2) as reader:
        assert reader.access == V2
        assert [cp.id for cp in reader.tenant_history("t", "acme", limit=10)] == ["c1"]
    with SqliteCheckpointer.open(path, read_only=True) as other:  # another schema: its reads need the follower
        with pytest.raises(ProcessingError):
            other.tenant_history("t", "acme", limit=10)


# -- PostgreSQL: a commit without a checkpoint re-stamps a thread an older schema stamped, in its own transaction --

V1 = AccessSchemas()
"""The older release: no schema declared (graph kind ``chat`` stamps its tenant only)."""


def _event(n: int) -> EventDraft:
    return EventDraft(run_id="run", type="step", timestamp=NOW, payload={"n": n})


def _stamps(conn, schema: str, thread_id: str) -> list[tuple[str, str, str | None, str | None, dict | None]]:
    """Every row of the thread and its stamp, in one statement (one snapshot): (kind, key, schema hash, tenant,
    attributes), the thread's own row included."""
    s = f'"{schema}"'
    columns = "access_schema, access_tenant, access_attrs"
    return conn.execute(
        f"SELECT 'checkpoint', id, {columns} FROM {s}.checkpoints WHERE thread_id = %(t)s"
        f" UNION ALL SELECT 'effect', key, {columns} FROM {s}.effects WHERE thread_id = %(t)s"
        f" UNION ALL SELECT 'event', seq::text, {columns} FROM {s}.events WHERE thread_id = %(t)s"
        f" UNION ALL SELECT 'pending', idx::text, {columns} FROM {s}.pending_writes WHERE thread_id = %(t)s"
        f" UNION ALL SELECT 'thread', thread_id, {columns} FROM {s}.threads WHERE thread_id = %(t)s"
        " ORDER BY 1, 2",
        {"t": thread_id},
    ).fetchall()


@pytest.fixture
def pg():
    pytest.importorskip("psycopg")
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        yield harness
    finally:
        harness.cleanup()


def _old_thread(pg, thread_id: str = "t"):
    """A thread whose checkpoint c1 (region eu) and event 1 a v1 store committed; (v1 store, v2 store, token)."""
    old = pg.open()
    token = old.claim(thread_id, ClaimRequest(holder="run", ttl=HOUR)).token
    step(old, thread_id, token, "c1", None, "acme", "eu")
    return old, pg.node(V2), token


@pytest.mark.postgres
def test_postgres_a_commit_without_a_checkpoint_restamps_its_thread_in_its_own_transaction(pg) -> None:
    import psycopg

    old, new, token = _old_thread(pg)
    v1, v2 = V1.for_graph("chat").hash, V2.for_graph("chat").hash
    before = [("checkpoint", "c1", v1, "acme", {}), ("event", "1", v1, "acme", {}), ("thread", "t", v1, "acme", {})]
    result: dict[str, object] = {}
    with psycopg.connect(pg.dsn) as locker, psycopg.connect(pg.dsn, autocommit=True) as observer:
        assert _stamps(observer, pg.schema, "t") == before
        # Holds c1's row: re-stamping it waits for this transaction, whichever transaction re-stamps.
        locker.execute(f'SELECT 1 FROM "{pg.schema}".checkpoints WHERE thread_id = %s FOR SHARE', ("t",))

        def commit() -> None:
            try:
                result["records"] = new.commit("t", Commit(token=token, events=[_event(2)]))
            except BaseException as error:  # reported by the test
                result["error"] = error

        committing = threading.Thread(target=commit)
        committing.start()
        deadline = time.monotonic() + 10
        while observer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (f"%{pg.schema}%",),
        ).fetchone()[0] == 0:
            assert time.monotonic() < deadline and committing.is_alive(), "the commit never waited for c1's row"
            time.sleep(0.01)
        # While the re-stamp waits, nothing of the commit is visible: never its event beside older stamps.
        assert _stamps(observer, pg.schema, "t") == before
        locker.rollback()
        committing.join(10)
        assert "error" not in result, result
        assert [record.seq for record in result["records"]] == [2]
        attrs = {"plan": "gold", "region": "eu"}
        assert _stamps(observer, pg.schema, "t") == [
            ("checkpoint", "c1", v2, "acme", attrs), ("event", "1", v2, "acme", attrs),
            ("event", "2", v2, "acme", attrs), ("thread", "t", v2, "acme", attrs),
        ]  # fmt: skip


@pytest.mark.postgres
def test_postgres_a_commit_whose_latest_checkpoint_moves_while_it_derives_derives_again(pg, monkeypatch) -> None:
    import psycopg

    old, new, token = _old_thread(pg)
    derived: list[str] = []
    derive = new._log_stamp

    def racing(thread_id: str, body: str | None):
        derived.append(codec.decode_checkpoint(body, thread_id).id)
        if len(derived) == 1:  # between the answer and the commit sent again, the older node commits c2
            step(old, "t", token, "c2", "c1", "acme", "us")
        return derive(thread_id, body)

    monkeypatch.setattr(new, "_log_stamp", racing)
    assert [record.seq for record in new.commit("t", Commit(token=token, events=[_event(3)]))] == [3]
    assert derived == ["c1", "c2"]  # the stamp derived from c1 was refused: c2 is the latest
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        rows = _stamps(conn, pg.schema, "t")
    assert [row[:2] for row in rows] == [
        ("checkpoint", "c1"), ("checkpoint", "c2"), ("event", "1"), ("event", "2"), ("event", "3"), ("thread", "t")
    ]  # fmt: skip
    assert [row[2:] for row in rows] == [(V2.for_graph("chat").hash, "acme", {"plan": "gold", "region": "us"})] * 6


@pytest.mark.postgres
def test_postgres_a_commit_whose_latest_checkpoint_keeps_moving_gives_up_with_nothing_written(
    pg, monkeypatch
) -> None:
    from threadloom.persistence.postgres.access import STAMP_ATTEMPTS

    old, new, token = _old_thread(pg)
    derived: list[str] = []
    derive = new._log_stamp

    def racing(thread_id: str, body: str | None):
        derived.append(codec.decode_checkpoint(body, thread_id).id)
        step(old, "t", token, f"c{len(derived) + 1}", f"c{len(derived)}", "acme", "us")  # every time
        return derive(thread_id, body)

    monkeypatch.setattr(new, "_log_stamp", racing)
    with pytest.raises(StoreUnavailable, match="nothing was written; retry") as caught:
        new.commit("t", Commit(token=token, events=[_event(0)]))
    assert caught.value.operation == "commit"
    assert derived == [f"c{n}" for n in range(1, STAMP_ATTEMPTS + 1)]
    assert [e.payload for e in old.events_after("t", 0, 100)] == [{"cp": f"c{n}"} for n in range(1, STAMP_ATTEMPTS + 2)]


@pytest.mark.postgres
@pytest.mark.parametrize("graph", ["chat", "default", 'é "q" \\ \t\n\x01\x7f \u2028 😀'])
def test_postgres_a_commit_without_a_checkpoint_to_a_current_thread_is_one_statement(pg, monkeypatch, graph) -> None:
    """The database names a graph kind's implicit schema exactly as the client does (for ``chat`` the v2 store
    declared its schema), so a thread its own schema stamped takes one statement; another schema's takes two."""
    import psycopg

    pg.access = V2
    store = pg.open()
    token = store.claim("t", ClaimRequest(holder="run", ttl=HOUR)).token
    step(store, "t", token, "c1", None, "acme", "eu", graph=graph)
    calls: list[str] = []
    call = store._call

    def counting(operation, thread_id, name, params, **kwargs):
        calls.append(name)
        return call(operation, thread_id, name, params, **kwargs)

    monkeypatch.setattr(store, "_call", counting)
    store.commit("t", Commit(token=token, events=[_event(2)]))
    assert calls == ["COMMIT"]
    other = pg.node(V1 if graph == "chat" else AccessSchemas([AccessSchema(graph, (REGION,))]))
    other.commit("t", Commit(token=token, events=[_event(3)]))  # another schema: re-stamped, in two statements
    monkeypatch.setattr(other, "_call", counting)
    other.commit("t", Commit(token=token, events=[_event(4)]))
    assert calls == ["COMMIT", "COMMIT"]
    store.commit("t", Commit(token=token, events=[_event(5)]))
    assert calls == ["COMMIT", "COMMIT", "COMMIT", "COMMIT"]
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        assert {row[2] for row in _stamps(conn, pg.schema, "t")} == {V2.for_graph(graph).hash}
        assert conn.execute(f'SELECT "{pg.schema}".tl_access_hash(%s)', (graph,)).fetchone()[0] == AccessSchema(
            graph
        ).hash
