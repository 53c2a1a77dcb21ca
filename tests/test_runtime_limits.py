"""A step the store refuses as invalid (a record over ``max_json_size``) ends its run FAILED, once.

The refusal is the same on every retry, so the run commits a FAILED checkpoint without the refused step (its
state, events and effect records) and ends with ``RunFailed``; the thread is settled, not left RUNNING for a
recovery that would run the node (and its effects) again. An effect result over the limit fails the node as
soon as ``fn`` returns. Every test runs over a real in-memory store and a real SQLite file.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from threadloom import (
    CheckpointStatus,
    Graph,
    GraphRuntime,
    InvalidRunState,
    RunFailed,
    Step,
    ValidationError,
    effect_keys,
    open_store,
)
from threadloom.actors import graph as g

WAIT = timedelta(seconds=10)
LIMIT = 2000  # characters of JSON per stored record
BIG = "x" * 5000

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/limits.db"
    store = open_store(url, max_json_size=LIMIT)
    yield store
    store.close()


@pytest.fixture
def runtime(store):
    runtime = GraphRuntime(store, node_id="n1")
    yield runtime
    runtime.close()


class Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = 0

    def __call__(self, result):
        with self._lock:
            self.n += 1
        return result


def _failed(handle) -> RunFailed:
    with pytest.raises(RunFailed) as caught:
        handle.wait(WAIT)
    return caught.value


def _settled_failed(store, thread_id: str, state: object):
    latest = store.latest(thread_id)
    assert latest is not None
    cp = latest.checkpoint
    assert cp.status is CheckpointStatus.FAILED and cp.state == state
    assert store.current_claim(thread_id) is None  # released
    return cp


def test_an_effect_result_over_max_json_size_fails_the_node_once_and_is_not_called_again(runtime, store):
    calls = Counter()

    def pay(state, ctx):
        ctx.emit("paying", {"amount": 5})
        return Step.end({**state, "receipt": ctx.effect("pay", lambda key: calls(BIG))})

    graph = Graph("pay", {"pay": pay}, entry="pay")
    handle = runtime.start("t1", graph, {"amount": 5})
    error = _failed(handle)
    cause = error.__cause__
    assert isinstance(cause, ValidationError) and "'pay'" in cause.field
    assert f"{LIMIT:,}" in cause.problems[0] and "max_json_size" in cause.problems[0]
    assert "'pay'" in str(error) and "max_json_size" in str(error)
    cp = _settled_failed(store, "t1", {"amount": 5})
    assert "max_json_size" in cp.metadata[g.ERROR_KEY]
    keys = effect_keys("t1", "pay", turn_id=handle.run_id)
    assert store.effect("t1", keys.record) is None
    assert store.effect("t1", keys.intent) is not None
    events = [event.type for event in store.events_after("t1", 0, 100)]
    assert "paying" in events and events[-1] == g.EVENT_RUN_FAILED  # the node's own events are kept
    for _ in range(3):
        with pytest.raises(InvalidRunState):
            runtime.recover("t1", graph)
    assert calls.n == 1


def test_an_effect_result_within_max_json_size_is_recorded(runtime, store):
    def node(state, ctx):
        return Step.end({"n": len(ctx.effect("small", lambda: "y" * 1000))})

    handle = runtime.start("t1", Graph("ok", {"node": node}, entry="node"), {})
    assert handle.wait(WAIT).state == {"n": 1000}
    assert store.effect("t1", effect_keys("t1", "small", turn_id=handle.run_id).record).result == "y" * 1000


@pytest.mark.parametrize("part", ["state", "event", "step_event"])
def test_a_step_whose_commit_is_refused_as_too_large_ends_the_run_failed_without_the_step(runtime, store, part):
    calls = Counter()

    def first(state, ctx):
        return Step.to("second", {**state, "first": True})

    def second(state, ctx):
        ctx.effect("small", lambda: calls("ok"))
        ctx.emit("ran", {"ok": True})
        if part == "event":
            ctx.emit("huge", BIG)
        if part == "step_event":
            return Step.end(state, events=[("huge", BIG)])
        return Step.end({**state, "big": BIG if part == "state" else None})

    graph = Graph("big", {"first": first, "second": second}, entry="first")
    handle = runtime.start("t1", graph, {})
    error = _failed(handle)
    cause = error.__cause__
    assert isinstance(cause, ValidationError) and cause.field.startswith("commit.")
    assert error.node == "second"
    cp = _settled_failed(store, "t1", {"first": True})
    assert cp.metadata[g.ERROR_KEY].startswith("ValidationError")
    events = [event.type for event in store.events_after("t1", 0, 100)]
    assert "ran" not in events and "huge" not in events and events[-1] == g.EVENT_RUN_FAILED
    assert store.effect("t1", effect_keys("t1", "small", turn_id=handle.run_id).record) is None
    with pytest.raises(InvalidRunState):
        runtime.recover("t1", graph)
    assert calls.n == 1
    fixed = Graph("big", {"first": lambda s, c: Step.end({**s, "done": 1}), "second": second}, entry="first")
    assert runtime.start("t1", fixed, {}).wait(WAIT).state == {"first": True, "done": 1}  # a new turn goes on


def test_a_failing_node_whose_events_are_too_large_still_ends_failed(runtime, store):
    def node(state, ctx):
        ctx.emit("huge", BIG)
        raise RuntimeError("the node's own error")

    handle = runtime.start("t1", Graph("bad", {"node": node}, entry="node"), {"a": 1})
    error = _failed(handle)
    assert isinstance(error.__cause__, RuntimeError) and "the node's own error" in str(error)
    cp = _settled_failed(store, "t1", {"a": 1})
    assert "the node's own error" in cp.metadata[g.ERROR_KEY]
    assert "huge" not in [event.type for event in store.events_after("t1", 0, 100)]
