"""``OpenTelemetryMeter``: a :class:`~threadloom.persistence.metrics.meter.Meter` over the OpenTelemetry metrics API.

Needs the ``metrics`` extra (``opentelemetry-api``) and, to export anything, an OpenTelemetry SDK configured by
the application (``opentelemetry-sdk`` and an exporter or reader); the library never configures one. The API is
imported when a meter is built, never when this module is imported.

Names: a counter ``x_total`` becomes the OpenTelemetry ``Counter`` ``x`` (OpenTelemetry's convention: the
``_total`` suffix is added by a Prometheus exporter, not by the instrument); a histogram keeps its name, with
its spec's unit (``"s"``) and its bucket bounds as the advisory explicit bucket boundaries; a gauge becomes a
synchronous ``Gauge`` of the same name (an API without ``create_gauge``, before 1.23, refuses gauges with a
``ValidationError``). Labels become attributes.
"""

from __future__ import annotations

import threading
from typing import Any

from threadloom.domain.errors import ValidationError
from threadloom.persistence.metrics.meter import BoundCounter, BoundGauge, BoundHistogram, Labels, Meter, MetricSpec


def _import_metrics_api() -> Any:
    try:
        from opentelemetry import metrics
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ValidationError(
            "meter",
            (f"OpenTelemetryMeter needs the metrics extra (pip install 'threadloom[metrics]'): {error}",),
        ) from error
    return metrics


def instrument_name(spec: MetricSpec) -> str:
    """The OpenTelemetry instrument name of ``spec``: a counter's ``_total`` suffix dropped, else its name."""
    if spec.kind == "counter" and spec.name.endswith("_total"):
        return spec.name[: -len("_total")]
    return spec.name


class OpenTelemetryMeter(Meter):
    """Records into OpenTelemetry instruments of one ``opentelemetry.metrics.Meter``.

    Args:
        meter_provider: the ``MeterProvider`` to get the meter from; None for the global one
            (``opentelemetry.metrics.get_meter_provider()``, a no-op until the application sets one).
        scope: the instrumentation scope name of the meter.

    Raises:
        ValidationError: ``opentelemetry-api`` is not installed.
    """

    def __init__(self, meter_provider: Any = None, *, scope: str = "threadloom") -> None:
        metrics = _import_metrics_api()
        self._otel = metrics.get_meter(scope, _version(), meter_provider=meter_provider)
        self._lock = threading.Lock()
        self._specs: dict[str, MetricSpec] = {}
        self._instruments: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"OpenTelemetryMeter({len(self._instruments)} instruments)"

    def describe(self, spec: MetricSpec) -> None:
        """Creates the instrument of ``spec`` (once; describing it again does nothing).

        Raises:
            ValidationError: ``spec.name`` was described before as something else.
        """
        with self._lock:
            self._ensure(spec)

    def _ensure(self, spec: MetricSpec) -> Any:
        known = self._specs.get(spec.name)
        if known is not None:
            if known != spec:
                raise ValidationError("spec", (f"metric {spec.name!r} was described before as {known!r}",))
            return self._instruments[spec.name]
        name = instrument_name(spec)
        if spec.kind == "counter":
            instrument = self._otel.create_counter(name, unit=spec.unit or "1", description=spec.help)
        elif spec.kind == "gauge":
            create_gauge = getattr(self._otel, "create_gauge", None)
            if create_gauge is None:
                raise ValidationError("spec", (f"this OpenTelemetry API has no synchronous gauge for {name!r}",))
            instrument = create_gauge(name, unit=spec.unit or "1", description=spec.help)
        else:
            try:
                instrument = self._otel.create_histogram(
                    name,
                    unit=spec.unit,
                    description=spec.help,
                    explicit_bucket_boundaries_advisory=list(spec.bucket_bounds),
                )
            except TypeError:  # an API older than the bucket advisory: the SDK's default buckets apply
                instrument = self._otel.create_histogram(name, unit=spec.unit, description=spec.help)
        self._specs[spec.name] = spec
        self._instruments[spec.name] = instrument
        return instrument

    def _instrument(self, name: str, kind: str) -> Any:
        instrument = self._instruments.get(name)
        if instrument is not None:
            spec = self._specs[name]
            if spec.kind != kind:
                raise ValidationError("name", (f"metric {name!r} is a {spec.kind}, not a {kind}",))
            return instrument
        with self._lock:
            if name in self._specs:
                return self._instruments[name]
            return self._ensure(MetricSpec(name=name, kind=kind, help=name))  # type: ignore[arg-type]

    def counter(self, name: str, labels: Labels = ()) -> BoundCounter:
        """The ``Counter`` for ``name`` (made on first use), bound to the attributes ``dict(labels)``."""
        return _Bound(self._instrument(name, "counter").add, dict(labels))

    def histogram(self, name: str, labels: Labels = ()) -> BoundHistogram:
        """The ``Histogram`` for ``name`` (made on first use), bound to the attributes ``dict(labels)``."""
        return _Bound(self._instrument(name, "histogram").record, dict(labels))

    def gauge(self, name: str, labels: Labels = ()) -> BoundGauge:
        """The ``Gauge`` for ``name`` (made on first use), bound to the attributes ``dict(labels)``."""
        return _Bound(self._instrument(name, "gauge").set, dict(labels))


class _Bound:
    """An instrument bound to one attribute set: ``add``/``observe``/``set`` call ``Counter.add``,
    ``Histogram.record`` or ``Gauge.set``."""

    __slots__ = ("_attributes", "_record")

    def __init__(self, record: Any, attributes: dict[str, str]) -> None:
        self._record = record
        self._attributes = attributes

    def add(self, amount: float = 1) -> None:
        self._record(amount, attributes=self._attributes)

    def observe(self, value: float) -> None:
        self._record(value, attributes=self._attributes)

    def set(self, value: float) -> None:
        self._record(value, attributes=self._attributes)


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("threadloom")
    except Exception:  # not installed as a distribution (a source checkout): the scope carries no version
        return None


__all__ = ["OpenTelemetryMeter", "instrument_name"]
