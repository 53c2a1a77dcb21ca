"""``MeteredRunQueue``: every call of a store's run queue, metered like the store's own calls.

:class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer` exposes its inner store's queue through this
wrapper (``metered.queue``), recording into the same meter:

==========================================  =========  ==============  ===============================================
metric                                      kind       labels          what
==========================================  =========  ==============  ===============================================
``threadloom_queue_calls_total``            counter    ``op``          calls of each queue method, failed ones included
``threadloom_queue_errors_total``           counter    ``op, error``   calls that raised, by the error's class name
                                                                       (``StaleLease``, ``ValidationError``, …)
``threadloom_queue_call_seconds``           histogram  ``op``          each call's latency in seconds
                                                                       (``time.perf_counter``), failed ones included
``threadloom_queue_leases_total``           counter    ``outcome``     ``lease`` and ``take_lease`` results:
                                                                       ``granted``, ``taken_over`` (it replaced an
                                                                       expired or fenced lease), ``none`` (nothing
                                                                       leasable; ``take_lease``: nothing changed)
``threadloom_queue_finished_total``         counter    ``status``      entries ``finish`` closed: ``completed``,
                                                                       ``failed`` (a quiet retry counts again)
``threadloom_queue_purged_total``           counter    —               finished entries ``purge`` deleted
==========================================  =========  ==============  ===============================================

``op`` is the queue method's name (:data:`~threadloom.persistence.queue.QUEUE_OPERATIONS`): ``enqueue``,
``lease``, ``renew_lease``, ``record_run``, ``finish``, ``release_lease``, ``take_lease``, ``retry``, ``entry``,
``entries``, ``open_runs``, ``purge``. A meter that raises never changes a call's outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueEntry
from threadloom.persistence.forwarding import ForwardingRunQueue
from threadloom.persistence.metrics.meter import BoundCounter, Labels, Meter, MetricSpec
from threadloom.persistence.queue import QUEUE_OPERATIONS, RunQueue

QUEUE_CALLS = "threadloom_queue_calls_total"
QUEUE_ERRORS = "threadloom_queue_errors_total"
QUEUE_LATENCY = "threadloom_queue_call_seconds"
QUEUE_LEASES = "threadloom_queue_leases_total"
QUEUE_FINISHED = "threadloom_queue_finished_total"
QUEUE_PURGED = "threadloom_queue_purged_total"

QUEUE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        name=QUEUE_CALLS, kind="counter", help="Run-queue calls, by queue method (failed calls included).",
        labels=("op",),
    ),
    MetricSpec(
        name=QUEUE_ERRORS, kind="counter", help="Run-queue calls that raised, by queue method and error class.",
        labels=("op", "error"),
    ),
    MetricSpec(
        name=QUEUE_LATENCY, kind="histogram", help="Run-queue call latency in seconds, by queue method.",
        labels=("op",), unit="s",
    ),
    MetricSpec(
        name=QUEUE_LEASES, kind="counter", help="Lease outcomes: granted, taken_over, none.", labels=("outcome",)
    ),
    MetricSpec(
        name=QUEUE_FINISHED, kind="counter", help="Entries finished, by status (completed, failed).",
        labels=("status",),
    ),
    MetricSpec(name=QUEUE_PURGED, kind="counter", help="Finished entries deleted by purge."),
)
"""The metrics :class:`MeteredRunQueue` records (see the module docstring)."""


def _outcome(value: str) -> Labels:
    return (("outcome", value),)


class MeteredRunQueue(ForwardingRunQueue):
    """A run queue with every call metered; built by ``MeteredCheckpointer.queue``.

    Each public method calls the inner queue's method of the same name and returns its result or raises its
    error unchanged; the metrics of the module docstring are recorded around it, into ``meter`` (whose metrics
    the caller has described). Safe to call from any number of threads, as the inner queue is.

    Args:
        inner: the queue to meter.
        meter: where measurements go.
        failed: called with the exception when recording into the meter raised (the call is unaffected).
    """

    def __init__(self, inner: RunQueue, meter: Meter, failed: Callable[[Exception], None]) -> None:
        super().__init__(inner)
        self._meter = meter
        self._meter_failed = failed
        timer = meter.timer if callable(getattr(meter, "timer", None)) else Meter.timer.__get__(meter)
        self._timers = {op: timer(QUEUE_CALLS, QUEUE_LATENCY, (("op", op),)) for op in QUEUE_OPERATIONS}
        self._leases = {name: meter.counter(QUEUE_LEASES, _outcome(name)) for name in ("granted", "taken_over", "none")}
        self._finished = {
            status: meter.counter(QUEUE_FINISHED, (("status", status.value),))
            for status in (EntryStatus.COMPLETED, EntryStatus.FAILED)
        }
        self._purged = meter.counter(QUEUE_PURGED)
        self._errors: dict[tuple[str, str], BoundCounter] = {}

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        start = perf_counter()
        try:
            result = super()._forward(operation, *args, **kwargs)
        except BaseException as error:
            self._record(operation, start, error)
            raise
        self._record(operation, start, None)
        try:
            self._after(operation, result)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)
        return result

    def _record(self, operation: str, start: float, error: BaseException | None) -> None:
        try:
            self._timers[operation].record(perf_counter() - start)
            if error is not None:
                key = (operation, type(error).__name__)
                errors = self._errors.get(key)
                if errors is None:
                    errors = self._errors[key] = self._meter.counter(
                        QUEUE_ERRORS, (("error", key[1]), ("op", key[0]))
                    )
                errors.add(1)
        except Exception as failure:  # a meter must never change a call's outcome
            self._meter_failed(failure)

    def _after(self, operation: str, result: Any) -> None:
        if operation in ("lease", "take_lease"):
            if result is None:
                self._leases["none"].add(1)
            elif isinstance(result, Lease):
                self._leases["granted" if result.taken_over_from is None else "taken_over"].add(1)
        elif operation == "finish" and isinstance(result, QueueEntry) and result.status in self._finished:
            self._finished[result.status].add(1)
        elif operation == "purge" and isinstance(result, PurgePage) and result.purged:
            self._purged.add(len(result.purged))


__all__ = ["QUEUE_METRICS", "MeteredRunQueue"]
