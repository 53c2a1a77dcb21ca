"""What every ``threadloom`` command shares: exit codes, the global state, errors, escaping, JSON and tables.

Commands import their helpers from here, never from :mod:`threadloom.cli.main` (the group), so that the group
can load each command lazily and no import runs in a circle.

Importing this module costs little: it needs only ``click`` and the standard library at import time. rich, the
stores and the domain values are imported by the functions that use them, so ``threadloom --help`` and
``threadloom --version`` start without them.

Errors never print a traceback: one line ``threadloom: error: ...`` on stderr, and the exit status says what
went wrong (:data:`EXIT_FAILED`, :data:`EXIT_USAGE`, :data:`EXIT_INTERRUPTED`); with ``--json``, stdout also gets
one line ``{"error": {"type": ..., "message": ...}}`` (see :func:`error_document`). Text from the store (ids,
event types, metadata, payloads) is printed with its control characters escaped (:func:`printable`), so stored
data cannot drive the terminal.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from threadloom.domain.values import Checkpoint, EventRecord, PendingWrite, ThreadCursor, ThreadSummary
    from threadloom.persistence.base import Checkpointer

DEFAULT_SQLITE_PATH = "threadloom.db"
"""The SQLite file the command opens when no store is named: in the working directory.

The same file ``open_store("sqlite://")`` uses (``threadloom.persistence.DEFAULT_SQLITE_PATH``); spelled out here
so that the command's help does not import the stores.
"""
DEFAULT_STORE_URL = f"sqlite:///{DEFAULT_SQLITE_PATH}"
"""The store the command opens when neither ``--store`` nor ``$THREADLOOM_STORE`` names one."""

STORE_ENV = "THREADLOOM_STORE"
"""The environment variable naming the store when ``--store`` is not given."""

EXIT_OK = 0
EXIT_FAILED = 1
"""The store refused or failed (any ``ThreadloomError`` but bad input), or the thread is unknown."""
EXIT_USAGE = 2
"""Bad command line or input: unknown option, bad duration, bad store URL, invalid id (``ValidationError``)."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C) in a command other than ``events --follow``, for which Ctrl-C is the normal end."""
EXIT_BROKEN_PIPE = 141
"""Standard output was closed before the output was written (``threadloom ... | head``): 128 + SIGPIPE, the status
of a Unix tool that SIGPIPE ended. What the command did to the store is done; only its output was cut."""


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


class FiniteFloatRange(click.FloatRange):
    """A :class:`click.FloatRange` that also refuses NaN, which compares false with both bounds and would pass.

    A number out of the range (``inf`` above a bound, a negative number below 0) is refused by the range itself;
    the message names the option and the range, as for every option click checks.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number != number:  # NaN
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


class TenantType(click.ParamType):
    """A click parameter type for a tenant id: a non-empty string of at most 255 characters without NUL (the
    stores' id rule), refused at parse time with the option's name (exit 2) before any store is opened."""

    name = "tenant"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from threadloom.domain import validation as v  # here: ``--help`` does not import the domain
        from threadloom.domain.errors import ValidationError

        try:
            return v.check_id("tenant", value)
        except ValidationError as error:
            self.fail("; ".join(error.problems), param, ctx)


TENANT = TenantType()


# -- secrets and terminal safety ---------------------------------------------------------------------------------------


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (longest secrets first).

    The secrets of a store URL (its password in the forms it may be printed in) are
    ``threadloom.persistence.url_secrets(url)``.
    """
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


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
    import json  # here, not at the top: --help and --version print no JSON

    separators = (",", ":") if compact else None
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators).translate(_JSON_SAFE)


# -- errors ----------------------------------------------------------------------------------------------------------


class CliError(click.ClickException):
    """An error the command reports on one line and exits with ``exit_code`` (default :data:`EXIT_FAILED`).

    Attributes:
        kind: the ``type`` of the ``--json`` error document: the library error's class name where one caused it
            (``ValidationError``, ``ProcessingError``), else the command's own (``UnknownThread``,
            ``StoreNotFound``, ``CommandError``).
    """

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, kind: str = "CommandError") -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click types it a ClassVar, reads it off the instance
        self.kind = kind


def error_document(kind: str, message: str) -> dict[str, Any]:
    """The JSON document a failed command prints on stdout with ``--json`` (besides its stderr line).

    Shape: ``{"error": {"type": kind, "message": message}}``, printed on one line, with the exit status of the
    stderr line. ``type`` is the library error's class name (``ValidationError``, ``ProcessingError``,
    ``CheckpointNotFound``, ``ThreadDeleted``, ...) or one of the command's own: ``UsageError`` (bad command
    line), ``UnknownThread``, ``StoreNotFound``, ``StoreDamaged`` (``check`` found problems), ``Interrupted``,
    ``CommandError``, ``UnexpectedError``.
    ``message`` is the stderr line's text without its ``threadloom: error:`` prefix (the password scrubbed).
    Not printed when the command already printed its JSON document (``stats`` reports a probe failure in it).
    """
    return {"error": {"type": kind, "message": message}}


def parse_json_option(option: str, text: str) -> Any:
    """The JSON value of the ``option`` a user gave as ``text`` (strict: ``NaN``/``Infinity`` refused, and an
    object that names one key twice is refused rather than keeping the last value, which the user may not mean).

    Raises:
        CliError: exit status :data:`EXIT_USAGE`, kind ``ValidationError``, one line naming ``option`` and what is
            wrong (the duplicated key, the position of a syntax error, nesting too deep).
    """
    import json  # here, not at the top: --help and --version parse no JSON

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made: dict[str, Any] = {}
        for key, value in items:
            if key in made:
                raise CliError(f"{option} names the key {json_text(key)} twice in one object", EXIT_USAGE,
                               kind="ValidationError")
            made[key] = value
        return made

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except ValueError as error:
        raise CliError(f"{option} is not a JSON value: {error}", EXIT_USAGE, kind="ValidationError") from None
    except RecursionError:
        raise CliError(f"{option} nests too deeply to be read", EXIT_USAGE, kind="ValidationError") from None


class Outcome:
    """What the error report of one run needs to know: JSON wanted, and whether a JSON document was printed."""

    __slots__ = ("emitted", "json_output")

    def __init__(self, json_output: bool = False) -> None:
        self.json_output = json_output
        self.emitted = False


OUTCOME: contextvars.ContextVar[Outcome | None] = contextvars.ContextVar("threadloom_cli_outcome", default=None)
"""The current run's :class:`Outcome` (set by the group while a command line runs)."""


# -- state shared by the commands --------------------------------------------------------------------------------------


class CliState:
    """The global options, and the store once a command opened it (closed when the command ends).

    Attributes:
        store_url: the URL as given (holds the password, if any: print :attr:`safe_url` instead).
        json_output: print JSON instead of tables.
        out: the rich console on stdout; err: the one on stderr.
    """

    __slots__ = ("_store", "err", "json_output", "out", "store_url")

    def __init__(self, store_url: str, json_output: bool, out: Console, err: Console) -> None:
        self.store_url = store_url
        self.json_output = json_output
        self.out = out
        self.err = err
        self._store: Checkpointer | None = None

    def __repr__(self) -> str:
        return f"CliState(store_url={self.safe_url!r}, json_output={self.json_output!r})"

    @property
    def safe_url(self) -> str:
        """The store URL with its password replaced by ``***``."""
        from threadloom.persistence import redact_url

        return redact_url(self.store_url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The strings never to print (the URL's password in its forms)."""
        from threadloom.persistence import url_secrets

        return url_secrets(self.store_url)

    def store(self, *, create: bool = False, read_only: bool = False, quick_check: bool = False) -> Checkpointer:
        """The store named by ``--store``, opened on first use.

        Args:
            create: create (and migrate) a SQLite file, or a PostgreSQL schema, that holds no store yet. False
                (every command that only reads, and ``sweep``): a missing one is refused, so a mistyped path or
                schema creates nothing, and so is a SQLite file that holds no threadloom store (another
                application's database, an empty file: "... is not a threadloom store"), left byte for byte as
                it was; a store of an older schema is migrated by a command that writes.
            read_only: the command only reads: a SQLite file is opened read-only (nothing created, migrated or
                written; a file that holds no threadloom store is refused), and a PostgreSQL schema is neither
                created nor migrated.
            quick_check: (``sweep``) before a SQLite file is opened read-write, SQLite's ``quick_check`` of it,
                through a connection that changes nothing: a damaged file is refused (kind ``StoreCorrupt``) as it
                was, byte for byte.

        Raises:
            CliError: the URL is bad, or names a SQLite path that is a directory, a FIFO or another file that is
                not a regular file (found by ``os.stat``, never opened), or a file whose directory does not exist
                (:data:`EXIT_USAGE`, kind ``ValidationError``), names a SQLite file that does not exist, or a
                PostgreSQL schema with no store, and ``create`` is False (:data:`EXIT_FAILED`, kind
                ``StoreNotFound`` for SQLite, ``ProcessingError`` for PostgreSQL), or the store could not be opened.
        """
        if self._store is None:
            import structlog

            from threadloom.domain.errors import ThreadloomError, ValidationError
            from threadloom.persistence import open_store, sqlite_file

            try:
                path = sqlite_file(self.store_url)
                if path is not None:
                    from threadloom.persistence.sqlite.store import check_path

                    # Only looks (os.stat): a directory, a FIFO or a device is a bad URL before anything opens it
                    # (opening a FIFO blocks until a writer comes), and so is a missing directory.
                    check_path(path)
                if path is not None and not create and not os.path.exists(path):
                    raise CliError(
                        f"no store at {os.path.abspath(path)!r}; check the path, or create one: 'threadloom "
                        f"--store sqlite:///{path} serve --graph module:attr' (a worker), 'queue enqueue', 'demo', or "
                        "open_store(...) from Python",
                        kind="StoreNotFound",
                    )
                options = self._postgres_options(create)
                if path is not None and read_only:
                    options["read_only"] = True
                elif path is not None and not create:
                    self._check_existing(path, quick_check)
                self._store = open_store(self.store_url, **options)
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
            structlog.get_logger("threadloom.cli").debug("cli.store_opened", store=self.safe_url)
        return self._store

    def _check_existing(self, path: str, quick_check: bool) -> None:
        """A SQLite file a writing command opens without creating a store: it must hold one (any schema version
        up to this code's) and, with ``quick_check``, be sound; checked before anything can change the file."""
        from threadloom.persistence.sqlite import readonly
        from threadloom.persistence.sqlite.schema import SCHEMA_VERSION

        problems = readonly.check_existing(os.path.abspath(path), 5.0, SCHEMA_VERSION, quick_check=quick_check)
        if problems:
            shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
            raise CliError(
                f"the SQLite file of {self.safe_url!r} is damaged ({shown}); nothing was swept; run "
                "'threadloom check' and restore a backup",
                kind="StoreCorrupt",
            )

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
        outcome = OUTCOME.get()
        if outcome is not None:
            outcome.emitted = True


def state_of(ctx: click.Context) -> CliState:
    """The global options of the ``threadloom`` group that runs the command.

    Raises:
        CliError: the command was invoked on its own, without the group.
    """
    state = ctx.find_object(CliState)
    if state is None:  # a command invoked without the group (never through ``threadloom``)
        raise CliError("internal: the command ran without the threadloom group")
    return state


def console(stream: Any, *, stderr: bool = False) -> Console:
    """A rich console on ``stream``: 200 columns wide when piped (tables are not folded at 80), else the
    terminal's width (or ``$COLUMNS``); markup highlighting off."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit with status 1, which means "the store refused or failed": the command's own
            # handler ends it with EXIT_BROKEN_PIPE instead.
            self.quiet = True
            raise BrokenPipeError("standard output was closed")

    tty = bool(getattr(stream, "isatty", lambda: False)())
    width = None if tty or "COLUMNS" in os.environ else 200  # piped output: do not fold at 80 columns
    return PipeConsole(stderr=stderr, highlight=False, width=width)


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


# -- table cells -------------------------------------------------------------------------------------------------------


def cell(value: Any, style: str = "") -> Text:
    """A table cell: ``value`` as text (None: empty), escaped with :func:`printable`, never read as rich markup."""
    from rich.text import Text

    return Text("" if value is None else printable(str(value)), style=style)


def time_cell(when: datetime | None) -> Text:
    """A time as ``2026-01-01 12:00:00.000+00:00`` (milliseconds), or an empty cell."""
    from rich.text import Text

    return Text("" if when is None else when.isoformat(sep=" ", timespec="milliseconds"))


SHOWN_JSON_MAX = 100_000
"""How many characters of one JSON value a table cell or block shows; a longer value is cut there, shown compact
and not highlighted, with its full length (``--json`` gives all of it). Rendering a value of megabytes line by line
would take minutes and gigabytes (found by hostile testing: a 1.3 MB stored list took 36 s and 1.7 GB)."""


def _cut(compact: str) -> Text:
    from rich.text import Text

    return Text(f"{compact[:SHOWN_JSON_MAX]} … (cut: {len(compact):,} characters of JSON in all; --json gives all)")


def json_cell(value: Any) -> Text:
    """``value`` as compact JSON text on one line (escaped as :func:`json_text` does), cut at
    :data:`SHOWN_JSON_MAX` characters."""
    from rich.text import Text

    compact = json_text(value, compact=True)
    return _cut(compact) if len(compact) > SHOWN_JSON_MAX else Text(compact)


def json_block(value: Any) -> Text:
    """``value`` as indented, highlighted JSON (as ``rich.json.JSON``, but with :func:`json_text`'s escapes); a
    value longer than :data:`SHOWN_JSON_MAX` characters as :func:`json_cell` shows it."""
    from rich.highlighter import JSONHighlighter

    compact = json_text(value, compact=True)
    if len(compact) > SHOWN_JSON_MAX:
        return _cut(compact)
    text = JSONHighlighter()(json_text(value, indent=2))
    text.no_wrap = True
    text.overflow = None
    return text


def new_table(title: str, *columns: str) -> Table:
    """A table with ``title`` (escaped, never markup) on the left, a bold header, and columns that fold."""
    from rich.table import Table

    table = Table(title=cell(title), title_justify="left", header_style="bold")  # a Text: never rich markup
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def event_line(ev: EventRecord) -> Text:
    """One event on one line, as ``events --follow`` prints it: seq, timestamp, type, run, token, node, payload."""
    from rich.text import Text

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


__all__ = [
    "DEFAULT_SQLITE_PATH",
    "DEFAULT_STORE_URL",
    "DURATION",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "SHOWN_JSON_MAX",
    "OUTCOME",
    "STORE_ENV",
    "CliError",
    "CliState",
    "DurationType",
    "Outcome",
    "cell",
    "checkpoint_json",
    "console",
    "cursor_json",
    "error_document",
    "event_json",
    "event_line",
    "json_block",
    "json_cell",
    "json_text",
    "new_table",
    "parse_duration",
    "parse_json_option",
    "pending_write_json",
    "printable",
    "scrub",
    "state_of",
    "summary_json",
    "time_cell",
]
