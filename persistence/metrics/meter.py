"""The ``Meter`` interface and its in-process default, :class:`InMemoryMeter`.

A meter keeps three kinds of metric, each named, with series told apart by labels:

- a monotonic **counter**: ``meter.counter(name, labels).add(amount)`` (amount ≥ 0);
- a **histogram**: ``meter.histogram(name, labels).observe(value)`` (``value`` in the metric's unit, seconds
  for latency);
- a **gauge**: ``meter.gauge(name, labels).set(value)``, a reading that goes up and down (a queue's depth); the
  last value set is the series' value.

``counter``/``histogram`` return a *bound* series: instrumented code binds each series once and then only calls
``add``/``observe``, which keeps recording cheap; ``meter.timer(calls, latency, labels)`` binds a calls counter
and a latency histogram whose ``record(seconds)`` updates both at once, and ``meter.add(name, amount, labels)``
and ``meter.observe(name, value, labels)`` are one-off shorthands. Labels are a tuple of ``(key, value)`` string
pairs, e.g. ``(("op", "commit"),)``; their order does not matter. Instrumented code may first call
``describe(spec)`` once per metric, so a meter that registers instruments up front (Prometheus, OpenTelemetry)
does so with the right help text, label names, unit and buckets. The metrics the store decorator records are
listed in :mod:`threadloom.persistence.metrics.metered`.

Adapters for ``prometheus_client`` (:mod:`threadloom.persistence.metrics.prometheus`) and OpenTelemetry
(:mod:`threadloom.persistence.metrics.otel`) need the ``metrics`` extra; this module needs nothing beyond the
standard library and attrs.
"""

from __future__ import annotations

import abc
import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol

import attrs

from threadloom.domain.errors import ValidationError

Labels = tuple[tuple[str, str], ...]
"""A metric's labels: ``(key, value)`` pairs of strings; order does not matter."""

LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
"""Upper bounds, in seconds, of the latency histogram buckets (100 µs to 30 s; ``+Inf`` is implied)."""


def _labels(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _check_kind(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in ("counter", "histogram", "gauge"):
        raise ValidationError("spec.kind", (f"must be 'counter', 'histogram' or 'gauge', got {value!r}",))


def _check_buckets(_inst: Any, _attr: Any, value: Any) -> None:
    if value is None:
        return
    if not value or any(not math.isfinite(b) for b in value) or list(value) != sorted(set(value)):
        raise ValidationError("spec.buckets", ("must be finite upper bounds in strictly increasing order",))


@attrs.frozen(kw_only=True)
class MetricSpec:
    """What a metric is, told to a meter by :meth:`Meter.describe` before it is recorded.

    Attributes:
        name: the metric's name, Prometheus style (``threadloom_store_calls_total``; a counter ends in
            ``_total``).
        kind: ``"counter"``, ``"histogram"`` or ``"gauge"``.
        help: one sentence saying what it counts or measures.
        labels: the label keys every recording of it carries, in a fixed order.
        unit: the unit of a histogram's observations or a gauge's values (``"s"`` for seconds), ``""`` for
            counts.
        buckets: a histogram's bucket upper bounds (strictly increasing, ``+Inf`` implied); None for a counter,
            or for a histogram: :data:`LATENCY_BUCKETS`.
    """

    name: str
    kind: Literal["counter", "histogram", "gauge"] = attrs.field(validator=_check_kind)
    help: str
    labels: tuple[str, ...] = attrs.field(default=(), converter=_labels)
    unit: str = ""
    buckets: tuple[float, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple), validator=_check_buckets
    )

    @property
    def bucket_bounds(self) -> tuple[float, ...]:
        """The histogram's finite bucket bounds: :attr:`buckets`, or :data:`LATENCY_BUCKETS` when None."""
        return self.buckets if self.buckets is not None else LATENCY_BUCKETS


class BoundCounter(Protocol):
    """One series of a counter, its labels fixed: what :meth:`Meter.counter` returns."""

    def add(self, amount: float = 1) -> None:
        """Adds ``amount`` (≥ 0)."""


class BoundHistogram(Protocol):
    """One series of a histogram, its labels fixed: what :meth:`Meter.histogram` returns."""

    def observe(self, value: float) -> None:
        """Records ``value``, in the metric's unit."""


class BoundGauge(Protocol):
    """One series of a gauge, its labels fixed: what :meth:`Meter.gauge` returns."""

    def set(self, value: float) -> None:
        """Sets the series' value to ``value``, in the metric's unit."""


class BoundTimer(Protocol):
    """A calls counter and a latency histogram of the same labels, recorded together: :meth:`Meter.timer`."""

    def record(self, seconds: float) -> None:
        """Adds 1 to the counter and observes ``seconds`` in the histogram."""


class _Timer:
    """The default :class:`BoundTimer`: its two bound series, one after the other."""

    __slots__ = ("_add", "_observe")

    def __init__(self, counter: BoundCounter, histogram: BoundHistogram) -> None:
        self._add = counter.add
        self._observe = histogram.observe

    def record(self, seconds: float) -> None:
        self._add(1)
        self._observe(seconds)


class Meter(abc.ABC):
    """Where measurements go: counters and histograms, named and labelled.

    A meter hands out *bound* series (:meth:`counter`, :meth:`histogram`): instrumented code looks each series
    up once and then only calls ``add``/``observe`` on it, so recording costs little inside every store call.
    Implementations must be safe to call from any number of threads at once and should not raise: a
    :class:`~threadloom.persistence.metrics.metered.MeteredCheckpointer` never lets a meter's failure change a store
    call's outcome, but it logs it.
    """

    def describe(self, spec: MetricSpec) -> None:  # noqa: B027 - optional hook, no-op by default
        """Announces a metric before it is first recorded (idempotent; the default does nothing).

        Args:
            spec: the metric's name, kind, help text, label keys, unit and buckets.

        Raises:
            ValidationError: the meter already knows ``spec.name`` as a different kind or with other labels.
        """

    @abc.abstractmethod
    def counter(self, name: str, labels: Labels = ()) -> BoundCounter:
        """The series ``labels`` of counter ``name`` (the same series for the same arguments).

        Raises:
            ValidationError: ``name`` is known as a histogram, or ``labels`` do not fit its label keys.
        """

    @abc.abstractmethod
    def histogram(self, name: str, labels: Labels = ()) -> BoundHistogram:
        """The series ``labels`` of histogram ``name`` (the same series for the same arguments).

        Raises:
            ValidationError: ``name`` is known as a counter, or ``labels`` do not fit its label keys.
        """

    def gauge(self, name: str, labels: Labels = ()) -> BoundGauge:
        """The series ``labels`` of gauge ``name`` (the same series for the same arguments).

        The meters of this package keep gauges; this default, for a meter written before gauges existed,
        refuses: the runtime then logs ``metrics.failed`` once and records its counters all the same.

        Raises:
            ValidationError: the meter keeps no gauges, ``name`` is known as another kind, or ``labels`` do not
                fit its label keys.
        """
        raise ValidationError("name", (f"{type(self).__name__} keeps no gauges (cannot record {name!r})",))

    def timer(self, calls: str, latency: str, labels: Labels = ()) -> BoundTimer:
        """The series ``labels`` of counter ``calls`` and of histogram ``latency``, recorded together.

        ``timer(...).record(seconds)`` is ``counter(calls, labels).add(1)`` and
        ``histogram(latency, labels).observe(seconds)``; a meter may do both at once, more cheaply (the
        in-memory meter takes its lock once).
        """
        return _Timer(self.counter(calls, labels), self.histogram(latency, labels))

    def add(self, name: str, amount: float = 1, labels: Labels = ()) -> None:
        """Adds ``amount`` (≥ 0) to the series ``labels`` of counter ``name`` (a one-off; bind for hot paths)."""
        self.counter(name, labels).add(amount)

    def observe(self, name: str, value: float, labels: Labels = ()) -> None:
        """Records ``value`` into the series ``labels`` of histogram ``name`` (a one-off; bind for hot paths)."""
        self.histogram(name, labels).observe(value)


# -- the in-process default -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HistogramSnapshot:
    """One histogram series at the moment of a snapshot.

    Attributes:
        count: how many observations were recorded.
        sum: their sum, in the metric's unit.
        buckets: ``(upper_bound, cumulative_count)`` pairs in increasing bound order, Prometheus style: each
            count includes every observation ``<= upper_bound``; the last pair's bound is ``math.inf`` and its
            count equals :attr:`count`.
    """

    count: int
    sum: float
    buckets: tuple[tuple[float, int], ...]

    @property
    def mean(self) -> float:
        """``sum / count`` (0.0 when empty)."""
        return self.sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """An upper bound of the ``q`` quantile (0 < q ≤ 1): the bound of the first bucket holding it.

        Returns:
            The smallest bucket bound that at least ``q`` of the observations are ``<=``; ``math.inf`` when that
            is only the ``+Inf`` bucket, and 0.0 for an empty histogram.

        Raises:
            ValidationError: ``q`` is not in (0, 1].
        """
        if not isinstance(q, (int, float)) or not 0 < q <= 1:
            raise ValidationError("q", (f"must be in (0, 1], got {q!r}",))
        if not self.count:
            return 0.0
        wanted = q * self.count
        for bound, cumulative in self.buckets:
            if cumulative >= wanted:
                return bound
        return math.inf

    def merged(self, other: HistogramSnapshot) -> HistogramSnapshot:
        """This series plus ``other`` (same bounds), e.g. to total a histogram over its labels."""
        if [b for b, _ in self.buckets] != [b for b, _ in other.buckets]:
            raise ValidationError("other", ("has other bucket bounds",))
        return HistogramSnapshot(
            count=self.count + other.count,
            sum=self.sum + other.sum,
            buckets=tuple((b, n + m) for (b, n), (_, m) in zip(self.buckets, other.buckets, strict=True)),
        )


def _matches(labels: Labels, wanted: Mapping[str, str]) -> bool:
    if not wanted:
        return True
    have = dict(labels)
    return all(have.get(key) == value for key, value in wanted.items())


def _json_number(value: float) -> float | str:
    return "+Inf" if value == math.inf else value


@attrs.frozen(kw_only=True)
class MeterSnapshot:
    """Everything an :class:`InMemoryMeter` recorded, as plain data (a copy: later recordings do not change it).

    Attributes:
        counters: ``(name, labels)`` → value, ``labels`` being sorted ``(key, value)`` pairs.
        histograms: ``(name, labels)`` → :class:`HistogramSnapshot`.
        gauges: ``(name, labels)`` → the last value set (series never set are left out).
    """

    counters: Mapping[tuple[str, Labels], float]
    histograms: Mapping[tuple[str, Labels], HistogramSnapshot]
    gauges: Mapping[tuple[str, Labels], float] = attrs.field(factory=dict)

    def counter(self, name: str, **labels: str) -> float:
        """The total of counter ``name`` over every series whose labels include ``labels``; 0 if none.

        ``snapshot.counter("threadloom_store_calls_total")`` counts every call, and
        ``snapshot.counter("threadloom_store_calls_total", op="commit")`` only the commits.
        """
        return sum(
            value for (key, series), value in self.counters.items() if key == name and _matches(series, labels)
        )

    def gauge(self, name: str, **labels: str) -> float | None:
        """The largest value of gauge ``name`` among the series whose labels include ``labels``; None if none
        was set."""
        values = [v for (key, series), v in self.gauges.items() if key == name and _matches(series, labels)]
        return max(values) if values else None

    def histogram(self, name: str, **labels: str) -> HistogramSnapshot | None:
        """Histogram ``name`` merged over every series whose labels include ``labels``; None if none."""
        out: HistogramSnapshot | None = None
        for (key, series), value in self.histograms.items():
            if key == name and _matches(series, labels):
                out = value if out is None else out.merged(value)
        return out

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        """JSON-ready plain data, sorted by name then labels.

        Returns:
            ``{"counters": [{"name", "labels", "value"}], "histograms": [{"name", "labels", "count", "sum",
            "buckets": [[upper_bound, cumulative_count], …]}], "gauges": [{"name", "labels", "value"}]}``, the
            last bound written ``"+Inf"``.
        """
        return {
            "gauges": [
                {"name": name, "labels": dict(labels), "value": value}
                for (name, labels), value in sorted(self.gauges.items())
            ],
            "counters": [
                {"name": name, "labels": dict(labels), "value": value}
                for (name, labels), value in sorted(self.counters.items())
            ],
            "histograms": [
                {
                    "name": name,
                    "labels": dict(labels),
                    "count": h.count,
                    "sum": h.sum,
                    "buckets": [[_json_number(bound), n] for bound, n in h.buckets],
                }
                for (name, labels), h in sorted(self.histograms.items(), key=lambda item: item[0])
            ],
        }


class _CounterSeries:
    """A bound counter series of an :class:`InMemoryMeter`; updated under the meter's lock."""

    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value: float = 0

    def add(self, amount: float = 1) -> None:
        lock = self._lock  # acquire/release: half the cost of ``with`` on this hot path
        lock.acquire()
        try:
            self.value += amount
        finally:
            lock.release()


class _GaugeSeries:
    """A bound gauge series of an :class:`InMemoryMeter`; updated under the meter's lock."""

    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value: float | None = None  # None until first set

    def set(self, value: float) -> None:
        with self._lock:
            self.value = value


class _HistogramSeries:
    """A bound histogram series of an :class:`InMemoryMeter`; updated under the meter's lock."""

    __slots__ = ("_lock", "bounds", "counts", "count", "sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is the +Inf bucket
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        index = bisect_left(self.bounds, value)  # the first bound >= value: upper bounds are inclusive
        lock = self._lock
        lock.acquire()
        try:
            self.counts[index] += 1
            self.count += 1
            self.sum += value
        finally:
            lock.release()

    def snapshot(self) -> HistogramSnapshot:
        running, pairs = 0, []
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            pairs.append((bound, running))
        return HistogramSnapshot(count=self.count, sum=self.sum, buckets=tuple(pairs))

    def clear(self) -> None:
        self.counts = [0] * len(self.counts)
        self.count = 0
        self.sum = 0.0


class _TimerSeries:
    """A calls counter and a latency histogram of an :class:`InMemoryMeter`, updated together."""

    __slots__ = ("_counter", "_histogram", "_lock", "_bounds")

    def __init__(self, lock: threading.Lock, counter: _CounterSeries, histogram: _HistogramSeries) -> None:
        self._lock = lock
        self._counter = counter
        self._histogram = histogram
        self._bounds = histogram.bounds

    def record(self, seconds: float) -> None:
        index = bisect_left(self._bounds, seconds)
        histogram = self._histogram
        lock = self._lock
        lock.acquire()
        try:
            self._counter.value += 1
            histogram.counts[index] += 1
            histogram.count += 1
            histogram.sum += seconds
        finally:
            lock.release()


def _normalize(labels: Labels) -> Labels:
    return labels if len(labels) < 2 else tuple(sorted(labels))


class InMemoryMeter(Meter):
    """Keeps every counter, histogram and gauge in this process; :meth:`snapshot` reads them (tests, the CLI).

    Thread-safe: one lock guards every series, so a snapshot is consistent across series. A histogram uses the
    buckets of its :class:`MetricSpec` when it was described, else :data:`LATENCY_BUCKETS`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, MetricSpec] = {}
        self._kinds: dict[str, str] = {}
        self._counters: dict[tuple[str, Labels], _CounterSeries] = {}
        self._histograms: dict[tuple[str, Labels], _HistogramSeries] = {}
        self._gauges: dict[tuple[str, Labels], _GaugeSeries] = {}

    def __repr__(self) -> str:
        return f"InMemoryMeter({len(self._counters)} counter series, {len(self._histograms)} histogram series)"

    def describe(self, spec: MetricSpec) -> None:
        """Remembers ``spec`` (its buckets are used for the histogram's series).

        Raises:
            ValidationError: ``spec.name`` was described before as something else, or used as another kind.
        """
        if not isinstance(spec, MetricSpec):
            raise ValidationError("spec", (f"must be a MetricSpec, got {type(spec).__name__}",))
        with self._lock:
            known = self._specs.setdefault(spec.name, spec)
            kind = self._kinds.setdefault(spec.name, spec.kind)
        if known != spec:
            raise ValidationError("spec", (f"metric {spec.name!r} was described before as {known!r}",))
        if kind != spec.kind:
            raise ValidationError("spec", (f"metric {spec.name!r} was recorded before as a {kind}",))

    def _kind(self, name: str, kind: str) -> None:  # lock held
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise ValidationError("name", (f"metric {name!r} is a {known}, not a {kind}",))

    def counter(self, name: str, labels: Labels = ()) -> BoundCounter:
        """The series ``labels`` of counter ``name``, made on first use."""
        key = (name, _normalize(labels))
        series = self._counters.get(key)
        if series is None:
            with self._lock:
                self._kind(name, "counter")
                series = self._counters.setdefault(key, _CounterSeries(self._lock))
        return series

    def histogram(self, name: str, labels: Labels = ()) -> BoundHistogram:
        """The series ``labels`` of histogram ``name``, made on first use with the described buckets."""
        key = (name, _normalize(labels))
        series = self._histograms.get(key)
        if series is None:
            with self._lock:
                self._kind(name, "histogram")
                series = self._histograms.get(key)
                if series is None:
                    spec = self._specs.get(name)
                    bounds = spec.bucket_bounds if spec is not None else LATENCY_BUCKETS
                    series = self._histograms[key] = _HistogramSeries(self._lock, bounds)
        return series

    def gauge(self, name: str, labels: Labels = ()) -> BoundGauge:
        """The series ``labels`` of gauge ``name``, made on first use (left out of snapshots until set)."""
        key = (name, _normalize(labels))
        series = self._gauges.get(key)
        if series is None:
            with self._lock:
                self._kind(name, "gauge")
                series = self._gauges.setdefault(key, _GaugeSeries(self._lock))
        return series

    def timer(self, calls: str, latency: str, labels: Labels = ()) -> BoundTimer:
        """Counter ``calls`` and histogram ``latency`` of series ``labels``, updated under one lock acquisition."""
        counter, histogram = self.counter(calls, labels), self.histogram(latency, labels)
        return _TimerSeries(self._lock, counter, histogram)  # type: ignore[arg-type]

    def snapshot(self) -> MeterSnapshot:
        """A copy of everything recorded so far (see :class:`MeterSnapshot`), consistent across series.

        Series that were bound but never recorded into (zero) are left out.
        """
        with self._lock:
            return MeterSnapshot(
                counters={key: series.value for key, series in self._counters.items() if series.value},
                histograms={key: series.snapshot() for key, series in self._histograms.items() if series.count},
                gauges={key: series.value for key, series in self._gauges.items() if series.value is not None},
            )

    def reset(self) -> None:
        """Sets every series back to zero (bound series stay bound, described metrics stay described)."""
        with self._lock:
            for counter in self._counters.values():
                counter.value = 0
            for histogram in self._histograms.values():
                histogram.clear()
            for gauge in self._gauges.values():
                gauge.value = None


def labels_of(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """``pairs`` as sorted :data:`Labels`, e.g. ``labels_of({"op": "commit"}) == (("op", "commit"),)``."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(sorted((str(key), str(value)) for key, value in items))


__all__ = [
    "LATENCY_BUCKETS",
    "BoundCounter",
    "BoundGauge",
    "BoundHistogram",
    "BoundTimer",
    "HistogramSnapshot",
    "InMemoryMeter",
    "Labels",
    "Meter",
    "MeterSnapshot",
    "MetricSpec",
    "labels_of",
]
