"""``threadloom queue list|enqueue|retry|cancel``: see and act on the store's durable run queue.

``list`` only reads. ``enqueue`` adds an open entry. ``retry`` enqueues a new entry with a failed entry's thread,
graph, input and tenant.
``cancel`` finishes an open entry ``FAILED``, fenced: it leases the entry itself and finishes it with that lease,
so a worker holding an older lease can renew, record and finish nothing more. Refusals (an unknown entry, an
entry in the wrong state, a live lease without ``--force``) change nothing and exit with status 1.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from rich.text import Text

from threadloom.cli.output import (
    EXIT_USAGE,
    TENANT,
    CliError,
    CliState,
    FiniteFloatRange,
    cell,
    new_table,
    parse_json_option,
    printable,
    state_of,
)
from threadloom.domain import rules
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.validation import MAX_DURATION
from threadloom.domain.values import CheckpointStatus
from threadloom.persistence.queue import RunQueue, cancel_entry, check_enqueue, queue_of

STATES = ("open", "leased", "completed", "failed", "done")
"""The choices of ``queue list --state``: open (not finished, leased or not), leased (open and a lease names a
holder, live or expired), completed, failed; ``done`` is an older name of ``completed``, still accepted."""

SCAN_PAGES = 20
"""``queue list`` with ``--tenant`` or ``--state leased`` reads at most this many pages of 1000 entries to fill its
page; the cursor it prints then resumes where it stopped."""

MAX_DELAY_DAYS = MAX_DURATION.days
"""The longest ``queue enqueue --delay``, in days (in seconds: ``MAX_DURATION.total_seconds()``)."""

CANCEL_REASON = "cancelled by an operator"
"""The ``error`` text of an entry ``queue cancel`` finished, before the optional ``--reason``."""


def _queue(state: CliState, *, read_only: bool, create: bool = False) -> RunQueue:
    store = state.store(read_only=read_only, create=create)
    try:
        return queue_of(store)
    except Exception as error:
        raise CliError(f"the store {state.safe_url!r} has no run queue", kind="ValidationError") from error


def entry_state(entry: QueueEntry, now: datetime) -> str:
    """``open``, ``leased`` (a live lease by ``now``), ``leased (expired)``, ``completed`` or ``failed``."""
    if entry.status is not EntryStatus.OPEN:
        return entry.status.value
    if entry.leased_by is None or entry.lease_expires_at is None:
        return "open"
    return "leased" if now < entry.lease_expires_at else "leased (expired)"


def age_text(span: timedelta) -> str:
    """A duration in its two largest units: ``45s``, ``3m12s``, ``2h05m``, ``4d03h``."""
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def clock_text(when: datetime, now: datetime) -> str:
    """``when`` in UTC: ``HH:MM:SS`` on the UTC day of ``now``, else ``YYYY-MM-DD HH:MM:SS``."""
    when = when.astimezone(UTC)
    return f"{when:%H:%M:%S}" if when.date() == now.astimezone(UTC).date() else f"{when:%Y-%m-%d %H:%M:%S}"


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def entry_json(entry: QueueEntry, now: datetime) -> dict[str, Any]:
    """An entry as a JSON object (times ISO 8601 by the store's clock; ``state`` as :func:`entry_state`).

    ``attempts`` counts every lease; ``refunded`` those handed back by a worker that stopped (not a try), and
    ``counted_attempts`` (their difference) is what ``ServePolicy.max_attempts`` limits.
    """
    return {
        "entry_id": entry.entry_id,
        "thread_id": entry.thread_id,
        "graph_id": entry.graph_id,
        "tenant_id": entry.tenant_id,
        "status": entry.status.value,
        "state": entry_state(entry, now),
        "attempts": entry.attempts,
        "refunded": entry.refunded,
        "counted_attempts": entry.counted_attempts,
        "run_ids": list(entry.run_ids),
        "leased_by": entry.leased_by,
        "lease_expires_at": _iso(entry.lease_expires_at),
        "enqueued_at": _iso(entry.enqueued_at),
        "available_at": _iso(entry.available_at),
        "finished_at": _iso(entry.finished_at),
        "error": entry.error,
        "retried_as": entry.retried_as,
        "input": entry.input,
    }


def _matches(entry: QueueEntry, wanted: str | None, tenant: str | None, all_tenants: bool) -> bool:
    if not all_tenants and entry.tenant_id != tenant:
        return False
    return wanted != "leased" or entry.leased_by is not None


def list_entries(
    queue: RunQueue, *, state: str | None, tenant: str | None, all_tenants: bool, limit: int, after: int
) -> tuple[list[QueueEntry], int | None]:
    """Up to ``limit`` entries after ``after`` that match, ascending, and the cursor of the next page (or None)."""
    status = {"open": EntryStatus.OPEN, "leased": EntryStatus.OPEN, "completed": EntryStatus.COMPLETED,
              "done": EntryStatus.COMPLETED, "failed": EntryStatus.FAILED}.get(state or "")
    found: list[QueueEntry] = []
    cursor = after
    for _ in range(SCAN_PAGES):
        page = queue.entries(limit=rules.MAX_PAGE, after=cursor, status=status)
        for entry in page:
            cursor = entry.entry_id
            if _matches(entry, state, tenant, all_tenants):
                found.append(entry)
                if len(found) == limit:
                    return found, cursor
        if len(page) < rules.MAX_PAGE:
            return found, None
    return found, cursor


def _now() -> datetime:
    return datetime.now(UTC)


def graph_seen(store: Any, queue: RunQueue, graph_id: str) -> bool:
    """Whether ``store`` shows signs of graph kind ``graph_id``: a thread whose latest checkpoint is of it (read
    through the store's index, any tenant), or a run-queue entry of it, of any state.

    The queue is read page by page, at most :data:`SCAN_PAGES` pages of 1000 entries; a queue longer than that
    with no entry of the graph in those pages counts as seen (the check never warns on a guess).

    Raises:
        ValidationError: ``graph_id`` is not a valid id (field ``graph_id``).
    """
    from threadloom.domain.access import WALK_GRAPH_ID

    if graph_id != WALK_GRAPH_ID and store.graph_threads(graph_id, limit=1):
        return True
    cursor = 0
    for _ in range(SCAN_PAGES):
        page = queue.entries(limit=rules.MAX_PAGE, after=cursor)
        if any(entry.graph_id == graph_id for entry in page):
            return True
        if len(page) < rules.MAX_PAGE:
            return False
        cursor = page[-1].entry_id
    return True


@click.group(name="queue")
def queue() -> None:
    """See and act on the run queue: list entries, enqueue a run, retry a failed one, cancel an open one."""


@queue.command(name="list")
@click.option("--state", "wanted", type=click.Choice(STATES, case_sensitive=False), default=None,
              help="Only entries in this state, as the table shows it (leased: open with a lease, live or "
                   "expired; done: the same as completed).")
@click.option("--tenant", default=None, type=TENANT, metavar="TENANT", help="Only this tenant's entries.")
@click.option("--limit", type=click.IntRange(1, rules.MAX_PAGE), default=50, show_default=True,
              help="Entries per page.")
@click.option("--after", type=click.IntRange(min=0), default=0, metavar="ENTRY",
              help="Start after this entry id (the cursor a page prints).")
@click.pass_context
def list_command(ctx: click.Context, wanted: str | None, tenant: str | None, limit: int, after: int) -> None:
    """List run-queue entries, oldest first: thread, tenant, graph, attempts and their runs, lease, age.

    An open entry not leasable yet (enqueued with --delay, or pushed back by a released lease) says when it
    becomes available; a failed entry that was retried names the entry its retry enqueued. Below the table,
    each listed entry that has an error text (a failed or cancelled one) prints it on a line of its own.

    Without --tenant it lists every tenant's entries. Times are the store's stamps (UTC); ages, lease states and
    availability are judged by the store's clock, read once as the listing starts (--json: "read_at").
    """
    state = state_of(ctx)
    q = _queue(state, read_only=True)
    wanted = wanted.lower() if wanted else None
    if wanted == "done":  # the older name of the state the table shows as completed
        wanted = "completed"
    now = q.depth().read_at  # the store's clock: the one that stamped the entries' times
    items, cursor = list_entries(
        q, state=wanted, tenant=tenant, all_tenants=tenant is None, limit=limit, after=after
    )
    if state.json_output:
        state.emit({"entries": [entry_json(e, now) for e in items], "next": cursor, "read_at": _iso(now)})
        return
    title = "run queue" + (f" of tenant {tenant!r}" if tenant is not None else "") + (f", {wanted}" if wanted else "")
    table = new_table(title, "entry", "thread (tenant)", "graph", "state", "tries", "runs", "lease", "age")
    for e in items:
        lease = ""
        if e.leased_by is not None and e.lease_expires_at is not None:
            lease = f"{e.leased_by} until {clock_text(e.lease_expires_at, now)}"
        shown = entry_state(e, now)
        if e.open and e.available_at > now:
            shown += f", from {clock_text(e.available_at, now)}"
        if e.retried_as is not None:
            shown += f", retried as {e.retried_as}"
        table.add_row(
            cell(e.entry_id), cell(e.thread_id if e.tenant_id is None else f"{e.thread_id} ({e.tenant_id})"),
            cell(e.graph_id), cell(shown),
            cell(e.attempts), cell(" ".join(e.run_ids)), cell(lease), cell(age_text(now - e.enqueued_at)),
        )
    state.out.print(table)
    for e in items:  # below the table, so it still fits 80 columns: an error text is often long
        if e.error:
            state.out.print(Text(f"entry {e.entry_id}: {printable(e.error)}"))
    more = f" - more follow: --after {cursor}" if cursor is not None else ""
    state.out.print(Text(f"{len(items)} entr{'y' if len(items) == 1 else 'ies'}{more}", style="dim"))


def _unknown_entry(state: CliState, entry_id: int) -> CliError:
    return CliError(f"unknown run-queue entry {entry_id} in {state.safe_url}", kind="UnknownEntry")


def _check_retriable(state: CliState, entry_id: int, entry: QueueEntry | None) -> None:
    """Raises the CliError (exit 1) that says why ``entry`` cannot be retried; returns if it can."""
    if entry is None:
        raise _unknown_entry(state, entry_id)
    if entry.status is not EntryStatus.FAILED:
        why = "it is open: a worker runs it when it leases it" if entry.open else "it completed"
        raise CliError(f"entry {entry_id} is not retried: {why}", kind="InvalidEntryState")
    if entry.retried_as is not None:
        raise CliError(
            f"entry {entry_id} is not retried: it was retried already, as entry {entry.retried_as}",
            kind="InvalidEntryState",
        )


@queue.command()
@click.argument("entry_id", metavar="ENTRY", type=click.IntRange(min=1))
@click.pass_context
def retry(ctx: click.Context, entry_id: int) -> None:
    """Enqueue a failed ENTRY again: a new entry with its thread, graph, input and tenant.

    An entry is retried once: the store records the new entry on the failed one in the same transaction, so a
    second retry (even a concurrent one) is refused, naming the entry the first enqueued.
    Refused (exit 1, nothing written): an unknown entry, an open one (it runs when a worker leases it), a
    completed one, one already retried, and a failed one whose run was admitted and is still incomplete on the
    thread (recover the thread instead, so the input is not admitted twice).
    """
    state = state_of(ctx)
    q = _queue(state, read_only=False)
    entry = q.entry(entry_id)
    _check_retriable(state, entry_id, entry)
    assert entry is not None
    store = state.store()
    admitted = store.lookup_run(entry.thread_id, entry.run_ids) if entry.run_ids else None
    if admitted is not None:
        latest = store.latest(entry.thread_id)
        if latest is not None and latest.checkpoint.status is CheckpointStatus.RUNNING:
            raise CliError(
                f"entry {entry_id} is not retried: its run {admitted.run_id!r} was admitted and thread "
                f"{entry.thread_id!r} is still incomplete; recover it (threadloom recover {entry.thread_id} "
                "--graph module:attr) so that its input is not admitted twice",
                kind="InvalidEntryState",
            )
    new = q.retry(entry_id)
    if new is None:  # another retry (or a purge) came first: say which
        _check_retriable(state, entry_id, q.entry(entry_id))
        raise CliError(f"entry {entry_id} is not retried: the store refused it", kind="InvalidEntryState")
    if state.json_output:
        state.emit({"retried": entry_id, "entry": entry_json(new, _now())})
        return
    state.out.print(cell(f"entry {entry_id} enqueued again as entry {new.entry_id} (thread {entry.thread_id}, "
                         f"graph {entry.graph_id})"))


@queue.command()
@click.argument("thread_id", metavar="THREAD")
@click.option("--graph", "graph_id", required=True, metavar="GRAPH_ID",
              help="The graph kind a worker runs for it (the id 'serve' knows it by).")
@click.option("--input", "input_text", default="null", show_default=True, metavar="JSON",
              help="The run's input, a JSON value.")
@click.option("--tenant", default=None, type=TENANT, metavar="TENANT", help="The tenant the run is for.")
@click.option("--delay", type=FiniteFloatRange(0, MAX_DURATION.total_seconds()), default=0.0, show_default=True,
              metavar="SECONDS",
              help=f"Not leased before this many seconds from now (by the store's clock; at most {MAX_DELAY_DAYS} "
                   "days).")
@click.pass_context
def enqueue(
    ctx: click.Context, thread_id: str, graph_id: str, input_text: str, tenant: str | None, delay: float
) -> None:
    """Add an open entry asking a worker ('threadloom serve') for a run of --graph on THREAD with --input.

    A store that does not exist yet is created. Refused (exit 2, nothing written): input that is not JSON, a bad
    thread, graph or tenant id, and a memory:// store (its queue is gone when the command exits). An object in
    --input that names a key twice is refused too. Running the command again after a failure may add a second
    entry (entries have no idempotency key): check with 'queue list' first.

    A graph the store shows no sign of (no thread of it, no other queue entry of it) is still enqueued, with a
    note on stderr that no runtime serving it has been seen: a mistyped --graph waits forever (--json:
    "graph_seen").
    """
    state = state_of(ctx)
    if state.store_url.partition(":")[0].lower() == "memory":
        raise CliError(
            "queue enqueue: a memory:// store lives only as long as this command, so the entry would be gone when "
            "it exits and no worker could run it; name a SQLite or PostgreSQL store with --store",
            EXIT_USAGE,
            kind="ValidationError",
        )
    value = parse_json_option("--input", input_text)
    # every check before the store opens: a refused entry creates no store either
    check_enqueue(thread_id, graph_id, value, tenant, timedelta(seconds=delay))
    q = _queue(state, read_only=False, create=True)  # enqueueing onto a new store creates it, as serve does
    seen = graph_seen(state.store(), q, graph_id)  # before the entry: it would be a sign of its own graph
    entry = q.enqueue(thread_id, graph_id=graph_id, input=value, tenant_id=tenant, delay=timedelta(seconds=delay))
    if not seen:
        click.echo(printable(
            f"threadloom: note: no runtime serving graph {graph_id!r} has been seen in this store (no thread and no "
            "other queue entry of it); the entry stays queued until a worker serves that graph id ('threadloom "
            "serve --graph module:attr')"
        ), err=True)  # fmt: skip
    if state.json_output:
        state.emit({"entry": entry_json(entry, _now()), "graph_seen": seen})
        return
    state.out.print(cell(f"entry {entry.entry_id} enqueued (thread {entry.thread_id}, graph {entry.graph_id})"))


def cancel_holder() -> str:
    """The lease holder ``queue cancel`` records: ``threadloom-cli@<host>:<pid>``."""
    return f"threadloom-cli@{socket.gethostname()}:{os.getpid()}"


@queue.command()
@click.argument("entry_id", metavar="ENTRY", type=click.IntRange(min=1))
@click.option("--force", is_flag=True, help="Also cancel an entry a worker holds a live lease on (fences it).")
@click.option("--reason", default=None, metavar="TEXT", help="Added to the entry's error text.")
@click.pass_context
def cancel(ctx: click.Context, entry_id: int, force: bool, reason: str | None) -> None:
    """Cancel the open ENTRY: it is finished FAILED ("cancelled by an operator") and never leased again.

    An entry a live lease holds (a worker is running it) is refused unless --force, which fences the lease: the
    worker's next renewal fails and it stops the run at its next step (what the run committed stays). Refused
    (exit 1, nothing changed): an unknown or finished entry, a live lease without --force.
    """
    state = state_of(ctx)
    q = _queue(state, read_only=False)
    before = q.entry(entry_id)
    if before is None:
        raise _unknown_entry(state, entry_id)
    text = CANCEL_REASON if reason is None else f"{CANCEL_REASON}: {reason}"
    done = None if not before.open else cancel_entry(q, entry_id, holder=cancel_holder(), reason=text, force=force)
    if done is None:
        now = q.entry(entry_id) or before
        if not now.open:
            raise CliError(f"entry {entry_id} is not cancelled: it is already {now.status.value}",
                           kind="InvalidEntryState")
        raise CliError(
            f"entry {entry_id} is not cancelled: {now.leased_by} holds a live lease on it until "
            f"{_iso(now.lease_expires_at)}; --force cancels it and fences that lease",
            kind="EntryLeased",
        )
    fenced = before.leased_by if before.leased_by is not None else None
    if state.json_output:
        state.emit({"cancelled": entry_id, "fenced": fenced, "entry": entry_json(done, _now())})
        return
    note = f"; the lease of {fenced} is fenced" if fenced else ""
    state.out.print(cell(f"entry {entry_id} cancelled (thread {done.thread_id}){note}"))


__all__ = ["CANCEL_REASON", "SCAN_PAGES", "STATES", "age_text", "entry_json", "entry_state", "list_entries", "queue"]
