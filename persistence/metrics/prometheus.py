"""``PrometheusMeter``: a :class:`~threadloom.persistence.metrics.meter.Meter` over ``prometheus_client``.

Needs the ``metrics`` extra (``pip install 'threadloom[metrics]'``); ``prometheus_client`` is imported when a
meter is built, never when this module is imported. Each metric becomes a ``prometheus_client`` ``Counter``,
``Histogram`` or ``Gauge`` of the same name in the meter's registry (a counter ``x_total`` is exposed as
``x_total``, plus the ``x_created`` sample ``prometheus_client`` adds), with the label names, help text and
buckets of its :class:`~threadloom.persistence.metrics.meter.MetricSpec`. Serve the registry with
:meth:`PrometheusMeter.serve` (what ``threadloom demo --metrics-port`` is meant to use),
``prometheus_client.start_http_server``, or any exposition of your own.
"""

from __future__ import annotations

import threading
from typing import Any

from threadloom.domain.errors import ValidationError
from threadloom.persistence.metrics.meter import BoundCounter, BoundGauge, BoundHistogram, Labels, Meter, MetricSpec


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ValidationError(
            "meter", (f"PrometheusMeter needs the metrics extra (pip install 'threadloom[metrics]'): {error}",)
        ) from error
    return prometheus_client


class PrometheusMeter(Meter):
    """Records into a ``prometheus_client`` registry.

    One meter per registry: share it between every store you meter (their counts add up). A metric recorded
    without being described first is created on first use, with its labels' keys as label names.

    Args:
        registry: the ``prometheus_client.CollectorRegistry`` to register the metrics in; None for
            ``prometheus_client.REGISTRY`` (what ``start_http_server`` serves by default).

    Raises:
        ValidationError: ``prometheus_client`` is not installed.
    """

    def __init__(self, registry: Any = None) -> None:
        self._prom = _import_prometheus()
        self._registry = self._prom.REGISTRY if registry is None else registry
        self._lock = threading.Lock()
        self._metrics: dict[str, tuple[MetricSpec, Any]] = {}
        self._children: dict[tuple[str, str, Labels], Any] = {}

    def __repr__(self) -> str:
        return f"PrometheusMeter({len(self._metrics)} metrics)"

    @property
    def registry(self) -> Any:
        """The registry the metrics live in."""
        return self._registry

    def describe(self, spec: MetricSpec) -> None:
        """Registers ``spec`` as a ``Counter`` or ``Histogram`` (once; describing it again does nothing).

        Raises:
            ValidationError: ``spec.name`` was described before as something else, or the registry already
                holds a metric of that name that this meter did not create (use one meter per registry).
        """
        with self._lock:
            self._ensure(spec)

    def _ensure(self, spec: MetricSpec) -> Any:
        known = self._metrics.get(spec.name)
        if known is not None:
            if known[0] != spec:
                raise ValidationError("spec", (f"metric {spec.name!r} was described before as {known[0]!r}",))
            return known[1]
        try:
            if spec.kind == "counter":
                metric = self._prom.Counter(spec.name, spec.help, spec.labels, registry=self._registry)
            elif spec.kind == "gauge":
                metric = self._prom.Gauge(spec.name, spec.help, spec.labels, registry=self._registry)
            else:
                metric = self._prom.Histogram(
                    spec.name, spec.help, spec.labels, registry=self._registry, buckets=spec.bucket_bounds
                )
        except ValueError as error:  # "Duplicated timeseries in CollectorRegistry", a bad name or label
            raise ValidationError(
                "registry",
                (f"cannot register {spec.name!r} ({error}); use one PrometheusMeter per registry",),
            ) from error
        self._metrics[spec.name] = (spec, metric)
        return metric

    def _child(self, name: str, kind: str, labels: Labels) -> Any:
        key = (name, kind, labels)
        child = self._children.get(key)
        if child is not None:
            return child
        with self._lock:
            known = self._metrics.get(name)
            if known is None:
                keys = tuple(k for k, _ in labels)
                spec = MetricSpec(name=name, kind=kind, help=name, labels=keys)  # type: ignore[arg-type]
                metric = self._ensure(spec)
            else:
                spec, metric = known
                if spec.kind != kind:
                    raise ValidationError("name", (f"metric {name!r} is a {spec.kind}, not a {kind}",))
            values = dict(labels)
            if set(values) != set(spec.labels):
                raise ValidationError("labels", (f"{name!r} takes labels {spec.labels}, got {tuple(values)}",))
            child = metric.labels(**{label: values[label] for label in spec.labels}) if spec.labels else metric
            if kind == "counter":
                child = _Counter(child)
            self._children[key] = child
            return child

    def serve(self, port: int, *, host: str = "127.0.0.1") -> MetricsServer:
        """Serves this meter's registry over HTTP (see :func:`serve`); close the returned server to stop."""
        return serve(self._registry, port, host=host)

    def counter(self, name: str, labels: Labels = ()) -> BoundCounter:
        """The child ``labels`` of the ``Counter`` ``name`` (its ``add`` is the child's ``inc``)."""
        return self._child(name, "counter", labels)

    def histogram(self, name: str, labels: Labels = ()) -> BoundHistogram:
        """The child ``labels`` of the ``Histogram`` ``name``."""
        return self._child(name, "histogram", labels)

    def gauge(self, name: str, labels: Labels = ()) -> BoundGauge:
        """The child ``labels`` of the ``Gauge`` ``name`` (its ``set`` is the child's ``set``)."""
        return self._child(name, "gauge", labels)


class MetricsServer:
    """An HTTP server exposing a registry at ``/metrics`` (any path answers) on a daemon thread of its own.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the one the system chose when 0 was asked for).
    """

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stops serving and frees the port (waits for the serving thread, at most 5 s); twice does nothing."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def serve(registry: Any, port: int, *, host: str = "127.0.0.1") -> MetricsServer:
    """Serves ``registry`` in the Prometheus text format over HTTP until the returned server is closed.

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` (e.g. ``PrometheusMeter(...).registry``).
        port: the TCP port (0: any free port; read it from ``MetricsServer.port``).
        host: the address to listen on; the loopback by default (``"0.0.0.0"`` to be scraped from elsewhere).

    Raises:
        ValidationError: ``port`` is not 0..65535, ``host`` is empty or not a str, or ``prometheus_client`` is
            not installed.
        OSError: the port is taken.
    """
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValidationError("port", (f"must be an int from 0 to 65535, got {port!r}",))
    if not isinstance(host, str) or not host.strip():
        # an empty host would listen on every interface: say so with "0.0.0.0", never by omission
        raise ValidationError("host", (f'must name an address ("0.0.0.0" for every interface), got {host!r}',))
    prom = _import_prometheus()

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *_args: Any) -> None:  # never print a line per scrape
            return None

    server = make_server(host, port, prom.make_wsgi_app(registry), Server, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, name="threadloom-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


class _Counter:
    """A ``prometheus_client`` counter child as a :class:`BoundCounter`: ``add`` is the child's ``inc``."""

    __slots__ = ("add",)

    def __init__(self, child: Any) -> None:
        self.add = child.inc


__all__ = ["MetricsServer", "PrometheusMeter", "serve"]
