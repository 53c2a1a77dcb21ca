"""``threadloom backup`` and ``threadloom check``: copy a store consistently, and verify what it holds.

Both only read the store (it is opened read-only). README: "Backup, restore and check".
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import click
from rich.text import Text

from threadloom.cli.output import EXIT_FAILED, CliError, CliState, cell, new_table, state_of
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.check import CheckReport


def _sqlite(store: Checkpointer) -> Any:
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return store if isinstance(store, SqliteCheckpointer) else None


def _postgres_scheme(url: str) -> bool:
    return url.partition(":")[0].lower() in ("postgresql", "postgres")


def pg_dump_commands(url: str, dest: str) -> tuple[list[str], list[str]]:
    """The ``pg_dump`` command that backs up the store's schema into ``dest``, and the ``pg_restore`` command that
    restores it, as argument lists. The connection string holds no password (give it as ``PGPASSWORD`` or in
    ``~/.pgpass``).

    Raises:
        ValidationError: ``url`` is not a connection string libpq reads.
    """
    from psycopg.conninfo import make_conninfo

    from threadloom.persistence.postgres import conninfo
    from threadloom.persistence.postgres.config import PostgresCheckpointerConfig

    rest, schema = conninfo.take_schema(url)
    parts = {key: value for key, value in conninfo.parse(rest).items() if key not in ("password", "sslpassword")}
    target = make_conninfo(**parts)
    schema = schema or PostgresCheckpointerConfig().schema
    dump = ["pg_dump", f"--dbname={target}", f"--schema={schema}", "--format=custom", f"--file={dest}"]
    restore = ["pg_restore", f"--dbname={target}", "--exit-on-error", dest]
    return dump, restore


@click.command()
@click.argument("dest", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Replace DEST if it exists.")
@click.pass_context
def backup(ctx: click.Context, dest: str, force: bool) -> None:
    """Copy the store into the file DEST: one consistent snapshot, taken while writers go on.

    SQLite: SQLite's online backup API; DEST is complete or absent (written beside it, then renamed), one
    self-contained file holding every commit acknowledged before the backup began. An existing DEST is refused
    unless --force. PostgreSQL: threadloom does not dump a server; the command prints the pg_dump command that
    backs up the store's schema (and the pg_restore command) and exits with status 1, since nothing was copied.
    """
    state = state_of(ctx)
    if _postgres_scheme(state.store_url):
        _print_pg_dump(state, dest)
        ctx.exit(EXIT_FAILED)
    store = state.store(read_only=True)
    sqlite = _sqlite(store)
    if sqlite is None:
        raise CliError(f"backup copies SQLite stores; {state.safe_url!r} is not one", kind="CommandError")
    try:
        report = sqlite.backup(dest, overwrite=force)
    except OSError as error:  # the store was read; writing the copy failed (permissions, disk full)
        raise CliError(f"backup to {dest!r} failed, no copy was left: {error.strerror or error}") from None
    if state.json_output:
        state.emit({"backup": {"path": report.path, "size_bytes": report.size_bytes, "threads": report.threads}})
        return
    state.out.print(
        cell(f"backed up {state.safe_url} to {report.path}: {report.size_bytes} bytes, {report.threads} thread(s)")
    )


def _print_pg_dump(state: CliState, dest: str) -> None:
    dump, restore = pg_dump_commands(state.store_url, os.path.abspath(dest))
    if state.json_output:
        state.emit({"backup": None, "pg_dump": dump, "pg_restore": restore})
    else:
        state.out.print(Text("threadloom does not dump a PostgreSQL server; back the store's schema up with:"))
        state.out.print(cell("  " + shlex.join(dump)))
        state.out.print(Text("and restore it (into a database without that schema) with:"))
        state.out.print(cell("  " + shlex.join(restore)))
        state.out.print(Text("(give the password as PGPASSWORD or in ~/.pgpass)", style="dim"))
    state.err.print(Text("threadloom: nothing was copied: run the pg_dump command above", style="dim"))


@click.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Verify the store's integrity; exit status 1 and a table of problems when it is not sound.

    SQLite: PRAGMA integrity_check of the file, then threadloom's invariants; PostgreSQL: the invariants. The
    invariants: every row decodes, events are numbered without gaps, tokens never exceed the store's counter
    nor go backwards, the registry row names the newest checkpoint and counts right, pending writes point at the
    latest checkpoint, tombstones hold nothing, no row belongs to no thread. Reads one snapshot; writers go on.
    """
    state = state_of(ctx)
    store = state.store(read_only=True)
    run = getattr(store, "check", None)
    if run is None:
        raise CliError(f"check works on SQLite and PostgreSQL stores; {state.safe_url!r} is neither")
    report: CheckReport = run()
    if state.json_output:
        state.emit(
            {
                "ok": report.ok,
                "truncated": report.truncated,
                "counts": {
                    "threads": report.threads,
                    "checkpoints": report.checkpoints,
                    "events": report.events,
                    "pending_writes": report.pending_writes,
                    "effects": report.effects,
                },
                "problems": [
                    {"check": p.check, "thread_id": p.thread_id, "detail": p.detail} for p in report.problems
                ],
            }
        )
    else:
        counts = (
            f"{report.threads} thread(s), {report.checkpoints} checkpoint(s), {report.events} event(s), "
            f"{report.pending_writes} pending write(s), {report.effects} effect record(s)"
        )
        if report.ok:
            state.out.print(cell(f"sound: {counts} checked"))
        else:
            table = new_table(f"{len(report.problems)} problem(s) in {state.safe_url}", "check", "thread", "problem")
            for p in report.problems:
                table.add_row(cell(p.check), cell(p.thread_id), cell(p.detail))
            state.out.print(table)
            more = "; more were found than shown" if report.truncated else ""
            state.out.print(cell(f"{counts} checked{more}", style="dim"))
    if not report.ok:
        raise CliError(f"the store is not sound: {len(report.problems)} problem(s), listed above", kind="StoreDamaged")


__all__ = ["backup", "check", "pg_dump_commands"]
