"""Child retention (README "Child retention"): when a run of a graph with a ``child_retention`` ends, the runtime
deletes the parent's older settled children, each with its descendants, every write fenced by the parent's claim.

Over memory (one store object shared by the runtimes) and SQLite (a store per runtime over one file). The fence
test runs two runtimes: the first one's run is held inside its retention while its claim on the parent expires and
the second runtime takes the parent over; the first then deletes nothing more.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    CheckpointStatus,
    ChildRetention,
    ClaimPolicy,
    ClaimRequest,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    ManualClock,
    Step,
    ThreadDeleted,
    ValidationError,
)
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.testing.harness import START

WAIT = timedelta(seconds=10)
TTL = ClaimPolicy().ttl


@pytest.fixture(params=["memory", "sqlite"])
def stores(request, tmp_path):
    """``make()`` gives a store over one storage whose clock (``make.clock``) is a ManualClock."""
    clock = ManualClock(START)
    opened: list = []
    shared = InMemoryCheckpointer(clock) if request.param == "memory" else None

    def make():
        if shared is not None:
            return shared
        from threadloom.persistence.sqlite.store import SqliteCheckpointer

        opened.append(SqliteCheckpointer.open(str(tmp_path / "children.db"), clock=clock))
        return opened[-1]

    make.clock = clock  # type: ignore[attr-defined]
    yield make
    for store in opened:
        store.close()
    if shared is not None:
        shared.close()


@pytest.fixture
def runtimes():
    made: list[GraphRuntime] = []

    def make(store, node_id: str, **options) -> GraphRuntime:
        made.append(GraphRuntime(store, node_id=node_id, **options))
        return made[-1]

    yield make
    for runtime in made:
        runtime.close()


def _child_graph() -> Graph:
    def work(state, ctx):
        if state.get("grandchild"):
            ctx.spawn(f"{ctx.thread_id}.g", _leaf(), {}).wait()
        if state.get("suspend"):
            return Step.suspend("work", {**state, "suspended": True})
        return Step.end({**state, "done": True})

    return Graph("child", {"work": work}, entry="work")


def _leaf() -> Graph:
    return Graph("leaf", {"only": lambda state, ctx: Step.end({"leaf": True})}, entry="only")


def _parent_graph(keep: int, gate: threading.Event | None = None, entered: threading.Event | None = None) -> Graph:
    """Each run spawns child ``<thread>.c<n>`` with the run's input and waits for it (``n`` None: no child)."""

    def spawn(state, ctx):
        if gate is not None and state.get("wait"):
            assert entered is not None
            entered.set()
            assert gate.wait(10), "the test never opened the gate"
        n = state.get("n")
        if n is not None:
            ctx.spawn(f"{ctx.thread_id}.c{n}", _child_graph(), dict(state.get("child", {}))).wait()
        return Step.end({"n": n})

    return Graph("parent", {"spawn": spawn}, entry="spawn", child_retention=ChildRetention(keep=keep))


def _gone(store, thread_id: str) -> bool:
    if store.latest(thread_id) is not None:
        return False
    try:
        store.events_after(thread_id, 1, 1)  # inside the deleted log (every run numbers events)
    except ThreadDeleted:
        return True  # a tombstone: the thread was there and was deleted
    return False


def test_a_parents_run_end_keeps_its_newest_children_and_deletes_the_older_settled_ones(stores, runtimes):
    store = stores()
    runtime = runtimes(store, "A")
    graph = _parent_graph(keep=2)
    with capture_logs() as logs:
        for n in range(1, 5):
            outcome = runtime.start("p", graph, {"n": n}).wait(WAIT)
            assert outcome.status is CheckpointStatus.COMPLETED
    assert store.children("p", limit=10) == ["p.c3", "p.c4"]
    assert _gone(store, "p.c1") and _gone(store, "p.c2")
    deleted = [e for e in logs if e["event"] == "retention.deleted"]
    assert [e["child"] for e in deleted] == ["p.c1", "p.c2"]
    assert all(e["thread_id"] == "p" and e["token"] is not None for e in deleted)
    # Each delete was fenced by the parent's claim: the run's own token, granted before the child's claim.
    assert store.latest("p").checkpoint.status is CheckpointStatus.COMPLETED
    claim = store.claim("p", ClaimRequest(holder="check", ttl=TTL))  # the parent's claim was released after
    store.release("p", claim.token)


def test_incomplete_suspended_and_busy_children_are_kept_and_a_deleted_child_takes_its_descendants(
    stores, runtimes
):
    store = stores()
    runtime = runtimes(store, "A")
    graph = _parent_graph(keep=0)
    runtime.start("p", graph, {"n": 1, "child": {"grandchild": True}}).wait(WAIT)  # p.c1 and p.c1.g
    assert _gone(store, "p.c1") and _gone(store, "p.c1.g")  # keep=0: the run's own child went at its end
    runtime.start("p", graph, {"n": 2, "child": {"suspend": True}}).wait(WAIT)  # p.c2 SUSPENDED: kept
    runtime.start("p", graph, {"n": 3}).wait(WAIT)  # p.c3 settled: deleted
    assert store.children("p", limit=10) == ["p.c2"]
    runtime.start("p", graph, {"n": 4}).wait(WAIT)
    assert store.children("p", limit=10) == ["p.c2"]  # still SUSPENDED
    runtime.resume("p.c2", _child_graph(), {"suspend": False}).wait(WAIT)  # p.c2 COMPLETED now
    # A settled child held by a live claim is kept, and deleted by the next run's end once released.
    held = store.claim("p.c2", ClaimRequest(holder="someone", ttl=TTL))
    with capture_logs() as logs:
        runtime.start("p", graph, {"n": None}).wait(WAIT)
    assert store.children("p", limit=10) == ["p.c2"]
    assert any(e["event"] == "retention.kept" and e["reason"] == "busy" for e in logs)
    store.release("p.c2", held.token)
    runtime.start("p", graph, {"n": None}).wait(WAIT)
    assert store.children("p", limit=10) == [] and _gone(store, "p.c2")


class _HoldChildClaims(ForwardingCheckpointer):
    """Holds each claim of a child thread (an id with a ``.``) at ``gate`` once ``armed`` is set: a process
    paused inside child retention."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.gate = threading.Event()

    def claim(self, thread_id, request):
        if self.armed.is_set() and "." in thread_id:
            self.reached.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return super().claim(thread_id, request)


def test_a_parent_run_that_lost_its_claim_during_retention_deletes_no_child_of_its_successor(stores, runtimes):
    held = _HoldChildClaims(stores())
    a = runtimes(held, "A", clock=ManualClock(START))  # A's clock never moves: A never renews its claim
    b = runtimes(stores(), "B")
    gate, entered = threading.Event(), threading.Event()
    keeping = _parent_graph(keep=5, gate=gate, entered=entered)
    for n in (1, 2):
        b.start("p", keeping, {"n": n}).wait(WAIT)  # p.c1, p.c2: kept by keep=5
    assert stores().children("p", limit=10) == ["p.c1", "p.c2"]
    held.armed.set()
    with capture_logs() as logs:
        ending = a.start("p", _parent_graph(keep=0), {"n": None})  # keep=0: its end would delete p.c1 and p.c2
        assert held.reached.wait(10)  # A's run committed its end and is inside retention, before p.c1's claim
        stores.clock.advance(TTL)  # A's claim on p expires by the store's clock
        successor = b.start("p", keeping, {"n": 1, "wait": True})  # takes p over; will take p.c1 up again
        assert entered.wait(10)
        held.gate.set()  # A goes on: its fenced writes meet B's claim
        outcome = ending.wait(WAIT)
        gate.set()
        assert successor.wait(WAIT).status is CheckpointStatus.COMPLETED
    assert outcome.status is CheckpointStatus.COMPLETED  # the run's end was committed before retention began
    stopped = [e for e in logs if e["event"] == "retention.stopped" and e["run_id"] == ending.run_id]
    assert stopped and "StaleClaim" in stopped[0]["error"]
    assert not any(e["event"] == "retention.deleted" and e["run_id"] == ending.run_id for e in logs)
    assert any(e["event"] == "claim.lost" and e["run_id"] == ending.run_id and e["op"] == "retention" for e in logs)
    store = stores()
    # B's run took p.c1 up as a new turn of the settled child: the child's first turn is still there.
    assert store.children("p", limit=10) == ["p.c1", "p.c2"]
    turns = [cp for cp in store.history("p.c1", limit=10) if cp.status is CheckpointStatus.COMPLETED]
    assert len({cp.run_id for cp in turns}) == 2
    assert not _gone(store, "p.c2")
    assert not any(e["event"] == "claim.release_failed" and e["run_id"] == ending.run_id for e in logs)


def test_retention_settings_are_validated():
    with pytest.raises(ValidationError) as bad:
        ChildRetention(keep=-1)
    assert bad.value.field == "child_retention.keep"
    with pytest.raises(ValidationError) as bad:
        ChildRetention(keep=True)
    assert bad.value.field == "child_retention.keep"
    with pytest.raises(ValidationError) as bad:
        Graph("g", {"a": lambda s, c: Step.end(s)}, entry="a", child_retention=3)  # type: ignore[arg-type]
    assert bad.value.field == "child_retention"
