"""The one place a ``sqlite3`` error becomes a threadloom error (one mapping function per store).

Errors are classified by SQLite's result code (``sqlite3.Error.sqlite_errorcode``,
https://sqlite.org/rescode.html), never by message text:

============================================  =======================  =========
condition                                     error                    retryable
============================================  =======================  =========
the ``COMMIT`` failed, SQLite says unapplied  ``StoreUnavailable``     yes
the ``COMMIT`` statement itself failed        ``OutcomeUnknown``       yes (fenced)
the store was closed while the call ran       ``StoreClosed``          no
busy or locked past ``busy_timeout``          ``StoreUnavailable``     yes
a read-only file                              ``StoreUnavailable``     yes
a directory that cannot be written            ``StoreUnavailable``     yes
disk full, disk I/O error (rolled back)       ``StoreUnavailable``     yes
the file cannot be opened or created          ``StoreUnavailable``     yes
not a database, a damaged file                ``StoreCorrupt``         no
anything else (interrupted, a constraint...)  ``ProcessingError``      no
============================================  =======================  =========

Every write runs in one transaction that ends with ``COMMIT``; a failure before it rolled the whole transaction
back, so only a failure of the ``COMMIT`` itself can leave the outcome unknown - and not every one: when the
transaction is still open after the failed ``COMMIT`` (``SQLITE_BUSY``: the rollback that follows discards it), or
the failure is ``SQLITE_FULL`` (the log frames could not be written, so no commit record is on disk), the write
did not apply (:func:`not_applied`). An I/O error while syncing may come after the commit record was written,
so it stays ``OutcomeUnknown``. Each message names the file and the thread (or "the store") and says what to do;
for a directory that cannot be written, that a read-only open reads the store there.
"""

from __future__ import annotations

import sqlite3

from threadloom.domain.errors import (
    OutcomeUnknown,
    ProcessingError,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
)

# SQLite primary result codes, read from ``sqlite3.Error.sqlite_errorcode`` (its low byte).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_INTERRUPT = 9
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26
SQLITE_READONLY_DIRECTORY = SQLITE_READONLY | (6 << 8)
"""The extended code of a file whose directory cannot be written (SQLite cannot make its -wal and -shm there)."""

_BUSY_ADVICE = "retry later, or open the store with a longer busy_timeout"

# Each known primary code: the error's kind, what happened (``{file}``, ``{where}``, ``{busy_s}``, ``{error}``
# filled in) and what to do.
_KNOWN: dict[int, tuple[type[ProcessingError], str, str]] = {
    SQLITE_BUSY: (
        StoreUnavailable,
        "another writer held the SQLite file {file} for longer than the busy timeout ({busy_s:g} s) while working "
        "on {where}",
        _BUSY_ADVICE,
    ),
    SQLITE_NOTADB: (StoreCorrupt, "{file} is not a SQLite database (while working on {where})", "give a store file"),
    SQLITE_CORRUPT: (
        StoreCorrupt, "the SQLite file {file} is damaged (while working on {where})", "restore it from a backup"
    ),
    SQLITE_CANTOPEN: (
        StoreUnavailable,
        "cannot open or create the SQLite file {file} (while working on {where})",
        "check that its directory exists and is writable",
    ),
    SQLITE_READONLY: (
        StoreUnavailable,
        "the SQLite file {file} or its directory is read-only (while working on {where})",
        "make it writable and retry",
    ),
    SQLITE_FULL: (
        StoreUnavailable, "the disk holding {file} is full (while working on {where})", "free space and retry"
    ),
    SQLITE_IOERR: (
        StoreUnavailable, "disk I/O error on {file} while working on {where} ({error})", "check the disk and retry"
    ),
    SQLITE_INTERRUPT: (ProcessingError, "the SQLite call was interrupted while working on {where}", "retry"),
}
_KNOWN[SQLITE_LOCKED] = _KNOWN[SQLITE_BUSY]
_UNKNOWN = (
    ProcessingError,
    "SQLite failed while working on {where} ({kind}: {error})",
    "retry; if it persists, check the file",
)


def primary_code(error: BaseException) -> int | None:
    """The primary SQLite result code of ``error``, or None when it carries none (not a database error)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_busy(error: BaseException) -> bool:
    """Whether ``error`` is SQLite's ``SQLITE_BUSY`` or ``SQLITE_LOCKED``: another connection holds the file."""
    return primary_code(error) in (SQLITE_BUSY, SQLITE_LOCKED)


def not_applied(conn: sqlite3.Connection, error: BaseException) -> bool:
    """Whether a failed ``COMMIT`` on ``conn`` certainly did not apply (see the module docstring).

    Call it right after the failure, before rolling back: the transaction still open (SQLite kept it, as for a
    busy file, and the caller's rollback will discard it), or ``SQLITE_FULL`` (SQLite rolled back a commit whose
    log frames it could not write).
    """
    try:
        still_open = conn.in_transaction
    except sqlite3.Error:  # a closed or broken connection: nothing known
        return False
    return still_open or primary_code(error) == SQLITE_FULL


def _where(thread_id: str | None) -> str:
    return f"thread {thread_id!r}" if thread_id is not None else "the store"


def map_error(
    error: BaseException,
    *,
    operation: str,
    thread_id: str | None,
    path: str,
    busy_s: float,
    closed: bool,
    committing: bool = False,
) -> ProcessingError:
    """The threadloom error of a ``sqlite3`` error met by ``operation`` (see the module's table).

    Args:
        error: what the driver raised.
        operation: the store or queue method, e.g. ``"commit"``.
        thread_id: the thread the call was about, or None.
        path: the database file.
        busy_s: the store's busy timeout, in seconds (named in the message of a busy file).
        closed: whether the store is closed (a driver error on a closed store is ``StoreClosed``).
        committing: the error came from the ``COMMIT`` statement: the write may or may not have applied.

    Returns:
        The error to raise; the caller chains ``error`` as its cause (or suppresses it on open).
    """
    where = _where(thread_id)
    primary = primary_code(error)
    kind: type[ProcessingError]
    if closed and (isinstance(error, sqlite3.ProgrammingError) or primary is None):
        kind, problem, advice = StoreClosed, "the store was closed while working on {where}", "open a new one"
    elif getattr(error, "sqlite_errorcode", None) == SQLITE_READONLY_DIRECTORY:
        kind, problem, advice = (
            StoreUnavailable,
            "the directory of the SQLite file {file} cannot be written, and SQLite keeps its -wal and -shm files "
            "there (while working on {where})",
            "a store that writes needs write access to its directory; to only read it, open it read-only "
            "(read_only=True; the commands that only read do)",
        )
    else:
        kind, problem, advice = _KNOWN.get(primary, _UNKNOWN) if primary is not None else _UNKNOWN
    problem = problem.format(file=repr(path), where=where, busy_s=busy_s, error=error, kind=type(error).__name__)
    if committing:
        return OutcomeUnknown(operation, f"{problem}, while its COMMIT was in flight")
    if kind is StoreUnavailable:
        advice = f"nothing was written; {advice}"
    return kind(operation, f"{problem}; {advice}")


def lock_timeout(operation: str, thread_id: str | None, path: str, busy_s: float) -> StoreUnavailable:
    """The error of a write that waited ``busy_s`` seconds for the other writers of this process to hand over the
    file (the in-process lock every store over one file shares): nothing was written, retryable."""
    return StoreUnavailable(
        operation,
        f"other writers in this process held the SQLite file {path!r} for longer than the busy timeout "
        f"({busy_s:g} s) while working on {_where(thread_id)}; nothing was written; {_BUSY_ADVICE}",
    )


__all__ = ["is_busy", "lock_timeout", "map_error", "not_applied", "primary_code"]
