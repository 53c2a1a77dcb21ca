"""Runs of one thread through ONE saver object (one web process serving two requests of one conversation).

``hold`` blocks of a saver take turns on a thread (a second waits for the first to end, or is ``ThreadBusy``), so
runs in blocks follow each other and never fork the history. Regressions found by hostile testing are marked.
"""

from __future__ import annotations

import asyncio
import contextvars
import operator
import threading
import time
from datetime import timedelta
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.graph import END, StateGraph
from langgraph.graph import START as GRAPH_START

from threadloom import StoreClosed, ThreadBusy
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


def test_a_block_inside_a_block_of_the_same_saver_and_thread_shares_it(saver) -> None:
    with saver.hold("t"):
        first = _put(saver, "t")
        with saver.hold("t"):
            second = _put(saver, "t", first, step=1)
        third = _put(saver, "t", second, step=2)  # the inner block's end left the outer block's claim
    assert len(_ids(saver, "t")) == 3 and third is not None


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


def test_async_blocks_take_turns(saver) -> None:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "aio"}}

    async def in_block(label: str) -> None:
        async with saver.ahold("aio", wait=timedelta(seconds=30)):
            await graph.ainvoke({"log": [label]}, config)
            await asyncio.sleep(0.05)

    async def main() -> None:
        await asyncio.gather(in_block("a"), in_block("b"))

    asyncio.run(main())
    log = graph.get_state(config).values["log"]
    assert sorted(log[0::3]) == ["a", "b"] and len(log) == 6


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

    result.done = lambda: bool(out)  # type: ignore[attr-defined]
    return result


def _one_node(saver, name: str, node):
    """A graph of one node, ``START -> name -> END``, on ``saver``."""
    builder = StateGraph(State)
    builder.add_node(name, node)
    builder.add_edge(GRAPH_START, name)
    builder.add_edge(name, END)
    return builder.compile(checkpointer=saver)


def _linear(graph, config) -> bool:
    """Whether the history is one line: each checkpoint's parent is the one listed right after it."""
    history = list(graph.get_state_history(config))
    parents = [s.parent_config["configurable"]["checkpoint_id"] if s.parent_config else None for s in history]
    return parents == [s.config["configurable"]["checkpoint_id"] for s in history][1:] + [None]


# -- found by hostile testing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_step_of_several_tasks_and_a_send_fan_out_run_inside_a_block(saver, durability) -> None:
    """LangGraph writes a finished task's results from its future's done-callback, outside the block's context:
    such writes were refused as another run's (ThreadBusy inside the run's own block)."""
    from langgraph.types import Send

    builder = StateGraph(State)
    builder.add_node("a", lambda state: {"log": ["a"]})
    builder.add_node("b", lambda state: {"log": ["b"]})
    builder.add_node("each", lambda item: {"log": [item["x"]]})
    builder.add_edge(GRAPH_START, "a")
    builder.add_edge(GRAPH_START, "b")
    builder.add_conditional_edges("a", lambda state: [Send("each", {"x": x}) for x in ("x1", "x2", "x3")], ["each"])
    builder.add_edge("b", END)
    builder.add_edge("each", END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "par"}}
    for _ in range(3):
        with saver.hold("par", wait=timedelta(seconds=10)):
            graph.invoke({"log": ["in"]}, config, durability=durability)
    log = graph.get_state(config).values["log"]
    assert len(log) == 18 and sorted(log[:6]) == ["a", "b", "in", "x1", "x2", "x3"]
    assert _linear(graph, config)


def test_a_block_cancelled_while_it_waits_for_its_turn_leaves_nothing_held(saver) -> None:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "t"}}

    async def main() -> None:
        first_in, release = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with saver.ahold("t", wait=timedelta(seconds=10)):
                first_in.set()
                await release.wait()
                await graph.ainvoke({"log": ["r1"]}, config)

        async def second() -> None:
            async with saver.ahold("t", wait=timedelta(seconds=10)):
                await graph.ainvoke({"log": ["r2"]}, config)

        running = asyncio.create_task(first())
        await first_in.wait()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(second(), 0.3)  # a client that went away while waiting
        release.set()
        await asyncio.wait_for(running, 30)
        async with saver.ahold("t", wait=timedelta(seconds=5)):  # the next request of the conversation
            await graph.ainvoke({"log": ["r3"]}, config)
        await asyncio.wait_for(graph.ainvoke({"log": ["r4"]}, config), 30)  # and one without a block

    asyncio.run(main())
    log = graph.get_state(config).values["log"]
    assert [entry for entry in log if entry.startswith("r")] == ["r1", "r3", "r4"]


def test_a_block_cancelled_while_it_claims_releases_the_claim_once_it_is_taken(store) -> None:
    saver = ThreadloomSaver(store, idle_release=timedelta(seconds=60))
    other = ThreadloomSaver(store, idle_release=timedelta(seconds=60))
    try:
        _put(other, "t")  # another host's run holds the thread: the block waits for its claim

        async def main() -> None:
            async def block() -> None:
                async with saver.ahold("t", wait=timedelta(seconds=10)):
                    pass

            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(block(), 0.3)

        asyncio.run(main())
        other.close()  # the other host's run ends
        time.sleep(0.3)
        with saver.hold("t", wait=timedelta(seconds=5)):  # the cancelled block kept neither the turn nor a claim
            pass
        third = ThreadloomSaver(store)
        try:
            with third.hold("t", wait=timedelta(seconds=5)):
                pass
        finally:
            third.close()
    finally:
        other.close()
        saver.close()


def test_more_waiting_async_blocks_than_the_savers_workers_all_get_their_turn(saver) -> None:
    """A block waiting for its turn held one of the saver's 4 pool threads: with 5 requests the running block's own
    calls queued behind the waiters, and every waiter timed out."""
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "conv"}}

    async def request(index: int) -> str:
        async with saver.ahold("conv", wait=timedelta(seconds=30)):
            await graph.ainvoke({"log": [f"r{index}"]}, config)
        return "ok"

    async def main() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(request(i) for i in range(8))), 60)

    assert asyncio.run(main()) == ["ok"] * 8
    assert len(graph.get_state(config).values["log"]) == 24
    assert _linear(graph, config)


def test_a_block_ended_by_another_task_lets_the_next_block_begin(saver) -> None:
    """A streaming endpoint's generator closed by another task (a client that went away): the block's end raised
    in resetting its context and kept the turn and the claim for good."""
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "t"}}

    async def main() -> None:
        async def stream():
            async with saver.ahold("t", wait=timedelta(seconds=5)):
                async for chunk in graph.astream({"log": ["one"]}, config):
                    yield chunk

        generator = stream()
        await generator.__anext__()
        await asyncio.create_task(generator.aclose())
        # LangGraph may still be storing what the cancelled run wrote: let it land (the next run reads after it)
        last, still = None, 0
        while still < 5:
            await asyncio.sleep(0.05)
            now = await saver.aget_tuple(config)
            current = now.checkpoint["id"] if now is not None else None
            last, still = current, (still + 1 if current == last else 0)

        async def next_request() -> None:
            async with saver.ahold("t", wait=timedelta(seconds=5)):
                await graph.ainvoke({"log": ["next"]}, config)

        await asyncio.wait_for(asyncio.create_task(next_request(), context=contextvars.Context()), 30)

    asyncio.run(main())
    assert graph.get_state(config).values["log"][-3:] == ["next", "first", "second"]


def test_close_ends_a_block_waiting_for_its_turn_at_once(saver) -> None:
    entered = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with saver.hold("t"):
            entered.set()
            release.wait(30)

    runner = threading.Thread(target=holder)
    runner.start()
    assert entered.wait(30)
    waiter = _in_thread_async(lambda: saver.hold("t", wait=timedelta(seconds=20)).__enter__())
    time.sleep(0.2)
    began = time.monotonic()
    saver.close()
    kind, error = waiter()
    assert kind == "error" and isinstance(error, StoreClosed), error
    assert time.monotonic() - began < 10  # not after the whole wait
    release.set()
    runner.join(30)


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_a_block_begun_inside_a_run_without_one_leaves_the_runs_claim_to_it(saver, durability) -> None:
    """The block took over the run's claim and released it at its end, under the run's writes still coming."""

    def node(state: State) -> State:
        with saver.hold("nest", wait=timedelta(seconds=5)):  # a node of a run that began outside any block
            pass
        return {"log": ["n"]}

    graph = _one_node(saver, "n", node)
    config = {"configurable": {"thread_id": "nest"}}
    for label in ("x", "y", "z"):
        graph.invoke({"log": [label]}, config, durability=durability)
    assert graph.get_state(config).values["log"] == ["x", "n", "y", "n", "z", "n"]
    assert _linear(graph, config)


def test_a_conversation_goes_on_after_its_last_run_is_removed_and_starts_again_after_all_are(saver) -> None:
    """A saver-side rule judging a run by what it read once left a thread refused for good here: the read skips a
    removed run's checkpoints, the thread's latest does not (found by hostile testing of a design not kept)."""
    graph = _one_node(saver, "n", lambda state: {"log": ["n"]})

    def config(thread: str, run: str | None = None) -> dict:
        return {"configurable": {"thread_id": thread, **({"run_id": run} if run else {})}}

    graph.invoke({"log": ["a"]}, config("t", "run-1"))
    graph.invoke({"log": ["b"]}, config("t", "run-2"))
    saver.delete_for_runs(["run-2"])
    assert graph.invoke({"log": ["c"]}, config("t"))["log"] == ["a", "n", "c", "n"]
    graph.invoke({"log": ["d"]}, config("u", "run-3"))
    saver.delete_for_runs(["run-3"])
    assert graph.invoke({"log": ["e"]}, config("u"))["log"] == ["e", "n"]


def test_removing_the_run_a_conversation_was_recorded_under_leaves_its_next_run_visible(saver) -> None:
    """Found by hostile testing: a checkpoint whose metadata names no run is recorded under the saver's hold, and
    removing that run hid every later checkpoint written under the same hold too (``get_state`` showed ``{}`` after
    the next run returned)."""
    graph = _one_node(saver, "n", lambda state: {"log": ["n"]})
    config = {"configurable": {"thread_id": "unnamed"}}
    graph.invoke({"log": ["x"]}, config)
    run = saver.store.latest("unnamed").checkpoint.run_id
    saver.delete_for_runs([run])
    assert graph.get_state(config).values == {}
    assert graph.invoke({"log": ["w"]}, config) == {"log": ["w", "n"]}
    assert graph.get_state(config).values == {"log": ["w", "n"]}
    assert [s.values for s in graph.get_state_history(config)] == [{"log": ["w", "n"]}, {"log": ["w"]}, {"log": []}]
