"""A real LangGraph ``StateGraph`` (a tool loop with a human review by ``interrupt``) on ThreadloomSaver.

On SQLite and PostgreSQL: the run is interrupted in a child process, the process is killed (SIGKILL) while it
holds the thread's claim, and another process resumes the run with ``Command(resume=...)`` once the dead host's
claim expired. On every store: ``get_state_history``, ``update_state``, time travel (invoking from an earlier
checkpoint), and the run's steps as numbered events in the thread's log.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from langgraph.types import Command

from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer

AGENT = Path(__file__).with_name("langgraph_agent.py")
_spec = importlib.util.spec_from_file_location("langgraph_agent", AGENT)
agent = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("langgraph_agent", agent)  # LangGraph reads the state's type hints through the module
_spec.loader.exec_module(agent)

FINAL = ["user:hi", "agent:call-0", "tool:1", "agent:call-1", "tool:2", "agent:review", "human:yes"]


def _child(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(AGENT), *args], cwd=tmp_path, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        env={**os.environ},
    )


def _line(proc: subprocess.Popen) -> dict:
    """The child's next JSON line (its log lines, which start otherwise, are skipped)."""
    while True:
        line = proc.stdout.readline()
        assert line, f"the child process ended early (exit {proc.wait(timeout=30)})"
        if line.startswith("{"):
            return json.loads(line)


def _interrupt_kill_resume(tmp_path: Path, store_arg: str, thread: str) -> None:
    start = _child(tmp_path, store_arg, thread, "start")
    try:
        first = _line(start)
        assert first == {"event": "interrupted", "log": FINAL[:-1], "interrupts": [{"question": "approve?", "seen": 6}]}
    finally:
        start.send_signal(signal.SIGKILL)  # a real crash: no release, the claim stays until its ttl
        start.wait(timeout=30)
    assert start.returncode == -signal.SIGKILL
    resume = _child(tmp_path, store_arg, thread, "resume", "yes")
    try:
        assert _line(resume) == {"event": "done", "log": FINAL}
        assert resume.wait(timeout=60) == 0
    finally:
        if resume.poll() is None:
            resume.kill()


def _history_update_time_travel(saver: ThreadloomSaver, thread: str) -> None:
    graph = agent.build(saver)
    config = {"configurable": {"thread_id": thread}}
    state = graph.get_state(config)
    assert state.values["log"] == FINAL and state.next == ()
    history = list(graph.get_state_history(config))
    # newest first: the final state, then the interrupted review step, ... back to the input checkpoint
    assert [snapshot.values.get("log", []) for snapshot in history][0] == FINAL
    assert history[-1].metadata["source"] == "input"
    steps = [snapshot.metadata["step"] for snapshot in history]
    assert steps == sorted(steps, reverse=True) and len(history) == 8
    review = next(snapshot for snapshot in history if snapshot.next == ("review",))
    assert review.values["log"] == FINAL[:-1]
    # the latest checkpoint of the store keeps its pending writes: none once the run ended
    assert history[0].tasks == ()

    # update_state on the latest, then read it back
    updated = graph.update_state(config, {"log": ["edited"]})
    assert graph.get_state(config).values["log"] == [*FINAL, "edited"]
    assert updated["configurable"]["checkpoint_id"] == graph.get_state(config).config["configurable"]["checkpoint_id"]

    # time travel: run again from the step before the second tool call; the graph reaches the review again
    before_tool = next(s for s in history if s.next == ("tool",) and s.values["log"][-1] == "agent:call-1")
    result = graph.invoke(None, before_tool.config)
    assert result["log"] == FINAL[:-1]
    assert [i.value for i in result["__interrupt__"]] == [{"question": "approve?", "seen": 6}]
    forked = graph.get_state(config)
    assert forked.next == ("review",) and forked.values["log"] == FINAL[:-1]
    assert forked.tasks[0].interrupts[0].value == {"question": "approve?", "seen": 6}
    # the fork's first checkpoint names the checkpoint it travelled from as its LangGraph parent
    fork_history = list(graph.get_state_history(config, limit=3))
    assert fork_history[-1].parent_config["configurable"]["checkpoint_id"] == (
        before_tool.config["configurable"]["checkpoint_id"])
    final = graph.invoke(Command(resume="again"), config)
    assert final["log"] == [*FINAL[:-1], "human:again"]
    # the store orders the history: the newest commit is the latest, whatever the checkpoint ids say
    assert graph.get_state(config).values["log"][-1] == "human:again"


def _events(store, thread: str) -> list:
    return [e for e in store.events_after(thread, 0, 1000) if e.type == "langgraph.checkpoint"]


def test_interrupt_resume_history_memory() -> None:
    store = InMemoryCheckpointer()
    thread = "t-memory"
    config = {"configurable": {"thread_id": thread}}
    first = ThreadloomSaver(store, ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200),
                            idle_release=timedelta(seconds=60))
    result = agent.build(first).invoke({"log": ["user:hi"], "steps": 0}, config)
    assert [i.value for i in result["__interrupt__"]] == [{"question": "approve?", "seen": 6}]
    # a second host resumes: it waits for the first host's claim (renewed while it lives) to be released
    second = ThreadloomSaver(store)
    with pytest.raises(Exception) as busy:
        with second.hold(thread):
            pass
    assert type(busy.value).__name__ == "ThreadBusy"
    first.close()
    with second.hold(thread, wait=timedelta(seconds=5)):
        assert agent.build(second).invoke(Command(resume="yes"), config)["log"] == FINAL
    _history_update_time_travel(second, thread)
    assert len(_events(store, thread)) >= 8
    second.close()


@pytest.mark.slow
def test_interrupt_kill_resume_sqlite(tmp_path) -> None:
    path = tmp_path / "agent.db"
    _interrupt_kill_resume(tmp_path, f"sqlite:{path}", "t-sqlite")
    with ThreadloomSaver.from_url(f"sqlite:///{path}") as saver:
        _history_update_time_travel(saver, "t-sqlite")
        events = _events(saver.store, "t-sqlite")
        assert [e.seq for e in events] == sorted(e.seq for e in events) and len(events) >= 8


@pytest.mark.slow
@pytest.mark.postgres
def test_interrupt_kill_resume_postgres(tmp_path, monkeypatch) -> None:
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    monkeypatch.setenv("THREADLOOM_TEST_PG", harness.dsn)
    try:
        harness.open_pg().close()  # create the schema before two processes race to
        _interrupt_kill_resume(tmp_path, f"postgres:{harness.schema}", "t-postgres")
        saver = ThreadloomSaver(harness.open_pg())
        _history_update_time_travel(saver, "t-postgres")
        assert len(_events(saver.store, "t-postgres")) >= 8
        saver.close()
    finally:
        harness.cleanup()


def test_the_readme_langgraph_section_runs_as_written(tmp_path) -> None:
    import re

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = text.index("\n## LangGraph\n")
    section = text[start : text.find("\n## ", start + 1)]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1
    done = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if not line.startswith("20")] == [
        "{'question': 'ship it?'}", "yes"]
    assert (tmp_path / "langgraph.db").exists()


def test_async_graph_interrupt_and_resume_sqlite(tmp_path) -> None:
    import asyncio

    async def main() -> list[str]:
        saver = ThreadloomSaver.from_url(f"sqlite:///{tmp_path / 'async.db'}")
        try:
            graph = agent.build(saver)
            config = {"configurable": {"thread_id": "t-async"}}
            first = await graph.ainvoke({"log": ["user:hi"], "steps": 0}, config)
            assert [i.value for i in first["__interrupt__"]] == [{"question": "approve?", "seen": 6}]
            async with saver.ahold("t-async"):
                done = await graph.ainvoke(Command(resume="yes"), config)
            history = [s async for s in graph.aget_state_history(config)]
            assert len(history) == 8
            return done["log"]
        finally:
            saver.close()

    assert asyncio.run(main()) == FINAL


def test_subgraph_interrupt_lives_in_a_child_thread_and_goes_with_its_root() -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    class S(TypedDict, total=False):
        x: int
        note: str

    inner = StateGraph(S)
    inner.add_node("a", lambda s: {"x": s["x"] + 1})
    inner.add_node("ask", lambda s: {"note": interrupt("inner?")})
    inner.add_edge(START, "a")
    inner.add_edge("a", "ask")
    inner.add_edge("ask", END)
    outer = StateGraph(S)
    outer.add_node("sub", inner.compile())
    outer.add_node("after", lambda s: {"x": s["x"] * 10})
    outer.add_edge(START, "sub")
    outer.add_edge("sub", "after")
    outer.add_edge("after", END)
    store = InMemoryCheckpointer()
    saver = ThreadloomSaver(store)
    graph = outer.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "sg"}}
    assert [i.value for i in graph.invoke({"x": 1}, config)["__interrupt__"]] == ["inner?"]
    state = graph.get_state(config, subgraphs=True)
    assert state.next == ("sub",) and state.tasks[0].state.next == ("ask",)
    [child] = store.children("sg", limit=10)
    assert child.startswith("sg::ns::sub:") and store.latest(child).checkpoint.origin.parent_thread == "sg"
    assert graph.invoke(Command(resume="ok"), config) == {"x": 20, "note": "ok"}
    saver.delete_thread("sg")
    assert store.children("sg", limit=10) == [] and store.latest(child) is None
    assert saver.get_tuple(config) is None
    saver.close()
