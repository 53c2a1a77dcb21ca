"""Access stamps in the durable stores beyond the contract (README "Access schemas"): the stamp columns as a
database sees them, a commit and a ``stamp_thread`` racing from two OS processes on one SQLite file, and a
PostgreSQL row-level-security policy on ``access_tenant``."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.contract.access import V2

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def step(store, thread_id: str, token: int, cp_id: str, parent: str | None, tenant: str, region: str) -> None:
    store.commit(
        thread_id,
        Commit(
            token=token,
            checkpoint=Checkpoint(
                id=cp_id, parent=parent, thread_id=thread_id, run_id="run", status=CheckpointStatus.RUNNING,
                created_at=NOW, state={"account": {"plan": "gold"}}, graph_id="chat", tenant_id=tenant,
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
from threadloom.testing.contract.access import V2

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
    assert store.stamp_thread("t") == 0  # the other process left every row at the current stamp
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
