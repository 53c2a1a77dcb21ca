"""The oracle's checks of access walks and stamp-checked reads (README "Access walks").

:class:`WalkChecks` is the part of the :class:`~threadloom.simulations.checkers.Oracle` that follows the walks:
the oracle hands it every commit, ``stamp_thread`` and tenant-scoped read whose outcome a simulated store reported,
and it checks at once, against the real store read directly (no other task runs in between):

* **at most one live walk lease per graph kind** (checked with the claims: the lease is a claim on the walk thread);
* **no stamp from a deposed walker**: a ``stamp_thread`` fenced by a walk lease applies only while that lease is
  the walk thread's current claim;
* **a stamp equals its thread's attributes**: right after a ``stamp_thread`` applied, every row of the thread
  carries the stamp the calling store's schema derives from the thread's latest checkpoint (derived and written
  in one transaction under the thread's lock: a commit that landed meanwhile is not overwritten with older
  attributes);
* **walk cursor monotone**: within one walk (one schema and heads) the recorded cursor and count never move back,
  and a completed walk is never recorded incomplete again;
* **a completed walk leaves every row stamped**: when a walk records completion, every row of every thread of its
  graph kind carries the walk's schema and the thread's tenant — unless a node of another schema wrote or read
  the thread since the walk (or a store of its schema) last stamped it — and a thread nothing touched since the
  walk stamped it carries exactly its current attributes;
* **tenant reads fail closed**: a tenant-scoped read (``tenant_history``, ``tenant_events_after``,
  ``export_tenant``) returns only rows of that tenant whose stored stamp is of the reading store's schema and names
  that tenant.
"""

from __future__ import annotations

from typing import Any

from threadloom.domain.access import AccessSchema, WalkRecord
from threadloom.domain.errors import ThreadloomError
from threadloom.domain.values import Checkpoint, Commit, EventRecord

WALK_MARK = "#access-walk/"
"""What every walk thread's id holds (``<group>#access-walk/<graph_id>``)."""

WALK_CHECKS: tuple[str, ...] = (
    "at most one live walk lease per graph kind",
    "no stamp from a deposed walker",
    "a stamp equals its thread's attributes",
    "walk cursor monotone",
    "a completed walk leaves every row stamped",
    "tenant reads fail closed",
)
"""The invariants of access walks and stamp-checked reads (``threadloom simulate`` lists them)."""


def is_walk_thread(thread_id: str | None) -> bool:
    """True for a walk thread's id."""
    return thread_id is not None and WALK_MARK in thread_id


class WalkChecks:
    """What the oracle knows of the walks (see the module docstring).

    Args:
        oracle: the oracle (its ``inner`` store, ``fail``, ``probe``, ``threads`` and operation counter).
    """

    def __init__(self, oracle: Any) -> None:
        self.oracle = oracle
        self.graph_of: dict[str, str] = {}  # thread -> the graph kind of its latest known checkpoint
        self.touched: dict[str, list[tuple[int, str, bool]]] = {}  # thread -> (op number, schema hash, commit?)
        self.stamped: dict[str, list[tuple[int, str]]] = {}  # thread -> (op number, schema hash) of stamps
        self.records: dict[str, WalkRecord] = {}  # walk thread -> its last committed record
        self.started: dict[str, int] = {}  # walk thread -> op number of its current walk's first record

    # -- plumbing -------------------------------------------------------------------------------------------------

    def _schema(self, store: Any, graph_id: str) -> AccessSchema:
        return store.access.for_graph(graph_id)

    def _stored(self, thread_id: str) -> Any:
        """The thread's rows with their stamps, read from the real store: (graph, checkpoints, pending, events,
        effects), each part a list of (value, stamp)."""
        return self.oracle.inner._stamped_thread(thread_id)

    def _touch(self, store: Any, thread_id: str, graph_id: str | None, commit: bool) -> None:
        if graph_id is None or getattr(store, "access", None) is None:
            return
        self.touched.setdefault(thread_id, []).append(
            (self.oracle.ops, self._schema(store, graph_id).hash, commit)
        )

    # -- what the oracle hands over -------------------------------------------------------------------------------

    def committed(self, store: Any, thread_id: str, commit: Commit) -> None:
        """A commit applied: noted for the completion check; a walk record is checked for monotony."""
        cp = commit.checkpoint
        if cp is not None:
            self.graph_of[thread_id] = cp.graph_id
        if is_walk_thread(thread_id):
            if cp is not None:
                self._walk_record(store, thread_id, cp)
            return
        self._touch(store, thread_id, self.graph_of.get(thread_id), True)

    def stamp_applied(self, store: Any, thread_id: str, fence: tuple[str, int] | None) -> None:
        """A ``stamp_thread`` applied: its fence was live, and the thread's rows now carry its attributes."""
        oracle = self.oracle
        if fence is not None:
            oracle.probe("walk_stamp")
            walk = oracle.threads.get(fence[0])
            if walk is None or fence[1] != walk.current or walk.released or walk.gone:
                current = walk.current if walk is not None else None
                oracle.fail(
                    "no stamp from a deposed walker",
                    f"{thread_id}: stamped under lease {fence[1]} of {fence[0]} (current is {current})",
                )
        else:
            oracle.probe("follower_stamp")
        graph_id, checkpoints, pending, events, effects = self._stored(thread_id)
        if graph_id is None or not checkpoints:
            return
        expected = self._schema(store, graph_id).columns(checkpoints[-1][0])
        self.stamped.setdefault(thread_id, []).append((oracle.ops, expected[0]))
        for kind, part in (("checkpoint", checkpoints), ("pending write", pending), ("event", events),
                           ("effect record", effects)):
            for value, stamp in part:
                if tuple(stamp or ()) != tuple(expected):
                    oracle.fail(
                        "a stamp equals its thread's attributes",
                        f"{thread_id}: a {kind} ({_row_name(value)}) carries {_stamp_text(stamp)} right after "
                        f"stamp_thread, not {_stamp_text(expected)} of the latest checkpoint",
                    )
                    return

    def tenant_read(self, store: Any, op: str, args: tuple[Any, ...], result: Any) -> None:
        """A tenant-scoped read returned ``result``: only that tenant's rows, each checked."""
        oracle = self.oracle
        oracle.probe(f"tenant_read.{op}")
        if op == "export_tenant":
            tenant = args[0]
            for thread in result.threads:
                self._check_rows(store, op, thread.thread_id, tenant, thread.checkpoints, thread.events)
            return
        thread_id, tenant = args[0], args[1]
        if op == "tenant_history":
            self._check_rows(store, op, thread_id, tenant, result, ())
        else:
            self._check_rows(store, op, thread_id, tenant, (), result)

    def _check_rows(
        self, store: Any, op: str, thread_id: str, tenant: str | None, checkpoints: Any, events: Any
    ) -> None:
        oracle = self.oracle
        graph_id, stored_cps, _, stored_events, _ = self._stored(thread_id)
        if graph_id is not None:
            self._touch(store, thread_id, graph_id, False)  # its follower may have stamped the thread
        if not checkpoints and not events:
            return
        oracle.probe("tenant_rows_returned")
        schema = self._schema(store, graph_id).hash if graph_id is not None else None
        cp_stamps = {cp.id: stamp for cp, stamp in stored_cps}
        event_stamps = {event.seq: stamp for event, stamp in stored_events}
        rows: list[tuple[str, str | None, Any]] = [
            (f"checkpoint {cp.id}", cp.tenant_id, cp_stamps.get(cp.id)) for cp in checkpoints
        ]
        rows += [(f"event {event.seq}", tenant, event_stamps.get(event.seq)) for event in events]
        for name, content_tenant, stamp in rows:
            if content_tenant != tenant or stamp is None or stamp[0] != schema or stamp[1] != tenant:
                oracle.fail(
                    "tenant reads fail closed",
                    f"{thread_id}: {op} for tenant {tenant!r} returned {name} of tenant {content_tenant!r} "
                    f"stamped {_stamp_text(stamp)} (the reader's schema is {schema})",
                )
                return

    # -- walk records -------------------------------------------------------------------------------------------

    def _walk_record(self, store: Any, walk_thread: str, cp: Checkpoint) -> None:
        oracle = self.oracle
        try:
            record = WalkRecord.from_state(walk_thread, cp.state)
        except ThreadloomError as error:
            oracle.fail("walk cursor monotone", f"{walk_thread}: a committed record does not decode: {error}")
            return
        previous = self.records.get(walk_thread)
        self.records[walk_thread] = record
        same = previous is not None and (previous.schema, previous.heads) == (record.schema, record.heads)
        if not same:
            self.started[walk_thread] = oracle.ops
            oracle.probe("walk_started")
            if previous is not None and previous.schema != record.schema:
                oracle.probe("walk_replaced")
        else:
            assert previous is not None
            if (record.cursor or "") < (previous.cursor or "") or record.count < previous.count:
                oracle.fail(
                    "walk cursor monotone",
                    f"{walk_thread}: cursor {previous.cursor!r} (count {previous.count}) moved back to "
                    f"{record.cursor!r} (count {record.count})",
                )
                return
            if previous.completed and not record.completed:
                oracle.fail("walk cursor monotone", f"{walk_thread}: a completed walk was recorded incomplete")
                return
            if previous.completed:
                return
        if record.completed:
            oracle.probe("walk_completed")
            self._check_completed(store, walk_thread, record)

    def _check_completed(self, store: Any, walk_thread: str, record: WalkRecord) -> None:
        """Every thread of the walked kind is stamped with the walk's schema (see the module docstring)."""
        oracle = self.oracle
        schema = self._schema(store, record.graph_id)
        if schema.hash != record.schema:
            oracle.fail(
                "a completed walk leaves every row stamped",
                f"{walk_thread}: completed by a node of schema {schema.hash}, not the walk's {record.schema}",
            )
            return
        start = self.started.get(walk_thread, 0)
        after = None
        while True:
            page = oracle.inner.graph_threads(record.graph_id, after=after, limit=100)
            for thread_id in page:
                self._check_thread(walk_thread, thread_id, schema, start)
                if oracle.violation is not None:
                    return
            if len(page) < 100:
                return
            after = page[-1]

    def _check_thread(self, walk_thread: str, thread_id: str, schema: AccessSchema, start: int) -> None:
        oracle = self.oracle
        stamps = [op for op, hash_ in self.stamped.get(thread_id, ()) if hash_ == schema.hash and op > start]
        since = max([start, *stamps])
        later = [(op, hash_, commit) for op, hash_, commit in self.touched.get(thread_id, ()) if op > since]
        if any(hash_ != schema.hash for _, hash_, _ in later):
            oracle.probe("walk_check_skipped_other_schema")
            return  # a node of another schema wrote or read (and so stamped) it since
        graph_id, checkpoints, pending, events, effects = self._stored(thread_id)
        if graph_id is None or not checkpoints:
            return
        latest = checkpoints[-1][0]
        exact = bool(stamps) and not any(commit for _, _, commit in later)
        expected = schema.columns(latest)
        oracle.probe("walk_thread_checked")
        for kind, part in (("checkpoint", checkpoints), ("pending write", pending), ("event", events),
                           ("effect record", effects)):
            for value, stamp in part:
                wrong = (
                    stamp is None
                    or stamp[0] != schema.hash
                    or stamp[1] != latest.tenant_id
                    or (exact and tuple(stamp) != tuple(expected))
                )
                if wrong:
                    oracle.fail(
                        "a completed walk leaves every row stamped",
                        f"{thread_id}: a {kind} ({_row_name(value)}) carries {_stamp_text(stamp)} when "
                        f"{walk_thread} completed (schema {schema.hash}"
                        + (f", attributes {expected[2]})" if exact else f", tenant {latest.tenant_id!r})"),
                    )
                    return


def _row_name(value: Any) -> str:
    if isinstance(value, Checkpoint):
        return f"checkpoint {value.id}"
    if isinstance(value, EventRecord):
        return f"event {value.seq}"
    return type(value).__name__


def _stamp_text(stamp: Any) -> str:
    if stamp is None:
        return "no stamp"
    return f"{stamp[0]}/{stamp[1]!r}/{stamp[2]}"
