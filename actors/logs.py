"""The runtime's log helpers: one structlog logger, never configured here (the CLI configures it).

Every line is a stable event name plus bound keys: ``thread_id``, ``run_id``, ``token``, ``tenant_id``,
``node_id`` (the runtime's node, as ``GraphRuntime(node_id=…)``; the graph node is ``graph_node``), ``op`` (the
store operation) and ``duration_ms`` (by the runtime's clock).
"""

from __future__ import annotations

from datetime import datetime

from threadloom.domain.clock import Clock
from threadloom.persistence.logs import get_logger

log = get_logger("threadloom")
"""The runtime's logger; its calls never raise (a closed output must never strand a run)."""


def elapsed_ms(clock: Clock, since: datetime) -> float:
    """Milliseconds from ``since`` to ``clock.now()``, rounded to microseconds."""
    return round((clock.now() - since).total_seconds() * 1000, 3)


def describe(error: BaseException) -> str:
    """``"<type>: <message>"`` of an error, for a log line or a queue entry's ``error``."""
    return f"{type(error).__name__}: {error}"
