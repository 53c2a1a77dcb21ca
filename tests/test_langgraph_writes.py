"""Every checkpoint's pending writes, as LangGraph's own saver returns them (README "LangGraph", pending writes).

The store keeps pending writes for a thread's latest checkpoint only; the saver keeps each earlier checkpoint's in
the checkpoint after it. ``list`` and ``get_tuple`` of an earlier checkpoint must return what LangGraph's
``InMemorySaver`` returns for the same run, and time travel from an earlier checkpoint must replay as it does
there. Over memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import operator
import random
import re
import sqlite3
from collections import Counter
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from structlog.testing import capture_logs

from threadloom import CheckpointConflict, ThreadBusy
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


def _no_write_dropped(logs: list[dict]) -> None:
    """Our saver kept every write LangGraph sent: none was reported dropped (late or early)."""
    dropped = [e for e in logs if e["event"] in ("langgraph.late_writes", "langgraph.early_writes_dropped")]
    assert dropped == []


def _run(saver: Any, thread: str) -> dict:
    graph = _graph(saver)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"left": 2, "log": []}, config)
    graph.invoke(Command(resume="yes"), config)
    graph.invoke(Command(resume="yes"), config)
    return config


@pytest.fixture(params=["InMemorySaver", "SqliteSaver"])
def theirs(request):
    """LangGraph's own saver, fed the same graph: its in-memory one, or SQLite's (in memory)."""
    if request.param == "InMemorySaver":
        yield InMemorySaver()
        return
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        yield SqliteSaver(connection)
    finally:
        connection.close()


class _Lagging(ThreadloomSaver):
    """Our saver, receiving each ``put_writes`` ``lag`` checkpoints after LangGraph sent it, as LangGraph's default
    durability sometimes delivers a run's input writes (its background executor does not order them with the
    checkpoints); :meth:`flush` delivers what is still held back."""

    def __init__(self, store: Any, lag: int) -> None:
        super().__init__(store)
        self.lag = lag
        self.held: list[list[Any]] = []  # [puts still to wait, args] in the order sent

    def put(self, config, checkpoint, metadata, new_versions):
        stored = super().put(config, checkpoint, metadata, new_versions)
        for entry in self.held:
            entry[0] -= 1
        while self.held and self.held[0][0] <= 0:
            super().put_writes(*self.held.pop(0)[1])
        return stored

    def put_writes(self, config, writes, task_id, task_path=""):
        self.held.append([self.lag, (config, writes, task_id, task_path)])

    def flush(self) -> None:
        while self.held:
            super().put_writes(*self.held.pop(0)[1])


def _check_as_langgraph(ours: Any, config: dict, expected: list) -> None:
    """Our saver's ``list``, ``get_tuple`` of each checkpoint, ``list`` before a checkpoint and with a filter all
    give the writes LangGraph's saver gives (``expected``: its ``_view``)."""
    assert _view(ours, config) == expected
    for item in ours.list(config):  # get_tuple of each checkpoint id agrees with list
        assert _writes(ours.get_tuple(item.config)) == _writes(item)
    for before in list(ours.list(config))[1:6]:  # and a listing before a checkpoint
        below = [(t.metadata["step"], _writes(t)) for t in ours.list(config, before=before.config)]
        assert below == [(step, writes) for step, _source, writes in expected if step < before.metadata["step"]]
    looped = [(t.metadata["step"], _writes(t)) for t in ours.list(config, filter={"source": "loop"})]
    assert looped == [(step, writes) for step, source, writes in expected if source == "loop"]


def test_list_and_get_tuple_return_every_checkpoints_writes_as_langgraph_does(store, theirs) -> None:
    with capture_logs() as logs:
        with ThreadloomSaver(store) as ours:
            config = _run(ours, "t")
            _run(theirs, "t")
            expected = _view(theirs, config)
            assert sum(1 for _step, _source, writes in expected[1:] if writes) >= 6  # earlier ones hold writes
            _check_as_langgraph(ours, config, expected)
    _no_write_dropped(logs)


@pytest.mark.parametrize("lag", [2, 5])
def test_writes_that_reach_the_saver_checkpoints_late_are_kept_as_langgraph_keeps_them(store, theirs, lag) -> None:
    with capture_logs() as logs:
        with _Lagging(store, lag) as ours:
            graph, config = _graph(ours), {"configurable": {"thread_id": "late"}}
            for request in ({"left": 2, "log": []}, Command(resume="yes"), Command(resume="yes")):
                graph.invoke(request, config)
                ours.flush()  # the run's writes still on their way arrive before the next run reads the thread
            _run(theirs, "late")
            _check_as_langgraph(ours, config, _view(theirs, config))
    _no_write_dropped(logs)


def test_time_travel_from_an_earlier_checkpoint_replays_its_writes_as_langgraph_does(store, theirs) -> None:
    with capture_logs() as logs:
        with ThreadloomSaver(store) as ours:
            results, views = [], []
            for saver in (ours, theirs):
                config = _run(saver, "travel")
                graph = _graph(saver)
                # the checkpoint where the first fan-out ran: its two tasks' writes are its pending writes
                earlier = next(t for t in saver.list(config) if t.metadata["step"] == 1)
                assert sorted(v for _task, channel, v in earlier.pending_writes if channel == "log") == [
                    ["left1"], ["right1"]
                ]  # fmt: skip
                first = graph.invoke(None, earlier.config)
                second = graph.invoke(Command(resume="again"), config)
                results.append(_ids_out(repr((first, second, graph.get_state(config).values))))
                views.append(_view(saver, config))
            assert results[0] == results[1]
            assert views[0] == views[1]
            assert "right1" in results[0]
    _no_write_dropped(logs)


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
        # one search (the checkpoint after it, which carries its writes) over the 1189 checkpoints above it: two
        # calls of at most 1000; no checkpoint carries late writes (the latest says so), so none is searched for
        assert store.calls["search_history"] == 2
        store.calls.clear()
        listed = list(saver.list(generate_config("deep"), limit=150))
        assert [_writes(t) for t in listed] == [[("m", str(s)), ("n", f"'w{s}'")] for s in range(1199, 1049, -1)]
        assert store.calls["search_history"] == 0  # a page's checkpoints carry each other's writes
        store.calls.clear()
        below = list(saver.list(generate_config("deep"), before=configs[600], limit=10))
        assert [_writes(t) for t in below] == [[("m", str(s)), ("n", f"'w{s}'")] for s in range(599, 589, -1)]
        # before and the latest read, the one after before searched for (599 above it: one call), nothing more
        assert (store.calls["checkpoint"], store.calls["latest"], store.calls["search_history"]) == (1, 1, 1)


def test_late_writes_of_an_earlier_checkpoint_cost_at_most_two_more_calls() -> None:
    store = CountingCheckpointer(InMemoryCheckpointer())
    with ThreadloomSaver(store, idle_release=timedelta(seconds=60)) as saver:
        configs: list[dict] = []
        parent = None
        for step in range(1200):
            parent = _put(saver, "deep", parent, step)
            configs.append(parent)
            saver.put_writes(parent, [("n", f"w{step}")], f"task-{step}")
            if step >= 5:  # every checkpoint also gets writes five checkpoints late, and one 64 late
                saver.put_writes(configs[step - 5], [("late", step - 5)], f"late-{step - 5}")
            if step >= 64 and step % 100 == 0:
                saver.put_writes(configs[step - 64], [("later", step - 64)], f"later-{step - 64}")

        def expected(s: int) -> list[tuple[str, str]]:
            found = [("late", str(s)), ("n", f"'w{s}'")] if s < 1195 else [("n", f"'w{s}'")]
            return sorted(found + ([("later", str(s))] if (s + 64) % 100 == 0 and s + 64 < 1200 else []))

        for index in (10, 36, 600, 1100, 1180, 1198):
            store.calls.clear()
            assert _writes(saver.get_tuple(configs[index])) == expected(index), index
            # the search for the checkpoint after it (one call per 1000 examined) and at most two for the late
            # writes near it
            assert store.calls["search_history"] <= (1200 - index) // 1000 + 1 + 2, (index, store.calls)
        store.calls.clear()
        listed = list(saver.list(generate_config("deep"), limit=300))
        assert [_writes(t) for t in listed] == [expected(s) for s in range(1199, 899, -1)]
        assert store.calls["search_history"] == 0  # a page's checkpoints carry each other's writes
        store.calls.clear()
        below = list(saver.list(generate_config("deep"), before=configs[1000], limit=100))
        assert [_writes(t) for t in below] == [expected(s) for s in range(999, 899, -1)]
        # the one after before (one call over the 199 above it), and the late writes near it (one window)
        assert store.calls["search_history"] == 2
        filtered = list(saver.list(generate_config("deep"), filter={"step": 36}))
        assert [_writes(t) for t in filtered] == [expected(36)]


def test_a_write_two_or_more_checkpoints_late_is_kept_for_its_checkpoint(store) -> None:
    """put ckpt1, ckpt2, ckpt3, then put_writes naming ckpt1: get_tuple(ckpt1) has them (up to the bound)."""
    with capture_logs() as logs:
        with ThreadloomSaver(store, idle_release=timedelta(seconds=60)) as saver:
            first = _put(saver, "t", None, 0)
            second = _put(saver, "t", first, 1)
            third = _put(saver, "t", second, 2)
            saver.put_writes(first, [("n", "late"), ("m", 2)], "task-1")
            reader = ThreadloomSaver(store)
            assert reader.get_tuple(first).pending_writes == [("task-1", "n", "late"), ("task-1", "m", 2)]
            assert reader.get_tuple(second).pending_writes == []
            assert reader.get_tuple(third).pending_writes == []
            configs = [first, second, third]
            for step in range(3, 70):
                configs.append(_put(saver, "t", configs[-1], step))
            saver.put_writes(first, [("n", "later")], "task-2")  # 69 checkpoints late: past the bound
            saver.put_writes(configs[5], [("n", "64 late")], "task-3")  # 64 late: kept
            saver.put_writes(second, [("n", "68 late")], "task-4")  # not kept
            saver.put_writes(configs[6], [("n", "63 late")], "task-5")
            _put(saver, "t", configs[-1], 70)
            assert reader.get_tuple(first).pending_writes == [("task-1", "n", "late"), ("task-1", "m", 2)]
            assert reader.get_tuple(configs[5]).pending_writes == [("task-3", "n", "64 late")]
            assert reader.get_tuple(configs[6]).pending_writes == [("task-5", "n", "63 late")]
            listed = {t.checkpoint["id"]: t.pending_writes for t in reader.list(generate_config("t"))}
            assert listed[first["configurable"]["checkpoint_id"]] == [("task-1", "n", "late"), ("task-1", "m", 2)]
            assert listed[configs[5]["configurable"]["checkpoint_id"]] == [("task-3", "n", "64 late")]
            assert sum(len(writes) for writes in listed.values()) == 4
            reader.close()
    dropped = {(e["checkpoint_id"], e["writes"]) for e in logs if e["event"] == "langgraph.late_writes"}
    assert dropped == {(first["configurable"]["checkpoint_id"], 1), (second["configurable"]["checkpoint_id"], 1)}


def test_a_tasks_second_execution_never_mixes_with_the_first_when_late(store) -> None:
    with ThreadloomSaver(store, idle_release=timedelta(seconds=60)) as saver:
        first = _put(saver, "t", None, 0)
        saver.put_writes(first, [("x", 1)], "task-1")
        configs = [first]
        for step in range(1, 4):
            configs.append(_put(saver, "t", configs[-1], step))
        saver.put_writes(first, [("x", 10), ("y", 20)], "task-1")  # a second execution, late: left out
        saver.put_writes(first, [("x", 5), ("y", 6)], "task-2")  # a task whose first execution is late
        configs.append(_put(saver, "t", configs[-1], 4))
        saver.put_writes(first, [("x", 50)], "task-2")  # its second execution, later still: left out
        saver.put_writes(first, [("__error__", "boom")], "task-3")
        configs.append(_put(saver, "t", configs[-1], 5))
        saver.put_writes(first, [("__error__", "boom again")], "task-3")  # a special write replaces its own
        expected = [("task-1", "x", 1), ("task-2", "x", 5), ("task-2", "y", 6), ("task-3", "__error__", "boom again")]
        assert sorted(saver.get_tuple(first).pending_writes) == expected
        listed = [t.pending_writes for t in saver.list(generate_config("t"))]
        assert sorted(listed[-1]) == expected
        assert listed[:-1] == [[]] * 5


def test_another_runs_late_write_is_refused(tmp_path) -> None:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    first_store, second_store = (SqliteCheckpointer.open(tmp_path / "two.db") for _ in range(2))
    a = ThreadloomSaver(first_store, idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(second_store)
    try:
        c1 = _put(a, "t", None, 0)
        c2 = _put(a, "t", c1, 1)
        c3 = _put(a, "t", c2, 2)
        with pytest.raises(ThreadBusy):
            b.put_writes(c1, [("n", "theirs")], "task-b")  # another host's run: refused, nothing written
        a.put_writes(c1, [("n", "mine")], "task-a")
        assert b.get_tuple(c1).pending_writes == [("task-a", "n", "mine")]  # b reads the thread at c3
        _put(a, "t", c3, 3)
        a.close()
        with pytest.raises(CheckpointConflict):  # b's run read the thread before a's run went on: refused
            b.put_writes(c1, [("n", "stale")], "task-b")
        with ThreadloomSaver(first_store) as again:
            with pytest.raises(ThreadBusy), again.hold("t"):  # another run of a's host holds it: b's refused
                b.put_writes(c1, [("n", "theirs")], "task-b")
            assert again.get_tuple(c1).pending_writes == [("task-a", "n", "mine")]
    finally:
        a.close()
        b.close()
        first_store.close()
        second_store.close()


@pytest.mark.parametrize("seed", range(3))
def test_late_writes_of_any_lag_are_read_back_by_every_read(seed) -> None:
    """A model check on a deep thread: writes 1 to 64 checkpoints late are kept, later ones are not; get_tuple,
    list, list before a checkpoint and filtered lists all return what the model holds."""
    rnd = random.Random(seed)
    store = InMemoryCheckpointer()
    expected: dict[int, list[tuple[str, int]]] = {}
    with ThreadloomSaver(store, idle_release=timedelta(seconds=600)) as saver:
        configs: list[dict] = []
        due: list[tuple[int, int, int]] = []  # (step it is sent at, its checkpoint, lag)
        parent = None
        for step in range(1100):
            config = generate_config("model")
            if parent is not None:
                config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            checkpoint = generate_checkpoint(channel_values={"n": step}, channel_versions={"n": step + 1})
            parent = saver.put(config, checkpoint, generate_metadata(step=step, mod=step % 7), {"n": step + 1})
            configs.append(parent)
            expected[step] = []
            if rnd.random() < 0.5:
                saver.put_writes(parent, [("own", step)], f"own-{step}")
                expected[step].append(("own", step))
            if rnd.random() < 0.2:
                lag = rnd.choice([1, 2, 3, 10, 64, 65, 100])
                due.append((step + lag, step, lag))
            for entry in [entry for entry in due if entry[0] == step]:
                due.remove(entry)
                _at, target, lag = entry
                saver.put_writes(configs[target], [("late", lag)], f"late-{target}")
                if lag <= 64:
                    expected[target].append(("late", lag))
        index = {c["configurable"]["checkpoint_id"]: i for i, c in enumerate(configs)}

        def view(items: Any) -> dict[int, list[tuple[str, int]]]:
            return {index[t.checkpoint["id"]]: sorted((ch, v) for _task, ch, v in t.pending_writes) for t in items}

        model = {i: sorted(writes) for i, writes in expected.items()}
        for i in rnd.sample(range(1100), 30):
            assert view([saver.get_tuple(configs[i])]) == {i: model[i]}
        assert view(saver.list(generate_config("model"))) == model
        for before in [*rnd.sample(range(1100), 5), 1099]:
            listed = view(saver.list(generate_config("model"), before=configs[before], limit=100))
            assert listed == {i: model[i] for i in range(max(0, before - 100), before)}
        for mod in range(2):
            before = rnd.randrange(1100)
            assert view(saver.list(generate_config("model"), filter={"mod": mod})) == {
                i: writes for i, writes in model.items() if i % 7 == mod
            }
            assert view(saver.list(generate_config("model"), filter={"mod": mod}, before=configs[before])) == {
                i: writes for i, writes in model.items() if i % 7 == mod and i < before
            }


def test_aput_and_aput_writes_store_the_values_as_they_were_when_called(store) -> None:
    """Found by hostile testing: LangGraph's checkpoint shares a join channel's live set of the nodes seen, and may
    add to it right after it calls ``aput``; the saver serialized on a thread of its pool, later, so a parallel join
    replayed as if its last branch had already run. The async methods now encode in the call, as LangGraph's own
    savers serialize in theirs."""
    import asyncio

    saver = ThreadloomSaver(store)
    seen = {"b1"}
    values = ["v1"]
    config = generate_config("frozen")
    checkpoint = generate_checkpoint(channel_values={"join:b1+b2:c": seen}, channel_versions={"join:b1+b2:c": 1})

    async def main() -> dict:
        stored = await _changed_after_call(
            saver.aput(config, checkpoint, generate_metadata(), {"join:b1+b2:c": 1}), lambda: seen.add("b2"))
        await _changed_after_call(saver.aput_writes(stored, [("log", values)], "task-1"), lambda: values.append("v2"))
        return stored

    try:
        stored = asyncio.run(main())
        found = saver.get_tuple(stored)
        assert found.checkpoint["channel_values"]["join:b1+b2:c"] == {"b1"}
        assert [w[1:] for w in found.pending_writes] == [("log", ["v1"])]
    finally:
        saver.close()


async def _changed_after_call(call: Any, change: Any) -> Any:
    """Runs the coroutine ``call`` up to its first wait, makes ``change`` (as LangGraph's loop may go on meanwhile),
    then waits for it."""
    import asyncio

    task = asyncio.ensure_future(call)
    await asyncio.sleep(0)  # the task runs up to its first await: the hop to the saver's pool
    change()
    return await task
