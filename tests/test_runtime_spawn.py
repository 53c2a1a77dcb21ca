"""``ctx.spawn`` across a parent's crash (DESIGN §5): a parent whose process died while its child ran is recovered
in another process, and its re-executed node's ``spawn`` recovers the child (waiting out the dead process's claim)
or returns the child's outcome when the child had completed, without running a child node or effect twice.

The crashes are real: one worker process on a real SQLite file runs several parents at once, each stopped at the
point its scenario needs, and is SIGKILLed; each test then recovers one of those parents in this process.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    CancelledError,
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimPolicy,
    ClaimRequest,
    Commit,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    InvalidRunState,
    ManualClock,
    StaleClaim,
    Step,
    ThreadBusy,
)

WAIT = timedelta(seconds=20)

GRAPH_MODULE = textwrap.dedent(
    """
    import os, sys, time
    from threadloom import Graph, Step

    LOG = os.environ["SPAWN_LOG"]

    def note(line):
        with open(LOG, "a") as handle:
            handle.write(line + "\\n")

    def hang(ctx, mode, state):
        # Only in the doomed worker: stop here until it is killed.
        if os.environ.get("SPAWN_DOOMED") == "1" and state["mode"] == mode:
            # one write(2) per line: several nodes reach here at once, and print() writes the line and its
            # newline apart, so two READY lines could run together
            os.write(2, ("READY " + ctx.thread_id + "\\n").encode())
            time.sleep(60)

    def search(state, ctx):
        note("search " + ctx.thread_id + " " + ctx.run_id)
        hits = ctx.effect("search", lambda: note("effect " + ctx.thread_id + " " + ctx.run_id) or "hits")
        return Step.to("summarize", {**state, "hits": hits})

    def summarize(state, ctx):
        note("summarize " + ctx.thread_id + " " + ctx.run_id)
        hang(ctx, "child", state)
        return Step.end({**state, "findings": "findings on " + state["q"]})

    CHILD = Graph("research", {"search": search, "summarize": summarize}, entry="search")

    def delegate(state, ctx):
        note("delegate " + ctx.thread_id + " " + ctx.run_id)
        child_input = {"q": ctx.thread_id, "mode": state["mode"]}
        found = ctx.effect("child", lambda: ctx.spawn(ctx.thread_id + ".child", CHILD, child_input).wait().state)
        hang(ctx, "after", state)
        return Step.end({**state, "child": found})

    PARENT = Graph("parent", {"delegate": delegate}, entry="delegate")
    """
)

SCENARIOS = {
    "p-child": "child",  # killed while the child runs (after its effect committed)
    "p-ghost": "child",  # the same; then a claim nobody renews holds the child when the parent recovers
    "p-giveup": "child",  # the same, with a claim on the child that outlives the runtime's patience
    "p-close": "child",  # the same, and the runtime closes while the spawn waits
    "p-after": "after",  # killed after the child completed, before the parent's step committed
}

WORKER = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    sys.path.insert(0, sys.argv[2])
    from spawn_graph import PARENT
    from threadloom import ClaimPolicy, GraphRuntime, SqliteCheckpointer

    store = SqliteCheckpointer.open(sys.argv[1])
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    runtime = GraphRuntime(store, node_id="doomed", claim_policy=policy)
    for pair in sys.argv[3:]:
        thread_id, mode = pair.split("=")
        runtime.start(thread_id, PARENT, {"mode": mode}, tenant_id="acme")
    time.sleep(60)
    """
)


def _load(path):
    spec = importlib.util.spec_from_file_location("spawn_graph", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Crashed:
    """What the killed worker left: the SQLite file, the call log and the graphs."""

    def __init__(self, db: str, log, module) -> None:
        self.db, self.log, self.parent, self.child = db, log, module.PARENT, module.CHILD

    def calls(self, thread_id: str) -> list[str]:
        """``"<what> <runtime node id>"`` per line the graph noted for ``thread_id``, in order."""
        out = []
        for line in self.log.read_text().splitlines():
            what, thread, run_id = line.split()
            if thread == thread_id:
                out.append(f"{what} {run_id.split(':')[0]}")
        return out


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("needs SIGKILL")
    folder = tmp_path_factory.mktemp("spawn")
    (folder / "spawn_graph.py").write_text(GRAPH_MODULE)
    log = folder / "calls.log"
    db = str(folder / "spawn.db")
    env = {**os.environ, "SPAWN_LOG": str(log), "SPAWN_DOOMED": "1"}
    pairs = [f"{thread_id}={mode}" for thread_id, mode in SCENARIOS.items()]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, db, str(folder), *pairs],
        env=env,
        stdout=subprocess.DEVNULL,  # unconfigured structlog prints its lines there
        stderr=subprocess.PIPE,  # the READY lines, never interleaved with a log line
        text=True,
    )
    expected = {f"{t}.child" if mode == "child" else t for t, mode in SCENARIOS.items()}
    try:
        ready: set[str] = set()
        for line in worker.stderr:
            if line.startswith("READY "):
                ready.add(line.split()[1])
                if ready == expected:
                    break
        else:
            pytest.fail(f"the worker ended before every scenario was reached: {sorted(ready)}")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.stderr.close()
    old = os.environ.get("SPAWN_LOG")
    os.environ["SPAWN_LOG"] = str(log)
    try:
        yield Crashed(db, log, _load(folder / "spawn_graph.py"))
    finally:
        if old is None:
            os.environ.pop("SPAWN_LOG", None)
        else:
            os.environ["SPAWN_LOG"] = old


@pytest.fixture
def store(crashed):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    store = SqliteCheckpointer.open(crashed.db)
    yield store
    store.close()


def _recover(runtime: GraphRuntime, thread_id: str, graph: Graph):
    """Recovers ``thread_id``, waiting (bounded) for the dead worker's claim on it to expire."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return runtime.recover(thread_id, graph, tenant_id="acme")
        except ThreadBusy as busy:
            assert str(busy.holder).startswith("held by run 'doomed:")
            assert time.monotonic() < deadline
            time.sleep(0.05)


def _claim_when_free(store, thread_id: str, holder: str, ttl: timedelta):
    """Claims ``thread_id`` for ``holder`` once the dead worker's claim expired: a claim nobody will renew."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return store.claim(thread_id, ClaimRequest(holder=holder, ttl=ttl, tenant_id="acme"))
        except ThreadBusy:
            assert time.monotonic() < deadline
            time.sleep(0.02)


def _assert_left_running(store, thread_id: str) -> None:
    parent, child = store.latest(thread_id).checkpoint, store.latest(f"{thread_id}.child").checkpoint
    assert parent.status is CheckpointStatus.RUNNING and parent.run_id.startswith("doomed:")
    assert child.status is CheckpointStatus.RUNNING and child.run_id.startswith("doomed:")
    assert child.origin.parent_thread == thread_id


def test_a_parent_killed_while_its_child_runs_recovers_and_the_child_completes_once(crashed, store):
    _assert_left_running(store, "p-child")
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
        outcome = _recover(runtime, "p-child", crashed.parent).wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED
    assert outcome.state == {
        "mode": "child",
        "child": {"q": "p-child", "mode": "child", "hits": "hits", "findings": "findings on p-child"},
    }
    child = store.latest("p-child.child").checkpoint
    assert child.status is CheckpointStatus.COMPLETED and child.run_id.startswith("rescuer:")
    assert child.origin.parent_thread == "p-child"
    assert store.children("p-child", limit=10) == ["p-child.child"]
    # The child's committed node and its effect ran once; only the node the kill interrupted ran again.
    assert crashed.calls("p-child.child") == [
        "search doomed",
        "effect doomed",
        "summarize doomed",
        "summarize rescuer",
    ]
    assert crashed.calls("p-child") == ["delegate doomed", "delegate rescuer"]


def test_spawn_waits_out_a_claim_nobody_renews_on_the_child_then_recovers_it(crashed, store):
    _assert_left_running(store, "p-ghost")
    ghost = _claim_when_free(store, "p-ghost.child", "dead:run-ghost", timedelta(milliseconds=1500))
    policy = ClaimPolicy(ttl=timedelta(seconds=4), renew_every=timedelta(seconds=1))
    with capture_logs() as logs:
        with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
            outcome = _recover(runtime, "p-ghost", crashed.parent).wait(WAIT)
    assert outcome.state["child"]["findings"] == "findings on p-ghost"
    busy = [e for e in logs if e["event"] == "claim.busy" and e["thread_id"] == "p-ghost.child"]
    assert busy and all(e["holder"] == "held by run 'dead:run-ghost'" for e in busy)
    child = store.latest("p-ghost.child").checkpoint
    assert child.status is CheckpointStatus.COMPLETED and child.run_id.startswith("rescuer:")
    taken = [e for e in logs if e["event"] == "claim.taken_over" and e["thread_id"] == "p-ghost.child"]
    assert [e["taken_over_from"] for e in taken] == ["dead:run-ghost"] and taken[0]["token"] > ghost.token
    assert crashed.calls("p-ghost.child").count("effect doomed") == 1
    assert [c for c in crashed.calls("p-ghost.child") if c.startswith("effect")] == ["effect doomed"]


def test_spawn_gives_up_once_the_childs_claim_outlives_the_claim_ttl_leaving_the_parent_recoverable(crashed, store):
    _assert_left_running(store, "p-giveup")
    _claim_when_free(store, "p-giveup.child", "dead:run-forever", timedelta(hours=1))
    before = store.latest("p-giveup").checkpoint.id
    policy = ClaimPolicy(ttl=timedelta(milliseconds=500), renew_every=timedelta(milliseconds=100))
    with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
        handle = _recover(runtime, "p-giveup", crashed.parent)
        with pytest.raises(ThreadBusy) as busy:
            handle.wait(WAIT)
    assert busy.value.thread_id == "p-giveup.child"
    # A child held by another run is no failure of the parent's logic: nothing was committed for the step, the
    # parent stays incomplete (RUNNING) and its claim was released, so a later recovery runs the node again.
    latest = store.latest("p-giveup").checkpoint
    assert latest.status is CheckpointStatus.RUNNING and latest.id == before
    assert store.claim("p-giveup", ClaimRequest(holder="next:run-1", ttl=timedelta(seconds=5), tenant_id="acme")).token > 0
    assert store.latest("p-giveup.child").checkpoint.run_id.startswith("doomed:")  # nothing written to the child


def test_closing_the_runtime_ends_a_spawn_waiting_for_the_childs_claim_without_failing_the_parent(crashed, store):
    _assert_left_running(store, "p-close")
    _claim_when_free(store, "p-close.child", "dead:run-forever", timedelta(hours=1))
    policy = ClaimPolicy(ttl=timedelta(seconds=30), renew_every=timedelta(seconds=10))
    with capture_logs() as logs:
        runtime = GraphRuntime(store, node_id="rescuer", claim_policy=policy)
        try:
            handle = _recover(runtime, "p-close", crashed.parent)
            deadline = time.monotonic() + 10
            while not any(e["event"] == "claim.busy" and e["thread_id"] == "p-close.child" for e in list(logs)):
                assert time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            runtime.close()
    with pytest.raises(CancelledError):
        handle.wait(timedelta(seconds=1))
    assert store.latest("p-close").checkpoint.status is CheckpointStatus.RUNNING  # recoverable, not FAILED
    assert store.latest("p-close.child").checkpoint.run_id.startswith("doomed:")


def test_a_child_that_completed_before_the_parent_died_is_not_run_again(crashed, store):
    child_before = store.latest("p-after.child").checkpoint
    assert child_before.status is CheckpointStatus.COMPLETED and child_before.run_id.startswith("doomed:")
    assert store.latest("p-after").checkpoint.status is CheckpointStatus.RUNNING
    history_before = [cp.id for cp in store.history("p-after.child", limit=50)]
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
        outcome = _recover(runtime, "p-after", crashed.parent).wait(WAIT)
    assert outcome.state["child"] == child_before.state
    assert outcome.state["child"]["findings"] == "findings on p-after"
    assert [cp.id for cp in store.history("p-after.child", limit=50)] == history_before
    assert crashed.calls("p-after.child") == ["search doomed", "effect doomed", "summarize doomed"]
    assert crashed.calls("p-after") == ["delegate doomed", "delegate rescuer"]


# -- in one process: what spawn still refuses -------------------------------------------------------------------------


def _leave_running(store, thread_id: str, origin: CheckpointOrigin | None) -> None:
    """A RUNNING child left by some run (its claim released): not this step's."""
    from datetime import UTC, datetime

    claim = store.claim(thread_id, ClaimRequest(holder="other:run-1", ttl=timedelta(seconds=5), tenant_id="acme"))
    checkpoint = Checkpoint(
        id="other:run-1:0",
        parent=None,
        thread_id=thread_id,
        run_id="other:run-1",
        status=CheckpointStatus.RUNNING,
        created_at=datetime.now(UTC),
        state={},
        graph_id="leaf",
        tenant_id="acme",
        origin=origin,
        metadata={"threadloom.next": "x"},
    )
    store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint))
    store.release(thread_id, claim.token)


@pytest.mark.parametrize(
    "origin",
    [
        None,
        CheckpointOrigin(parent_thread="elsewhere", parent_checkpoint="elsewhere:0", task_id="1:p"),
        CheckpointOrigin(parent_thread="parent", parent_checkpoint="an-earlier-step", task_id="1:p"),
    ],
    ids=["no-origin", "another-parent", "another-step"],
)
def test_spawn_still_refuses_a_running_thread_another_parent_or_step_left(origin):
    store = InMemoryCheckpointer()
    _leave_running(store, "kid", origin)
    leaf = Graph("leaf", {"x": lambda state, ctx: Step.end({**state, "ran": True})}, entry="x")
    refused: list[BaseException] = []

    def parent(state, ctx):
        try:
            ctx.spawn("kid", leaf, {})
        except InvalidRunState as error:
            refused.append(error)
        return Step.end(state)

    try:
        with GraphRuntime(store, node_id="n1") as runtime:
            runtime.start("parent", Graph("p", {"p": parent}, entry="p"), {}, tenant_id="acme").wait(WAIT)
        assert len(refused) == 1 and "recover it first" in str(refused[0])
        assert store.latest("kid").checkpoint.id == "other:run-1:0"
    finally:
        store.close()


def test_a_brand_new_child_is_still_started_with_this_steps_origin():
    store = InMemoryCheckpointer()
    leaf = Graph("leaf", {"x": lambda state, ctx: Step.end({**state, "ran": True})}, entry="x")
    seen = threading.Event()

    def parent(state, ctx):
        out = ctx.spawn("kid", leaf, {"a": 1}).wait(WAIT)
        seen.set()
        return Step.end({"kid": out.state})

    try:
        with GraphRuntime(store, node_id="n1") as runtime:
            outcome = runtime.start("parent", Graph("p", {"p": parent}, entry="p"), {}, tenant_id="acme").wait(WAIT)
        assert seen.is_set() and outcome.state == {"kid": {"a": 1, "ran": True}}
        kid = store.latest("kid").checkpoint
        assert kid.origin == CheckpointOrigin(
            parent_thread="parent", parent_checkpoint=store.latest("parent").checkpoint.parent, task_id="1:p"
        )
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("how", ["taken-over", "deleted"])
def test_a_parent_that_lost_its_thread_cannot_start_a_child(how, kind, tmp_path):
    """The child's first commit is fenced by the parent run's claim: a parent run that lost its thread (taken over,
    or deleted and begun again by another run) leaves no child behind for its successor (found by the simulation:
    the successor's spawn of the same child was refused InvalidRunState and its run FAILED)."""
    store_clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    if kind == "memory":
        store = InMemoryCheckpointer(clock=store_clock)
    else:
        from threadloom.persistence.sqlite.store import SqliteCheckpointer

        store = SqliteCheckpointer.open(str(tmp_path / "fence.db"), clock=store_clock)
    leaf = Graph("leaf", {"x": lambda state, ctx: Step.end({**state, "ran": True})}, entry="x")
    lost = threading.Event()
    at_spawn = threading.Event()
    refused: list[BaseException] = []

    def parent(state, ctx):
        at_spawn.set()
        assert lost.wait(20)
        try:
            ctx.spawn("kid", leaf, {})
        except BaseException as error:
            refused.append(error)
            raise
        return Step.end(state)

    policy = ClaimPolicy(ttl=timedelta(seconds=30), renew_every=timedelta(seconds=20))
    try:
        with GraphRuntime(store, node_id="n1", claim_policy=policy) as runtime:
            handle = runtime.start("parent", Graph("p", {"p": parent}, entry="p"), {}, tenant_id="acme")
            assert at_spawn.wait(20)
            store_clock.advance(timedelta(seconds=31))  # the run's claim expired, by the store's clock
            thief = store.claim("parent", ClaimRequest(holder="n2:run-1", ttl=timedelta(seconds=30), tenant_id="acme"))
            if how == "deleted":
                store.delete_thread("parent", thief.token)
            lost.set()
            with pytest.raises(StaleClaim):
                handle.wait(WAIT)
        assert len(refused) == 1 and isinstance(refused[0], StaleClaim) and refused[0].thread_id == "parent"
        assert store.latest("kid") is None and store.events_after("kid", 0, 10) == []
        assert store.claim("kid", ClaimRequest(holder="n3:run-1", ttl=timedelta(seconds=30))).token > thief.token
        if how == "taken-over":
            assert store.latest("parent").checkpoint.status is CheckpointStatus.RUNNING  # no FAILED: recoverable
    finally:
        store.close()
