"""Section ``runtime``: the actor runtime's supersteps/s with 100 concurrent runs, and the memory of a live run.

**Throughput.** A ``GraphRuntime`` runs :data:`RUNS` runs at once, one per thread, of a one-node graph that loops:
each superstep adds one to a counter in a state of about 2.5 KB of JSON (the SQLite section's state) and emits one
event, so each superstep is one fenced commit of a checkpoint (with the runtime's three metadata keys) and one
event. The runs loop until the measurement ends; supersteps are counted over the middle of the run (after a
warm-up), so starting and ending the runs is not timed. The baseline is the bare store doing the same writes with
no runtime: :data:`RUNS` threads, each holding the claim of a thread of its own and committing the same checkpoint
(same state, same metadata) and one event per call, as fast as they can. The same number of writer threads as the
runtime has actors is the fairest comparison: the runtime's actors commit from that many threads, so the store's
contention is the same on both sides and the ratio is what the runtime itself costs per step (actor messages, a
task per node, copies of the state, validation of the step, the logging calls). One row over SQLite (the embedded
default), one over the in-memory store (where the store costs least, so the runtime's own cost shows most). The
runtime logs at WARNING, as a host would in production (the ``commit.applied`` info lines are filtered out).

**Memory.** :data:`PARKED` runs are started whose node waits on an event, and the memory they hold is divided
by their number: the Python heap (``tracemalloc``) and the resident set size (RSS) of the process. Each is
measured in a fresh process (so the allocator and the C library's caches of earlier sections cannot hide it),
over the in-memory store. Baselines, also per item and each in a fresh process: for the heap, one *stored*
thread in the in-memory store (its claim, the same admission checkpoint and one event: what a thread costs at
rest, and part of a live run's own figure); for the RSS, one bare Python thread parked on an event (the floor of
any design with a thread per live actor: a parked run has two, its actor's and its node's). There is no goal:
the figures are reported.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_sqlite import STATE
from benchlib import Row, Section, Settings, quiet_logs, throughput

from threadloom import (
    Checkpoint,
    Checkpointer,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    Step,
)
from threadloom.actors import graph as g

RUNS = 100
"""Concurrent runs of the throughput rows (and writer threads of their baseline)."""
PARKED = 200
"""Live runs parked at once for the memory rows (50 with ``--quick``)."""
GOAL = 0.8
"""Runtime supersteps/s at least this share of the bare store's commits/s from as many threads."""
ROUNDS = 2
"""Alternating rounds per throughput row; the best round of each side counts."""
WARMUP_S = 0.3
"""Seconds the runs loop before supersteps are counted (at most the measurement's own length)."""

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PAYLOAD = {"node": "loop", "ok": True, "tokens": 512}
GRAPH_ID = "bench-loop"
_TTL = timedelta(hours=1)


# -- throughput ------------------------------------------------------------------------------------------------


def looping_graph(go: threading.Event, stop: threading.Event, steps: Callable[[], object]) -> Graph:
    """One node that adds one to ``state["step"]``, emits one event and loops until ``stop`` is set.

    Every execution waits for ``go`` first (so all runs can be started before any loops), then calls
    ``steps()`` (a thread-safe counter).
    """

    def loop(state, ctx):
        if not go.is_set():  # Event.wait takes the event's lock even once set: 100 runs would contend for it
            go.wait()
        steps()
        new = {**state, "step": state["step"] + 1}
        if stop.is_set():
            return Step.end(new, events=[("step", PAYLOAD)])
        return Step.to("loop", new, events=[("step", PAYLOAD)])

    return Graph(GRAPH_ID, {"loop": loop}, entry="loop")


def runtime_rate(store: Checkpointer, seconds: float, runs: int = RUNS, prefix: str = "rt") -> float:
    """Supersteps/s of ``runs`` concurrent looping runs on one ``GraphRuntime`` over ``store``.

    The runs are all started (their first node waits), let go together, loop for :data:`WARMUP_S` (at most
    ``seconds``), then node executions are counted for ``seconds`` (each execution follows the commit of the
    previous step); the runs are then stopped, awaited, and the runtime closed. Raises what a run ended with if
    one failed.
    """
    go, stop = threading.Event(), threading.Event()
    counter = itertools.count()
    executed = [0]

    def step() -> None:
        executed[0] = next(counter)

    graph = looping_graph(go, stop, step)
    runtime = GraphRuntime(store, node_id=f"bench-{prefix}")
    try:
        handles = [runtime.start(f"{prefix}-{i}", graph, STATE) for i in range(runs)]
        go.set()
        time.sleep(min(WARMUP_S, seconds))
        began, first = time.perf_counter(), executed[0]
        time.sleep(seconds)
        elapsed, last = time.perf_counter() - began, executed[0]
        stop.set()
        for handle in handles:
            handle.wait(timedelta(seconds=60))  # raises RunFailed, StaleClaim, ... if a run went wrong
    finally:
        go.set()
        stop.set()
        runtime.close()
    return (last - first) / elapsed


class BareRun:
    """What the runtime's run writes, without the runtime: a claim, an admission, then one step per call.

    Each call commits the next checkpoint (the same state shape and metadata the runtime writes) and one event,
    fenced by the claim, parented on the previous one.
    """

    def __init__(self, store: Checkpointer, thread_id: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.run_id = f"{thread_id}:run"
        self.token = store.claim(thread_id, ClaimRequest(holder=self.run_id, ttl=_TTL)).token
        self.state = STATE
        self.step = 0
        self.parent: str | None = None
        self._commit(self.state, "", "loop", g.EVENT_RUN_STARTED, {"graph_id": GRAPH_ID, "node": "loop"})

    def _commit(self, state: dict, node: str, next_node: str, event: str, payload: dict) -> None:
        checkpoint_id = f"{self.run_id}:{self.step}"
        checkpoint = Checkpoint(
            id=checkpoint_id,
            parent=self.parent,
            thread_id=self.thread_id,
            run_id=self.run_id,
            status=CheckpointStatus.RUNNING,
            created_at=NOW,
            state=state,
            graph_id=GRAPH_ID,
            metadata={g.NEXT_KEY: next_node, g.STEP_KEY: str(self.step), g.NODE_KEY: node},
        )
        draft = EventDraft(run_id=self.run_id, type=event, timestamp=NOW, payload=payload,
                           checkpoint_id=checkpoint_id, node_id=node or None)
        self.store.commit(self.thread_id, Commit(token=self.token, checkpoint=checkpoint, events=(draft,)))
        self.parent = checkpoint_id

    def __call__(self) -> None:
        self.step += 1
        self.state = {**self.state, "step": self.state["step"] + 1}
        self._commit(self.state, "loop", "loop", "step", PAYLOAD)


def bare_rate(store: Checkpointer, seconds: float, writers: int = RUNS, prefix: str = "bare") -> float:
    """Commits/s of ``writers`` threads committing :class:`BareRun` steps to threads of their own on ``store``."""
    return throughput(writers, seconds, lambda i: BareRun(store, f"{prefix}-{i}"))


def _stores(settings: Settings) -> list[tuple[str, Callable[[str], Checkpointer]]]:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return [
        ("sqlite", lambda name: SqliteCheckpointer.open(str(settings.workdir / f"{name}.db"))),
        ("memory", lambda _name: InMemoryCheckpointer()),
    ]


def _throughput_rows(settings: Settings, runs: int) -> list[Row]:
    rows = []
    seconds = settings.seconds
    for label, make_store in _stores(settings):
        best = {"runtime": 0.0, "bare": 0.0}
        for round_ in range(ROUNDS):
            for side in ("runtime", "bare") if round_ % 2 == 0 else ("bare", "runtime"):
                store = make_store(f"{label}-{side}-{round_}")
                try:
                    measure = runtime_rate if side == "runtime" else bare_rate
                    best[side] = max(best[side], measure(store, seconds, runs))
                finally:
                    store.close()
                gc.collect()
        ours, bare = best["runtime"], best["bare"]
        if label == "memory":
            own_us = (1 / ours - 1 / bare) * 1e6 if ours and bare else float("nan")
            note = (f"runtime over the memory store: the runtime's own cost ≈ {own_us:,.0f} µs per superstep "
                    "(1/ours − 1/bare), machine-wide with all runs together")
        else:
            note = (
                f"runtime: {runs} runs of a one-node loop on one GraphRuntime, each superstep one fenced commit "
                f"of a checkpoint ({len(json.dumps(STATE)):,} B of JSON state, the runtime's metadata) + 1 event; "
                f"baseline: the same commits from {runs} threads straight to the store (the same contention). "
                f"Best of {ROUNDS} alternating rounds, {seconds:g} s each after a "
                f"{min(WARMUP_S, seconds):g} s warm-up; "
                "runtime logs at WARNING."
            )
        rows.append(
            Row(
                section="runtime",
                measure=f"supersteps/s, {runs} concurrent runs ({label})",
                value=ours,
                baseline=bare,
                baseline_label=f"bare {label} store, {runs} writer threads, same commits",
                unit="/s",
                goal=f"≥ {GOAL}×",
                met=ours / bare >= GOAL if bare else None,
                note=note,
            )
        )
    return rows


# -- memory ----------------------------------------------------------------------------------------------------


def _rss_kib() -> float:
    """The process's resident set size in KiB (``/proc/self/statm``; else the peak from ``getrusage``)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1024 if sys.platform == "darwin" else float(peak)


class _Parking:
    """Counts items that reached their parked point; ``wait_for(n)`` blocks until ``n`` did."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0
        self.gate = threading.Event()

    def arrive(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()
        self.gate.wait()

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.count >= n, timeout):
                raise TimeoutError(f"only {self.count} of {n} items parked within {timeout:g} s")


def _measure(park: Callable[[int, str], None], n: int) -> dict[str, float]:
    """KiB per item: RSS of parking ``n`` items, then (tracing) the Python heap of parking ``n`` more."""
    park(3, "warm")  # first-use costs (imports, the timer thread, caches) are not the items'
    gc.collect()
    before = _rss_kib()
    park(n, "rss")
    gc.collect()
    rss = (_rss_kib() - before) / n
    tracemalloc.start()
    gc.collect()
    start, _peak = tracemalloc.get_traced_memory()
    park(n, "heap")
    gc.collect()
    heap = (tracemalloc.get_traced_memory()[0] - start) / n / 1024
    tracemalloc.stop()
    return {"rss_kib": rss, "heap_kib": heap}


def probe(kind: str, n: int) -> dict[str, float]:
    """Memory per item of ``kind`` (``runs``, ``stored`` or ``threads``), measured in this process.

    ``runs``: live runs whose node waits on an event, on one ``GraphRuntime`` over an in-memory store.
    ``stored``: threads stored in an in-memory store (claim, the admission checkpoint, one event).
    ``threads``: bare Python threads waiting on an event.
    """
    restore = quiet_logs()
    parking = _Parking()
    cleanups: list[Callable[[], None]] = []
    store = InMemoryCheckpointer()
    try:
        if kind == "runs":
            def node(state, ctx):
                parking.arrive()
                return Step.end(state)

            graph = Graph(GRAPH_ID, {"loop": node}, entry="loop")
            runtime = GraphRuntime(store, node_id="bench-memory")
            handles = []
            cleanups.append(runtime.close)

            def park(count: int, name: str) -> None:
                target = parking.count + count
                handles.extend(runtime.start(f"{name}-{i}", graph, STATE) for i in range(count))
                parking.wait_for(target)
        elif kind == "stored":
            def park(count: int, name: str) -> None:
                for i in range(count):
                    BareRun(store, f"{name}-{i}")
        elif kind == "threads":
            threads: list[threading.Thread] = []

            def park(count: int, name: str) -> None:
                target = parking.count + count
                for i in range(count):
                    thread = threading.Thread(target=parking.arrive, name=f"{name}-{i}", daemon=True)
                    thread.start()
                    threads.append(thread)
                parking.wait_for(target)

            cleanups.append(lambda: [thread.join(10) for thread in threads])
        else:
            raise ValueError(f"unknown probe kind {kind!r}")
        return _measure(park, n)
    finally:
        parking.gate.set()
        for cleanup in reversed(cleanups):
            cleanup()
        store.close()
        restore()


def _run_probe(kind: str, n: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), kind, str(n)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} memory probe failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_rows(n: int) -> list[Row]:
    runs, stored, threads = (_run_probe(kind, n) for kind in ("runs", "stored", "threads"))
    note = (
        f"runtime memory: {n} live runs parked in their node (an actor thread and a node thread each, over an "
        "in-memory store, so a run's figure includes its stored thread), each kind measured in a fresh process: "
        "RSS first, then the Python heap with tracemalloc. No goal: reported."
    )
    return [
        Row(
            section="runtime",
            measure="Python heap per live run (tracemalloc)",
            value=runs["heap_kib"],
            baseline=stored["heap_kib"],
            baseline_label="one stored thread, memory store (claim + checkpoint + event)",
            unit="KiB",
            goal="report",
            note=note,
        ),
        Row(
            section="runtime",
            measure="RSS per live run",
            value=runs["rss_kib"],
            baseline=threads["rss_kib"],
            baseline_label="one bare Python thread parked on an Event",
            unit="KiB",
            goal="report",
            note=note,
        ),
    ]


def run(settings: Settings, *, runs: int = RUNS, parked: int | None = None) -> list[Row]:
    """The runtime section's rows: supersteps/s over SQLite and memory, then memory per live run.

    Args:
        settings: the run's settings (``seconds`` per throughput measurement).
        runs: concurrent runs (and baseline writer threads) of the throughput rows.
        parked: live runs parked for the memory rows (default :data:`PARKED`, 50 with ``--quick``).
    """
    restore = quiet_logs()
    try:
        rows = _throughput_rows(settings, runs)
    finally:
        restore()
    if parked is None:
        parked = 50 if settings.quick else PARKED
    return rows + _memory_rows(parked)


SECTION = Section(
    name="runtime",
    title=f"runtime supersteps/s with {RUNS} concurrent runs vs the bare store; memory per live run",
    run=run,
    order=40,
)


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], int(sys.argv[2]))))
