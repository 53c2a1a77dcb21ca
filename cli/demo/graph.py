"""The sample agent graph of ``threadloom demo``: a tool-using loop with child threads and effects.

Two graphs (plain Python, named nodes, one commit per node):

* ``demo-agent`` — ``plan`` → ``act`` (a tool call through ``ctx.effect``) → ``delegate`` on some rounds (a
  child thread of ``demo-research`` runs a sub-task and the node waits for its findings) → ``reflect`` → back to
  ``plan`` for the next round, or ``answer`` (one more effect: the reply is sent) → end.
* ``demo-research`` — ``search`` (an effect) → ``summarize`` → end.

Every effect goes through a :class:`Ledger`: the demo's stand-in for the outside world (a tool provider). It
lives in its own SQLite file, outside the store, and is written by the effect's function itself, so it counts
what really ran. Like a real provider it is idempotent by the idempotency key ``ctx.effect`` hands the function:
a second call with a key it already executed (which happens when a process died after the call and before the
step that made it committed: effects run at least once) executes nothing and returns the first execution's
result; the ledger records that attempt, so the demo can show it.

Nodes sleep a little (``pace`` scales it) so a run takes about a second and a crash lands in the middle of one.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from threadloom.actors.graph import Graph, NodeContext, Step
from threadloom.actors.runtime import GraphRuntime

AGENT_GRAPH = "demo-agent"
"""The graph id of the agent loop (the run-queue entries' ``graph_id``)."""
RESEARCH_GRAPH = "demo-research"
"""The graph id of the child threads."""
TOOLS = ("search_web", "read_file", "run_sql", "call_api")
"""The tools the agent calls, in turn."""


# -- the ledger: the outside world ------------------------------------------------------------------------------------


@attrs.frozen
class Execution:
    """One executed effect, as the ledger recorded it (the first call with its idempotency key)."""

    thread_id: str
    key: str
    idempotency_key: str
    execution_id: str
    tool: str
    worker: str
    pid: int
    run_id: str
    at_us: int


@attrs.frozen
class Attempt:
    """One call of the ledger: ``executed`` (the first for its idempotency key) or ``deduplicated`` (a repeat)."""

    thread_id: str
    key: str
    idempotency_key: str
    execution_id: str
    outcome: str
    worker: str
    pid: int
    run_id: str
    at_us: int


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS executions (
        thread_id TEXT NOT NULL, key TEXT NOT NULL, idempotency_key TEXT NOT NULL PRIMARY KEY,
        execution_id TEXT NOT NULL, tool TEXT NOT NULL, worker TEXT NOT NULL, pid INTEGER NOT NULL,
        run_id TEXT NOT NULL, at_us INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, key TEXT NOT NULL,
        idempotency_key TEXT NOT NULL, execution_id TEXT NOT NULL, outcome TEXT NOT NULL, worker TEXT NOT NULL,
        pid INTEGER NOT NULL, run_id TEXT NOT NULL, at_us INTEGER NOT NULL)""",
)


class Ledger:
    """The demo's tool provider: every effect the sample graph runs executes here, once per idempotency key.

    A SQLite file of its own (never the store). Safe from many threads and processes at once.

    Args:
        path: the ledger file (created with its tables if missing).
        worker: the name of the process calling it (recorded on each execution and attempt).
        tool_latency_s: how long a call takes before it executes (seconds): a crash during it executes nothing.
    """

    def __init__(self, path: str | Path, worker: str = "coordinator", *, tool_latency_s: float = 0.0) -> None:
        self.path = str(path)
        self.worker = worker
        self.tool_latency_s = tool_latency_s
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA busy_timeout = 30000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    self._conn.execute(statement)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Closes the ledger's connection."""
        with self._lock:
            self._conn.close()

    def call(
        self, thread_id: str, key: str, idempotency_key: str, run_id: str, tool: str, argument: Any
    ) -> dict[str, Any]:
        """Executes ``tool(argument)`` once per ``idempotency_key``; a repeat returns the first execution.

        ``thread_id`` and ``key`` (the effect's key in the graph) are recorded for the verification to read.

        Returns:
            ``{"execution_id", "tool", "output"}`` of the (first) execution: JSON, recorded by ``ctx.effect``.
        """
        if self.tool_latency_s > 0:
            time.sleep(self.tool_latency_s)
        execution_id = uuid.uuid4().hex[:12]
        now_us = time.time_ns() // 1000
        pid = os.getpid()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                inserted = self._conn.execute(
                    "INSERT OR IGNORE INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (thread_id, key, idempotency_key, execution_id, tool, self.worker, pid, run_id, now_us),
                ).rowcount
                first = self._conn.execute(
                    "SELECT execution_id, tool FROM executions WHERE idempotency_key = ?", (idempotency_key,)
                ).fetchone()
                self._conn.execute(
                    "INSERT INTO attempts (thread_id, key, idempotency_key, execution_id, outcome, worker, pid, "
                    "run_id, at_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (thread_id, key, idempotency_key, first[0], "executed" if inserted else "deduplicated",
                     self.worker, pid, run_id, now_us),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return {"execution_id": first[0], "tool": first[1], "output": f"{first[1]}({argument}) ok"}

    def executions(self) -> list[Execution]:
        """Every execution, in the order they ran."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT thread_id, key, idempotency_key, execution_id, tool, worker, pid, run_id, at_us "
                "FROM executions ORDER BY at_us"
            ).fetchall()
        return [Execution(*row) for row in rows]

    def attempts(self) -> list[Attempt]:
        """Every call, in the order they were made."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT thread_id, key, idempotency_key, execution_id, outcome, worker, pid, run_id, at_us "
                "FROM attempts ORDER BY id"
            ).fetchall()
        return [Attempt(*row) for row in rows]


# -- the graphs -------------------------------------------------------------------------------------------------------


def demo_input(index: int) -> dict[str, Any]:
    """The input of the demo's run number ``index`` (1-based): 2 to 4 rounds; even runs delegate round 2,
    runs divisible by 4 also round 3."""
    rounds = 2 + index % 3
    delegate = [2] if index % 2 == 0 else []
    if index % 4 == 0 and rounds >= 3:
        delegate.append(3)
    return {"task": f"task {index}", "rounds": rounds, "delegate": delegate}


def build_graphs(runtime: GraphRuntime, ledger: Ledger, *, pace: float = 1.0) -> dict[str, Graph]:
    """The demo's graphs, by id: ``demo-agent`` (the queued runs) and ``demo-research`` (their children).

    Args:
        runtime: the runtime the graphs run in (unused since ``ctx.spawn`` takes up a crashed child itself; kept
            so callers need not change).
        ledger: where every effect executes.
        pace: scales every node's sleep (1.0: a run takes about a second; 0: no sleeping).
    """

    def think(seconds: float) -> None:
        if pace > 0:
            time.sleep(seconds * pace)

    def tool_call(ctx: NodeContext, key: str, tool: str, argument: Any) -> Callable[[str], Any]:
        return lambda idempotency_key: ledger.call(ctx.thread_id, key, idempotency_key, ctx.run_id, tool, argument)

    # -- the research child ------------------------------------------------------------------------------------

    def search(state: Any, ctx: NodeContext) -> Step:
        think(0.05)
        result = ctx.effect("search", tool_call(ctx, "search", "search_web", state["question"]))
        ctx.emit("research.searched", {"execution_id": result["execution_id"]})
        return Step.to("summarize", {**state, "effects": ["search"], "hits": result["output"]})

    def summarize(state: Any, ctx: NodeContext) -> Step:
        think(0.08)
        return Step.end({**state, "findings": f"findings on {state['question']}"})

    research = Graph(RESEARCH_GRAPH, {"search": search, "summarize": summarize}, entry="search", max_steps=10)

    # -- the agent loop ----------------------------------------------------------------------------------------

    def plan(state: Any, ctx: NodeContext) -> Step:
        think(0.08)
        round_ = state.get("round", 0) + 1
        tool = TOOLS[(round_ + len(state["task"])) % len(TOOLS)]
        ctx.emit("agent.planned", {"round": round_, "tool": tool})
        return Step.to("act", {**state, "round": round_, "tool": tool})

    def act(state: Any, ctx: NodeContext) -> Step:
        round_ = state["round"]
        key = f"tool:{round_}"
        result = ctx.effect(key, tool_call(ctx, key, state["tool"], f"{state['task']} #{round_}"))
        ctx.emit("agent.tool_result", {"key": key, "execution_id": result["execution_id"]})
        effects = [*state.get("effects", []), key]
        following = "delegate" if round_ in state["delegate"] else "reflect"
        return Step.to(following, {**state, "effects": effects, "observation": result["output"]})

    def delegate(state: Any, ctx: NodeContext) -> Step:
        child_id = f"{ctx.thread_id}.research-{state['round']}"
        question = f"{state['task']}, round {state['round']}"
        # Unique to this round: if an earlier execution of this node died, spawn recovers that child (or returns
        # its findings if it had completed) instead of running it again.
        child = ctx.spawn(child_id, research, {"question": question}).wait().state
        ctx.emit("agent.delegated", {"child": child_id})
        children = [*state.get("children", []), child_id]
        return Step.to("reflect", {**state, "children": children, "observation": child["findings"]})

    def reflect(state: Any, ctx: NodeContext) -> Step:
        think(0.04)
        if state["round"] < state["rounds"]:
            return Step.to("plan", state)
        return Step.to("answer", state)

    def answer(state: Any, ctx: NodeContext) -> Step:
        think(0.05)
        reply = f"done: {state['task']} in {state['round']} rounds"
        receipt = ctx.effect("answer", tool_call(ctx, "answer", "send_message", reply))
        ctx.emit("agent.answered", {"execution_id": receipt["execution_id"]})
        return Step.end({**state, "effects": [*state.get("effects", []), "answer"], "answer": reply})

    agent = Graph(
        AGENT_GRAPH,
        {"plan": plan, "act": act, "delegate": delegate, "reflect": reflect, "answer": answer},
        entry="plan",
        max_steps=64,
    )
    return {AGENT_GRAPH: agent, RESEARCH_GRAPH: research}


__all__ = [
    "AGENT_GRAPH",
    "RESEARCH_GRAPH",
    "Attempt",
    "Execution",
    "Ledger",
    "build_graphs",
    "demo_input",
]
