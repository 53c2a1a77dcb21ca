"""The ``threadloom`` command: read and sweep a store from a terminal or a script (DESIGN §1, §3, §6).

Usage: ``threadloom [--store URL] [--json] [--log-level LEVEL] COMMAND ...``. The store URL defaults to
``$THREADLOOM_STORE``, else ``sqlite:///threadloom.db`` (a file in the working directory). Every command prints
rich tables on stdout, or, with ``--json``, one JSON document (``events --follow``: one JSON object per line).

Errors never print a traceback: one line ``threadloom: error: ...`` on stderr, and the exit status says what
went wrong (:data:`EXIT_FAILED`, :data:`EXIT_USAGE`, :data:`EXIT_INTERRUPTED`); with ``--json``, stdout also gets
one line ``{"error": {"type": ..., "message": ...}}`` (see :func:`error_document`). A store URL's password never
appears in output, errors or log lines. Text from the store (ids, event types, metadata, payloads) is printed
with its control characters escaped (:func:`printable`), so stored data cannot drive the terminal.

Commands that only read (``threads``, ``show``, ``history``, ``events``, ``stats``) and ``sweep`` refuse a SQLite
file that does not exist instead of creating it (a mistyped path).

This module is the only place that configures logging (structlog, and the standard library's ``logging`` that
drivers use): the library itself never does (DESIGN §6).

Adding a command: define it in a module of its own as a :class:`click.Command` and name it in
:data:`LAZY_COMMANDS` (it is imported only when run), or decorate it with ``@cli.command()`` here. Inside it,
``ctx.find_object(CliState)`` gives the global options and :meth:`CliState.store` the opened store.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import click
import structlog
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from threadloom.domain import rules
from threadloom.domain.errors import CancelledError, ReplayUnavailable, ThreadloomError, ValidationError
from threadloom.domain.values import (
    Checkpoint,
    EventRecord,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence import DEFAULT_SQLITE_PATH, Checkpointer, open_store, redact_url, sqlite_file, url_secrets
from threadloom.persistence.logs import structlog_restored

DEFAULT_STORE_URL = f"sqlite:///{DEFAULT_SQLITE_PATH}"
"""The store the command opens when neither ``--store`` nor ``$THREADLOOM_STORE`` names one."""

STORE_ENV = "THREADLOOM_STORE"
LOG_LEVEL_ENV = "THREADLOOM_LOG_LEVEL"

EXIT_OK = 0
EXIT_FAILED = 1
"""The store refused or failed (any ``ThreadloomError`` but bad input), or the thread is unknown."""
EXIT_USAGE = 2
"""Bad command line or input: unknown option, bad duration, bad store URL, invalid id (``ValidationError``)."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C) in a command other than ``events --follow``, for which Ctrl-C is the normal end."""

FOLLOW_WAIT = timedelta(seconds=5)
"""How long one ``await_events_after`` call of ``events --follow`` waits before it asks again."""
FOLLOW_PAGE = 1000
"""At most this many events per read of ``events --follow``."""
FOLLOW_STOP_GRACE_S = 3.0
"""After Ctrl-C, how long ``events --follow`` waits (seconds) for the store's wait to end before exiting."""
REGISTRY_SCAN_PAGES = 10
"""``show`` looks for the thread's registry row in at most this many pages of 1000 of its tenant's threads."""

LAZY_COMMANDS: dict[str, str] = {
    "stats": "threadloom.cli.stats:stats",
    "demo": "threadloom.cli.demo.run:demo",
    "demo-worker": "threadloom.cli.demo.run:demo_worker",
    "simulate": "threadloom.simulations.cli:simulate_command",
}
"""Commands defined in other modules: name -> ``"module:attribute"`` (a ``click.Command``), imported on use.

This is where later commands plug in: each is listed once it exists.
"""

_log = structlog.get_logger("threadloom.cli")


# -- durations -------------------------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}


def parse_duration(text: str) -> timedelta:
    """A duration written as numbers with units: ``30s``, ``15m``, ``2h``, ``7d``, ``1w``, ``500ms``, ``1h30m``.

    Returns:
        The duration, greater than zero.

    Raises:
        ValueError: ``text`` is not such a duration, or is zero (the message says how to write one).
    """
    cleaned = text.strip().lower()
    total = timedelta()
    position = 0
    for match in _DURATION_PART.finditer(cleaned):
        if match.start() != position:
            break
        try:
            total += int(match.group(1)) * _UNITS[match.group(2)]
        except OverflowError:
            raise ValueError(f"{text!r} is too long a duration") from None
        position = match.end()
    if not cleaned or position != len(cleaned):
        raise ValueError(f"{text!r} is not a duration; write a number and a unit (ms, s, m, h, d, w): 30s, 15m, 2h, 7d")
    if total <= timedelta():
        raise ValueError(f"{text!r} must be longer than zero")
    return total


class DurationType(click.ParamType):
    """A click parameter type for :func:`parse_duration`."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


DURATION = DurationType()


# -- secrets ---------------------------------------------------------------------------------------------------------


# ``url_secrets`` (imported above from the persistence package) gives the forms of a store URL's passwords, read
# from the text itself: ``user:pass@`` (up to the last ``@``), ``password=`` query values, ``key=value`` strings,
# and URLs no parser accepts.


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (longest secrets first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


# -- terminal safety -------------------------------------------------------------------------------------------------

_BIDI_AND_SEPARATORS = (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_PRINTABLE = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r",
    **{code: f"\\u{code:04x}" for code in _BIDI_AND_SEPARATORS},
}
# Inside JSON text, json.dumps already escapes C0; DEL, C1 and the bidi controls pass raw with ensure_ascii=False.
_JSON_SAFE = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0), *_BIDI_AND_SEPARATORS)}


def printable(text: str) -> str:
    """``text`` with the characters that can drive a terminal written as escapes, for tables and error lines.

    C0 controls (ESC included), DEL and C1 controls become ``\\x1b``-style escapes (``\\n``, ``\\r``, ``\\t`` for
    those three); bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069) and the line and paragraph
    separators become ``\\u202e``-style escapes. Everything else, non-ASCII letters included, is kept.
    """
    return text.translate(_PRINTABLE)


def json_text(value: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """``value`` as JSON text with non-ASCII kept but DEL, C1 and bidi controls escaped as ``\\u…``.

    The text decodes to the same value (``json.loads``) and prints nothing a terminal would act on.
    """
    separators = (",", ":") if compact else None
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators).translate(_JSON_SAFE)


def _text(value: Any, style: str = "") -> Text:
    """A table cell: ``value`` as text, escaped with :func:`printable`, never read as rich markup."""
    return Text("" if value is None else printable(str(value)), style=style)


# -- logging ---------------------------------------------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
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

    @property  # type: ignore[override]
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
        level: one of :data:`LOG_LEVELS`; lines below it are dropped.
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


# -- state shared by the commands --------------------------------------------------------------------------------------


class CliError(click.ClickException):
    """An error the command reports on one line and exits with ``exit_code`` (default :data:`EXIT_FAILED`).

    Attributes:
        kind: the ``type`` of the ``--json`` error document: the library error's class name where one caused it
            (``ValidationError``, ``ProcessingError``), else the command's own (``UnknownThread``,
            ``StoreNotFound``, ``CommandError``).
    """

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, kind: str = "CommandError") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.kind = kind


@attrs.define
class _Outcome:
    """What the error report of one run needs to know: JSON wanted, and whether a JSON document was printed."""

    json_output: bool = False
    emitted: bool = False


_OUTCOME: contextvars.ContextVar[_Outcome | None] = contextvars.ContextVar("threadloom_cli_outcome", default=None)


@attrs.define
class CliState:
    """The global options, and the store once a command opened it (closed when the command ends).

    Attributes:
        store_url: the URL as given (holds the password, if any: print :attr:`safe_url` instead).
        json_output: print JSON instead of tables.
        out: the rich console on stdout; err: the one on stderr.
    """

    store_url: str
    json_output: bool
    out: Console
    err: Console
    _store: Checkpointer | None = None

    @property
    def safe_url(self) -> str:
        """The store URL with its password replaced by ``***``."""
        return redact_url(self.store_url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The strings never to print (the URL's password in its forms)."""
        return url_secrets(self.store_url)

    def store(self, *, create: bool = False) -> Checkpointer:
        """The store named by ``--store``, opened on first use.

        Args:
            create: create (and migrate) a SQLite file, or a PostgreSQL schema, that holds no store yet. False
                (every command of this module): a missing one is refused, so a mistyped path or schema creates
                nothing.

        Raises:
            CliError: the URL is bad (:data:`EXIT_USAGE`), names a SQLite file that does not exist, or a
                PostgreSQL schema with no store, and ``create`` is False (:data:`EXIT_FAILED`, kind
                ``StoreNotFound`` for SQLite, ``ProcessingError`` for PostgreSQL), or the store could not be opened.
        """
        if self._store is None:
            try:
                path = sqlite_file(self.store_url)
                if path is not None and not create and not os.path.exists(path):
                    raise CliError(
                        f"no store at {os.path.abspath(path)!r}; run a command that writes (such as "
                        f"'threadloom demo --store sqlite:///{path}'), or check the path",
                        kind="StoreNotFound",
                    )
                self._store = open_store(self.store_url, **self._postgres_options(create))
            except ValidationError as error:
                reason = "; ".join(error.problems) if error.field == "url" else str(error)
                raise CliError(
                    f"bad store URL: {scrub(reason, self.secrets)}", EXIT_USAGE, kind="ValidationError"
                ) from error
            except ThreadloomError as error:
                raise CliError(
                    f"cannot open store {self.safe_url!r}: {scrub(str(error), self.secrets)}", kind=type(error).__name__
                ) from error
            except OSError as error:
                raise CliError(
                    f"cannot open store {self.safe_url!r}: {scrub(str(error), self.secrets)}", kind="ProcessingError"
                ) from error
            _log.debug("cli.store_opened", store=self.safe_url)
        return self._store

    def _postgres_options(self, create: bool) -> dict[str, Any]:
        """``open_store``'s options: for a PostgreSQL URL and not ``create``, a config that creates no schema."""
        scheme = self.store_url.partition(":")[0].lower()
        if create or scheme not in ("postgresql", "postgres"):
            return {}
        from threadloom.persistence.postgres.store import PostgresCheckpointerConfig

        return {"config": PostgresCheckpointerConfig(create=False)}

    def close(self) -> None:
        """Closes the store if it was opened."""
        if self._store is not None:
            store, self._store = self._store, None
            store.close()

    def emit(self, document: Any) -> None:
        """Prints ``document`` as one JSON document on stdout (DEL, C1 and bidi controls escaped)."""
        click.echo(json_text(document, indent=2))
        outcome = _OUTCOME.get()
        if outcome is not None:
            outcome.emitted = True


def _state(ctx: click.Context) -> CliState:
    state = ctx.find_object(CliState)
    if state is None:  # a command invoked without the group (never through ``threadloom``)
        raise CliError("internal: the command ran without the threadloom group")
    return state


# -- JSON shapes -------------------------------------------------------------------------------------------------------


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def checkpoint_json(cp: Checkpoint) -> dict[str, Any]:
    """A checkpoint as a JSON object (times ISO 8601)."""
    return {
        "id": cp.id,
        "parent": cp.parent,
        "thread_id": cp.thread_id,
        "run_id": cp.run_id,
        "status": cp.status.value,
        "created_at": _iso(cp.created_at),
        "graph_id": cp.graph_id,
        "tenant_id": cp.tenant_id,
        "fencing_token": cp.fencing_token,
        "origin": None
        if cp.origin is None
        else {
            "parent_thread": cp.origin.parent_thread,
            "parent_checkpoint": cp.origin.parent_checkpoint,
            "task_id": cp.origin.task_id,
        },
        "metadata": dict(cp.metadata),
        "state": cp.state,
    }


def pending_write_json(pw: PendingWrite) -> dict[str, Any]:
    """A pending write as a JSON object."""
    return {"checkpoint_id": pw.checkpoint_id, "task_id": pw.task_id, "node_id": pw.node_id, "payload": pw.payload}


def event_json(ev: EventRecord) -> dict[str, Any]:
    """An event record as a JSON object (``timestamp`` ISO 8601, the producer's)."""
    return {
        "thread_id": ev.thread_id,
        "seq": ev.seq,
        "token": ev.token,
        "run_id": ev.run_id,
        "type": ev.type,
        "timestamp": _iso(ev.timestamp),
        "checkpoint_id": ev.checkpoint_id,
        "task_id": ev.task_id,
        "node_id": ev.node_id,
        "payload": ev.payload,
    }


def summary_json(summary: ThreadSummary) -> dict[str, Any]:
    """A registry row as a JSON object (``updated_at`` ISO 8601, the store's clock)."""
    return {
        "thread_id": summary.thread_id,
        "tenant_id": summary.tenant_id,
        "status": summary.status.value,
        "updated_at": _iso(summary.updated_at),
        "latest_checkpoint_id": summary.latest_checkpoint_id,
        "latest_run_id": summary.latest_run_id,
        "graph_id": summary.graph_id,
        "metadata": dict(summary.metadata),
    }


def cursor_json(cursor: ThreadCursor | None) -> dict[str, Any] | None:
    """A registry cursor as a JSON object, or None."""
    return None if cursor is None else {"updated_at": _iso(cursor.updated_at), "thread_id": cursor.thread_id}


# -- table helpers -----------------------------------------------------------------------------------------------------


def _when(when: datetime | None) -> Text:
    return Text("" if when is None else when.isoformat(sep=" ", timespec="milliseconds"))


def _compact(value: Any) -> Text:
    return Text(json_text(value, compact=True))


def _plain(value: Any) -> Text:
    return _text(value)


def _json_block(value: Any) -> Text:
    """``value`` as indented, highlighted JSON (as ``rich.json.JSON``, but with :func:`json_text`'s escapes)."""
    text = JSONHighlighter()(json_text(value, indent=2))
    text.no_wrap = True
    text.overflow = None
    return text


def _table(title: str, *columns: str) -> Table:
    table = Table(title=_text(title), title_justify="left", header_style="bold")  # a Text: never rich markup
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _event_line(ev: EventRecord) -> Text:
    line = Text()
    line.append(f"{ev.seq:>6} ", style="bold")
    line.append(ev.timestamp.isoformat(sep=" ", timespec="milliseconds"), style="dim")
    line.append(f"  {printable(ev.type)}", style="cyan")
    line.append(f"  run={printable(ev.run_id)} token={ev.token}")
    if ev.node_id is not None:
        line.append(f" node={printable(ev.node_id)}")
    if ev.payload is not None:
        line.append("  ")
        line.append(json_text(ev.payload, compact=True))
    return line


# -- the group -----------------------------------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ThreadloomGroup(click.Group):
    """The ``threadloom`` group: loads :data:`LAZY_COMMANDS` on use, and reports every error on one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            module_name, _, attribute = LAZY_COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module_name), attribute)
        return command

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Runs the command; exits with its status (or returns it when ``standalone_mode`` is False).

        The logging configuration the command sets up is undone when it returns, so a program (or a test) that
        runs the command in its own process gets its own configuration back.
        """
        with _logging_restored():
            code = self._run(args, prog_name or "threadloom", complete_var, extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Sequence[str] | None, prog_name: str, complete_var: str | None, extra: Any) -> int:
        argv = list(sys.argv[1:] if args is None else args)
        # The URL is known before parsing, so that even a parse error never echoes its password; --json too, so
        # that a parse error is reported as a JSON document as well.
        secrets = _argv_secrets(argv)
        outcome = _Outcome(json_output=_argv_wants_json(argv))
        token = _OUTCOME.set(outcome)

        def fail(message: str, code: int, kind: str) -> int:
            line = _one_line(scrub(message, secrets))
            click.echo(f"{prog_name}: error: {printable(line)}", err=True)
            if outcome.json_output and not outcome.emitted:
                with contextlib.suppress(OSError, ValueError):  # stdout closed: the stderr line is what is left
                    click.echo(json_text(error_document(kind, line)))
            return code

        try:
            result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            return result if isinstance(result, int) else EXIT_OK
        except click.exceptions.NoArgsIsHelpError as error:
            if outcome.json_output:
                return fail(f"no command given (see '{prog_name} --help')", EXIT_USAGE, "UsageError")
            error.show()
            return EXIT_USAGE
        except click.UsageError as error:
            hint = ""
            if error.ctx is not None:
                hint = f" (see '{error.ctx.command_path} --help')"
            return fail(error.format_message() + hint, EXIT_USAGE, "UsageError")
        except CliError as error:
            return fail(error.format_message(), error.exit_code, error.kind)
        except click.ClickException as error:
            return fail(error.format_message(), error.exit_code, "CommandError")
        except click.Abort:
            click.echo(f"{prog_name}: interrupted", err=True)
            if outcome.json_output and not outcome.emitted:
                with contextlib.suppress(OSError, ValueError):
                    click.echo(json_text(error_document("Interrupted", "interrupted")))
            return EXIT_INTERRUPTED
        except ValidationError as error:
            return fail(str(error), EXIT_USAGE, "ValidationError")
        except ThreadloomError as error:
            return fail(str(error), EXIT_FAILED, type(error).__name__)
        except BrokenPipeError:  # stdout closed early (``threadloom ... | head``): not an error of ours
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_FAILED
        except Exception as error:  # never a traceback: one line, and the traceback in the debug log
            if structlog.is_configured():  # else structlog's defaults would print it on stdout
                _log.debug("cli.unexpected_error", exc_info=True)
            return fail(
                f"unexpected {type(error).__name__}: {error} (run with --log-level debug for details)",
                EXIT_FAILED,
                "UnexpectedError",
            )
        finally:
            _OUTCOME.reset(token)


def error_document(kind: str, message: str) -> dict[str, Any]:
    """The JSON document a failed command prints on stdout with ``--json`` (besides its stderr line).

    Shape: ``{"error": {"type": kind, "message": message}}``, printed on one line, with the exit status of the
    stderr line. ``type`` is the library error's class name (``ValidationError``, ``ProcessingError``,
    ``CheckpointNotFound``, ``ThreadDeleted``, ...) or one of the command's own: ``UsageError`` (bad command
    line), ``UnknownThread``, ``StoreNotFound``, ``Interrupted``, ``CommandError``, ``UnexpectedError``.
    ``message`` is the stderr line's text without its ``threadloom: error:`` prefix (the password scrubbed).
    Not printed when the command already printed its JSON document (``stats`` reports a probe failure in it).
    """
    return {"error": {"type": kind, "message": message}}


def _argv_wants_json(argv: Sequence[str]) -> bool:
    """Whether the group's options (before the command name) hold ``--json``."""
    takes_value = {"--store", "--log-level"}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--json":
            return True
        if arg == "--" or not arg.startswith("-"):
            return False
        index += 2 if arg in takes_value else 1
    return False


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """Restores structlog's configuration, the root logger and the driver loggers as they were."""
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


def _argv_secrets(argv: Sequence[str]) -> tuple[str, ...]:
    """The password forms of every store URL on the command line or in ``$THREADLOOM_STORE``."""
    found: list[str] = list(url_secrets(os.environ.get(STORE_ENV, "")))
    for index, arg in enumerate(argv):
        if arg.startswith("--store="):
            found.extend(url_secrets(arg.partition("=")[2]))
        elif arg == "--store" and index + 1 < len(argv):
            found.extend(url_secrets(argv[index + 1]))
    return tuple(sorted(set(found), key=len, reverse=True))


@click.group(name="threadloom", cls=ThreadloomGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    "store_url",
    envvar=STORE_ENV,
    default=DEFAULT_STORE_URL,
    show_default=True,
    metavar="URL",
    help=f"The store: memory://, sqlite:///path.db or postgresql://user@host/db (env {STORE_ENV}).",
)
@click.option("--json", "json_output", is_flag=True, help="Print one JSON document (events --follow: JSON lines).")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="warning",
    show_default=True,
    envvar=LOG_LEVEL_ENV,
    help=f"Log lines at this level and above go to stderr (env {LOG_LEVEL_ENV}).",
)
@click.version_option(package_name="threadloom", prog_name="threadloom")
@click.pass_context
def cli(ctx: click.Context, store_url: str, json_output: bool, log_level: str) -> None:
    """threadloom: durable, fenced agent threads. Read and sweep a store.

    Exit status: 0 done; 1 the store refused or failed, or the thread is unknown; 2 bad command line, store URL
    or input; 130 interrupted.
    """
    state = CliState(
        store_url=store_url,
        json_output=json_output,
        out=_console(sys.stdout),
        err=_console(sys.stderr, stderr=True),
    )
    configure_logging(log_level.lower(), secrets=state.secrets)
    ctx.obj = state
    ctx.call_on_close(state.close)


def _console(stream: Any, *, stderr: bool = False) -> Console:
    tty = bool(getattr(stream, "isatty", lambda: False)())
    width = None if tty or "COLUMNS" in os.environ else 200  # piped output: do not fold at 80 columns
    return Console(stderr=stderr, highlight=False, width=width)


# -- threads -------------------------------------------------------------------------------------------------------------


@cli.command()
@click.option("--tenant", default=None, metavar="TENANT", help="The tenant whose threads to list (absent: no tenant).")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([status.value for status in ThreadStatus], case_sensitive=False),
    help="Only threads in this status (repeat for several).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, ThreadQuery.MAX_LIMIT),
    default=50,
    show_default=True,
    help="Threads per page.",
)
@click.option("--all-pages", is_flag=True, help="Follow the cursor through every page.")
@click.pass_context
def threads(ctx: click.Context, tenant: str | None, statuses: tuple[str, ...], limit: int, all_pages: bool) -> None:
    """List a tenant's root threads, most recently updated first.

    Status: running (a live claim holds it), idle (no live claim, latest checkpoint running), suspended,
    completed, failed, deleted (a cascade delete began).
    """
    state = _state(ctx)
    store = state.store()
    query = ThreadQuery(
        tenant_id=tenant,
        limit=limit,
        statuses=frozenset(ThreadStatus(s.lower()) for s in statuses) if statuses else None,
    )
    items: list[ThreadSummary] = []
    page = store.threads(query)
    items.extend(page.items)
    while all_pages and page.next is not None:
        page = store.threads(attrs.evolve(query, after=page.next))
        items.extend(page.items)
    if state.json_output:
        state.emit({"tenant_id": tenant, "threads": [summary_json(s) for s in items], "next": cursor_json(page.next)})
        return
    title = f"threads of tenant {tenant!r}" if tenant is not None else "threads (no tenant)"
    table = _table(title, "thread", "status", "updated at", "latest checkpoint", "latest run", "graph", "metadata")
    for s in items:
        table.add_row(
            _text(s.thread_id),
            _text(s.status.value),
            _when(s.updated_at),
            _text(s.latest_checkpoint_id),
            _text(s.latest_run_id),
            _text(s.graph_id),
            _compact(s.metadata) if s.metadata else Text(""),
        )
    state.out.print(table)
    state.out.print(Text(f"{len(items)} thread(s)" + (" — more follow: add --all-pages" if page.next else ""), style="dim"))


# -- show ----------------------------------------------------------------------------------------------------------------


def _find_in_registry(store: Checkpointer, cp: Checkpoint) -> ThreadSummary | None:
    """The thread's registry row, looked for in at most :data:`REGISTRY_SCAN_PAGES` pages of its tenant."""
    query = ThreadQuery(tenant_id=cp.tenant_id, limit=ThreadQuery.MAX_LIMIT)
    for _ in range(REGISTRY_SCAN_PAGES):
        page = store.threads(query)
        for summary in page.items:
            if summary.thread_id == cp.thread_id:
                return summary
        if page.next is None:
            return None
        query = attrs.evolve(query, after=page.next)
    return None


def _unknown_thread(state: CliState, thread_id: str) -> CliError:
    return CliError(f"unknown thread {thread_id!r}: it has no checkpoint in {state.safe_url}", kind="UnknownThread")


@cli.command()
@click.argument("thread")
@click.pass_context
def show(ctx: click.Context, thread: str) -> None:
    """Show THREAD's latest checkpoint, its pending writes and its registry row.

    The store interface has no read of claims: a registry status of 'running' means a live claim holds the
    thread. Child threads (spawned by another thread) are not in the registry.
    """
    state = _state(ctx)
    store = state.store()
    stored = store.latest(thread)
    if stored is None:
        raise _unknown_thread(state, thread)
    cp = stored.checkpoint
    notes = ["claims: the store interface has no claim read; registry status 'running' means a live claim holds it"]
    summary = None
    if cp.origin is not None:
        notes.append(f"registry: a child thread (of {cp.origin.parent_thread!r}) is not listed in the registry")
    else:
        summary = _find_in_registry(store, cp)
        if summary is None:
            notes.append(
                f"registry: not among the newest {REGISTRY_SCAN_PAGES * ThreadQuery.MAX_LIMIT} threads of its tenant"
            )
    if state.json_output:
        state.emit(
            {
                "thread_id": thread,
                "checkpoint": checkpoint_json(cp),
                "pending_writes": [pending_write_json(pw) for pw in stored.pending_writes],
                "registry": None if summary is None else summary_json(summary),
                "notes": notes,
            }
        )
        return
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    rows: list[tuple[str, Text]] = [
        ("thread", _text(thread)),
        ("status", _text(summary.status.value) if summary is not None else Text("(not in the registry)", style="dim")),
        ("updated at", _when(summary.updated_at) if summary is not None else Text("")),
        ("checkpoint", _text(cp.id)),
        ("parent", _plain(cp.parent)),
        ("checkpoint status", _text(cp.status.value)),
        ("run", _text(cp.run_id)),
        ("token", _plain(cp.fencing_token)),
        ("graph", _text(cp.graph_id)),
        ("tenant", _plain(cp.tenant_id)),
        ("created at", _when(cp.created_at)),
    ]
    if cp.origin is not None:
        rows.append(("origin", _compact(checkpoint_json(cp)["origin"])))
    if cp.metadata:
        rows.append(("checkpoint metadata", _compact(cp.metadata)))
    if summary is not None and summary.metadata:
        rows.append(("thread metadata", _compact(summary.metadata)))
    for key, value in rows:
        facts.add_row(key, value)
    state.out.print(facts)
    state.out.print(Text("state", style="bold"))
    state.out.print(_json_block(cp.state))
    if stored.pending_writes:
        writes = _table(f"pending writes ({len(stored.pending_writes)})", "task", "node", "payload")
        for pw in stored.pending_writes:
            writes.add_row(_text(pw.task_id), _text(pw.node_id), _compact(pw.payload))
        state.out.print(writes)
    else:
        state.out.print(Text("no pending writes", style="dim"))
    for note in notes:
        state.out.print(_text(note, style="dim"))


# -- history -------------------------------------------------------------------------------------------------------------


def _history(store: Checkpointer, thread: str, limit: int, before: str | None) -> list[Checkpoint]:
    out: list[Checkpoint] = []
    while len(out) < limit:
        want = min(rules.MAX_PAGE, limit - len(out))
        page = store.history(thread, limit=want, before=before)
        out.extend(page)
        if len(page) < want:
            break
        before = page[-1].id
    return out


@cli.command()
@click.argument("thread")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many.")
@click.option("--before", metavar="CHECKPOINT", default=None, help="Start after this checkpoint (to page on).")
@click.pass_context
def history(ctx: click.Context, thread: str, limit: int, before: str | None) -> None:
    """List THREAD's checkpoints, newest first."""
    state = _state(ctx)
    store = state.store()
    items = _history(store, thread, limit, before)
    if not items and before is None and store.latest(thread) is None:
        raise _unknown_thread(state, thread)
    if state.json_output:
        state.emit({"thread_id": thread, "checkpoints": [checkpoint_json(cp) for cp in items]})
        return
    table = _table(f"history of {thread!r}, newest first", "checkpoint", "parent", "status", "run", "token", "created at")
    for cp in items:
        table.add_row(
            _text(cp.id), _plain(cp.parent), _text(cp.status.value), _text(cp.run_id), _plain(cp.fencing_token),
            _when(cp.created_at),
        )
    state.out.print(table)


# -- events --------------------------------------------------------------------------------------------------------------


def _earliest_after(store: Checkpointer, thread: str) -> int:
    """The ``after_seq`` that reads from the earliest event ``thread`` still keeps (0 unless compacted or pruned)."""
    try:
        store.events_after(thread, 0, 1)
    except ReplayUnavailable as error:
        return error.earliest_seq - 1
    return 0


def _read_events(store: Checkpointer, thread: str, after: int, limit: int) -> list[EventRecord]:
    out: list[EventRecord] = []
    while len(out) < limit:
        want = min(rules.MAX_EVENTS_PAGE, limit - len(out))
        page = store.events_after(thread, after, want)
        out.extend(page)
        if len(page) < want:
            break
        after = page[-1].seq
    return out


def follow_events(
    store: Checkpointer,
    thread: str,
    after: int,
    limit: int | None,
    deliver: Callable[[EventRecord], None],
    *,
    wait: timedelta = FOLLOW_WAIT,
) -> None:
    """Delivers THREAD's events after ``after`` as they are committed, until Ctrl-C or ``limit`` events.

    The waiting happens on a thread of its own with ``await_events_after`` and a cancel event; the calling
    (main) thread only waits for it, so Ctrl-C (``KeyboardInterrupt``) reaches it at once, sets the cancel event
    and returns normally once the store's wait has ended (or after :data:`FOLLOW_STOP_GRACE_S`).

    Raises:
        ThreadloomError: the store refused a read (e.g. ``ThreadDeleted`` when the thread is deleted).
    """
    cancel = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        last = after
        delivered = 0
        try:
            while not cancel.is_set():
                page = FOLLOW_PAGE if limit is None else min(FOLLOW_PAGE, limit - delivered)
                for event in store.await_events_after(thread, last, page, wait, cancel=cancel):
                    deliver(event)
                    last = event.seq
                    delivered += 1
                if limit is not None and delivered >= limit:
                    return
        except CancelledError:
            return
        except BaseException as error:  # reported by the main thread
            if not cancel.is_set():
                failures.append(error)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None  # Ctrl-C raises here
    worker = threading.Thread(target=run, name="threadloom-follow", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        worker.join(FOLLOW_STOP_GRACE_S)
        _log.debug("cli.follow_stopped", thread_id=thread)
        return
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if failures:
        raise failures[0]


@cli.command()
@click.argument("thread")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=None,
    help="Events with seq > AFTER [default: from the earliest event the store still keeps].",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many events [default: 100; with --follow: no limit].",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are committed, until Ctrl-C.")
@click.pass_context
def events(ctx: click.Context, thread: str, after: int | None, limit: int | None, follow: bool) -> None:
    """Print THREAD's numbered events after --after, oldest first.

    Without --after it starts at the earliest event still kept (retention and compaction drop older ones). With
    --follow, waits for new commits (from any process) and prints each event as it lands; Ctrl-C ends it with
    exit status 0. With --json, --follow prints one JSON object per line.
    """
    state = _state(ctx)
    store = state.store()
    if after is None:
        after = _earliest_after(store, thread)
    try:
        _print_events(state, store, thread, after, limit, follow)
    except ReplayUnavailable as error:  # told in the command's words (--after), not the library's (after_seq)
        raise CliError(
            f"events of thread {thread!r} before {error.earliest_seq} were compacted or pruned; use --after "
            f"{error.earliest_seq - 1} or more, or leave --after out to start at the earliest kept",
            kind="ReplayUnavailable",
        ) from error


def _print_events(
    state: CliState, store: Checkpointer, thread: str, after: int, limit: int | None, follow: bool
) -> None:
    if follow:
        if state.json_output:

            def deliver(event: EventRecord) -> None:
                sys.stdout.write(json_text(event_json(event)) + "\n")
                sys.stdout.flush()

        else:

            def deliver(event: EventRecord) -> None:
                state.out.print(_event_line(event))
                state.out.file.flush()

        follow_events(store, thread, after, limit, deliver)
        return
    items = _read_events(store, thread, after, 100 if limit is None else limit)
    if not items and after == 0 and store.latest(thread) is None:
        raise _unknown_thread(state, thread)
    if state.json_output:
        last = items[-1].seq if items else after
        state.emit({"thread_id": thread, "events": [event_json(ev) for ev in items], "last_seq": last})
        return
    table = _table(f"events of {thread!r} after {after}", "seq", "type", "run", "token", "node", "timestamp", "payload")
    for ev in items:
        table.add_row(
            _text(ev.seq), _text(ev.type), _text(ev.run_id), _text(ev.token), _plain(ev.node_id),
            _when(ev.timestamp), _compact(ev.payload),
        )
    state.out.print(table)


# -- sweep ---------------------------------------------------------------------------------------------------------------


@attrs.define
class SweepTotals:
    """What a whole sweep did: pages called, threads visited, pruned and reclaimed."""

    pages: int = 0
    visited: int = 0
    pruned: int = 0
    reclaimed: int = 0


def sweep_all(store: Checkpointer, policy: SweepPolicy) -> Iterator[SweepTotals]:
    """Runs ``store.sweep`` page after page from the start until the cursor ends; yields the totals after each.

    The sweep has no guard (the command does not know which runs a live runtime protects).
    """
    totals = SweepTotals()
    after: str | None = None
    while True:
        page = store.sweep(policy, None, after=after)
        totals.pages += 1
        totals.visited += len(page.visited)
        totals.pruned += len(page.pruned)
        totals.reclaimed += len(page.reclaimed)
        yield totals
        if page.next is None:
            return
        after = page.next


def _td_json(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@cli.command()
@click.option("--max-age", type=DURATION, default=None, help="Remove checkpoints and events at least this old (30s, 2h, 7d).")
@click.option("--max-checkpoints", type=click.IntRange(min=1), default=None, help="Keep at most this many per thread.")
@click.option("--max-events", type=click.IntRange(min=0), default=None, help="Keep at most this many events per thread.")
@click.option("--tombstone-age", type=DURATION, default=None, help="Reclaim delete tombstones older than this.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=100, show_default=True, help="Threads per page.")
@click.pass_context
def sweep(
    ctx: click.Context,
    max_age: timedelta | None,
    max_checkpoints: int | None,
    max_events: int | None,
    tombstone_age: timedelta | None,
    batch_size: int,
) -> None:
    """Apply a retention policy to every thread of the store, page by page.

    Each thread keeps its latest checkpoint and its pending writes whatever the policy. This sweep has no guard:
    it does not know which runs a live runtime protects (the runtime's own scheduled sweep does). Ages are
    judged by the store's clock. Without options it only visits.
    """
    state = _state(ctx)
    store = state.store()
    policy = SweepPolicy(
        retention=RetentionPolicy(max_age=max_age, max_checkpoints=max_checkpoints, max_events=max_events),
        batch_size=batch_size,
        tombstone_age=tombstone_age,
    )
    progress = Progress(
        SpinnerColumn(),
        TextColumn("sweeping"),
        BarColumn(),
        TextColumn("{task.fields[visited]} visited · {task.fields[pruned]} pruned · {task.fields[reclaimed]} reclaimed"),
        TimeElapsedColumn(),
        console=state.err,
        transient=True,
        disable=state.json_output or not state.err.is_terminal,
    )
    totals = SweepTotals()
    interrupted = False
    with progress:
        task = progress.add_task("sweep", total=None, visited=0, pruned=0, reclaimed=0)
        try:
            for totals in sweep_all(store, policy):
                progress.update(task, visited=totals.visited, pruned=totals.pruned, reclaimed=totals.reclaimed)
        except KeyboardInterrupt:
            interrupted = True
    _log.info("sweep.finished", pages=totals.pages, visited=totals.visited, pruned=totals.pruned,
              reclaimed=totals.reclaimed, interrupted=interrupted)
    if state.json_output:
        state.emit(
            {
                "policy": {
                    "max_age_s": _td_json(max_age),
                    "max_checkpoints": max_checkpoints,
                    "max_events": max_events,
                    "tombstone_age_s": _td_json(tombstone_age),
                    "batch_size": batch_size,
                },
                "pages": totals.pages,
                "visited": totals.visited,
                "pruned": totals.pruned,
                "reclaimed": totals.reclaimed,
                "complete": not interrupted,
            }
        )
    else:
        table = _table(
            "sweep" + (" (interrupted)" if interrupted else "") + ": counts of threads",
            "pages", "threads visited", "threads pruned", "tombstones reclaimed",
        )
        table.add_row(*(Text(str(n)) for n in (totals.pages, totals.visited, totals.pruned, totals.reclaimed)))
        state.out.print(table)
    if interrupted:
        ctx.exit(EXIT_INTERRUPTED)


# -- later commands ------------------------------------------------------------------------------------------------------
# A later command (``demo``: the multi-process crash demo; ``simulate``) is defined in a module of its own and named
# in LAZY_COMMANDS above, as ``stats`` is; e.g. LAZY_COMMANDS["simulate"] = "threadloom.simulations.cli:simulate".


def main(argv: Sequence[str] | None = None) -> None:
    """The console script ``threadloom`` (and ``python -m threadloom``): runs the command and exits."""
    cli.main(args=argv, prog_name="threadloom")


__all__ = [
    "DEFAULT_STORE_URL",
    "DURATION",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "LAZY_COMMANDS",
    "CliError",
    "CliState",
    "cli",
    "configure_logging",
    "error_document",
    "follow_events",
    "json_text",
    "main",
    "parse_duration",
    "printable",
    "scrub",
    "url_secrets",
]
