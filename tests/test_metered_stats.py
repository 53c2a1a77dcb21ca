"""``threadloom stats``: read-only probes through a MeteredCheckpointer, printed as a table or JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    InMemoryCheckpointer,
    InMemoryMeter,
    MeteredCheckpointer,
    ReplayUnavailable,
)
from threadloom.cli.main import cli
from threadloom.cli.stats import operations, probe
from threadloom.persistence.metrics.metered import OPERATIONS

START = datetime(2026, 1, 1, tzinfo=UTC)


def run(*args: str):
    return CliRunner().invoke(cli, ["--store", "memory://", *args], catch_exceptions=False)


def seeded_store(count: int = 3) -> InMemoryCheckpointer:
    store = InMemoryCheckpointer()
    for index in range(count):
        thread_id = f"t{index}"
        claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=timedelta(minutes=1)))
        cp = Checkpoint(
            id="c1", parent=None, thread_id=thread_id, run_id="run-1", status=CheckpointStatus.RUNNING,
            created_at=START,
        )
        store.commit(
            thread_id,
            Commit(token=claim.token, checkpoint=cp, events=(EventDraft(run_id="run-1", type="x", timestamp=START),)),
        )
    return store


def test_probe_reads_only_and_every_read_is_metered():
    inner = seeded_store()
    meter = InMemoryMeter()
    wrapped = MeteredCheckpointer(inner, meter)
    read = probe(wrapped, None, [], sample=2)
    assert len(read) == 2 and set(read) <= {"t0", "t1", "t2"}
    rows = {row["op"]: row for row in operations(meter.snapshot())}
    assert rows["threads"]["calls"] == 1 and rows["incomplete"]["calls"] == 1
    for op in ("latest", "history", "events_after", "children", "lookup_run"):
        assert rows[op]["calls"] == 2 and rows[op]["errors"] == 0, op
    assert not {"claim", "renew", "release", "commit", "delete_thread", "prune", "sweep", "compact_events"} & set(rows)
    assert [row["op"] for row in operations(meter.snapshot())] == [op for op in OPERATIONS if op in rows]
    for row in rows.values():
        assert row["p50_ms"] is not None and row["p50_ms"] <= row["p99_ms"]
    # nothing was written: the same events, the same claims (t0's claim is still live)
    assert [e.seq for e in inner.events_after("t0", 0, 10)] == [1]


def test_probe_of_named_threads_reads_those_even_when_unknown():
    meter = InMemoryMeter()
    read = probe(MeteredCheckpointer(InMemoryCheckpointer(), meter), "acme", ["a", "b"], sample=5)
    assert read == ["a", "b"]
    snapshot = meter.snapshot()
    assert snapshot.counter("threadloom_store_calls_total", op="latest") == 2
    assert snapshot.counter("threadloom_store_calls_total", op="lookup_run") == 0  # no checkpoint: no run to look up


def test_stats_prints_a_table():
    result = run("stats", "--rounds", "2", "--thread", "a")
    assert result.exit_code == 0, result.output
    assert "store calls on memory://" in result.output
    for op in ("threads", "incomplete", "latest", "history", "events_after", "children"):
        assert op in result.output
    assert "p99 ms" in result.output


def test_stats_json_has_rows_and_the_whole_snapshot():
    result = run("--json", "stats", "--rounds", "3", "--tenant", "acme", "--thread", "x")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["store"] == "memory://" and document["tenant_id"] == "acme" and document["threads"] == ["x"]
    rows = {row["op"]: row for row in document["operations"]}
    assert rows["threads"]["calls"] == 3 and rows["latest"]["calls"] == 3
    names = {counter["name"] for counter in document["snapshot"]["counters"]}
    assert "threadloom_store_calls_total" in names
    assert {h["labels"]["op"] for h in document["snapshot"]["histograms"]} >= {"threads", "latest"}
    assert document["failure"] is None


@pytest.mark.parametrize("args", [["stats", "--thread", ""], ["stats", "--rounds", "0"]])
def test_stats_refuses_bad_input_as_a_usage_error(args):
    result = run(*args)
    assert result.exit_code == 2


def test_stats_over_a_sqlite_file_reads_its_threads_and_changes_nothing(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = tmp_path / "store.db"
    store = SqliteCheckpointer.open(str(path))
    for index in range(3):
        thread_id = f"t{index}"
        claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=timedelta(minutes=1)))
        cp = Checkpoint(
            id="c1", parent=None, thread_id=thread_id, run_id="run-1", status=CheckpointStatus.RUNNING,
            created_at=START,
        )
        store.commit(thread_id, Commit(token=claim.token, checkpoint=cp))
        store.release(thread_id, claim.token)
    before = [store.latest(f"t{index}") for index in range(3)]
    result = CliRunner().invoke(
        cli, ["--store", f"sqlite:///{path}", "--json", "stats", "--rounds", "2"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert sorted(document["threads"]) == ["t0", "t1", "t2"]
    rows = {row["op"]: row for row in document["operations"]}
    assert rows["latest"]["calls"] == 6 and rows["lookup_run"]["calls"] == 6
    assert rows["incomplete"]["calls"] == 2
    assert all(row["errors"] == 0 for row in rows.values())
    assert [store.latest(f"t{index}") for index in range(3)] == before
    assert len(store.incomplete(None, limit=10).items) == 3  # still idle: the probes claimed nothing
    store.close()


def test_stats_after_a_sweep_reads_events_from_each_threads_floor_without_errors(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = tmp_path / "store.db"
    store = SqliteCheckpointer.open(str(path))
    for index in range(2):
        thread_id = f"t{index}"
        claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=timedelta(minutes=1)))
        parent = None
        for step in range(5):
            cp = Checkpoint(
                id=f"c{step}", parent=parent, thread_id=thread_id, run_id="run-1",
                status=CheckpointStatus.COMPLETED if step == 4 else CheckpointStatus.RUNNING, created_at=START,
            )
            store.commit(thread_id, Commit(
                token=claim.token, checkpoint=cp, events=(EventDraft(run_id="run-1", type="x", timestamp=START),),
            ))
            parent = cp.id
        store.release(thread_id, claim.token)
    store.close()
    url = f"sqlite:///{path}"
    swept = CliRunner().invoke(cli, ["--store", url, "sweep", "--max-checkpoints", "2", "--yes"])
    assert swept.exit_code == 0, swept.output
    reopened = SqliteCheckpointer.open(str(path))
    with pytest.raises(ReplayUnavailable):  # the sweep dropped the events before the oldest checkpoint kept
        reopened.events_after("t0", 0, 10)
    reopened.close()
    result = CliRunner().invoke(cli, ["--store", url, "--json", "stats", "--rounds", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {row["op"]: row for row in json.loads(result.stdout)["operations"]}
    assert rows["events_after"]["calls"] == 2  # one per thread: the floor's lookup is not metered
    assert all(row["errors"] == 0 for row in rows.values()), rows
    table = CliRunner().invoke(cli, ["--store", url, "stats", "--rounds", "1"], catch_exceptions=False)
    assert "ReplayUnavailable" not in table.stdout and "errors" in table.stdout
