"""``threadloom demo``: real worker processes, a real crash, and a verification of what the store kept.

The command is the coordinator:

1. It opens the store — a SQLite file in a fresh temporary folder, or the one ``--store`` names — and enqueues
   ``--runs`` runs of the sample agent graph (:mod:`threadloom.cli.demo.graph`) on threads ``demo-001``… of tenant
   ``acme``.
2. It starts ``--workers`` worker processes (``python -m threadloom demo-worker``, hidden), each serving the run
   queue with a short claim and lease ttl; they log JSON lines to files in the demo's folder.
3. Unless ``--no-crash``, once a quarter of the runs completed it SIGKILLs the worker that holds the most runs
   in the middle of their work. Its claims and leases expire; the other workers take its threads over and
   recover them from their latest checkpoints, reading recorded effects instead of running them again (a call
   the crash cut off before its step committed is made again, with the same idempotency key).
4. It shows progress live (a rich display on a terminal, plain lines otherwise), stops the workers once every
   run finished, and verifies the store and the effect ledger (:func:`~threadloom.cli.demo.verify.verify`):
   every run completed; each effect recorded once, re-executions with its idempotency key; every event log
   gap-free; no write with a stale token accepted; tokens strictly increasing. It prints a table (or, with
   ``--json``, one JSON document) and exits 1 if a check failed.

The effect ledger (:class:`~threadloom.cli.demo.graph.Ledger`) stands in for the outside world: a tool provider
that executes each idempotency key once. It is what the verification counts executions with.

With ``--metrics-port N`` every store call of the demo is metered
(:class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer` into a
:class:`~threadloom.persistence.metrics.prometheus.PrometheusMeter`) and served in the Prometheus text format on the
loopback only (:class:`~threadloom.cli.demo.metrics.DemoMetrics`): worker ``k`` serves its own store's metrics on
port ``N+k``; the coordinator serves on ``N`` its own store's metrics (the progress reads, the verification and its
stale-token probes) together with every worker's, read from their ports at each scrape, each series labelled
``process`` (``coordinator``, ``worker-1``…), plus ``threadloom_demo_process_up`` saying whose series are there.
Run-queue calls (enqueue, lease, complete) are not metered: ``MeteredCheckpointer`` forwards ``store.queue`` as is.
"""

from __future__ import annotations

import os
import secrets as _secrets
import shlex
import shutil
import signal
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import attrs
import click
from click.core import ParameterSource
from rich.text import Text

from threadloom.actors.graph import STEP_KEY
from threadloom.cli.demo.display import DemoResult, Display, print_result, take_snapshot
from threadloom.cli.demo.graph import AGENT_GRAPH, Ledger, demo_input
from threadloom.cli.demo.metrics import DemoMetrics
from threadloom.cli.demo.plan import DEFAULT_RENEW, DemoPlan, worker_of
from threadloom.cli.demo.processes import Worker, start_worker, stop_workers
from threadloom.cli.demo.verify import PAGE, Check, Crash, verify
from threadloom.cli.logs import configure_logging
from threadloom.cli.output import DURATION, EXIT_FAILED, CliError, state_of
from threadloom.domain.errors import ThreadloomError, ValidationError
from threadloom.domain.values import ThreadQuery, ThreadStatus
from threadloom.persistence import open_store, redact_url, url_secrets
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.queue import RunQueue

POLL_S = 0.25
"""How often (seconds) the coordinator reads the queue and the registry for its display."""
CRASH_AT = 0.25
"""The crash comes once this share of the runs completed (and a worker holds a run past its first node)."""


def pick_victim(store: Checkpointer, plan: DemoPlan, live: list[Worker]) -> tuple[Worker, list[str]] | None:
    """The live worker holding the most root threads past their first node (registry status RUNNING), with them.

    None while no worker holds a run in the middle of its work.
    """
    held: dict[str, list[str]] = defaultdict(list)
    roots = set(plan.roots)
    page = store.threads(ThreadQuery(tenant_id=plan.tenant, statuses={ThreadStatus.RUNNING}, limit=PAGE))
    for summary in page.items:
        if summary.thread_id not in roots:
            continue
        name = worker_of(summary.latest_run_id)
        if name is None:
            continue
        stored = store.latest(summary.thread_id)
        if stored is not None and int(stored.checkpoint.metadata.get(STEP_KEY, "0") or 0) >= 1:
            held[name].append(summary.thread_id)
    candidates = [w for w in live if held.get(w.name)]
    if not candidates:
        return None
    victim = max(candidates, key=lambda w: len(held[w.name]))
    return victim, sorted(held[victim.name])


def run_demo(
    store: Checkpointer,
    store_url: str,
    plan: DemoPlan,
    folder: Path,
    display: Display,
    *,
    log_level: str = "info",
    metrics: DemoMetrics | None = None,
) -> tuple[Crash | None, list[Check], list[Worker], bool]:
    """Enqueues the runs, starts the workers, crashes one, waits for the runs, stops the workers, verifies.

    With ``metrics``, worker ``k`` serves its store's metrics on ``metrics.worker_port(k)``.

    Returns:
        The crash (None without one), the checks, the workers, and whether the demo timed out.
    """
    queue = getattr(store, "queue", None)
    assert isinstance(queue, RunQueue)
    ledger_path = folder / "ledger.db"
    ledger = Ledger(ledger_path)
    entry_ids: set[int] = set()
    for index in range(1, plan.runs + 1):
        entry = queue.enqueue(
            plan.thread_id(index), graph_id=AGENT_GRAPH, input=demo_input(index), tenant_id=plan.tenant
        )
        entry_ids.add(entry.entry_id)
    display.note(f"enqueued {plan.runs} runs of {AGENT_GRAPH} for tenant {plan.tenant!r}")
    workers: list[Worker] = []
    crash: Crash | None = None
    timed_out = False
    try:
        for number in range(1, plan.workers + 1):
            port = None if metrics is None else metrics.worker_port(number)
            workers.append(
                start_worker(
                    f"worker-{number}", store_url, folder, ledger_path, plan, log_level, metrics_port=port
                )
            )
        display.note("started " + ", ".join(f"{w.name} (pid {w.pid})" for w in workers))
        reported: set[str] = set()
        taken: set[str] = set()
        deadline = time.monotonic() + plan.timeout.total_seconds()
        while True:
            snapshot = take_snapshot(queue, entry_ids)
            display.update(snapshot, workers)
            if snapshot.finished >= plan.runs:
                break
            for worker in workers:
                if worker.process.poll() is not None and not worker.killed and worker.name not in reported:
                    reported.add(worker.name)
                    tail = " | ".join(worker.log_tail()[-2:])
                    display.note(f"{worker.name} exited with status {worker.process.returncode}: {tail}")
            live = [w for w in workers if w.process.poll() is None]
            if not live:
                display.note("no worker is left; stopping")
                break
            if time.monotonic() > deadline:
                display.note(f"gave up after {plan.timeout.total_seconds():.0f}s")
                timed_out = True
                break
            due = snapshot.completed >= max(1, int(plan.runs * CRASH_AT))
            if plan.crash and crash is None and len(live) >= 2 and due:
                picked = pick_victim(store, plan, live)
                if picked is not None and picked[0].process.poll() is None:
                    victim, held = picked
                    os.kill(victim.pid, signal.SIGKILL)
                    killed_at = datetime.now(UTC)
                    victim.killed = True
                    victim.process.wait()
                    crash = Crash(victim.name, victim.pid, killed_at, display.elapsed(), held)
                    display.note(
                        f"SIGKILL {victim.name} (pid {victim.pid}) while it holds {len(held)} runs mid-way: "
                        + ", ".join(held)
                    )
            if crash is not None:
                for entry in snapshot.entries:
                    if entry.thread_id in crash.held and entry.thread_id not in taken and entry.run_ids:
                        by = worker_of(entry.run_ids[-1])
                        if by is not None and by != crash.worker:
                            taken.add(entry.thread_id)
                            display.note(f"{by} took over {entry.thread_id} from {crash.worker}")
            time.sleep(POLL_S)
    finally:
        stop_workers(workers)
    display.note("workers stopped; verifying")
    try:
        checks = verify(store, queue, ledger, plan, entry_ids, crash)
    finally:
        ledger.close()
    return crash, checks, workers, timed_out


def _store_url(ctx: click.Context, own: str | None) -> str | None:
    """The store the user named: ``demo --store``, else a global ``--store`` given on the command line."""
    if own is not None:
        return own
    parent = ctx.parent
    if parent is not None and parent.get_parameter_source("store_url") is ParameterSource.COMMANDLINE:
        return parent.params.get("store_url")
    return None


def _sqlite_url(path: Path) -> str:
    """``sqlite:///`` + the absolute path (so ``sqlite:////tmp/…/demo.db``)."""
    return f"sqlite:///{path.resolve()}"


def _open_demo_store(url: str) -> Checkpointer:
    safe = redact_url(url)
    if url.split(":", 1)[0].lower() == "memory":
        raise CliError(
            "the demo's workers are separate processes: memory:// cannot be shared; use sqlite or postgresql", 2
        )
    try:
        store = open_store(url)
    except ValidationError as error:
        reason = "; ".join(error.problems) if error.field == "url" else str(error)
        raise CliError(f"bad store URL: {reason}", 2) from error
    except (ThreadloomError, OSError) as error:
        raise CliError(f"cannot open store {safe!r}: {error}") from error
    if not isinstance(getattr(store, "queue", None), RunQueue):
        store.close()
        raise CliError(f"the store {safe!r} ({type(store).__name__}) has no run queue; the demo needs one")
    return store


@click.command(name="demo")
@click.option("--store", "store_url", default=None, metavar="URL",
              help="Run on this store (sqlite:///path.db or postgresql://…) [default: a new SQLite file in a "
                   "temporary folder].")
@click.option("--workers", type=click.IntRange(1, 16), default=3, show_default=True, help="Worker processes.")
@click.option("--runs", type=click.IntRange(1, 1000), default=50, show_default=True, help="Runs to enqueue.")
@click.option("--concurrency", type=click.IntRange(1, 32), default=4, show_default=True,
              help="Runs at once in each worker.")
@click.option("--no-crash", is_flag=True, help="Do not kill a worker.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder (store, ledger, worker logs) for inspection.")
@click.option("--ttl", type=DURATION, default="3s", show_default=True, help="The workers' claim and lease ttl.")
@click.option("--timeout", type=DURATION, default="2m", show_default=True, help="Give up waiting after this long.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="N",
              help="Serve Prometheus metrics of every store call on 127.0.0.1 while the demo runs: worker k on "
                   "port N+k (its own calls), and on N the coordinator's own calls plus every worker's, each "
                   "series labelled process=coordinator|worker-k (a SIGKILLed worker's series vanish; "
                   "threadloom_demo_process_up says whose are there). Run-queue calls are not metered. Ports in "
                   "use: exit 2.")
@click.option("--walk", is_flag=True,
              help="Instead: the access-walk demonstration - release v1 fills the store, v1 and v2 worker "
                   "processes run side by side, v1 stops, v2's walk re-stamps every row, its walker is SIGKILLed "
                   "mid-walk and resumed by another process, then every row's stamp is audited (README \"Quick "
                   "start\"). --runs, --workers, --concurrency and --metrics-port do not apply.")
@click.option("--threads", type=click.IntRange(4, 100_000), default=240, show_default=True,
              help="With --walk: threads release v1 leaves in the store (over four tenants).")
@click.option("--walk-rate", type=click.FloatRange(0, min_open=True), default=40.0, show_default=True,
              help="With --walk: the v2 walk's walk_rate (threads a second at most).")
@click.option("--walk-share", type=click.FloatRange(0, 1, min_open=True), default=0.1, show_default=True,
              help="With --walk: the v2 walk's walk_share (share of its time it may spend stamping).")
@click.option("--overlap", type=DURATION, default="3s", show_default=True,
              help="With --walk: how long v1 and v2 run side by side before v1 stops.")
@click.option("--commits-per-s", type=click.FloatRange(0, 1000), default=10.0, show_default=True,
              help="With --walk: live commits each worker process makes a second.")
@click.option("--plant-misstamp", is_flag=True, hidden=True,
              help="With --walk: re-stamp one row for another tenant before the audit (the audit must fail).")
@click.pass_context
def demo(
    ctx: click.Context,
    store_url: str | None,
    workers: int,
    runs: int,
    concurrency: int,
    no_crash: bool,
    keep: bool,
    ttl: timedelta,
    timeout: timedelta,
    metrics_port: int | None,
    walk: bool,
    threads: int,
    walk_rate: float,
    walk_share: float,
    overlap: timedelta,
    commits_per_s: float,
    plant_misstamp: bool,
) -> None:
    """Run the sample agent graph in worker processes, SIGKILL one mid-run, and verify what the store kept.

    Enqueues --runs runs of a tool-using agent loop (with child threads and effects) for tenant 'acme', starts
    --workers worker processes on the store, SIGKILLs the one holding the most runs once a quarter of the runs
    completed, lets the others take its threads over once its claims expire, shows progress live, and ends with
    a verification table: every run completed; each effect recorded once (a call the crash cut off is made
    again, with the same idempotency key); every event log gap-free; no write with a stale token accepted;
    tokens strictly increasing. Exit status 1 if a check fails.

    Without --store it works in a new SQLite file in a temporary folder, removed at the end unless --keep.

    With --metrics-port N it serves Prometheus metrics on 127.0.0.1 while it runs (URLs printed at start):
    http://127.0.0.1:N/metrics has them all, labelled by process; N+1, N+2, … each worker's alone.

    With --walk, the access-walk demonstration instead: release v1 (tenant-only access schema) fills --threads
    threads of four tenants; worker processes of v1 and v2 (v2 adds the attribute 'region') run side by side with
    live commits; v1 stops, and only then v2's walk re-stamps every row, its pace live on screen; the v2 process
    walking is SIGKILLed mid-walk and another resumes through the walk lease; a final audit reads every row's
    stamp columns and reads as each tenant: rows unstamped, mis-stamped, cross-tenant reads must all be 0 (exit
    status 1 otherwise). --ttl (default 2s with --walk) is the lease and membership ttl.
    """
    if walk:
        from threadloom.cli.demo.walk_command import run_walk_command
        from threadloom.cli.demo.walk_plan import WalkPlan

        if metrics_port is not None:
            raise CliError("--metrics-port does not apply to --walk", 2)
        walk_plan = WalkPlan(
            threads=threads, walk_share=walk_share, walk_rate=walk_rate, overlap=overlap,
            commits_per_s=commits_per_s, crash=not no_crash, timeout=timeout,
        )  # fmt: skip
        if ctx.get_parameter_source("ttl") is ParameterSource.COMMANDLINE:
            walk_plan = attrs.evolve(walk_plan, ttl=ttl, renew_every=min(DEFAULT_RENEW, ttl / 4))
        run_walk_command(ctx, _store_url(ctx, store_url), walk_plan, keep=keep, plant=plant_misstamp)
        return
    state = state_of(ctx)
    if workers < 2 and not no_crash:
        raise CliError("a crash needs a second worker to take over: use --workers 2 or more, or --no-crash", 2)
    renew = min(DEFAULT_RENEW, ttl / 3)
    named = _store_url(ctx, store_url)
    metrics = None if metrics_port is None else DemoMetrics(metrics_port, workers).start()  # before anything runs
    folder = Path(tempfile.mkdtemp(prefix="threadloom-demo-"))
    url = named if named is not None else _sqlite_url(folder / "demo.db")
    prefix = "demo" if named is None else f"demo-{_secrets.token_hex(3)}"
    level = str((ctx.parent.params.get("log_level") if ctx.parent else None) or "warning").lower()
    configure_logging(level, secrets=tuple({*state.secrets, *url_secrets(url)}))
    plan = DemoPlan(
        runs=runs, workers=workers, concurrency=concurrency, crash=not no_crash, ttl=ttl, renew_every=renew,
        prefix=prefix, timeout=timeout,
    )  # fmt: skip
    label = redact_url(url)
    inspect = (  # quoted for a shell: a URL's "?schema=" is a glob
        f"threadloom --store {shlex.quote(label)} threads --tenant {shlex.quote(plan.tenant)}"
        if keep or named is not None
        else ""
    )
    console = state.err if state.json_output else state.out
    started = time.monotonic()
    store: Checkpointer | None = None
    try:
        store = _open_demo_store(url)
        if metrics is not None:
            store = metrics.wrap(store)
            for line in metrics.describe():
                console.print(Text(line), soft_wrap=True)
        display = Display(console, plan, label, live=console.is_terminal and not state.json_output)
        with display:
            crash, checks, procs, timed_out = run_demo(store, url, plan, folder, display, metrics=metrics)
        result = DemoResult(
            plan=plan,
            store_label=label,
            folder=folder,
            kept=keep,
            crash=crash,
            checks=checks,
            workers=[{"name": w.name, "pid": w.pid, "status": w.status()} for w in procs],
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            inspect=inspect,
        )
    finally:
        if store is not None:
            store.close()
        if metrics is not None:
            metrics.close()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if state.json_output:
        state.emit(result.json())
    else:
        print_result(state.out, result)
    if not result.passed:
        ctx.exit(EXIT_FAILED)


__all__ = ["CRASH_AT", "POLL_S", "demo", "pick_victim", "run_demo"]
