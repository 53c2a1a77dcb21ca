"""SQLite store harnesses for the contract suite.

Three arrangements over one temporary SQLite file, all reading the harness's :class:`ManualClock`:

* :class:`SqliteHarness` - one :class:`SqliteCheckpointer`; :meth:`sibling` opens a second store on the file.
* :class:`SqlitePairHarness` - two stores over the file, calls alternating between them
  (:class:`AlternatingCheckpointer`): every rule must hold whichever store a call reaches.
* :class:`SqliteReopeningHarness` - a store that opens the file afresh for every call and closes it after
  (:class:`ReopeningCheckpointer`): nothing may live in a store object, only in the file (token counter,
  reclamation mark, claims, numbering, children's places).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from threadloom.domain.access import AccessSchemas
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.harness import AlternatingCheckpointer, StoreHarness

_HARNESS = object()


class SqliteHarness(StoreHarness):
    """One :class:`SqliteCheckpointer` over a temporary file; its sibling is a second store on that file."""

    name = "sqlite"
    reopenable = True
    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="threadloom-sqlite-")
        self.path = os.path.join(self.directory, "store.db")

    def open_sqlite(
        self, busy_timeout: timedelta = timedelta(seconds=5), access: AccessSchemas | None | object = _HARNESS
    ) -> SqliteCheckpointer:
        """A plain :class:`SqliteCheckpointer` over this harness's file and clock (not tracked for cleanup),
        stamping with ``access`` (default: the harness's :attr:`access`)."""
        return SqliteCheckpointer.open(
            self.path, clock=self.clock, busy_timeout=busy_timeout,
            access=self.access if access is _HARNESS else access,  # type: ignore[arg-type]
        )

    def _open(self) -> Checkpointer:
        return self.open_sqlite()

    def _remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class SqlitePairHarness(SqliteHarness):
    """Two SQLite stores over one file; each call goes to the next of them in turn."""

    name = "sqlite-pair"

    def _open(self) -> Checkpointer:
        return AlternatingCheckpointer(self.open_sqlite(), self.open_sqlite())


class ReopeningCheckpointer(ForwardingCheckpointer):
    """Opens a fresh store for every call and closes it once the call returns.

    Args:
        opener: builds a store over the storage under test (called once per call).

    Each call goes to the new store's public method unchanged (it validates the call), so a test passes only if
    everything the contract promises is kept in the storage itself. Once this wrapper is closed, every call
    raises ``StoreClosed`` without opening a store.
    """

    def __init__(self, opener: Callable[[], Checkpointer]) -> None:
        super().__init__(None)
        self._opener = opener

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self._ensure_open(operation)
        store = self._opener()
        try:
            return getattr(store, operation)(*args, **kwargs)
        finally:
            store.close()


class SqliteReopeningHarness(SqliteHarness):
    """SQLite across close and reopen: every call runs on a store opened for it and closed after it."""

    name = "sqlite-reopening"

    def _open(self) -> Checkpointer:
        access = self.access  # each call's store stamps with the declarations this store was opened with
        return ReopeningCheckpointer(lambda: self.open_sqlite(access=access))


__all__ = ["ReopeningCheckpointer", "SqliteHarness", "SqlitePairHarness", "SqliteReopeningHarness"]


def query_plan(conn: sqlite3.Connection, sql: str) -> list[str]:
    """The ``EXPLAIN QUERY PLAN`` lines of ``sql`` with placeholder arguments (named ``:x`` or positional ``?``)."""
    names = set(re.findall(r":(\w+)", sql))
    if names:
        params: Any = {name: "[]" if name == "runs" else 1 for name in names}
    else:
        count = max([int(n) for n in re.findall(r"\?(\d+)", sql)] or [sql.count("?")])
        params = ["[]" if "json_each" in sql else 1] * count
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


class VmSteps:
    """Counts the SQLite virtual-machine steps of a store's calls: the cost of a call, independent of time.

    Needs a store with exactly one pooled connection (one call warms it up).
    """

    def __init__(self, store: SqliteCheckpointer) -> None:
        store.latest("warm-up")
        (self.conn,) = store._db.idle
        self.count = 0

    def __call__(self, call: Callable[[], Any]) -> int:
        self.count = 0

        def tick() -> int:
            self.count += 1
            return 0

        self.conn.set_progress_handler(tick, 1)
        try:
            call()
        finally:
            self.conn.set_progress_handler(None, 1)
        return self.count
