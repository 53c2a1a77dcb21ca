"""``MeteredCheckpointer``: a decorator that meters every call of another store.

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
``threadloom_clock_skew_detected_total``    counter    ``op``          a SQLite store read a claim or commit another
                                                                       process stamped in its future by more than its
                                                                       ``clock_skew_tolerance`` (at most once per
                                                                       holder a minute; log ``clock.skew_detected``
                                                                       names the holder); only for a store that
                                                                       watches for skew
==========================================  =========  ==============  ===============================================

``op`` is the store method's name: ``claim``, ``renew``, ``release``, ``commit``, ``latest``, ``checkpoint``,
``history``, ``search_history``, ``children``, ``events_after``, ``await_events_after``, ``compact_events``,
``delete_thread``, ``effect``, ``lookup_run``, ``prune``, ``sweep``, ``threads``, ``incomplete``, ``tenants``.

The store's run queue, ``metered.queue``, is metered too, into the same meter: see
:mod:`threadloom.persistence.metrics.metered_queue` (``threadloom_queue_calls_total`` and the rest).

A takeover of a claim whose tenant differs from the request's is counted as ``granted``: the store does not
reveal it to the claimant, so neither does
the meter.

A meter that raises never changes a call's outcome (the call's result or error is what the caller gets); the
first such failure is logged (``metrics.failed``) and every one is counted in
:attr:`MeteredCheckpointer.meter_failures`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

from threadloom.domain.errors import CancelledError, StaleClaim, ThreadBusy, ValidationError
from threadloom.domain.values import EventRecord, RunClaim, SweepPage
from threadloom.persistence.base import OPERATIONS, Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.persistence.logs import get_logger as _safe_logger
from threadloom.persistence.metrics.meter import BoundCounter, InMemoryMeter, Labels, Meter, MetricSpec
from threadloom.persistence.metrics.metered_queue import QUEUE_METRICS, MeteredRunQueue
from threadloom.persistence.queue import RunQueue

_log = _safe_logger("threadloom.metrics")

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
CLOCK_SKEW = "threadloom_clock_skew_detected_total"
ROWS_STAMPED = "threadloom_access_rows_stamped_total"

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
    MetricSpec(
        name=CLOCK_SKEW,
        kind="counter",
        help="Claims or commits read stamped in this process's future beyond the tolerance (SQLite), by store method.",
        labels=("op",),
    ),
    MetricSpec(
        name=ROWS_STAMPED,
        kind="counter",
        help="Rows whose access stamp stamp_thread changed (walks and the follower of tenant-scoped reads).",
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
    """One store method's bound series: ``record(seconds)`` counts a call and observes its latency; ``after``
    records what a successful call's result tells (claim outcome, events committed, sweep page, wait outcome)."""

    __slots__ = ("after", "name", "record")

    def __init__(self, meter: Meter, name: str) -> None:
        self.name = name
        # A duck-typed meter may have only counter() and histogram(): Meter.timer composes those.
        timer = meter.timer if callable(getattr(meter, "timer", None)) else Meter.timer.__get__(meter)
        self.record = timer(CALLS, LATENCY, _OP[name]).record
        self.after: Callable[[Any], None] | None = None


class MeteredCheckpointer(ForwardingCheckpointer):
    """Another store, with every call metered.

    Each public method calls the inner store's public method of the same name with the same arguments and
    returns its result or raises its error unchanged (the inner store validates the call; the wrapper does not);
    the metrics of the module docstring are recorded around it. :meth:`await_events_after` is the inner store's
    own, so a store that wakes on commits still wakes when wrapped. Safe to call from any number of threads, as
    the inner store is. Closing it closes the inner store; :attr:`queue` is the inner store's queue, metered into
    the same meter (:class:`~threadloom.persistence.metrics.metered_queue.MeteredRunQueue`).

    Args:
        inner: the store to meter. The wrapper owns it from now on: :meth:`close` closes it.
        meter: where measurements go; a new :class:`~threadloom.persistence.metrics.meter.InMemoryMeter` when None.
            Several wrappers may share one meter (their counts add up).

    Raises:
        ValidationError: ``inner`` is not a ``Checkpointer``, or ``meter`` has no ``counter``/``histogram``, or
            the meter refused a metric's description (e.g. a Prometheus registry that already holds it).
    """

    def __init__(self, inner: Checkpointer, meter: Meter | None = None) -> None:
        if not isinstance(inner, Checkpointer):  # a wrapper that meters nothing would be no use
            raise ValidationError("inner", (f"must be a Checkpointer, got {type(inner).__name__}",))
        super().__init__(inner)
        self._meter = InMemoryMeter() if meter is None else _check_meter(meter)
        describe = getattr(self._meter, "describe", None)
        if callable(describe):
            for spec in (*STORE_METRICS, *QUEUE_METRICS):
                describe(spec)
        self._failures = 0
        self._failures_lock = threading.Lock()
        # Every series is bound once, here: the hot path then only calls add/observe on it.
        meter = self._meter
        self._ops: dict[str, _Op] = {op: _Op(meter, op) for op in OPERATIONS}
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
        self._ops["claim"].after = self._claimed
        self._ops["commit"].after = self._committed
        self._ops["await_events_after"].after = self._waited
        self._ops["sweep"].after = self._swept
        self._rows_stamped = meter.counter(ROWS_STAMPED)
        self._ops["stamp_thread"].after = self._stamped
        watched: Any = inner
        while watched is not None and getattr(watched, "skew_watch", None) is None:
            watched = getattr(watched, "inner", None)
        if watched is not None:
            skew = {op: meter.counter(CLOCK_SKEW, _OP[op]) for op in ("claim", "commit")}  # the ops that watch
            watched.skew_watch.listeners.append(
                lambda op, _skew_s: self._extra(skew.get(op) or meter.counter(CLOCK_SKEW, _OP[op]))
            )
        inner_queue = inner.queue
        self._queue = None if inner_queue is None else MeteredRunQueue(inner_queue, self._meter, self._meter_failed)

    def __repr__(self) -> str:
        return f"MeteredCheckpointer({self._inner!r}, meter={self._meter!r})"

    @property
    def inner(self) -> Checkpointer:
        """The store every call is delegated to."""
        return self._inner  # type: ignore[return-value]

    @property
    def queue(self) -> RunQueue | None:  # type: ignore[override]
        """The inner store's run queue, every call metered into :attr:`meter`; None when it has none."""
        return self._queue

    @property
    def meter(self) -> Meter:
        """Where this wrapper's measurements go (``meter.snapshot()`` for an ``InMemoryMeter``)."""
        return self._meter

    @property
    def meter_failures(self) -> int:
        """How many times recording into the meter raised (each ignored; the first one logged)."""
        return self._failures

    # -- the call --------------------------------------------------------------------------------------------------

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """The inner store's ``operation``, timed and counted (see the module docstring for what is recorded)."""
        op = self._ops[operation]
        start = perf_counter()
        try:
            result = super()._forward(operation, *args, **kwargs)
        except BaseException as error:
            self._failed(op, start, error)
            raise
        elapsed = perf_counter() - start
        try:
            op.record(elapsed)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)
        if op.after is not None:
            op.after(result)
        return result

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
            elif isinstance(error, CancelledError) and op.name == "await_events_after":
                self._cancelled.add(1)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _extra(self, counter: BoundCounter, amount: float = 1) -> None:
        try:
            counter.add(amount)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _claimed(self, claim: RunClaim) -> None:
        self._extra(self._granted if claim.taken_over_from is None else self._taken_over)

    def _committed(self, records: list[EventRecord]) -> None:
        if records:
            self._extra(self._events_committed, len(records))

    def _waited(self, found: list[EventRecord]) -> None:
        self._extra(self._woken if found else self._timed_out)

    def _stamped(self, changed: int) -> None:
        if changed:
            self._extra(self._rows_stamped, changed)

    def _swept(self, page: SweepPage) -> None:
        self._extra(self._sweep_pages)
        if page.visited:
            self._extra(self._sweep_visited, len(page.visited))
        if page.pruned:
            self._extra(self._sweep_pruned, len(page.pruned))
        if page.reclaimed:
            self._extra(self._sweep_reclaimed, len(page.reclaimed))


__all__ = ["OPERATIONS", "STORE_METRICS", "MeteredCheckpointer"]
