"""The hazards of LangGraph's stock savers, each refused by ThreadloomSaver: two savers (two hosts) over one storage.

* a second host's concurrent run fails with ThreadBusy (or waits when asked) instead of forking the history;
* a paused writer whose claim was taken over gets StaleClaim and writes nothing;
* a thread deleted during a run is not brought back by the run's next write;
* a task executed twice never mixes its writes with the other execution's;
* a skewed clock never hides a step: the store orders the history, not the checkpoint ids' timestamps;
* a run's own early and late writes are accepted, another run's are refused.

In one process over memory (a manual clock expires claims), SQLite (two connections to one file) and PostgreSQL
(two stores on one schema); and in two OS processes for SQLite and PostgreSQL, the first paused with SIGSTOP.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from threadloom import CheckpointConflict, StaleClaim, ThreadBusy, ValidationError
from threadloom.domain.clock import ManualClock
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.harness import START

AGENT = Path(__file__).with_name("langgraph_agent.py")


def _agent():
    spec = importlib.util.spec_from_file_location("langgraph_agent", AGENT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("langgraph_agent", module)
    spec.loader.exec_module(module)
    return sys.modules["langgraph_agent"]


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_stores(request, tmp_path):
    """Two stores over one storage (memory: one store, it is the storage)."""
    if request.param == "memory":
        store = InMemoryCheckpointer()
        yield store, store
        store.close()
    elif request.param == "sqlite":
        first, second = SqliteCheckpointer.open(tmp_path / "two.db"), SqliteCheckpointer.open(tmp_path / "two.db")
        yield first, second
        first.close()
        second.close()
    else:
        from threadloom.testing.postgres_harness import PgHarness

        harness = PgHarness()
        try:
            yield harness.open_pg(), harness.open_pg()
        finally:
            harness.cleanup()


def _put(saver, thread, parent=None, *, checkpoint_id=None, step=0, ns=""):
    config = generate_config(thread, checkpoint_ns=ns)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(checkpoint_id=checkpoint_id, channel_values={"n": step},
                                     channel_versions={"n": step + 1})
    return saver.put(config, checkpoint, generate_metadata(step=step), {"n": step + 1})


def _wait_released(store, thread) -> None:
    """Waits until no claim holds ``thread`` (a saver's idle hold was released)."""
    deadline = time.monotonic() + 10
    while store.current_claim(thread) is not None:
        assert time.monotonic() < deadline, "the idle hold was never released"
        time.sleep(0.01)


def _refused_on_top_of(saver, thread, parent, new) -> None:
    """A checkpoint continuing ``parent`` (a run the saver's delete stopped) is refused: ``thread`` holds ``new``
    only."""
    with pytest.raises(CheckpointConflict):
        _put(saver, thread, parent, step=1)
    assert _ids(saver, thread) == [new["configurable"]["checkpoint_id"]]


def _ids(saver, thread):
    return [t.checkpoint["id"] for t in saver.list(generate_config(thread))]


def test_second_host_run_is_busy_then_waits(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    try:
        first = _put(a, "t1")
        with pytest.raises(ThreadBusy):
            _put(b, "t1", first, step=1)  # B's run on the thread A's run holds: refused, nothing forked
        with pytest.raises(ThreadBusy):
            b.put_writes(first, [("ch", "b")], "task-b")  # another run's writes too
        assert _ids(b, "t1") == [first["configurable"]["checkpoint_id"]]
        assert b.get_tuple(first).pending_writes == []
        # asked to wait, B gets the thread as soon as A's run ends (here: A's saver closes)
        import threading

        threading.Timer(0.3, a.close).start()
        with b.hold("t1", wait=timedelta(seconds=10)):
            second = _put(b, "t1", first, step=1)
        assert _ids(b, "t1") == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("wait", "says"),
    [(1.0, "must be a timedelta, got float"), (5, "must be a timedelta, got int"),
     (timedelta(seconds=-1), "must not be negative")],
    ids=["float-seconds", "int-seconds", "negative"],
)  # fmt: skip
def test_a_hold_wait_that_is_not_a_timedelta_of_zero_or_more_is_a_validation_error(wait, says) -> None:
    """Found by a user (on ``Subscription.get``): a number of seconds raised ``AttributeError``. Durations are
    ``timedelta`` throughout the API; ``hold``/``ahold`` refuse anything else, naming ``wait``, before claiming."""
    import asyncio

    store = InMemoryCheckpointer()
    saver = ThreadloomSaver(store)
    try:
        with pytest.raises(ValidationError) as caught, saver.hold("v1", wait=wait):
            pass
        assert caught.value.field == "wait" and says in str(caught.value)

        async def ahold() -> None:
            async with saver.ahold("v1", wait=wait):
                pass

        with pytest.raises(ValidationError) as caught:
            asyncio.run(ahold())
        assert caught.value.field == "wait" and says in str(caught.value)
        assert store.current_claim("v1") is None  # nothing was claimed
        with saver.hold("v1", wait=timedelta(0)):
            assert store.current_claim("v1") is not None
    finally:
        saver.close()
        store.close()


def test_two_executions_of_a_task_never_mix(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    try:
        stored = _put(a, "t2")
        a.put_writes(stored, [("x", 1), ("y", 2)], "task-1")
        a.put_writes(stored, [("x", 10), ("y", 20), ("z", 30)], "task-1")  # a second execution, same saver
        a.put_writes(stored, [("x", 5)], "task-2")
        a.close()  # the host ends; another host runs the same task again
        with b.hold("t2"):
            b.put_writes(stored, [("x", 100), ("z", 300)], "task-1")
            b.put_writes(stored, [("__error__", "boom")], "task-3")
            b.put_writes(stored, [("__error__", "boom again")], "task-3")  # a special write replaces its own
        writes = ThreadloomSaver(two_stores[1]).get_tuple(stored).pending_writes
        assert sorted(writes) == sorted(
            [("task-1", "x", 1), ("task-1", "y", 2), ("task-2", "x", 5), ("task-3", "__error__", "boom again")]
        )
    finally:
        a.close()
        b.close()


def test_store_orders_history_not_checkpoint_ids(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    try:
        # host A's clock runs ahead: its checkpoint id sorts after everything host B will write
        ahead = _put(a, "t3", checkpoint_id="ffffffff-ffff-6fff-8fff-ffffffffffff", step=0)
        a.close()
        with b.hold("t3"):
            behind = _put(b, "t3", ahead, checkpoint_id="00000000-0000-6000-8000-000000000001", step=1)
        reader = ThreadloomSaver(two_stores[0])
        latest = reader.get_tuple(generate_config("t3"))
        assert latest.checkpoint["id"] == behind["configurable"]["checkpoint_id"]  # B's step is not hidden
        assert latest.parent_config["configurable"]["checkpoint_id"] == ahead["configurable"]["checkpoint_id"]
        assert _ids(reader, "t3") == ["00000000-0000-6000-8000-000000000001", "ffffffff-ffff-6fff-8fff-ffffffffffff"]
        reader.close()
    finally:
        a.close()
        b.close()


def test_own_early_and_late_writes_are_accepted(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    try:
        first = _put(a, "t4")
        checkpoint = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": 2})
        early = {"configurable": {"thread_id": "t4", "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}
        a.put_writes(early, [("n", "early")], "task-early")  # before its checkpoint is stored
        config = generate_config("t4")
        config["configurable"]["checkpoint_id"] = first["configurable"]["checkpoint_id"]
        second = a.put(config, checkpoint, generate_metadata(step=1), {"n": 2})
        a.put_writes(first, [("n", "late")], "task-late")  # the run's late write for the superseded checkpoint
        reader = ThreadloomSaver(two_stores[1])
        assert reader.get_tuple(second).pending_writes == [("task-early", "n", "early")]
        assert reader.get_tuple(first).pending_writes == [("task-late", "n", "late")]  # kept for its checkpoint
        third = a.put(second, generate_checkpoint(channel_values={"n": 2}, channel_versions={"n": 3}),
                      generate_metadata(step=2), {"n": 3})
        a.put_writes(first, [("n", "later")], "task-later")  # two checkpoints late: kept for its checkpoint too
        assert [(t.checkpoint["id"], t.pending_writes) for t in reader.list(generate_config("t4"))] == [
            (third["configurable"]["checkpoint_id"], []),
            (second["configurable"]["checkpoint_id"], [("task-early", "n", "early")]),
            (first["configurable"]["checkpoint_id"], [("task-late", "n", "late"), ("task-later", "n", "later")]),
        ]
        assert reader.get_tuple(first).pending_writes == [("task-late", "n", "late"), ("task-later", "n", "later")]
        reader.close()
    finally:
        a.close()


def test_unencodable_value_is_refused_before_anything_is_written(two_stores) -> None:
    import threading

    a = ThreadloomSaver(two_stores[0])
    try:
        checkpoint = generate_checkpoint(channel_values={"lock": threading.Lock()}, channel_versions={"lock": 1})
        with pytest.raises(Exception) as refused:
            a.put(generate_config("t5"), checkpoint, generate_metadata(), {"lock": 1})
        assert type(refused.value).__name__ == "ValidationError" and "checkpoint" in str(refused.value)
        assert two_stores[0].current_claim("t5") is None and two_stores[0].latest("t5") is None
        stored = _put(a, "t5")
        with pytest.raises(Exception) as refused_write:
            a.put_writes(stored, [("ok", 1), ("bad", threading.Lock())], "task")
        assert type(refused_write.value).__name__ == "ValidationError"
        assert a.get_tuple(stored).pending_writes == []
    finally:
        a.close()


def test_paused_writer_and_delete_during_run_with_a_manual_clock() -> None:
    clock = ManualClock(START)
    store = InMemoryCheckpointer(clock=clock)
    a = ThreadloomSaver(store, ttl=timedelta(seconds=30), idle_release=timedelta(seconds=600))
    b = ThreadloomSaver(store)
    try:
        first = _put(a, "p1")
        clock.advance(timedelta(seconds=31))  # A paused past its claim's ttl (its renewal did not run)
        with b.hold("p1"):
            taken = _put(b, "p1", first, step=1)
        with pytest.raises(StaleClaim):
            _put(a, "p1", first, step=1)  # A wakes: refused, nothing written
        with pytest.raises(StaleClaim):
            a.put_writes(taken, [("n", "a")], "task-a")
        assert _ids(b, "p1") == [taken["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
        assert b.get_tuple(taken).pending_writes == []

        second = _put(a, "p2")
        clock.advance(timedelta(seconds=31))
        b.delete_thread("p2")  # deleted during A's run
        for _ in range(2):
            with pytest.raises(StaleClaim):
                _put(a, "p2", second, step=1)  # the run's next writes never bring the thread back
        assert store.latest("p2") is None and b.get_tuple(generate_config("p2")) is None
    finally:
        a.close()
        b.close()


def test_own_delete_is_not_undone_by_the_run() -> None:
    store = InMemoryCheckpointer()
    a = ThreadloomSaver(store, idle_release=timedelta(seconds=600))
    try:
        first = _put(a, "d1")
        a.delete_thread("d1")
        with pytest.raises(StaleClaim):
            _put(a, "d1", first, step=1)
        assert store.latest("d1") is None
    finally:
        a.close()


def test_own_delete_is_not_undone_by_a_run_that_read_before_it_and_had_not_written() -> None:
    """Found by hostile testing: a run with ``durability="exit"`` reads the thread, writes nothing until it ends,
    and the same saver deletes the thread meanwhile; the run's first checkpoint (naming the deleted one as its
    parent) brought the thread back with the deleted state. A read by the saver in between changes nothing; a new
    run, whose first checkpoint names no parent, begins the thread again."""
    store = InMemoryCheckpointer()
    a = ThreadloomSaver(store, idle_release=timedelta(milliseconds=1))
    try:
        first = _put(a, "d2")
        _wait_released(store, "d2")  # the run is idle: its hold is let go
        a.delete_thread("d2")  # the run read `first` before this and has not written since
        assert a.get_tuple(generate_config("d2")) is None  # e.g. a UI reading the state meanwhile
        with pytest.raises(CheckpointConflict):
            _put(a, "d2", first, step=1)
        assert store.latest("d2") is None and store.current_claim("d2") is None
        again = _put(a, "d2")  # a new run
        assert store.latest("d2").checkpoint.id == again["configurable"]["checkpoint_id"]
        _put(a, "d2", again, step=1)
    finally:
        a.close()


def test_own_delete_then_the_conversation_begins_again_at_once() -> None:
    """Found in use: deleting a conversation and starting it again on the same saver got ``StaleClaim`` until the
    deleted run had been quiet for ``idle_release``. A new run (its first checkpoint names no parent) now begins
    the thread at once, with the writes it sent before that checkpoint; the deleted run's writes stay refused."""
    store = InMemoryCheckpointer()
    a = ThreadloomSaver(store, idle_release=timedelta(seconds=600))
    try:
        first = _put(a, "d4")
        a.delete_thread("d4")
        new_id = generate_checkpoint()["id"]
        early = generate_config("d4")
        early["configurable"]["checkpoint_id"] = new_id
        a.put_writes(early, [("n", 7), ("n", 8)], "task-new")  # LangGraph may send them before the checkpoint
        again = _put(a, "d4", checkpoint_id=new_id)
        assert store.latest("d4").checkpoint.id == new_id
        assert [w[1:] for w in a.get_tuple(again).pending_writes] == [("n", 7), ("n", 8)]
        with pytest.raises(StaleClaim):
            _put(a, "d4", first, step=1)  # the deleted run's next checkpoint
        with pytest.raises(StaleClaim):
            a.put_writes(first, [("n", 9)], "task-old")  # and its late writes
        second = _put(a, "d4", again, step=1)
        assert _ids(a, "d4") == [second["configurable"]["checkpoint_id"], new_id]
    finally:
        a.close()


def test_deleted_runs_stay_refused_across_restarts_and_idle_releases() -> None:
    """Found by hostile testing: the deleted run was refused only while the new run's hold remembered it. After a
    second delete and restart, or once the new run's hold was let go idle, the first run's next checkpoint was
    stored on top of the new history, with the deleted state."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store, idle_release=timedelta(seconds=600)) as a:
        r0 = _put(a, "d6")
        r0_next = _put(a, "d6", r0, step=1)
        a.delete_thread("d6")
        r1 = _put(a, "d6")
        a.delete_thread("d6")
        r2 = _put(a, "d6")
        with pytest.raises(StaleClaim):
            _put(a, "d6", r1, step=1)  # the run the last delete stopped, while the new run's hold remembers it
        for parent in (r0, r0_next):  # the run an earlier delete stopped: refused all the same
            with pytest.raises(CheckpointConflict):
                _put(a, "d6", parent, step=2)
        assert _ids(a, "d6") == [r2["configurable"]["checkpoint_id"]]
    with ThreadloomSaver(store, idle_release=timedelta(milliseconds=1)) as b:
        old = _put(b, "d7")
        b.delete_thread("d7")
        new = _put(b, "d7")
        _wait_released(store, "d7")  # the new run is idle: its hold is let go
        _refused_on_top_of(b, "d7", old, new)
        _put(b, "d7", new, step=1)  # the new run goes on


def test_a_run_that_read_before_the_delete_stays_refused_after_a_new_run_or_a_hold_block() -> None:
    """Found by hostile testing: with no hold at the delete (the run that read the thread was quiet, as with
    ``durability="exit"``), or with the new run in a ``hold`` block, the old run's first checkpoint was stored on
    top of the new run's history."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store, idle_release=timedelta(milliseconds=1)) as a:
        read = _put(a, "d8")
        _wait_released(store, "d8")  # the run is idle: no hold at the delete
        a.delete_thread("d8")
        _refused_on_top_of(a, "d8", read, _put(a, "d8"))
    with ThreadloomSaver(store, idle_release=timedelta(seconds=600)) as b:
        old = _put(b, "d9")
        b.delete_thread("d9")
        with b.hold("d9"):
            _refused_on_top_of(b, "d9", old, _put(b, "d9"))


def test_deleting_a_deleted_thread_again_or_copying_onto_it_needs_no_quiet_wait() -> None:
    """Found by hostile testing: a second ``delete_thread``, or a ``copy_thread`` onto the thread just deleted,
    raised ``StaleClaim`` (the hold the first delete lost) until ``idle_release``; once the copy worked, the run
    continuing from it was refused (the saver still took the thread for deleted and empty)."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store, idle_release=timedelta(seconds=600)) as a:
        _put(a, "e1")
        a.delete_thread("e1")
        a.delete_thread("e1")  # nothing left: nothing to do
        source = _put(a, "e2")
        a.copy_thread("e2", "e1")
        assert _ids(a, "e1") == [source["configurable"]["checkpoint_id"]]
        following = _put(a, "e1", source, step=1)  # the restored conversation goes on
        assert _ids(a, "e1") == [following["configurable"]["checkpoint_id"], source["configurable"]["checkpoint_id"]]
        a.delete_thread("e1")
        assert store.latest("e1") is None and store.current_claim("e1") is None


def test_a_run_forking_far_back_before_the_delete_stays_refused() -> None:
    """Found by hostile testing: the saver remembered only the newest 100 deleted checkpoints, so a time travel
    from one further back, under way at the delete, wrote its state back after the conversation began again."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store, idle_release=timedelta(seconds=600)) as a:
        configs = [_put(a, "f1")]
        for step in range(1, 150):
            configs.append(_put(a, "f1", configs[-1], step=step))
        a.delete_thread("f1")
        _refused_on_top_of(a, "f1", configs[3], _put(a, "f1"))


def test_a_checkpoint_another_saver_restored_is_no_deleted_one() -> None:
    """Found by hostile testing: a saver that deleted a thread refused every fork from its history after another
    saver (host) restored it by a copy keeping the ids; a parent the thread holds is never a deleted run's."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store, idle_release=timedelta(milliseconds=1)) as a, \
            ThreadloomSaver(store, idle_release=timedelta(milliseconds=1)) as b:
        first = _put(a, "g1")
        _put(a, "g1", first, step=1)
        _wait_released(store, "g1")
        a.copy_thread("g1", "g1-archive")
        _wait_released(store, "g1-archive")
        a.delete_thread("g1")
        b.copy_thread("g1-archive", "g1")
        _wait_released(store, "g1")
        assert a.get_tuple(first) is not None  # LangGraph reads the checkpoint it travels from
        fork = _put(a, "g1", first, step=1)  # time travel from the restored first checkpoint
        assert _ids(a, "g1")[0] == fork["configurable"]["checkpoint_id"]


def test_empty_writes_still_name_a_valid_thread() -> None:
    with ThreadloomSaver(InMemoryCheckpointer()) as a:
        config = generate_config("a::ns::b")
        config["configurable"]["checkpoint_id"] = generate_checkpoint()["id"]
        with pytest.raises(ValidationError):
            a.put_writes(config, [], "task-1")


def test_own_delete_then_the_same_graph_runs_the_thread_again() -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict):
        n: int

    builder = StateGraph(S)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    store = InMemoryCheckpointer()
    saver = ThreadloomSaver(store, idle_release=timedelta(seconds=600))
    try:
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "d5"}}
        assert graph.invoke({"n": 1}, config) == {"n": 2}
        saver.delete_thread("d5")
        assert graph.invoke({"n": 10}, config) == {"n": 11}  # before: StaleClaim for idle_release
        assert [s.values for s in graph.get_state_history(config)] == [{"n": 11}, {"n": 10}, {}]
        assert graph.invoke({"n": 20}, config) == {"n": 21}
    finally:
        saver.close()


def test_subgraph_namespace_is_a_child_thread_fenced_by_the_root() -> None:
    store = InMemoryCheckpointer()
    a = ThreadloomSaver(store, idle_release=timedelta(seconds=600))
    try:
        _put(a, "s1")
        _put(a, "s1", ns="tools:abc")
        child = "s1::ns::tools:abc"
        assert store.children("s1", limit=10) == [child]
        assert store.latest(child).checkpoint.origin.parent_thread == "s1"
        a.delete_thread("s1")
        assert store.latest(child) is None and store.latest("s1") is None
    finally:
        a.close()


# -- two OS processes ----------------------------------------------------------------------------------------------


def _spawn(tmp_path: Path, store_arg: str, thread: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(AGENT), store_arg, thread, "hold"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env={**os.environ})


def _event(proc: subprocess.Popen) -> dict:
    while True:
        line = proc.stdout.readline()
        assert line, f"the child process ended early (exit {proc.wait(timeout=30)})"
        if line.startswith("{"):
            return json.loads(line)


def _two_process_hazards(tmp_path: Path, store_arg: str, saver: ThreadloomSaver) -> None:
    agent = _agent()
    graph = agent.build(saver)
    config = {"configurable": {"thread_id": "h1"}}
    host_a = _spawn(tmp_path, store_arg, "h1")
    try:
        assert _event(host_a) == {"event": "holding"}
        # host A's run holds the thread (renewing): host B's run fails loudly instead of forking
        with pytest.raises(ThreadBusy):
            graph.invoke({"log": ["host-b:concurrent"], "steps": 0}, config)
        host_a.send_signal(signal.SIGSTOP)  # A pauses; B waits for its claim (ttl 1 s) to expire, then takes over
        with saver.hold("h1", wait=timedelta(seconds=20)):
            graph.update_state(graph.get_state(config).config, {"log": ["host-b:took-over"]})
        host_a.send_signal(signal.SIGCONT)
        host_a.stdin.write("stale\n")
        host_a.stdin.flush()
        assert _event(host_a)["error"] == "StaleClaim"
        assert host_a.wait(timeout=30) == 0
    finally:
        if host_a.poll() is None:
            host_a.kill()
    logs = [snapshot.values.get("log", []) for snapshot in graph.get_state_history(config)]
    assert logs[0] == ["host-a:first", "host-b:took-over"]
    assert not any("host-a:late" in log or "host-b:concurrent" in log for log in logs)

    # a thread deleted while its run is paused stays deleted when the run writes again
    host_a = _spawn(tmp_path, store_arg, "h2")
    try:
        assert _event(host_a) == {"event": "holding"}
        host_a.send_signal(signal.SIGSTOP)
        with saver.hold("h2", wait=timedelta(seconds=20)):
            saver.delete_thread("h2")
        host_a.send_signal(signal.SIGCONT)
        host_a.stdin.write("reread\n")  # it even re-reads the (now empty) thread before writing
        host_a.stdin.flush()
        assert _event(host_a)["error"] == "StaleClaim"
        assert host_a.wait(timeout=30) == 0
    finally:
        if host_a.poll() is None:
            host_a.kill()
    assert saver.get_tuple({"configurable": {"thread_id": "h2"}}) is None
    assert saver.store.latest("h2") is None


@pytest.mark.slow
def test_two_processes_sqlite(tmp_path) -> None:
    path = tmp_path / "hosts.db"
    SqliteCheckpointer.open(path).close()
    saver = ThreadloomSaver.from_url(f"sqlite:///{path}")
    try:
        _two_process_hazards(tmp_path, f"sqlite:{path}", saver)
    finally:
        saver.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_two_processes_postgres(tmp_path, monkeypatch) -> None:
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    monkeypatch.setenv("THREADLOOM_TEST_PG", harness.dsn)
    try:
        saver = ThreadloomSaver(harness.open_pg())
        try:
            _two_process_hazards(tmp_path, f"postgres:{harness.schema}", saver)
        finally:
            saver.close()
    finally:
        harness.cleanup()


def test_a_new_hold_starts_a_new_run_after_a_delete() -> None:
    store = InMemoryCheckpointer()
    a = ThreadloomSaver(store, idle_release=timedelta(seconds=600))
    try:
        first = _put(a, "n1")
        a.delete_thread("n1")
        with pytest.raises(StaleClaim):
            _put(a, "n1", first, step=1)
        with a.hold("n1"):
            again = _put(a, "n1")
        assert _ids(a, "n1") == [again["configurable"]["checkpoint_id"]]
        assert store.current_claim("n1") is None  # released when the block ended
    finally:
        a.close()
    with pytest.raises(Exception) as closed:
        _put(a, "n2")
    assert type(closed.value).__name__ == "StoreClosed"


def test_a_write_between_read_and_first_write_is_a_conflict(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    try:
        with b.hold("c1"):
            first = _put(b, "c1")
        seen = a.get_tuple(generate_config("c1"))  # A's run reads the thread...
        with b.hold("c1"):
            other = _put(b, "c1", first, step=1)  # ...another host's run writes it...
        from threadloom import CheckpointConflict

        with pytest.raises(CheckpointConflict):
            a.put_writes(seen.config, [("n", "a")], "task-a")  # ...A's run, built on what it read, is refused
        with pytest.raises(CheckpointConflict):
            _put(a, "c1", seen.config, step=1)
        assert b.get_tuple(other).pending_writes == []
        assert _ids(a, "c1") == [other["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
        again = a.get_tuple(generate_config("c1"))  # a run that reads again may write
        mine = _put(a, "c1", again.config, step=2)
        assert _ids(a, "c1")[0] == mine["configurable"]["checkpoint_id"]
    finally:
        a.close()
        b.close()


def test_a_first_checkpoint_between_read_of_an_empty_thread_and_first_write_is_a_conflict(two_stores) -> None:
    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    try:
        assert a.get_tuple(generate_config("e1")) is None  # A's run reads a new, empty thread...
        with b.hold("e1"):
            other = _put(b, "e1")  # ...another host's run writes its first checkpoint...
        from threadloom import CheckpointConflict

        with pytest.raises(CheckpointConflict):
            _put(a, "e1")  # ...A's first checkpoint, built on the empty thread, is refused
        assert _ids(a, "e1") == [other["configurable"]["checkpoint_id"]]
        assert two_stores[0].current_claim("e1") is None  # the refused run's claim was released
        again = a.get_tuple(generate_config("e1"))  # a run that reads again may write
        mine = _put(a, "e1", again.config, step=1)
        assert _ids(a, "e1") == [mine["configurable"]["checkpoint_id"], other["configurable"]["checkpoint_id"]]
    finally:
        a.close()
        b.close()


class _LostAnswer:
    """A store whose next checkpoint commits fail in flight: applied (``after``) or not (``before``), and reported
    as ``OutcomeUnknown`` either way, as a connection dropped mid-commit would."""

    def __new__(cls, inner, faults: list[str]):
        from threadloom import OutcomeUnknown
        from threadloom.persistence.forwarding import ForwardingCheckpointer

        class Store(ForwardingCheckpointer):
            def _forward(self, operation, *args, **kwargs):
                if operation == "commit" and args[1].checkpoint is not None and faults:
                    fault = faults.pop(0)
                    if fault == "after":
                        super()._forward(operation, *args, **kwargs)
                    raise OutcomeUnknown("commit", "the connection was lost while the commit was in flight")
                return super()._forward(operation, *args, **kwargs)

        return Store(inner)


def test_a_put_whose_outcome_is_unknown_learns_it_from_the_store(tmp_path) -> None:
    from threadloom import OutcomeUnknown

    faults: list[str] = []
    store = _LostAnswer(SqliteCheckpointer.open(tmp_path / "lost.db"), faults)
    saver = ThreadloomSaver(store, idle_release=timedelta(seconds=60))
    try:
        first = _put(saver, "u1")
        faults.append("after")  # applied, answer lost: the put returns as if nothing happened
        second = _put(saver, "u1", first, step=1)
        faults.append("before")  # not applied: the put raises, and the same put again applies once
        config = generate_config("u1")
        config["configurable"]["checkpoint_id"] = second["configurable"]["checkpoint_id"]
        checkpoint = generate_checkpoint(channel_values={"n": 2}, channel_versions={"n": 3})
        with pytest.raises(OutcomeUnknown):
            saver.put(config, checkpoint, generate_metadata(step=2), {"n": 3})
        third = saver.put(config, checkpoint, generate_metadata(step=2), {"n": 3})
        assert _ids(saver, "u1") == [third["configurable"]["checkpoint_id"], second["configurable"]["checkpoint_id"],
                                     first["configurable"]["checkpoint_id"]]
    finally:
        saver.close()
        store.close()


def test_when_a_losing_run_learns_the_thread_is_busy_depends_on_durability(two_stores) -> None:
    """README "LangGraph": with LangGraph's default durability the writes run in the background, so the losing
    run's nodes all run before its ThreadBusy surfaces (found by a new user); with ``durability="sync"`` or inside
    ``hold`` it comes before the first node. Either way nothing of the losing run is kept."""
    from typing import TypedDict

    from langgraph.graph import END, StateGraph
    from langgraph.graph import START as GRAPH_START

    class State(TypedDict):
        n: int

    ran: list[str] = []

    def step(name: str):
        def node(state: State) -> State:
            ran.append(name)
            return {"n": state["n"] + 1}

        return node

    def graph(saver):
        builder = StateGraph(State)
        builder.add_node("one", step("one"))
        builder.add_node("two", step("two"))
        builder.add_edge(GRAPH_START, "one")
        builder.add_edge("one", "two")
        builder.add_edge("two", END)
        return builder.compile(checkpointer=saver)

    a = ThreadloomSaver(two_stores[0], idle_release=timedelta(seconds=60))
    b = ThreadloomSaver(two_stores[1])
    config = {"configurable": {"thread_id": "busy"}}
    try:
        graph(a).invoke({"n": 0}, config)  # A's run holds the thread for idle_release after its last write
        kept = _ids(b, "busy")
        ran.clear()
        with pytest.raises(ThreadBusy):
            graph(b).invoke({"n": 10}, config)  # LangGraph's default durability: the writes in the background
        assert ran == ["one", "two"]  # the nodes ran before the error surfaced
        assert _ids(b, "busy") == kept  # and nothing of B's run was kept
        ran.clear()
        with pytest.raises(ThreadBusy):
            graph(b).invoke({"n": 10}, config, durability="sync")
        assert ran == []  # the first write (before the first node) failed
        with pytest.raises(ThreadBusy):
            with b.hold("busy"):
                graph(b).invoke({"n": 10}, config)
        assert ran == [] and _ids(b, "busy") == kept
    finally:
        a.close()
        b.close()
