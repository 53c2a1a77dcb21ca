"""``SqliteCheckpointer``: the embedded default store, one SQLite file (README "Configuration": ``sqlite:///…``).

It behaves exactly like the reference :class:`~threadloom.persistence.memory.InMemoryCheckpointer`, deciding
with the same pure rules (:mod:`threadloom.domain.rules`: the commit check order, claims, thread status, numbering,
retention) and storing the same JSON text. What SQLite adds:

* **All state lives in the file** - the token counter, the reclamation mark, claims, event numbering, children's
  places - so several stores and several processes over one file behave as one store.
* **Writes** are ``BEGIN IMMEDIATE`` transactions shared by the writers of a store (group commit), **reads** one
  snapshot that never waits for a writer (WAL): see :mod:`threadloom.persistence.sqlite.connection`.
* **Commits write the encoded commit as it is**: the texts :func:`~threadloom.persistence.encoded.encode_commit`
  made once go into their rows unchanged; nothing is validated, encoded or decoded again on the way.
* **Times** are integer microseconds since the Unix epoch, stamped by the store's clock at commit.
* **Bounded calls**: every call is answered through an index (:mod:`threadloom.persistence.sqlite.schema`); a writer
  waits at most ``busy_timeout`` for the file, then fails with ``StoreUnavailable``.
* **The run queue** lives in the same file: ``store.queue`` is a
  :class:`~threadloom.persistence.sqlite.queue.SqliteRunQueue` over the store's database, and ``prune`` and
  ``sweep`` read the runs its open entries recorded inside their own write transaction.

Errors (README "Errors"; mapped in :mod:`threadloom.persistence.sqlite.errors`): ``StoreUnavailable`` (busy past
the busy timeout, read-only, disk full or an I/O error that rolled the write back: retryable), ``StoreCorrupt``
(not a database, a damaged file or row, a schema newer than the code: not retryable), ``StoreClosed`` after
:meth:`~SqliteCheckpointer.close`, and ``OutcomeUnknown`` when the ``COMMIT`` itself failed (the write may have
applied; fencing keeps a retry safe).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.access import AccessSchemas, Member
from threadloom.domain.clock import Clock, from_micros, to_micros
from threadloom.domain.errors import CancelledError, CheckpointNotFound, StoreCorrupt, ThreadBusy, ValidationError
from threadloom.domain.values import (
    Checkpoint,
    CheckpointPage,
    CheckpointStatus,
    ClaimRequest,
    EffectRecord,
    EventRecord,
    RetentionPolicy,
    RunClaim,
    StoredCheckpoint,
    SweepGuard,
    SweepPage,
    SweepPolicy,
    TenantCount,
    TenantPage,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence import codec
from threadloom.persistence.access import check_access
from threadloom.persistence.base import DEFAULT_MAX_JSON_SIZE, StoreBase, ask_guard, check_max_json_size
from threadloom.persistence.check import CheckReport
from threadloom.persistence.clock import SystemClock, check_clock
from threadloom.persistence.encoded import EncodedCommit
from threadloom.persistence.sqlite import access, maintenance, readonly, retention
from threadloom.persistence.sqlite import schema as sql
from threadloom.persistence.sqlite.connection import (
    MAX_WRITE_BATCH,
    SYNCHRONOUS,
    SYNCHRONOUS_MODES,
    WAL_AUTOCHECKPOINT,
    Database,
)
from threadloom.persistence.sqlite.queue import SqliteRunQueue
from threadloom.persistence.sqlite.schema import JOURNAL_MODE, MIGRATIONS, SCHEMA_VERSION
from threadloom.persistence.sqlite.skew import DEFAULT_SKEW_TOLERANCE, SkewWatch
from threadloom.persistence.sqlite.watcher import DataVersionWatcher
from threadloom.persistence.wakeups import Wakeups

_Row = tuple[Any, ...]
CANCEL_CHECK_S = 0.02  # how often a blocking wait with a cancel event looks at it
_NO_THREAD: _Row = (None,) * 18  # COMMIT_READ's columns of a thread the file does not hold
_UNSTAMPED = (None, None, None)
_NO_POSITION = 2**63 - 1  # above every position: search_history without ``before`` reads from the latest down


def check_path(path: Any) -> str:
    """The absolute path of the store file ``path`` names, as :meth:`SqliteCheckpointer.open` takes it.

    Touches nothing: it only looks at what is there.

    Raises:
        ValidationError: (field ``path``) ``path`` is not a file path (a directory, a FIFO or another file that
            is not a regular file, empty, ``:memory:``), or names a missing file whose directory does not exist
            or is not a directory.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValidationError("path", (f"must be a str or os.PathLike, got {type(path).__name__}",))
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ValidationError("path", ("must be a text path, not bytes",))
    if not text or text == ":memory:" or text.startswith("file:"):
        raise ValidationError(
            "path", (f"{text!r} names no file; give a file path (use memory:// for a store in memory)",)
        )
    if "\x00" in text:
        raise ValidationError("path", ("must not contain NUL",))
    absolute = os.path.abspath(text)
    if os.path.isdir(absolute):
        raise ValidationError("path", (f"{text!r} is a directory; give the path of a database file in it",))
    try:
        mode = os.stat(absolute).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent: a store is created there, if its directory is one
        # (a dangling symlink: the directory of the file it names, where SQLite would create it)
        _check_directory(text, os.path.dirname(os.path.realpath(absolute)))
        return absolute
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENAMETOOLONG):  # no retry heals these
            raise ValidationError(
                "path", (f"{text!r} cannot name a file: {error.strerror or error}; give the path of a database file",)
            ) from None
        return absolute  # unreadable (no search permission...): opening it says so
    if not stat.S_ISREG(mode):
        raise ValidationError(
            "path", (f"{text!r} is not a regular file (a FIFO, a device, a socket); give the path of a database file",)
        )
    return absolute


def _check_directory(text: str, directory: str) -> None:
    """Refuses the path of a file whose directory does not exist, or is not a directory: no retry makes it one.

    A directory that exists but cannot be searched or written (permissions, a lock) is left to the open, which
    reports it as ``StoreUnavailable`` (that may pass)."""
    try:
        mode = os.stat(directory).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ValidationError(
            "path", (f"the directory {directory!r} of {text!r} does not exist; create it first",)
        ) from None
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        raise ValidationError("path", (f"{directory!r}, the directory of {text!r}, is not a directory",))


def _expiry(field: str, now: datetime, ttl: timedelta) -> datetime:
    try:
        return now + ttl
    except OverflowError:
        raise ValidationError(field, (f"{ttl} from now is past the largest time a store can record",)) from None


def _token_of(conn: sqlite3.Connection, thread_id: str) -> int | None:
    row = conn.execute(sql.TOKEN_OF, (thread_id,)).fetchone()
    return row[0] if row is not None else None


def _check_fence(conn: sqlite3.Connection, fence: tuple[str, int] | None) -> None:
    if fence is not None:
        rules.check_token(fence[0], fence[1], _token_of(conn, fence[0]))


_OPENING = object()


class _Previewed(Exception):  # noqa: N818 - not an error: how a previewed sweep rolls its transaction back
    """Carries a previewed sweep's result out of its write transaction, which the raise rolls back."""

    def __init__(self, result: tuple[list[str], list[str]]) -> None:
        super().__init__("preview")
        self.result = result


class SqliteCheckpointer(StoreBase):
    """The store contract in one SQLite file; build it with :meth:`open`.

    Safe to call from any number of threads and from any number of processes over the same file; every store over
    the file behaves as one. ``await_events_after`` re-reads when the store's one ``PRAGMA data_version`` watcher
    sees the file change (:mod:`~threadloom.persistence.sqlite.watcher`), so it wakes within a few milliseconds of
    a commit made through any store or process, and costs no read while nothing changes.

    Every call may raise, besides what the contract names: ``StoreUnavailable`` (retryable: nothing was written),
    ``StoreCorrupt`` (not retryable), ``StoreClosed`` after :meth:`close`; a write whose ``COMMIT`` failed raises
    ``OutcomeUnknown`` (read the thread, or retry: fencing refuses a write twice).
    """

    def __init__(
        self,
        database: Database,
        opening: object,
        max_json_size: int = DEFAULT_MAX_JSON_SIZE,
        clock_skew_tolerance: timedelta = DEFAULT_SKEW_TOLERANCE,
        access: AccessSchemas | None = None,
    ) -> None:
        if opening is not _OPENING:
            raise TypeError("build a SqliteCheckpointer with SqliteCheckpointer.open(path, ...)")
        super().__init__(max_json_size=max_json_size, access=access)
        self._db = database
        self._skew = SkewWatch(database.path, clock_skew_tolerance)
        self.queue = SqliteRunQueue(database)
        """The store's run queue, in the same file: its open entries' runs survive retention."""
        self._watcher = DataVersionWatcher(self._watch_connection, os.path.basename(database.path))

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        clock: Clock | None = None,
        busy_timeout: timedelta = timedelta(seconds=5),
        *,
        synchronous: str = SYNCHRONOUS,
        read_only: bool = False,
        max_json_size: int = DEFAULT_MAX_JSON_SIZE,
        clock_skew_tolerance: timedelta = DEFAULT_SKEW_TOLERANCE,
        access: AccessSchemas | None = None,
    ) -> SqliteCheckpointer:
        """Opens (creating and migrating as needed) the store in the SQLite file at ``path``.

        Any number of stores and processes may open one file, a new one included, at the same time.
        With ``read_only=True`` nothing is created, migrated or written (README: "The `threadloom` command").

        Args:
            path: the database file (str or path-like); its directory must exist (it is never created).
                Relative paths are resolved against the working directory now.
            clock: the store's clock (default :class:`SystemClock`); it decides claim expiry, ``updated_at``,
                tombstone and retention age. Every store over one file must read the same time: a process whose
                clock runs ahead takes over live claims and prunes what is not yet old (README "Limits").
            busy_timeout: how long a call waits for another writer (thread or process) to release the file
                before it fails with ``StoreUnavailable`` (> 0).
            synchronous: ``PRAGMA synchronous`` of the connections, one of ``OFF``, ``NORMAL``, ``FULL``,
                ``EXTRA``; default ``NORMAL`` (a crash of the process loses nothing committed, a power loss may
                lose the last commits; ``FULL`` syncs every commit).
            read_only: open the file for reading only: it must exist and hold a threadloom store of this
                version; no file is created or changed, the journal mode is left alone, and every write method
                raises ``ProcessingError`` before touching the file. Works on a store owned by another user or in a
                directory the caller cannot write.
            max_json_size: the longest JSON text, in characters, of one record a commit stores (a checkpoint
                with its state, a pending write, an event, an effect record); default 16 MiB, at most 128 MiB.
                A longer one is a ``ValidationError`` before the file is touched (README "Limits").
            clock_skew_tolerance: how far in this store's future (> 0) a claim or commit another process stamped
                may lie before the store logs ``clock.skew_detected`` naming the holder that stamped it (once
                per holder a minute) and a metered store counts it; default 5 s.
            access: the access schemas this store stamps every commit's rows with and checks tenant-scoped reads
                against (README "Access schemas"); default: none declared (every graph kind tenant-only).

        Returns:
            The open store; close it with :meth:`close` (or use it as a context manager).

        Raises:
            ValidationError: ``path`` is not a file path (a directory, a FIFO or another file that is not a
                regular file, empty, ``:memory:``), names a file whose directory does not exist (or is not a
                directory; with ``read_only`` too), or another argument is bad; nothing was created. Not
                retryable: no retry creates the directory.
            StoreUnavailable: the file cannot be opened or created (its directory exists but cannot be searched
                or written) or stayed busy; retry once that is fixed. With ``read_only``: no file at ``path`` in
                an existing directory, or it cannot be read.
            StoreCorrupt: the file is not a SQLite database, is damaged, or was written by a newer version of
                threadloom; not retryable. With ``read_only`` also: an empty file, or a SQLite database that holds
                no threadloom store ("... is not a threadloom store").
            ProcessingError: with ``read_only``: a store of an older schema (a read does not migrate it).
        """
        absolute = check_path(path)
        if clock is None:
            clock = SystemClock()
        else:
            check_clock("clock", clock)
        v.check_positive_duration("busy_timeout", busy_timeout)
        if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValidationError("synchronous", (f"must be one of {sorted(SYNCHRONOUS_MODES)}, got {synchronous!r}",))
        if not isinstance(read_only, bool):
            raise ValidationError("read_only", (f"must be a bool, got {type(read_only).__name__}",))
        check_max_json_size(max_json_size)
        v.check_positive_duration("clock_skew_tolerance", clock_skew_tolerance)
        check_access(access)
        busy_s = busy_timeout.total_seconds()
        if read_only:
            probe = readonly.probe(absolute, busy_s, SCHEMA_VERSION)
            return cls(
                Database(absolute, clock, busy_s, synchronous.upper(), read_only=probe),
                _OPENING,
                max_json_size,
                clock_skew_tolerance,
                access,
            )
        database = Database(absolute, clock, busy_s, synchronous.upper())
        store = cls(database, _OPENING, max_json_size, clock_skew_tolerance, access)
        try:
            database.setup(
                lambda conn: sql.migrate(
                    conn, path=absolute, now_us=to_micros(database.now()), busy_s=database.busy_s
                )
            )
        except BaseException:
            store.close()
            raise
        return store

    @property
    def skew_watch(self) -> SkewWatch:
        """What finds stamps of other processes in this one's future; add a listener ``(op, skew_s)`` to its
        ``listeners`` to count them (a :class:`~threadloom.persistence.metrics.MeteredCheckpointer` does)."""
        return self._skew

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._db.path

    def __repr__(self) -> str:
        return f"SqliteCheckpointer(path={self._db.path!r}, clock={self._db.clock!r})"

    def _close(self) -> None:
        self._watcher.stop()
        self._db.close()

    def _watch_connection(self) -> sqlite3.Connection:
        if self._db.read_only is not None:
            return readonly.connect(self._db.path, self._db.busy_s, immutable=False)
        return sqlite3.connect(self._db.path, timeout=self._db.busy_s, isolation_level=None, check_same_thread=False)

    def wakeups(self) -> Wakeups:
        """The store's waiters and its ``data_version`` watcher, for waiting without a thread per waiter
        (README "asyncio"); :meth:`await_events_after` waits on it too."""
        return self._watcher.wakeups()

    @property
    def read_only(self) -> bool:
        """True for a store opened with ``read_only=True``: every write raises ``ProcessingError``."""
        return self._db.read_only is not None

    # -- maintenance (README "Backup, restore and check") ------------------------------------------------------------

    def backup(self, dest: str | os.PathLike[str], *, overwrite: bool = False) -> maintenance.BackupReport:
        """Copies the store into the file ``dest``: one consistent snapshot taken while writers go on, complete
        or absent (written beside ``dest`` and renamed into place once synced), one self-contained file with the
        permission bits of the store's file.

        Args:
            dest: the file to write; its directory must exist.
            overwrite: replace an existing ``dest`` (default: refuse it).

        Returns:
            ``BackupReport``: the copy's absolute path, its size in bytes and how many thread rows it holds.

        Raises:
            ValidationError: (field ``dest``) it exists and ``overwrite`` is False, or exists and is not a regular
                file (a directory, a FIFO, a device: refused even with ``overwrite``), or it is the store's own file
                or one of its ``-wal``, ``-shm``, ``-journal`` files, or in a directory that does not exist; nothing
                was written.
            ProcessingError: reading the store failed; no copy was left. Safe to retry.
            OSError: writing the copy failed (disk full, permissions); no copy was left.
        """
        self._ensure_open("backup")
        return maintenance.backup(self._db, dest, overwrite=overwrite)

    def check(self) -> CheckReport:
        """Checks the file (``PRAGMA integrity_check``) and the store's invariants on one snapshot (README
        "Backup, restore and check" lists them). Reads only; writers go on meanwhile.

        Returns:
            ``CheckReport``: the problems found (empty when sound; ``report.ok``) and the rows read.

        Raises:
            ProcessingError: the file cannot be opened or read at all.
        """
        self._ensure_open("check")
        return maintenance.check(self._db)

    def integrity_check(self, *, quick: bool = True) -> list[str]:
        """SQLite's own check of the file (``PRAGMA quick_check``; ``quick=False``: ``integrity_check``).

        Returns:
            ``[]`` when the file is sound, else SQLite's messages (at most 100).

        Raises:
            ProcessingError: the file cannot be read at all.
        """
        self._ensure_open("check")
        return maintenance.integrity(self._db, quick=quick)

    def _now_us(self) -> int:
        return to_micros(self._db.now())

    # -- claims ----------------------------------------------------------------------------------------------------

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        return self._db.write("claim", thread_id, self._claim_work, thread_id, request)

    def _claim_work(self, conn: sqlite3.Connection, thread_id: str, request: ClaimRequest) -> RunClaim:
        now = self._db.now()
        now_us = to_micros(now)
        row = conn.execute(sql.CLAIM_READ, (thread_id,)).fetchone()
        old_holder = old_tenant = None
        if row is not None:
            self._skew.saw("claim", thread_id, row[7], row[6], now_us)
        if row is not None and row[1] is not None:
            old_holder, _token, expires, old_tenant, latest_id, stamped, _updated, _run = row
            self._skew.saw("claim", thread_id, old_holder, stamped, now_us)
            if rules.claim_is_live(from_micros(expires), now):
                raise ThreadBusy(thread_id, latest_id, rules.busy_holder(old_holder, old_tenant, request.tenant_id))
        expires_at = _expiry("request.ttl", now, request.ttl)
        token, mark = conn.execute(sql.TOKEN).fetchall()[0]
        start = max(1, mark)
        conn.execute(
            sql.CLAIM_WRITE,
            (thread_id, request.holder, token, to_micros(expires_at), request.tenant_id, start, start, start, now_us),
        )
        return RunClaim(
            thread_id=thread_id,
            holder=request.holder,
            token=token,
            expires_at=expires_at,
            tenant_id=request.tenant_id,
            taken_over_from=rules.taken_over_from(old_holder, old_tenant, request.tenant_id),
        )

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        return self._db.write("renew", thread_id, self._renew_work, thread_id, token, ttl)

    def _renew_work(self, conn: sqlite3.Connection, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        row = conn.execute(sql.RENEW_READ, (thread_id,)).fetchone()
        rules.check_token(thread_id, token, row[1] if row is not None else None)
        now = self._db.now()
        expires_at = _expiry("ttl", now, ttl)
        conn.execute(sql.RENEW, (to_micros(expires_at), to_micros(now), thread_id))
        return RunClaim(thread_id=thread_id, holder=row[0], token=token, expires_at=expires_at, tenant_id=row[2])

    def _current_claim(self, thread_id: str) -> RunClaim | None:
        rows = self._db.fetch_all("current_claim", thread_id, sql.CURRENT_CLAIM, (thread_id,))
        if not rows:
            return None
        holder, token, expires, tenant = rows[0]
        return RunClaim(thread_id=thread_id, holder=holder, token=token, expires_at=from_micros(expires),
                        tenant_id=tenant)

    def _release(self, thread_id: str, token: int) -> None:
        self._db.write("release", thread_id, self._release_work, thread_id, token)

    @staticmethod
    def _release_work(conn: sqlite3.Connection, thread_id: str, token: int) -> None:
        row = conn.execute(sql.RELEASE_READ, (thread_id,)).fetchone()
        if row is None or row[0] != token:
            return
        _token, latest_id, n_pending, metadata, deleted_at, first_seq, next_seq = row
        if latest_id is None and n_pending == 0 and metadata is None and deleted_at is None and next_seq == first_seq:
            # A thread that holds nothing but the claim is forgotten, as the reference store forgets it.
            mark, has_effects, has_place = conn.execute(sql.FORGETTABLE, (thread_id,)).fetchone()
            if first_seq <= max(1, mark) and not has_effects and not has_place:
                conn.execute(sql.FORGET, (thread_id,))
                return
        conn.execute(sql.RELEASE, (thread_id,))

    # -- commits -----------------------------------------------------------------------------------------------------

    def _commit(self, thread_id: str, commit: EncodedCommit) -> list[EventRecord]:
        return self._db.write("commit", thread_id, self._commit_work, thread_id, commit)

    def _commit_work(self, conn: sqlite3.Connection, thread_id: str, commit: EncodedCommit) -> list[EventRecord]:
        """One commit inside the write transaction: the checks of commit rule 3, then the encoded texts as they are.

        Statements of a commit of a checkpoint, a pending write and an event to a thread: the thread's row read,
        the checkpoint's insert (which is also the duplicate check, through the ``(thread_id, id)`` unique index),
        the pending writes put in place of the old latest's, the events' insert and the thread's row update.
        """
        (
            current, next_seq, n_checkpoints, n_pending, metadata_text, deleting, updated_at, latest_id,
            latest_position, latest_status, latest_run_id, latest_tenant, latest_graph_id, origin_parent,
            stamped_at, *thread_stamp,
        ) = conn.execute(sql.COMMIT_READ, (thread_id,)).fetchone() or _NO_THREAD
        cp = commit.checkpoint
        top = latest_position or 0  # the latest's position; 0 for an empty history
        keep = top  # the checkpoints at or below this position stay (retract_turn cuts back to the settled one)
        now_us: int | None = None
        at_us = 0  # the rows' stamp: now, or the thread's last stamp when the clock stepped back since
        inserted = False

        def contains(checkpoint_id: str) -> bool:
            nonlocal keep, now_us, at_us, inserted
            if commit.retract_turn:  # the parent named the latest: the cut goes back to the newest settled one
                settled = conn.execute(sql.NEWEST_SETTLED, (thread_id,)).fetchone()
                keep = settled[0] if settled is not None else 0
            if keep < top:  # a retract turn: the history still holds what it cuts, the insert comes after the cut
                return conn.execute(sql.HAS_CHECKPOINT, (thread_id, checkpoint_id)).fetchone() is not None
            # The insert answers: it writes nothing when the history holds the id. A later check's refusal rolls
            # this call's changes back with the rest.
            now_us = self._now_us()
            at_us = now_us if stamped_at is None else max(now_us, stamped_at)
            inserted = self._insert_checkpoint(conn, thread_id, commit, keep + 1, at_us, next_seq, latest_run_id)
            return not inserted

        rules.check_commit(
            thread_id,
            token=commit.token,
            current=current,
            fence=commit.fence,
            fence_current=lambda other: _token_of(conn, other),
            checkpoint=None if cp is None else (cp.id, cp.parent),
            contains=contains,
            latest_id=lambda: latest_id,
            pending_targets=commit.pending_targets,
            retract_turn=commit.retract_turn,
        )
        # Every check passed: apply.
        if now_us is None:
            now_us = self._now_us()
            at_us = now_us if stamped_at is None else max(now_us, stamped_at)
        self._skew.saw("commit", thread_id, latest_run_id, updated_at, now_us)
        if cp is not None:
            stamp = commit.stamp or _UNSTAMPED
        else:
            stamp = access.log_stamp(conn, self._access, thread_id, latest_graph_id, latest_position, thread_stamp)
        writes = commit.pending_writes
        first_pending = n_pending
        same_place = False  # the checkpoint keeps the thread's tenant, graph and origin
        if cp is not None:
            if keep < top:
                n_checkpoints -= conn.execute(sql.CUT_HISTORY, (thread_id, keep)).rowcount
            if not inserted:  # after the cut: it follows the newest checkpoint the cut kept
                before = conn.execute(sql.RUN_AT, (thread_id, keep)).fetchone() if keep else None
                self._insert_checkpoint(
                    conn, thread_id, commit, keep + 1, at_us, next_seq, None if before is None else before[0]
                )
            n_checkpoints += 1
            if n_pending > len(writes):
                conn.execute(sql.DROP_PENDING_FROM, (thread_id, len(writes)))
            first_pending, n_pending = 0, 0
            updated_at = now_us
            latest_id, latest_position, latest_status, latest_run_id = cp.id, keep + 1, cp.status, cp.run_id
            same_place = (
                latest_tenant == cp.tenant_id and latest_graph_id == cp.graph_id and origin_parent == cp.origin_parent
            )
            latest_tenant, latest_graph_id = cp.tenant_id, cp.graph_id
            if cp.origin_parent != origin_parent:
                if origin_parent is not None:
                    conn.execute(sql.UNLIST_CHILD, (origin_parent, thread_id))
                if cp.origin_parent is not None:
                    conn.execute(sql.LIST_CHILD, (cp.origin_parent, thread_id))
                origin_parent = cp.origin_parent
        if writes:
            conn.executemany(
                sql.PUT_PENDING,
                [(thread_id, first_pending + index, w.text, *stamp) for index, w in enumerate(writes)],
            )
            n_pending += len(writes)
        records = []
        if commit.events:
            rows = []
            for event in commit.events:
                rows.append((thread_id, next_seq, at_us, event.text(next_seq), *stamp))
                records.append(event.record(next_seq))
                next_seq += 1
            conn.executemany(sql.INSERT_EVENT, rows)
        if commit.effects:
            conn.executemany(
                sql.INSERT_EFFECT, [(thread_id, effect.key, effect.text, *stamp) for effect in commit.effects]
            )
        if cp is not None or records:
            stamped_at = at_us
        if commit.metadata:
            merged = {**codec.decode_metadata(metadata_text, thread_id), **commit.metadata}
            metadata_text = codec.encode_metadata(merged)
            deleting = 1 if merged.get(rules.DELETING_KEY) == "true" else 0
            updated_at = now_us
        if cp is None and not commit.metadata:
            if records or writes:  # the registry's columns stay: a narrower update leaves their index entries alone
                conn.execute(sql.COMMIT_WRITE_LOG, (next_seq, n_pending, stamped_at, thread_id))
            return records
        if cp is not None and same_place:
            conn.execute(
                sql.COMMIT_WRITE_STEP,
                (
                    next_seq, n_checkpoints, n_pending, metadata_text, deleting, updated_at, latest_id,
                    latest_position, latest_status, latest_run_id, stamped_at, *stamp, thread_id,
                ),
            )
            return records
        conn.execute(
            sql.COMMIT_WRITE,
            (
                next_seq, n_checkpoints, n_pending, metadata_text, deleting, updated_at, latest_id, latest_position,
                latest_status, latest_run_id, latest_tenant, latest_graph_id, origin_parent, stamped_at,
                *stamp, thread_id,
            ),
        )
        return records

    @staticmethod
    def _insert_checkpoint(
        conn: sqlite3.Connection,
        thread_id: str,
        commit: EncodedCommit,
        position: int,
        now_us: int,
        seq_mark: int,
        run_before: str | None,
    ) -> bool:
        """Inserts the commit's checkpoint at ``position``, after a checkpoint of the run ``run_before`` (None: the
        history holds none below it); False (nothing written) when the history holds its id."""
        cp = commit.checkpoint
        assert cp is not None
        return conn.execute(
            sql.INSERT_CHECKPOINT,
            (thread_id, position, cp.id, cp.run_id, 1 if cp.settled else 0, now_us, seq_mark, cp.text, cp.metadata,
             None if run_before == cp.run_id else 1, *(commit.stamp or _UNSTAMPED)),
        ).rowcount == 1

    # -- reads -------------------------------------------------------------------------------------------------------

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        rows = self._db.fetch_all("latest", thread_id, sql.LATEST, (thread_id,))
        rows.sort(key=lambda row: (row[0], row[1]))
        if not rows or rows[0][0] != 0:
            return None
        return StoredCheckpoint(
            checkpoint=codec.decode_checkpoint(rows[0][2], thread_id),
            pending_writes=tuple(codec.decode_pending_write(row[2], thread_id) for row in rows[1:]),
        )

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        rows = self._db.fetch_all("checkpoint", thread_id, sql.CHECKPOINT, (thread_id, checkpoint_id))
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        if before is None:
            rows = self._db.fetch_all("history", thread_id, sql.HISTORY, (thread_id, limit))
        else:
            rows = self._db.read("history", thread_id, self._history_work, thread_id, limit, before)
        return [codec.decode_checkpoint(row[0], thread_id) for row in rows]

    @staticmethod
    def _history_work(conn: sqlite3.Connection, thread_id: str, limit: int, before: str) -> list[_Row]:
        found = conn.execute(sql.POSITION_OF, (thread_id, before)).fetchone()
        if found is None:
            raise CheckpointNotFound(thread_id, before)
        return conn.execute(sql.HISTORY_BEFORE, (thread_id, found[0], limit)).fetchall()

    def _search_history(
        self, thread_id: str, metadata: dict[str, str], limit: int, before: str | None, scan: int
    ) -> CheckpointPage:
        wanted = codec.encode_metadata(metadata) if metadata else "{}"
        rows, floor = self._db.read(
            "search_history", thread_id, self._search_work, thread_id, wanted, limit, before, scan
        )
        return CheckpointPage.of([codec.decode_checkpoint(text, thread_id) for text in rows], limit, floor)

    @staticmethod
    def _search_work(
        conn: sqlite3.Connection, thread_id: str, wanted: str, limit: int, before: str | None, scan: int
    ) -> tuple[list[str], str | None]:
        below = _NO_POSITION
        if before is not None:
            found = conn.execute(sql.POSITION_OF, (thread_id, before)).fetchone()
            if found is None:
                raise CheckpointNotFound(thread_id, before)
            below = found[0]
        bodies: list[str] = []
        examined: str | None = None
        rows = conn.execute(sql.SEARCH_HISTORY, (thread_id, below, wanted, scan + 1))
        try:
            for index, (cp_id, body) in enumerate(rows):
                if index == scan:  # one past the window: older checkpoints follow its oldest
                    return bodies, examined
                examined = cp_id
                if body is not None:
                    bodies.append(body)
                    if len(bodies) > limit:
                        break
        finally:
            rows.close()
        return bodies, None

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        return self._db.read("children", parent, self._children_work, parent, limit, after, snapshot=after is not None)

    @staticmethod
    def _children_work(conn: sqlite3.Connection, parent: str, limit: int, after: str | None) -> list[str]:
        start = 0
        if after is not None:
            found = conn.execute(sql.PLACE_OF, (parent, after)).fetchone()
            if found is None:
                raise ValidationError("after", (f"{after!r} is not known as a child of {parent!r}",))
            start = found[0]
        return [row[0] for row in conn.execute(sql.CHILDREN, (parent, start, limit))]

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        rows = self._db.fetch_all("events_after", thread_id, sql.EVENTS, (thread_id, retention.clamp(after_seq), limit))
        events = []
        for seq, first_seq, floor, text in rows:
            if seq is None:
                start = max(1, text)  # the header row: the store's mark in the last column
                rules.read_start(
                    thread_id,
                    after_seq,
                    first_seq=first_seq if first_seq is not None else start,
                    floor=floor if floor is not None else start,
                )
            else:
                events.append((seq, text))
        events.sort()
        return [codec.decode_event(text, thread_id) for _seq, text in events]

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        """Reads, and while it finds nothing waits for the watcher to see the file change (or ``cancel``)."""
        operation = "await_events_after"
        if timeout <= timedelta(0):
            return self._events_after(thread_id, after_seq, limit)
        deadline = time.monotonic() + timeout.total_seconds()
        waiters = self._watcher.waiters
        wake = waiters.add(thread_id)
        try:
            self._watcher.start()
            while True:
                wake.clear()
                self._ensure_open(operation)
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                found = self._events_after(thread_id, after_seq, limit)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found
                step = remaining if self._watcher.listening() else min(remaining, self.poll_interval.total_seconds())
                if cancel is not None:
                    step = min(step, CANCEL_CHECK_S)  # a threading.Event cannot wake us: look at it often
                wake.wait(step)
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
        finally:
            waiters.remove(thread_id, wake)

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        rows = self._db.fetch_all("effect", thread_id, sql.EFFECT, (thread_id, key))
        return codec.decode_effect(rows[0][0], thread_id) if rows else None

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        rows = self._db.fetch_all("lookup_run", thread_id, sql.LOOKUP_RUN, (thread_id, codec.dumps(sorted(run_ids))))
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    # -- writes without a checkpoint ---------------------------------------------------------------------------------

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        self._db.write("compact_events", thread_id, self._compact_work, thread_id, before_seq)

    @staticmethod
    def _compact_work(conn: sqlite3.Connection, thread_id: str, before_seq: int) -> None:
        row = conn.execute(sql.COMPACT_READ, (thread_id,)).fetchone()
        if row is None:
            return
        floor, next_seq = row
        new_floor = rules.compacted_floor(floor=floor, next_seq=next_seq, before_seq=before_seq)
        if new_floor != floor:
            conn.execute(sql.SET_FLOOR, (new_floor, thread_id))
            conn.execute(sql.DROP_EVENTS_BEFORE, (thread_id, new_floor))

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        self._db.write("delete_thread", thread_id, self._delete_work, thread_id, token, fence)

    def _delete_work(self, conn: sqlite3.Connection, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        row = conn.execute(sql.DELETE_READ, (thread_id,)).fetchone()
        rules.check_token(thread_id, token, row[0] if row is not None else None)
        _check_fence(conn, fence)
        _token, first_seq, next_seq, origin_parent = row
        start = rules.tombstone_next_seq(first_seq=first_seq, next_seq=next_seq)
        for statement in (sql.DELETE_CHECKPOINTS, sql.DROP_PENDING, sql.DELETE_EVENTS, sql.DELETE_EFFECTS):
            conn.execute(statement, (thread_id,))
        if origin_parent is not None:
            conn.execute(sql.UNLIST_CHILD, (origin_parent, thread_id))
        conn.execute(sql.TOMBSTONE, (start, self._now_us(), thread_id))

    # -- retention -------------------------------------------------------------------------------------------------

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        self._db.write("prune", thread_id, self._prune_work, thread_id, policy)

    def _prune_work(self, conn: sqlite3.Connection, thread_id: str, policy: RetentionPolicy) -> None:
        retention.prune(conn, thread_id, policy, self._now_us())

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        rows = self._db.fetch_all("sweep", None, sql.SWEEP_PAGE, (after or "", policy.batch_size + 1))
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        protected = ask_guard(guard, page)  # before any change, outside any transaction: the guard is user code
        pruned: list[str] = []
        reclaimed: list[str] = []
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            pruned, reclaimed = self._db.write("sweep", None, self._sweep_work, page, policy, protected)
        more = len(ids) > policy.batch_size
        return SweepPage(
            visited=page, pruned=tuple(pruned), reclaimed=tuple(reclaimed), next=page[-1] if more and page else None
        )

    def _sweep_work(
        self, conn: sqlite3.Connection, page: tuple[str, ...], policy: SweepPolicy, protected: dict[str, frozenset[str]]
    ) -> tuple[list[str], list[str]]:
        return retention.sweep(conn, page, policy, protected, self._now_us())

    def _preview_sweep(self, policy: SweepPolicy, after: str | None) -> SweepPage:
        rows = self._db.fetch_all("preview_sweep", None, sql.SWEEP_PAGE, (after or "", policy.batch_size + 1))
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        pruned: list[str] = []
        reclaimed: list[str] = []
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            try:
                self._db.write("preview_sweep", None, self._preview_work, page, policy)
            except _Previewed as done:  # raised by the work: its transaction rolled back
                pruned, reclaimed = done.result
        more = len(ids) > policy.batch_size
        return SweepPage(
            visited=page, pruned=tuple(pruned), reclaimed=tuple(reclaimed), next=page[-1] if more and page else None
        )

    def _preview_work(self, conn: sqlite3.Connection, page: tuple[str, ...], policy: SweepPolicy) -> None:
        raise _Previewed(retention.sweep(conn, page, policy, {}, self._now_us()))

    # -- registry --------------------------------------------------------------------------------------------------

    @staticmethod
    def _summary(row: _Row, now: datetime) -> ThreadSummary:
        (thread_id, tenant_id, status, claim_token, claim_expires, metadata_text, updated_at, latest_id, run_id,
         graph) = row
        metadata = codec.decode_metadata(metadata_text, thread_id)
        live = claim_token is not None and rules.claim_is_live(from_micros(claim_expires), now)
        try:
            latest_status = CheckpointStatus(status)
        except ValueError as error:
            raise StoreCorrupt(
                "decode", f"the stored status {status!r} of thread {thread_id!r} does not decode; the row is damaged"
            ) from error
        return ThreadSummary(
            thread_id=thread_id,
            tenant_id=tenant_id,
            status=rules.thread_status(latest_status, live_claim=live, metadata=metadata),
            updated_at=from_micros(updated_at),
            latest_checkpoint_id=latest_id,
            latest_run_id=run_id,
            graph_id=graph,
            metadata=metadata,
        )

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        now = self._db.now()
        statement = sql.threads_statement(query, to_micros(now))
        if statement is None:
            return ThreadPage()
        rows = self._db.fetch_all("threads", None, *statement)
        summaries = [self._summary(row, now) for row in rows]
        return ThreadPage.of([s for s in summaries if query.matches(s)], query.limit)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        now = self._db.now()
        statement = sql.incomplete_statement(tenant_id, limit, after, to_micros(now))
        rows = self._db.fetch_all("incomplete", None, *statement)
        summaries = [self._summary(row, now) for row in rows]
        return ThreadPage.of([s for s in summaries if s.status is ThreadStatus.IDLE], limit)

    def _tenants(self, limit: int, after: str | None) -> TenantPage:
        return self._db.read("tenants", None, _tenants, limit, after)

    # -- access (README "Access schemas"; the statements in persistence/sqlite/access.py) --------------------------

    def _stamp_thread(self, thread_id: str, fence: tuple[str, int] | None) -> int:
        return self._db.write("stamp_thread", thread_id, access.stamp_thread, self._access, thread_id, fence)

    def _graph_threads(self, graph_id: str, after: str | None, limit: int) -> list[str]:
        rows = self._db.fetch_all("graph_threads", None, sql.GRAPH_THREADS, (graph_id, after or "", limit))
        return [row[0] for row in rows]

    def _token_high_water(self) -> int:
        rows = self._db.fetch_all("token_high_water", None, sql.TOKEN_HIGH_WATER, ())
        return int(rows[0][0]) if rows else 0

    def _heartbeat(self, group: str, member: str, serves: tuple[str, ...], ttl: timedelta) -> None:
        now = self._db.now()
        expires_us = to_micros(_expiry("ttl", now, ttl))
        self._db.write("heartbeat", None, access.heartbeat, group, member, serves, to_micros(now), expires_us)

    def _members(self, group: str) -> list[Member]:
        rows = self._db.fetch_all("members", None, sql.MEMBERS, (group, self._now_us()))
        return access.members(rows)

    def _stamped_history(self, thread_id: str, limit: int, before: str | None) -> tuple[str | None, list[Any]]:
        return self._db.read("tenant_history", thread_id, access.stamped_history, thread_id, limit, before)

    def _stamped_events(self, thread_id: str, after_seq: int, limit: int) -> tuple[str | None, list[Any]]:
        return self._db.read("tenant_events_after", thread_id, access.stamped_events, thread_id, after_seq, limit)

    def _tenant_threads(self, tenant_id: str | None, after: str | None, limit: int) -> list[str]:
        rows = self._db.fetch_all("export_tenant", None, sql.TENANT_THREADS, (tenant_id, after or "", limit))
        return [row[0] for row in rows]

    def _stamped_thread(self, thread_id: str) -> Any:
        return self._db.read("export_tenant", thread_id, access.stamped_thread, thread_id)


def _tenants(conn: sqlite3.Connection, limit: int, after: str | None) -> TenantPage:
    """The tenants page (``Checkpointer.tenants``) read on ``conn`` in one read transaction."""
    rows = conn.execute(sql.TENANTS, (after or "", limit + 1)).fetchall()
    named = [TenantCount(tenant_id=tenant, threads=n) for tenant, n in rows]
    tenantless = conn.execute(sql.TENANTLESS).fetchone()[0] if len(named) <= limit else 0
    return TenantPage.of(named, tenantless, limit)


__all__ = [
    "JOURNAL_MODE",
    "MAX_WRITE_BATCH",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SYNCHRONOUS",
    "SYNCHRONOUS_MODES",
    "SqliteCheckpointer",
    "WAL_AUTOCHECKPOINT",
]
