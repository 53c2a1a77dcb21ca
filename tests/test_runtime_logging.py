"""A log line that cannot be written never strands a run (found by a first-time user: ``agent.py | head -1``).

The library never configures structlog, whose default writes to standard output. When that output is a closed
pipe every log call raises; runs must still be claimed, committed, released and answered.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from threadloom import Graph, GraphRuntime, InMemoryCheckpointer, Step
from threadloom.persistence.logs import SafeLogger

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from threadloom import Graph, GraphRuntime, Step, open_store

    def plan(state, ctx):
        ctx.emit("planned", {})
        return Step.to("answer", {**state, "found": ctx.effect("search", lambda: "x")})

    def answer(state, ctx):
        return Step.end({**state, "answer": state["found"]})

    graph = Graph("qa", {"plan": plan, "answer": answer}, entry="plan")
    with open_store("sqlite:///" + sys.argv[1]) as store, GraphRuntime(store) as runtime:
        outcomes = [runtime.start(f"q-{i}", graph, {"q": i}).wait().status.value for i in range(3)]
        latest = [store.latest(f"q-{i}").checkpoint.status.value for i in range(3)]
    with open(sys.argv[2], "w") as out:
        json.dump({"outcomes": outcomes, "latest": latest}, out)
    """
)


def test_runs_finish_when_standard_output_is_a_closed_pipe(tmp_path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    result_file = tmp_path / "result.json"
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "agent.db"), str(result_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    process.stdout.close()  # as `| head -0` would: every later write to stdout raises BrokenPipeError
    try:
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode is not None, "the program hung once its output was closed"
    result = json.loads(result_file.read_text())
    assert result == {"outcomes": ["completed"] * 3, "latest": ["completed"] * 3}


class _Exploding:
    def bind(self, **_values):
        return self

    def info(self, *_args, **_kwargs):
        raise BrokenPipeError("closed")

    warning = error = info


def test_a_logger_that_raises_changes_nothing_in_process(monkeypatch) -> None:
    import threadloom.actors.thread_actor as thread_actor

    monkeypatch.setattr(thread_actor, "_log", SafeLogger(_Exploding()))
    graph = Graph("g", {"only": lambda state, ctx: Step.end({"n": 1})}, entry="only")
    store = InMemoryCheckpointer()
    with GraphRuntime(store) as runtime:
        outcome = runtime.start("t", graph, {}).wait()
    assert outcome.state == {"n": 1}
    assert store.latest("t").checkpoint.status.value == "completed"
