"""``GraphRuntime`` reads that take a tenant: history, events and the per-tenant export check the rows' access
stamps and fail closed (README "Access schemas"), on a real SQLite file."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from threadloom.actors.runtime import GraphRuntime
from threadloom.domain.access import AccessAttribute, AccessSchema, AccessSchemas
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft
from threadloom.persistence.sqlite.store import SqliteCheckpointer

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ACCESS = AccessSchemas([AccessSchema("g", (AccessAttribute("region", "metadata", "region"),))])


def _commit(store: SqliteCheckpointer, thread_id: str, tenant: str, step: int, parent: str | None) -> str:
    claim = store.claim(thread_id, ClaimRequest(holder=f"run-{step}", ttl=timedelta(seconds=30), tenant_id=tenant))
    checkpoint_id = f"{thread_id}-{step}"
    store.commit(
        thread_id,
        Commit(
            token=claim.token,
            checkpoint=Checkpoint(
                id=checkpoint_id, parent=parent, thread_id=thread_id, run_id=f"run-{step}",
                status=CheckpointStatus.COMPLETED, created_at=T0, graph_id="g", tenant_id=tenant,
                metadata={"region": "eu"}, state={"step": step},
            ),
            events=[EventDraft(run_id=f"run-{step}", type="step", timestamp=T0, payload=step)],
        ),
    )
    store.release(thread_id, claim.token)
    return checkpoint_id


def test_runtime_tenant_reads_return_only_rows_stamped_for_the_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tenants.db"
    old = SqliteCheckpointer.open(str(path))  # an older release: its rows carry the tenant-only schema's stamp
    first = _commit(old, "t1", "acme", 1, None)
    old.close()
    store = SqliteCheckpointer.open(str(path), access=ACCESS)
    second = _commit(store, "t1", "acme", 2, first)
    _commit(store, "t2", "globex", 1, None)
    runtime = GraphRuntime(store, node_id="reader")
    try:
        # the row of the older schema is stamped first (the follower), then shown
        assert [cp.id for cp in runtime.history("t1", "acme")] == [second, first]
        assert [event.payload for event in runtime.events("t1", "acme")] == [1, 2]
        assert runtime.history("t1", "globex") == [] and runtime.events("t1", "globex") == []
        page = runtime.export_tenant("acme")
        assert [thread.thread_id for thread in page.threads] == ["t1"] and page.next is None
        assert [cp.id for cp in page.threads[0].checkpoints] == [first, second]
        assert [thread.thread_id for thread in runtime.export_tenant("globex").threads] == ["t2"]
        # a row stamped for another tenant is never returned, even to the thread's own tenant; the runtime's walk
        # of kind "g" must be past t1 first, or its stamp of the older row could land after the hand edit below
        deadline = time.monotonic() + 60
        while not (runtime.walks().get("g") and runtime.walks()["g"].completed):
            assert time.monotonic() < deadline, f"the walk of 'g' did not complete: {runtime.walks()}"
            time.sleep(0.05)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE checkpoints SET access_tenant = 'globex' WHERE thread_id = 't1' AND id = ?", (first,))
        assert [cp.id for cp in runtime.history("t1", "acme")] == [second]
        assert [cp.id for cp in runtime.history("t1", "globex")] == []
    finally:
        runtime.close()
        store.close()
