"""The metrics of ``threadloom demo --metrics-port N``: each worker serves its own store's metrics, and the
coordinator serves its own together with every worker's, labelled ``process``, on the loopback only."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any, Self

from threadloom.cli.output import CliError
from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.metrics.metered import MeteredCheckpointer

METRICS_HOST = "127.0.0.1"
"""The address every metrics endpoint of the demo listens on: the loopback only."""
SCRAPE_TIMEOUT_S = 1.0
"""How long (seconds) the coordinator's endpoint waits for one worker's metrics while it is scraped."""
PROCESS_UP = "threadloom_demo_process_up"
"""The coordinator endpoint's gauge: 1 where a process's metrics were read for this scrape, else 0."""


def port_in_use(port: int, host: str = METRICS_HOST) -> str | None:
    """Why ``port`` cannot be listened on at ``host`` (the system's reason), or None if it can right now.

    Binds and closes a socket at once, with ``SO_REUSEADDR`` as the metrics server does, so a port held only by
    a closed connection (``TIME_WAIT``) counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def port_taken(port: int, reason: str, uses: str = "") -> CliError:
    return CliError(
        f"metrics port {port} on {METRICS_HOST} is not available ({reason}); choose another --metrics-port{uses}", 2
    )


class _Aggregate:
    """A ``prometheus_client`` collector: the coordinator's metrics and every worker's, labelled by process.

    At each scrape it renders the coordinator's registry and fetches each worker's endpoint (at most
    :data:`SCRAPE_TIMEOUT_S` each), parses them, adds ``process="<name>"`` to every sample and yields the
    families merged by name, plus :data:`PROCESS_UP` per process. A worker that cannot be read (not started yet,
    SIGKILLed, stopped) contributes nothing but ``threadloom_demo_process_up{process=...} 0``: its counts are not
    remembered, so a series only ever shows what its process reports now.
    """

    def __init__(self, own: Any, workers: list[tuple[str, str]]) -> None:
        self._own = own
        self._workers = workers

    def collect(self) -> Any:
        import prometheus_client
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.parser import text_string_to_metric_families

        sources = [("coordinator", prometheus_client.generate_latest(self._own).decode())]
        up = GaugeMetricFamily(
            PROCESS_UP,
            "1 if the process's metrics were read for this scrape, 0 if not (a worker not started yet, SIGKILLed "
            "or stopped: its series are then absent).",
            labels=["process"],
        )
        up.add_metric(["coordinator"], 1)
        for name, url in self._workers:
            try:
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                    sources.append((name, response.read().decode()))
            except (OSError, ValueError):
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
        merged: dict[str, Any] = {}
        for process, text in sources:
            try:
                families = list(text_string_to_metric_families(text))
            except ValueError:  # not what a worker serves: leave it out rather than fail the whole scrape
                continue
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = prometheus_client.Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                elif into.type != family.type:
                    continue
                into.samples.extend(
                    sample._replace(labels={**sample.labels, "process": process}) for sample in family.samples
                )
        yield from merged.values()
        yield up


class DemoMetrics:
    """The metrics of ``threadloom demo --metrics-port N``: ports, the coordinator's meter and its endpoint.

    Port ``N`` serves the coordinator's endpoint (:class:`_Aggregate`: its own store's metrics and each worker's,
    labelled ``process``); worker ``k`` (1-based) serves its own store's metrics on ``N+k``. Everything listens on
    :data:`METRICS_HOST` only. :meth:`start` checks every port before anything else happens.

    Args:
        port: ``N``, the coordinator's port (1..65535; ``N + workers`` must be a port too).
        workers: how many worker processes the demo starts.
    """

    def __init__(self, port: int, workers: int) -> None:
        self.port = port
        self.workers = workers
        self._server: Any = None
        self._meter: Any = None

    def worker_port(self, number: int) -> int:
        """The port worker ``number`` (1-based) serves on: ``N + number``."""
        return self.port + number

    def url(self, port: int) -> str:
        """``http://127.0.0.1:<port>/metrics``."""
        return f"http://{METRICS_HOST}:{port}/metrics"

    def start(self) -> Self:
        """Checks the workers' ports, then serves the coordinator's endpoint on ``N``.

        Raises:
            CliError: (exit 2) ``N + workers`` is above 65535, a port is in use, or ``prometheus_client`` is not
                installed (the ``metrics`` extra).
        """
        try:
            import prometheus_client
        except ImportError as error:
            extra = "pip install 'threadloom[metrics]'"
            raise CliError(f"--metrics-port needs the metrics extra ({extra}): {error}", 2) from error
        from threadloom.persistence.metrics.prometheus import PrometheusMeter, serve

        last = self.worker_port(self.workers)
        if last > 65535:
            raise CliError(
                f"--metrics-port {self.port} leaves no port for worker {self.workers} ({last} > 65535)", 2
            )
        uses = f" (the demo uses ports {self.port}-{last}: N and N+1…N+{self.workers} for its workers)"
        for number in range(1, self.workers + 1):
            reason = port_in_use(self.worker_port(number))
            if reason is not None:
                raise port_taken(self.worker_port(number), reason, uses)
        try:
            self._meter = PrometheusMeter(prometheus_client.CollectorRegistry())
            served = prometheus_client.CollectorRegistry()
            served.register(_Aggregate(self._meter.registry, self.worker_urls()))
            self._server = serve(served, self.port, host=METRICS_HOST)
        except ValidationError as error:
            raise CliError(f"--metrics-port: {error}", 2) from error
        except OSError as error:
            raise port_taken(self.port, error.strerror or str(error), uses) from error
        return self

    def worker_urls(self) -> list[tuple[str, str]]:
        """``(worker name, its metrics URL)`` for every worker, in order."""
        return [(f"worker-{k}", self.url(self.worker_port(k))) for k in range(1, self.workers + 1)]

    def wrap(self, store: Checkpointer) -> MeteredCheckpointer:
        """``store`` metered into the coordinator's registry (closing the wrapper closes ``store``)."""
        return MeteredCheckpointer(store, self._meter)

    def describe(self) -> list[str]:
        """The lines printed at start: where to scrape."""
        lines = [f"metrics: {self.url(self.port)} (coordinator and every worker, labelled process)"]
        lines += [f"metrics: {url} ({name} only)" for name, url in self.worker_urls()]
        return lines

    def close(self) -> None:
        """Stops the coordinator's endpoint (twice does nothing)."""
        if self._server is not None:
            self._server.close()


__all__ = ["METRICS_HOST", "PROCESS_UP", "SCRAPE_TIMEOUT_S", "DemoMetrics", "port_in_use", "port_taken"]
