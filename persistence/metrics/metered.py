"""``MeteredCheckpointer``: a decorator that meters every call of another store (seeds 000; DESIGN §3, §6).

It delegates every method to the inner store's *public* method - so the inner store's own validation, its
closed check and its own :meth:`~threadloom.persistence.base.Checkpointer.await_events_after` (the one that wakes
on commits, for memory and PostgreSQL) run unchanged - and records around each call, into a
:class:`~threadloom.persistence.metrics.meter.Meter`:

==========================================  =========  ==============  ===============================================
metric                                      kind       labels          what
==========================================  =========  ==============  ===============================================
``threadloom_store_calls_total``            counter    ``op``          calls of each store method, failed ones included
``threadloom_store_errors_total``           counter    ``op, error``   calls that raised, by the error's class name
                                                                       (``ThreadBusy``, ``StaleClaim``,
                                                                       ``ValidationError``, ``ProcessingError``, …)
``threadloom_store_call_seconds``           histogram  ``op``          each call's latency in seconds
                                                                       (``time.perf_counter``), failed ones included;
                                                                       for ``await_events_after`` it includes the wait
``threadloom_claims_total``                 counter    ``outcome``     ``granted``: ``claim`` returned a claim that
                                                                       replaced none the caller may see;
                                                                       ``taken_over``: it named the expired claim it
                                                                       replaced (``RunClaim.taken_over_from``);
                                                                       ``busy``: ``claim`` raised ``ThreadBusy``;
                                                                       ``stale``: any call raised ``StaleClaim`` (a run
                                                                       learnt it lost a claim: ``renew``, ``commit``,
                                                                       ``delete_thread``, a fence)
``threadloom_events_committed_total``       counter    —               events numbered by successful commits
``threadloom_sweep_pages_total``            counter    —               successful ``sweep`` calls (one page each)
``threadloom_sweep_visited_total``          counter    —               threads those pages visited
``threadloom_sweep_pruned_total``           counter    —               threads those pages pruned
``threadloom_sweep_reclaimed_total``        counter    —               tombstones those pages reclaimed
``threadloom_waits_total``                  counter    ``outcome``     ``await_events_after`` ends: ``woken`` (returned
                                                                       events, at once or after waiting),
                                                                       ``timed_out`` (returned ``[]``), ``cancelled``
                                                                       (raised ``CancelledError``)
==========================================  =========  ==============  ===============================================

``op`` is the store method's name: ``claim``, ``renew``, ``release``, ``commit``, ``latest``, ``checkpoint``,
``history``, ``children``, ``events_after``, ``await_events_after``, ``compact_events``, ``delete_thread``,
``effect``, ``lookup_run``, ``prune``, ``sweep``, ``threads``, ``incomplete``.

A takeover of a claim whose tenant differs from the request's is counted as ``granted``: the store does not
reveal it to the claimant (seeds 000 "claim": a refusal never reveals another tenant's RunId), so neither does
the meter.

A meter that raises never changes a call's outcome (the call's result or error is what the caller gets); the
first such failure is logged (``metrics.failed``) and every one is counted in
:attr:`MeteredCheckpointer.meter_failures`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from time import perf_counter
from typing import Any, TypeVar

from threadloom.persistence.logs import get_logger as _safe_logger

from threadloom.domain.errors import CancelledError, StaleClaim, ThreadBusy, ValidationError
from threadloom.domain.values import (
    Checkpoint,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventRecord,
    RetentionPolicy,
    RunClaim,
    StoredCheckpoint,
    SweepGuard,
    SweepPage,
    SweepPolicy,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
)
from threadloom.persistence.base import OPERATIONS, Checkpointer
from threadloom.persistence.metrics.meter import BoundCounter, InMemoryMeter, Labels, Meter, MetricSpec

_log = _safe_logger("threadloom.metrics")

_T = TypeVar("_T")

CALLS = "threadloom_store_calls_total"
ERRORS = "threadloom_store_errors_total"
LATENCY = "threadloom_store_call_seconds"
CLAIMS = "threadloom_claims_total"
EVENTS_COMMITTED = "threadloom_events_committed_total"
SWEEP_PAGES = "threadloom_sweep_pages_total"
SWEEP_VISITED = "threadloom_sweep_visited_total"
SWEEP_PRUNED = "threadloom_sweep_pruned_total"
SWEEP_RECLAIMED = "threadloom_sweep_reclaimed_total"
WAITS = "threadloom_waits_total"

"""Every metered store method: the values of the ``op`` label."""

STORE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        name=CALLS, kind="counter", help="Store calls, by store method (failed calls included).", labels=("op",)
    ),
    MetricSpec(
        name=ERRORS,
        kind="counter",
        help="Store calls that raised, by store method and error class.",
        labels=("op", "error"),
    ),
    MetricSpec(
        name=LATENCY,
        kind="histogram",
        help="Store call latency in seconds, by store method (failed calls and waits included).",
        labels=("op",),
        unit="s",
    ),
    MetricSpec(
        name=CLAIMS,
        kind="counter",
        help="Claim outcomes: granted, taken_over, busy (ThreadBusy), stale (any StaleClaim).",
        labels=("outcome",),
    ),
    MetricSpec(name=EVENTS_COMMITTED, kind="counter", help="Events numbered by successful commits."),
    MetricSpec(name=SWEEP_PAGES, kind="counter", help="Retention sweep pages completed."),
    MetricSpec(name=SWEEP_VISITED, kind="counter", help="Threads visited by retention sweep pages."),
    MetricSpec(name=SWEEP_PRUNED, kind="counter", help="Threads pruned by retention sweep pages."),
    MetricSpec(name=SWEEP_RECLAIMED, kind="counter", help="Tombstones reclaimed by retention sweep pages."),
    MetricSpec(
        name=WAITS,
        kind="counter",
        help="await_events_after outcomes: woken (returned events), timed_out (returned none), cancelled.",
        labels=("outcome",),
    ),
)
"""The metrics :class:`MeteredCheckpointer` records (see the module docstring); it describes each to its meter."""

_OP: dict[str, Labels] = {op: (("op", op),) for op in OPERATIONS}
_GRANTED: Labels = (("outcome", "granted"),)
_TAKEN_OVER: Labels = (("outcome", "taken_over"),)
_BUSY: Labels = (("outcome", "busy"),)
_STALE: Labels = (("outcome", "stale"),)
_WOKEN: Labels = (("outcome", "woken"),)
_TIMED_OUT: Labels = (("outcome", "timed_out"),)
_CANCELLED: Labels = (("outcome", "cancelled"),)


def _check_meter(meter: Any) -> Meter:
    if isinstance(meter, Meter):
        return meter
    if callable(getattr(meter, "counter", None)) and callable(getattr(meter, "histogram", None)):
        return meter  # duck-typed: anything with counter() and histogram() will do
    raise ValidationError(
        "meter", (f"must be a Meter (with counter and histogram), got {type(meter).__name__}",)
    )


class _Op:
    """One store method's bound series: ``record(seconds)`` counts a call and observes its latency."""

    __slots__ = ("name", "record")

    def __init__(self, meter: Meter, name: str) -> None:
        self.name = name
        # A duck-typed meter may have only counter() and histogram(): Meter.timer composes those.
        timer = meter.timer if callable(getattr(meter, "timer", None)) else Meter.timer.__get__(meter)
        self.record = timer(CALLS, LATENCY, _OP[name]).record


class MeteredCheckpointer(Checkpointer):
    """Another store, with every call metered (seeds 000 ``MeteredCheckpointer``; DESIGN §3 "Stores").

    Each public method calls the inner store's public method of the same name with the same arguments and
    returns its result or raises its error unchanged; the metrics of the module docstring are recorded around
    it. :meth:`await_events_after` is the inner store's own, so a store that wakes on commits still wakes when
    wrapped. Safe to call from any number of threads, as the inner store is. Closing it closes the inner store.

    Args:
        inner: the store to meter. The wrapper owns it from now on: :meth:`close` closes it.
        meter: where measurements go; a new :class:`~threadloom.persistence.metrics.meter.InMemoryMeter` when None.
            Several wrappers may share one meter (their counts add up).

    Raises:
        ValidationError: ``inner`` is not a ``Checkpointer``, or ``meter`` has no ``counter``/``histogram``, or
            the meter refused a metric's description (e.g. a Prometheus registry that already holds it).
    """

    def __init__(self, inner: Checkpointer, meter: Meter | None = None) -> None:
        super().__init__()
        if not isinstance(inner, Checkpointer):
            raise ValidationError("inner", (f"must be a Checkpointer, got {type(inner).__name__}",))
        self._inner = inner
        self._meter = InMemoryMeter() if meter is None else _check_meter(meter)
        describe = getattr(self._meter, "describe", None)
        if callable(describe):
            for spec in STORE_METRICS:
                describe(spec)
        self._failures = 0
        self._failures_lock = threading.Lock()
        # Every series is bound once, here: the hot path then only calls add/observe on it.
        meter = self._meter
        for op in OPERATIONS:  # self._op_commit, self._op_events_after, …
            setattr(self, f"_op_{op}", _Op(meter, op))
        self._granted = meter.counter(CLAIMS, _GRANTED)
        self._taken_over = meter.counter(CLAIMS, _TAKEN_OVER)
        self._busy = meter.counter(CLAIMS, _BUSY)
        self._stale = meter.counter(CLAIMS, _STALE)
        self._events_committed = meter.counter(EVENTS_COMMITTED)
        self._sweep_pages = meter.counter(SWEEP_PAGES)
        self._sweep_visited = meter.counter(SWEEP_VISITED)
        self._sweep_pruned = meter.counter(SWEEP_PRUNED)
        self._sweep_reclaimed = meter.counter(SWEEP_RECLAIMED)
        self._woken = meter.counter(WAITS, _WOKEN)
        self._timed_out = meter.counter(WAITS, _TIMED_OUT)
        self._cancelled = meter.counter(WAITS, _CANCELLED)
        self._errors: dict[tuple[str, str], BoundCounter] = {}  # (op, error class) -> series, bound on first use

    def __repr__(self) -> str:
        return f"MeteredCheckpointer({self._inner!r}, meter={self._meter!r})"

    @property
    def inner(self) -> Checkpointer:
        """The store every call is delegated to."""
        return self._inner

    @property
    def meter(self) -> Meter:
        """Where this wrapper's measurements go (``meter.snapshot()`` for an ``InMemoryMeter``)."""
        return self._meter

    @property
    def queue(self) -> Any:
        """The inner store's run queue (DESIGN §4; ``store.queue``), so a runtime can serve a wrapped store.

        Its calls are not metered. ``AttributeError`` when the inner store has no queue.
        """
        return self._inner.queue

    @property
    def meter_failures(self) -> int:
        """How many times recording into the meter raised (each ignored; the first one logged)."""
        return self._failures

    @property
    def closed(self) -> bool:
        """True once this wrapper or its inner store was closed."""
        return self._closed or self._inner.closed

    def _close(self) -> None:
        self._inner.close()

    # -- recording -------------------------------------------------------------------------------------------------

    def _meter_failed(self, error: Exception) -> None:
        with self._failures_lock:
            self._failures += 1
            first = self._failures == 1
        if first:
            _log.warning(
                "metrics.failed",
                error=f"{type(error).__name__}: {error}",
                meter=type(self._meter).__name__,
                note="store calls are unaffected; further meter failures are counted, not logged",
            )

    def _failed(self, op: _Op, start: float, error: BaseException) -> None:
        elapsed = perf_counter() - start
        try:
            op.record(elapsed)
            key = (op.name, type(error).__name__)
            errors = self._errors.get(key)
            if errors is None:
                errors = self._errors[key] = self._meter.counter(ERRORS, (("error", key[1]), ("op", key[0])))
            errors.add(1)
            if isinstance(error, StaleClaim):
                self._stale.add(1)
            elif isinstance(error, ThreadBusy):
                self._busy.add(1)
            elif isinstance(error, CancelledError) and op is self._op_await_events_after:
                self._cancelled.add(1)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _done(self, op: _Op, start: float) -> None:
        elapsed = perf_counter() - start
        try:
            op.record(elapsed)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _extra(self, counter: BoundCounter, amount: float = 1) -> None:
        try:
            counter.add(amount)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _call(self, op: _Op, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        start = perf_counter()
        try:
            result = method(*args, **kwargs)
        except BaseException as error:
            self._failed(op, start, error)
            raise
        self._done(op, start)
        return result

    # -- claims ----------------------------------------------------------------------------------------------------

    def claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        """The inner store's :meth:`~Checkpointer.claim`, metered (outcome ``granted``, ``taken_over``, ``busy``)."""
        claim = self._call(self._op_claim, self._inner.claim, thread_id, request)
        self._extra(self._granted if claim.taken_over_from is None else self._taken_over)
        return claim

    def renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        """The inner store's :meth:`~Checkpointer.renew`, metered (a ``StaleClaim`` counts as outcome ``stale``)."""
        return self._call(self._op_renew, self._inner.renew, thread_id, token, ttl)

    def release(self, thread_id: str, token: int) -> None:
        """The inner store's :meth:`~Checkpointer.release`, metered."""
        self._call(self._op_release, self._inner.release, thread_id, token)

    # -- commits ---------------------------------------------------------------------------------------------------

    def commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        """The inner store's :meth:`~Checkpointer.commit`, metered; its events add to ``events_committed``."""
        op = self._op_commit  # the hot path, written out: no generic call, one try around the recording
        start = perf_counter()
        try:
            records = self._inner.commit(thread_id, commit)
        except BaseException as error:
            self._failed(op, start, error)
            raise
        elapsed = perf_counter() - start
        try:
            op.record(elapsed)
            if records:
                self._events_committed.add(len(records))
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)
        return records

    # -- reads -----------------------------------------------------------------------------------------------------

    def latest(self, thread_id: str) -> StoredCheckpoint | None:
        """The inner store's :meth:`~Checkpointer.latest`, metered."""
        return self._call(self._op_latest, self._inner.latest, thread_id)

    def checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        """The inner store's :meth:`~Checkpointer.checkpoint`, metered."""
        return self._call(self._op_checkpoint, self._inner.checkpoint, thread_id, checkpoint_id)

    def history(self, thread_id: str, *, limit: int, before: str | None = None) -> list[Checkpoint]:
        """The inner store's :meth:`~Checkpointer.history` (newest first), metered."""
        return self._call(self._op_history, self._inner.history, thread_id, limit=limit, before=before)

    def children(self, parent: str, *, limit: int, after: str | None = None) -> list[str]:
        """The inner store's :meth:`~Checkpointer.children` (oldest first), metered."""
        return self._call(self._op_children, self._inner.children, parent, limit=limit, after=after)

    def events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        """The inner store's :meth:`~Checkpointer.events_after` (ascending), metered."""
        return self._call(self._op_events_after, self._inner.events_after, thread_id, after_seq, limit)

    def await_events_after(
        self,
        thread_id: str,
        after_seq: int,
        limit: int,
        timeout: timedelta,
        *,
        cancel: threading.Event | None = None,
    ) -> list[EventRecord]:
        """The inner store's own :meth:`~Checkpointer.await_events_after`, metered (DESIGN §3 rule 11).

        The inner store's override runs, so a store that wakes on commits (memory, PostgreSQL) still returns as
        soon as one lands. The wait ends ``woken`` (events returned), ``timed_out`` (``[]``) or ``cancelled``
        (``CancelledError``); its latency includes the wait.
        """
        found = self._call(
            self._op_await_events_after,
            self._inner.await_events_after,
            thread_id,
            after_seq,
            limit,
            timeout,
            cancel=cancel,
        )
        self._extra(self._woken if found else self._timed_out)
        return found

    def compact_events(self, thread_id: str, before_seq: int) -> None:
        """The inner store's :meth:`~Checkpointer.compact_events`, metered."""
        self._call(self._op_compact_events, self._inner.compact_events, thread_id, before_seq)

    def delete_thread(self, thread_id: str, token: int, *, fence: tuple[str, int] | None = None) -> None:
        """The inner store's :meth:`~Checkpointer.delete_thread`, metered."""
        self._call(self._op_delete_thread, self._inner.delete_thread, thread_id, token, fence=fence)

    def effect(self, thread_id: str, key: str) -> EffectRecord | None:
        """The inner store's :meth:`~Checkpointer.effect`, metered."""
        return self._call(self._op_effect, self._inner.effect, thread_id, key)

    def lookup_run(self, thread_id: str, run_ids: Iterable[str]) -> Checkpoint | None:
        """The inner store's :meth:`~Checkpointer.lookup_run`, metered."""
        return self._call(self._op_lookup_run, self._inner.lookup_run, thread_id, run_ids)

    # -- retention -------------------------------------------------------------------------------------------------

    def prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        """The inner store's :meth:`~Checkpointer.prune`, metered."""
        self._call(self._op_prune, self._inner.prune, thread_id, policy)

    def sweep(self, policy: SweepPolicy, guard: SweepGuard | None, *, after: str | None = None) -> SweepPage:
        """The inner store's :meth:`~Checkpointer.sweep`, metered: one page, its visited, pruned and reclaimed."""
        page = self._call(self._op_sweep, self._inner.sweep, policy, guard, after=after)
        self._extra(self._sweep_pages)
        if page.visited:
            self._extra(self._sweep_visited, len(page.visited))
        if page.pruned:
            self._extra(self._sweep_pruned, len(page.pruned))
        if page.reclaimed:
            self._extra(self._sweep_reclaimed, len(page.reclaimed))
        return page

    # -- registry --------------------------------------------------------------------------------------------------

    def threads(self, query: ThreadQuery) -> ThreadPage:
        """The inner store's :meth:`~Checkpointer.threads`, metered."""
        return self._call(self._op_threads, self._inner.threads, query)

    def incomplete(self, tenant_id: str | None, *, limit: int, after: ThreadCursor | None = None) -> ThreadPage:
        """The inner store's :meth:`~Checkpointer.incomplete`, metered."""
        return self._call(self._op_incomplete, self._inner.incomplete, tenant_id, limit=limit, after=after)

    # -- the abstract implementation hooks ---------------------------------------------------------------------------
    # Every public method above goes to the inner store's public method, so these are reached only by code that
    # calls a store's private hooks directly; they forward to the inner store's hooks, unmetered.

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        return self._inner._claim(thread_id, request)

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        return self._inner._renew(thread_id, token, ttl)

    def _release(self, thread_id: str, token: int) -> None:
        self._inner._release(thread_id, token)

    def _commit(self, thread_id: str, commit: Commit) -> list[EventRecord]:
        return self._inner._commit(thread_id, commit)

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        return self._inner._latest(thread_id)

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        return self._inner._checkpoint(thread_id, checkpoint_id)

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        return self._inner._history(thread_id, limit, before)

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        return self._inner._children(parent, limit, after)

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        return self._inner._events_after(thread_id, after_seq, limit)

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        return self._inner._await_events_after(thread_id, after_seq, limit, timeout, cancel)

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        self._inner._compact_events(thread_id, before_seq)

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        self._inner._delete_thread(thread_id, token, fence)

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        return self._inner._effect(thread_id, key)

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        return self._inner._lookup_run(thread_id, run_ids)

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        self._inner._prune(thread_id, policy)

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        return self._inner._sweep(policy, guard, after)

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        return self._inner._threads(query)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        return self._inner._incomplete(tenant_id, limit, after)


__all__ = ["OPERATIONS", "STORE_METRICS", "MeteredCheckpointer"]
