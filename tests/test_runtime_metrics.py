"""The runtime's metrics (``GraphRuntime(meter=...)``) read from a real ``prometheus_client`` registry, and
``threadloom serve --metrics-port`` read by ``threadloom stats --runtime`` from a real worker process.

Runs of a small graph on a SQLite store whose clock is a ManualClock (so a claim expires when the test says):
a completed run, a failed node, a run that dies holding its thread and is taken over by a recovery (the dead
run then finds its claim lost), the queue's depth and the oldest open entry's age, and a subscription's lag.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from threadloom import (
    CheckpointStatus,
    ClaimPolicy,
    Graph,
    GraphRuntime,
    ManualClock,
    RunFailed,
    ServePolicy,
    SqliteCheckpointer,
    StaleClaim,
    Step,
    WatchPolicy,
)
from threadloom.actors import metrics as m
from threadloom.testing.harness import START

prometheus_client = pytest.importorskip("prometheus_client")

WAIT = timedelta(seconds=10)
TTL = timedelta(seconds=30)


def small_graph(gate: threading.Event | None = None) -> Graph:
    """a -> b; b waits for ``gate`` when given, and fails when the state asks it to."""

    def a(state, ctx):
        ctx.emit("a.done", None)
        return Step.to("b", {**state, "a": True})

    def b(state, ctx):
        if gate is not None:
            assert gate.wait(10), "the test never opened the gate"
        if state.get("fail"):
            raise RuntimeError("asked to fail")
        return Step.end({**state, "b": True})

    return Graph("small", {"a": a, "b": b}, entry="a")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    store = SqliteCheckpointer.open(str(tmp_path / "metrics.db"), clock=clock)
    yield store
    store.close()


@pytest.fixture
def meter():
    from threadloom.persistence.metrics.prometheus import PrometheusMeter

    return PrometheusMeter(prometheus_client.CollectorRegistry())


def value(meter, name: str, **labels: str) -> float | None:
    return meter.registry.get_sample_value(name, labels)


def runs(meter, what: str) -> float:
    return value(meter, f"threadloom_runs_{what}_total", graph_id="small") or 0.0


def test_runs_completed_failed_taken_over_and_lost_claims_are_counted(store, clock, meter) -> None:
    runtime = GraphRuntime(store, node_id="n1", claim_policy=ClaimPolicy(ttl=TTL), meter=meter)
    try:
        assert runtime.metrics.meter is meter
        runtime.start("ok", small_graph(), {}).wait(WAIT)
        assert (runs(meter, "started"), runs(meter, "completed"), runs(meter, "failed")) == (1, 1, 0)
        with pytest.raises(RunFailed):
            runtime.start("bad", small_graph(), {"fail": True}).wait(WAIT)
        assert (runs(meter, "started"), runs(meter, "completed"), runs(meter, "failed")) == (2, 1, 1)

        # A run that stops holding its thread (a paused process): its claim expires by the store's clock, a
        # recovery takes it over and finishes the run; the first run then finds its claim lost.
        gate = threading.Event()
        stuck = runtime.start("held", small_graph(gate), {})
        deadline = time.monotonic() + 10
        while store.latest("held").checkpoint.metadata.get("threadloom.next") != "b":
            assert time.monotonic() < deadline, "node a never committed"
            time.sleep(0.01)
        clock.advance(TTL + timedelta(seconds=1))
        other = GraphRuntime(store, node_id="n2", claim_policy=ClaimPolicy(ttl=TTL), meter=meter)
        try:
            recovered = other.recover("held", small_graph()).wait(WAIT)
            assert recovered.state == {"a": True, "b": True}
        finally:
            other.close()
        assert (runs(meter, "recovered"), runs(meter, "taken_over"), runs(meter, "completed")) == (1, 1, 2)
        assert value(meter, "threadloom_claims_lost_total", graph_id="small") is None
        gate.set()
        with pytest.raises(StaleClaim):
            stuck.wait(WAIT)
        assert value(meter, "threadloom_claims_lost_total", graph_id="small") == 1
        assert runs(meter, "failed") == 2  # the fenced run ends failed (run.failed), the failed node before it
        assert (runs(meter, "started"), runs(meter, "suspended"), runs(meter, "stopped")) == (3, 0, 0)
        assert runtime.metrics.failures == 0
    finally:
        runtime.close()


def test_queue_depth_and_the_oldest_open_entry_age_while_serving(store, clock, meter) -> None:
    first = store.queue.enqueue("q1", graph_id="elsewhere")  # a graph this worker does not serve: stays open
    clock.advance(timedelta(seconds=5))
    store.queue.enqueue("q2", graph_id="elsewhere")
    store.queue.enqueue("q3", graph_id="small", input={})
    runtime = GraphRuntime(store, node_id="n1", meter=meter)
    try:
        server = runtime.serve([small_graph()], policy=ServePolicy(poll_interval=timedelta(milliseconds=20)),
                               block=False)
        deadline = time.monotonic() + 10
        while store.queue.entry(3).status.value == "open" or value(meter, m.QUEUE_DEPTH) != 2:
            assert time.monotonic() < deadline, (store.queue.entry(3), value(meter, m.QUEUE_DEPTH))
            clock.advance(timedelta(milliseconds=100))  # a sample is due at most once a QUEUE_SAMPLE_INTERVAL
            time.sleep(0.05)
        assert first.entry_id == 1
        age = value(meter, m.QUEUE_OLDEST_AGE)
        assert age is not None and age >= 5  # q1, enqueued 5 s (and a little) before the others by the store clock
        server.stop()
        server.join(WAIT)
    finally:
        runtime.close()
    assert runs(meter, "started") == 1 and runs(meter, "completed") == 1


def test_subscription_lag_is_the_events_read_and_not_yet_taken(store, meter) -> None:
    runtime = GraphRuntime(
        store, node_id="n1", meter=meter, watch_policy=WatchPolicy(poll_interval=timedelta(milliseconds=20))
    )
    try:
        runtime.start("t", small_graph(), {}).wait(WAIT)
        events = store.events_after("t", 0, 100)
        assert len(events) == 3  # run started, a.done, run completed
        subscription = runtime.subscribe("t")
        deadline = time.monotonic() + 10
        while value(meter, m.SUBSCRIPTION_LAG, node_id="n1") != 3:
            assert time.monotonic() < deadline, value(meter, m.SUBSCRIPTION_LAG, node_id="n1")
            time.sleep(0.01)
        assert subscription.lag == 3
        assert subscription.get(WAIT).seq == 1
        assert value(meter, m.SUBSCRIPTION_LAG, node_id="n1") == 2
        subscription.get(WAIT), subscription.get(WAIT)
        assert value(meter, m.SUBSCRIPTION_LAG, node_id="n1") == 0
        subscription.cancel()
    finally:
        runtime.close()


def test_a_meter_without_gauges_loses_only_the_gauges(store) -> None:
    """A meter written before gauges existed: runs are counted, the gauges are refused (logged once)."""
    from structlog.testing import capture_logs

    from threadloom.persistence.metrics.meter import InMemoryMeter, Meter

    class Counting(Meter):
        def __init__(self) -> None:
            self.inner = InMemoryMeter()

        def counter(self, name, labels=()):
            return self.inner.counter(name, labels)

        def histogram(self, name, labels=()):
            return self.inner.histogram(name, labels)

    counting = Counting()
    with capture_logs() as logs:
        runtime = GraphRuntime(store, node_id="n1", meter=counting)
        try:
            runtime.start("t", small_graph(), {}).wait(WAIT)
            runtime.metrics.queue_depth(store.queue.depth())
            runtime.metrics.queue_depth(store.queue.depth())
        finally:
            runtime.close()
    assert counting.inner.snapshot().counter(m.RUNS_COMPLETED, graph_id="small") == 1
    assert runtime.metrics.failures >= 2
    assert [entry["event"] for entry in logs].count("metrics.failed") == 1


def test_the_runtime_metrics_reach_an_opentelemetry_reader(store) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from threadloom.persistence.metrics.otel import OpenTelemetryMeter

    reader = InMemoryMetricReader()
    meter = OpenTelemetryMeter(sdk.MeterProvider(metric_readers=[reader]))
    runtime = GraphRuntime(store, node_id="n1", meter=meter)
    try:
        runtime.start("t", small_graph(), {}).wait(WAIT)
        runtime.metrics.queue_depth(store.queue.depth())
    finally:
        runtime.close()
    seen = {
        metric.name: [point.value for point in metric.data.data_points]
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert seen["threadloom_runs_started"] == [1] and seen["threadloom_runs_completed"] == [1]
    assert seen[m.QUEUE_DEPTH] == [0]


# -- a real worker process, read by stats --runtime ---------------------------------------------------------------

GRAPH_MODULE = '''
from threadloom import Graph, Step


def a(state, ctx):
    return Step.to("b", {**state, "a": True})


def b(state, ctx):
    if state.get("fail"):
        raise RuntimeError("asked to fail")
    return Step.end({**state, "b": True})


graph = Graph("small", {"a": a, "b": b}, entry="a")
'''


def _stats(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "threadloom", "stats", "--runtime", url, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _sqlite_target(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Any]:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    path = tmp_path / "served.db"
    SqliteCheckpointer.open(str(path)).close()
    return f"sqlite:///{path}", lambda: SqliteCheckpointer.open(str(path))


def _postgres_target(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Any]:
    from threadloom.persistence.postgres.store import PostgresCheckpointer
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()  # skips loudly without a server (fails under CI=true)
    request.addfinalizer(harness.cleanup)
    harness.open_pg().close()  # creates the schema
    sep = "&" if "?" in harness.dsn else "?"
    return f"{harness.dsn}{sep}schema={harness.schema}", lambda: PostgresCheckpointer.open(
        harness.dsn, harness.config()
    )


@pytest.fixture(
    params=[_sqlite_target, pytest.param(_postgres_target, marks=pytest.mark.postgres)], ids=["sqlite", "postgres"]
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """``(store URL, open)``: a fresh store the commands open by URL, and how the test opens it."""
    return request.param(tmp_path, request)


def _entries(open_store: Any) -> list[Any]:
    with open_store() as store:
        return store.queue.entries(limit=100)


@pytest.mark.slow
def test_stats_runtime_reads_a_serving_worker_process(tmp_path: Path, target: tuple[str, Any]) -> None:
    url_of_store, open_store = target
    (tmp_path / "smallgraph.py").write_text(GRAPH_MODULE)
    with open_store() as store:
        store.queue.enqueue("ok-1", graph_id="small", input={})
        store.queue.enqueue("ok-2", graph_id="small", input={})
        store.queue.enqueue("bad", graph_id="small", input={"fail": True})
        store.queue.enqueue("waits", graph_id="not-served", input={})
    before = _entries(open_store)
    worker = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", url_of_store, "serve", "--graph", "smallgraph:graph",
         "--metrics-port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        first = worker.stdout.readline()
        found = re.search(r"metrics at (http://127\.0\.0\.1:(\d+)/metrics)", first)
        assert found, (first, worker.stderr.read() if worker.poll() is not None else "")
        assert first.startswith("serving small from ")
        url, port = found.group(1), found.group(2)
        deadline = time.monotonic() + 30
        while True:
            result = _stats(f"127.0.0.1:{port}")
            assert result.returncode == 0, result.stderr
            document = json.loads(_stats(url, "--json").stdout)
            samples = {(s["name"], tuple(sorted(s["labels"].items()))): s["value"] for s in document["metrics"]}
            done = samples.get(("threadloom_runs_completed_total", (("graph_id", "small"),))) == 2
            depth = samples.get(("threadloom_queue_depth", ()))
            if done and samples.get(("threadloom_runs_failed_total", (("graph_id", "small"),))) == 1 and depth == 1:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.3)
        assert document["runtime"] == url
        assert samples[("threadloom_runs_started_total", (("graph_id", "small"),))] == 3
        assert samples[("threadloom_queue_finished_total", (("status", "completed"),))] == 2
        assert samples[("threadloom_queue_finished_total", (("status", "failed"),))] == 1
        assert samples[("threadloom_claims_total", (("outcome", "granted"),))] == 3
        assert all(name.startswith("threadloom_") for name, _ in samples)
        table = result.stdout
        assert "threadloom_runs_completed_total" in table and "graph_id=small" in table
        assert "threadloom_queue_depth" in table
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.stderr.read()
    after = _entries(open_store)
    assert [(e.thread_id, e.status.value) for e in after] == [
        ("ok-1", "completed"), ("ok-2", "completed"), ("bad", "failed"), ("waits", "open")
    ]
    assert after[3] == before[3]  # the entry of a graph not served is untouched
    # The port is closed with the worker: nothing answers any more (exit 1, one line).
    gone = _stats(url)
    assert gone.returncode == 1 and "cannot read the metrics at" in gone.stderr


def test_serve_refuses_a_bad_graph_and_a_taken_port_with_nothing_changed(
    tmp_path: Path, target: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from click.testing import CliRunner

    from threadloom.cli.main import cli

    url_of_store, open_store = target
    with open_store() as store:
        store.queue.enqueue("t", graph_id="small", input={})
    before = _entries(open_store)
    (tmp_path / "smallgraph.py").write_text(GRAPH_MODULE)
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(cli, ["--store", url_of_store, "serve", "--graph", "nosuch:graph"])
    assert missing.exit_code == 2 and "--graph nosuch:graph" in missing.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(
            cli, ["--store", url_of_store, "serve", "--graph", "smallgraph:graph", "--metrics-port", str(port)]
        )
    assert busy.exit_code == 2 and f"metrics port {port}" in busy.output
    assert _entries(open_store) == before


def test_stats_runtime_refuses_a_bad_target_and_store_options(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from threadloom.cli.main import cli

    url = f"sqlite:///{tmp_path / 'never.db'}"
    bad = CliRunner().invoke(cli, ["--store", url, "stats", "--runtime", "not a url"])
    assert bad.exit_code == 2 and "--runtime must be HOST:PORT" in bad.output
    mixed = CliRunner().invoke(cli, ["--store", url, "stats", "--runtime", "127.0.0.1:9", "--thread", "t"])
    assert mixed.exit_code == 2 and "takes no --tenant or --thread" in mixed.output
    assert not list(tmp_path.iterdir())  # the store was not opened


def test_the_command_line_alone_enqueues_and_serves_on_a_new_sqlite_file(tmp_path: Path) -> None:
    """Found by a new user: ``queue enqueue`` and ``serve`` refused a store that did not exist yet, and the error
    advised ``demo`` (which fills it with demo runs). Both write, so both create it; real processes."""
    (tmp_path / "smallgraph.py").write_text(GRAPH_MODULE)
    url = f"sqlite:///{tmp_path / 'new.db'}"
    enqueued = subprocess.run(
        [sys.executable, "-m", "threadloom", "--store", url, "--json", "queue", "enqueue", "t1", "--graph", "small",
         "--input", '{"n": 1}'],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert enqueued.returncode == 0, enqueued.stderr
    assert json.loads(enqueued.stdout)["entry"]["status"] == "open"
    worker = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", f"sqlite:///{tmp_path / 'other.db'}", "serve", "--graph",
         "smallgraph:graph"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout.readline().startswith("serving small from "), worker.stderr.read()
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    assert (tmp_path / "other.db").exists()  # the worker created its store before anything was enqueued
    worker = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", url, "serve", "--graph", "smallgraph:graph"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        store = SqliteCheckpointer.open(str(tmp_path / "new.db"), read_only=True)
        try:
            deadline = time.monotonic() + 30
            while (latest := store.latest("t1")) is None or latest.checkpoint.status is not CheckpointStatus.COMPLETED:
                assert time.monotonic() < deadline and worker.poll() is None, worker.stderr.read()
                time.sleep(0.1)
            assert latest.checkpoint.state == {"n": 1, "a": True, "b": True}
        finally:
            store.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
