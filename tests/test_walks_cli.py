"""``threadloom walks`` against real SQLite and PostgreSQL stores walked by a real runtime."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from threadloom.actors.policies import ClaimPolicy
from threadloom.actors.runtime import GraphRuntime
from threadloom.cli.main import cli
from threadloom.domain.access import AccessAttribute, AccessSchema, AccessSchemas, AccessStampOptions
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit

pytestmark = pytest.mark.usefixtures("restore_cli_logging")

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ACCESS = AccessSchemas([AccessSchema("g", (AccessAttribute("region", "metadata", "region"),))])
HASH = ACCESS.for_graph("g").hash
FAST = AccessStampOptions(interval=timedelta(milliseconds=200), walk_batch=4, walk_share=1.0, walk_rate=1000.0)
LEASE = ClaimPolicy(ttl=timedelta(seconds=1.5))


@attrs.define
class Backend:
    url: str
    open: Callable[..., Any]


def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = tmp_path / "walks.db"
    return Backend(f"sqlite:///{path}", lambda **kw: SqliteCheckpointer.open(str(path), **kw))


def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    from threadloom.persistence.postgres.store import PostgresCheckpointer
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    request.addfinalizer(harness.cleanup)
    sep = "&" if "?" in harness.dsn else "?"
    return Backend(
        f"{harness.dsn}{sep}schema={harness.schema}",
        lambda **kw: PostgresCheckpointer.open(harness.dsn, harness.config(), **kw),
    )


@pytest.fixture(params=[_sqlite, pytest.param(_postgres, marks=pytest.mark.postgres)], ids=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    made: Backend = request.param(tmp_path, request)
    return made


def fill(store: Any, count: int) -> list[str]:
    ids = [f"t{index:03d}" for index in range(count)]
    for thread_id in ids:
        claim = store.claim(thread_id, ClaimRequest(holder="writer", ttl=timedelta(seconds=30)))
        checkpoint = Checkpoint(
            id=f"{thread_id}-0",
            parent=None,
            thread_id=thread_id,
            run_id="writer",
            status=CheckpointStatus.COMPLETED,
            created_at=T0,
            graph_id="g",
            metadata={"region": "eu"},
        )
        store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint))
        store.release(thread_id, claim.token)
    return ids


def run(backend: Backend, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", backend.url, *args], catch_exceptions=False)


def test_walks_lists_the_record_holder_and_members(backend: Backend) -> None:
    writer = backend.open()  # declares nothing: its rows carry the implicit schema's stamps
    ids = fill(writer, 10)
    store = backend.open(access=ACCESS)
    rt = GraphRuntime(store, node_id="node-1", claim_policy=LEASE, access_options=FAST)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            record = rt.walks().get("g")
            if record is not None and record.completed:
                break
            time.sleep(0.05)
        result = run(backend, "walks", "--json")
        assert result.exit_code == 0, result.output
        document = json.loads(result.output)
        assert document["group"] == "threadloom"
        [row] = document["walks"]
        assert row["graph_id"] == "g" and row["schema"] == HASH
        assert row["count"] == 10 and row["completed"] is True and row["cursor"] == ids[-1]
        assert row["heads"] >= 10
        assert row["holder"] is None and row["share"] is None  # completed: the lease was released
        assert row["members"] == [f"node-1@{HASH}"]
        table = run(backend, "walks")
        assert table.exit_code == 0 and "g" in table.output and HASH in table.output
        follow = run(backend, "walks", "--json", "--follow", "--every", "0.1")
        assert follow.exit_code == 0
        assert json.loads(follow.output.splitlines()[-1])["walks"][0]["completed"] is True
        bar = run(backend, "walks", "--follow", "--every", "0.1")
        assert bar.exit_code == 0 and "10/10" in bar.output and HASH in bar.output
        # A node of another schema of the kind (a rolling release whose walk has not started): the walk is
        # completed, but --follow goes on until no live member serves another schema (here: its membership lapses).
        other = AccessSchema("g").hash
        store.heartbeat("threadloom#access", "node-2", [f"g@{other}"], timedelta(seconds=1))
        waiting = run(backend, "walks", "--json")
        [row] = json.loads(waiting.output)["walks"]
        assert row["completed"] is True and row["waiting"] == [other]
        followed = run(backend, "walks", "--json", "--follow", "--every", "0.1")
        assert followed.exit_code == 0
        lines = [json.loads(line)["walks"][0] for line in followed.output.splitlines()]
        assert lines[0]["waiting"] == [other] and lines[-1]["waiting"] == [] and lines[-1]["completed"] is True
    finally:
        rt.close()
        store.close()
        writer.close()
    # a kind no live member serves is listed when named
    named = run(backend, "walks", "--json", "--graph", "g", "--graph", "nobody")
    rows = {row["graph_id"]: row for row in json.loads(named.output)["walks"]}
    assert rows["g"]["completed"] is True
    assert rows["nobody"] == {
        "graph_id": "nobody",
        "walk": "threadloom#access-walk/nobody",
        "schema": None,
        "heads": None,
        "cursor": None,
        "count": 0,
        "completed": False,
        "holder": None,
        "share": None,
        "members": [],
        "waiting": [],
    }


def test_walks_shows_the_live_holder_and_share_mid_walk(backend: Backend) -> None:
    writer = backend.open()
    fill(writer, 30)
    store = backend.open(access=ACCESS)
    slow = AccessStampOptions(interval=timedelta(milliseconds=200), walk_batch=2, walk_share=1.0, walk_rate=4.0)
    rt = GraphRuntime(store, node_id="node-1", claim_policy=LEASE, access_options=slow)
    try:
        deadline = time.monotonic() + 20
        row: dict[str, Any] = {}
        while time.monotonic() < deadline:
            result = run(backend, "walks", "--json")
            rows = json.loads(result.output)["walks"]
            if rows and rows[0]["holder"] is not None and rows[0]["count"] > 0:
                row = rows[0]
                break
            time.sleep(0.1)
        assert row, "no live holder seen"
        assert row["holder"].startswith("node-1/walker-") and row["completed"] is False
        # walk_share 1.0, halved for each second a slow write of this store (its first calls) pressed it
        assert 1.0 / 8 <= row["share"] <= 1.0
    finally:
        rt.close()
        store.close()
        writer.close()


def test_walks_refuses_a_bad_group(backend: Backend) -> None:
    backend.open().close()
    result = run(backend, "walks", "--group", "a#b")
    assert result.exit_code == 2
    assert "group" in result.output


def test_walks_follow_refuses_an_every_that_is_not_a_number_of_seconds(backend: Backend) -> None:
    """Found by an operator: ``--every nan`` was accepted (NaN compares false with both bounds of the range)."""
    backend.open().close()
    for every, says in (("nan", "'nan' is not a number"), ("inf", "not in the range"), ("-1", "not in the range")):
        result = run(backend, "walks", "--follow", "--graph", "g", "--every", every)
        assert result.exit_code == 2, (every, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "'--every'" in lines[0] and says in lines[0], (every, result.output)


@pytest.mark.parametrize("share", ["nan", "inf", "-3", "7", "0", "half"])
def test_walks_shows_no_share_for_a_walk_record_whose_share_is_not_one(tmp_path: Path, share: Any) -> None:
    from threadloom.actors.walker import DEFAULT_GROUP, SHARE_KEY
    from threadloom.domain.access import WalkRecord, walk_thread_id

    backend = _sqlite(tmp_path, None)  # type: ignore[arg-type]
    walk = walk_thread_id(DEFAULT_GROUP, "g")
    with backend.open(access=ACCESS) as store:
        fill(store, 1)
        claim = store.claim(walk, ClaimRequest(holder="walker", ttl=timedelta(minutes=5)))
        record = WalkRecord(graph_id="g", schema=HASH, heads=1)
        checkpoint = record.checkpoint(walk, id="w-0", parent=None, run_id="walker", created_at=T0)
        checkpoint = attrs.evolve(checkpoint, metadata={SHARE_KEY: share})
        store.commit(walk, Commit(token=claim.token, checkpoint=checkpoint))
    result = run(backend, "--json", "walks", "--graph", "g")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["walks"]
    assert row["holder"] == "walker" and row["share"] is None


def _follower(backend: Backend, tmp_path: Path, *args: str) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", backend.url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("json_output", [False, True], ids=["table", "json"])
def test_walks_follow_with_no_walk_says_so_and_ends_at_once(backend: Backend, tmp_path: Path, json_output: bool) -> None:
    """Found by a user: on a store with no walk, ``walks --follow`` printed nothing until it was killed."""
    with backend.open() as store:
        fill(store, 2)  # threads, but no node declares a schema: nothing walks, nothing waits
    plain = run(backend, *(["--json"] if json_output else []), "walks")
    follower = _follower(backend, tmp_path, *(["--json"] if json_output else []), "walks", "--follow")
    try:
        out, err = follower.communicate(timeout=60)  # a follower that never ends fails here, not forever
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert err == ""
    if json_output:  # one line, as every line of --follow --json; what plain walks prints, compact
        assert out.count("\n") == 1 and json.loads(out) == json.loads(plain.output) == {"group": "threadloom", "walks": []}
    else:
        assert out == plain.output and out.startswith("no walks: no live member serves a schema")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_walks_follow_ends_with_status_0_on_sigterm_or_ctrl_c(backend: Backend, tmp_path: Path, sig: str) -> None:
    """Found by a user: SIGTERM ended ``walks --follow`` with status 143 (``events --follow`` ends with 0)."""
    with backend.open() as store:
        fill(store, 2)
    follower = _follower(backend, tmp_path, "--json", "walks", "--follow", "--graph", "g", "--every", "0.1")
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())  # following: the walk of g has not started
        assert first["walks"][0]["graph_id"] == "g" and first["walks"][0]["completed"] is False
        follower.send_signal(getattr(signal, sig))
        assert follower.wait(timeout=60) == 0
        assert follower.stderr is not None and "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_walks_follow_keeps_following_a_kind_whose_members_stopped(backend: Backend, tmp_path: Path) -> None:
    """A kind listed once stays followed when its last member's heartbeat lapses (a rolling restart): --follow
    neither ends with "no walks" nor drops the kind while its walk has not completed."""
    with backend.open() as store:
        fill(store, 2)
        seen = threading.Event()

        def beat() -> None:  # a live member until the follower listed it, then it stops (no restart yet)
            while not seen.is_set():
                store.heartbeat("threadloom#access", "node-1", [f"g@{HASH}"], timedelta(seconds=1))
                seen.wait(0.2)

        store.heartbeat("threadloom#access", "node-1", [f"g@{HASH}"], timedelta(seconds=1))
        beating = threading.Thread(target=beat, daemon=True)
        beating.start()
        follower = _follower(backend, tmp_path, "--json", "walks", "--follow", "--every", "0.1")
        try:
            assert follower.stdout is not None
            rows = json.loads(follower.stdout.readline())["walks"]
            seen.set()
            beating.join()
            assert [row["graph_id"] for row in rows] == ["g"] and rows[0]["members"] == [f"node-1@{HASH}"]
            while rows[0]["members"]:  # until the heartbeat lapsed
                rows = json.loads(follower.stdout.readline())["walks"]
                assert [row["graph_id"] for row in rows] == ["g"]
            assert rows[0]["completed"] is False and follower.poll() is None
            follower.send_signal(signal.SIGTERM)
            assert follower.wait(timeout=60) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
