"""``threadloom walks``: the access walks of a store, per graph kind (README "Access walks").

For each graph kind it prints the walk record kept in the store - schema hash, heads, cursor, count, completed -
the walk lease's live holder (its expiry judged by this machine's clock), and the live share: the share the
holder's pace allowed when it recorded its last page (known only while a live holder walks; ``-`` otherwise).
The graph kinds listed are those the live members of the walk group serve, plus each ``--graph`` given: a kind
whose every node stopped is listed only by ``--graph``. With ``--follow`` a progress bar per kind shows the
count against the kind's threads, until every listed walk is completed and no live member serves another schema
of its kind (``waiting``: a rolling release whose walk has not started yet), or Ctrl-C or SIGTERM (exit status 0
either way). A kind listed once stays followed when its members stop (a rolling restart); when no kind is listed
at the start, ``--follow`` prints what ``walks`` prints and ends at once. The store is only read (a SQLite file
is opened read-only).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from threadloom.actors.walker import DEFAULT_GROUP, SHARE_KEY
from threadloom.cli.output import CliError, CliState, FiniteFloatRange, json_text, new_table, printable, state_of
from threadloom.domain import validation as v
from threadloom.domain.errors import ProcessingError, ThreadloomError

COUNT_CAP = 100_000
"""``--follow`` counts a kind's threads after the cursor up to this many (the bar's total is then a floor)."""
COUNT_PAGE = 1000
"""Thread ids per read while counting."""


def walk_rows(store: Any, group: str, graphs: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per graph kind (sorted by graph id): the record, the live holder, the live share, the members,
    and ``waiting``: the schemas live members serve that are not the record's (their walk has not started: it
    starts once no live member serves the recorded schema, or, with no record, at the next claim).

    Raises:
        ProcessingError: the store failed, or a walk record does not decode (naming the walk).
    """
    from threadloom.domain.access import WalkRecord, member_group, walk_thread_id

    now = datetime.now(UTC)  # a lease is live until its expiry, judged here by this machine's clock
    members = store.members(member_group(group))
    serving: dict[str, list[str]] = {}
    for member in members:
        for served in member.serves:
            graph_id, _, schema = served.rpartition("@")
            if graph_id:
                serving.setdefault(graph_id, []).append(f"{member.member}@{schema}")
    rows = []
    for graph_id in sorted({*serving, *graphs}):
        thread = walk_thread_id(group, graph_id)
        latest = store.latest(thread)
        record = WalkRecord.from_state(thread, latest.checkpoint.state) if latest is not None else None
        claim = store.current_claim(thread)
        live = claim is not None and claim.expires_at > now
        share: float | None = None
        if live and latest is not None:
            share = _share(latest.checkpoint.metadata.get(SHARE_KEY))
        record_schema = record.schema if record else None
        waiting = sorted({served.rpartition("@")[2] for served in serving.get(graph_id, [])} - {record_schema})
        rows.append(
            {
                "graph_id": graph_id,
                "walk": thread,
                "schema": record.schema if record else None,
                "heads": record.heads if record else None,
                "cursor": record.cursor if record else None,
                "count": record.count if record else 0,
                "completed": record.completed if record else False,
                "holder": claim.holder if live and claim is not None else None,
                "share": share,
                "members": sorted(serving.get(graph_id, [])),
                "waiting": waiting,
            }
        )
    return rows


def _share(text: Any) -> float | None:
    """The share a walk record's metadata holds: a number in (0, 1], else None (a damaged or foreign record's
    text is never printed as a share, nor as a NaN or infinity that strict JSON readers refuse)."""
    try:
        share = float(text)
    except (TypeError, ValueError):
        return None
    return share if 0 < share <= 1 else None


def remaining(store: Any, graph_id: str, cursor: str | None, cap: int = COUNT_CAP) -> int:
    """How many of the kind's threads come after ``cursor`` (counted up to ``cap``)."""
    count, after = 0, cursor
    while count < cap:
        page = store.graph_threads(graph_id, after=after, limit=COUNT_PAGE)
        count += len(page)
        if len(page) < COUNT_PAGE:
            break
        after = page[-1]
    return count


def _table(rows: list[dict[str, Any]], group: str) -> Table:
    table = new_table(
        f"access walks of group {printable(group)}",
        "graph",
        "schema",
        "heads",
        "cursor",
        "count",
        "completed",
        "holder",
        "share",
        "members",
        "waiting",
    )
    for row in rows:
        table.add_row(
            printable(row["graph_id"]),
            printable(row["schema"] or "-"),
            "-" if row["heads"] is None else str(row["heads"]),
            printable(row["cursor"] or "-"),
            str(row["count"]),
            "yes" if row["completed"] else ("no" if row["schema"] else "-"),
            printable(row["holder"] or "-"),
            "-" if row["share"] is None else f"{row['share']:.3f}",
            printable(", ".join(row["members"]) or "-"),
            printable(", ".join(row["waiting"]) or "-"),
        )
    return table


NO_WALKS = "no walks: no live member serves a schema in this group; name a kind with --graph"
"""What ``walks`` prints when it lists no kind (``--follow`` too: then nothing is left to wait for)."""


def _settled(rows: list[dict[str, Any]]) -> bool:
    """True when every row's walk is completed and no other schema's walk waits (``--follow`` ends): also when
    no kind is listed (nothing walks, nothing waits)."""
    return all(row["completed"] and not row["waiting"] for row in rows)


def _follow(state: CliState, store: Any, group: str, graphs: tuple[str, ...], every: float) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    # A kind once listed stays listed (as if named by --graph): a walk whose every member stopped mid-walk (a
    # rolling restart) is followed until it completes, not dropped as "no walks".
    followed = set(graphs)
    if state.json_output:
        while True:
            rows = walk_rows(store, group, tuple(sorted(followed)))
            click.echo(_json_line({"group": group, "walks": rows}))
            if _settled(rows):
                return
            followed.update(row["graph_id"] for row in rows)
            time.sleep(every)
    rows = walk_rows(store, group, graphs)
    if not rows:
        state.out.print(NO_WALKS)
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        console=state.out,
    )
    tasks: dict[str, Any] = {}
    totals: dict[str, tuple[str | None, int]] = {}  # graph id -> (schema, threads) counted once per walk
    with progress:
        while True:
            for row in rows:
                graph_id, count = row["graph_id"], row["count"]
                known = totals.get(graph_id)
                if known is None or known[0] != row["schema"] or known[1] < count:
                    total = count if row["completed"] else count + remaining(store, graph_id, row["cursor"])
                    totals[graph_id] = (row["schema"], total)
                total = max(totals[graph_id][1], 1)
                share = "-" if row["share"] is None else f"{row['share']:.3f}"
                waits = f" waiting {','.join(row['waiting'])}" if row["waiting"] else ""
                detail = printable(f"schema {row['schema'] or '-'} holder {row['holder'] or '-'} share {share}{waits}")
                if graph_id not in tasks:
                    tasks[graph_id] = progress.add_task(printable(graph_id), total=total, detail=detail)
                done = total if row["completed"] else min(count, total)
                progress.update(tasks[graph_id], completed=done, total=total, detail=detail)
            if _settled(rows):
                return
            followed.update(row["graph_id"] for row in rows)
            time.sleep(every)
            rows = walk_rows(store, group, tuple(sorted(followed)))


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While in the block, SIGTERM (a service manager's stop, ``kill``) raises ``KeyboardInterrupt`` as Ctrl-C
    does, on the main thread only; the previous handler is put back after."""
    sigterm = getattr(signal, "SIGTERM", None)
    if sigterm is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(sigterm, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(sigterm, previous if previous is not None else signal.SIG_DFL)


def _json_line(document: Any) -> str:
    return json_text(document, compact=True)


@click.command()
@click.option("--group", default=DEFAULT_GROUP, show_default=True, metavar="GROUP", help="The walk group.")
@click.option(
    "--graph",
    "graphs",
    multiple=True,
    metavar="GRAPH",
    help="Also list this graph kind (repeatable): one no live member serves.",
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Show a progress bar per kind until every walk completed and none waits (at once when none is listed), "
    "or Ctrl-C / SIGTERM.",
)
@click.option(
    "--every",
    type=FiniteFloatRange(0.05, 3600),
    default=1.0,
    show_default=True,
    help="With --follow: seconds between reads.",
)
@click.pass_context
def walks(ctx: click.Context, group: str, graphs: tuple[str, ...], follow: bool, every: float) -> None:
    """List the access walks per graph kind: schema hash, heads, cursor, count, completed, holder, live share.

    Kinds listed: those the group's live members serve, and each --graph. The live share is the share the
    holder's pace allowed when it recorded its last page (shown only while a live holder walks). With --follow,
    a progress bar per kind (count against the kind's threads) until every listed walk completed and no live
    member serves another schema of its kind (the 'waiting' column), or Ctrl-C / SIGTERM (exit status 0); it
    ends at once when no kind is listed. With --json and --follow, one JSON object per line. Reads only.
    """
    from threadloom.domain.access import member_group

    state = state_of(ctx)
    try:
        member_group(group)
        for graph_id in graphs:
            v.check_id("graph", graph_id)
    except ThreadloomError as error:
        raise CliError(str(error), 2, kind=type(error).__name__) from error
    store = state.store(read_only=True)
    try:
        if follow:
            try:
                with _sigterm_interrupts():
                    _follow(state, store, group, graphs, every)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the normal end of following (exit status 0)
                return
            return
        rows = walk_rows(store, group, graphs)
    except ProcessingError as error:
        raise CliError(str(error), kind=type(error).__name__) from error
    if state.json_output:
        state.emit({"group": group, "walks": rows})
        return
    if not rows:
        state.out.print(NO_WALKS)
        return
    state.out.print(_table(rows, group))
