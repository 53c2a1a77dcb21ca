"""The verification of ``threadloom demo``: it reads everything the demo wrote and checks it.

The five checks: every run completed; each effect recorded once, a call repeated after the crash only with its
first call's idempotency key (against the effect ledger, which stands in for the outside world, idempotent by
that key); every event log gap-free; no write with a stale token accepted (it also tries such writes:
the store must refuse them); tokens strictly increasing. Each check must fail when the data is wrong.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from threadloom.actors.cascade import all_children
from threadloom.actors.graph import END_EVENTS, TURN_KEY, EffectKeys, effect_keys
from threadloom.cli.demo.graph import Ledger
from threadloom.cli.demo.plan import DemoPlan, worker_of
from threadloom.domain.errors import StaleClaim, ThreadloomError
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.values import Checkpoint, CheckpointStatus, Commit, EventDraft, EventRecord
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.queue import RunQueue

PAGE = 1000
"""Rows per read while verifying."""
PROBES = 5
"""At most this many stale-token writes are tried while verifying."""
EFFECTS_CHECK = "each effect recorded once; re-executions reused its idempotency key"
"""The name of the effects check (effects run at least once: a crash can repeat a call, never its record)."""


# -- what the verification found --------------------------------------------------------------------------------------


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


# -- reading the store -------------------------------------------------------------------------------------------------


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
            following.extend(all_children(store, parent, page_size=PAGE))
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


# -- verification ------------------------------------------------------------------------------------------------------


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
    """Effects run at least once and are recorded once: every effect a completed thread recorded has one record,
    its intent was committed by the run that first called it, and the provider (the ledger, idempotent by
    idempotency key) executed it once, the record holding that execution; every execution belongs to a recorded
    effect, so a re-execution that used another idempotency key shows as an execution nobody recorded; and a
    re-execution (a deduplicated call) only where the crashed worker's first call never had its step committed."""
    problems: list[str] = []
    expected: dict[str, tuple[str, str, EffectKeys]] = {}  # idempotency key -> (thread, effect key, its keys)
    for thread_id, stored in latest.items():
        if stored is None or not isinstance(stored.checkpoint.state, dict):
            continue
        turn = stored.checkpoint.metadata.get(TURN_KEY)  # the demo's threads each run one turn
        for key in stored.checkpoint.state.get("effects", []):
            keys = effect_keys(thread_id, key, turn_id=turn)
            expected[keys.idempotency] = (thread_id, key, keys)
    executions = {e.idempotency_key: e for e in ledger.executions() if e.thread_id in latest}
    attempts = [a for a in ledger.attempts() if a.thread_id in latest]
    victim = crash.worker if crash is not None else None
    once = 0
    for idempotency_key, (thread_id, key, keys) in sorted(expected.items(), key=lambda item: item[1][:2]):
        execution = executions.get(idempotency_key)
        record = store.effect(thread_id, keys.record)
        intent = store.effect(thread_id, keys.intent)
        if record is None:
            problems.append(f"{thread_id} has no effect record for {key!r}")
        if execution is None:
            problems.append(f"{thread_id} effect {key!r} is in the thread's state but never executed")
            continue
        # The intent names the first run that meant to call: the one whose call executed, or a crashed worker's
        # run that died before its call reached the provider.
        crashed_first = victim is not None and worker_of(intent.run_id if intent else None) == victim
        if intent is None or (intent.run_id != execution.run_id and not crashed_first):
            problems.append(f"{thread_id} effect {key!r} was called by {execution.run_id} without its intent")
            continue
        if record is not None and (record.result or {}).get("execution_id") != execution.execution_id:
            problems.append(f"{thread_id} effect {key!r} records another execution than the ledger's")
            continue
        once += record is not None
    for idempotency_key in sorted(set(executions) - set(expected)):
        stray = executions[idempotency_key]
        problems.append(
            f"{stray.thread_id} effect {stray.key!r} executed (idempotency key {idempotency_key}) "
            "but no completed run recorded it"
        )
    repeats = [a for a in attempts if a.outcome != "executed"]
    for attempt in repeats:
        # A re-execution is legitimate only where the first call's step never committed: the crashed worker made
        # the first call, and the effect record is not its run's (a recovered run that re-executed the node).
        first = executions.get(attempt.idempotency_key)
        known = expected.get(attempt.idempotency_key)
        record = store.effect(attempt.thread_id, known[2].record) if known is not None else None
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
    figure = (
        f"{once}/{len(expected)} effects recorded once; {len(repeats)} re-execution(s) after the crash, "
        "each with its first call's idempotency key (the provider executed it once)"
    )
    return Check(name=EFFECTS_CHECK, passed=not problems, figure=figure, problems=_examples(problems))


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
    event_count = sum(len(e) for e in logs.values())
    figure = f"0 of {event_count} events and {sum(len(h) for h in histories.values())} checkpoints with a stale token"
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


__all__ = [
    "PAGE",
    "PROBES",
    "Check",
    "Crash",
    "Takeover",
    "all_threads",
    "demo_entries",
    "find_takeovers",
    "probe_stale_writes",
    "read_events",
    "read_history",
    "runs_in_order",
    "verify",
]
