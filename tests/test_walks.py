"""Access walks with real stores: walker actors, leases, claim rules, pace reports, restarts (README "Access walks").

Memory and SQLite; PostgreSQL for the takeover of a paused walker. Short intervals and lease ttls keep each test to
a few seconds. Some tests drive a :class:`Walker` step by step (``Walker.step``) instead of through its timer, so
a pause or a stop lands exactly where the test wants it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from threadloom.actors.policies import ClaimPolicy
from threadloom.actors.runs import RunEnv
from threadloom.actors.runtime import GraphRuntime
from threadloom.actors.scheduler import RandomIds, ThreadScheduler
from threadloom.actors.walker import REPORT_EVERY, WALK_ROWS, WALK_THREADS, Walker, WalkSeen
from threadloom.domain.access import (
    WALK_GRAPH_ID,
    AccessAttribute,
    AccessSchema,
    AccessSchemas,
    AccessStampOptions,
    WalkRecord,
    walk_thread_id,
)
from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import StaleClaim
from threadloom.domain.pace import WalkPaceReport
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit, SweepPolicy
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.persistence.memory import InMemoryCheckpointer
from threadloom.persistence.metrics.meter import InMemoryMeter
from threadloom.persistence.sqlite import SqliteCheckpointer

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRAPH = "g"
REGION = AccessAttribute("region", "metadata", "region")
TEAM = AccessAttribute("team", "state", "/team")
OLD = AccessSchemas([AccessSchema(GRAPH, (REGION,))])
NEW = AccessSchemas([AccessSchema(GRAPH, (REGION, TEAM))])
FAST = AccessStampOptions(interval=timedelta(milliseconds=200), walk_batch=5, walk_share=1.0, walk_rate=1000.0)
LEASE = ClaimPolicy(ttl=timedelta(seconds=1.5))
WALK = walk_thread_id("threadloom", GRAPH)


def fill(store: Any, count: int, graph_id: str = GRAPH, prefix: str = "t") -> list[str]:
    """``count`` threads of ``graph_id``, two commits each: the first with region ``eu``, the latest ``us`` - so
    the first commit's rows carry attributes the thread no longer has (and rows of an older schema, if the store
    that wrote them declared another)."""
    ids = [f"{prefix}{index:03d}" for index in range(count)]
    for thread_id in ids:
        claim = store.claim(thread_id, ClaimRequest(holder="writer", ttl=timedelta(seconds=30), tenant_id="acme"))
        parent = None
        for step, region in enumerate(("eu", "us")):
            checkpoint = Checkpoint(
                id=f"{thread_id}-{step}",
                parent=parent,
                thread_id=thread_id,
                run_id="writer",
                status=CheckpointStatus.RUNNING,
                created_at=T0,
                state={"team": "blue", "step": step},
                graph_id=graph_id,
                tenant_id="acme",
                metadata={"region": region},
            )
            store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint))
            parent = checkpoint.id
        store.release(thread_id, claim.token)
    return ids


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def completed(runtime: GraphRuntime, schema: str) -> WalkRecord | None:
    record = runtime.walks().get(GRAPH)
    return record if record is not None and record.completed and record.schema == schema else None


def assert_all_current(store: Any, ids: list[str]) -> None:
    """Every row of every thread carries the current stamp: stamping again changes nothing."""
    assert [store.stamp_thread(thread_id) for thread_id in ids] == [0] * len(ids)


def runtime(store: Any, node_id: str, **kwargs: Any) -> GraphRuntime:
    return GraphRuntime(store, node_id=node_id, claim_policy=LEASE, access_options=FAST, **kwargs)


def sqlite_pair(tmp_path: Any, old: AccessSchemas | None, new: AccessSchemas) -> tuple[Any, Any]:
    path = tmp_path / "walks.db"
    first = SqliteCheckpointer.open(path) if old is None else SqliteCheckpointer.open(path, access=old)
    return first, SqliteCheckpointer.open(path, access=new)


# -- a full walk ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_full_walk_stamps_every_row(kind: str, tmp_path: Any) -> None:
    if kind == "memory":
        writer = store = InMemoryCheckpointer(access=NEW)
    else:
        writer, store = sqlite_pair(tmp_path, None, NEW)  # rows written by a node that declared nothing
    ids = fill(writer, 12)
    others = fill(writer, 3, graph_id="h", prefix="h")  # a kind this node did not declare: not walked
    meter = InMemoryMeter()
    with runtime(store, "n1", meter=meter) as rt:
        schema = NEW.for_graph(GRAPH).hash
        record = wait_for(lambda: completed(rt, schema), what="the walk to complete")
        assert record.count == 12 and record.cursor == ids[-1]
        assert record.heads >= 1
        share = rt.share(GRAPH)
        assert share is not None and 0 < share <= 1.0
        assert rt.share("h") is None and "h" not in rt.walks()
        assert store.current_claim(WALK) is None  # a completed walk releases its lease
    assert_all_current(store, ids)
    snapshot = meter.snapshot()
    assert snapshot.counter(WALK_THREADS, graph_id=GRAPH) == 12
    assert snapshot.counter(WALK_ROWS, graph_id=GRAPH) > 0
    assert store.stamp_thread(others[0]) >= 0  # the undeclared kind is left to its own schema (and the follower)
    for opened in {id(writer): writer, id(store): store}.values():
        opened.close()


def test_a_completed_walk_of_this_schema_is_not_read_again(tmp_path: Any) -> None:
    store = InMemoryCheckpointer(access=NEW)
    fill(store, 3)
    with runtime(store, "n1") as rt:
        wait_for(lambda: completed(rt, NEW.for_graph(GRAPH).hash), what="the walk")
    stored = store.latest(WALK)
    assert stored is not None
    with capture_logs() as logs, runtime(store, "n2") as rt:
        wait_for(lambda: completed(rt, NEW.for_graph(GRAPH).hash), what="the record read")
        time.sleep(0.5)
    assert store.latest(WALK).checkpoint.id == stored.checkpoint.id  # nothing claimed or committed again
    assert not [line for line in logs if line["event"] in ("access.walk_started", "access.walk_resumed")]
    store.close()


def test_a_kind_with_no_stored_thread_is_not_claimed() -> None:
    store = InMemoryCheckpointer(access=NEW)
    with runtime(store, "n1") as rt:
        time.sleep(0.6)
        assert rt.walks() == {} and rt.share(GRAPH) is None
        assert store.latest(WALK) is None and store.current_claim(WALK) is None
        fill(store, 2)  # the first thread: the walk is claimed by the next attempt
        wait_for(lambda: completed(rt, NEW.for_graph(GRAPH).hash), what="the walk")
    store.close()


# -- a rolling deployment -------------------------------------------------------------------------------------


def test_rolling_deployment_starts_the_new_walk_once_the_old_schema_has_no_member(tmp_path: Any) -> None:
    old_store, new_store = sqlite_pair(tmp_path, OLD, NEW)
    ids = fill(old_store, 8)
    old_hash, new_hash = OLD.for_graph(GRAPH).hash, NEW.for_graph(GRAPH).hash
    old_rt = runtime(old_store, "old")
    wait_for(lambda: completed(old_rt, old_hash), what="the old walk")
    with capture_logs() as logs:
        new_rt = runtime(new_store, "new")
        # the old node is alive: the new one reads the old schema's record and waits
        wait_for(lambda: new_rt.walks().get(GRAPH), what="the new node to read the record")
        time.sleep(1.0)
        assert new_rt.walks()[GRAPH].schema == old_hash
        assert WalkRecord.from_state(WALK, new_store.latest(WALK).checkpoint.state).schema == old_hash
        old_rt.close()  # the old node stops; its membership expires a lease ttl after its last heartbeat
        stopped = time.monotonic()
        record = wait_for(lambda: completed(new_rt, new_hash), what="the new walk")
        waited = time.monotonic() - stopped
        new_rt.close()
    assert record.count == 8
    started = [line for line in logs if line["event"] == "access.walk_started"]
    assert len(started) == 1 and started[0]["replaced"] == old_hash
    assert waited > 0  # (the wait is the old membership's expiry; its length is not asserted)
    assert_all_current(new_store, ids)
    old_store.close()
    new_store.close()


# -- walkers driven step by step ------------------------------------------------------------------------------


def env(store: Any, clock: Any, node_id: str) -> RunEnv:
    return RunEnv(
        store=store,
        clock=clock,
        scheduler=ThreadScheduler(clock),
        ids=RandomIds(),
        claim_policy=LEASE,
        node_id=node_id,
        start_child=lambda *_args: None,  # type: ignore[arg-type,return-value]
    )


def walker(store: Any, clock: Any, node_id: str, told: list[Any], incarnation: int = 1) -> Walker:
    return Walker(env(store, clock, node_id), NEW.for_graph(GRAPH), FAST, "threadloom", told.append, None, incarnation)


def run_steps(w: Walker, clock: ManualClock, until: Callable[[], bool], limit: int = 500) -> None:
    """Steps ``w`` until ``until()`` or it has no next step, moving the clock by each step's delay."""
    for _ in range(limit):
        if until():
            return
        delay = w.step()
        if delay is None:
            return
        clock.advance(timedelta(seconds=delay))
    raise AssertionError("the walker did not get there")


def test_a_walker_reports_after_each_page_and_between_pages_at_most_every_tenth_of_a_second() -> None:
    clock = ManualClock(T0)
    store = InMemoryCheckpointer(clock, access=NEW)
    ids = fill(store, 12)
    told: list[Any] = []
    run_steps(walker(store, clock, "a", told), clock, lambda: False)  # a thread a millisecond: pages of 5
    reports = [m for m in told if isinstance(m, WalkPaceReport)]
    assert [r.cursor for r in reports if r.cursor is not None] == [ids[4], ids[9], ids[11], ids[11]]  # + done
    assert len(reports) == 5 and reports[0].cursor is None and reports[-1].completed  # claimed, pages, done

    slow_clock = ManualClock(T0)
    slow = InMemoryCheckpointer(slow_clock, access=NEW)
    fill(slow, 12)
    told = []
    w = walker(slow, slow_clock, "a", told)
    while (delay := w.step()) is not None:  # a tenth of a second between threads: a report after each
        slow_clock.advance(timedelta(seconds=delay) + REPORT_EVERY)
    assert len([m for m in told if isinstance(m, WalkPaceReport)]) == 1 + 12 + 1
    store.close()
    slow.close()


def test_a_deposed_walker_stamps_nothing() -> None:
    clock = ManualClock(T0)
    store = InMemoryCheckpointer(clock, access=NEW)
    ids = fill(store, 6)
    told_a: list[Any] = []
    a = walker(store, clock, "a", told_a)
    assert a.step() == 0.0  # claimed
    old_token = a._token  # noqa: SLF001
    a.step()  # the first page read, its first thread stamped
    assert a._page and a._page[0] == ids[1]  # noqa: SLF001 - where the pause lands
    clock.advance(LEASE.ttl + timedelta(seconds=1))  # paused past its lease
    told_b: list[Any] = []
    b = walker(store, clock, "b", told_b)
    assert b.step() == 0.0  # takes the lease over
    with capture_logs() as logs:
        a.step()  # wakes up and tries the next thread: fenced
    assert [line["event"] for line in logs] == ["access.deposed"]
    assert "StaleClaim" in logs[0]["error"]
    assert a._token is None  # noqa: SLF001
    with pytest.raises(StaleClaim):  # the store refuses the old lease for every stamp
        store.stamp_thread(ids[2], fence=(WALK, old_token))
    assert store.stamp_thread(ids[1]) > 0  # the deposed walker stamped nothing: the thread was still stale
    run_steps(b, clock, lambda: False)
    record = WalkRecord.from_state(WALK, store.latest(WALK).checkpoint.state)
    assert record.completed and record.count == 6
    store.close()


def test_a_walker_stopped_mid_walk_is_resumed_at_the_recorded_cursor(tmp_path: Any) -> None:
    writer, store = sqlite_pair(tmp_path, None, NEW)
    ids = fill(writer, 12)
    clock = ManualClock(T0)
    told: list[Any] = []
    first = walker(store, clock, "a", told)

    def recorded() -> WalkRecord | None:
        latest = store.latest(WALK)
        return WalkRecord.from_state(WALK, latest.checkpoint.state) if latest is not None else None

    run_steps(first, clock, lambda: (r := recorded()) is not None and r.cursor == ids[4])
    clock.advance(timedelta(seconds=1))
    first.step()  # one thread of the second page stamped, not recorded
    assert recorded().cursor == ids[4] and recorded().count == 5
    first.on_stop()  # stopped: releases its lease
    assert store.current_claim(WALK) is None
    second = walker(store, clock, "b", told)
    with capture_logs() as logs:
        assert second.step() == 0.0
    resumed = [line for line in logs if line["event"] == "access.walk_resumed"]
    assert resumed and resumed[0]["cursor"] == ids[4] and resumed[0]["count"] == 5
    run_steps(second, clock, lambda: False)
    final = recorded()
    assert final.completed and final.count == 12 and final.cursor == ids[-1]
    cursors = [m.record.cursor or "" for m in told if isinstance(m, WalkSeen)]
    assert cursors == sorted(cursors)  # the cursor never moved back
    assert any(isinstance(m, WalkPaceReport) and m.graph_id == GRAPH for m in told)
    assert_all_current(store, ids)
    writer.close()
    store.close()


# -- failures -------------------------------------------------------------------------------------------------


def test_a_walk_record_that_does_not_decode_is_logged_and_the_supervisor_keeps_running() -> None:
    store = InMemoryCheckpointer(access=NEW)
    fill(store, 3)
    claim = store.claim(WALK, ClaimRequest(holder="vandal", ttl=timedelta(seconds=30)))
    bad = Checkpoint(
        id="bad",
        parent=None,
        thread_id=WALK,
        run_id="vandal",
        status=CheckpointStatus.RUNNING,
        created_at=T0,
        state={"graph_id": GRAPH, "heads": "many"},
        graph_id=WALK_GRAPH_ID,
    )
    store.commit(WALK, Commit(token=claim.token, checkpoint=bad))
    store.release(WALK, claim.token)
    with capture_logs() as logs, runtime(store, "n1") as rt:
        failed = wait_for(
            lambda: [line for line in logs if line["event"] == "access.walk_failed"], what="access.walk_failed"
        )
        assert "ProcessingError" in failed[0]["error"] and WALK in failed[0]["error"]
        assert rt.walks() == {} and rt.share(GRAPH) is None
        assert rt.sweep(SweepPolicy())  # the supervisor still answers
    assert store.latest(WALK).checkpoint.id == "bad"  # nothing written over it
    store.close()


class CrashOnce(ForwardingCheckpointer):
    """A store whose first ``stamp_thread`` raises an unexpected error (a bug in the walker's path)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.crashes = 0

    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        if self.crashes == 0:
            self.crashes += 1
            raise RuntimeError("boom")
        return super().stamp_thread(thread_id, fence=fence)


def test_a_crashed_walker_is_restarted_through_its_lease() -> None:
    inner = InMemoryCheckpointer(access=NEW)
    ids = fill(inner, 7)
    store = CrashOnce(inner)
    with capture_logs() as logs, runtime(store, "n1") as rt:
        record = wait_for(lambda: completed(rt, NEW.for_graph(GRAPH).hash), what="the walk")
    events = [line["event"] for line in logs]
    assert "access.walker_crashed" in events and "access.walker_restarted" in events
    assert store.crashes == 1 and record.count == 7
    # the crashed walker's lease was left to expire: the new walker took it over, it did not start blindly
    resumed = [line for line in logs if line["event"] in ("access.walk_resumed", "access.walk_started")]
    assert resumed and resumed[-1]["event"] == "access.walk_resumed"
    assert_all_current(inner, ids)
    inner.close()


# -- PostgreSQL: a paused walker taken over --------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_takeover_of_a_paused_walker() -> None:
    from threadloom.persistence.postgres.store import PostgresCheckpointer
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        writer = harness.open_pg()
        ids = fill(writer, 8)
        first = PostgresCheckpointer.open(harness.dsn, harness.config(), access=NEW)
        second = PostgresCheckpointer.open(harness.dsn, harness.config(), access=NEW)
        clock = ManualClock(T0)  # the lease expires by the database's clock; this one only paces
        told: list[Any] = []
        a = walker(first, clock, "a", told)
        assert a.step() == 0.0
        a.step()
        stalled = a._page[0]  # noqa: SLF001
        time.sleep(LEASE.ttl.total_seconds() + 0.3)  # a pauses past its lease
        clock.advance(LEASE.ttl + timedelta(seconds=0.3))
        b = walker(second, clock, "b", told, incarnation=2)
        assert b.step() == 0.0
        with capture_logs() as logs:
            a.step()
        assert [line["event"] for line in logs] == ["access.deposed"]
        assert second.stamp_thread(stalled) > 0  # a stamped nothing after it was deposed
        run_steps(b, clock, lambda: False)
        record = WalkRecord.from_state(WALK, second.latest(WALK).checkpoint.state)
        assert record.completed and record.count == 8
        assert_all_current(second, ids)
        for store in (first, second, writer):
            store.close()
    finally:
        harness.cleanup()


def test_the_readme_access_walks_example_runs_as_written(tmp_path: Any) -> None:
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Access walks\n")
    section = readme[start : readme.index("\n## ", start + 1)]
    [block] = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "{} None"
    assert (tmp_path / "agents.db").exists()


def test_a_refused_bulkhead_slot_presses_the_pace_and_the_thread_is_stamped_again() -> None:
    clock = ManualClock(T0)
    store = InMemoryCheckpointer(clock, access=NEW)
    ids = fill(store, 3)
    told: list[Any] = []
    w = walker(store, clock, "a", told)
    assert w.step() == 0.0  # claimed
    bulkhead = store.history_bulkhead
    taken = 0
    while bulkhead.try_enter():  # every slot taken by other history reads
        taken += 1
    refused = bulkhead.refused
    delay = w.step()
    assert delay is not None and delay > 0
    assert bulkhead.refused == refused + 1 and store.pressed()
    assert w._page and w._page[0] == ids[0]  # noqa: SLF001 - not stamped: read again
    for _ in range(taken):
        bulkhead.leave()
    clock.advance(timedelta(seconds=1))  # a second later the pace reads the press and halves its share
    w.step()
    reports = [m for m in told if isinstance(m, WalkPaceReport)]
    assert reports[-1].pressed and reports[-1].share == pytest.approx(FAST.walk_share / 2)
    assert w._page[0] == ids[1]  # noqa: SLF001 - the refused thread was stamped this time
    run_steps(w, clock, lambda: False)
    assert_all_current(store, ids)
    store.close()


OLD_NODE = """
import sys, time
from datetime import timedelta
from threadloom.actors.policies import ClaimPolicy
from threadloom.actors.runtime import GraphRuntime
from threadloom.domain.access import AccessAttribute, AccessSchema, AccessSchemas, AccessStampOptions
from threadloom.persistence import open_store

access = AccessSchemas([AccessSchema("g", (AccessAttribute("region", "metadata", "region"),))])
store = open_store(sys.argv[1], access=access)
slow = AccessStampOptions(interval=timedelta(milliseconds=200), walk_batch=2, walk_share=1.0, walk_rate=4.0)
rt = GraphRuntime(store, node_id="old", claim_policy=ClaimPolicy(ttl=timedelta(seconds=1.5)), access_options=slow)
while True:
    record = rt.walks().get("g")
    if record is not None and record.count > 0:
        print("walking", flush=True)
        break
    time.sleep(0.05)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_rolling_deployment_across_processes_with_the_old_node_killed_mid_walk(kind: str, tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys

    from threadloom.persistence import open_store

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'walks.db'}"
        cleanup: Callable[[], None] = lambda: None  # noqa: E731
    else:
        from threadloom.testing.postgres_harness import PgHarness

        harness = PgHarness()
        url = f"{harness.dsn}{'&' if '?' in harness.dsn else '?'}schema={harness.schema}"
        cleanup = harness.cleanup
    writer = open_store(url)
    ids = fill(writer, 30)
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_NODE, url], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert old.stdout is not None
        for line in old.stdout:  # its unconfigured log lines come first
            if line.strip() == "walking":
                break
        else:
            raise AssertionError("the old node never walked")
        store = open_store(url, access=NEW)
        old_hash, new_hash = OLD.for_graph(GRAPH).hash, NEW.for_graph(GRAPH).hash
        with runtime(store, "new") as rt:
            wait_for(lambda: rt.walks().get(GRAPH), what="the old walk's record")
            time.sleep(0.8)
            seen = rt.walks()[GRAPH]
            assert seen.schema == old_hash and not seen.completed  # the old node walks; the new one waits
            old.send_signal(signal.SIGKILL)  # killed mid-walk: its lease and membership are left to expire
            old.wait(10)
            record = wait_for(lambda: completed(rt, new_hash), what="the new walk")
        assert record.count == 30
        assert_all_current(store, ids)
        store.close()
    finally:
        if old.poll() is None:
            old.kill()
            old.wait(10)
        writer.close()
        cleanup()
