"""``threadloom threads``, ``show``, ``history`` and ``events``: read a store's threads from a terminal or a script.

Each command reads only (no claim, nothing written) and refuses a SQLite file that does not exist. ``events
--follow`` waits for commits from any process and prints each event as it lands, until Ctrl-C.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import click
import structlog
from rich.table import Table
from rich.text import Text

from threadloom.cli.output import (
    TENANT,
    CliError,
    CliState,
    cell,
    checkpoint_json,
    cursor_json,
    event_json,
    event_line,
    json_block,
    json_cell,
    json_text,
    new_table,
    pending_write_json,
    state_of,
    summary_json,
    time_cell,
)
from threadloom.cli.queue import age_text, entry_json, entry_state
from threadloom.domain import rules
from threadloom.domain.errors import CancelledError, ReplayUnavailable
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.values import (
    Checkpoint,
    EventRecord,
    PendingWrite,
    RunClaim,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence.base import Checkpointer

FOLLOW_WAIT = timedelta(seconds=5)
"""How long one ``await_events_after`` call of ``events --follow`` waits before it asks again."""
FOLLOW_PAGE = 1000
"""At most this many events per read of ``events --follow``."""
FOLLOW_STOP_GRACE_S = 3.0
"""After Ctrl-C, how long ``events --follow`` waits (seconds) for the store's wait to end before exiting."""
QUEUE_SCAN_PAGES = 10
"""``show`` looks for the open run-queue entries naming the thread in at most this many pages of 1000."""
REGISTRY_SCAN_PAGES = 10
"""``show`` looks for the thread's registry row in at most this many pages of 1000 of its tenant's threads."""

_log = structlog.get_logger("threadloom.cli")


@click.command()
@click.option(
    "--tenant",
    default=None,
    type=TENANT,
    metavar="TENANT",
    help="The tenant whose threads to list (absent: the threads with no tenant; 'threadloom tenants' lists them).",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([status.value for status in ThreadStatus], case_sensitive=False),
    help="Only threads in this status (repeat for several).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, ThreadQuery.MAX_LIMIT),
    default=50,
    show_default=True,
    help="Threads per page.",
)
@click.option("--all-pages", is_flag=True, help="Follow the cursor through every page.")
@click.pass_context
def threads(ctx: click.Context, tenant: str | None, statuses: tuple[str, ...], limit: int, all_pages: bool) -> None:
    """List a tenant's root threads, most recently updated first.

    Without --tenant it lists the threads that have no tenant, and says how many root threads the tenants hold
    (list those with --tenant T, or the tenants with 'threadloom tenants').

    Status: running (a live claim holds it), idle (no live claim, latest checkpoint running), suspended,
    completed, failed, deleted (a cascade delete began).
    """
    state = state_of(ctx)
    store = state.store(read_only=True)
    query = ThreadQuery(
        tenant_id=tenant,
        limit=limit,
        statuses=frozenset(ThreadStatus(s.lower()) for s in statuses) if statuses else None,
    )
    items: list[ThreadSummary] = []
    page = store.threads(query)
    items.extend(page.items)
    while all_pages and page.next is not None:
        page = store.threads(attrs.evolve(query, after=page.next))
        items.extend(page.items)
    others = None
    if tenant is None:
        from threadloom.cli.tenants import other_tenants

        others = other_tenants(store)
    if state.json_output:
        document: dict[str, Any] = {
            "tenant_id": tenant, "threads": [summary_json(s) for s in items], "next": cursor_json(page.next)
        }
        if others is not None:
            document["other_tenants"] = others.to_json()
        state.emit(document)
        return
    title = f"threads of tenant {tenant!r}" if tenant is not None else "threads (no tenant)"
    table = new_table(title, "thread", "status", "updated at", "latest checkpoint", "latest run", "graph", "metadata")
    for s in items:
        table.add_row(
            cell(s.thread_id),
            cell(s.status.value),
            time_cell(s.updated_at),
            cell(s.latest_checkpoint_id),
            cell(s.latest_run_id),
            cell(s.graph_id),
            json_cell(s.metadata) if s.metadata else Text(""),
        )
    state.out.print(table)
    more = " — more follow: add --all-pages" if page.next else ""
    state.out.print(Text(f"{len(items)} thread(s){more}", style="dim"))
    if others is not None and others.threads:
        state.out.print(Text(others.hint, style="dim"))


# -- show --------------------------------------------------------------------------------------------------------------


def _find_in_registry(store: Checkpointer, cp: Checkpoint) -> ThreadSummary | None:
    """The thread's registry row, looked for in at most :data:`REGISTRY_SCAN_PAGES` pages of its tenant."""
    query = ThreadQuery(tenant_id=cp.tenant_id, limit=ThreadQuery.MAX_LIMIT)
    for _ in range(REGISTRY_SCAN_PAGES):
        page = store.threads(query)
        for summary in page.items:
            if summary.thread_id == cp.thread_id:
                return summary
        if page.next is None:
            return None
        query = attrs.evolve(query, after=page.next)
    return None


def _open_entries_of(store: Checkpointer, thread: str) -> tuple[list[QueueEntry], bool]:
    """The open run-queue entries naming ``thread`` among the first :data:`QUEUE_SCAN_PAGES` pages of open
    entries, and whether that was all of them."""
    queue = getattr(store, "queue", None)
    if queue is None:
        return [], True
    found: list[QueueEntry] = []
    after = 0
    for _ in range(QUEUE_SCAN_PAGES):
        page = queue.entries(limit=rules.MAX_PAGE, after=after, status=EntryStatus.OPEN)
        found.extend(e for e in page if e.thread_id == thread)
        if len(page) < rules.MAX_PAGE:
            return found, True
        after = page[-1].entry_id
    return found, False


def _claim_live(claim: RunClaim, summary: ThreadSummary | None) -> str:
    """``live``/``expired`` as the store judged it (its registry row), else by this host's clock."""
    if summary is not None:
        return "live" if summary.status is ThreadStatus.RUNNING else "expired"
    return ("live" if datetime.now(UTC) < claim.expires_at else "expired") + " (by this host's clock)"


def _claim_json(claim: RunClaim | None, summary: ThreadSummary | None) -> dict[str, Any] | None:
    if claim is None:
        return None
    return {"holder": claim.holder, "token": claim.token, "expires_at": claim.expires_at.isoformat(),
            "tenant_id": claim.tenant_id, "state": _claim_live(claim, summary)}


def _claim_cell(claim: RunClaim | None, summary: ThreadSummary | None) -> Text:
    if claim is None:
        return Text("none (no run holds it)", style="dim")
    expires = claim.expires_at.isoformat(sep=" ", timespec="seconds")
    return cell(f"{claim.holder} (token {claim.token}), expires {expires} by the store's clock: "
                f"{_claim_live(claim, summary)}")


LANGGRAPH_GRAPH_ID = "langgraph"
"""The ``graph_id`` of the LangGraph saver's checkpoints (``threadloom.langgraph``, imported only for one)."""


def _langgraph_values(cp: Checkpoint, writes: list[PendingWrite]) -> tuple[dict[str, Any] | None, str | None]:
    """A LangGraph saver's checkpoint and pending writes decoded, or why not; (None, None) when ``cp`` is not the
    saver's or LangGraph is not installed. Decoded with the saver's strict serializer: nothing is unpickled and
    no callable a stored value names is called."""
    if cp.graph_id != LANGGRAPH_GRAPH_ID:
        return None, None
    try:
        from threadloom.langgraph import decode_stored
    except ImportError:  # without the langgraph extra: the stored values are shown as they are
        return None, None
    try:
        return decode_stored(cp, writes), None
    except Exception as error:  # a value the strict serializer refuses or cannot read: shown as stored
        text = str(error).strip().splitlines()
        why = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
        return None, f"langgraph: the checkpoint's values do not decode ({why}); shown as stored"


def _unknown_thread(state: CliState, thread_id: str) -> CliError:
    return CliError(f"unknown thread {thread_id!r}: it has no checkpoint in {state.safe_url}", kind="UnknownThread")


@click.command()
@click.argument("thread")
@click.pass_context
def show(ctx: click.Context, thread: str) -> None:
    """Show THREAD's latest checkpoint, its pending writes and its registry row.

    Also the claim that holds it (its holder and expiry by the store's clock, live or expired) and the open
    run-queue entries naming it. Child threads (spawned by another thread) are not in the registry. A LangGraph
    saver's checkpoint is shown decoded when LangGraph is installed (never unpickling; --json: the "langgraph"
    key).
    """
    state = state_of(ctx)
    store = state.store(read_only=True)
    stored = store.latest(thread)
    if stored is None:
        raise _unknown_thread(state, thread)
    cp = stored.checkpoint
    notes: list[str] = []
    claim = store.current_claim(thread)
    entries, scanned_all = _open_entries_of(store, thread)
    if not scanned_all:
        notes.append(f"queue: only the first {QUEUE_SCAN_PAGES * rules.MAX_PAGE} open entries were searched")
    summary = None
    if cp.origin is not None:
        notes.append(f"registry: a child thread (of {cp.origin.parent_thread!r}) is not listed in the registry")
    else:
        summary = _find_in_registry(store, cp)
        if summary is None:
            notes.append(
                f"registry: not among the newest {REGISTRY_SCAN_PAGES * ThreadQuery.MAX_LIMIT} threads of its tenant"
            )
    decoded, undecodable = _langgraph_values(cp, list(stored.pending_writes))
    if undecodable is not None:
        notes.append(undecodable)
    now = datetime.now(UTC)
    if state.json_output:
        document: dict[str, Any] = {
            "thread_id": thread,
            "checkpoint": checkpoint_json(cp),
            "pending_writes": [pending_write_json(pw) for pw in stored.pending_writes],
            "registry": None if summary is None else summary_json(summary),
            "claim": _claim_json(claim, summary),
            "queue_entries": [entry_json(e, now) for e in entries],
            "notes": notes,
        }
        if decoded is not None or undecodable is not None:
            document["langgraph"] = decoded
        state.emit(document)
        return
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    rows: list[tuple[str, Text]] = [
        ("thread", cell(thread)),
        ("status", cell(summary.status.value) if summary is not None else Text("(not in the registry)", style="dim")),
        ("updated at", time_cell(summary.updated_at) if summary is not None else Text("")),
        ("claim", _claim_cell(claim, summary)),
        ("checkpoint", cell(cp.id)),
        ("parent", cell(cp.parent)),
        ("checkpoint status", cell(cp.status.value)),
        ("run", cell(cp.run_id)),
        ("token", cell(cp.fencing_token)),
        ("graph", cell(cp.graph_id)),
        ("tenant", cell(cp.tenant_id)),
        ("created at", time_cell(cp.created_at)),
    ]
    if cp.origin is not None:
        rows.append(("origin", json_cell(checkpoint_json(cp)["origin"])))
    if cp.metadata:
        rows.append(("checkpoint metadata", json_cell(cp.metadata)))
    if summary is not None and summary.metadata:
        rows.append(("thread metadata", json_cell(summary.metadata)))
    for key, value in rows:
        facts.add_row(key, value)
    state.out.print(facts)
    if decoded is None:
        state.out.print(Text("state", style="bold"))
        state.out.print(json_block(cp.state))
    else:
        state.out.print(Text("state (LangGraph checkpoint, decoded)", style="bold"))
        state.out.print(json_block({key: decoded[key] for key in ("checkpoint", "metadata", "parent")}))
    if stored.pending_writes:
        writes = new_table(f"pending writes ({len(stored.pending_writes)})", "task", "node", "payload")
        for i, pw in enumerate(stored.pending_writes):
            payload = pw.payload
            if decoded is not None and isinstance(payload, dict):
                payload = {**payload, "value": decoded["pending_writes"][i]["value"]}
            writes.add_row(cell(pw.task_id), cell(pw.node_id), json_cell(payload))
        state.out.print(writes)
    else:
        state.out.print(Text("no pending writes", style="dim"))
    if entries:
        table = new_table(f"open run-queue entries of {thread!r}", "entry", "graph", "state", "tries", "lease", "age")
        for e in entries:
            lease = f"{e.leased_by} until {e.lease_expires_at:%H:%M:%S}" if e.lease_expires_at and e.leased_by else ""
            table.add_row(cell(e.entry_id), cell(e.graph_id), cell(entry_state(e, now)), cell(e.attempts),
                          cell(lease), cell(age_text(now - e.enqueued_at)))
        state.out.print(table)
    else:
        state.out.print(Text("no open run-queue entry names it", style="dim"))
    for note in notes:
        state.out.print(cell(note, style="dim"))


# -- history -----------------------------------------------------------------------------------------------------------


def _history(store: Checkpointer, thread: str, limit: int, before: str | None) -> list[Checkpoint]:
    out: list[Checkpoint] = []
    while len(out) < limit:
        want = min(rules.MAX_PAGE, limit - len(out))
        page = store.history(thread, limit=want, before=before)
        out.extend(page)
        if len(page) < want:
            break
        before = page[-1].id
    return out


@click.command()
@click.argument("thread")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many.")
@click.option("--before", metavar="CHECKPOINT", default=None, help="Start after this checkpoint (to page on).")
@click.pass_context
def history(ctx: click.Context, thread: str, limit: int, before: str | None) -> None:
    """List THREAD's checkpoints, newest first."""
    state = state_of(ctx)
    store = state.store(read_only=True)
    items = _history(store, thread, limit + 1, before)
    more = len(items) > limit
    items = items[:limit]
    if not items and before is None and store.latest(thread) is None:
        raise _unknown_thread(state, thread)
    next_before = items[-1].id if more else None
    if state.json_output:
        state.emit({"thread_id": thread, "checkpoints": [checkpoint_json(cp) for cp in items], "next": next_before})
        return
    table = new_table(
        f"history of {thread!r}, newest first", "checkpoint", "parent", "status", "run", "token", "created at"
    )
    for cp in items:
        table.add_row(
            cell(cp.id), cell(cp.parent), cell(cp.status.value), cell(cp.run_id), cell(cp.fencing_token),
            time_cell(cp.created_at),
        )
    state.out.print(table)
    if next_before is not None:
        state.out.print(Text(f"more follow: --before {next_before}", style="dim"))


# -- events ------------------------------------------------------------------------------------------------------------


def _earliest_after(store: Checkpointer, thread: str) -> int:
    """The ``after_seq`` that reads from the earliest event ``thread`` still keeps (0 unless compacted or pruned)."""
    try:
        store.events_after(thread, 0, 1)
    except ReplayUnavailable as error:
        return error.earliest_seq - 1
    return 0


def _read_events(store: Checkpointer, thread: str, after: int, limit: int) -> list[EventRecord]:
    out: list[EventRecord] = []
    while len(out) < limit:
        want = min(rules.MAX_EVENTS_PAGE, limit - len(out))
        page = store.events_after(thread, after, want)
        out.extend(page)
        if len(page) < want:
            break
        after = page[-1].seq
    return out


def follow_events(
    store: Checkpointer,
    thread: str,
    after: int,
    limit: int | None,
    deliver: Callable[[EventRecord], None],
    *,
    wait: timedelta = FOLLOW_WAIT,
) -> None:
    """Delivers THREAD's events after ``after`` as they are committed, until Ctrl-C, SIGTERM or ``limit`` events.

    The waiting happens on a thread of its own with ``await_events_after`` and a cancel event; the calling
    (main) thread only waits for it, so Ctrl-C or SIGTERM (both raise ``KeyboardInterrupt`` there) reaches it at
    once, sets the cancel event and returns normally once the store's wait has ended (or after
    :data:`FOLLOW_STOP_GRACE_S`). A second Ctrl-C during that wait raises ``KeyboardInterrupt`` (exit status 130).

    Raises:
        ThreadloomError: the store refused a read (e.g. ``ThreadDeleted`` when the thread is deleted).
    """
    cancel = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        last = after
        delivered = 0
        try:
            while not cancel.is_set():
                page = FOLLOW_PAGE if limit is None else min(FOLLOW_PAGE, limit - delivered)
                for event in store.await_events_after(thread, last, page, wait, cancel=cancel):
                    deliver(event)
                    last = event.seq
                    delivered += 1
                if limit is not None and delivered >= limit:
                    return
        except CancelledError:
            return
        except BaseException as error:  # reported by the main thread
            if not cancel.is_set():
                failures.append(error)

    main = threading.current_thread() is threading.main_thread()
    # Ctrl-C and SIGTERM (a service manager's stop, ``kill``) both raise KeyboardInterrupt here: the normal end.
    stops = [sig for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)) if sig is not None] if main else []
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in stops}
    worker = threading.Thread(target=run, name="threadloom-follow", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        worker.join(FOLLOW_STOP_GRACE_S)
        _log.debug("cli.follow_stopped", thread_id=thread)
        return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if failures:
        raise failures[0]


@click.command()
@click.argument("thread")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=None,
    help="Events with seq > AFTER [default: from the earliest event the store still keeps].",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many events [default: 100; with --follow: no limit].",
)
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing new events as they are committed, until Ctrl-C or SIGTERM."
)
@click.pass_context
def events(ctx: click.Context, thread: str, after: int | None, limit: int | None, follow: bool) -> None:
    """Print THREAD's numbered events after --after, oldest first.

    Without --after it starts at the earliest event still kept (retention and compaction drop older ones). With
    --follow, waits for new commits (from any process) and prints each event as it lands; Ctrl-C or SIGTERM ends
    it with exit status 0. With --json, --follow prints one JSON object per line.
    """
    state = state_of(ctx)
    store = state.store(read_only=True)
    if after is None:
        after = _earliest_after(store, thread)
    try:
        _print_events(state, store, thread, after, limit, follow)
    except ReplayUnavailable as error:  # told in the command's words (--after), not the library's (after_seq)
        raise CliError(
            f"events of thread {thread!r} before {error.earliest_seq} were compacted or pruned; use --after "
            f"{error.earliest_seq - 1} or more, or leave --after out to start at the earliest kept",
            kind="ReplayUnavailable",
        ) from error


def _print_events(
    state: CliState, store: Checkpointer, thread: str, after: int, limit: int | None, follow: bool
) -> None:
    if follow:
        if state.json_output:

            def deliver(event: EventRecord) -> None:
                sys.stdout.write(json_text(event_json(event)) + "\n")
                sys.stdout.flush()

        else:

            def deliver(event: EventRecord) -> None:
                state.out.print(event_line(event))
                state.out.file.flush()

        follow_events(store, thread, after, limit, deliver)
        return
    want = 100 if limit is None else limit
    items = _read_events(store, thread, after, want + 1)
    more = len(items) > want
    items = items[:want]
    if not items and after == 0 and store.latest(thread) is None:
        raise _unknown_thread(state, thread)
    next_after = items[-1].seq if more else None
    if state.json_output:
        last = items[-1].seq if items else after
        state.emit({"thread_id": thread, "events": [event_json(ev) for ev in items], "last_seq": last,
                    "next": next_after})
        return
    table = new_table(
        f"events of {thread!r} after {after}", "seq", "type", "run", "token", "node", "timestamp", "payload"
    )
    for ev in items:
        table.add_row(
            cell(ev.seq), cell(ev.type), cell(ev.run_id), cell(ev.token), cell(ev.node_id),
            time_cell(ev.timestamp), json_cell(ev.payload),
        )
    state.out.print(table)
    if next_after is not None:
        state.out.print(Text(f"more follow: --after {next_after}", style="dim"))


__all__ = [
    "FOLLOW_PAGE",
    "FOLLOW_STOP_GRACE_S",
    "FOLLOW_WAIT",
    "REGISTRY_SCAN_PAGES",
    "events",
    "follow_events",
    "history",
    "show",
    "threads",
]
