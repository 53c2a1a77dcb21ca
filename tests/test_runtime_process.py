"""A real crash: a worker process is SIGKILLed in the middle of a run on a SQLite file, and this process recovers
the run once the dead worker's claim expired, without re-running the node that had committed (DESIGN §5). And a
worker killed after its effect ran but before the step committed: the recovery calls the effect again, with the
same idempotency key (on SQLite and PostgreSQL)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest

from threadloom import CheckpointStatus, ClaimPolicy, GraphRuntime, ThreadBusy

GRAPH_MODULE = textwrap.dedent(
    """
    import os, time
    from threadloom import Graph, Step

    LOG = os.environ["CRASH_LOG"]

    def note(line):
        with open(LOG, "a") as handle:
            handle.write(line + "\\n")

    def a(state, ctx):
        note("a " + ctx.run_id)
        ctx.effect("side-effect", lambda: note("effect " + ctx.run_id) or "done")
        return Step.to("b", {**state, "a": True})

    def b(state, ctx):
        note("b " + ctx.run_id)
        if os.environ.get("CRASH_HANG") == "1":
            print("READY", flush=True)
            time.sleep(60)
        return Step.end({**state, "b": True})

    GRAPH = Graph("crashy", {"a": a, "b": b}, entry="a")
    """
)

WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    sys.path.insert(0, sys.argv[2])
    from crash_graph import GRAPH
    from threadloom import ClaimPolicy, GraphRuntime, SqliteCheckpointer

    store = SqliteCheckpointer.open(sys.argv[1])
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    runtime = GraphRuntime(store, node_id="doomed", claim_policy=policy)
    runtime.start("t1", GRAPH, {"x": 1}, tenant_id="acme").wait()
    """
)


def _load(path):
    return _load_module(path, "crash_graph")


def _load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_sigkilled_workers_run_is_recovered_by_another_process(tmp_path, monkeypatch):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    (tmp_path / "crash_graph.py").write_text(GRAPH_MODULE)
    log = tmp_path / "calls.log"
    db = str(tmp_path / "crash.db")
    env = {**os.environ, "CRASH_LOG": str(log), "CRASH_HANG": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, db, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        for line in worker.stdout:  # unconfigured structlog prints its lines here too
            if line.strip() == "READY":
                break
        else:
            pytest.fail("the worker ended before it reached node b")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.stdout.close()
    monkeypatch.setenv("CRASH_LOG", str(log))
    graph = _load(tmp_path / "crash_graph.py").GRAPH
    store = SqliteCheckpointer.open(db)
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    try:
        with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
            deadline = time.monotonic() + 10
            while True:
                try:
                    handle = runtime.recover("t1", graph, tenant_id="acme")
                    break
                except ThreadBusy as busy:  # the dead worker's claim lives until its ttl runs out
                    assert str(busy.holder).startswith("held by run 'doomed:")
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            outcome = handle.wait(timedelta(seconds=10))
        assert outcome.status is CheckpointStatus.COMPLETED and outcome.state == {"x": 1, "a": True, "b": True}
        calls = [line.split()[0] + " " + line.split()[1].split(":")[0] for line in log.read_text().splitlines()]
        assert calls == ["a doomed", "effect doomed", "b doomed", "b rescuer"]
        assert store.latest("t1").checkpoint.run_id == handle.run_id
    finally:
        store.close()


PAY_GRAPH = textwrap.dedent(
    """
    import os, time
    from threadloom import Graph, Step

    LOG = os.environ["PAY_LOG"]

    def pay(state, ctx):
        def call_provider(idempotency_key):
            with open(LOG, "a") as handle:
                handle.write(f"pay {ctx.run_id} {idempotency_key}\\n")
            return {"paid": state["amount"], "by": ctx.run_id}

        receipt = ctx.effect("pay", call_provider)
        if os.environ.get("PAY_HANG") == "1":
            print("PAID", flush=True)
            time.sleep(60)  # SIGKILLed here: after the provider was called, before the step committed
        return Step.end({**state, "receipt": receipt})

    GRAPH = Graph("payer", {"pay": pay}, entry="pay")
    """
)

PAY_WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    sys.path.insert(0, sys.argv[1])
    from pay_graph import GRAPH
    from threadloom import ClaimPolicy, GraphRuntime, PostgresCheckpointer, PostgresCheckpointerConfig, open_store

    if sys.argv[2] == "sqlite":
        store = open_store("sqlite:///" + sys.argv[3])
    else:
        store = PostgresCheckpointer.open(sys.argv[3], config=PostgresCheckpointerConfig(schema=sys.argv[4]))
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    runtime = GraphRuntime(store, node_id="doomed", claim_policy=policy)
    runtime.start("t1", GRAPH, {"amount": 5}, tenant_id="acme").wait()
    """
)


@pytest.fixture(params=["sqlite", "postgres"])
def pay_store(request, tmp_path):
    """``(worker arguments, a store over the same storage)`` for the worker's SQLite file or PostgreSQL schema."""
    if request.param == "sqlite":
        from threadloom.persistence.sqlite.store import SqliteCheckpointer

        db = str(tmp_path / "pay.db")
        store = SqliteCheckpointer.open(db)
        yield ["sqlite", db], store
        store.close()
        return
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        store = harness.open()
        yield ["postgres", harness.dsn, harness.schema], store
    finally:
        harness.cleanup()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_worker_killed_after_its_effect_ran_is_recovered_with_the_same_idempotency_key(
    tmp_path, monkeypatch, pay_store
):
    from threadloom import effect_keys

    arguments, store = pay_store
    (tmp_path / "pay_graph.py").write_text(PAY_GRAPH)
    log = tmp_path / "provider.log"
    env = {**os.environ, "PAY_LOG": str(log), "PAY_HANG": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-c", PAY_WORKER, str(tmp_path), *arguments], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        for line in worker.stdout:  # unconfigured structlog prints its lines here too
            if line.strip() == "PAID":
                break
        else:
            pytest.fail("the worker ended before it called the provider")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.stdout.close()
    doomed_run = store.latest("t1").checkpoint.run_id  # the admission committed; the step never did
    keys = effect_keys("t1", "pay", turn_id=doomed_run)
    assert store.effect("t1", keys.intent).run_id == doomed_run  # the intent committed before the call
    assert store.effect("t1", keys.record) is None
    monkeypatch.setenv("PAY_LOG", str(log))
    monkeypatch.delenv("PAY_HANG", raising=False)
    graph = _load_module(tmp_path / "pay_graph.py", "pay_graph").GRAPH
    policy = ClaimPolicy(ttl=timedelta(seconds=1), renew_every=timedelta(milliseconds=200))
    with GraphRuntime(store, node_id="rescuer", claim_policy=policy) as runtime:
        deadline = time.monotonic() + 10
        while True:
            try:
                handle = runtime.recover("t1", graph, tenant_id="acme")
                break
            except ThreadBusy:  # the dead worker's claim lives until its ttl runs out
                assert time.monotonic() < deadline
                time.sleep(0.05)
        outcome = handle.wait(timedelta(seconds=10))
    calls = [line.split() for line in log.read_text().splitlines()]
    # At least once: the provider was called by both processes, with one idempotency key.
    assert [(call[0], call[1].split(":")[0]) for call in calls] == [("pay", "doomed"), ("pay", "rescuer")]
    assert calls[0][2] == calls[1][2] == keys.idempotency
    # Recorded once: the rescuer's result, which the completed state holds.
    record = store.effect("t1", keys.record)
    assert record.run_id == handle.run_id and outcome.state["receipt"] == record.result
    assert outcome.status is CheckpointStatus.COMPLETED
