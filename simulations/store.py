"""The store as one simulated node sees it: every call a yield point, some calls faulty, every outcome checked.

:class:`SimStore` wraps the real store a node uses (a shared in-memory store, or the node's own SQLite store
over the shared file). Each call first yields to the world (a round trip: the other tasks may run meanwhile),
then may suffer the faults the seed chose: a write that fails *before* it reached the storage, or
one that applied but whose reply was lost — both reach the caller as ``OutcomeUnknown`` — or a slow call. What
really happened is reported to the :class:`~threadloom.simulations.checkers.Oracle`, which checks it at once.
A walker's fenced ``stamp_thread`` may also find its node paused past the walk lease's ttl, or crashing, while
the call is on its way. ``pressed`` is judged on the world's clock (this node's slow or failed calls of the last
second), never the wall clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from threadloom.domain.clock import Clock
from threadloom.domain.errors import CancelledError, OutcomeUnknown, StoreUnavailable, ThreadloomError
from threadloom.domain.values import EventRecord, SweepGuard, SweepPage, SweepPolicy
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer, ForwardingRunQueue
from threadloom.persistence.queue import RunQueue
from threadloom.simulations.world import SimCrash, SimNode, World

WRITES = frozenset({"claim", "renew", "release", "commit", "delete_thread", "stamp_thread", "heartbeat"})
"""The store calls a fault can make fail before or after they applied."""

STORE_WIDE = frozenset(
    {
        "sweep", "threads", "incomplete", "tenants", "graph_threads", "token_high_water", "heartbeat", "members",
        "export_tenant",
    }
)
"""The store calls that name no thread (the oracle notes them under none)."""


class Faults:
    """The store faults of one seed, and whether they are on (they heal at the world's heal time).

    Attributes:
        fail_before, fail_after: the chance that a write fails before it applied, or after (each 0..1).
        slow: the chance that a call is slow, and ``slow_for`` how slow at most.
        walk_pause, walk_crash: the chance that a walker's fenced ``stamp_thread`` finds its node paused past the
            lease's ttl while the call is on its way (it reaches the storage late), or crashing (before or after
            the call applied); ``pause_node`` and ``crash_node`` do it.
        active: False once the faults healed.
    """

    def __init__(self) -> None:
        self.fail_before = 0.0
        self.fail_after = 0.0
        self.slow = 0.0
        self.slow_for = timedelta(0)
        self.walk_pause = 0.0
        self.walk_crash = 0.0
        self.pause_node: Callable[[SimNode], None] = lambda _node: None
        self.crash_node: Callable[[SimNode], None] = lambda _node: None
        self.active = True


class SimStore(ForwardingCheckpointer):
    """The store of one simulated node: forwards every call to ``inner``'s public method, as a yield point.

    ``inner`` validates each call (this wrapper validates nothing). Closing a ``SimStore`` does not close
    ``inner``, which other nodes may share: the seed closes the real stores when it ends.

    Args:
        inner: the real store.
        node: the node whose calls these are.
        oracle: receives what each call really did, and checks it.
        faults: the seed's store faults.
        store_clock: the clock ``inner`` decides claim expiry by.
    """

    def __init__(self, inner: Checkpointer, node: SimNode, oracle: Any, faults: Faults, store_clock: Clock) -> None:
        super().__init__(inner)
        self.store_clock = store_clock
        self.node = node
        self.world: World = node.world
        self.oracle = oracle
        self.faults = faults
        self._queue = SimQueue(self, inner.queue) if inner.queue is not None else None
        self._pressed_at: datetime | None = None  # the world's time of this node's last slow or failed call

    def __repr__(self) -> str:
        return f"SimStore({self.node.name!r})"

    @property
    def queue(self) -> SimQueue | None:  # type: ignore[override]
        """The node's view of the real store's run queue: every call a yield point."""
        return self._queue

    def close(self) -> None:
        """Refuses this node's later calls; the real store stays open (the seed closes it)."""
        self._closed = True

    def pressed(self, window: timedelta = timedelta(seconds=1)) -> bool:
        """Whether one of this node's calls was slow, or failed with ``OutcomeUnknown`` or ``StoreUnavailable``,
        within the last ``window`` of virtual time (the real store's signal reads the wall clock)."""
        return self._pressed_at is not None and self.world.now - self._pressed_at <= window

    # -- the call ---------------------------------------------------------------------------------------------

    def _latency(self) -> timedelta:
        world, faults = self.world, self.faults
        if faults.active and faults.slow and world.rng.random() < faults.slow:
            self.oracle.probe("slow_call")
            self._pressed_at = world.now
            slow_for_us = int(faults.slow_for / timedelta(microseconds=1))
            return timedelta(microseconds=world.rng.randrange(1, max(2, slow_for_us)))
        return timedelta(milliseconds=world.rng.choice((0, 0, 1, 2)))

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Every call of the contract: a yield point, the seed's faults, and the oracle's check of the outcome."""
        thread_id = None if operation in STORE_WIDE else args[0]
        noted = (*args, kwargs["fence"]) if operation in ("delete_thread", "stamp_thread") else args
        return self._call(operation, thread_id, noted, super()._forward, operation, *args, **kwargs)

    def _call(
        self, op: str, thread_id: str | None, noted: tuple[Any, ...], call: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Yields, applies the faults, runs ``call``, and reports the outcome to the oracle (with ``noted``)."""
        world, faults = self.world, self.faults
        if self.node.dead:
            raise SimCrash()
        self._ensure_open(op)
        crash = self._walk_fault(op, noted)
        world.sleep(self._latency())
        if crash == "before":
            faults.crash_node(self.node)
            raise SimCrash()
        fault = None
        if faults.active and op in WRITES:
            roll = world.rng.random()
            if roll < faults.fail_before:
                fault = "before"
            elif roll < faults.fail_before + faults.fail_after:
                fault = "after"
        if fault == "before":
            self._pressed_at = world.now
            self.oracle.note(self, op, thread_id, noted, error=OutcomeUnknown(op, "the request was lost"))
            self.oracle.probe(f"outcome_unknown_not_applied.{op}")
            raise OutcomeUnknown(op, f"the request of thread {thread_id!r} was lost before it reached the storage")
        try:
            result = call(*args, **kwargs)
        except ThreadloomError as error:
            if isinstance(error, StoreUnavailable):
                self._pressed_at = world.now
            self.oracle.note(self, op, thread_id, noted, error=error)
            raise
        self.oracle.note(self, op, thread_id, noted, result=result)
        if crash == "after":
            faults.crash_node(self.node)
            raise SimCrash()
        if fault == "after":
            self._pressed_at = world.now
            self.oracle.probe(f"outcome_unknown_applied.{op}")
            raise OutcomeUnknown(op, f"the reply for thread {thread_id!r} was lost after the storage applied it")
        return result

    def _walk_fault(self, op: str, noted: tuple[Any, ...]) -> str | None:
        """A walker's fenced stamp may find its node paused (the call then reaches the storage after the pause) or
        crashing: returns ``"before"`` or ``"after"`` (the call applied) for a crash, else None."""
        faults, rng = self.faults, self.world.rng
        if op != "stamp_thread" or noted[-1] is None or not faults.active:
            return None
        if faults.walk_pause and rng.random() < faults.walk_pause:
            self.oracle.probe("walker_paused_mid_page")
            faults.pause_node(self.node)
        if faults.walk_crash and rng.random() < faults.walk_crash:
            self.oracle.probe("walker_crashed_mid_page")
            return rng.choice(("before", "after"))
        return None

    # -- what the simulation does itself ----------------------------------------------------------------------

    def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        """Reads; if nothing is there, yields until the oracle saw a write to the thread, ``cancel`` or
        ``timeout`` (virtual time), and reads again: a store that wakes on commits."""
        if cancel is not None and cancel.is_set():
            raise CancelledError("await_events_after")
        found = self.events_after(thread_id, after_seq, limit)
        if found:
            return found
        version = self.oracle.version(thread_id)
        self.world.block(
            lambda: self.oracle.version(thread_id) != version or (cancel is not None and cancel.is_set()),
            self.world.now + timeout,
        )
        if cancel is not None and cancel.is_set():
            raise CancelledError("await_events_after")
        return self.events_after(thread_id, after_seq, limit)

    def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        """The real sweep, its guard checked by the oracle (which also checks what the page removed)."""
        checking = self.oracle.guard_for(self, guard)
        page = self._call("sweep", None, (policy, checking), super()._forward, "sweep", policy, checking, after=after)
        self.oracle.after_sweep(self, page, checking)
        return page


class SimQueue(ForwardingRunQueue):
    """The run queue of one simulated node: every call forwarded to the real queue's public method (which
    validates it); each write and lease is a yield point whose outcome the oracle records."""

    READS = frozenset({"entry", "entries", "open_runs"})
    """The calls forwarded as they are: no yield point, nothing recorded."""

    def __init__(self, store: SimStore, inner: RunQueue) -> None:
        super().__init__(inner)
        self._store = store

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        if operation in self.READS:
            return super()._forward(operation, *args, **kwargs)
        store = self._store
        store.world.sleep(store._latency())
        try:
            result = super()._forward(operation, *args, **kwargs)
        except ThreadloomError as error:
            store.oracle.note_queue(store, operation, args, error=error)
            raise
        store.oracle.note_queue(store, operation, args, result=result)
        return result
