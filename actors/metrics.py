"""The runtime's own metrics: runs, lost claims, the run queue's depth and subscription lag.

``GraphRuntime(store, meter=...)`` records them into the same kind of
:class:`~threadloom.persistence.metrics.meter.Meter` the store wrapper uses (the in-process meter, or the
Prometheus and OpenTelemetry adapters); share one meter between ``MeteredCheckpointer`` and the runtime to export
both. Without a meter nothing is recorded and no call is made for it. docs/operations.md "Metrics" lists them:

==============================================  =======  ============  ==============================================
metric                                          kind     labels        what
==============================================  =======  ============  ==============================================
``threadloom_runs_started_total``               counter  ``graph_id``  runs that admitted new input (a start or a
                                                                       resume): ``run.started``
``threadloom_runs_recovered_total``             counter  ``graph_id``  runs that continued an incomplete run:
                                                                       ``run.recovered``
``threadloom_runs_taken_over_total``            counter  ``graph_id``  runs whose claim took over another run's
                                                                       expired claim (``claim.taken_over``)
``threadloom_runs_completed_total``             counter  ``graph_id``  runs that ended ``COMPLETED``
``threadloom_runs_suspended_total``             counter  ``graph_id``  runs that ended ``SUSPENDED``
``threadloom_runs_failed_total``                counter  ``graph_id``  runs that ended with ``run.failed`` (a node
                                                                       failed, the claim was lost, a store failure)
``threadloom_runs_stopped_total``               counter  ``graph_id``  runs stopped by a cancel, ``close`` or a
                                                                       stopping worker (``run.stopped``)
``threadloom_claims_lost_total``                counter  ``graph_id``  runs that found their claim taken over
                                                                       (``claim.lost``)
``threadloom_queue_depth``                      gauge    —             open run-queue entries (waiting or leased),
                                                                       read by ``serve`` at most once a
                                                                       :data:`QUEUE_SAMPLE_INTERVAL`
``threadloom_queue_oldest_open_age_seconds``    gauge    —             how long the oldest open entry has waited,
                                                                       by the store's clock (0 when none is open)
``threadloom_subscription_lag_events``          gauge    ``node_id``   the most events any of the runtime's
                                                                       subscriptions has read from the store and
                                                                       its consumer not taken yet
==============================================  =======  ============  ==============================================

A meter that raises never changes a run: the first failure is logged (``metrics.failed``), every one is counted in
:attr:`RuntimeMetrics.failures`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from threadloom.actors.logs import log as _log
from threadloom.domain.queue import QueueDepth
from threadloom.persistence.metrics.meter import BoundCounter, BoundGauge, Meter, MetricSpec

RUNS_STARTED = "threadloom_runs_started_total"
RUNS_RECOVERED = "threadloom_runs_recovered_total"
RUNS_TAKEN_OVER = "threadloom_runs_taken_over_total"
RUNS_COMPLETED = "threadloom_runs_completed_total"
RUNS_SUSPENDED = "threadloom_runs_suspended_total"
RUNS_FAILED = "threadloom_runs_failed_total"
RUNS_STOPPED = "threadloom_runs_stopped_total"
CLAIMS_LOST = "threadloom_claims_lost_total"
QUEUE_DEPTH = "threadloom_queue_depth"
QUEUE_OLDEST_AGE = "threadloom_queue_oldest_open_age_seconds"
SUBSCRIPTION_LAG = "threadloom_subscription_lag_events"

QUEUE_SAMPLE_INTERVAL = timedelta(seconds=1)
"""``serve`` reads the queue's depth (``RunQueue.depth``) at most this often, by the runtime's clock."""

_RUN_COUNTERS = {
    "started": (RUNS_STARTED, "Runs that admitted new input (a start or a resume)."),
    "recovered": (RUNS_RECOVERED, "Runs that continued an incomplete run at the node after its last commit."),
    "taken_over": (RUNS_TAKEN_OVER, "Runs whose claim took over another run's expired claim."),
    "completed": (RUNS_COMPLETED, "Runs that ended COMPLETED."),
    "suspended": (RUNS_SUSPENDED, "Runs that ended SUSPENDED, waiting for input."),
    "failed": (RUNS_FAILED, "Runs that ended failed (a node failed, the claim was lost, a store failure)."),
    "stopped": (RUNS_STOPPED, "Runs stopped by a cancel, a runtime's close or a stopping worker."),
    "claim_lost": (CLAIMS_LOST, "Runs that found their claim taken over by another run."),
}

RUNTIME_METRICS: tuple[MetricSpec, ...] = (
    *(MetricSpec(name=name, kind="counter", help=text, labels=("graph_id",)) for name, text in _RUN_COUNTERS.values()),
    MetricSpec(name=QUEUE_DEPTH, kind="gauge", help="Open run-queue entries (waiting or leased)."),
    MetricSpec(
        name=QUEUE_OLDEST_AGE, kind="gauge", unit="s",
        help="How long the oldest open run-queue entry has waited, by the store's clock (0 when none is open).",
    ),
    MetricSpec(
        name=SUBSCRIPTION_LAG, kind="gauge", labels=("node_id",),
        help="The most events a subscription of the runtime has read and its consumer not taken yet.",
    ),
)  # fmt: skip
"""Every metric the runtime records, as described to its meter."""


class RuntimeMetrics:
    """Records a runtime's metrics into ``meter``; with None, every method returns at once.

    Safe to call from any thread. Each method swallows a meter's failure (logged once as ``metrics.failed``).

    Args:
        meter: where measurements go, or None.
        node_id: the runtime's node (the ``node_id`` label of the subscription lag).
    """

    def __init__(self, meter: Meter | None, node_id: str) -> None:
        self.meter = meter
        self._node_id = node_id
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], BoundCounter] = {}
        self._gauges: dict[str, BoundGauge] = {}
        self._failures = 0
        self._next_sample: datetime | None = None
        if meter is not None:

            def describe() -> None:
                for spec in RUNTIME_METRICS:
                    meter.describe(spec)

            self._guard(describe)

    @property
    def enabled(self) -> bool:
        """True when a meter records."""
        return self.meter is not None

    @property
    def failures(self) -> int:
        """How many times recording raised (each ignored; the first logged)."""
        return self._failures

    def _guard(self, record: Callable[[], Any]) -> None:
        try:
            record()
        except Exception as error:  # noqa: BLE001 - a meter must never change a run
            with self._lock:
                self._failures += 1
                first = self._failures == 1
            if first:
                _log.warning(
                    "metrics.failed",
                    error=f"{type(error).__name__}: {error}",
                    meter=type(self.meter).__name__,
                    note="runs are unaffected; further meter failures are counted, not logged",
                )

    def _gauge(self, name: str) -> BoundGauge:
        gauge = self._gauges.get(name)
        if gauge is None:
            assert self.meter is not None
            labels = (("node_id", self._node_id),) if name == SUBSCRIPTION_LAG else ()
            gauge = self._gauges[name] = self.meter.gauge(name, labels)
        return gauge

    def run(self, what: str, graph_id: str) -> None:
        """Counts one run event: ``started``, ``recovered``, ``taken_over``, ``completed``, ``suspended``,
        ``failed``, ``stopped`` or ``claim_lost``, for a run of ``graph_id``."""
        meter = self.meter
        if meter is None:
            return

        def record() -> None:
            key = (what, graph_id)
            counter = self._runs.get(key)
            if counter is None:
                counter = self._runs[key] = meter.counter(_RUN_COUNTERS[what][0], (("graph_id", graph_id),))
            counter.add(1)

        self._guard(record)

    def queue_due(self, now: datetime) -> bool:
        """True when the queue's depth should be read now (a meter records, and :data:`QUEUE_SAMPLE_INTERVAL`
        passed since the last reading); claims the reading, so concurrent workers read it once."""
        if self.meter is None:
            return False
        with self._lock:
            if self._next_sample is not None and now < self._next_sample:
                return False
            self._next_sample = now + QUEUE_SAMPLE_INTERVAL
            return True

    def queue_depth(self, depth: QueueDepth) -> None:
        """Sets the queue gauges from one ``RunQueue.depth`` reading."""
        if self.meter is None:
            return
        age = depth.oldest_age

        def record() -> None:
            self._gauge(QUEUE_DEPTH).set(depth.open)
            self._gauge(QUEUE_OLDEST_AGE).set(age.total_seconds() if age is not None else 0.0)

        self._guard(record)

    def subscription_lag(self, lag: int) -> None:
        """Sets the subscription lag gauge (the most events any subscription holds undelivered)."""
        if self.meter is None:
            return
        self._guard(lambda: self._gauge(SUBSCRIPTION_LAG).set(lag))


__all__ = [
    "CLAIMS_LOST",
    "QUEUE_DEPTH",
    "QUEUE_OLDEST_AGE",
    "QUEUE_SAMPLE_INTERVAL",
    "RUNS_COMPLETED",
    "RUNS_FAILED",
    "RUNS_RECOVERED",
    "RUNS_STARTED",
    "RUNS_STOPPED",
    "RUNS_SUSPENDED",
    "RUNS_TAKEN_OVER",
    "RUNTIME_METRICS",
    "SUBSCRIPTION_LAG",
    "RuntimeMetrics",
]
