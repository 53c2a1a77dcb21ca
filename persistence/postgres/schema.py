"""The store's schema: numbered migrations (``migrations/NNNN_name.sql``) and the step that applies them.

A migration is the file ``migrations/<version, 4 digits>_<name>.sql``, read with :mod:`importlib.resources`. Its
SQL names the schema ``{s}`` and the notification channel ``{channel}`` (filled in quoted by
:meth:`~threadloom.persistence.postgres.calls.Database.render`; literal braces doubled). Functions are defined
once each, in their current form, in ``migrations/functions/*.sql`` (``CREATE OR REPLACE``); a migration that
creates or changes a function includes its file with a line ``\\ir functions/<file>.sql`` (psql's
include-relative), after dropping a form whose parameters changed. So no migration repeats another's text.

:func:`migrate` applies, in one transaction under a transaction-level advisory lock on the schema, every
version the schema's ``schema_version`` table does not record yet, and records each. Several processes opening
one schema at once migrate it once. A schema at a version newer than this code knows is refused.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import timedelta
from importlib import resources
from typing import Any

import attrs

from threadloom.domain.errors import ProcessingError, StoreCorrupt, ThreadloomError
from threadloom.persistence.logs import get_logger
from threadloom.persistence.postgres import sql as q
from threadloom.persistence.postgres.calls import Database

log = get_logger("threadloom.persistence.postgres.schema")

MIGRATE_TRIES = 3
"""How many times :func:`migrate` tries its transaction when a lock wait outlasts the call bound (each try rolls
back whole; a ``store.migrate_retry`` warning names the try that failed)."""

MIGRATE_STATEMENT_TIMEOUT = timedelta(minutes=15)
"""How long one statement of a migration may run (an index built over a large store's rows), if longer than the
call bound: a statement that outlasts it fails the open (``StoreUnavailable``, nothing applied)."""

_FILE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")
_INCLUDE = re.compile(r"^\\ir\s+(functions/[a-z0-9_]+\.sql)\s*$", re.MULTILINE)


@attrs.frozen
class Migration:
    """One numbered migration: its version, file name, and its SQL with the included function files."""

    version: int
    name: str
    text: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("migrations", *name.split("/")).read_text(encoding="utf-8")


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration, in version order (read once, on first use).

    Raises:
        ProcessingError: the migration files are not numbered 1, 2, 3… without a gap (a broken installation).
    """
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.fullmatch(entry.name)
        if match is not None:
            text = _INCLUDE.sub(lambda m: _read(m.group(1)), _read(entry.name))
            found.append(Migration(int(match.group(1)), entry.name, text))
    found.sort(key=lambda migration: migration.version)
    if [migration.version for migration in found] != list(range(1, len(found) + 1)):
        raise ProcessingError("open", f"the store's migrations are not numbered 1 to {len(found)}: {found}")
    return tuple(found)


def migrate(db: Database, target: str) -> None:
    """Creates the schema of ``db`` or applies the migrations it lacks (see the module docstring).

    Args:
        db: the store's calls (its schema, bound and pool).
        target: where the database is (``user@host:port/dbname``), named in errors.

    Raises:
        ProcessingError: the schema holds no store and ``config.create`` is False (nothing was created).
        StoreCorrupt: the schema is at a version newer than this code.
        StoreUnavailable: the database failed, each of :data:`MIGRATE_TRIES` tries waited longer than the call
            bound for a lock, or a statement ran longer than :data:`MIGRATE_STATEMENT_TIMEOUT` (nothing was applied:
            a retry is safe).
    """
    from psycopg import errors

    config = db.config
    steps = migrations()
    latest = steps[-1].version
    conn, restore = db.checkout("open", None)
    # Reading the version: the call bounds of the tries. Once a migration is due, each try may also wait one call
    # bound for its locks, and a statement may run MIGRATE_STATEMENT_TIMEOUT: the watch is widened then.
    statement_ms = max(config.call_timeout_ms, int(MIGRATE_STATEMENT_TIMEOUT.total_seconds() * 1000))
    watch = db.watchdog.enter(conn, time.monotonic() + (MIGRATE_TRIES + 1) * config.deadline_s)
    widened = False
    failed = True
    try:
        for attempt in range(MIGRATE_TRIES):
            try:
                cur = db.cursor(conn)
                try:
                    cur.execute(db.render(q.VERSION))
                    row = cur.fetchone()
                    if row is not None and row[0] >= latest:
                        _check_version(config.schema, row[0], latest)
                        failed = False
                        return
                    if not config.create:  # a reader never migrates
                        raise ProcessingError(
                            "open",
                            f"schema {config.schema!r} at {target} holds a threadloom store of version {row[0]}, "
                            f"older than this threadloom's {latest}, and nothing was migrated (this open may not "
                            "create or migrate); open it once with a command that writes to migrate it",
                        )
                except (errors.UndefinedTable, errors.InvalidSchemaName):
                    if not config.create:
                        raise ProcessingError(
                            "open",
                            f"schema {config.schema!r} at {target} is not a threadloom store (nothing was "
                            "created); check the schema, or create it (the CLI's 'serve', 'queue enqueue' or "
                            "'demo', or open_store from Python)",
                        ) from None
                ms = config.call_timeout_ms
                if not widened and db.watchdog.leave(watch) is None:
                    deadline = time.monotonic() + (MIGRATE_TRIES + 1) * config.deadline_s + statement_ms / 1000
                    watch, widened = db.watchdog.enter(conn, deadline), True
                with conn.transaction():
                    cur.execute(f"SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {statement_ms}")
                    cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (q.SCHEMA_LOCK_CLASS, config.schema))
                    cur.execute(db.render(q.BOOTSTRAP))
                    cur.execute(db.render(q.VERSION))
                    current = cur.fetchone()[0]
                    _check_version(config.schema, current, latest)
                    for step in steps:
                        if step.version > current:
                            cur.execute(db.render(step.text))
                            cur.execute(db.render(q.RECORD_VERSION), (step.version,))
                if current < latest:
                    log.info("store.migrated", op="open", schema=config.schema, version=latest)
                failed = False
                return
            except (errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable):
                # CREATE SCHEMA/TABLE IF NOT EXISTS raced a creator that does not take our lock: try again.
                if attempt == MIGRATE_TRIES - 1:
                    raise
            except errors.LockNotAvailable as error:
                # A lock wait longer than the call bound: the transaction rolled back (nothing applied). Waiting a
                # bounded time per try keeps live traffic from queueing behind the migration's locks.
                if attempt == MIGRATE_TRIES - 1 or conn.closed or conn.broken:
                    raise
                log.warning(
                    "store.migrate_retry", op="open", schema=config.schema, attempt=attempt + 1,
                    error=f"{type(error).__name__}: {error}".strip(),
                )
    except ThreadloomError:
        raise
    except Exception as error:
        aborted = db.watchdog.leave(watch)  # DDL under an advisory lock, idempotent: never OutcomeUnknown
        broken = bool(conn.closed or conn.broken)
        raise db.error(error, "open", None, write=False, aborted=aborted, broken=broken) from None
    finally:
        # A try that failed rolled back whole and left the connection idle: it goes back to the pool as it is. One
        # the watchdog aborted, or left broken or mid-transaction, is closed; a pool handed a closed connection
        # logs a warning ("discarding closed connection") that repeats the open's own error, so a failed open
        # closes its own pool first (the store closes it next anyway) and the connection closes with it, quietly.
        discard = db.watchdog.leave(watch) is not None or not _idle(conn)
        if failed and db.owns_pool:
            db.pool.close(timeout=config.connect_timeout.total_seconds())
        db.give_back(conn, discard=discard, restore=restore)


def _idle(conn: Any) -> bool:
    """Whether ``conn`` is open, not broken, and outside any transaction."""
    from psycopg.pq import TransactionStatus

    return not (conn.closed or conn.broken) and conn.info.transaction_status == TransactionStatus.IDLE


def _check_version(schema: str, current: int, latest: int) -> None:
    if current > latest:
        raise StoreCorrupt(
            "open",
            f"schema {schema!r} is at version {current}, newer than this threadloom knows ({latest}); "
            "upgrade threadloom",
        )


__all__ = ["Migration", "migrate", "migrations"]
