"""A LangGraph tool loop with a human review (``interrupt``), for the LangGraph saver's tests.

Imported by the tests (by file path) and run as a child process::

    python langgraph_agent.py STORE THREAD start|resume ANSWER|hold-start|pause-put

``STORE`` is ``sqlite:PATH`` or ``postgres:SCHEMA`` (the server in ``$THREADLOOM_TEST_PG``). The child prints
one JSON line per result; ``start`` then waits to be killed.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time
from datetime import timedelta
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    steps: int


def agent(state: State) -> State:
    steps = state.get("steps", 0)
    if steps < 2:
        return {"log": [f"agent:call-{steps}"], "steps": steps + 1}
    return {"log": ["agent:review"]}


def route(state: State) -> str:
    return "tool" if state["log"][-1].startswith("agent:call") else "review"


def tool(state: State) -> State:
    return {"log": [f"tool:{state['steps']}"]}


def review(state: State) -> State:
    answer = interrupt({"question": "approve?", "seen": len(state["log"])})
    return {"log": [f"human:{answer}"]}


def build(checkpointer):
    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tool", tool)
    graph.add_node("review", review)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tool", "review"])
    graph.add_edge("tool", "agent")
    graph.add_edge("review", END)
    return graph.compile(checkpointer=checkpointer)


def open_saver(store: str, **options):
    from threadloom.langgraph import ThreadloomSaver

    kind, _, where = store.partition(":")
    if kind == "sqlite":
        return ThreadloomSaver.from_url(f"sqlite:///{where}", **options)
    from threadloom.persistence.postgres.config import PostgresCheckpointerConfig

    dsn = os.environ["THREADLOOM_TEST_PG"]
    return ThreadloomSaver.from_url(dsn, config=PostgresCheckpointerConfig(schema=where, min_size=1, max_size=2),
                                    **options)


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: list[str]) -> int:
    import structlog

    # The library's log lines (its renewer logs from its own thread) go to stderr: stdout carries the JSON lines.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    store, thread, action = argv[:3]
    config = {"configurable": {"thread_id": thread}}
    if action == "start":
        saver = open_saver(store, ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200),
                           idle_release=timedelta(seconds=60))
        graph = build(saver)
        result = graph.invoke({"log": ["user:hi"], "steps": 0}, config)
        say(event="interrupted", log=result["log"], interrupts=[i.value for i in result.get("__interrupt__", [])])
        time.sleep(600)  # holding the claim (renewed) until killed
        return 0
    if action == "resume":
        saver = open_saver(store, ttl=timedelta(seconds=5))
        graph = build(saver)
        with saver.hold(thread, wait=timedelta(seconds=20)):
            result = graph.invoke(Command(resume=argv[3]), config)
        say(event="done", log=result["log"])
        saver.close()
        return 0
    if action == "hold":
        # Claims the thread with a short ttl and stops renewing (a paused host), then writes when told.
        saver = open_saver(store, ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200),
                           idle_release=timedelta(seconds=60))
        graph = build(saver)
        state = graph.get_state(config)
        graph.update_state(state.config, {"log": ["host-a:first"]})
        say(event="holding")
        line = sys.stdin.readline().strip()  # the test pauses this process (SIGSTOP) and continues it
        try:
            graph.update_state(graph.get_state(config).config if line == "reread" else state.config,
                               {"log": ["host-a:late"]})
            say(event="wrote")
        except Exception as error:  # the test reads the error's type
            say(event="refused", error=type(error).__name__, message=str(error))
        saver.close()
        return 0
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
