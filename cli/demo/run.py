"""``threadloom demo``: real worker processes, a real crash, and a verification of what the store kept.

The command is the coordinator (DESIGN §4, §5):

1. It opens the store — a SQLite file in a fresh temporary folder, or the one ``--store`` names — and enqueues
   ``--runs`` runs of the sample agent graph (:mod:`threadloom.cli.demo.graph`) on threads ``demo-001``… of tenant
   ``acme``.
2. It starts ``--workers`` worker processes (``python -m threadloom demo-worker``, hidden), each serving the run
   queue with a short claim and lease ttl; they log JSON lines to files in the demo's folder.
3. Unless ``--no-crash``, once a quarter of the runs completed it SIGKILLs the worker that holds the most runs
   in the middle of their work. Its claims and leases expire; the other workers take its threads over and
   recover them from their latest checkpoints, reading recorded effects instead of running them again.
4. It shows progress live (a rich display on a terminal, plain lines otherwise), stops the workers once every
   run finished, and verifies the store and the effect ledger (:func:`verify`): every run completed; each
   effect executed exactly once; every event log gap-free; no write with a stale token accepted; tokens
   strictly increasing. It prints a table (or, with ``--json``, one JSON document) and exits 1 if a check
   failed.

The effect ledger (:class:`~threadloom.cli.demo.graph.Ledger`) stands in for the outside world: a tool provider
that executes each effect key once. It is what the verification counts executions with.

With ``--metrics-port N`` every store call of the demo is metered
(:class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer` into a
:class:`~threadloom.persistence.metrics.prometheus.PrometheusMeter`) and served in the Prometheus text format on the
loopback only (:class:`DemoMetrics`): worker ``k`` serves its own store's metrics on port ``N+k``; the coordinator
serves on ``N`` its own store's metrics (the progress reads, the verification and its stale-token probes) together
with every worker's, read from their ports at each scrape, each series labelled ``process`` (``coordinator``,
``worker-1``…), plus ``threadloom_demo_process_up`` saying whose series are there. Run-queue calls (enqueue, lease,
complete) are not metered: ``MeteredCheckpointer`` forwards ``store.queue`` as is.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets as _secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

import attrs
import click
import structlog
from click.core import ParameterSource
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from threadloom.actors.graph import END_EVENTS, STEP_KEY
from threadloom.actors.policies import ClaimPolicy, ServePolicy
from threadloom.actors.runtime import GraphRuntime
from threadloom.cli.main import (
    DURATION,
    EXIT_FAILED,
    STORE_ENV,
    CliError,
    CliState,
    configure_logging,
    url_secrets,
)
from threadloom.cli.demo.graph import AGENT_GRAPH, Ledger, build_graphs, demo_input
from threadloom.domain.errors import StaleClaim, ThreadloomError, ValidationError
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.values import (
    Checkpoint,
    CheckpointStatus,
    Commit,
    EventDraft,
    EventRecord,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence import open_store, redact_url
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.persistence.queue import RunQueue

TENANT = "acme"
"""The tenant the demo's runs are for."""
DEFAULT_TTL = timedelta(seconds=3)
"""The workers' claim and lease ttl: how long a dead worker's threads stay held."""
DEFAULT_RENEW = timedelta(seconds=1)
"""How often the workers renew their claims and leases."""
POLL_S = 0.25
"""How often (seconds) the coordinator reads the queue and the registry for its display."""
PLAIN_EVERY_S = 1.0
"""Without a terminal, at most one progress line per this many seconds (plus one line per notable event)."""
STOP_GRACE_S = 15.0
"""How long (seconds) a worker may take to stop after SIGTERM before it is killed."""
CRASH_AT = 0.25
"""The crash comes once this share of the runs completed (and a worker holds a run past its first node)."""
PAGE = 1000
"""Rows per read while verifying."""
PROBES = 5
"""At most this many stale-token writes are tried while verifying."""
LOG_TAIL = 5
"""Lines of a worker's log shown when it exits unexpectedly."""
METRICS_HOST = "127.0.0.1"
"""The address every metrics endpoint of the demo listens on: the loopback only."""
SCRAPE_TIMEOUT_S = 1.0
"""How long (seconds) the coordinator's endpoint waits for one worker's metrics while it is scraped."""
PROCESS_UP = "threadloom_demo_process_up"
"""The coordinator endpoint's gauge: 1 where a process's metrics were read for this scrape, else 0."""


# -- what the demo does --------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DemoPlan:
    """The demo's parameters.

    Attributes:
        runs, workers, concurrency: runs enqueued, worker processes, queue workers per process.
        crash: SIGKILL a worker in the middle of the runs.
        ttl, renew_every: the workers' claim and lease ttl and renewal period.
        pace: scales the sample graph's sleeps (1.0: about a second a run).
        prefix: the root threads are ``<prefix>-001``…
        tenant: the tenant of every run.
        timeout: the demo gives up waiting for the runs after this long.
    """

    runs: int
    workers: int
    concurrency: int
    crash: bool
    ttl: timedelta = DEFAULT_TTL
    renew_every: timedelta = DEFAULT_RENEW
    pace: float = 1.0
    prefix: str = "demo"
    tenant: str = TENANT
    timeout: timedelta = timedelta(minutes=2)

    def thread_id(self, index: int) -> str:
        """The root thread of run ``index`` (1-based)."""
        return f"{self.prefix}-{index:0{max(3, len(str(self.runs)))}d}"

    @property
    def roots(self) -> list[str]:
        """Every root thread, in run order."""
        return [self.thread_id(index) for index in range(1, self.runs + 1)]


def worker_of(run_id: str | None) -> str | None:
    """The worker (runtime node id) that made ``run_id`` (``<node>:run-…``), or None."""
    if not run_id or ":" not in run_id:
        return None
    return run_id.split(":", 1)[0]


@attrs.frozen(kw_only=True)
class Takeover:
    """A run of the crashed worker that another run took over: the next run in the thread's log."""

    thread_id: str
    from_run: str
    from_token: int
    by_run: str
    by_token: int
    recovered_at: datetime
    after_s: float | None

    def json(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "from_run": self.from_run,
            "from_token": self.from_token,
            "by_run": self.by_run,
            "by_worker": worker_of(self.by_run),
            "by_token": self.by_token,
            "recovered_at": self.recovered_at.isoformat(),
            "after_s": self.after_s,
        }


@attrs.define
class Crash:
    """The crash the demo caused: which worker, when, what it held, and who took over."""

    worker: str
    pid: int
    killed_at: datetime
    elapsed_s: float
    held: list[str]
    takeovers: list[Takeover] = attrs.Factory(list)

    def json(self, ttl: timedelta) -> dict[str, Any]:
        latencies = [t.after_s for t in self.takeovers if t.after_s is not None]
        return {
            "worker": self.worker,
            "pid": self.pid,
            "killed_at": self.killed_at.isoformat(),
            "elapsed_s": round(self.elapsed_s, 3),
            "held": list(self.held),
            "ttl_s": ttl.total_seconds(),
            "takeovers": [t.json() for t in self.takeovers],
            "max_recovery_s": max(latencies) if latencies else None,
        }


@attrs.frozen(kw_only=True)
class Check:
    """One verification: its name, whether it passed, a figure, and what failed (at most a few examples)."""

    name: str
    passed: bool
    figure: str
    problems: tuple[str, ...] = ()

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "figure": self.figure, "problems": list(self.problems)}


# -- reading the store -----------------------------------------------------------------------------------------------------


def demo_entries(queue: RunQueue, entry_ids: set[int]) -> list[QueueEntry]:
    """The demo's queue entries as the store holds them now, in entry order."""
    if not entry_ids:
        return []
    found: list[QueueEntry] = []
    after = min(entry_ids) - 1
    last = max(entry_ids)
    while after < last:
        page = queue.entries(limit=PAGE, after=after)
        found.extend(entry for entry in page if entry.entry_id in entry_ids)
        if len(page) < PAGE:
            break
        after = page[-1].entry_id
    return found


def all_threads(store: Checkpointer, roots: list[str]) -> list[str]:
    """The roots and all their descendants (children paged with ``children``), roots first."""
    seen: list[str] = []
    frontier = list(roots)
    while frontier:
        seen.extend(frontier)
        following: list[str] = []
        for parent in frontier:
            after: str | None = None
            while True:
                page = store.children(parent, limit=PAGE, after=after)
                following.extend(page)
                if len(page) < PAGE:
                    break
                after = page[-1]
        frontier = following
    return seen


def read_events(store: Checkpointer, thread_id: str) -> list[EventRecord]:
    """Every event of the thread, oldest first, paged from the start."""
    events: list[EventRecord] = []
    after = 0
    while True:
        page = store.events_after(thread_id, after, PAGE)
        events.extend(page)
        if len(page) < PAGE:
            return events
        after = page[-1].seq


def read_history(store: Checkpointer, thread_id: str) -> list[Checkpoint]:
    """Every checkpoint of the thread, newest first, paged."""
    history: list[Checkpoint] = []
    before: str | None = None
    while True:
        page = store.history(thread_id, limit=PAGE, before=before)
        history.extend(page)
        if len(page) < PAGE:
            return history
        before = page[-1].id


def runs_in_order(events: list[EventRecord]) -> list[tuple[str, int, list[EventRecord]]]:
    """The runs of a log, in the order they first wrote: ``(run_id, first token, its events)``."""
    order: list[str] = []
    by_run: dict[str, list[EventRecord]] = defaultdict(list)
    for event in events:
        if event.run_id not in by_run:
            order.append(event.run_id)
        by_run[event.run_id].append(event)
    return [(run, by_run[run][0].token, by_run[run]) for run in order]


def find_takeovers(logs: dict[str, list[EventRecord]], victim: str, killed_at: datetime | None) -> list[Takeover]:
    """Every place a run of ``victim`` stopped without an end event and another run went on with the thread."""
    found: list[Takeover] = []
    for thread_id, events in logs.items():
        runs = runs_in_order(events)
        for (run, token, own), (following, next_token, theirs) in itertools.pairwise(runs):
            if worker_of(run) != victim or any(event.type in END_EVENTS for event in own):
                continue
            first = theirs[0]
            after = None if killed_at is None else round((first.timestamp - killed_at).total_seconds(), 3)
            found.append(
                Takeover(
                    thread_id=thread_id,
                    from_run=run,
                    from_token=token,
                    by_run=following,
                    by_token=next_token,
                    recovered_at=first.timestamp,
                    after_s=after,
                )
            )
    return found


# -- verification --------------------------------------------------------------------------------------------------------


def _examples(problems: list[str]) -> tuple[str, ...]:
    return tuple(problems[:5]) + ((f"… and {len(problems) - 5} more",) if len(problems) > 5 else ())


def probe_stale_writes(
    store: Checkpointer, logs: dict[str, list[EventRecord]], crash: Crash | None
) -> tuple[int, list[str]]:
    """Tries to commit with tokens that are no longer a thread's claim; every try must be ``StaleClaim``.

    With a crash: the crashed worker's tokens on the threads taken over from it (a "zombie" coming back). Else
    the first run's token of a few threads (released when the run ended). Returns how many were tried and the
    problems (writes accepted).
    """
    targets: list[tuple[str, str, int]] = []
    if crash is not None:
        targets = [(t.thread_id, t.from_run, t.from_token) for t in crash.takeovers]
    else:
        for thread_id, events in logs.items():
            if events:
                targets.append((thread_id, events[0].run_id, events[0].token))
    problems: list[str] = []
    for thread_id, run_id, token in targets[:PROBES]:
        draft = EventDraft(
            run_id=run_id,
            type="demo.stale_write",
            timestamp=datetime.now(UTC),
            payload={"token": token},
        )
        try:
            store.commit(thread_id, Commit(token=token, events=(draft,)))
        except StaleClaim:
            continue
        except ThreadloomError as error:
            problems.append(f"{thread_id}: a write with stale token {token} failed otherwise: {error}")
            continue
        problems.append(f"{thread_id}: a write with stale token {token} was accepted")
    return min(len(targets), PROBES), problems


def verify(
    store: Checkpointer,
    queue: RunQueue,
    ledger: Ledger,
    plan: DemoPlan,
    entry_ids: set[int],
    crash: Crash | None,
) -> list[Check]:
    """Reads everything the demo wrote and checks it (the five checks of ``threadloom demo``).

    Fills ``crash.takeovers`` from the event logs. Reads are paged; nothing is written but the stale-token
    probes (which the store must refuse).

    Returns:
        The checks, in the order printed.
    """
    entries = demo_entries(queue, entry_ids)
    threads = all_threads(store, plan.roots)
    latest = {thread_id: store.latest(thread_id) for thread_id in threads}
    logs = {thread_id: read_events(store, thread_id) for thread_id in threads}
    if crash is not None:
        crash.takeovers = find_takeovers(logs, crash.worker, crash.killed_at)
    probed, probe_problems = probe_stale_writes(store, logs, crash)
    if probed:
        logs = {thread_id: read_events(store, thread_id) for thread_id in threads}  # a write let in shows below
    histories = {thread_id: read_history(store, thread_id) for thread_id in threads}
    checks = [
        _check_completed(plan, entries, entry_ids, latest),
        _check_effects(store, latest, ledger, crash),
        _check_gap_free(logs),
        _check_stale(logs, histories, probed, probe_problems),
        _check_tokens(logs, histories, crash),
    ]
    return checks


def _check_completed(
    plan: DemoPlan, entries: list[QueueEntry], entry_ids: set[int], latest: dict[str, Any]
) -> Check:
    problems: list[str] = []
    done = [entry for entry in entries if entry.status is EntryStatus.COMPLETED]
    for entry in entries:
        if entry.status is not EntryStatus.COMPLETED:
            problems.append(f"queue entry {entry.entry_id} ({entry.thread_id}) is {entry.status.value}"
                            + (f": {entry.error}" if entry.error else ""))
    if len(entries) != len(entry_ids):
        problems.append(f"{len(entry_ids) - len(entries)} queue entries are missing")
    children = 0
    completed_threads = 0
    roots = set(plan.roots)
    for thread_id, stored in latest.items():
        is_child = thread_id not in roots
        children += is_child
        if stored is None:
            problems.append(f"thread {thread_id} has no checkpoint")
        elif stored.checkpoint.status is not CheckpointStatus.COMPLETED:
            problems.append(f"thread {thread_id} is {stored.checkpoint.status.value}")
        else:
            completed_threads += 1
    figure = (
        f"{len(done)}/{len(entry_ids)} runs; {completed_threads}/{len(latest)} threads COMPLETED "
        f"({children} child threads)"
    )
    return Check(name="every run completed", passed=not problems, figure=figure, problems=_examples(problems))


def _check_effects(store: Checkpointer, latest: dict[str, Any], ledger: Ledger, crash: Crash | None) -> Check:
    """Every effect a completed thread recorded executed once in the ledger, and its record holds that
    execution; every execution belongs to a recorded effect; a repeated call only where a crash cut off the
    first call's step before it committed (the provider executed it once: it is idempotent by key)."""
    problems: list[str] = []
    executions = {(e.thread_id, e.key): e for e in ledger.executions() if e.thread_id in latest}
    attempts = [a for a in ledger.attempts() if a.thread_id in latest]
    expected: set[tuple[str, str]] = set()
    for thread_id, stored in latest.items():
        if stored is None or not isinstance(stored.checkpoint.state, dict):
            continue
        for key in stored.checkpoint.state.get("effects", []):
            expected.add((thread_id, key))
    once = 0
    for thread_id, key in sorted(expected):
        execution = executions.get((thread_id, key))
        record = store.effect(thread_id, key)
        if record is None:
            problems.append(f"{thread_id} has no effect record for {key!r}")
        if execution is None:
            problems.append(f"{thread_id} effect {key!r} is in the thread's state but never executed")
            continue
        if record is not None and (record.result or {}).get("execution_id") != execution.execution_id:
            problems.append(f"{thread_id} effect {key!r} records another execution than the ledger's")
            continue
        once += record is not None
    for pair in sorted(set(executions) - expected):
        problems.append(f"{pair[0]} effect {pair[1]!r} executed but no completed run recorded it")
    repeats = [a for a in attempts if a.outcome != "executed"]
    victim = crash.worker if crash is not None else None
    for attempt in repeats:
        # A repeated call is legitimate only where the first call's step never committed: the crashed worker made
        # the first call, and the effect record is not its run's (a recovered run that re-executed the node).
        first = executions.get((attempt.thread_id, attempt.key))
        record = store.effect(attempt.thread_id, attempt.key)
        if (
            first is None
            or first.worker != victim
            or attempt.worker == victim
            or (record is not None and record.run_id == first.run_id)
        ):
            problems.append(
                f"{attempt.thread_id} effect {attempt.key!r} was called again by {attempt.run_id} "
                f"(first call by {first.run_id if first else '?'})"
            )
    figure = f"{once}/{len(expected)} effects executed once"
    if repeats:
        figure += (
            f"; {len(repeats)} call(s) repeated after the crash cut off their step before it committed, "
            "executed once by the provider (idempotent by key)"
        )
    return Check(
        name="each effect executed exactly once", passed=not problems, figure=figure, problems=_examples(problems)
    )


def _check_gap_free(logs: dict[str, list[EventRecord]]) -> Check:
    problems: list[str] = []
    total = 0
    for thread_id, events in logs.items():
        total += len(events)
        if not events:
            problems.append(f"{thread_id} has no events")
            continue
        seqs = [event.seq for event in events]
        expected = list(range(seqs[0], seqs[0] + len(seqs)))
        if seqs != expected:
            missing = sorted(set(range(seqs[0], max(seqs) + 1)) - set(seqs))
            problems.append(f"{thread_id}: seqs {seqs[0]}..{seqs[-1]} are not contiguous (missing {missing[:5]})")
        elif seqs[0] != 1:
            problems.append(f"{thread_id}: the log starts at {seqs[0]}, not 1")
    figure = f"{len(logs)} threads, {total} events, {len(problems)} gaps"
    return Check(name="every event log gap-free", passed=not problems, figure=figure, problems=_examples(problems))


def _check_stale(
    logs: dict[str, list[EventRecord]],
    histories: dict[str, list[Checkpoint]],
    probed: int,
    probe_problems: list[str],
) -> Check:
    problems = list(probe_problems)
    for thread_id, events in logs.items():
        tokens_of: dict[str, set[int]] = defaultdict(set)
        highest = 0
        for event in events:
            tokens_of[event.run_id].add(event.token)
            if event.token < highest:
                problems.append(
                    f"{thread_id}: event {event.seq} carries token {event.token} after token {highest} was in use"
                )
            highest = max(highest, event.token)
        for run, tokens in tokens_of.items():
            if len(tokens) != 1:
                problems.append(f"{thread_id}: run {run} wrote with tokens {sorted(tokens)}")
        run_token = {run: next(iter(tokens)) for run, tokens in tokens_of.items() if len(tokens) == 1}
        for checkpoint in histories[thread_id]:
            token = run_token.get(checkpoint.run_id)
            if checkpoint.fencing_token is None:
                problems.append(f"{thread_id}: checkpoint {checkpoint.id} carries no fencing token")
            elif token is not None and checkpoint.fencing_token != token:
                problems.append(
                    f"{thread_id}: checkpoint {checkpoint.id} carries token {checkpoint.fencing_token}, "
                    f"its run's events {token}"
                )
    events = sum(len(e) for e in logs.values())
    figure = f"0 of {events} events and {sum(len(h) for h in histories.values())} checkpoints with a stale token"
    if problems:
        figure = f"{len(problems)} stale write(s) found"
    if probed:
        figure += f"; {probed - len(probe_problems)}/{probed} writes with a superseded token refused"
    return Check(
        name="no write with a stale token accepted", passed=not problems, figure=figure, problems=_examples(problems)
    )


def _check_tokens(
    logs: dict[str, list[EventRecord]], histories: dict[str, list[Checkpoint]], crash: Crash | None
) -> Check:
    """Per thread, each run's token is above the previous run's and checkpoint tokens never go down toward the
    newest; across the store no token was issued to two runs; every takeover's token is above the crashed
    worker's."""
    problems: list[str] = []
    handovers = 0
    owner: dict[int, str] = {}
    for thread_id, events in logs.items():
        runs = runs_in_order(events)
        for run, token, _own in runs:
            if owner.setdefault(token, run) != run:
                problems.append(f"token {token} was issued to two runs: {owner[token]} and {run}")
        for (run, token, _own), (following, next_token, _theirs) in itertools.pairwise(runs):
            handovers += 1
            if next_token <= token:
                problems.append(f"{thread_id}: run {following} has token {next_token} after {run}'s {token}")
        newest_first = [cp.fencing_token for cp in histories[thread_id] if cp.fencing_token is not None]
        for newer, older in itertools.pairwise(newest_first):
            if newer < older:
                problems.append(f"{thread_id}: checkpoint token {newer} is newer than token {older}")
                break
    figure = f"{len(owner)} runs, {len(owner)} distinct tokens; {handovers} handover(s) within a thread, each higher"
    if crash is not None:
        higher = sum(t.by_token > t.from_token for t in crash.takeovers)
        for takeover in crash.takeovers:
            if takeover.by_token <= takeover.from_token:
                problems.append(
                    f"{takeover.thread_id}: the takeover's token {takeover.by_token} is not above the crashed "
                    f"worker's {takeover.from_token}"
                )
        figure += f"; {higher}/{len(crash.takeovers)} takeovers above the crashed worker's token"
    return Check(name="tokens strictly increasing", passed=not problems, figure=figure, problems=_examples(problems))


# -- the worker processes ----------------------------------------------------------------------------------------------


@attrs.define
class Worker:
    """One worker process the coordinator started."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self) -> str:
        """``up``, ``SIGKILLed``, ``stopped`` (exit 0) or ``exited N``."""
        code = self.process.poll()
        if self.killed:
            return "SIGKILLed"
        if code is None:
            return "up"
        return "stopped" if code == 0 else f"exited {code}"

    def log_tail(self) -> list[str]:
        """The last lines of its log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return lines[-LOG_TAIL:]


def start_worker(
    name: str,
    store_url: str,
    folder: Path,
    ledger_path: Path,
    plan: DemoPlan,
    log_level: str,
    *,
    metrics_port: int | None = None,
) -> Worker:
    """Starts ``python -m threadloom demo-worker`` in a session of its own (Ctrl-C reaches the coordinator only).

    The store URL travels in the environment (never on a command line ``ps`` shows); the worker's log lines go
    to ``<folder>/logs/<name>.log``. With ``metrics_port`` the worker meters its store and serves the metrics on
    that port of :data:`METRICS_HOST`.
    """
    log_path = folder / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "threadloom", "--log-level", log_level, "demo-worker",
        "--name", name,
        "--ledger", str(ledger_path),
        "--concurrency", str(plan.concurrency),
        "--ttl", f"{int(plan.ttl.total_seconds() * 1000)}ms",
        "--renew-every", f"{int(plan.renew_every.total_seconds() * 1000)}ms",
        "--pace", str(plan.pace),
    ]  # fmt: skip
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    env = {**os.environ, STORE_ENV: store_url}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return Worker(name=name, process=process, log_path=log_path)


def stop_workers(workers: list[Worker]) -> None:
    """SIGTERM to every live worker, then SIGKILL to any still running after :data:`STOP_GRACE_S`."""
    for worker in workers:
        if worker.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        try:
            worker.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
            worker.process.wait()


# -- metrics ------------------------------------------------------------------------------------------------------------


def port_in_use(port: int, host: str = METRICS_HOST) -> str | None:
    """Why ``port`` cannot be listened on at ``host`` (the system's reason), or None if it can right now.

    Binds and closes a socket at once, with ``SO_REUSEADDR`` as the metrics server does, so a port held only by
    a closed connection (``TIME_WAIT``) counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def _port_taken(port: int, reason: str, uses: str = "") -> CliError:
    return CliError(
        f"metrics port {port} on {METRICS_HOST} is not available ({reason}); choose another --metrics-port{uses}", 2
    )


class _Aggregate:
    """A ``prometheus_client`` collector: the coordinator's metrics and every worker's, labelled by process.

    At each scrape it renders the coordinator's registry and fetches each worker's endpoint (at most
    :data:`SCRAPE_TIMEOUT_S` each), parses them, adds ``process="<name>"`` to every sample and yields the
    families merged by name, plus :data:`PROCESS_UP` per process. A worker that cannot be read (not started yet,
    SIGKILLed, stopped) contributes nothing but ``threadloom_demo_process_up{process=...} 0``: its counts are not
    remembered, so a series only ever shows what its process reports now.
    """

    def __init__(self, own: Any, workers: list[tuple[str, str]]) -> None:
        self._own = own
        self._workers = workers

    def collect(self) -> Any:
        import prometheus_client
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.parser import text_string_to_metric_families

        sources = [("coordinator", prometheus_client.generate_latest(self._own).decode())]
        up = GaugeMetricFamily(
            PROCESS_UP,
            "1 if the process's metrics were read for this scrape, 0 if not (a worker not started yet, SIGKILLed "
            "or stopped: its series are then absent).",
            labels=["process"],
        )
        up.add_metric(["coordinator"], 1)
        for name, url in self._workers:
            try:
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                    sources.append((name, response.read().decode()))
            except (OSError, ValueError):
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
        merged: dict[str, Any] = {}
        for process, text in sources:
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError:  # not what a worker serves: leave it out rather than fail the whole scrape
                continue
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = prometheus_client.Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                elif into.type != family.type:
                    continue
                into.samples.extend(
                    sample._replace(labels={**sample.labels, "process": process}) for sample in family.samples
                )
        yield from merged.values()
        yield up


class DemoMetrics:
    """The metrics of ``threadloom demo --metrics-port N``: ports, the coordinator's meter and its endpoint.

    Port ``N`` serves the coordinator's endpoint (:class:`_Aggregate`: its own store's metrics and each worker's,
    labelled ``process``); worker ``k`` (1-based) serves its own store's metrics on ``N+k``. Everything listens on
    :data:`METRICS_HOST` only. :meth:`start` checks every port before anything else happens.

    Args:
        port: ``N``, the coordinator's port (1..65535; ``N + workers`` must be a port too).
        workers: how many worker processes the demo starts.
    """

    def __init__(self, port: int, workers: int) -> None:
        self.port = port
        self.workers = workers
        self._server: Any = None
        self._meter: Any = None

    def worker_port(self, number: int) -> int:
        """The port worker ``number`` (1-based) serves on: ``N + number``."""
        return self.port + number

    def url(self, port: int) -> str:
        """``http://127.0.0.1:<port>/metrics``."""
        return f"http://{METRICS_HOST}:{port}/metrics"

    def start(self) -> Self:
        """Checks the workers' ports, then serves the coordinator's endpoint on ``N``.

        Raises:
            CliError: (exit 2) ``N + workers`` is above 65535, a port is in use, or ``prometheus_client`` is not
                installed (the ``metrics`` extra).
        """
        try:
            import prometheus_client
        except ImportError as error:
            extra = "pip install 'threadloom[metrics]'"
            raise CliError(f"--metrics-port needs the metrics extra ({extra}): {error}", 2) from error
        from threadloom.persistence.metrics.prometheus import PrometheusMeter, serve

        last = self.worker_port(self.workers)
        if last > 65535:
            raise CliError(
                f"--metrics-port {self.port} leaves no port for worker {self.workers} ({last} > 65535)", 2
            )
        uses = f" (the demo uses ports {self.port}-{last}: N and N+1…N+{self.workers} for its workers)"
        for number in range(1, self.workers + 1):
            reason = port_in_use(self.worker_port(number))
            if reason is not None:
                raise _port_taken(self.worker_port(number), reason, uses)
        try:
            self._meter = PrometheusMeter(prometheus_client.CollectorRegistry())
            served = prometheus_client.CollectorRegistry()
            served.register(_Aggregate(self._meter.registry, self.worker_urls()))
            self._server = serve(served, self.port, host=METRICS_HOST)
        except ValidationError as error:
            raise CliError(f"--metrics-port: {error}", 2) from error
        except OSError as error:
            raise _port_taken(self.port, error.strerror or str(error), uses) from error
        return self

    def worker_urls(self) -> list[tuple[str, str]]:
        """``(worker name, its metrics URL)`` for every worker, in order."""
        return [(f"worker-{k}", self.url(self.worker_port(k))) for k in range(1, self.workers + 1)]

    def wrap(self, store: Checkpointer) -> MeteredCheckpointer:
        """``store`` metered into the coordinator's registry (closing the wrapper closes ``store``)."""
        return MeteredCheckpointer(store, self._meter)

    def describe(self) -> list[str]:
        """The lines printed at start: where to scrape."""
        lines = [f"metrics: {self.url(self.port)} (coordinator and every worker, labelled process)"]
        lines += [f"metrics: {url} ({name} only)" for name, url in self.worker_urls()]
        return lines

    def close(self) -> None:
        """Stops the coordinator's endpoint (twice does nothing)."""
        if self._server is not None:
            self._server.close()


# -- the display ------------------------------------------------------------------------------------------------------------


@attrs.define
class Snapshot:
    """What one poll saw: queue counts, per-worker runs, and the registry's RUNNING roots by worker."""

    completed: int = 0
    failed: int = 0
    running: int = 0
    queued: int = 0
    by_worker_running: Counter[str] = attrs.Factory(Counter)
    by_worker_done: Counter[str] = attrs.Factory(Counter)
    entries: list[QueueEntry] = attrs.Factory(list)

    @property
    def finished(self) -> int:
        return self.completed + self.failed


def take_snapshot(queue: RunQueue, entry_ids: set[int]) -> Snapshot:
    """Reads the demo's queue entries and counts them."""
    now = datetime.now(UTC)
    snapshot = Snapshot()
    snapshot.entries = demo_entries(queue, entry_ids)
    for entry in snapshot.entries:
        if entry.status is EntryStatus.COMPLETED:
            snapshot.completed += 1
            snapshot.by_worker_done[worker_of(entry.run_ids[-1] if entry.run_ids else None) or "?"] += 1
        elif entry.status is EntryStatus.FAILED:
            snapshot.failed += 1
        elif entry.leased_by is not None and entry.lease_expires_at is not None and entry.lease_expires_at > now:
            snapshot.running += 1
            snapshot.by_worker_running[entry.leased_by.split("#", 1)[0]] += 1
        else:
            snapshot.queued += 1
    return snapshot


class Display:
    """The live progress: a rich display on a terminal, plain lines otherwise (or on stderr with ``--json``)."""

    def __init__(self, console: Console, plan: DemoPlan, store_label: str, *, live: bool) -> None:
        self.console = console
        self.plan = plan
        self.store_label = store_label
        self.started = time.monotonic()
        self.notes: list[str] = []
        self.snapshot = Snapshot()
        self.workers: list[Worker] = []
        self._live: Live | None = (
            Live(console=console, refresh_per_second=8, transient=False, get_renderable=self.render) if live else None
        )
        self._last_line = 0.0
        self._last_counts: tuple[int, ...] = ()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __enter__(self) -> Self:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()

    def note(self, text: str) -> None:
        """A notable moment (the crash, a takeover, a worker that died): kept on screen, or printed at once."""
        line = f"{self.elapsed():6.1f}s  {text}"
        self.notes.append(line)
        if self._live is None:
            self.console.print(Text(line), soft_wrap=True)

    def update(self, snapshot: Snapshot, workers: list[Worker]) -> None:
        self.snapshot, self.workers = snapshot, workers
        if self._live is not None:
            return
        counts = (snapshot.completed, snapshot.failed, snapshot.running, snapshot.queued)
        now = time.monotonic()
        if counts != self._last_counts and now - self._last_line >= PLAIN_EVERY_S:
            self._last_counts, self._last_line = counts, now
            self.console.print(Text(f"{self.elapsed():6.1f}s  {self._summary()}"), soft_wrap=True)

    def _summary(self) -> str:
        s = self.snapshot
        text = f"{s.completed}/{self.plan.runs} completed · {s.running} running · {s.queued} queued"
        return text + (f" · {s.failed} failed" if s.failed else "")

    def render(self) -> Group:
        s = self.snapshot
        header = Text()
        header.append("threadloom demo", style="bold")
        header.append(f"  {self.store_label}  ·  {self.plan.runs} runs · {len(self.workers)} workers  ·  ")
        header.append(f"{self.elapsed():.1f}s", style="dim")
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=self.plan.runs, completed=s.finished, width=40), Text(self._summary()))
        table = Table(title_justify="left", header_style="bold", box=None, padding=(0, 2))
        for column in ("worker", "pid", "state", "running", "completed"):
            table.add_column(column)
        for worker in self.workers:
            status = worker.status()
            style = "red bold" if worker.killed else ("green" if status == "up" else "dim")
            table.add_row(
                Text(worker.name),
                Text(str(worker.pid)),
                Text(status, style=style),
                Text(str(s.by_worker_running.get(worker.name, 0)) if not worker.killed else "-"),
                Text(str(s.by_worker_done.get(worker.name, 0))),
            )
        notes = Text("\n".join(self.notes[-8:]), style="yellow") if self.notes else Text("")
        return Group(header, bar, Text(""), table, Text(""), notes)


# -- the coordinator -----------------------------------------------------------------------------------------------------


@attrs.define
class DemoResult:
    """What a demo did and found."""

    plan: DemoPlan
    store_label: str
    folder: Path | None
    kept: bool
    crash: Crash | None
    checks: list[Check]
    workers: list[dict[str, Any]]
    duration_s: float
    timed_out: bool
    inspect: str

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "store": self.store_label,
            "runs": self.plan.runs,
            "workers": self.workers,
            "tenant": self.plan.tenant,
            "threads": {"first": self.plan.thread_id(1), "last": self.plan.thread_id(self.plan.runs)},
            "crash": None if self.crash is None else self.crash.json(self.plan.ttl),
            "checks": [check.json() for check in self.checks],
            "duration_s": round(self.duration_s, 3),
            "timed_out": self.timed_out,
            "folder": str(self.folder) if self.kept and self.folder is not None else None,
            "inspect": self.inspect,
        }


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
        entry = queue.enqueue(plan.thread_id(index), graph_id=AGENT_GRAPH, input=demo_input(index), tenant_id=plan.tenant)
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
            if plan.crash and crash is None and len(live) >= 2 and snapshot.completed >= max(1, int(plan.runs * CRASH_AT)):
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


# -- output ------------------------------------------------------------------------------------------------------------------


def print_result(console: Console, result: DemoResult) -> None:
    """The verification table, the crash and where to look next."""
    table = Table(title="verification", title_justify="left", header_style="bold")
    table.add_column("check")
    table.add_column("result")
    table.add_column("figure", overflow="fold")
    for check in result.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(Text(check.name), verdict, Text(check.figure))
        for problem in check.problems:
            table.add_row(Text(""), Text(""), Text(problem, style="red"))
    console.print(table)
    crash = result.crash
    if crash is not None:
        latencies = [t.after_s for t in crash.takeovers if t.after_s is not None]
        by = Counter(worker_of(t.by_run) for t in crash.takeovers)
        children = sum(1 for t in crash.takeovers if t.thread_id not in crash.held)
        line = (
            f"crash: {crash.worker} (pid {crash.pid}) SIGKILLed at {crash.elapsed_s:.1f}s holding "
            f"{len(crash.held)} runs mid-way; {len(crash.takeovers)} threads taken over ("
            + (f"{len(crash.takeovers) - children} runs and {children} of their child threads; " if children else "")
            + f"{', '.join(f'{name}: {n}' for name, n in sorted(by.items()))})"
        )
        if latencies:
            line += (
                f", recovered {min(latencies):.1f}–{max(latencies):.1f}s after the kill "
                f"(claim ttl {result.plan.ttl.total_seconds():g}s)"
            )
        console.print(Text(line), soft_wrap=True)
    elif result.plan.crash:
        console.print(Text("crash: none (no worker held a run mid-way at the time)"), soft_wrap=True)
    verdict = "all checks passed" if result.passed else "SOME CHECKS FAILED"
    console.print(
        Text(f"{verdict} in {result.duration_s:.1f}s", style="bold green" if result.passed else "bold red")
    )
    if result.kept and result.folder is not None:
        console.print(Text(f"kept {result.folder} (store, effect ledger ledger.db, worker logs in logs/)"))
    if result.inspect:
        console.print(Text(f"inspect: {result.inspect}"), soft_wrap=True)


# -- the commands --------------------------------------------------------------------------------------------------------


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
        raise CliError("the demo's workers are separate processes: memory:// cannot be shared; use sqlite or postgresql", 2)
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
) -> None:
    """Run the sample agent graph in worker processes, SIGKILL one mid-run, and verify what the store kept.

    Enqueues --runs runs of a tool-using agent loop (with child threads and effects) for tenant 'acme', starts
    --workers worker processes on the store, SIGKILLs the one holding the most runs once a quarter of the runs
    completed, lets the others take its threads over once its claims expire, shows progress live, and ends with
    a verification table: every run completed; each effect executed exactly once; every event log gap-free; no
    write with a stale token accepted; tokens strictly increasing. Exit status 1 if a check fails.

    Without --store it works in a new SQLite file in a temporary folder, removed at the end unless --keep.

    With --metrics-port N it serves Prometheus metrics on 127.0.0.1 while it runs (URLs printed at start):
    http://127.0.0.1:N/metrics has them all, labelled by process; N+1, N+2, … each worker's alone.
    """
    state = ctx.find_object(CliState)
    if state is None:
        raise CliError("internal: the command ran without the threadloom group")
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
    state = ctx.find_object(CliState)
    if state is None:
        raise CliError("internal: the command ran without the threadloom group")
    store: Checkpointer = state.store()
    if not isinstance(getattr(store, "queue", None), RunQueue):
        raise CliError(f"the store {state.safe_url!r} has no run queue")
    endpoint = None
    if metrics_port is not None:
        from threadloom.persistence.metrics.prometheus import PrometheusMeter

        try:
            import prometheus_client

            meter = PrometheusMeter(prometheus_client.CollectorRegistry())
            endpoint = meter.serve(metrics_port, host=METRICS_HOST)
        except ImportError as error:
            raise CliError(f"--metrics-port needs the metrics extra: {error}", 2) from error
        except OSError as error:
            raise _port_taken(metrics_port, error.strerror or str(error)) from error
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
    runtime = GraphRuntime(store, node_id=name, claim_policy=ClaimPolicy(ttl=ttl, renew_every=renew_every))
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


__all__ = [
    "Check",
    "Crash",
    "DemoMetrics",
    "DemoPlan",
    "DemoResult",
    "Takeover",
    "demo",
    "demo_worker",
    "find_takeovers",
    "run_demo",
    "verify",
]
