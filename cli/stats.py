"""``threadloom stats``: read-only probes of a store through a ``MeteredCheckpointer``, and their metrics.

The command wraps the store named by ``--store`` in a
:class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer` with an
:class:`~threadloom.persistence.metrics.meter.InMemoryMeter`, runs a few rounds of read-only calls (the registry,
incomplete threads, and for a few threads their latest checkpoint, history, events, children and run lookup),
and prints what the meter recorded: calls, errors and latency per store method. Nothing is written, claimed or
swept. It is a quick health and latency check of a store URL from a terminal (README: "The `threadloom`
command"); a long-running host exports the same metrics with a Prometheus or OpenTelemetry meter instead.
"""

from __future__ import annotations

import math
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from threadloom.cli.output import TENANT, CliError, printable, scrub, state_of
from threadloom.domain import validation as v
from threadloom.domain.errors import ProcessingError, ReplayUnavailable, ThreadloomError
from threadloom.domain.values import ThreadQuery
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.meter import HistogramSnapshot, InMemoryMeter, MeterSnapshot
from threadloom.persistence.metrics.metered import CALLS, ERRORS, LATENCY, OPERATIONS, MeteredCheckpointer

PAGE = 50
"""Threads per registry read, checkpoints per history read, children per children read."""
EVENTS_PAGE = 100
"""Events per events read."""


def replay_start(store: Checkpointer, thread_id: str) -> int:
    """The ``after_seq`` that reads the thread's events from the earliest one still kept (its replay floor).

    0 unless retention or compaction dropped older events; then one less than the first event kept. Read with
    one ``events_after`` of one event, whose ``ReplayUnavailable`` names the floor.
    """
    try:
        store.events_after(thread_id, 0, 1)
    except ReplayUnavailable as error:
        return error.earliest_seq - 1
    except ProcessingError:
        raise
    except ThreadloomError:
        return 0
    return 0


def probe(store: Checkpointer, tenant_id: str | None, threads: list[str], sample: int) -> list[str]:
    """One round of read-only calls; returns the threads it read (given ones, else up to ``sample`` listed).

    A thread's events are read from its replay floor (:func:`replay_start`, asked of the store a
    ``MeteredCheckpointer`` wraps, so that the lookup is not metered): a store whose retention dropped old events
    answers without an error. A store error of one call (``ThreadDeleted``, …) ends that call only: it is what
    the meter counts.

    Raises:
        ProcessingError: the storage failed (there is no point in reading on).
    """
    def attempt(call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except ProcessingError:
            raise
        except ThreadloomError:
            return None

    unmetered = store.inner if isinstance(store, MeteredCheckpointer) else store
    page = attempt(store.threads, ThreadQuery(tenant_id=tenant_id, limit=PAGE))
    attempt(store.incomplete, tenant_id, limit=PAGE)
    chosen = list(threads) or ([s.thread_id for s in page.items[:sample]] if page is not None else [])
    for thread_id in chosen:
        stored = attempt(store.latest, thread_id)
        attempt(store.history, thread_id, limit=PAGE)
        attempt(store.events_after, thread_id, replay_start(unmetered, thread_id), EVENTS_PAGE)
        attempt(store.children, thread_id, limit=PAGE)
        if stored is not None:
            attempt(store.lookup_run, thread_id, [stored.checkpoint.run_id])
    return chosen


def _ms(seconds: float) -> float | None:
    return None if math.isinf(seconds) else round(seconds * 1000, 3)


def operations(snapshot: MeterSnapshot) -> list[dict[str, Any]]:
    """Per store method that was called: calls, errors, mean latency and bucket bounds of p50/p99 (ms).

    Ordered as :data:`~threadloom.persistence.metrics.metered.OPERATIONS`. A quantile is the upper bound of the
    latency bucket that holds it (None when only the ``+Inf`` bucket does).
    """
    rows = []
    for op in OPERATIONS:
        calls = snapshot.counter(CALLS, op=op)
        if not calls:
            continue
        latency = snapshot.histogram(LATENCY, op=op) or HistogramSnapshot(count=0, sum=0.0, buckets=())
        rows.append(
            {
                "op": op,
                "calls": int(calls),
                "errors": int(snapshot.counter(ERRORS, op=op)),
                "mean_ms": round(latency.mean * 1000, 3),
                "p50_ms": _ms(latency.quantile(0.5)),
                "p99_ms": _ms(latency.quantile(0.99)),
            }
        )
    return rows


def _bound(ms: float | None) -> Text:
    return Text("> 30 s" if ms is None else f"≤ {ms:g}")


@click.command()
@click.option("--tenant", default=None, type=TENANT, metavar="TENANT",
              help="The tenant whose threads to read (absent: no tenant).")
@click.option("--thread", "threads", multiple=True, metavar="THREAD", help="Read this thread (repeatable).")
@click.option(
    "--sample",
    type=click.IntRange(0, PAGE),
    default=5,
    show_default=True,
    help="Without --thread: read this many of the tenant's most recently updated threads.",
)
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True, help="Probe rounds.")
@click.option(
    "--runtime",
    default=None,
    metavar="HOST:PORT|URL",
    help="Instead of probing the store, read a running worker's metrics port ('threadloom serve --metrics-port').",
)
@click.pass_context
def stats(
    ctx: click.Context, tenant: str | None, threads: tuple[str, ...], sample: int, rounds: int, runtime: str | None
) -> None:
    """Probe the store with read-only calls and print their metrics: calls, errors, latency per method.

    Reads the registry and incomplete threads of --tenant, and for each thread (--thread, or a sample of the
    registry) its latest checkpoint, history, events (from the earliest one retention kept), children and run
    lookup; writes nothing. A healthy store shows no errors. Latency
    quantiles are bucket bounds (ms): p50 ≤ 2.5 means half the calls took at most 2.5 ms. With --json, prints
    the table's rows and the meter's whole snapshot.

    With --runtime HOST:PORT (or an http URL), it opens no store: it reads the Prometheus metrics a running
    worker serves (runs, claims, queue depth, subscription lag, store and queue calls) and prints each
    threadloom sample.
    """
    state = state_of(ctx)
    if runtime is not None:
        if tenant is not None or threads:
            raise CliError("--runtime reads a worker's metrics port: it takes no --tenant or --thread", 2)
        from threadloom.cli.runtime_stats import print_runtime_stats

        print_runtime_stats(state, runtime)
        return
    v.check_optional_id("tenant", tenant)
    for thread_id in threads:
        v.check_id("thread", thread_id)
    meter = InMemoryMeter()
    # The group closes the inner store when the command ends.
    store = MeteredCheckpointer(state.store(read_only=True), meter)
    read: list[str] = []
    failure: ProcessingError | None = None
    for _ in range(rounds):
        try:
            read = probe(store, tenant, list(threads), sample)
        except ProcessingError as error:
            failure = error
            break
    snapshot = meter.snapshot()
    rows = operations(snapshot)
    others = None
    if tenant is None and not threads and not read and failure is None:
        # After the meter's snapshot: these calls are not in the table.
        from threadloom.cli.tenants import other_tenants

        others = other_tenants(store)
    if state.json_output:
        state.emit(
            {
                "store": state.safe_url,
                "tenant_id": tenant,
                "rounds": rounds,
                "threads": read,
                "operations": rows,
                "failure": None if failure is None else scrub(str(failure), state.secrets),
                "snapshot": snapshot.to_dict(),
                **({"other_tenants": others.to_json()} if others is not None else {}),
            }
        )
    else:
        table = Table(
            title=Text(printable(f"store calls on {state.safe_url} ({rounds} round(s), {len(read)} thread(s) read)")),
            title_justify="left",
            header_style="bold",
        )
        for column in ("op", "calls", "errors", "mean ms", "p50 ms", "p99 ms"):
            table.add_column(column, justify="left" if column == "op" else "right")
        for row in rows:
            table.add_row(
                Text(row["op"]),
                Text(str(row["calls"])),
                Text(str(row["errors"]), style="red" if row["errors"] else ""),
                Text(f"{row['mean_ms']:.3f}"),
                _bound(row["p50_ms"]),
                _bound(row["p99_ms"]),
            )
        state.out.print(table)
        if others is not None and others.threads:
            state.out.print(Text(others.hint, style="dim"))
        errors = [
            (dict(labels), value) for (name, labels), value in sorted(snapshot.counters.items()) if name == ERRORS
        ]
        if errors:
            detail = Table(title="errors", title_justify="left", header_style="bold")
            for column in ("op", "error", "count"):
                detail.add_column(column)
            for labels, value in errors:
                detail.add_row(
                    Text(printable(labels.get("op", ""))),
                    Text(printable(labels.get("error", ""))),
                    Text(str(int(value))),
                )
            state.out.print(detail)
    if failure is not None:
        raise CliError(
            f"the store failed while probing {state.safe_url}: {scrub(str(failure), state.secrets)}",
            kind=type(failure).__name__,
        )


__all__ = ["operations", "probe", "replay_start", "stats"]
