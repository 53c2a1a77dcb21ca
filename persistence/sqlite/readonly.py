"""Opening a SQLite store read-only: a read changes no file, and a file that is not a store is refused.

``SqliteCheckpointer.open(path, read_only=True)`` (and ``open_store(url, read_only=True)``) calls :func:`probe`
before it opens anything through SQLite's usual path. The probe:

* refuses a missing file (nothing is created), an empty file, a file that is not SQLite, and a SQLite file that
  holds no threadloom schema ("... is not a threadloom store") or a schema of another version (a read never
  migrates);
* looks at a file with no write-ahead log (``-wal``) beside it through an ``immutable=1`` connection, which takes
  no lock and creates no file, so another application's database is left byte for byte as it was and no ``-wal``
  or ``-shm`` file appears;
* then opens the store with ``mode=ro``: a reader of a WAL-mode file shares its ``-shm`` index with the writers,
  so it sees every commit and never waits for one. SQLite creates the ``-wal`` and ``-shm`` files of a store
  that has none when the directory allows it (as any reader does); a read-only ``-shm`` (a store owned by another
  user) is read without being written.
* A reader that does not own the store file must not create them (files of another user would lock the owner's
  writers out), and in a directory the reader cannot write it cannot: a store with no ``-wal`` then has no writer
  attached, and each read is an ``immutable=1`` snapshot, kept only if the file did not change meanwhile, else
  read again (through ``mode=ro`` once a writer's ``-wal`` exists) (:attr:`Access.immutable`).
* A store whose ``-wal`` holds commits but whose ``-shm`` is gone, in a directory the reader cannot write, cannot
  be read without losing those commits: that is refused, saying how to read it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from urllib.parse import quote

import attrs

from threadloom.domain.errors import ProcessingError, StoreCorrupt, StoreUnavailable
from threadloom.persistence.sqlite.errors import SQLITE_CANTOPEN, SQLITE_READONLY, map_error, primary_code

SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""

STORE_TABLES = frozenset({"schema_version", "store", "threads", "checkpoints", "pending", "events", "effects"})
"""Tables every threadloom SQLite store holds; a file lacking any of them is not a store."""


def uri(path: str, *, immutable: bool) -> str:
    """The ``file:`` URI that opens ``path`` read-only (``immutable``: also without locks or side files)."""
    return f"file:{quote(path)}?mode=ro" + ("&immutable=1" if immutable else "")


def connect(path: str, busy_s: float, *, immutable: bool) -> sqlite3.Connection:
    """A read-only connection to ``path`` in autocommit mode (see :func:`uri`)."""
    return sqlite3.connect(
        uri(path, immutable=immutable),
        uri=True,
        timeout=busy_s,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=256,
    )


@attrs.frozen
class Stamp:
    """What a snapshot read compares before and after: the file's identity, size and time, and whether a ``-wal``
    exists (a writer is attached)."""

    inode: int
    size: int
    mtime_ns: int
    wal: bool


@attrs.frozen
class Access:
    """How a read-only store reads its file.

    Attributes:
        immutable: while no ``-wal`` exists, read ``immutable=1`` snapshots (no lock, no side file), each kept only
            if the file did not change under it (:meth:`stamp`); ``mode=ro`` while one exists. Chosen when the
            reader may not (or cannot) create the ``-wal`` and ``-shm`` files: it does not own the store file, or
            the directory refuses it.
    """

    immutable: bool

    @staticmethod
    def stamp(path: str) -> Stamp:
        """The file's :class:`Stamp` now."""
        info = os.stat(path)
        return Stamp(info.st_ino, info.st_size, info.st_mtime_ns, os.path.exists(path + "-wal"))


def _not_a_store(path: str, what: str) -> StoreCorrupt:
    return StoreCorrupt(
        "open",
        f"{path!r} is not a threadloom store ({what}); nothing was changed; check the path, or create a store "
        "with a command that writes",
    )


def check_schema(conn: sqlite3.Connection, path: str, expected: int, *, older: bool = False) -> None:
    """Refuses a file whose tables are not a threadloom store of schema version ``expected``.

    Args:
        older: accept an older schema too (a read-write open then migrates it).

    Raises:
        StoreCorrupt: not a threadloom store, or its schema is newer than this code.
        ProcessingError: an older schema, unless ``older`` (a read-only open never migrates).
        sqlite3.Error: as the driver raised it.
    """
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        raise _not_a_store(path, "a SQLite database with no tables")
    missing = STORE_TABLES - tables
    if missing:
        raise _not_a_store(path, f"a SQLite database without the tables {', '.join(sorted(missing))}")
    version = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
    if version > expected:
        raise StoreCorrupt(
            "open",
            f"the SQLite file {path!r} has schema version {version}, newer than this threadloom's {expected}; "
            "upgrade threadloom to read it",
        )
    if version < expected and not older:
        raise ProcessingError(
            "open",
            f"the SQLite file {path!r} has schema version {version}, older than this threadloom's {expected}, and "
            "a read-only open does not migrate it; open it once read-write (any command that writes, such as "
            "'threadloom sweep') to migrate it, or read it with the threadloom that wrote it",
        )


def probe(path: str, busy_s: float, expected: int) -> Access:
    """Checks that ``path`` is a threadloom store of schema ``expected`` without changing any file, and finds
    how to read it (see the module).

    Raises:
        StoreUnavailable: no file at ``path`` (nothing is created), or it cannot be read (permissions).
        StoreCorrupt: not a regular file (a FIFO, a device), an empty file, not a SQLite database, not a
            threadloom store, a newer schema, a damaged file.
        ProcessingError: an older schema; a ``-wal`` that cannot be read in a directory the caller cannot write.
    """
    _check_header(path, "a read-only open creates nothing")
    wal = path + "-wal"
    try:
        if not os.path.exists(wal):
            # No log: look without locks or side files, so a foreign file is left exactly as it was.
            _check(path, busy_s, expected, immutable=True)
            if os.stat(path).st_uid != os.geteuid():
                # -wal and -shm files made by another user than the store's owner would lock its writers out.
                return Access(immutable=True)
        try:
            _check(path, busy_s, expected, immutable=False)
        except sqlite3.Error as error:
            code = primary_code(error)
            if code not in (SQLITE_READONLY, SQLITE_CANTOPEN):
                raise
            if not os.path.exists(wal):  # the directory refuses the side files: no writer can exist either
                return Access(immutable=True)
            if not os.path.exists(path + "-shm"):
                raise ProcessingError(
                    "open",
                    f"the SQLite file {path!r} has a write-ahead log ({wal!r}) but no shared-memory file, and a "
                    "read-only open cannot make one in a directory it cannot write; read it as a user who can "
                    "write that directory, or copy the file together with its -wal into a directory you can write "
                    "and read the copy",
                ) from None
            raise
    except sqlite3.Error as error:
        raise map_error(error, operation="open", thread_id=None, path=path, busy_s=busy_s, closed=False) from None
    return Access(immutable=False)


def _check_header(path: str, creates_nothing: str) -> None:
    """Refuses a missing or unreadable file, one that is not a regular file (a FIFO, a device), an empty file, and
    one that is not a SQLite database."""
    try:
        # O_NONBLOCK: opening a FIFO put at the path meanwhile returns at once instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _not_a_store(path, "not a regular file")
            header = os.read(fd, 100)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise StoreUnavailable("open", f"no SQLite file at {path!r}; {creates_nothing}: check the path") from None
    except OSError as error:
        raise StoreUnavailable(
            "open", f"cannot read the SQLite file {path!r} ({error.strerror}); a read needs read access to the file"
        ) from None
    if not header:
        raise _not_a_store(path, "an empty file")
    if not header.startswith(SQLITE_MAGIC):
        raise _not_a_store(path, "not a SQLite database")


def check_existing(path: str, busy_s: float, expected: int, *, quick_check: bool = False) -> list[str]:
    """Before a read-write open that must not create a store (the command's maintenance writes, such as
    ``sweep``): checks, changing no file, that ``path`` holds a threadloom store of schema ``expected`` or older
    (the open then migrates it), and with ``quick_check`` runs SQLite's ``PRAGMA quick_check`` of the file.

    Like :func:`probe`, a file with no ``-wal`` beside it is read through an ``immutable=1`` connection (no lock,
    no side file), so a file that is refused, or found damaged, is left byte for byte as it was.

    Returns:
        ``quick_check``'s messages (at most 100): ``[]`` when the file is sound, or when not asked.

    Raises:
        StoreUnavailable: no file at ``path`` (nothing is created), or it cannot be read.
        StoreCorrupt: an empty file, not a SQLite database, not a threadloom store ("... is not a threadloom
            store"), a newer schema, a file too damaged to read its tables.
    """
    _check_header(path, "this command creates no store")
    try:
        conn = connect(path, busy_s, immutable=not os.path.exists(path + "-wal"))
        try:
            check_schema(conn, path, expected, older=True)
            if not quick_check:
                return []
            rows = conn.execute("PRAGMA quick_check(100)").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as error:
        raise map_error(error, operation="open", thread_id=None, path=path, busy_s=busy_s, closed=False) from None
    messages = [line for row in rows for line in str(row[0]).splitlines() if line.strip()]
    return [] if messages == ["ok"] else messages


def _check(path: str, busy_s: float, expected: int, *, immutable: bool) -> None:
    conn = connect(path, busy_s, immutable=immutable)
    try:
        check_schema(conn, path, expected)
    finally:
        conn.close()


__all__ = [
    "SQLITE_MAGIC",
    "STORE_TABLES",
    "Access",
    "Stamp",
    "check_existing",
    "check_schema",
    "connect",
    "probe",
    "uri",
]
