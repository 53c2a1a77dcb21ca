"""One GraphRuntime over one store (DESIGN §5): supersteps, effects, failures, suspend/resume, tenants, children,
cascade deletes, cancel, sweeps, logs and clean shutdown. Every test runs over memory and over SQLite."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    BusyHolder,
    CancelledError,
    CheckpointStatus,
    ClaimPolicy,
    ClaimRequest,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    InvalidRunState,
    RunFailed,
    SequentialIds,
    ServePolicy,
    Step,
    TenantMismatch,
    ThreadBusy,
    ThreadQuery,
    ThreadStatus,
    ValidationError,
    WatchPolicy,
)
from threadloom.actors import graph as g
from threadloom.actors.scheduler import ThreadScheduler

WAIT = timedelta(seconds=10)


def _memory(tmp_path):
    return InMemoryCheckpointer()


def _sqlite(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return SqliteCheckpointer.open(str(tmp_path / "runtime.db"))


@pytest.fixture(params=[_memory, _sqlite], ids=["memory", "sqlite"])
def store(request, tmp_path):
    store = request.param(tmp_path)
    yield store
    store.close()


@pytest.fixture
def runtime(store):
    runtime = GraphRuntime(store, node_id="n1", watch_policy=WatchPolicy(poll_interval=timedelta(milliseconds=50)))
    yield runtime
    runtime.close()


class Counter:
    """Counts calls per key across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def hit(self, key: str) -> int:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]


def linear_graph(counter: Counter, gate: threading.Event | None = None, graph_id: str = "linear") -> Graph:
    """a -> b -> c; b waits for ``gate`` when given; every node counts itself; a runs an effect."""

    def a(state, ctx):
        counter.hit("a")
        value = ctx.effect("charge", lambda: counter.hit("charge") * 100)
        ctx.emit("a.done", {"charged": value})
        return Step.to("b", {**state, "charged": value, "path": state.get("path", []) + ["a"]})

    def b(state, ctx):
        counter.hit("b")
        if gate is not None:
            assert gate.wait(10), "the test never opened the gate"
        return Step.to("c", {**state, "path": state["path"] + ["b"]}, events=[("b.done", None)])

    def c(state, ctx):
        counter.hit("c")
        return Step.end({**state, "path": state["path"] + ["c"]})

    return Graph(graph_id, {"a": a, "b": b, "c": c}, entry="a")


def test_a_run_commits_one_checkpoint_per_superstep_with_its_next_node(runtime, store):
    counter = Counter()
    handle = runtime.start("t1", linear_graph(counter), {"x": 1}, tenant_id="acme")
    outcome = handle.wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED
    assert outcome.state == {"x": 1, "charged": 100, "path": ["a", "b", "c"]}
    assert outcome.steps == 3 and outcome.run_id == handle.run_id
    history = list(reversed(store.history("t1", limit=10)))
    assert [cp.metadata[g.NEXT_KEY] for cp in history] == ["a", "b", "c", ""]
    assert [cp.metadata[g.NODE_KEY] for cp in history] == ["", "a", "b", "c"]
    assert [cp.status for cp in history] == [CheckpointStatus.RUNNING] * 3 + [CheckpointStatus.COMPLETED]
    assert all(cp.run_id == handle.run_id and cp.tenant_id == "acme" and cp.graph_id == "linear" for cp in history)
    assert history[0].state == {"x": 1} and history[-1].id == outcome.checkpoint_id
    assert all(cp.fencing_token == handle.token for cp in history)
    events = store.events_after("t1", 0, 100)
    assert [e.type for e in events] == [g.EVENT_RUN_STARTED, "a.done", "b.done", g.EVENT_RUN_COMPLETED]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[1].payload == {"charged": 100} and events[1].node_id == "a" and events[1].task_id == "1:a"
    assert events[1].checkpoint_id == history[1].id
    effect = store.effect("t1", g.effect_keys("t1", "charge", turn_id=handle.run_id).record)
    assert effect.result == 100 and effect.run_id == handle.run_id and effect.checkpoint_id == history[1].id
    # The claim was released: the thread can be claimed at once, and the registry says COMPLETED.
    page = runtime.threads(ThreadQuery(tenant_id="acme"))
    assert [(s.thread_id, s.status) for s in page.items] == [("t1", ThreadStatus.COMPLETED)]
    assert runtime.threads(ThreadQuery(tenant_id="other")).items == ()
    assert runtime.live_runs() == {}


def test_a_second_start_is_a_new_turn_from_the_settled_state(runtime, store):
    counter = Counter()
    graph = linear_graph(counter)
    first = runtime.start("t1", graph, {"x": 1}).wait(WAIT)
    second = runtime.start("t1", graph, {"y": 2}).wait(WAIT)
    assert second.state["x"] == 1 and second.state["y"] == 2
    assert second.state["path"] == ["a", "b", "c", "a", "b", "c"]
    assert counter.counts["charge"] == 2  # an effect key names one effect of one turn: the new turn runs it
    assert second.state["charged"] == 200
    assert store.history("t1", limit=10)[4].id == first.checkpoint_id


def test_a_failing_node_commits_failed_and_the_handle_raises_run_failed(runtime, store):
    def boom(state, ctx):
        ctx.emit("about-to-fail")
        raise RuntimeError("kaput")

    graph = Graph("failing", {"boom": boom}, entry="boom")
    handle = runtime.start("t1", graph, {"x": 1})
    with pytest.raises(RunFailed) as caught:
        handle.wait(WAIT)
    assert caught.value.node == "boom" and "kaput" in caught.value.message
    assert isinstance(caught.value.__cause__, RuntimeError)
    latest = store.latest("t1").checkpoint
    assert latest.status is CheckpointStatus.FAILED and latest.state == {"x": 1}
    assert "kaput" in latest.metadata[g.ERROR_KEY]
    assert [e.type for e in store.events_after("t1", 0, 10)][-2:] == ["about-to-fail", g.EVENT_RUN_FAILED]
    assert runtime.threads(ThreadQuery(tenant_id=None)).items[0].status is ThreadStatus.FAILED


@pytest.mark.parametrize(
    "bad",
    [
        lambda state, ctx: {"not": "a step"},
        lambda state, ctx: Step.to("nowhere", state),
        lambda state, ctx: ctx.emit("x", {"nan": float("nan")}),
        lambda state, ctx: Step.end({"set": {1, 2}}),
    ],
)
def test_a_node_returning_garbage_fails_the_run_clearly(runtime, bad):
    handle = runtime.start("t1", Graph("bad", {"n": bad}, entry="n"))
    with pytest.raises(RunFailed):
        handle.wait(WAIT)


@pytest.mark.parametrize(
    "node",
    [
        lambda state, ctx: ctx.emit(g.EVENT_RUN_COMPLETED, {}),
        lambda state, ctx: Step.end(state, events=[("threadloom.anything", None)]),
    ],
    ids=["emit", "step-events"],
)
def test_a_node_cannot_write_the_runtimes_own_event_types(runtime, store, node):
    """A log reader trusts ``threadloom.*`` events to come from the runtime (found by a hostile review: a node
    could write ``threadloom.run_completed`` into its thread's log)."""
    with pytest.raises(RunFailed, match="the runtime's own"):
        runtime.start("t1", Graph("forger", {"n": node}, entry="n")).wait(WAIT)
    types = [event.type for event in store.events_after("t1", 0, 10)]
    assert types == [g.EVENT_RUN_STARTED, g.EVENT_RUN_FAILED]


def test_max_steps_stops_a_loop(runtime, store):
    graph = Graph("loop", {"n": lambda state, ctx: Step.to("n", state)}, entry="n", max_steps=3)
    with pytest.raises(RunFailed, match="max_steps"):
        runtime.start("t1", graph).wait(WAIT)
    assert store.latest("t1").checkpoint.status is CheckpointStatus.FAILED


def test_suspend_then_resume_with_input(runtime, store):
    def ask(state, ctx):
        return Step.suspend("answer", {**state, "asked": True})

    def answer(state, ctx):
        return Step.end({**state, "done": state["reply"]})

    graph = Graph("chat", {"ask": ask, "answer": answer}, entry="ask")
    outcome = runtime.start("t1", graph, {"q": "?"}, tenant_id="acme").wait(WAIT)
    assert outcome.status is CheckpointStatus.SUSPENDED and outcome.next == "answer"
    assert runtime.threads(ThreadQuery(tenant_id="acme")).items[0].status is ThreadStatus.SUSPENDED
    with pytest.raises(InvalidRunState, match="resume"):
        runtime.start("t1", graph, {}, tenant_id="acme")
    with pytest.raises(InvalidRunState, match="nothing to recover"):
        runtime.recover("t1", graph, tenant_id="acme")
    with pytest.raises(TenantMismatch):
        runtime.resume("t1", graph, {"reply": "x"}, tenant_id="evil")
    done = runtime.resume("t1", graph, {"reply": "42"}, tenant_id="acme").wait(WAIT)
    assert done.status is CheckpointStatus.COMPLETED and done.state == {
        "q": "?",
        "asked": True,
        "reply": "42",
        "done": "42",
    }
    with pytest.raises(InvalidRunState, match="not a suspended run"):
        runtime.resume("t1", graph, {}, tenant_id="acme")
    types = [e.type for e in store.events_after("t1", 0, 20)]
    assert types == [g.EVENT_RUN_STARTED, g.EVENT_RUN_SUSPENDED, g.EVENT_RUN_RESUMED, g.EVENT_RUN_COMPLETED]


def test_tenants_are_checked_and_never_leak(runtime, store):
    counter = Counter()
    graph = linear_graph(counter)
    runtime.start("t1", graph, {}, tenant_id="acme").wait(WAIT)
    with pytest.raises(TenantMismatch) as caught:
        runtime.start("t1", graph, {}, tenant_id="evil")
    assert "acme" not in str(caught.value) and "evil" in str(caught.value)
    for call in (
        lambda: runtime.children("t1", "evil"),
        lambda: runtime.latest("t1", "evil"),
        lambda: runtime.subscribe("t1", tenant_id="evil"),
        lambda: runtime.delete_thread("t1", "evil"),
        lambda: runtime.recover("t1", graph, tenant_id=None),
    ):
        with pytest.raises(TenantMismatch):
            call()
    assert runtime.latest("t1", "acme").checkpoint.tenant_id == "acme"
    assert runtime.incomplete("evil").items == ()
    assert store.latest("t1").checkpoint.status is CheckpointStatus.COMPLETED  # nothing changed


def test_a_refusal_spends_a_fencing_token_only_once_the_run_holds_the_thread(runtime, store):
    """What the README says of refusals and tokens: ThreadBusy is refused before a claim and spends none; a refusal
    found once the run holds the thread (TenantMismatch, InvalidRunState) claims and releases it, spending one."""
    counter = Counter()
    gate = threading.Event()
    graph = linear_graph(counter, gate)
    handle = runtime.start("t1", graph, {}, tenant_id="acme")
    _wait_for(lambda: counter.counts.get("b") == 1)
    mark = store.token_high_water()
    for call in (lambda: runtime.start("t1", graph, {}, tenant_id="acme"),
                 lambda: runtime.start("t1", graph, {}, tenant_id="evil"),
                 lambda: runtime.recover("t1", graph, tenant_id="acme"),
                 lambda: runtime.resume("t1", graph, {}, tenant_id="acme")):
        with pytest.raises(ThreadBusy):
            call()
    assert store.token_high_water() == mark  # busy: no token spent
    gate.set()
    handle.wait(WAIT)
    for call, refusal in ((lambda: runtime.start("t1", graph, {}, tenant_id="evil"), TenantMismatch),
                          (lambda: runtime.recover("t1", graph, tenant_id="acme"), InvalidRunState),
                          (lambda: runtime.resume("t1", graph, {}, tenant_id="acme"), InvalidRunState),
                          (lambda: runtime.start("t1", linear_graph(counter, graph_id="other"), {},
                                                 tenant_id="acme"), InvalidRunState)):
        mark = store.token_high_water()
        with pytest.raises(refusal):
            call()
        assert store.token_high_water() == mark + 1  # claimed, found refused, released
        assert store.current_claim("t1") is None
    assert store.latest("t1").checkpoint.status is CheckpointStatus.COMPLETED  # nothing else changed


def test_start_refuses_an_incomplete_thread_and_recover_continues_it(runtime, store):
    counter = Counter()
    gate = threading.Event()
    graph = linear_graph(counter, gate)
    handle = runtime.start("t1", graph, {})
    _wait_for(lambda: counter.counts.get("b") == 1)
    handle.cancel()
    gate.set()
    with pytest.raises(CancelledError):
        handle.wait(WAIT)
    # b's step finished and was committed before the run stopped; the thread is incomplete and unclaimed.
    latest = store.latest("t1").checkpoint
    assert latest.status is CheckpointStatus.RUNNING and latest.metadata[g.NEXT_KEY] == "c"
    assert [s.thread_id for s in runtime.incomplete().items] == ["t1"]
    with pytest.raises(InvalidRunState, match="recover"):
        runtime.start("t1", graph, {})
    outcome = runtime.recover("t1", graph).wait(WAIT)
    assert outcome.state["path"] == ["a", "b", "c"] and outcome.steps == 1
    assert counter.counts == {"a": 1, "charge": 1, "b": 1, "c": 1}
    assert runtime.incomplete().items == ()
    assert g.EVENT_RUN_RECOVERED in [e.type for e in store.events_after("t1", 0, 20)]


def test_a_graph_of_another_kind_is_refused(runtime):
    counter = Counter()
    runtime.start("t1", linear_graph(counter), {}).wait(WAIT)
    with pytest.raises(InvalidRunState, match="runs graph 'linear'"):
        runtime.start("t1", linear_graph(counter, graph_id="other"), {})


def test_bad_arguments_are_validation_errors(runtime):
    graph = linear_graph(Counter())
    with pytest.raises(ValidationError) as caught:
        runtime.start("", graph)
    assert caught.value.field == "thread_id"
    with pytest.raises(ValidationError) as caught:
        runtime.start("t1", graph, {"bad": object()})
    assert caught.value.field == "input"
    with pytest.raises(ValidationError):
        runtime.start("t1", "not a graph")
    with pytest.raises(ValidationError):
        ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(seconds=1))
    with pytest.raises(ValidationError):
        Graph("g", {"a": lambda s, c: Step.end(s)}, entry="b")


BAD_TIMEOUTS = [
    pytest.param(0.5, "must be a timedelta, got float", id="float-seconds"),
    pytest.param(1, "must be a timedelta, got int", id="int-seconds"),
    pytest.param(True, "must be a timedelta, got bool", id="bool"),
    pytest.param("1s", "must be a timedelta, got str", id="text"),
    pytest.param(timedelta(seconds=-1), "must not be negative", id="negative"),
    pytest.param(timedelta.max, "must be at most 36500 days", id="past-the-longest"),
]


@pytest.mark.parametrize(("timeout", "says"), BAD_TIMEOUTS)
def test_a_timeout_that_is_not_a_timedelta_of_zero_or_more_is_a_validation_error_naming_it(runtime, timeout, says):
    """Found by a user: ``subscribe(...).get(timeout=0.5)`` raised ``AttributeError``. Durations are
    ``timedelta`` throughout the API (as ``await_events_after``'s ``timeout``, every ttl and policy): every wait
    refuses anything else, naming ``timeout``, before it waits or changes anything."""
    graph = linear_graph(Counter())
    subscription = runtime.subscribe("t1")
    handle = runtime.start("t1", graph)
    server = runtime.serve([graph], block=False, signals=False)
    calls = {
        "Subscription.get": lambda: subscription.get(timeout),
        "Subscription.get(timeout=)": lambda: subscription.get(timeout=timeout),
        "Subscription.cancel": lambda: subscription.cancel(timeout),
        "RunHandle.wait": lambda: handle.wait(timeout),
        "RunHandle.exception": lambda: handle.exception(timeout),
        "Server.join": lambda: server.join(timeout),
    }
    for name, call in calls.items():
        with pytest.raises(ValidationError) as caught:
            call()
        assert caught.value.field == "timeout", name
        assert says in str(caught.value), (name, str(caught.value))
    assert subscription.active  # the refused cancel cancelled nothing
    assert handle.wait(WAIT).status is CheckpointStatus.COMPLETED  # the refused waits left the run alone
    first = subscription.get(WAIT)  # nothing was taken from the subscription
    assert first is not None and first.seq == 1
    server.stop()
    server.join(WAIT)


@pytest.mark.parametrize("timeout", [None, timedelta(0), timedelta(milliseconds=20)], ids=["none", "zero", "20ms"])
def test_a_wait_takes_none_zero_or_a_timedelta(runtime, timeout):
    handle = runtime.start("t1", linear_graph(Counter()))
    handle.wait(WAIT)
    assert handle.wait(timeout).status is CheckpointStatus.COMPLETED  # an ended run: at once, whatever the bound
    assert handle.exception(timeout) is None
    if timeout is None:  # no bound: until the next event
        subscription = runtime.subscribe("t1")
        first = subscription.get(timeout)
        assert first is not None and first.seq == 1
        subscription.cancel(WAIT)
    else:
        quiet = runtime.subscribe("quiet")
        assert quiet.get(timeout) is None  # nothing comes: None once the bound passed
        quiet.cancel(timeout)
        assert not quiet.active


def test_a_short_ttl_alone_makes_a_policy_that_renews_in_time(store):
    """``ClaimPolicy(ttl=3 s)`` used to be refused (the default renew_every, 10 s, is not shorter)."""
    assert ClaimPolicy(ttl=timedelta(seconds=3)).renew_every == timedelta(seconds=1)
    assert ClaimPolicy().renew_every == timedelta(seconds=10)
    assert ClaimPolicy(ttl=timedelta(minutes=5)).renew_every == timedelta(seconds=10)
    assert ServePolicy(lease_ttl=timedelta(seconds=3)).renew_every == timedelta(seconds=1)
    with pytest.raises(ValidationError) as caught:  # an explicit renew_every is still checked against the ttl
        ClaimPolicy(ttl=timedelta(seconds=3), renew_every=timedelta(seconds=10))
    assert caught.value.field == "claim_policy.renew_every"
    with pytest.raises(ValidationError) as caught:
        ClaimPolicy(ttl=timedelta(0))
    assert caught.value.field == "claim_policy.ttl"
    # A node that runs for three times the ttl keeps its claim: the derived renewals (every ttl / 3) hold it.
    ttl = timedelta(milliseconds=600)
    started = threading.Event()

    def slow(state, ctx):
        started.set()
        time.sleep(3 * ttl.total_seconds())
        return Step.end({"slow": True})

    with GraphRuntime(store, node_id="n1", claim_policy=ClaimPolicy(ttl=ttl)) as runtime:
        handle = runtime.start("t1", Graph("slow", {"slow": slow}, entry="slow"), {})
        assert started.wait(WAIT.total_seconds())
        time.sleep(2 * ttl.total_seconds())
        with pytest.raises(ThreadBusy):  # still held, past two ttls
            store.claim("t1", ClaimRequest(holder="other", ttl=ttl))
        outcome = handle.wait(WAIT)
    assert outcome.status is CheckpointStatus.COMPLETED and outcome.state == {"slow": True}


def test_a_delete_refused_for_another_tenant_writes_nothing(runtime, store):
    runtime.start("t1", linear_graph(Counter()), {}, tenant_id="acme").wait(WAIT)
    history = [checkpoint.id for checkpoint in store.history("t1", limit=100)]
    lapsed = store.claim("t1", ClaimRequest(holder="crashed-run", ttl=timedelta(milliseconds=1), tenant_id="acme"))
    time.sleep(0.01)  # the claim lapses: a delete that claimed would take it over
    with pytest.raises(TenantMismatch):
        runtime.delete_thread("t1", "evil")
    assert store.current_claim("t1") == lapsed  # neither taken over nor released: no claim was written
    assert [checkpoint.id for checkpoint in store.history("t1", limit=100)] == history
    store.release("t1", lapsed.token)
    assert runtime.delete_thread("t1", "acme") == ["t1"]


@pytest.mark.parametrize("ttl", [timedelta(seconds=30), timedelta(milliseconds=1)], ids=["live", "lapsed"])
def test_a_delete_for_another_tenant_before_the_first_checkpoint_is_refused_by_the_claims_tenant(runtime, store, ttl):
    """A run holds its claim before its first checkpoint: another tenant's delete is refused by the claim's tenant,
    neither told that a run holds the thread nor taking a lapsed claim over (found by hostile testing)."""
    starting = store.claim("t1", ClaimRequest(holder="run-acme", ttl=ttl, tenant_id="acme"))
    time.sleep(0.01)
    mark = store.token_high_water()
    with pytest.raises(TenantMismatch) as caught:
        runtime.delete_thread("t1", "evil")
    assert "held" not in str(caught.value)
    assert store.current_claim("t1") == starting and store.token_high_water() == mark
    store.release("t1", starting.token)


def test_a_busy_thread_names_its_holder_to_the_same_tenant_only(runtime, store):
    gate = threading.Event()
    counter = Counter()
    handle = runtime.start("t1", linear_graph(counter, gate), {}, tenant_id="acme")
    try:
        with pytest.raises(ThreadBusy) as caught:
            runtime.start("t1", linear_graph(counter), {}, tenant_id="acme")
        assert caught.value.holder == BusyHolder.Run(handle.run_id)
        with pytest.raises(ThreadBusy) as caught:
            runtime.recover("t1", linear_graph(counter), tenant_id="evil")
        assert caught.value.holder == BusyHolder.UNNAMED
        assert runtime.live_runs() == {"t1": frozenset({handle.run_id})}
        assert runtime.threads(ThreadQuery(tenant_id="acme")).items[0].status is ThreadStatus.RUNNING
    finally:
        gate.set()
    handle.wait(WAIT)


def test_children_are_spawned_listed_and_deleted_in_a_cascade(runtime, store):
    leaf = Graph("leaf", {"x": lambda state, ctx: Step.end({**state, "leaf": True})}, entry="x")

    def mid_node(state, ctx):
        ctx.spawn(f"{ctx.thread_id}.leaf", leaf, {"from": ctx.thread_id}).wait(WAIT)
        return Step.end(state)

    mid = Graph("mid", {"m": mid_node}, entry="m")

    def root_node(state, ctx):
        results = []
        for name in ("c1", "c2"):
            results.append(ctx.effect(f"child:{name}", lambda name=name: ctx.spawn(name, mid, {}).wait(WAIT).state))
        return Step.end({**state, "children": len(results)})

    root = Graph("root", {"r": root_node}, entry="r")
    outcome = runtime.start("root", root, {}, tenant_id="acme").wait(WAIT)
    assert outcome.state["children"] == 2
    assert runtime.children("root", "acme") == ["c1", "c2"]
    assert runtime.children("c1", "acme") == ["c1.leaf"]
    child = store.latest("c1").checkpoint
    assert child.origin.parent_thread == "root" and child.origin.task_id == "1:r" and child.tenant_id == "acme"
    assert child.origin.parent_checkpoint == runtime.latest("root", "acme").checkpoint.parent
    assert [s.thread_id for s in runtime.threads(ThreadQuery(tenant_id="acme")).items] == ["root"]  # roots only
    with capture_logs() as logs:
        deleted = runtime.delete_thread("root", "acme")
    assert deleted == ["c1.leaf", "c1", "c2.leaf", "c2", "root"]
    for thread_id in deleted:
        assert store.latest(thread_id) is None
    assert runtime.children("root", "acme") == []
    deletes = [entry for entry in logs if entry.get("op") == "delete_thread" and entry["event"] == "commit.applied"]
    root_token = next(e["token"] for e in logs if e["event"] == "claim.granted" and e["thread_id"] == "root")
    assert [e["thread_id"] for e in deletes] == deleted
    assert all(e["fence"] == ["root", root_token] for e in deletes[:-1]) and deletes[-1]["fence"] is None


def test_a_cascade_stopped_by_a_live_child_leaves_the_root_marked_deleted(runtime, store):
    gate = threading.Event()
    counter = Counter()

    def parent(state, ctx):
        ctx.spawn("kid", linear_graph(counter, gate), {})
        return Step.end(state)

    runtime.start("root", Graph("p", {"p": parent}, entry="p"), {}).wait(WAIT)
    _wait_for(lambda: counter.counts.get("b") == 1)
    try:
        with pytest.raises(ThreadBusy) as caught:
            runtime.delete_thread("root")
        assert caught.value.thread_id == "kid"
        summary = runtime.threads(ThreadQuery(tenant_id=None)).items[0]
        assert summary.status is ThreadStatus.DELETED and summary.metadata["threadloom.deleting"] == "true"
        assert runtime.incomplete().items == ()
        probe = store.claim("root", ClaimRequest(holder="probe", ttl=timedelta(seconds=1)))  # it was released
        store.release("root", probe.token)
    finally:
        gate.set()
    _wait_for(lambda: counter.counts.get("c") == 1)
    _wait_for(lambda: runtime.live_runs() == {})
    assert runtime.delete_thread("root") == ["kid", "root"]  # any runtime finishes the cascade


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition never held")
        time.sleep(0.005)


def test_every_run_log_line_carries_the_design_keys(store):
    with capture_logs() as logs:
        with GraphRuntime(store, node_id="n1") as runtime:
            runtime.start("t1", linear_graph(Counter()), {}, tenant_id="acme").wait(WAIT)
    names = [entry["event"] for entry in logs]
    for name in ("claim.granted", "commit.applied", "run.started", "run.completed"):
        assert name in names
    for entry in logs:
        if entry["event"].startswith(("claim.", "commit.", "run.")):
            assert entry["thread_id"] == "t1" and entry["tenant_id"] == "acme" and entry["node_id"] == "n1"
            assert entry["run_id"].startswith("n1:run-") and "op" in entry
            assert entry.get("token") == 1 or entry["event"] == "run.started"
    commits = [entry for entry in logs if entry["event"] == "commit.applied"]
    assert [entry["graph_node"] for entry in commits] == [None, "a", "b", "c"]
    assert all("duration_ms" in entry for entry in commits)


def test_ids_come_from_the_injected_factory(store):
    with GraphRuntime(store, node_id="n1", ids=SequentialIds()) as runtime:
        first = runtime.start("t1", linear_graph(Counter()), {})
        first.wait(WAIT)
        second = runtime.start("t2", linear_graph(Counter()), {})
        second.wait(WAIT)
    assert (first.run_id, second.run_id) == ("n1:run-1", "n1:run-2")
    assert [cp.id for cp in store.history("t1", limit=10)] == [f"n1:run-1:{i}" for i in (3, 2, 1, 0)]


def test_timers_tasks_and_waits_go_through_the_given_scheduler(store):
    class CountingScheduler(ThreadScheduler):
        def __init__(self) -> None:
            super().__init__()
            self.timers = 0
            self.tasks: list[str] = []

        def call_at(self, when, fn):
            self.timers += 1
            return super().call_at(when, fn)

        def spawn(self, name, fn):
            self.tasks.append(name)
            return super().spawn(name, fn)

    scheduler = CountingScheduler()
    with GraphRuntime(store, node_id="n1", scheduler=scheduler) as runtime:
        runtime.start("t1", linear_graph(Counter()), {}).wait(WAIT)
        runtime.subscribe("t1").cancel()
    # One task runs the run's nodes one after another: each step's commit and the next node stay on its thread.
    assert scheduler.tasks.count("node-t1") == 1 and "watch-t1" in scheduler.tasks
    assert scheduler.timers == 1  # the run's renewal timer, set when it claimed (a quick run never renews)


def test_the_scheduler_runs_tasks_on_reused_threads_and_never_makes_one_wait_for_another():
    scheduler = ThreadScheduler()
    ran: list[tuple[threading.Thread, str]] = []

    def record() -> None:
        ran.append((threading.current_thread(), threading.current_thread().name))

    scheduler.spawn("first", record).join(10)
    scheduler.spawn("second", record).join(10)
    assert ran[0][0] is ran[1][0]  # the idle thread took the next task: no thread started for it
    assert [name for _thread, name in ran] == ["threadloom-first", "threadloom-second"]
    # A task blocked on another task's work never holds that work up: a busy pool starts another thread.
    ready, answered = threading.Event(), threading.Event()
    waiter = scheduler.spawn("waiter", lambda: answered.set() if ready.wait(10) else None)
    scheduler.spawn("answer", ready.set).join(10)
    waiter.join(10)
    assert answered.is_set() and not waiter.alive
    # close() ends idle threads and names a task still running after the timeout.
    release = threading.Event()
    stuck = scheduler.spawn("stuck", lambda: release.wait(10))
    assert scheduler.close(timedelta(milliseconds=50)) == ["threadloom-stuck"]
    assert stuck.alive
    release.set()
    stuck.join(10)
    assert not stuck.alive
    for thread in {ran[0][0], stuck.thread, waiter.thread}:  # a closed scheduler keeps no idle thread
        thread.join(10)
        assert not thread.is_alive()
