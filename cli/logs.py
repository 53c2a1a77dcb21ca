"""The command's logging: the only place that configures structlog and the standard ``logging`` the drivers use.

The library itself never configures logging; the ``threadloom`` command does, for the time a command runs, and
puts the previous configuration back when it returns (:func:`logging_restored`), so a program or a test that
runs the command in its own process keeps its own. Imported only once a command runs (never for ``--help``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import structlog

from threadloom.cli.output import scrub
from threadloom.persistence.logs import structlog_restored

DRIVER_LOGGERS = ("psycopg", "psycopg_pool")
"""Standard-library loggers of the database drivers (``psycopg.pool`` is a child of ``psycopg``)."""
_HANDLER_NAME = "threadloom-cli"


class _StderrHandler(logging.StreamHandler):
    """A ``logging`` handler writing to the current ``sys.stderr`` (it may be replaced, e.g. in tests), with
    ``secrets`` scrubbed from every formatted line."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__(sys.stderr)
        self.set_name(_HANDLER_NAME)
        self._secrets = tuple(secrets)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record), self._secrets)


class _ScrubbingPrintLogger(structlog.PrintLogger):
    """structlog's ``PrintLogger`` on the current ``sys.stderr``, with ``secrets`` scrubbed from each line."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__(file=sys.stderr)
        self._secrets = tuple(secrets)

    def msg(self, message: str) -> None:
        super().msg(scrub(message, self._secrets))

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def configure_logging(level: str, *, secrets: Sequence[str] = (), stream: Any = None) -> None:
    """Configures structlog and the standard ``logging`` for the command (never called by the library).

    Log lines go to stderr: a coloured console renderer when stderr is a terminal, JSON lines otherwise. Every
    rendered line (tracebacks included) has ``secrets`` (a store URL's password) replaced by ``***``.

    Args:
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical``; lines below it are dropped.
        secrets: strings never to print.
        stream: the stream whose ``isatty()`` chooses the renderer (default ``sys.stderr``).
    """
    number = logging.getLevelName(level.upper())
    tty = bool(getattr(stream if stream is not None else sys.stderr, "isatty", lambda: False)())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if tty:
        tail: list[Any] = [structlog.dev.ConsoleRenderer(colors=True)]
    else:
        tail = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *tail],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=lambda *_args: _ScrubbingPrintLogger(secrets),  # a new one per logger: today's stderr
        cache_logger_on_first_use=False,
    )
    # Drivers (psycopg, psycopg_pool) log through the standard library: render their lines the same way.
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(handler)
    handler = _StderrHandler(secrets)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
        )
    )
    root.addHandler(handler)
    root.setLevel(number)
    # A driver's own warnings (a pool retrying a connection) repeat what the command's error line says: they
    # show from --log-level info on.
    for name in DRIVER_LOGGERS:
        logging.getLogger(name).setLevel(number if number <= logging.INFO else max(number, logging.ERROR))


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Restores structlog's configuration, the root logger and the driver loggers as they were on entry."""
    root = logging.getLogger()
    root_level, handlers = root.level, list(root.handlers)
    drivers = {name: logging.getLogger(name).level for name in DRIVER_LOGGERS}
    try:
        with structlog_restored():
            yield
    finally:
        for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME and h not in handlers]:
            root.removeHandler(handler)
        for handler in handlers:
            if handler.get_name() == _HANDLER_NAME:
                root.addHandler(handler)  # one an outer configuration had (added once: addHandler checks)
        root.setLevel(root_level)
        for name, level in drivers.items():
            logging.getLogger(name).setLevel(level)


__all__ = ["DRIVER_LOGGERS", "configure_logging", "logging_restored"]
