"""``threadloom sweep``: apply a retention policy to every thread of a store, page by page.

``--dry-run`` sweeps each page inside a transaction that is rolled back (``preview_sweep``) and prints what
would be pruned and reclaimed, page by page, changing nothing. ``--queue-age`` also purges finished run-queue
entries older than that. ``--max-events 0`` (every event of every thread) asks for confirmation unless ``--yes``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import attrs
import click
import structlog
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from threadloom.cli.output import DURATION, EXIT_INTERRUPTED, CliError, CliState, new_table, printable, state_of
from threadloom.domain import rules
from threadloom.domain.queue import EntryStatus, PurgePage
from threadloom.domain.values import RetentionPolicy, SweepPage, SweepPolicy
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.queue import RunQueue, queue_of

_log = structlog.get_logger("threadloom.cli")


@attrs.define
class SweepTotals:
    """What a whole sweep did: pages called, threads visited, pruned and reclaimed."""

    pages: int = 0
    visited: int = 0
    pruned: int = 0
    reclaimed: int = 0


def sweep_all(store: Checkpointer, policy: SweepPolicy) -> Iterator[SweepTotals]:
    """Runs ``store.sweep`` page after page from the start until the cursor ends; yields the totals after each.

    The sweep has no guard (the command does not know which runs a live runtime protects).
    """
    totals = SweepTotals()
    after: str | None = None
    while True:
        page = store.sweep(policy, None, after=after)
        totals.pages += 1
        totals.visited += len(page.visited)
        totals.pruned += len(page.pruned)
        totals.reclaimed += len(page.reclaimed)
        yield totals
        if page.next is None:
            return
        after = page.next


def preview_all(store: Checkpointer, policy: SweepPolicy) -> Iterator[SweepPage]:
    """``store.preview_sweep`` page after page from the start until the cursor ends: what a sweep would do."""
    after: str | None = None
    while True:
        page = store.preview_sweep(policy, after=after)  # type: ignore[attr-defined]
        yield page
        if page.next is None:
            return
        after = page.next


def purge_all(queue: RunQueue, older_than: timedelta, batch_size: int) -> Iterator[PurgePage]:
    """``queue.purge`` page after page from the first entry until the cursor ends."""
    after: int | None = None
    while True:
        page = queue.purge(older_than, limit=min(batch_size, rules.MAX_PAGE), after=after)
        yield page
        if page.next is None:
            return
        after = page.next


def purgeable(queue: RunQueue, older_than: timedelta, now: datetime) -> list[int]:
    """The finished entries that finished at least ``older_than`` before ``now`` (what a purge would delete)."""
    found: list[int] = []
    for status in (EntryStatus.COMPLETED, EntryStatus.FAILED):
        after = 0
        while True:
            page = queue.entries(limit=rules.MAX_PAGE, after=after, status=status)
            found.extend(e.entry_id for e in page if e.finished_at is not None and e.finished_at <= now - older_than)
            if len(page) < rules.MAX_PAGE:
                break
            after = page[-1].entry_id
    return sorted(found)


def _confirm_every_event(state: CliState, yes: bool) -> None:
    """``--max-events 0`` removes every event of every thread: asked on a terminal, refused elsewhere without --yes."""
    if yes:
        return
    question = "--max-events 0 removes every event of every thread; sweep anyway?"
    if sys.stdin.isatty() and not state.json_output:
        if click.confirm(question, default=False, err=True):
            return
        raise CliError("nothing swept: not confirmed", kind="NotConfirmed")
    raise CliError(
        "nothing swept: --max-events 0 removes every event of every thread; add --yes to confirm, or --dry-run "
        "to see what it would remove",
        kind="NotConfirmed",
    )


def _td_json(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@click.command()
@click.option(
    "--max-age", type=DURATION, default=None, help="Remove checkpoints and events at least this old (30s, 2h, 7d)."
)
@click.option("--max-checkpoints", type=click.IntRange(min=1), default=None, help="Keep at most this many per thread.")
@click.option(
    "--max-events", type=click.IntRange(min=0), default=None, help="Keep at most this many events per thread."
)
@click.option("--tombstone-age", type=DURATION, default=None, help="Reclaim delete tombstones older than this.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True, help="Threads per page.")
@click.option(
    "--queue-age", type=DURATION, default=None,
    help="Also delete finished run-queue entries that finished at least this long ago (7d).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be pruned and reclaimed, page by page; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (--max-events 0).")
@click.pass_context
def sweep(
    ctx: click.Context,
    max_age: timedelta | None,
    max_checkpoints: int | None,
    max_events: int | None,
    tombstone_age: timedelta | None,
    batch_size: int,
    queue_age: timedelta | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Apply a retention policy to every thread of the store, page by page.

    Each thread keeps its latest checkpoint and its pending writes whatever the policy. This sweep has no guard:
    it does not know which runs a live runtime protects (the runtime's own scheduled sweep does). Ages are
    judged by the store's clock. Without options it only visits.
    """
    state = state_of(ctx)
    policy = SweepPolicy(
        retention=RetentionPolicy(max_age=max_age, max_checkpoints=max_checkpoints, max_events=max_events),
        batch_size=batch_size,
        tombstone_age=tombstone_age,
    )
    if max_events == 0 and not dry_run:
        _confirm_every_event(state, yes)
    # On SQLite: the file must hold a store, and SQLite's quick_check must find it sound, before it is opened to
    # write (a damaged file is refused byte for byte as it was: the sweep reads too little to notice damage).
    store = state.store(quick_check=True)
    policy_json = {
        "max_age_s": _td_json(max_age),
        "max_checkpoints": max_checkpoints,
        "max_events": max_events,
        "tombstone_age_s": _td_json(tombstone_age),
        "batch_size": batch_size,
        "queue_age_s": _td_json(queue_age),
    }
    if dry_run:
        _dry_run(state, store, policy, queue_age, policy_json)
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("sweeping"),
        BarColumn(),
        TextColumn(
            "{task.fields[visited]} visited · {task.fields[pruned]} pruned · {task.fields[reclaimed]} reclaimed"
        ),
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
        disable=state.json_output or not state.err.is_terminal,
    )
    totals = SweepTotals()
    interrupted = False
    with progress:
        task = progress.add_task("sweep", total=None, visited=0, pruned=0, reclaimed=0)
        try:
            for totals in sweep_all(store, policy):
                progress.update(task, visited=totals.visited, pruned=totals.pruned, reclaimed=totals.reclaimed)
        except KeyboardInterrupt:
            interrupted = True
    purged = 0
    if queue_age is not None and not interrupted:
        try:
            for purge_page in purge_all(queue_of(store), queue_age, batch_size):
                purged += len(purge_page.purged)
        except KeyboardInterrupt:
            interrupted = True
    _log.info("sweep.finished", pages=totals.pages, visited=totals.visited, pruned=totals.pruned,
              reclaimed=totals.reclaimed, queue_purged=purged, interrupted=interrupted)
    if state.json_output:
        state.emit(
            {
                "policy": policy_json,
                "pages": totals.pages,
                "visited": totals.visited,
                "pruned": totals.pruned,
                "reclaimed": totals.reclaimed,
                "queue_purged": purged if queue_age is not None else None,
                "complete": not interrupted,
            }
        )
    else:
        table = new_table(
            "sweep" + (" (interrupted)" if interrupted else "") + ": counts of threads",
            "pages", "threads visited", "threads pruned", "tombstones reclaimed",
        )
        table.add_row(*(Text(str(n)) for n in (totals.pages, totals.visited, totals.pruned, totals.reclaimed)))
        state.out.print(table)
        if queue_age is not None:
            state.out.print(Text(f"{purged} finished run-queue entr{'y' if purged == 1 else 'ies'} purged"))
    if interrupted:
        ctx.exit(EXIT_INTERRUPTED)


def _dry_run(
    state: CliState, store: Checkpointer, policy: SweepPolicy, queue_age: timedelta | None, policy_json: dict
) -> None:
    """Prints, page by page, what the sweep would prune and reclaim (and the entries a purge would delete)."""
    if not callable(getattr(store, "preview_sweep", None)):
        raise CliError(f"{type(store).__name__} cannot preview a sweep; nothing changed", kind="ProcessingError")
    pages: list[SweepPage] = []
    for number, page in enumerate(preview_all(store, policy), start=1):
        pages.append(page)
        if not state.json_output:
            line = Text(f"page {number}: {len(page.visited)} visited", style="bold")
            line.append(f"; would prune {len(page.pruned)}: " + (", ".join(map(printable, page.pruned)) or "-"))
            line.append(f"; would reclaim {len(page.reclaimed)}: " + (", ".join(map(printable, page.reclaimed)) or "-"))
            state.out.print(line)
    entries = purgeable(queue_of(store), queue_age, datetime.now(UTC)) if queue_age is not None else None
    if state.json_output:
        state.emit(
            {
                "dry_run": True,
                "policy": policy_json,
                "pages": [
                    {"visited": list(p.visited), "pruned": list(p.pruned), "reclaimed": list(p.reclaimed)}
                    for p in pages
                ],
                "visited": sum(len(p.visited) for p in pages),
                "pruned": sum(len(p.pruned) for p in pages),
                "reclaimed": sum(len(p.reclaimed) for p in pages),
                "queue_purged": entries,
            }
        )
        return
    total = sum(len(p.pruned) for p in pages), sum(len(p.reclaimed) for p in pages)
    state.out.print(Text(f"dry run: {total[0]} thread(s) would be pruned, {total[1]} tombstone(s) reclaimed; "
                         "nothing was changed", style="dim"))
    if entries is not None:
        state.out.print(Text(f"{len(entries)} finished run-queue entr{'y' if len(entries) == 1 else 'ies'} would be "
                             f"purged (by this host's clock): {', '.join(map(str, entries)) or '-'}"))


__all__ = ["SweepTotals", "preview_all", "purge_all", "purgeable", "sweep", "sweep_all"]
