"""Finding a skewed clock among the processes of one SQLite file.

A SQLite store judges claim expiry and retention age by its own process's clock, so every process on one file
must read the same time (README "Limits"). A process whose clock runs ahead takes over claims that are still
live and prunes what is not yet old; it cannot see that itself, but the others can: what it stamps (a claim, a
commit) lies in their future. :class:`SkewWatch` is told of each stamp a store reads that another writer may
have made, and reports one that lies more than ``tolerance`` in this process's future: a structlog warning
``clock.skew_detected`` (keys ``op``, ``thread_id``, ``holder`` - the run that stamped it -, ``skew_ms``,
``tolerance_ms``, ``path``) and a call of each listener (a metered store counts it), at most once per holder per
:data:`SKEW_REPORT_PERIOD`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from threadloom.persistence.logs import get_logger

log = get_logger("threadloom.persistence.sqlite.skew")

DEFAULT_SKEW_TOLERANCE = timedelta(seconds=5)
"""How far in the future a stamp may lie before it is reported: more than ordinary NTP error, less than a ttl."""

SKEW_REPORT_PERIOD = timedelta(minutes=1)
"""A holder is reported at most once per this period (read at each report: tests may shrink it)."""

SkewListener = Callable[[str, float], None]
"""Called with ``(op, skew_s)`` for each report: the operation that read the stamp and how far ahead it was."""


class SkewWatch:
    """Reports stamps read in this process's future (see the module). Safe from any number of threads."""

    def __init__(self, path: str, tolerance: timedelta) -> None:
        self.path = path
        self.tolerance = tolerance
        self._tolerance_us = int(tolerance / timedelta(microseconds=1))
        self._lock = threading.Lock()
        self._reported: dict[str, float] = {}  # holder -> time.monotonic() of its last report
        self.listeners: list[SkewListener] = []

    def saw(self, op: str, thread_id: str, holder: str | None, stamp_us: int | None, now_us: int) -> None:
        """Notes a stamp ``stamp_us`` (microseconds since the epoch) read at ``now_us`` by this process's clock."""
        if stamp_us is None or stamp_us - now_us <= self._tolerance_us:
            return
        skew_s = (stamp_us - now_us) / 1e6
        key = holder if holder is not None else ""
        moment = time.monotonic()
        with self._lock:
            last = self._reported.get(key)
            if last is not None and moment - last < SKEW_REPORT_PERIOD.total_seconds():
                return
            self._reported[key] = moment
            listeners = list(self.listeners)
        log.warning(
            "clock.skew_detected",
            op=op,
            thread_id=thread_id,
            holder=holder,
            skew_ms=round(skew_s * 1000),
            tolerance_ms=self._tolerance_us // 1000,
            path=self.path,
            advice="every process on one SQLite file must read the same clock: check this host's and the holder's",
        )
        for listener in listeners:
            listener(op, skew_s)


__all__ = ["DEFAULT_SKEW_TOLERANCE", "SKEW_REPORT_PERIOD", "SkewListener", "SkewWatch"]
