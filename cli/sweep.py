"""``threadloom sweep``: apply a retention policy to every thread of a store, page by page."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import attrs
import click
import structlog
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from threadloom.cli.output import DURATION, EXIT_INTERRUPTED, CliError, CliState, new_table, state_of
from threadloom.domain.values import RetentionPolicy, SweepPolicy
from threadloom.persistence.base import Checkpointer

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


def _refuse_a_damaged_file(state: CliState, store: Checkpointer) -> None:
    """Before a SQLite store is swept, SQLite's ``quick_check`` of the file: a damaged file is refused (exit 1),
    nothing swept, since the sweep alone reads too little of the file to notice and writing could spread damage."""
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    if not isinstance(store, SqliteCheckpointer):
        return
    problems = store.integrity_check(quick=True)
    if problems:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise CliError(
            f"the SQLite file of {state.safe_url!r} is damaged ({shown}); nothing was swept; run 'threadloom check' "
            "and restore a backup",
            kind="StoreCorrupt",
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
@click.pass_context
def sweep(
    ctx: click.Context,
    max_age: timedelta | None,
    max_checkpoints: int | None,
    max_events: int | None,
    tombstone_age: timedelta | None,
    batch_size: int,
) -> None:
    """Apply a retention policy to every thread of the store, page by page.

    Each thread keeps its latest checkpoint and its pending writes whatever the policy. This sweep has no guard:
    it does not know which runs a live runtime protects (the runtime's own scheduled sweep does). Ages are
    judged by the store's clock. Without options it only visits.
    """
    state = state_of(ctx)
    store = state.store()
    _refuse_a_damaged_file(state, store)
    policy = SweepPolicy(
        retention=RetentionPolicy(max_age=max_age, max_checkpoints=max_checkpoints, max_events=max_events),
        batch_size=batch_size,
        tombstone_age=tombstone_age,
    )
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
    _log.info("sweep.finished", pages=totals.pages, visited=totals.visited, pruned=totals.pruned,
              reclaimed=totals.reclaimed, interrupted=interrupted)
    if state.json_output:
        state.emit(
            {
                "policy": {
                    "max_age_s": _td_json(max_age),
                    "max_checkpoints": max_checkpoints,
                    "max_events": max_events,
                    "tombstone_age_s": _td_json(tombstone_age),
                    "batch_size": batch_size,
                },
                "pages": totals.pages,
                "visited": totals.visited,
                "pruned": totals.pruned,
                "reclaimed": totals.reclaimed,
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
    if interrupted:
        ctx.exit(EXIT_INTERRUPTED)


__all__ = ["SweepTotals", "sweep", "sweep_all"]
