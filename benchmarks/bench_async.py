"""Section ``async``: asyncio runs and subscriptions (README "asyncio").

Rows, all measured in this run:

* completed runs/s of :data:`RUNS` concurrent runs whose two nodes each ``await asyncio.sleep`` (:data:`SLEEP`), on
  one ``GraphRuntime`` over SQLite, started with ``await runtime.astart`` and awaited on their handles from one
  event loop - against the same runs (``time.sleep`` nodes) driven through the sync API from one thread each;
* OS threads and RSS per parked run with :data:`RUNS` runs parked in an ``async def`` node, against the same
  runs parked in a sync node (each run keeps its thread actor either way; an async node adds no thread);
* OS threads with :data:`RUNS` idle async subscriptions (``runtime.subscribe`` from a coroutine) against none
  (goal: no thread per subscription);
* with ``THREADLOOM_BENCH_PG`` set: wake latency p50/p99 of :data:`RUNS` idle async subscriptions to one thread on a
  runtime over PostgreSQL when one commit lands through a second store, from the start of the commit to each
  subscription's ``async for`` getting the event - against one subscription (goal p99 ≤ 10 ms); and the event
  loop thread's CPU time per commit over the same span (it leaves out the time other processes held the CPU);
* the async store's pool size: 1,000 concurrent ``latest`` calls through ``AsyncStore`` over SQLite at several
  ``max_workers``, against the default (8).
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from benchlib import Row, Section, Settings, quiet_logs

from threadloom import (
    ClaimRequest,
    Commit,
    EventDraft,
    Graph,
    GraphRuntime,
    SqliteCheckpointer,
    Step,
)
from threadloom.persistence.aio import AsyncStore

RUNS = 1000
SLEEP = 0.05
"""Seconds each node sleeps (an LLM call's await, say)."""
PG_ENV = "THREADLOOM_BENCH_PG"
WAKE_GOAL_US = 10_000.0
THREAD_GOAL = 10
"""At most this many more OS threads with the subscriptions than without (a constant, not one per subscription)."""


def _rss_kib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Sqlite:
    """A fresh SQLite store and runtime in a temporary directory; ``close`` removes them."""

    def __init__(self, workdir: str, name: str) -> None:
        self.directory = tempfile.mkdtemp(prefix=f"bench-async-{name}-", dir=workdir)
        self.store = SqliteCheckpointer.open(os.path.join(self.directory, "s.db"))
        self.runtime = GraphRuntime(self.store, node_id=name)

    def close(self) -> None:
        self.runtime.close()
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


# -- completed runs/s ------------------------------------------------------------------------------------------------


async def _anode(state: Any, ctx: Any) -> Step:
    await asyncio.sleep(SLEEP)
    return Step.to("b", state) if ctx.node == "a" else Step.end(state)


def _snode(state: Any, ctx: Any) -> Step:
    time.sleep(SLEEP)
    return Step.to("b", state) if ctx.node == "a" else Step.end(state)


ASYNC_GRAPH = Graph("bench-async", {"a": _anode, "b": _anode}, entry="a")
SYNC_GRAPH = Graph("bench-sync", {"a": _snode, "b": _snode}, entry="a")


def _async_runs_per_s(workdir: str, runs: int) -> float:
    bench = _Sqlite(workdir, "async")
    try:

        async def one(index: int) -> None:
            handle = await bench.runtime.astart(f"t{index}", ASYNC_GRAPH, {})
            await handle

        async def all_runs() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(one(index) for index in range(runs)))
            return time.perf_counter() - started

        return runs / asyncio.run(all_runs())
    finally:
        bench.close()


def _sync_runs_per_s(workdir: str, runs: int) -> float:
    bench = _Sqlite(workdir, "sync")
    try:
        barrier = threading.Barrier(runs + 1)
        errors: list[BaseException] = []

        def one(index: int) -> None:
            barrier.wait()
            try:
                bench.runtime.start(f"t{index}", SYNC_GRAPH, {}).wait(timedelta(minutes=5))
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=one, args=(index,), daemon=True) for index in range(runs)]
        for thread in threads:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise errors[0]
        return runs / elapsed
    finally:
        bench.close()


# -- parked runs and idle subscriptions ----------------------------------------------------------------------------


def _parked(workdir: str, runs: int, *, use_async: bool) -> tuple[int, float]:
    """(OS threads, RSS KiB per run) with ``runs`` runs parked in their node; both measured against before."""
    bench = _Sqlite(workdir, "parked-async" if use_async else "parked-sync")
    arrived = [0]
    lock = threading.Lock()
    release = threading.Event()
    loop_gate: list[asyncio.Event] = []

    async def apark(state: Any, ctx: Any) -> Step:
        if not loop_gate:
            loop_gate.append(asyncio.Event())
        with lock:
            arrived[0] += 1
        await loop_gate[0].wait()
        return Step.end(state)

    def spark(state: Any, ctx: Any) -> Step:
        with lock:
            arrived[0] += 1
        release.wait()
        return Step.end(state)

    graph = Graph("park", {"p": apark if use_async else spark}, entry="p")
    try:
        warm = bench.runtime.start("warm", Graph("warm", {"p": _anode if use_async else _snode}, entry="p"), {})
        warm.wait(timedelta(seconds=30))
        gc.collect()
        threads_before, rss_before = threading.active_count(), _rss_kib()
        handles = [bench.runtime.start(f"t{index}", graph, {}) for index in range(runs)]
        deadline = time.monotonic() + 120
        while arrived[0] < runs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {arrived[0]} of {runs} runs parked")
            time.sleep(0.01)
        time.sleep(0.2)
        gc.collect()
        threads, rss = threading.active_count() - threads_before, (_rss_kib() - rss_before) / runs
        if use_async:
            bench.runtime._aio.loop().call_soon_threadsafe(loop_gate[0].set)
        release.set()
        for handle in handles:
            handle.wait(timedelta(seconds=60))
        return threads, rss
    finally:
        release.set()
        bench.close()


def _subscription_threads(workdir: str, count: int) -> tuple[int, int]:
    """(OS threads with ``count`` idle async subscriptions, OS threads before them)."""
    bench = _Sqlite(workdir, "subs")
    try:

        async def measure() -> tuple[int, int]:
            handle = await bench.runtime.astart("t", Graph("one", {"a": _anode, "b": _anode}, entry="a"), {})
            await handle
            before = threading.active_count()
            subscriptions = [bench.runtime.subscribe("t", 1000) for _ in range(count)]
            await asyncio.sleep(0.5)
            during = threading.active_count()
            for subscription in subscriptions:
                subscription.cancel()
            return during, before

        return asyncio.run(measure())
    finally:
        bench.close()


# -- PostgreSQL wake latency ---------------------------------------------------------------------------------------


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _wake_latencies(url: str, subscribers: int, samples: int) -> tuple[list[float], list[float]]:
    """µs from the start of a commit on store B to each of ``subscribers`` async subscriptions on a runtime over
    store A getting its event, over ``samples`` commits; and, per commit, the µs of CPU the event loop's thread
    spent in that span (``time.thread_time``: the wake, the fan-out and the consumers, not the time other
    processes held the CPU)."""
    from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig

    config = PostgresCheckpointerConfig(schema=f"tl_bench_{uuid.uuid4().hex[:12]}")
    store_a = PostgresCheckpointer.open(url, config)
    store_b = PostgresCheckpointer.open(url, config)
    runtime = GraphRuntime(store_a, node_id="wake")
    now = datetime.now(UTC)
    try:
        # A finished run first: the thread has a checkpoint, so each subscription checks its tenant once.
        runtime.start("wake", Graph("one", {"a": _anode, "b": _anode}, entry="a"), {}).wait(timedelta(seconds=30))
        first = len(store_a.events_after("wake", 0, 100))
        claim = store_b.claim("wake", ClaimRequest(holder="writer", ttl=timedelta(hours=1)))
        latencies: list[float] = []
        loop_cpu: list[float] = []

        async def measure() -> None:
            subscriptions = [runtime.subscribe("wake", first) for _ in range(subscribers)]
            got: list[float] = []
            arrived = asyncio.Event()
            last_cpu = [0.0]

            async def consume(subscription: Any) -> None:
                async for _event in subscription:
                    got.append(time.perf_counter())
                    if len(got) == subscribers:
                        last_cpu[0] = time.thread_time()
                        arrived.set()

            consumers = [asyncio.create_task(consume(s)) for s in subscriptions]
            await asyncio.sleep(1.0 + subscribers / 500)  # every subscription replayed and parked in its wait
            loop = asyncio.get_running_loop()
            for index in range(-1, samples):  # the first commit warms up (not counted)
                got.clear()
                arrived.clear()
                draft = EventDraft(run_id="writer", type="tick", timestamp=now, payload={"n": index})
                started, started_cpu = time.perf_counter(), time.thread_time()
                await loop.run_in_executor(None, store_b.commit, "wake", Commit(token=claim.token, events=(draft,)))
                await asyncio.wait_for(arrived.wait(), 60)
                if index >= 0:
                    latencies.extend((at - started) * 1e6 for at in got)
                    loop_cpu.append((last_cpu[0] - started_cpu) * 1e6)
                await asyncio.sleep(0.05)
            for subscription in subscriptions:
                subscription.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)

        asyncio.run(measure())
        return latencies, loop_cpu
    finally:
        runtime.close()
        store_a.close()
        store_b.close()
        _drop_schema(url, config.schema)


# -- the async store's pool ----------------------------------------------------------------------------------------


def _pool_calls_per_s(workdir: str, workers: int, calls: int) -> float:
    directory = tempfile.mkdtemp(prefix="bench-async-pool-", dir=workdir)
    store = SqliteCheckpointer.open(os.path.join(directory, "s.db"))
    try:
        claim = store.claim("t", ClaimRequest(holder="w", ttl=timedelta(hours=1)))
        store.release("t", claim.token)

        async def measure() -> float:
            aio = AsyncStore(store, max_workers=workers, own_store=False)
            await asyncio.gather(*(aio.current_claim("t") for _ in range(50)))  # start the pool's threads
            started = time.perf_counter()
            await asyncio.gather(*(aio.current_claim("t") for _ in range(calls)))
            elapsed = time.perf_counter() - started
            await aio.close()
            return calls / elapsed

        return asyncio.run(measure())
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def run(settings: Settings, *, runs: int | None = None, calls: int = 1000) -> list[Row]:
    """The section's rows: ``runs`` runs and subscriptions (default :data:`RUNS`, 100 with ``--quick``) and
    ``calls`` concurrent calls for the pool rows."""
    restore = quiet_logs()
    if runs is None:
        runs = 100 if settings.quick else RUNS
    workdir = str(settings.workdir)
    rows: list[Row] = []
    try:
        note = (
            f"async: {runs} concurrent runs of 2 nodes each sleeping {SLEEP * 1000:g} ms, one GraphRuntime over "
            "SQLite (a fresh file per measurement); async = astart + await handle from one event loop, sync = start "
            "+ wait from one thread per run. Each run keeps its thread actor (a pykka thread) either way."
        )
        value, baseline = _async_runs_per_s(workdir, runs), _sync_runs_per_s(workdir, runs)
        rows.append(
            Row("async", f"completed runs/s, {runs} concurrent async runs", value, baseline,
                "the same runs through the sync API from threads", "/s", goal="report", note=note)
        )
        a_threads, a_rss = _parked(workdir, runs, use_async=True)
        s_threads, s_rss = _parked(workdir, runs, use_async=False)
        rows.append(
            Row("async", f"OS threads added, {runs} parked async runs", a_threads, s_threads,
                "the same runs parked in a sync node", "threads", goal="report", note=note)
        )
        rows.append(
            Row("async", "RSS per parked async run", a_rss, s_rss, "a run parked in a sync node", "KiB",
                goal="report", note=note)
        )
        during, before = _subscription_threads(workdir, runs)
        rows.append(
            Row("async", f"OS threads with {runs} idle async subscriptions", during, before,
                "OS threads before them", "threads", goal=f"≤ +{THREAD_GOAL}", met=during - before <= THREAD_GOAL,
                note=note)
        )
        _pool_calls_per_s(workdir, 8, calls)  # warm-up: the first store of the run pays the page cache
        measured = {workers: _pool_calls_per_s(workdir, workers, calls) for workers in (2, 8, 32)}
        for workers in (2, 32):
            rows.append(
                Row("async", f"AsyncStore current_claim calls/s, {calls} concurrent, max_workers={workers}",
                    measured[workers], measured[8], "max_workers=8 (the default)", "/s", goal="report",
                    note=f"async pool: {calls} concurrent current_claim calls through AsyncStore over SQLite.")
            )
        url = os.environ.get(PG_ENV, "").strip()
        if url:
            samples = 5 if settings.quick else 20
            # One subscription gives one latency per commit: 10x the commits, so its p99 is not just its worst
            # commit (at 100 commits the p99 of ``_percentile`` is the maximum).
            many, many_cpu = _wake_latencies(url, runs, samples)
            one, one_cpu = _wake_latencies(url, 1, samples * 10)
            wake_note = (
                f"async wake: {samples} commits of 1 event through store B ({samples * 10} for one subscription; "
                "after one not counted); latency from the commit's start to each "
                f"of {runs} async subscriptions (one thread, a runtime over store A) getting it in `async for`."
            )
            for label, q in (("p50", 0.5), ("p99", 0.99)):
                value = _percentile(many, q)
                rows.append(
                    Row("async", f"wake latency {label}, {runs} idle async subscriptions (PostgreSQL)", value,
                        _percentile(one, q), "one async subscription", "µs",
                        goal=f"p99 ≤ {WAKE_GOAL_US / 1000:g} ms" if q > 0.5 else "",
                        met=value <= WAKE_GOAL_US if q > 0.5 else None, note=wake_note)
                )
            cpu_note = (
                "async wake CPU: the event loop thread's CPU time (time.thread_time) from a commit's start to the "
                "last subscription getting its event, median over the commits; per subscription and commit: "
                f"(value - baseline) / {runs}. Unlike the latencies it leaves out the time other processes held "
                "the CPU (a loaded machine still slows it through shared caches)."
            )
            rows.append(
                Row("async", f"event loop CPU per commit, {runs} idle async subscriptions (PostgreSQL)",
                    _percentile(many_cpu, 0.5), _percentile(one_cpu, 0.5), "one async subscription", "µs",
                    goal="report", note=cpu_note)
            )
        else:
            rows.append(
                Row("async", "wake latency of idle async subscriptions (PostgreSQL)", float("nan"), float("nan"),
                    f"set {PG_ENV} to measure", "µs", goal="", note="")
            )
        return rows
    finally:
        restore()


SECTION = Section(
    name="async",
    title=f"asyncio: {RUNS} async runs vs sync runs from threads; threads and RSS per parked run; wake latency",
    run=run,
    order=45,
)
