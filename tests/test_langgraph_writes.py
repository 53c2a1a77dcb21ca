"""Every checkpoint's pending writes, as LangGraph's own saver returns them (README "LangGraph", pending writes).

The store keeps pending writes for a thread's latest checkpoint only; the saver keeps each earlier checkpoint's in
the checkpoint after it. ``list`` and ``get_tuple`` of an earlier checkpoint must return what LangGraph's
``InMemorySaver`` returns for the same run, and time travel from an earlier checkpoint must replay as it does
there. Over memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from structlog.testing import capture_logs

from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing.harness import CountingCheckpointer


@pytest.fixture
def store(each_store):
    return each_store


class _State(TypedDict, total=False):
    left: int
    log: Annotated[list[str], operator.add]
    answer: str


def _graph(checkpointer: Any):
    """A loop that fans out to two nodes each round, then asks for approval (``interrupt``)."""

    def plan(state: _State) -> _State:
        return {"left": state["left"] - 1, "log": [f"plan{state['left']}"]}

    def left(state: _State) -> _State:
        return {"log": [f"left{state['left']}"]}

    def right(state: _State) -> _State:
        return {"log": [f"right{state['left']}"]}

    def approve(state: _State) -> _State:
        return {"answer": interrupt({"question": "approve?", "seen": len(state["log"])})}

    graph = StateGraph(_State)
    graph.add_node("plan", plan)
    graph.add_node("left", left)
    graph.add_node("right", right)
    graph.add_node("approve", approve)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "left")
    graph.add_edge("plan", "right")
    graph.add_edge(["left", "right"], "approve")
    graph.add_conditional_edges("approve", lambda s: "plan" if s["left"] > 0 else END, ["plan", END])
    return graph.compile(checkpointer=checkpointer)


def _ids_out(text: str) -> str:
    return re.sub(r"id='[0-9a-f]+'", "id=…", text)


def _writes(item: Any) -> list[tuple[str, str]]:
    """A tuple's pending writes as (channel, value) pairs, in an order that does not depend on task ids (an
    interrupt's id is derived from ids that differ between savers)."""
    return sorted(
        (channel, _ids_out(repr(value))) for _task, channel, value in item.pending_writes
    )


def _view(saver: Any, config: dict) -> list[tuple[Any, str, list[tuple[str, str]]]]:
    return [(t.metadata["step"], t.metadata["source"], _writes(t)) for t in saver.list(config)]


def _allowing_dropped(ours: Any, config: dict, logs: list[dict], expected: list) -> list:
    """LangGraph's view ``expected`` as ours may hold it: a write that reached our saver two or more checkpoints
    after its own is accepted and not kept (README "LangGraph", Limits; a ``langgraph.late_writes`` debug line).
    LangGraph's default durability sends a run's input writes after its next checkpoints now and then, on a quiet
    machine too. Where our saver logged such a drop, our checkpoint's writes must be a subset of LangGraph's, and
    count as the expected ones; everywhere else the views must agree exactly."""
    dropped = {entry["checkpoint_id"] for entry in logs if entry["event"] == "langgraph.late_writes"}
    items = list(ours.list(config))
    assert len(items) == len(expected)
    adjusted = []
    for item, (step, source, theirs) in zip(items, expected, strict=True):
        if item.config["configurable"]["checkpoint_id"] in dropped:
            mine = _writes(item)
            assert set(mine) <= set(theirs), (step, source, mine, theirs)
            theirs = mine
        adjusted.append((step, source, theirs))
    return adjusted


def _run(saver: Any, thread: str) -> dict:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"left": 2, "log": []}, config)
    graph.invoke(Command(resume="yes"), config)
    graph.invoke(Command(resume="yes"), config)
    return config


def test_list_and_get_tuple_return_every_checkpoints_writes_as_langgraph_does(store) -> None:
    theirs = InMemorySaver()
    with ThreadloomSaver(store) as ours:
        with capture_logs() as logs:
            config = _run(ours, "t")
        _run(theirs, "t")
        mine, expected = _view(ours, config), _allowing_dropped(ours, config, logs, _view(theirs, config))
        assert mine == expected
        assert sum(1 for _step, _source, writes in mine[1:] if writes) >= 6  # earlier checkpoints hold writes
        for item in ours.list(config):  # get_tuple of each checkpoint id agrees with list
            assert _writes(ours.get_tuple(item.config)) == _writes(item)
        for before in list(ours.list(config))[1:4]:  # and a listing before a checkpoint
            below = [(t.metadata["step"], _writes(t)) for t in ours.list(config, before=before.config)]
            assert below == [(step, writes) for step, _source, writes in expected if step < before.metadata["step"]]
        looped = [(t.metadata["step"], _writes(t)) for t in ours.list(config, filter={"source": "loop"})]
        assert looped == [(step, writes) for step, source, writes in expected if source == "loop"]


def test_time_travel_from_an_earlier_checkpoint_replays_its_writes_as_langgraph_does(store) -> None:
    theirs = InMemorySaver()
    with ThreadloomSaver(store) as ours:
        results, views, logs = [], [], []
        for saver in (ours, theirs):
            with capture_logs() as captured:
                config = _run(saver, "travel")
            logs.extend(captured)
            graph = _graph(saver)
            # the checkpoint where the first fan-out ran: its two tasks' writes are its pending writes
            earlier = next(t for t in saver.list(config) if t.metadata["step"] == 1)
            assert sorted(v for _task, channel, v in earlier.pending_writes if channel == "log") == [
                ["left1"], ["right1"]
            ]  # fmt: skip
            with capture_logs() as captured:
                first = graph.invoke(None, earlier.config)
                second = graph.invoke(Command(resume="again"), config)
            logs.extend(captured)
            results.append(_ids_out(repr((first, second, graph.get_state(config).values))))
            views.append(_view(saver, config))
        assert results[0] == results[1]
        assert views[0] == _allowing_dropped(ours, config, logs, views[1])
        assert "right1" in results[0]


def _put(saver: Any, thread: str, parent: dict | None, step: int) -> dict:
    config = generate_config(thread)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values={"n": step}, channel_versions={"n": step + 1})
    return saver.put(config, checkpoint, generate_metadata(step=step), {"n": step + 1})



def test_an_earlier_checkpoints_writes_cost_a_bounded_search_and_pages_carry_them() -> None:
    store = CountingCheckpointer(InMemoryCheckpointer())
    with ThreadloomSaver(store) as saver:
        configs, parent = [], None
        for step in range(1200):
            parent = _put(saver, "deep", parent, step)
            saver.put_writes(parent, [("n", f"w{step}"), ("m", step)], f"task-{step}")
            configs.append(parent)
        store.calls.clear()
        assert _writes(saver.get_tuple(configs[-2])) == [("m", "1198"), ("n", "'w1198'")]
        assert store.calls == Counter({"latest": 1, "checkpoint": 1, "effect": 1})  # the latest carries them
        store.calls.clear()
        assert _writes(saver.get_tuple(configs[10])) == [("m", "10"), ("n", "'w10'")]
        # two searches (the checkpoint after it, which carries its writes, and the one after that, which carries
        # the late ones), each over the 1189 checkpoints above it: two calls of at most 1000
        assert store.calls["search_history"] == 4
        store.calls.clear()
        listed = list(saver.list(generate_config("deep"), limit=150))
        assert [_writes(t) for t in listed] == [[("m", str(s)), ("n", f"'w{s}'")] for s in range(1199, 1049, -1)]
        assert store.calls["search_history"] == 0  # a page's checkpoints carry each other's writes
