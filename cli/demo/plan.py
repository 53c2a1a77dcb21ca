"""What ``threadloom demo`` runs: its parameters (:class:`DemoPlan`) and how run ids name their worker."""

from __future__ import annotations

from datetime import timedelta

import attrs

TENANT = "acme"
"""The tenant the demo's runs are for."""
DEFAULT_TTL = timedelta(seconds=3)
"""The workers' claim and lease ttl: how long a dead worker's threads stay held."""
DEFAULT_RENEW = timedelta(seconds=1)
"""How often the workers renew their claims and leases."""


@attrs.frozen(kw_only=True)
class DemoPlan:
    """The demo's parameters.

    Attributes:
        runs, workers, concurrency: runs enqueued, worker processes, queue workers per process.
        crash: SIGKILL a worker in the middle of the runs.
        ttl, renew_every: the workers' claim and lease ttl and renewal period.
        pace: scales the sample graph's sleeps (1.0: about a second a run).
        prefix: the root threads are ``<prefix>-001``…
        tenant: the tenant of every run.
        timeout: the demo gives up waiting for the runs after this long.
    """

    runs: int
    workers: int
    concurrency: int
    crash: bool
    ttl: timedelta = DEFAULT_TTL
    renew_every: timedelta = DEFAULT_RENEW
    pace: float = 1.0
    prefix: str = "demo"
    tenant: str = TENANT
    timeout: timedelta = timedelta(minutes=2)

    def thread_id(self, index: int) -> str:
        """The root thread of run ``index`` (1-based)."""
        return f"{self.prefix}-{index:0{max(3, len(str(self.runs)))}d}"

    @property
    def roots(self) -> list[str]:
        """Every root thread, in run order."""
        return [self.thread_id(index) for index in range(1, self.runs + 1)]


def worker_of(run_id: str | None) -> str | None:
    """The worker (runtime node id) that made ``run_id`` (``<node>:run-…``), or None."""
    if not run_id or ":" not in run_id:
        return None
    return run_id.split(":", 1)[0]


__all__ = ["DEFAULT_RENEW", "DEFAULT_TTL", "TENANT", "DemoPlan", "worker_of"]
