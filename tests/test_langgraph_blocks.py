"""Runs of one thread through ONE saver object (one web process serving two requests of one conversation).

``hold`` blocks of a saver take turns on a thread (a second waits for the first to end, or is ``ThreadBusy``), and
while a block holds the thread a write from outside it (another run of the same saver) is ``ThreadBusy`` with
nothing written, instead of sharing the block's claim and forking the history. LangGraph's writes inherit the
block's context (its background executor copies ``contextvars``; the async methods run in the caller's context).
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from datetime import timedelta
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.graph import END, StateGraph
from langgraph.graph import START as GRAPH_START

from threadloom import CheckpointConflict, ThreadBusy
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.sqlite.store import SqliteCheckpointer


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path):
    if request.param == "memory":
        opened = InMemoryCheckpointer()
        yield opened
        opened.close()
    elif request.param == "sqlite":
        opened = SqliteCheckpointer.open(tmp_path / "blocks.db")
        yield opened
        opened.close()
    else:
        from threadloom.testing.postgres_harness import PgHarness

        harness = PgHarness()
        try:
            yield harness.open_pg()
        finally:
            harness.cleanup()


@pytest.fixture
def saver(store):
    opened = ThreadloomSaver(store, idle_release=timedelta(seconds=60))
    yield opened
    opened.close()


def _put(saver, thread, parent=None, *, step=0, ns=""):
    config = generate_config(thread, checkpoint_ns=ns)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values={"n": step}, channel_versions={"n": step + 1})
    return saver.put(config, checkpoint, generate_metadata(step=step), {"n": step + 1})


def _ids(saver, thread):
    return [t.checkpoint["id"] for t in saver.list(generate_config(thread))]


def _in_thread(fn):
    """``fn()`` on a new OS thread (a fresh context: outside any block of the caller); its result or error."""
    return _in_thread_async(fn)()


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver, gate: threading.Event | None = None, inside: threading.Event | None = None):
    def first(state: State) -> State:
        if inside is not None:
            inside.set()
        if gate is not None:
            assert gate.wait(30)
        return {"log": ["first"]}

    def second(state: State) -> State:
        return {"log": ["second"]}

    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(GRAPH_START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=saver)


def test_a_second_hold_block_of_the_same_saver_is_busy_or_waits_its_turn(saver) -> None:
    with saver.hold("t"):
        first = _put(saver, "t")
        kind, error = _in_thread(lambda: saver.hold("t").__enter__())
        assert kind == "error" and isinstance(error, ThreadBusy)  # no wait: refused at once, nothing claimed
        assert error.thread_id == "t" and error.latest_checkpoint == first["configurable"]["checkpoint_id"]
    order: list[str] = []
    entered = threading.Event()
    release = threading.Event()

    def one() -> None:
        with saver.hold("t"):
            entered.set()
            order.append("one:in")
            assert release.wait(30)
            order.append("one:out")

    def two() -> None:
        assert entered.wait(30)
        with saver.hold("t", wait=timedelta(seconds=30)):
            order.append("two:in")

    workers = [threading.Thread(target=one), threading.Thread(target=two)]
    for worker in workers:
        worker.start()
    assert entered.wait(30)
    time.sleep(0.2)  # two() is waiting for one()'s block
    assert order == ["one:in"]
    release.set()
    for worker in workers:
        worker.join(30)
    assert order == ["one:in", "one:out", "two:in"]


def test_a_write_of_the_same_saver_from_outside_the_block_is_busy_and_writes_nothing(saver, store) -> None:
    with saver.hold("t"):
        first = _put(saver, "t")
        for outside in (
            lambda: _put(saver, "t", first, step=1),
            lambda: saver.put_writes(first, [("ch", "x")], "task-x"),
            lambda: _put(saver, "t", step=1, ns="sub:1"),  # a subgraph namespace: fenced by the root's block
        ):
            kind, error = _in_thread(outside)
            assert kind == "error" and isinstance(error, ThreadBusy), error
        assert _ids(saver, "t") == [first["configurable"]["checkpoint_id"]]
        assert saver.get_tuple(first).pending_writes == []
        assert store.children("t", limit=10) == []  # the namespace was never written
        second = _put(saver, "t", first, step=1)  # inside the block: written
        saver.put_writes(second, [("ch", "y")], "task-y")
    assert _ids(saver, "t") == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
    assert [w[1:] for w in saver.get_tuple(second).pending_writes] == [("ch", "y")]
    # the block ended: a run without one writes again
    kind, _ = _in_thread(lambda: _put(saver, "t", second, step=2))
    assert kind == "ok"


def test_a_block_inside_a_block_of_the_same_saver_and_thread_shares_it(saver) -> None:
    with saver.hold("t"):
        first = _put(saver, "t")
        with saver.hold("t"):
            second = _put(saver, "t", first, step=1)
        third = _put(saver, "t", second, step=2)  # the inner block's end left the outer block's claim
    assert len(_ids(saver, "t")) == 3 and third is not None


@pytest.mark.parametrize("durability", ["async", "sync", "exit"])
def test_a_concurrent_graph_run_of_the_same_saver_is_busy_while_a_block_runs(saver, durability) -> None:
    gate, inside = threading.Event(), threading.Event()
    graph = _graph(saver, gate, inside)
    config = {"configurable": {"thread_id": "g"}}
    with saver.hold("g"):
        _graph(saver).invoke({"log": ["one"]}, config, durability=durability)
    before = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]

    def blocked_run() -> None:
        with saver.hold("g"):
            graph.invoke({"log": ["two"]}, config, durability=durability)

    runner = threading.Thread(target=blocked_run)
    runner.start()
    try:
        assert inside.wait(30)
        plain = _graph(saver)
        kind, error = _in_thread(lambda: plain.invoke({"log": ["three"]}, config, durability=durability))
        assert kind == "error" and isinstance(error, ThreadBusy), error
    finally:
        gate.set()
        runner.join(30)
    after = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(config)]
    assert after[-len(before):] == before  # one linear history: the second run continued the first
    assert graph.get_state(config).values["log"] == ["one", "first", "second", "two", "first", "second"]


def test_graph_runs_in_blocks_of_one_saver_take_turns_and_never_fork(saver) -> None:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "turns"}}

    def run(label: str) -> None:
        with saver.hold("turns", wait=timedelta(seconds=30)):
            graph.invoke({"log": [label]}, config)

    workers = [threading.Thread(target=run, args=(f"r{i}",)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    log = graph.get_state(config).values["log"]
    assert len(log) == 12 and sorted(log[0::3]) == ["r0", "r1", "r2", "r3"]  # every run continued the one before
    assert all(log[i + 1 : i + 3] == ["first", "second"] for i in range(0, 12, 3))
    history = list(graph.get_state_history(config))
    parents = [s.parent_config["configurable"]["checkpoint_id"] for s in history if s.parent_config]
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    assert parents == ids[1:]  # each checkpoint's parent is the one stored before it


def test_async_blocks_take_turns_and_a_task_outside_them_is_busy(saver) -> None:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "aio"}}

    async def main() -> None:
        started = asyncio.Event()

        async def in_block(label: str) -> None:
            async with saver.ahold("aio", wait=timedelta(seconds=30)):
                started.set()
                await graph.ainvoke({"log": [label]}, config)
                await asyncio.sleep(0.1)

        blocked = [asyncio.create_task(in_block("a")), asyncio.create_task(in_block("b"))]
        await started.wait()
        outside = {"configurable": {"thread_id": "aio", "checkpoint_ns": "", "checkpoint_id": "cp-outside"}}
        with pytest.raises(ThreadBusy):  # this task is not inside a block: refused, whatever it names
            await saver.aput_writes(outside, [("ch", "x")], "task-x")
        await asyncio.gather(*blocked)

    asyncio.run(main())
    log = graph.get_state(config).values["log"]
    assert sorted(log[0::3]) == ["a", "b"] and len(log) == 6


# -- runs without blocks: a run that read the latest and finds another run's checkpoint after it ---------------------


def test_a_put_after_a_latest_another_run_of_the_same_saver_continued_is_a_conflict(saver) -> None:
    base = _put(saver, "t")
    read_by_b = saver.get_tuple(generate_config("t"))  # run B reads the thread's latest
    assert read_by_b.config["configurable"]["checkpoint_id"] == base["configurable"]["checkpoint_id"]
    first = _put(saver, "t", base, step=1)  # run A (same saver, same claim) continues it first
    with pytest.raises(CheckpointConflict) as caught:
        _put(saver, "t", read_by_b.config, step=1)  # B's checkpoint would fork: refused
    assert caught.value.expected == base["configurable"]["checkpoint_id"]
    assert caught.value.actual == first["configurable"]["checkpoint_id"]
    assert _ids(saver, "t") == [first["configurable"]["checkpoint_id"], base["configurable"]["checkpoint_id"]]
    second = _put(saver, "t", first, step=2)  # A's run goes on: the claim is still its
    # picking a checkpoint by its id (LangGraph's time travel) branches from it on purpose: stored after the latest
    picked = saver.get_tuple(base)
    branched = _put(saver, "t", picked.config, step=1)
    assert _ids(saver, "t")[:2] == [branched["configurable"]["checkpoint_id"], second["configurable"]["checkpoint_id"]]


class _ReadTogether(ThreadloomSaver):
    """A saver whose reads of a thread's latest wait for each other (two runs both read before either writes)."""

    barrier: threading.Barrier

    def get_tuple(self, config):
        found = super().get_tuple(config)
        if not config["configurable"].get("checkpoint_id") and not config["configurable"].get("checkpoint_ns"):
            try:
                self.barrier.wait(5)
            except threading.BrokenBarrierError:
                pass
        return found


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_two_concurrent_graph_runs_of_one_saver_without_blocks_never_fork(store, durability) -> None:
    saver = _ReadTogether(store, idle_release=timedelta(seconds=60))
    try:
        graph = _graph(saver)
        config = {"configurable": {"thread_id": "both"}}
        saver.barrier = threading.Barrier(1)
        graph.invoke({"log": ["zero"]}, config, durability=durability)
        saver.barrier = threading.Barrier(2)
        results = [_in_thread_async(lambda label=label: graph.invoke({"log": [label]}, config, durability=durability))
                   for label in ("a", "b")]
        outcomes = [result() for result in results]
        saver.barrier = threading.Barrier(1)  # the reads below read alone
        kinds = sorted(kind for kind, _ in outcomes)
        assert kinds == ["error", "ok"], outcomes
        error = next(value for kind, value in outcomes if kind == "error")
        assert isinstance(error, CheckpointConflict), error
        log = graph.get_state(config).values["log"]
        assert log[:3] == ["zero", "first", "second"] and len(log) == 6 and log[3] in ("a", "b")
        history = list(graph.get_state_history(config))
        parents = [s.parent_config["configurable"]["checkpoint_id"] for s in history if s.parent_config]
        assert parents == [s.config["configurable"]["checkpoint_id"] for s in history][1:]  # one line, no fork
    finally:
        saver.close()


def _in_thread_async(fn):
    """Starts ``fn()`` on a new OS thread; returns a function that waits for it and gives its result or error."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as error:  # handed back to the test
            out.append(("error", error))

    worker = threading.Thread(target=run)
    worker.start()

    def result():
        worker.join(30)
        assert out, "the call did not end"
        return out[0]

    return result
