"""Backing up and checking a SQLite store (README "Backup, restore and check").

:func:`backup` copies the store with SQLite's online backup API in one step: the copy is one consistent snapshot
(the last commit before it began, everything in the ``-wal`` file included), taken while writers go on (in WAL
mode a reader never blocks a writer), and written to a temporary file beside ``dest`` that is renamed into place
only once complete and synced. The copy is one self-contained file (rollback journal): open it as a store, or
inspect it read-only, as it is.

:func:`check` reads one snapshot of the store and reports broken invariants
(:mod:`threadloom.persistence.check`), with SQLite's ``PRAGMA integrity_check`` of the file first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import stat
import tempfile

import attrs

from threadloom.domain.errors import StoreCorrupt, ValidationError
from threadloom.persistence.check import CheckReport, Collector, ThreadRows, audit_thread, orphans
from threadloom.persistence.sqlite.connection import Database

COMPANIONS = ("", "-wal", "-shm", "-journal")
"""Suffixes of the store's file and of the files SQLite keeps beside it; a backup never writes any of them."""

INTEGRITY_MESSAGES = 100
"""At most this many messages of ``PRAGMA integrity_check`` are reported."""

_THREADS = (
    "SELECT thread_id, first_seq, next_seq, floor, claim_holder, claim_token, claim_expires, deleted_at, latest_id,"
    " latest_position, n_checkpoints, n_pending, metadata, latest_status, latest_run_id FROM threads ORDER BY thread_id"
)
_CHECKPOINTS = "SELECT position, id, body FROM checkpoints WHERE thread_id = ? ORDER BY position"
_PENDING = "SELECT idx, body FROM pending WHERE thread_id = ? ORDER BY idx"
_EVENTS = "SELECT seq, body FROM events WHERE thread_id = ? ORDER BY seq"
_EFFECTS = "SELECT key, body FROM effects WHERE thread_id = ? ORDER BY key"
_ORPHANS = " UNION ALL ".join(
    f"SELECT '{kind}', thread_id FROM (SELECT DISTINCT thread_id FROM {table})"
    " WHERE thread_id NOT IN (SELECT thread_id FROM threads)"
    for kind, table in (("checkpoints", "checkpoints"), ("pending writes", "pending"), ("events", "events"),
                        ("effect records", "effects"))
)


@attrs.frozen
class BackupReport:
    """A finished backup.

    Attributes:
        path: the absolute path of the copy.
        size_bytes: its size.
        threads: thread rows it holds (tombstones included).
    """

    path: str
    size_bytes: int
    threads: int


def integrity(db: Database, *, quick: bool = False) -> list[str]:
    """SQLite's own check of the file: ``[]`` when sound, else its messages (at most :data:`INTEGRITY_MESSAGES`).

    ``quick`` runs ``PRAGMA quick_check`` (no index-to-table cross check: faster, finds less).

    Raises:
        ProcessingError: the file cannot be read at all (mapped: ``StoreCorrupt``, ``StoreUnavailable``, ...).
    """
    pragma = "quick_check" if quick else "integrity_check"
    rows = db.fetch_all("check", None, f"PRAGMA {pragma}({INTEGRITY_MESSAGES})", ())
    messages = [line for row in rows for line in str(row[0]).splitlines() if line.strip()]
    return [] if messages == ["ok"] else messages


def check(db: Database) -> CheckReport:
    """The store's integrity: ``PRAGMA integrity_check`` and threadloom's invariants, on one snapshot.

    Rows the engine cannot read end the row checks with an ``integrity`` problem, reported with what was found.

    Raises:
        ProcessingError: the file cannot be opened or read at all.
    """
    found = Collector()
    try:
        for message in integrity(db):
            found.add("integrity", None, message)
    except StoreCorrupt as error:  # so damaged that SQLite's own check stopped: what the rows say still counts
        found.add("integrity", None, error.message)
    db.read("check", None, _check_rows, found, snapshot=False)  # its own snapshot: it ends it even on damage
    return found.report()


def _check_rows(conn: sqlite3.Connection, found: Collector) -> None:
    conn.execute("BEGIN")
    try:
        last_token = conn.execute("SELECT last_token FROM store WHERE id = 1").fetchone()
        if last_token is None:
            found.add("tokens", None, "the store's token counter row is missing")
        counter = last_token[0] if last_token is not None else 0
        for row in conn.execute(_THREADS):
            audit_thread(_thread_rows(conn, row), counter, found)
        orphans(found, iter(conn.execute(_ORPHANS)))
    except sqlite3.DatabaseError as error:
        found.add("integrity", None, f"reading the rows failed, the check stopped there: {error}")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")  # it only read


def _thread_rows(conn: sqlite3.Connection, row: tuple[object, ...]) -> ThreadRows:
    (tid, first_seq, next_seq, floor, holder, token, expires, deleted_at, latest_id, latest_position, n_checkpoints,
     n_pending, metadata, latest_status, latest_run_id) = row
    assert isinstance(tid, str)
    return ThreadRows(
        thread_id=tid, first_seq=first_seq, next_seq=next_seq, floor=floor,  # type: ignore[arg-type]
        claim_holder=holder, claim_token=token, claim_expires=expires,  # type: ignore[arg-type]
        deleted=deleted_at is not None, latest_id=latest_id, latest_position=latest_position,  # type: ignore[arg-type]
        n_checkpoints=n_checkpoints, n_pending=n_pending, metadata=metadata,  # type: ignore[arg-type]
        latest_status=latest_status, latest_run_id=latest_run_id,
        checkpoints=conn.execute(_CHECKPOINTS, (tid,)),
        pending=conn.execute(_PENDING, (tid,)),
        events=conn.execute(_EVENTS, (tid,)),
        effects=conn.execute(_EFFECTS, (tid,)),
    )


def backup(db: Database, dest: str | os.PathLike[str], *, overwrite: bool = False) -> BackupReport:
    """Copies the store into the file ``dest`` (see the module): one consistent snapshot, writers never blocked.

    The copy gets the permission bits of the store's file (owned by the user who runs the backup).

    Args:
        db: the store's database (read-only or not).
        dest: the file to write; its directory must exist.
        overwrite: replace an existing ``dest``. False (default): an existing ``dest`` is refused.

    Returns:
        The report of the copy.

    Raises:
        ValidationError: (field ``dest``) ``dest`` exists and ``overwrite`` is False, exists and is not a regular
            file (a directory, a FIFO, a device: refused even with ``overwrite``), is a symbolic link to nothing, is
            the store's own file or one of its ``-wal``, ``-shm``, ``-journal`` files (symbolic links resolved), or
            its directory does not exist; nothing was written.
        ProcessingError: reading the store failed (mapped); the partial copy was removed. Safe to retry.
        OSError: writing the copy failed (disk full, permissions: "cannot write DEST's directory ..." when not even
            the temporary file could be made); the partial copy was removed.
    """
    target = os.path.abspath(os.fspath(dest))
    _check_dest(db.path, target, overwrite)
    directory = os.path.dirname(target)
    try:
        fd, partial = tempfile.mkstemp(dir=directory, prefix=os.path.basename(target) + ".", suffix=".part")
    except OSError as error:
        raise OSError(
            error.errno, f"cannot write DEST's directory {directory!r} ({error.strerror}); nothing was written"
        ) from None
    os.close(fd)
    try:
        copy = sqlite3.connect(partial, isolation_level=None)
        try:
            db.read("backup", None, _copy_into, copy, snapshot=False)
            copy.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            threads = copy.execute("SELECT count(*) FROM threads").fetchone()[0]
        finally:
            copy.close()
        # The copy gets the store file's permission bits (the temporary file was made 0600); synced with them,
        # through a read-only descriptor (the bits may not let the owner write).
        os.chmod(partial, stat.S_IMODE(os.stat(db.path).st_mode))
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(partial, target)
        else:
            try:
                os.link(partial, target)  # never replaces a file that appeared meanwhile
            except FileExistsError:
                raise ValidationError(
                    "dest", (f"{target!r} appeared while the copy was made; nothing was replaced",)
                ) from None
            os.unlink(partial)
        _sync_directory(os.path.dirname(target))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return BackupReport(path=target, size_bytes=os.path.getsize(target), threads=threads)


def _check_dest(store: str, target: str, overwrite: bool) -> None:
    """Refuses a ``dest`` that is the store's file or one of its companions, or that exists and is not a regular
    file (``overwrite`` replaces only a regular file), or whose directory does not exist."""
    resolved = os.path.realpath(target)
    for base, suffix in itertools.product((store, os.path.realpath(store)), COMPANIONS):
        own = base + suffix
        if resolved == os.path.realpath(own) or _same_file(target, own):
            what = "the store's own file" if not suffix else f"the store's {suffix} file (part of the store)"
            raise ValidationError("dest", (f"{target!r} is {what}; name another file",))
    if os.path.isdir(target):
        raise ValidationError("dest", (f"{target!r} is a directory; give the path of the file to write",))
    if not os.path.isdir(os.path.dirname(target)):
        raise ValidationError("dest", (f"the directory of {target!r} does not exist",))
    if os.path.islink(target) and not os.path.exists(target):
        raise ValidationError(
            "dest", (f"{target!r} is a dangling symbolic link (to {os.readlink(target)!r}); remove it or name "
                     "another file",)
        )
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValidationError(
            "dest", (f"{target!r} exists and is not a regular file; only a regular file is replaced, even with "
                     "overwrite (--force)",)
        )
    if not overwrite:
        raise ValidationError(
            "dest", (f"{target!r} exists; choose another file, or overwrite it (overwrite=True, or --force)",)
        )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (or cannot be looked at): not the same file
        return False


def _copy_into(conn: sqlite3.Connection, copy: sqlite3.Connection) -> None:
    conn.backup(copy)  # pages=-1: every page in one step, one read snapshot of the source


def _sync_directory(path: str) -> None:
    with contextlib.suppress(OSError):  # not every platform or filesystem lets a directory be synced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["INTEGRITY_MESSAGES", "BackupReport", "backup", "check", "integrity"]
