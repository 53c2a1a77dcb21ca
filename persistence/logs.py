"""Loggers that never raise: a log line that cannot be written must never change a call's outcome.

The library logs through structlog and never configures it. An unconfigured structlog writes to standard output;
when that is a closed pipe (``program | head -1``) or an application's handler fails, the write raises. A store
call or a run must then go on exactly as if the line had been written: its claim released, its caller answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import structlog


class SafeLogger:
    """Wraps a structlog logger: every call (``info``, ``warning``, ``bind``, …) swallows what the write raises.

    Args:
        inner: the structlog (bound or lazy) logger to write through.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def bind(self, **values: Any) -> SafeLogger:
        """The same logger with ``values`` bound to every line."""
        try:
            return SafeLogger(self._inner.bind(**values))
        except Exception:  # noqa: BLE001 - a logger must not fail its caller
            return self

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a closed pipe or a broken handler must not fail the call
                return None

        return call


def get_logger(name: str) -> SafeLogger:
    """A :class:`SafeLogger` over ``structlog.get_logger(name)``."""
    return SafeLogger(structlog.get_logger(name))


@contextlib.contextmanager
def structlog_restored() -> Iterator[None]:
    """Puts structlog's configuration back as it was on exit (unconfigured again, if it was): for the tools that
    configure logging for a while — the CLI, a simulation, a benchmark — inside a host that has its own."""
    configured = structlog.is_configured()
    saved = structlog.get_config()
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()
