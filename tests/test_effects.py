"""``ctx.effect``: what a key names (one effect of one turn by default, or of the whole thread when asked), the
idempotency key a side effect receives, and the intent that tells a re-execution a call may already have happened.

Every test runs over memory, SQLite and PostgreSQL (the latter where ``THREADLOOM_TEST_PG`` reaches a server).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from threadloom import Graph, GraphRuntime, InMemoryCheckpointer, Step

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
