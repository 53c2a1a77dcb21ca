"""The operator's commands (``queue list|retry|cancel``, ``sweep --dry-run``/``--queue-age``/``--yes``) against a
real SQLite file and a real PostgreSQL schema: each test asserts what changed in the store, and that refusals and
dry runs changed nothing (every row of every table compared; for SQLite the file's bytes too)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from threadloom import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EntryStatus,
    EventDraft,
    StaleLease,
)
from threadloom.cli.main import cli
from threadloom.cli.output import EXIT_FAILED, EXIT_USAGE

TTL = timedelta(seconds=30)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


pytestmark = pytest.mark.usefixtures("restore_cli_logging")


@attrs.define
class Backend:
    """A store the command opens by ``url``; ``open()`` gives the library's store on it; ``dump()`` every row."""

    url: str
    open: Callable[[], Any]
    dump: Callable[[], Any]
    name: str


def _sqlite_backend(tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = tmp_path / "ops.db"

    def dump() -> Any:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")]
            rows = {table: sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"'))) for table in tables}
        finally:
            conn.close()
        return rows, hashlib.sha256(path.read_bytes()).hexdigest()

    return Backend(f"sqlite:///{path}", lambda: SqliteCheckpointer.open(str(path)), dump, "sqlite")


def _postgres_backend(tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    import psycopg

    from threadloom.persistence.postgres.store import PostgresCheckpointer
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()  # skips loudly without a server (fails under CI=true)
    request.addfinalizer(harness.cleanup)
    harness.open_pg().close()  # creates the schema

    def dump() -> Any:
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1", (harness.schema,)
            )]
            return {
                table: sorted(map(repr, conn.execute(f'SELECT * FROM "{harness.schema}"."{table}"')))
                for table in tables
            }

    sep = "&" if "?" in harness.dsn else "?"
    return Backend(
        f"{harness.dsn}{sep}schema={harness.schema}",
        lambda: PostgresCheckpointer.open(harness.dsn, harness.config()),
        dump,
        "postgres",
    )


@pytest.fixture(
    params=[_sqlite_backend, pytest.param(_postgres_backend, marks=pytest.mark.postgres)], ids=["sqlite", "postgres"]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    made = request.param(tmp_path, request)
    store = made.open()  # creates the SQLite file
    store.close()
    return made


def run(backend: Backend, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--store", backend.url, *args], catch_exceptions=False)
    return result


@pytest.fixture
def store(backend: Backend) -> Iterator[Any]:
    opened = backend.open()
    yield opened
    opened.close()


def _commit_run(store: Any, thread_id: str, run_id: str, n: int, *, parent: str | None = None,
                status: CheckpointStatus = CheckpointStatus.RUNNING) -> list[str]:
    claim = store.claim(thread_id, ClaimRequest(holder=run_id, ttl=TTL))
    ids = []
    for i in range(n):
        cp_id = f"{run_id}:{i}"
        store.commit(thread_id, Commit(
            token=claim.token,
            checkpoint=Checkpoint(id=cp_id, parent=parent, thread_id=thread_id, run_id=run_id,
                                  status=status if i == n - 1 else CheckpointStatus.RUNNING, created_at=NOW),
            events=[EventDraft(run_id=run_id, type="step", timestamp=NOW, payload=i)],
        ))
        parent = cp_id
        ids.append(cp_id)
    store.release(thread_id, claim.token)
    return ids


# -- queue list ----------------------------------------------------------------------------------------------------


def test_queue_list_shows_entries_with_their_state_runs_and_lease_and_filters(backend: Backend, store: Any) -> None:
    q = store.queue
    a = q.enqueue("t-a", graph_id="qa", input={"n": 1}, tenant_id="acme")
    b = q.enqueue("t-b", graph_id="qa", tenant_id="other")
    c = q.enqueue("t-c", graph_id="qa", tenant_id="acme")
    lease = q.lease("worker-1", TTL)
    q.record_run(a.entry_id, lease.attempt, "run-a1")
    lease_b = q.lease("worker-2", TTL)
    q.finish(b.entry_id, lease_b.attempt, status=EntryStatus.FAILED, error="boom")
    before = backend.dump()
    result = run(backend, "--json", "queue", "list")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [e["entry_id"] for e in doc["entries"]] == [a.entry_id, b.entry_id, c.entry_id] and doc["next"] is None
    first = doc["entries"][0]
    assert first["state"] == "leased" and first["leased_by"] == "worker-1" and first["run_ids"] == ["run-a1"]
    assert first["attempts"] == 1 and first["lease_expires_at"] is not None and first["input"] == {"n": 1}
    assert doc["entries"][1]["state"] == "failed" and doc["entries"][1]["error"] == "boom"
    listed = lambda *args: [e["entry_id"] for e in json.loads(run(backend, "--json", "queue", "list", *args).output)["entries"]]  # noqa: E731
    assert listed("--tenant", "acme") == [a.entry_id, c.entry_id]
    assert listed("--state", "leased") == [a.entry_id]
    assert listed("--state", "open") == [a.entry_id, c.entry_id]
    assert listed("--state", "failed") == [b.entry_id]
    assert listed("--state", "done") == []
    assert listed("--state", "completed") == []
    page = json.loads(run(backend, "--json", "queue", "list", "--limit", "1").output)
    assert [e["entry_id"] for e in page["entries"]] == [a.entry_id] and page["next"] == a.entry_id
    assert listed("--after", str(a.entry_id)) == [b.entry_id, c.entry_id]
    table = run(backend, "queue", "list")
    assert "worker-1" in table.output and "run-a1" in table.output and "3 entries" in table.output
    assert "acme" in table.output and "other" in table.output  # each entry's tenant
    assert f"entry {b.entry_id}: boom" in table.output  # a failed entry's error, below the table
    assert f"entry {a.entry_id}:" not in table.output
    assert backend.dump() == before  # listing reads only


def test_queue_list_filters_completed_as_the_table_shows_it_and_counts_refunds(backend: Backend, store: Any) -> None:
    q = store.queue
    done = q.enqueue("t-a", graph_id="qa")
    lease = q.lease("w", TTL)
    q.finish(done.entry_id, lease.attempt)
    handed = q.enqueue("t-b", graph_id="qa")
    first = q.lease("w", TTL)
    q.release_lease(handed.entry_id, first.attempt, refund=True)  # a worker that stopped gracefully
    q.lease("w", TTL)  # a second lease: counted
    listed = lambda *args: json.loads(run(backend, "--json", "queue", "list", *args).stdout)["entries"]  # noqa: E731
    assert [e["entry_id"] for e in listed("--state", "completed")] == [done.entry_id]
    assert [e["entry_id"] for e in listed("--state", "done")] == [done.entry_id]  # the older name, still taken
    assert "completed" in run(backend, "queue", "list", "--state", "completed").stdout
    entry = {e["entry_id"]: e for e in listed()}[handed.entry_id]
    assert (entry["attempts"], entry["refunded"], entry["counted_attempts"]) == (2, 1, 1)
    assert "completed" in run(backend, "queue", "list", "--help").stdout


def test_queue_list_says_when_a_delayed_entry_becomes_available_by_the_stores_clock(
    backend: Backend, store: Any
) -> None:
    """Found by an operator: a delayed entry looked like any open one, and nothing said whose entry it was."""
    now = store.queue.depth().read_at
    delayed = store.queue.enqueue("t-later", graph_id="qa", tenant_id="acme", delay=timedelta(hours=2))
    soon = store.queue.enqueue("t-now", graph_id="qa")
    before = backend.dump()
    doc = json.loads(run(backend, "--json", "queue", "list").output)
    read_at = datetime.fromisoformat(doc["read_at"])
    assert now <= read_at < datetime.fromisoformat(doc["entries"][0]["available_at"])
    assert [e["state"] for e in doc["entries"]] == ["open", "open"]  # --json: unchanged fields, read_at added
    table = " ".join(run(backend, "queue", "list").output.split())
    available = delayed.available_at.astimezone(UTC)
    shown = f"{available:%H:%M:%S}" if available.date() == read_at.astimezone(UTC).date() else f"{available:%Y-%m-%d}"
    assert f"open, from {shown}" in table and "acme" in table, table
    assert table.count(", from ") == 1  # the entry leasable now says nothing more
    assert soon.entry_id in [e["entry_id"] for e in doc["entries"]]
    assert backend.dump() == before


# -- queue cancel --------------------------------------------------------------------------------------------------


def test_queue_cancel_finishes_an_idle_entry_failed(backend: Backend, store: Any) -> None:
    q = store.queue
    entry = q.enqueue("t1", graph_id="qa")
    result = run(backend, "queue", "cancel", str(entry.entry_id), "--reason", "wrong input")
    assert result.exit_code == 0, result.output
    assert f"entry {entry.entry_id} cancelled" in result.output
    after = q.entry(entry.entry_id)
    assert after.status is EntryStatus.FAILED and after.error == "cancelled by an operator: wrong input"
    assert q.lease("w", TTL) is None  # never leased again


def test_queue_cancel_refuses_a_live_lease_unless_forced_and_force_fences_the_worker(
    backend: Backend, store: Any
) -> None:
    q = store.queue
    entry = q.enqueue("t1", graph_id="qa")
    queued_behind = q.enqueue("t1", graph_id="qa")
    lease = q.lease("worker-1", TTL)
    before = backend.dump()
    refused = run(backend, "queue", "cancel", str(entry.entry_id))
    assert refused.exit_code == EXIT_FAILED
    assert "worker-1 holds a live lease" in refused.output and "--force" in refused.output
    assert backend.dump() == before  # nothing changed
    forced = run(backend, "--json", "queue", "cancel", str(entry.entry_id), "--force")
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.output)
    assert doc["fenced"] == "worker-1" and doc["entry"]["status"] == "failed"
    with pytest.raises(StaleLease):
        q.renew_lease(entry.entry_id, lease.attempt, TTL)
    with pytest.raises(StaleLease):
        q.finish(entry.entry_id, lease.attempt)
    assert q.lease("w", TTL).entry_id == queued_behind.entry_id  # the thread's next entry goes on


@pytest.mark.parametrize("command", ["cancel", "retry"])
def test_unknown_finished_and_bad_entries_are_refused_with_nothing_changed(
    backend: Backend, store: Any, command: str
) -> None:
    q = store.queue
    done = q.enqueue("t1", graph_id="qa")
    lease = q.lease("w", TTL)
    q.finish(done.entry_id, lease.attempt)
    before = backend.dump()
    unknown = run(backend, "queue", command, "999")
    assert unknown.exit_code == EXIT_FAILED and "unknown run-queue entry 999" in unknown.output
    finished = run(backend, "--json", "queue", command, str(done.entry_id))
    assert finished.exit_code == EXIT_FAILED
    assert json.loads(finished.output.splitlines()[-1])["error"]["type"] == "InvalidEntryState"
    for bad in ("x", "0", "-3"):
        assert run(backend, "queue", command, bad).exit_code == EXIT_USAGE
    assert backend.dump() == before


# -- queue retry ---------------------------------------------------------------------------------------------------


def test_queue_retry_enqueues_a_failed_entry_again(backend: Backend, store: Any) -> None:
    q = store.queue
    entry = q.enqueue("t1", graph_id="qa", input={"question": "why?"}, tenant_id="acme")
    lease = q.lease("w", TTL)
    q.record_run(entry.entry_id, lease.attempt, "run-1")
    _commit_run(store, "t1", "run-1", 2, status=CheckpointStatus.FAILED)  # the run failed: the thread settled
    q.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="boom")
    result = run(backend, "--json", "queue", "retry", str(entry.entry_id))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    new = q.entry(doc["entry"]["entry_id"])
    assert doc["retried"] == entry.entry_id and new.entry_id > entry.entry_id
    assert (new.thread_id, new.graph_id, new.input, new.tenant_id) == ("t1", "qa", {"question": "why?"}, "acme")
    assert new.status is EntryStatus.OPEN and new.attempts == 0 and new.run_ids == ()
    assert q.entry(entry.entry_id).status is EntryStatus.FAILED  # the failed entry stays as it was


def test_queue_retry_twice_is_refused_naming_the_entry_the_first_retry_enqueued(
    backend: Backend, store: Any
) -> None:
    q = store.queue
    entry = q.enqueue("t1", graph_id="qa", input={"n": 1})
    lease = q.lease("w", TTL)
    q.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="boom")
    first = run(backend, "queue", "retry", str(entry.entry_id))
    assert first.exit_code == 0, first.output
    new = q.entries(limit=10)[-1]
    assert new.entry_id > entry.entry_id and f"as entry {new.entry_id}" in first.output
    before = backend.dump()
    again = run(backend, "queue", "retry", str(entry.entry_id))
    assert again.exit_code == EXIT_FAILED
    assert again.stdout == ""
    assert again.stderr.strip().splitlines() == [
        f"threadloom: error: entry {entry.entry_id} is not retried: it was retried already, as entry {new.entry_id}"
    ]
    assert backend.dump() == before  # nothing enqueued
    doc = json.loads(run(backend, "--json", "queue", "retry", str(entry.entry_id)).stdout)
    assert doc["error"]["type"] == "InvalidEntryState" and f"entry {new.entry_id}" in doc["error"]["message"]
    listed = json.loads(run(backend, "--json", "queue", "list").stdout)["entries"]
    assert [e["retried_as"] for e in listed] == [new.entry_id, None]
    assert f"retried as {new.entry_id}" in " ".join(run(backend, "queue", "list").stdout.split())


def test_queue_retry_refuses_an_open_entry_and_an_admitted_incomplete_run(backend: Backend, store: Any) -> None:
    q = store.queue
    open_entry = q.enqueue("t0", graph_id="qa")
    entry = q.enqueue("t1", graph_id="qa")
    q.lease("w", TTL)
    lease = q.lease("w", TTL)
    assert lease.entry_id == entry.entry_id
    q.record_run(entry.entry_id, lease.attempt, "run-1")
    _commit_run(store, "t1", "run-1", 1)  # admitted, still RUNNING
    q.finish(entry.entry_id, lease.attempt, status=EntryStatus.FAILED, error="store damaged")
    before = backend.dump()
    refused = run(backend, "queue", "retry", str(entry.entry_id))
    assert refused.exit_code == EXIT_FAILED and "still incomplete" in refused.output and "recover" in refused.output
    still_open = run(backend, "queue", "retry", str(open_entry.entry_id))
    assert still_open.exit_code == EXIT_FAILED and "is open" in still_open.output
    assert backend.dump() == before


# -- sweep ---------------------------------------------------------------------------------------------------------


def _history_store(store: Any) -> None:
    for i in range(5):
        _commit_run(store, f"t{i}", f"run-{i}", 4)
    claim = store.claim("gone", ClaimRequest(holder="r", ttl=TTL))
    store.commit("gone", Commit(token=claim.token, events=[EventDraft(run_id="r", type="x", timestamp=NOW)]))
    store.delete_thread("gone", claim.token)


def test_sweep_dry_run_prints_each_page_and_changes_nothing(backend: Backend, store: Any) -> None:
    _history_store(store)
    store.close()
    before = backend.dump()
    result = run(backend, "--json", "sweep", "--dry-run", "--max-checkpoints", "1", "--max-events", "0",
                 "--tombstone-age", "1ms", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["dry_run"] is True and len(doc["pages"]) == 3
    assert doc["pages"][0] == {"visited": ["gone", "t0"], "pruned": ["t0"], "reclaimed": ["gone"]}
    assert doc["pruned"] == 5 and doc["reclaimed"] == 1 and doc["visited"] == 6
    assert backend.dump() == before  # every row (and the SQLite file's bytes) as it was
    text = run(backend, "sweep", "--dry-run", "--max-checkpoints", "1", "--batch-size", "2")
    assert "page 1: 2 visited; would prune 1: t0" in text.output and "nothing was changed" in text.output
    assert backend.dump() == before
    real = run(backend, "--json", "sweep", "--max-checkpoints", "1", "--batch-size", "2")
    assert json.loads(real.output)["pruned"] == 5  # what the dry run announced
    reopened = backend.open()
    try:
        assert len(reopened.history("t0", limit=10)) == 1
    finally:
        reopened.close()


def test_sweep_max_events_zero_needs_yes_and_is_refused_with_nothing_changed(backend: Backend, store: Any) -> None:
    _history_store(store)
    store.close()
    before = backend.dump()
    refused = run(backend, "sweep", "--max-events", "0")  # stdin is not a terminal: no question, a refusal
    assert refused.exit_code == EXIT_FAILED and "--yes" in refused.output
    declined = CliRunner().invoke(cli, ["--store", backend.url, "sweep", "--max-events", "0"], input="n\n")
    assert declined.exit_code == EXIT_FAILED
    assert backend.dump() == before
    done = run(backend, "--json", "sweep", "--max-events", "0", "--yes")
    assert done.exit_code == 0 and json.loads(done.output)["pruned"] == 5
    reopened = backend.open()
    try:
        assert reopened.events_after("t0", 4, 10) == []
    finally:
        reopened.close()


def test_sweep_queue_age_purges_finished_entries_only(backend: Backend, store: Any) -> None:
    q = store.queue
    finished = q.enqueue("t1", graph_id="qa")
    lease = q.lease("w", TTL)
    q.record_run(finished.entry_id, lease.attempt, "r1")
    q.finish(finished.entry_id, lease.attempt)
    still_open = q.enqueue("t2", graph_id="qa")
    young = run(backend, "--json", "sweep", "--queue-age", "1h")
    assert young.exit_code == 0 and json.loads(young.output)["queue_purged"] == 0
    assert q.entry(finished.entry_id) is not None
    preview = run(backend, "--json", "sweep", "--dry-run", "--queue-age", "1ms")
    assert json.loads(preview.output)["queue_purged"] == [finished.entry_id]
    assert q.entry(finished.entry_id) is not None
    purged = run(backend, "--json", "sweep", "--queue-age", "1ms")
    assert purged.exit_code == 0 and json.loads(purged.output)["queue_purged"] == 1
    assert q.entry(finished.entry_id) is None and q.entry(still_open.entry_id).open


# -- show, recover, delete -----------------------------------------------------------------------------------------

GRAPH_MODULE = '''
from threadloom import Graph, Step

def first(state, ctx):
    return Step.to("second", {**state, "first": True})

def second(state, ctx):
    return Step.end({**state, "second": True})

graph = Graph("g", {"first": first, "second": second}, entry="first")
'''


@pytest.fixture
def graph_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "cli_ops_graph.py").write_text(GRAPH_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_ops_graph:graph"


def _dead_run(store: Any, thread: str, ttl: timedelta, *, tenant: str | None = "acme") -> Any:
    """A run that claimed ``thread``, committed its first checkpoint (next node: first) and died."""
    claim = store.claim(thread, ClaimRequest(holder="dead-run", ttl=ttl, tenant_id=tenant))
    store.commit(thread, Commit(token=claim.token, checkpoint=Checkpoint(
        id="c0", parent=None, thread_id=thread, run_id="dead-run", status=CheckpointStatus.RUNNING, created_at=NOW,
        graph_id="g", state={"n": 1}, tenant_id=tenant, metadata={"threadloom.next": "first"},
    )))
    return claim


def test_show_names_the_claim_holder_its_expiry_and_the_open_entries(backend: Backend, store: Any) -> None:
    claim = _dead_run(store, "t1", TTL)
    entry = store.queue.enqueue("t1", graph_id="g", tenant_id="acme")
    store.queue.enqueue("other", graph_id="g")
    doc = json.loads(run(backend, "--json", "show", "t1").output)
    assert doc["claim"] == {"holder": "dead-run", "token": claim.token, "expires_at": claim.expires_at.isoformat(),
                            "tenant_id": "acme", "state": "live"}
    assert [e["entry_id"] for e in doc["queue_entries"]] == [entry.entry_id]
    text = run(backend, "show", "t1").output
    assert "dead-run (token" in text and "by the store's clock: live" in text and "open run-queue entries" in text
    store.release("t1", claim.token)
    assert json.loads(run(backend, "--json", "show", "t1").output)["claim"] is None


def test_recover_refuses_a_live_claim_then_waits_for_a_dead_runs_claim_to_expire(
    backend: Backend, store: Any, graph_module: str
) -> None:
    claim = _dead_run(store, "t1", timedelta(seconds=2))
    before = backend.dump()
    refused = run(backend, "recover", "t1", "--graph", graph_module)
    assert refused.exit_code == EXIT_FAILED and "'dead-run'" in refused.output and "--wait" in refused.output
    assert backend.dump() == before
    result = run(backend, "--json", "recover", "t1", "--graph", graph_module, "--wait", "--timeout", "60s")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["status"] == "completed"
    latest = store.latest("t1").checkpoint
    assert latest.status is CheckpointStatus.COMPLETED and latest.state == {"n": 1, "first": True, "second": True}
    assert latest.fencing_token > claim.token and store.current_claim("t1") is None


def test_recover_wait_gives_up_on_a_claim_that_keeps_being_renewed(
    backend: Backend, store: Any, graph_module: str
) -> None:
    import threading

    claim = _dead_run(store, "t1", timedelta(seconds=1))
    stop = threading.Event()

    def renew() -> None:  # a live run: it renews its claim well before expiry
        while not stop.wait(0.2):
            store.renew("t1", claim.token, timedelta(seconds=1))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        result = run(backend, "recover", "t1", "--graph", graph_module, "--wait", "--timeout", "2s")
    finally:
        stop.set()
        renewer.join()
    assert result.exit_code == EXIT_FAILED
    assert "'dead-run'" in result.output and "--timeout ran out" in result.output
    assert store.latest("t1").checkpoint.id == "c0" and store.current_claim("t1").token == claim.token


def test_recover_refuses_a_bad_graph_an_unknown_thread_and_a_settled_one(
    backend: Backend, store: Any, graph_module: str
) -> None:
    _commit_run(store, "done", "run-1", 1, status=CheckpointStatus.COMPLETED)
    before = backend.dump()
    bad = run(backend, "recover", "done", "--graph", "no_such_module_xyz:graph")
    assert bad.exit_code == EXIT_USAGE and "cannot import" in bad.output
    assert run(backend, "recover", "done", "--graph", "cli_ops_graph").exit_code == EXIT_USAGE
    unknown = run(backend, "recover", "nope", "--graph", graph_module)
    assert unknown.exit_code == EXIT_FAILED and "unknown thread" in unknown.output
    settled = run(backend, "--json", "recover", "done", "--graph", graph_module)
    assert settled.exit_code == EXIT_FAILED
    assert json.loads(settled.output.splitlines()[-1])["error"]["type"] == "InvalidRunState"
    assert backend.dump() == before


def test_recover_and_delete_refuse_another_tenants_thread_before_they_look_at_it(
    backend: Backend, store: Any, graph_module: str
) -> None:
    _commit_run(store, "done", "run-1", 1, status=CheckpointStatus.COMPLETED)  # tenant None
    live = _dead_run(store, "live", TTL)  # tenant acme, a live claim
    store.claim("starting", ClaimRequest(holder="run-s", ttl=TTL, tenant_id="acme"))  # no checkpoint yet
    mark = store.token_high_water()
    before = backend.dump()
    for args in (
        ("recover", "done", "--graph", graph_module, "--tenant", "other"),
        ("recover", "live", "--graph", graph_module, "--tenant", "other"),
        ("delete", "live", "--tenant", "other", "--yes"),
        ("delete", "starting", "--tenant", "other", "--yes"),
    ):
        result = run(backend, "--json", *args)
        assert result.exit_code == EXIT_FAILED, (args, result.output)
        error = json.loads(result.output.splitlines()[-1])["error"]
        # Neither the thread's status nor its holder is told to another tenant.
        assert error["type"] == "TenantMismatch", (args, error)
        assert "completed" not in error["message"] and live.holder not in error["message"], (args, error)
    assert store.token_high_water() == mark  # no claim was taken
    assert backend.dump() == before


def test_delete_cascades_after_confirmation_and_refuses_a_live_run(backend: Backend, store: Any) -> None:
    from threadloom import CheckpointOrigin

    _commit_run(store, "root", "run-1", 2)
    claim = store.claim("child", ClaimRequest(holder="run-c", ttl=TTL))
    store.commit("child", Commit(token=claim.token, checkpoint=Checkpoint(
        id="k0", parent=None, thread_id="child", run_id="run-c", status=CheckpointStatus.COMPLETED, created_at=NOW,
        origin=CheckpointOrigin(parent_thread="root"),
    )))
    store.release("child", claim.token)
    live = _dead_run(store, "busy", TTL, tenant=None)
    before = backend.dump()
    unconfirmed = run(backend, "delete", "root")  # stdin is not a terminal: refused without --yes
    assert unconfirmed.exit_code == EXIT_FAILED and "--yes" in unconfirmed.output
    declined = CliRunner().invoke(cli, ["--store", backend.url, "delete", "root"], input="n\n")
    assert declined.exit_code == EXIT_FAILED
    held = run(backend, "delete", "busy", "--yes")
    assert held.exit_code == EXIT_FAILED
    assert backend.dump() == before
    done = run(backend, "--json", "delete", "root", "--yes")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["deleted"] == ["child", "root"]
    assert store.latest("root") is None and store.latest("child") is None
    assert store.current_claim("busy").token == live.token
    assert run(backend, "delete", "root", "--yes").exit_code == EXIT_FAILED  # unknown now


# -- listing -------------------------------------------------------------------------------------------------------


def test_history_and_events_print_the_cursor_of_the_next_page(backend: Backend, store: Any) -> None:
    ids = _commit_run(store, "t1", "run-1", 5)
    page = json.loads(run(backend, "--json", "history", "t1", "--limit", "2").output)
    assert [cp["id"] for cp in page["checkpoints"]] == [ids[4], ids[3]] and page["next"] == ids[3]
    following = json.loads(run(backend, "--json", "history", "t1", "--limit", "2", "--before", page["next"]).output)
    assert [cp["id"] for cp in following["checkpoints"]] == [ids[2], ids[1]]
    last = json.loads(run(backend, "--json", "history", "t1", "--limit", "5").output)
    assert last["next"] is None
    assert "more follow: --before " + ids[3] in run(backend, "history", "t1", "--limit", "2").output
    events = json.loads(run(backend, "--json", "events", "t1", "--limit", "3").output)
    assert [e["seq"] for e in events["events"]] == [1, 2, 3] and events["next"] == 3
    assert json.loads(run(backend, "--json", "events", "t1", "--after", "3").output)["next"] is None
    assert "more follow: --after 3" in run(backend, "events", "t1", "--limit", "3").output


def test_global_options_are_accepted_after_the_command_name(backend: Backend, store: Any) -> None:
    _commit_run(store, "t1", "run-1", 1)
    after = CliRunner().invoke(cli, ["history", "t1", "--json", "--store", backend.url, "--log-level", "error"])
    assert after.exit_code == 0, after.output
    assert json.loads(after.output)["checkpoints"][0]["id"] == "run-1:0"
    nested = CliRunner().invoke(cli, ["queue", "list", f"--store={backend.url}", "--json"])
    assert nested.exit_code == 0 and json.loads(nested.output)["entries"] == []
    from threadloom.cli.main import hoist_global_options

    assert hoist_global_options(["demo", "--store", "x", "--json"]) == ["--json", "demo", "--store", "x"]
    assert hoist_global_options(["events", "t", "--", "--json"]) == ["events", "t", "--", "--json"]


# -- tenants, and what threads without --tenant says ----------------------------------------------------------------


def _tenant_threads(store: Any, *, untenanted: bool = True) -> None:
    """acme: 3 root threads and a child; beta: 1; no tenant: 2 (none with ``untenanted=False``)."""
    for thread, tenant, origin in [("a1", "acme", None), ("a2", "acme", None), ("a3", "acme", None),
                                   ("a1-kid", "acme", "a1"), ("b1", "beta", None), ("n1", None, None),
                                   ("n2", None, None)]:
        if tenant is None and not untenanted:
            continue
        claim = store.claim(thread, ClaimRequest(holder=f"run-{thread}", ttl=TTL, tenant_id=tenant))
        store.commit(thread, Commit(token=claim.token, checkpoint=Checkpoint(
            id=f"{thread}:0", parent=None, thread_id=thread, run_id=f"run-{thread}", status=CheckpointStatus.COMPLETED,
            created_at=NOW, tenant_id=tenant,
            origin=CheckpointOrigin(parent_thread=origin) if origin is not None else None,
        )))
        store.release(thread, claim.token)


def test_tenants_lists_root_thread_counts_pages_and_changes_nothing(backend: Backend, store: Any) -> None:
    _tenant_threads(store)
    before = backend.dump()
    listed = run(backend, "--json", "tenants")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == {
        "tenants": [{"tenant_id": "acme", "threads": 3}, {"tenant_id": "beta", "threads": 1},
                    {"tenant_id": None, "threads": 2}],
        "next": None,
    }
    first = json.loads(run(backend, "--json", "tenants", "--limit", "1").output)
    assert first == {"tenants": [{"tenant_id": "acme", "threads": 3}], "next": "acme"}
    rest = json.loads(run(backend, "--json", "tenants", "--after", "acme").output)
    assert [row["tenant_id"] for row in rest["tenants"]] == ["beta", None] and rest["next"] is None
    table = run(backend, "tenants", "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "(no tenant)" not in table.output and "more follow: --after beta" in table.output
    assert "(no tenant)" in run(backend, "tenants").output
    for bad in (["--limit", "0"], ["--after", ""]):
        refused = run(backend, "tenants", *bad)
        assert refused.exit_code == EXIT_USAGE, refused.output
    assert backend.dump() == before


def test_threads_without_tenant_says_what_other_tenants_hold(backend: Backend, store: Any) -> None:
    _tenant_threads(store)
    before = backend.dump()
    listed = run(backend, "--json", "threads")
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.output)
    assert sorted(s["thread_id"] for s in document["threads"]) == ["n1", "n2"]
    assert document["other_tenants"]["tenants"] == 2 and document["other_tenants"]["threads"] == 4
    assert document["other_tenants"]["complete"] is True
    table = run(backend, "threads").output
    assert "4 more root thread(s) belong to 2 tenant(s)" in " ".join(table.split())
    assert "--tenant T" in table and "threadloom tenants" in table
    scoped = run(backend, "--json", "threads", "--tenant", "acme")
    assert "other_tenants" not in json.loads(scoped.output)
    assert "more root thread" not in run(backend, "threads", "--tenant", "acme").output
    assert backend.dump() == before


def test_stats_without_tenant_on_a_store_whose_threads_all_have_one_says_where_they_are(
    backend: Backend, store: Any
) -> None:
    """Found by a new user: ``stats`` without ``--tenant`` read 0 threads and said nothing more."""
    _tenant_threads(store, untenanted=False)
    before = backend.dump()
    probed = run(backend, "--json", "stats", "--rounds", "1")
    assert probed.exit_code == 0, probed.output
    document = json.loads(probed.output)
    assert document["threads"] == []
    assert document["other_tenants"]["tenants"] == 2 and document["other_tenants"]["threads"] == 4
    table = " ".join(run(backend, "stats", "--rounds", "1").output.split())
    assert "4 more root thread(s) belong to 2 tenant(s)" in table
    scoped = json.loads(run(backend, "--json", "stats", "--rounds", "1", "--tenant", "acme").output)
    assert scoped["threads"] and "other_tenants" not in scoped
    assert backend.dump() == before


def test_tables_fit_an_80_column_terminal(tmp_path: Path) -> None:
    """``threads``, ``show``, ``queue list`` and ``tenants`` in a real pseudo-terminal 80 columns wide: no line is
    wider."""
    from threadloom.persistence.sqlite.store import SqliteCheckpointer
    from threadloom.testing.terminal import run_in_terminal

    path = tmp_path / "wide.db"
    with SqliteCheckpointer.open(str(path)) as store:
        for i in range(3):
            thread = f"customer-support-conversation-{i:04d}-with-a-long-identifier"
            claim = store.claim(thread, ClaimRequest(holder=f"worker-node-{i}:run-0123456789abcdef", ttl=TTL))
            store.commit(thread, Commit(token=claim.token, checkpoint=Checkpoint(
                id=f"checkpoint-{i}-0123456789abcdef0123456789", parent=None, thread_id=thread,
                run_id=f"worker-node-{i}:run-0123456789abcdef", status=CheckpointStatus.RUNNING, created_at=NOW,
                graph_id="a-graph-with-a-long-name", state={"text": "x" * 300},
                metadata={"customer": "a-rather-long-customer-name", "channel": "email"},
            )))
            entry = store.queue.enqueue(thread, graph_id="a-graph-with-a-long-name", input={"n": i},
                                        tenant_id="a-tenant-with-a-long-name-0123456789")
            lease = store.queue.lease(f"worker-node-{i}.example.internal", TTL)
            store.queue.record_run(entry.entry_id, lease.attempt, f"worker-node-{i}:run-0123456789abcdef")
        store.queue.enqueue("customer-support-conversation-9999-with-a-long-identifier", tenant_id="t-delayed",
                            graph_id="a-graph-with-a-long-name", delay=timedelta(days=3))
        tenant = "a-tenant-with-a-rather-long-name-for-an-eighty-column-terminal-0123456789"
        claim = store.claim("tenanted", ClaimRequest(holder="r", ttl=TTL, tenant_id=tenant))
        store.commit("tenanted", Commit(token=claim.token, checkpoint=Checkpoint(
            id="c", parent=None, thread_id="tenanted", run_id="r", status=CheckpointStatus.COMPLETED, created_at=NOW,
            tenant_id=tenant,
        )))
    url = f"sqlite:///{path}"
    for args in (["threads"], ["show", "customer-support-conversation-0001-with-a-long-identifier"],
                 ["queue", "list"], ["tenants"]):
        shown = run_in_terminal(["--store", url, *args], columns=80, timeout_s=60)
        assert shown.exit_code == 0, shown.text
        assert len(shown.lines) > 3, shown.text
        assert shown.wider_than(80) == [], shown.text
        if args[0] != "tenants":
            assert "customer" in shown.text  # ids fold inside their cells
        else:
            assert "a-tenant-with" in shown.text and "(no tenant)" in shown.text
        if args[0] == "queue":
            assert "(t-delay" in shown.text and "from" in shown.text and "(a-tenan" in shown.text  # cells fold
        if args[0] == "threads":
            assert "1 more root thread(s) belong to 1 tenant(s)" in " ".join(shown.text.split())


def test_the_terminal_replay_follows_a_live_redraw_and_reports_a_line_past_the_last_column() -> None:
    from threadloom.testing.terminal import replay

    live = "status 1\r\n\x1b[32mrow\x1b[0m\r\x1b[2K\x1b[1A\x1b[2Kstatus 2\r\nrow\r\n"
    assert replay(live, 10) == ("status 2\nrow\n", ())
    text, over = replay("x" * 12 + "\r\n" + "y" * 10 + "\r\n", 10)
    assert text.split("\n")[:2] == ["x" * 12, "y" * 10] and over == ("x" * 12,)
    erased, over = replay("z" * 11 + "\r\x1b[2Kshort\r\n", 10)
    assert erased == "short\n" and over == ("z" * 11,)  # erased by a redraw, but it was drawn too wide


# -- queue enqueue -------------------------------------------------------------------------------------------------


def test_queue_enqueue_adds_an_open_entry_and_refuses_bad_input_writing_nothing(backend: Backend, store: Any) -> None:
    """Found by a new user: the CLI could list, retry and cancel entries but not add one."""
    added = run(backend, "--json", "queue", "enqueue", "t-new", "--graph", "qa", "--input", '{"n": 1}',
                "--tenant", "acme")
    assert added.exit_code == 0, added.output
    entry = json.loads(added.stdout)["entry"]
    assert (entry["thread_id"], entry["graph_id"], entry["tenant_id"], entry["input"]) == ("t-new", "qa", "acme", {"n": 1})
    assert entry["status"] == "open" and entry["attempts"] == 0
    stored = store.queue.entry(entry["entry_id"])
    assert stored is not None and stored.input == {"n": 1} and stored.tenant_id == "acme"
    later = run(backend, "queue", "enqueue", "t-later", "--graph", "qa", "--delay", "3600")
    assert later.exit_code == 0 and "enqueued (thread t-later, graph qa)" in " ".join(later.output.split())
    assert store.queue.lease("w", TTL).entry.thread_id == "t-new"  # the delayed one is not leasable yet
    assert store.queue.lease("w", TTL) is None
    before = backend.dump()
    for bad in (["t", "--graph", "qa", "--input", "{nope"], ["t", "--graph", "qa", "--input", "NaN"],
                ["", "--graph", "qa"], ["t", "--graph", ""], ["t", "--graph", "qa", "--delay", "-1"], ["t"],
                ["t", "--graph", "qa", "--input", "[" * 5000 + "]" * 5000],  # found by hostile testing: these four
                ["t", "--graph", "qa", "--delay", "inf"], ["t", "--graph", "qa", "--delay", "nan"],  # were exit 1
                ["t", "--graph", "qa", "--delay", "1e300"]):
        refused = run(backend, "queue", "enqueue", *bad)
        assert refused.exit_code == EXIT_USAGE, (bad, refused.output)
    assert backend.dump() == before


def test_queue_enqueue_refuses_a_delay_that_is_not_a_number_of_seconds_naming_the_option(
    backend: Backend, store: Any
) -> None:
    """Found by an operator: ``--delay nan`` said "--delay must be at most 36500 days"."""
    before = backend.dump()
    for delay, says in (("nan", "'nan' is not a number"), ("NaN", "'NaN' is not a number"),
                        ("inf", "not in the range"), ("-inf", "not in the range"), ("-1", "not in the range"),
                        ("1e300", "not in the range")):
        refused = run(backend, "queue", "enqueue", "t", "--graph", "qa", "--delay", delay)
        assert refused.exit_code == EXIT_USAGE, (delay, refused.output)
        lines = refused.output.strip().splitlines()
        assert len(lines) == 1 and "'--delay'" in lines[0] and says in lines[0], (delay, refused.output)
    assert backend.dump() == before


def test_queue_enqueue_refuses_an_input_object_naming_a_key_twice(backend: Backend, store: Any) -> None:
    """Found by an operator: ``--input '{"n": 1, "n": 2}'`` was enqueued with ``{"n": 2}`` (the last value won)."""
    before = backend.dump()
    for text, key in (('{"n": 1, "n": 2}', '"n"'), ('[{"a": {"b\\u00e9": 1, "bé": 2}}]', '"bé"')):
        refused = run(backend, "queue", "enqueue", "t", "--graph", "qa", "--input", text)
        assert refused.exit_code == EXIT_USAGE, refused.output
        lines = refused.output.strip().splitlines()
        assert len(lines) == 1 and "--input" in lines[0] and f"key {key} twice" in lines[0], refused.output
        as_json = run(backend, "--json", "queue", "enqueue", "t", "--graph", "qa", "--input", text)
        assert as_json.exit_code == EXIT_USAGE
        assert json.loads(as_json.stdout.splitlines()[0])["error"]["type"] == "ValidationError"
    assert backend.dump() == before
    assert store.queue.entries(limit=10) == []


def test_queue_enqueue_notes_a_graph_the_store_has_never_seen(backend: Backend, store: Any) -> None:
    """Found by an operator: an entry of a mistyped --graph was enqueued silently and waited forever."""
    unseen = run(backend, "--json", "queue", "enqueue", "t1", "--graph", "qa")
    assert unseen.exit_code == 0, unseen.output
    assert json.loads(unseen.stdout)["graph_seen"] is False
    note = unseen.stderr.strip().splitlines()
    assert len(note) == 1 and "note: no runtime serving graph 'qa' has been seen" in note[0], unseen.stderr
    entry = store.queue.entry(json.loads(unseen.stdout)["entry"]["entry_id"])
    assert entry is not None and entry.graph_id == "qa"  # enqueued all the same
    again = run(backend, "--json", "queue", "enqueue", "t2", "--graph", "qa")  # a queue entry of it: seen
    assert again.exit_code == 0 and json.loads(again.stdout)["graph_seen"] is True and again.stderr == ""
    claim = store.claim("t3", ClaimRequest(holder="r", ttl=TTL))
    store.commit("t3", Commit(token=claim.token, checkpoint=Checkpoint(
        id="c", parent=None, thread_id="t3", run_id="r", status=CheckpointStatus.COMPLETED, created_at=NOW,
        graph_id="ran", tenant_id="acme")))
    store.release("t3", claim.token)
    ran = run(backend, "--json", "queue", "enqueue", "t4", "--graph", "ran")  # a thread of it (another tenant)
    assert ran.exit_code == 0 and json.loads(ran.stdout)["graph_seen"] is True and ran.stderr == ""
    text = run(backend, "queue", "enqueue", "t5", "--graph", "typo")
    assert text.exit_code == 0
    assert "enqueued (thread t5, graph typo)" in " ".join(text.stdout.split()) and "note" not in text.stdout
    assert "graph 'typo' has been seen" in text.stderr
    assert [e.graph_id for e in store.queue.entries(limit=10)] == ["qa", "qa", "ran", "typo"]


@pytest.mark.parametrize("url", ["memory://", "MEMORY://"])
def test_queue_enqueue_refuses_a_memory_store_whose_queue_is_gone_when_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Found by an operator: against memory:// the entry was 'enqueued' into a queue gone as the command exited."""
    monkeypatch.chdir(tmp_path)
    refused = CliRunner().invoke(cli, ["--store", url, "queue", "enqueue", "t", "--graph", "qa"])
    assert refused.exit_code == EXIT_USAGE, refused.output
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and "memory://" in lines[0] and "--store" in lines[0], refused.output
    assert "enqueued" not in refused.output
    as_json = CliRunner().invoke(cli, ["--store", url, "--json", "queue", "enqueue", "t", "--graph", "qa"])
    assert as_json.exit_code == EXIT_USAGE
    assert json.loads(as_json.stdout.splitlines()[0])["error"]["type"] == "ValidationError"
    assert list(tmp_path.iterdir()) == []  # no store opened or created, not even the default file


@pytest.mark.parametrize(
    "args",
    [("--graph", "threadloom.access-walk"), ("--graph", "g", "--tenant", ""), ("--graph", "g", "--input", "1e999")],
    ids=["reserved-graph", "empty-tenant", "input-not-json"],
)
def test_a_refused_queue_enqueue_creates_no_store(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Refused (exit 2, nothing written) holds for a store that does not exist yet: the input is checked before
    the store is created (found by hostile testing: the new file was left with the whole schema)."""
    path = tmp_path / "new.db"
    refused = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "queue", "enqueue", "t1", *args])
    assert refused.exit_code == EXIT_USAGE, refused.output
    assert list(tmp_path.iterdir()) == []


# -- refusals: one error line, no log line ---------------------------------------------------------------------------


def test_refusals_print_only_their_error_line_on_stderr(backend: Backend, store: Any, graph_module: str) -> None:
    """A refusal is the one error line the README promises: no log line of the same refusal before it."""
    claim = _dead_run(store, "live", TTL)  # a live claim (tenant acme)
    _dead_run(store, "t1", TTL)
    store.release("t1", store.current_claim("t1").token)
    entry = store.queue.enqueue("t1", graph_id="g", tenant_id="acme")
    store.queue.lease("w", TTL)
    def rows() -> dict[str, Any]:  # the stored rows, but the claim bookkeeping: a refused delete claims and releases
        dump = backend.dump()[0] if backend.name == "sqlite" else backend.dump()
        return {table: found for table, found in dump.items() if table not in ("store", "threads")}

    before = rows()
    for args in (
        ("delete", "t1", "--tenant", "other", "--yes"),  # another tenant's thread
        ("delete", "live", "--yes"),  # a live run holds it
        ("recover", "t1", "--graph", graph_module, "--tenant", "other"),
        ("recover", "live", "--graph", graph_module),
        ("queue", "cancel", str(entry.entry_id)),  # a live lease
        ("queue", "retry", str(entry.entry_id)),  # open
    ):
        result = run(backend, *args)
        assert result.exit_code == EXIT_FAILED, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("threadloom: error: "), (args, result.stderr)
        assert result.stdout == "", args
        assert rows() == before, args
    asked = run(backend, "--log-level", "info", "delete", "live", "--yes")  # logs asked for
    assert asked.exit_code == EXIT_FAILED and "claim.busy" in asked.stderr
    store.release("live", claim.token)


@pytest.mark.parametrize(
    "command",
    [("threads",), ("stats",), ("queue", "list"), ("queue", "enqueue", "t1", "--graph", "g"), ("recover", "t1",
     "--graph", "m:g"), ("delete", "t1", "--yes")],
    ids=["threads", "stats", "queue-list", "queue-enqueue", "recover", "delete"],
)
@pytest.mark.parametrize("tenant", ["", "x" * 256], ids=["empty", "too-long"])
def test_every_tenant_option_refuses_a_bad_tenant_id_by_name_before_a_store_opens(
    tmp_path: Path, command: tuple[str, ...], tenant: str
) -> None:
    """A bad ``--tenant`` is a usage error naming ``--tenant`` (exit 2), on every command, and no store is opened
    or created (it used to name an internal field, ``query.tenant_id``, or pass as the tenant ``''``)."""
    path = tmp_path / "new.db"
    refused = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", *command, "--tenant", tenant])
    assert refused.exit_code == EXIT_USAGE, refused.output
    assert "Invalid value for '--tenant'" in refused.output, refused.output
    assert "query.tenant_id" not in refused.output
    assert list(tmp_path.iterdir()) == []
