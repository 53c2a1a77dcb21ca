"""``threadloom demo-worker`` (hidden): one worker process of ``threadloom demo``.

The coordinator starts it as ``python -m threadloom demo-worker`` with the store URL in ``$THREADLOOM_STORE``; it
serves the store's run queue with the sample graphs until SIGTERM (or until its coordinator is gone).
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta

import click
import structlog

from threadloom.actors.policies import ClaimPolicy, ServePolicy
from threadloom.actors.runtime import GraphRuntime
from threadloom.cli.demo.graph import Ledger, build_graphs
from threadloom.cli.demo.metrics import METRICS_HOST, port_taken
from threadloom.cli.output import DURATION, CliError, state_of
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.persistence.queue import RunQueue


@click.command(name="demo-worker", hidden=True)
@click.option("--name", required=True, help="The worker's node id (its RunIds start with it).")
@click.option("--ledger", "ledger_path", required=True, type=click.Path(dir_okay=False), help="The effect ledger.")
@click.option("--concurrency", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option("--ttl", type=DURATION, default="3s", show_default=True)
@click.option("--renew-every", type=DURATION, default="1s", show_default=True)
@click.option("--pace", type=click.FloatRange(0, 10), default=1.0, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Meter the store and serve its metrics on this port of 127.0.0.1.")
@click.pass_context
def demo_worker(
    ctx: click.Context,
    name: str,
    ledger_path: str,
    concurrency: int,
    ttl: timedelta,
    renew_every: timedelta,
    pace: float,
    metrics_port: int | None,
) -> None:
    """A worker of ``threadloom demo``: serves the store's run queue with the sample graphs until SIGTERM.

    With ``--metrics-port`` its store is a ``MeteredCheckpointer`` over a ``PrometheusMeter`` served on that port
    of 127.0.0.1 until the worker stops (port taken: exit 2 before serving the queue).
    """
    state = state_of(ctx)
    store: Checkpointer = state.store()
    if not isinstance(getattr(store, "queue", None), RunQueue):
        raise CliError(f"the store {state.safe_url!r} has no run queue")
    endpoint = None
    meter = None
    if metrics_port is not None:
        from threadloom.persistence.metrics.prometheus import PrometheusMeter

        try:
            import prometheus_client

            meter = PrometheusMeter(prometheus_client.CollectorRegistry())
            endpoint = meter.serve(metrics_port, host=METRICS_HOST)
        except ImportError as error:
            raise CliError(f"--metrics-port needs the metrics extra: {error}", 2) from error
        except OSError as error:
            raise port_taken(metrics_port, error.strerror or str(error)) from error
        store = MeteredCheckpointer(store, meter)  # the CLI state still closes the inner store at the end
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ledger = Ledger(ledger_path, worker=name, tool_latency_s=0.1 * pace)
    policy = ServePolicy(
        lease_ttl=ttl,
        renew_every=renew_every,
        poll_interval=timedelta(milliseconds=100),
        busy_delay=timedelta(milliseconds=250),
        max_attempts=100,
    )
    runtime = GraphRuntime(
        store, node_id=name, claim_policy=ClaimPolicy(ttl=ttl, renew_every=renew_every), meter=meter
    )
    try:
        graphs = build_graphs(runtime, ledger, pace=pace)
        server = runtime.serve(graphs, concurrency=concurrency, policy=policy, block=False)
        structlog.get_logger("threadloom.demo").info(
            "demo.worker_serving", worker=name, pid=os.getpid(), metrics=None if endpoint is None else endpoint.url
        )
        parent = os.getppid()
        while not stop.wait(0.5):
            if os.getppid() != parent:  # the coordinator died without stopping us: do not serve on as an orphan
                break
        server.stop()
    finally:
        runtime.close()
        ledger.close()
        if endpoint is not None:
            endpoint.close()
    structlog.get_logger("threadloom.demo").info("demo.worker_stopped", worker=name, pid=os.getpid())


__all__ = ["demo_worker"]
