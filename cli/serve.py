"""``threadloom serve``: a worker process that works the store's run queue with your graphs until SIGTERM.

It runs ``GraphRuntime.serve`` (README "Agent runs that survive crashes", "Stopping a worker") on the store named
by ``--store``, with the graphs named by ``--graph module:attr``. With ``--metrics-port N`` the store (and its
run queue) is metered and the runtime records its own metrics (runs, lost claims, queue depth, subscription lag)
into one ``PrometheusMeter``, served on ``--metrics-host`` (the loopback by default) port N while it runs:
``threadloom stats --runtime HOST:N`` prints them. The first line on stdout says what it serves and where its
metrics are (a JSON object with ``--json``).
"""

from __future__ import annotations

from typing import Any

import click
import structlog

from threadloom.cli.output import CliError, printable, state_of
from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.queue import RunQueue


def _graphs(specs: tuple[str, ...]) -> list[Any]:
    from threadloom.actors.graph import Graph
    from threadloom.cli.thread_ops import _graph

    graphs = []
    for spec in specs:
        graph = _graph(spec)
        if not isinstance(graph, Graph):  # pragma: no cover - load_graph returns a Graph or refuses
            raise CliError(f"--graph {spec}: not a Graph", 2, kind="ValidationError")
        graphs.append(graph)
    ids = [graph.graph_id for graph in graphs]
    if len(set(ids)) != len(ids):
        raise CliError(f"--graph names one graph id twice: {sorted(ids)}", 2, kind="ValidationError")
    return graphs


def _check_listen_address(host: str, shown: str) -> None:
    """Refuses an IP address nothing on this machine can be reached at though a socket binds it (multicast, the
    broadcast address): the printed URL would lead nowhere (found by hostile testing)."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return  # a host name: resolved (and refused if it is not this machine's) when the endpoint binds
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        kind = "a multicast" if address.is_multicast else "the broadcast"
        raise CliError(
            f"--metrics-host {shown} is {kind} address, not one a scraper can reach this machine at; give one of "
            "its addresses, e.g. 127.0.0.1 or 0.0.0.0 for every interface", 2, kind="ValidationError",
        )  # fmt: skip


def _metrics_endpoint(port: int, host: str) -> tuple[Any, Any]:
    """A ``PrometheusMeter`` and the endpoint serving it on ``host`` port ``port``, listening already.

    Raises:
        CliError: (exit status 2) the metrics extra is missing; ``--metrics-host`` is empty, names no address this
            machine can resolve or is not one of its addresses; ``--metrics-port`` is taken or not allowed.
    """
    import errno
    import socket

    try:
        import prometheus_client

        from threadloom.persistence.metrics.prometheus import PrometheusMeter
    except ImportError as error:
        raise CliError(f"--metrics-port needs the metrics extra: {error}", 2) from error
    meter = PrometheusMeter(prometheus_client.CollectorRegistry())
    shown = printable(repr(host))
    _check_listen_address(host, shown)
    try:
        return meter, meter.serve(port, host=host)
    except ValidationError as error:
        raise CliError(f"--metrics-host {shown}: {'; '.join(error.problems)}", 2, kind="ValidationError") from error
    except (socket.gaierror, UnicodeError, ValueError) as error:  # the name does not resolve (or cannot be one)
        why = error.strerror if isinstance(error, socket.gaierror) and error.strerror else str(error)
        raise CliError(
            f"--metrics-host {shown} is not a host name or IPv4 address this machine can resolve ({printable(why)}); "
            "give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0 for every interface", 2,
            kind="ValidationError",
        ) from error  # fmt: skip
    except OSError as error:
        why = printable(error.strerror or str(error))
        if error.errno == errno.EADDRNOTAVAIL:
            raise CliError(
                f"--metrics-host {shown} is not an address of this machine, so nothing can listen on it ({why}); "
                "give one of its addresses, e.g. 127.0.0.1 or 0.0.0.0 for every interface", 2,
                kind="ValidationError",
            ) from error  # fmt: skip
        raise CliError(
            f"metrics port {port} on {printable(host)} is not available ({why}); choose another --metrics-port", 2,
        ) from error  # fmt: skip


@click.command()
@click.option(
    "--graph",
    "graph_specs",
    required=True,
    multiple=True,
    metavar="MODULE:ATTR",
    help="A Graph to serve (or a function returning one), importable from the working directory; repeat for several.",
)
@click.option(
    "--concurrency", type=click.IntRange(1, 256), default=1, show_default=True, help="Workers: entries worked at once."
)
@click.option(
    "--node-id", default=None, metavar="NAME", help="Names this worker in RunIds and log lines [default: HOST-PID]."
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="N",
    help="Meter the store, its run queue and the runtime, and serve the metrics on this port "
    "(0: a free port, printed).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    metavar="HOST",
    help="The address the metrics port listens on (0.0.0.0 to be scraped from other machines).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    graph_specs: tuple[str, ...],
    concurrency: int,
    node_id: str | None,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Work the store's run queue with the given graphs until SIGTERM or Ctrl-C.

    Each worker leases an entry of one of the graphs, runs it (or recovers a run a dead worker left), and
    finishes the entry. The first SIGTERM or Ctrl-C lets the nodes in flight commit, hands their entries back and
    exits 0; a second abandons them. Exit status 2, before the store is opened: a bad --graph, a metrics port
    that is taken, or a --metrics-host that does not resolve or is not an address of this machine.
    """
    from threadloom.actors.policies import ServePolicy
    from threadloom.actors.runtime import GraphRuntime

    state = state_of(ctx)
    if node_id is not None:
        v.check_id("node_id", node_id)
    graphs = _graphs(graph_specs)
    endpoint = None
    meter = None
    if metrics_port is None and ctx.get_parameter_source("metrics_host") is not click.core.ParameterSource.DEFAULT:
        raise CliError("--metrics-host needs --metrics-port: without it nothing is served", 2, kind="UsageError")
    if metrics_port is not None:  # before the store is opened (or created): a bad host or port changes nothing
        meter, endpoint = _metrics_endpoint(metrics_port, metrics_host)
    try:
        store: Checkpointer = state.store(create=True)  # a worker may start before anything was enqueued
        if not isinstance(getattr(store, "queue", None), RunQueue):
            raise CliError(f"the store {state.safe_url!r} has no run queue")
        if meter is not None:
            from threadloom.persistence.metrics.metered import MeteredCheckpointer

            store = MeteredCheckpointer(store, meter)  # the CLI state still closes the inner store at the end
        runtime = GraphRuntime(store, node_id=node_id, meter=meter)
        served = sorted(graph.graph_id for graph in graphs)
        line: dict[str, Any] = {
            "serving": served,
            "store": state.safe_url,
            "node_id": runtime.node_id,
            "concurrency": concurrency,
            "metrics": None if endpoint is None else endpoint.url,
        }

        def announce(_server: object) -> None:
            # Printed once the workers run and SIGTERM / Ctrl-C stop them cleanly: a supervisor that signals the
            # process as soon as it reads this line gets a clean stop (exit 0), never the default death.
            if state.json_output:
                state.emit(line)
            else:
                where = "" if endpoint is None else f"; metrics at {endpoint.url}"
                state.out.print(
                    f"serving {', '.join(served)} from {state.safe_url} as {runtime.node_id} "
                    f"({concurrency} worker(s)){where}",
                    markup=False, highlight=False, soft_wrap=True,
                )  # fmt: skip
            state.out.file.flush()
            structlog.get_logger("threadloom.cli").info("serve.started", **line)

        with runtime:
            runtime.serve(graphs, concurrency=concurrency, policy=ServePolicy(), block=True, on_started=announce)
            structlog.get_logger("threadloom.cli").info("serve.stopped", node_id=runtime.node_id)
    except ValidationError as error:
        raise CliError(str(error), 2, kind="ValidationError") from error
    finally:
        if endpoint is not None:
            endpoint.close()


__all__ = ["serve"]
