"""``ctx.effect``: what a key names (one effect of one turn by default, or of the whole thread when asked), the
idempotency key a side effect receives, and the intent that tells a re-execution a call may already have happened.

Every test runs over memory, SQLite and PostgreSQL (the latter where ``THREADLOOM_TEST_PG`` reaches a server).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from threadloom import (
    CancelledError,
    CheckpointStatus,
    EffectMayHaveRun,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    RunFailed,
    Step,
    ValidationError,
    effect_keys,
)
from threadloom.actors import graph as g

WAIT = timedelta(seconds=10)


def _memory(tmp_path):
    return InMemoryCheckpointer(), None


def _sqlite(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return SqliteCheckpointer.open(str(tmp_path / "effects.db")), None


def _postgres(tmp_path):
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    return harness.open(), harness


@pytest.fixture(params=[_memory, _sqlite, _postgres], ids=["memory", "sqlite", "postgres"])
def store(request, tmp_path):
    store, harness = request.param(tmp_path)
    try:
        yield store
    finally:
        store.close()
        if harness is not None:
            harness.cleanup()


@pytest.fixture
def runtime(store):
    runtime = GraphRuntime(store, node_id="n1")
    yield runtime
    runtime.close()


def readme_agent() -> Graph:
    """The agent of the README's "Agent runs that survive crashes", as written there."""

    def plan(state, ctx):
        found = ctx.effect("search", lambda: f"results for {state['question']}")
        ctx.emit("searched", {"chars": len(found)})
        return Step.to("answer", {**state, "found": found})

    def answer(state, ctx):
        return Step.end({**state, "answer": state["found"].upper()})

    return Graph("qa", {"plan": plan, "answer": answer}, entry="plan")


def test_the_readme_agent_asked_twice_on_one_thread_answers_each_question(runtime):
    graph = readme_agent()
    first = runtime.start("question-1", graph, {"question": "why fence?"}, tenant_id="acme").wait(WAIT)
    second = runtime.start("question-1", graph, {"question": "why claims?"}, tenant_id="acme").wait(WAIT)
    assert first.state["answer"] == "RESULTS FOR WHY FENCE?"
    assert second.state["answer"] == "RESULTS FOR WHY CLAIMS?"


class Calls:
    """What each effect function was called with, in order, across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[str, str | None]] = []

    def add(self, name: str, idempotency_key: str | None = None) -> int:
        with self._lock:
            self.seen.append((name, idempotency_key))
            return len(self.seen)

    def keys(self, name: str) -> list[str | None]:
        return [key for seen, key in self.seen if seen == name]


def test_a_thread_scoped_key_is_recorded_once_for_every_turn(runtime, store):
    calls = Calls()

    def ask(state, ctx):
        profile = ctx.effect("profile", lambda: calls.add("profile"), scope="thread")
        reply = ctx.effect("reply", lambda: calls.add("reply"))
        return Step.end({**state, "profile": profile, "reply": reply})

    graph = Graph("scoped", {"ask": ask}, entry="ask")
    first = runtime.start("t1", graph, {"q": 1}).wait(WAIT)
    second = runtime.start("t1", graph, {"q": 2}).wait(WAIT)
    assert [name for name, _ in calls.seen] == ["profile", "reply", "reply"]
    assert first.state["profile"] == second.state["profile"] == 1
    assert (first.state["reply"], second.state["reply"]) == (2, 3)
    thread_wide = store.effect("t1", effect_keys("t1", "profile").record)
    assert thread_wide.result == 1 and thread_wide.run_id == first.run_id
    per_turn = [store.effect("t1", effect_keys("t1", "reply", turn_id=o.run_id).record) for o in (first, second)]
    assert [(r.result, r.run_id) for r in per_turn] == [(2, first.run_id), (3, second.run_id)]


def test_fn_gets_one_idempotency_key_per_effect_in_the_form_it_asks_for(runtime, store):
    calls = Calls()

    def keyword_only(*, idempotency_key):
        return calls.add("keyword", idempotency_key)

    def node(state, ctx):
        ctx.effect("none", lambda: calls.add("none"))
        ctx.effect("positional", lambda key: calls.add("positional", key))
        ctx.effect("keyword", keyword_only)
        ctx.effect("defaulted", lambda idempotency_key=None: calls.add("defaulted", idempotency_key))
        ctx.effect("thread-wide", lambda key: calls.add("thread-wide", key), scope="thread")
        return Step.end(state)

    graph = Graph("keys", {"node": node}, entry="node")
    first = runtime.start("t1", graph, {}).wait(WAIT)
    second = runtime.start("t1", graph, {}).wait(WAIT)
    assert calls.keys("none") == [None, None]
    for name in ("positional", "keyword", "defaulted"):
        expected = [effect_keys("t1", name, turn_id=o.run_id).idempotency for o in (first, second)]
        assert calls.keys(name) == expected and len(set(expected)) == 2
    assert calls.keys("thread-wide") == [effect_keys("t1", "thread-wide").idempotency]
    assert len({key for _, key in calls.seen if key is not None}) == 7  # every effect of every turn its own


def test_the_keys_of_an_effect_depend_on_thread_turn_and_key_only():
    keys = effect_keys("t1", "charge", turn_id="run-1")
    assert keys == effect_keys("t1", "charge", turn_id="run-1")
    assert uuid.UUID(keys.idempotency).version == 5
    assert keys.record == f"charge@{keys.idempotency}" and keys.intent == keys.record + "/intent"
    others = [
        effect_keys("t2", "charge", turn_id="run-1"),
        effect_keys("t1", "charge", turn_id="run-2"),
        effect_keys("t1", "charge"),
        effect_keys("t1", "charge2", turn_id="run-1"),
    ]
    assert len({keys.idempotency, *(other.idempotency for other in others)}) == 5
    long = effect_keys("t" * 255, "k" * 255, turn_id="r" * 255)
    assert len(long.intent) == 255 and long.record.endswith("@" + long.idempotency)
    with pytest.raises(ValidationError) as caught:
        effect_keys("t1", "")
    assert caught.value.field == "key"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda ctx: ctx.effect("k", lambda a, b: 1), "fn"),
        (lambda ctx: ctx.effect("k", "not callable"), "fn"),
        (lambda ctx: ctx.effect("k", lambda: 1, scope="run"), "scope"),
        (lambda ctx: ctx.effect("k", lambda: 1, on_uncertain="ignore"), "on_uncertain"),
        (lambda ctx: ctx.effect("k", lambda: 1, on_uncertain=lambda: 1), "on_uncertain"),
        (lambda ctx: ctx.effect("k", lambda: 1, on_uncertain=lambda *, idempotency_key: 1), "on_uncertain"),
        (lambda ctx: ctx.effect("k", lambda: 1, on_uncertain=lambda key, other: 1), "on_uncertain"),
        (lambda ctx: ctx.effect("", lambda: 1), "key"),
    ],
)
def test_bad_effect_arguments_fail_the_node_with_nothing_recorded(runtime, store, call, field):
    def node(state, ctx):
        call(ctx)
        return Step.end(state)

    handle = runtime.start("t1", Graph("bad", {"node": node}, entry="node"), {})
    with pytest.raises(RunFailed) as caught:
        handle.wait(WAIT)
    assert isinstance(caught.value.__cause__, ValidationError) and caught.value.__cause__.field == field
    assert store.effect("t1", effect_keys("t1", "k", turn_id=handle.run_id).intent) is None


def test_an_on_uncertain_callable_taking_the_key_as_one_positional_argument_is_accepted(runtime, store):
    def node(state, ctx):
        for index, choice in enumerate([lambda key, extra=None: 1, lambda *args: 1, lambda key, /: 1, str]):
            ctx.effect(f"k{index}", lambda: index, on_uncertain=choice)
        return Step.end(state)

    assert runtime.start("t1", Graph("ok", {"node": node}, entry="node"), {}).wait(WAIT).status is (
        CheckpointStatus.COMPLETED
    )


def test_a_recovered_run_continues_its_turn_and_reads_that_turns_records(runtime, store):
    calls = Calls()
    gate = threading.Event()
    entered = threading.Event()

    def a(state, ctx):
        return Step.to("b", {**state, "a": ctx.effect("k", lambda: calls.add("k"))})

    def b(state, ctx):
        entered.set()
        assert gate.wait(10)
        return Step.to("c", state)

    def c(state, ctx):
        return Step.end({**state, "c": ctx.effect("k", lambda: calls.add("k-again")), "turn": ctx.turn_id})

    graph = Graph("turns", {"a": a, "b": b, "c": c}, entry="a")
    first = runtime.start("t1", graph, {})
    assert entered.wait(10)
    first.cancel()
    gate.set()
    with pytest.raises(CancelledError):
        first.wait(WAIT)
    recovered = runtime.recover("t1", graph).wait(WAIT)
    assert recovered.run_id != first.run_id
    assert recovered.state == {"a": 1, "c": 1, "turn": first.run_id}
    assert [name for name, _ in calls.seen] == ["k"]
    assert {cp.metadata[g.TURN_KEY] for cp in store.history("t1", limit=10)} == {first.run_id}
    again = runtime.start("t1", graph, {})
    gate.set()
    assert again.wait(WAIT).state["turn"] == again.run_id  # a start is a new turn: "k" runs afresh
    assert [name for name, _ in calls.seen] == ["k", "k"]


def test_a_resume_begins_a_new_turn(runtime, store):
    calls = Calls()

    def ask(state, ctx):
        value = ctx.effect("k", lambda: calls.add("k"))
        if not state.get("approved"):
            return Step.suspend("ask", {**state, "asked": value})
        return Step.end({**state, "value": value, "turn": ctx.turn_id})

    graph = Graph("approval", {"ask": ask}, entry="ask")
    runtime.start("t1", graph, {}).wait(WAIT)
    resumed = runtime.resume("t1", graph, {"approved": True})
    outcome = resumed.wait(WAIT)
    assert outcome.state == {"approved": True, "asked": 1, "value": 2, "turn": resumed.run_id}


def interrupted_after_effect(calls: Calls, stop: threading.Event, on_uncertain="repeat") -> Graph:
    """charge → end. ``charge`` runs its effect, then, the first time, waits for ``stop`` and fails because its
    run was stopped: the step never commits, so the thread holds the effect's intent and no record."""

    def charge(state, ctx):
        def pay(idempotency_key):
            calls.add("pay", idempotency_key)
            return {"paid": state["amount"]}

        def ask_provider(idempotency_key):
            calls.add("ask", idempotency_key)
            return {"paid": state["amount"], "asked": True}

        choice = ask_provider if on_uncertain == "callable" else on_uncertain
        try:
            receipt = ctx.effect("pay", pay, on_uncertain=choice)
        except EffectMayHaveRun as uncertain:
            return Step.suspend("charge", {**state, "uncertain": uncertain.idempotency_key})
        if len(calls.seen) == 1:
            stop.wait(10)
            raise RuntimeError("stopped while reading the receipt")
        return Step.end({**state, "receipt": receipt})

    return Graph("payments", {"charge": charge}, entry="charge")


def _interrupt(runtime, graph, calls, stop):
    handle = runtime.start("t1", graph, {"amount": 5})
    deadline = time.monotonic() + 10
    while not calls.seen:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    handle.cancel()
    stop.set()
    with pytest.raises(CancelledError):
        handle.wait(WAIT)
    return handle


@pytest.mark.parametrize("on_uncertain", ["repeat", "raise", "callable"])
def test_a_re_executed_step_finds_the_intent_and_does_what_the_node_chose(runtime, store, on_uncertain):
    calls = Calls()
    stop = threading.Event()
    graph = interrupted_after_effect(calls, stop, on_uncertain)
    first = _interrupt(runtime, graph, calls, stop)
    keys = effect_keys("t1", "pay", turn_id=first.run_id)
    intent = store.effect("t1", keys.intent)
    assert intent.run_id == first.run_id and intent.result["idempotency_key"] == keys.idempotency
    assert store.effect("t1", keys.record) is None
    with capture_logs() as logs:
        outcome = runtime.recover("t1", graph).wait(WAIT)
    uncertain = [line for line in logs if line["event"] == "effect.uncertain"]
    assert [(line["key"], line["idempotency_key"], line["intent_run"]) for line in uncertain] == [
        ("pay", keys.idempotency, first.run_id)
    ]
    record = store.effect("t1", keys.record)
    if on_uncertain == "repeat":
        assert calls.seen == [("pay", keys.idempotency), ("pay", keys.idempotency)]
        assert outcome.state["receipt"] == record.result == {"paid": 5}
        assert record.run_id == outcome.run_id
    elif on_uncertain == "callable":
        assert calls.seen == [("pay", keys.idempotency), ("ask", keys.idempotency)]
        assert outcome.state["receipt"] == record.result == {"paid": 5, "asked": True}
    else:
        assert calls.seen == [("pay", keys.idempotency)]
        assert outcome.status is CheckpointStatus.SUSPENDED and outcome.state["uncertain"] == keys.idempotency
        assert record is None
    assert store.effect("t1", keys.intent) == intent  # first-wins: the intent names the first execution
