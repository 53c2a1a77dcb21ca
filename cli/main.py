"""The ``threadloom`` command: read and sweep a store from a terminal or a script.

Usage: ``threadloom [--store URL] [--json] [--log-level LEVEL] COMMAND ...``; the three global options may also
follow the command name (``threadloom threads --json``). The store URL defaults to
``$THREADLOOM_STORE``, else ``sqlite:///threadloom.db`` (a file in the working directory). Every command prints
rich tables on stdout, or, with ``--json``, one JSON document (``events --follow``: one JSON object per line).

Errors never print a traceback: one line ``threadloom: error: ...`` on stderr, and the exit status says what
went wrong (see :mod:`threadloom.cli.output`); with ``--json``, stdout also gets one line
``{"error": {"type": ..., "message": ...}}``. A store URL's password never appears in output, errors or log lines.

Commands that only read (``threads``, ``show``, ``history``, ``events``, ``stats``, ``check``, ``backup``) open
a SQLite store read-only: they create, migrate and write nothing, and refuse a file that does not exist or holds
no threadloom store. ``sweep`` writes, but refuses a SQLite file that does not exist instead of creating it.

This module holds the group, its global options, the table of commands and :func:`main`; each command lives in a
module of its own, imported only when it runs, so ``threadloom --help`` and ``threadloom --version`` import
neither rich, structlog, the stores nor the runtime. Logging is configured (:mod:`threadloom.cli.logs`) once a
command runs, and put back as it was when it returns: the library itself never configures it.

Adding a command: define it in a module of its own as a :class:`click.Command` (importing its helpers from
:mod:`threadloom.cli.output`, never from this module) and name it in :data:`LAZY_COMMANDS` with its one-line
help. Inside it, :func:`threadloom.cli.output.state_of` gives the global options and
:meth:`~threadloom.cli.output.CliState.store` the opened store.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import click

from threadloom import __version__
from threadloom.cli.output import (
    DEFAULT_STORE_URL,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    OUTCOME,
    STORE_ENV,
    CliError,
    CliState,
    Outcome,
    console,
    error_document,
    json_text,
    printable,
    scrub,
)

LOG_LEVEL_ENV = "THREADLOOM_LOG_LEVEL"
"""The environment variable giving ``--log-level`` when the option is not given."""
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The choices of ``--log-level``."""


class LazyCommand(NamedTuple):
    """A command of the group, imported only when it runs.

    Attributes:
        target: ``"module:attribute"`` naming the :class:`click.Command`.
        help: the first paragraph of the command's help, what ``threadloom --help`` lists (a test keeps it equal
            to the command's own).
        hidden: left out of ``threadloom --help`` (as the command's own ``hidden``).
    """

    target: str
    help: str
    hidden: bool = False


LAZY_COMMANDS: dict[str, LazyCommand] = {
    "threads": LazyCommand(
        "threadloom.cli.read:threads", "List a tenant's root threads, most recently updated first."
    ),
    "tenants": LazyCommand(
        "threadloom.cli.tenants:tenants", "List the tenants with how many root threads each holds."
    ),
    "show": LazyCommand(
        "threadloom.cli.read:show", "Show THREAD's latest checkpoint, its pending writes and its registry row."
    ),
    "history": LazyCommand("threadloom.cli.read:history", "List THREAD's checkpoints, newest first."),
    "events": LazyCommand("threadloom.cli.read:events", "Print THREAD's numbered events after --after, oldest first."),
    "queue": LazyCommand(
        "threadloom.cli.queue:queue",
        "See and act on the run queue: list entries, enqueue a run, retry a failed one, cancel an open one.",
    ),
    "recover": LazyCommand(
        "threadloom.cli.thread_ops:recover",
        "Continue THREAD's incomplete run at the node after its last commit, and wait for it to end.",
    ),
    "delete": LazyCommand(
        "threadloom.cli.thread_ops:delete",
        "Delete THREAD and all its descendants (the runtime's fenced cascade); asks first unless --yes.",
    ),
    "sweep": LazyCommand(
        "threadloom.cli.sweep:sweep", "Apply a retention policy to every thread of the store, page by page."
    ),
    "backup": LazyCommand(
        "threadloom.cli.maintenance:backup",
        "Copy the store into the file DEST: one consistent snapshot, taken while writers go on.",
    ),
    "check": LazyCommand(
        "threadloom.cli.maintenance:check",
        "Verify the store's integrity; exit status 1 and a table of problems when it is not sound.",
    ),
    "stats": LazyCommand(
        "threadloom.cli.stats:stats",
        "Probe the store with read-only calls and print their metrics: calls, errors, latency per method.",
    ),
    "serve": LazyCommand(
        "threadloom.cli.serve:serve",
        "Work the store's run queue with the given graphs until SIGTERM or Ctrl-C.",
    ),
    "walks": LazyCommand(
        "threadloom.cli.walks:walks",
        "List the access walks per graph kind: schema hash, heads, cursor, count, completed, holder, live share.",
    ),
    "demo": LazyCommand(
        "threadloom.cli.demo.coordinator:demo",
        "Run the sample agent graph in worker processes, SIGKILL one mid-run, and verify what the store kept.",
    ),
    "demo-worker": LazyCommand(
        "threadloom.cli.demo.worker:demo_worker",
        "A worker of ``threadloom demo``: serves the store's run queue with the sample graphs until SIGTERM.",
        hidden=True,
    ),
    "demo-walk-worker": LazyCommand(
        "threadloom.cli.demo.walk_worker:demo_walk_worker",
        "A node of ``threadloom demo --walk``: walks its release's schema and commits live until SIGTERM.",
        hidden=True,
    ),
    "simulate": LazyCommand(
        "threadloom.cli.simulate:simulate_command",
        "Run the deterministic simulation of crashes and takeovers over seeds.",
    ),
}
"""Every command of the group: name -> where it is defined, and its one-line help for the listing."""

# While the group lists its commands (for --help, or to complete a command name), ``get_command`` answers with a
# stand-in made of the table's help (nothing is imported); otherwise with the real command.
_LISTING: contextvars.ContextVar[bool] = contextvars.ContextVar("threadloom_cli_listing", default=False)
# Where the logging configuration a command sets up is undone: entered by the group's callback, closed by main().
_CLEANUP: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar(
    "threadloom_cli_cleanup", default=None
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _StdoutClosed(Exception):
    """Standard output was closed under a command (a pipe's reader ended): :data:`EXIT_BROKEN_PIPE`."""


class ThreadloomGroup(click.Group):
    """The ``threadloom`` group: loads :data:`LAZY_COMMANDS` on use, and reports every error on one line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as error:  # click would end the process with status 1 ("the store failed")
            raise _StdoutClosed from error

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        entry = LAZY_COMMANDS.get(cmd_name)
        if command is None and entry is not None:
            if _LISTING.get():
                return click.Command(cmd_name, help=entry.help, hidden=entry.hidden)
            module_name, _, attribute = entry.target.partition(":")
            # As ``from module import attribute`` does (not importlib.import_module): ``python -X importtime``
            # then reports the command's module among the imports it times.
            command = getattr(__import__(module_name, fromlist=[attribute]), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Lists the commands with their one-line help from :data:`LAZY_COMMANDS`, importing none of them."""
        token = _LISTING.set(True)
        try:
            super().format_commands(ctx, formatter)
        finally:
            _LISTING.reset(token)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Completes command names (with their one-line help from :data:`LAZY_COMMANDS`) and the group's options,
        importing no command."""
        token = _LISTING.set(True)
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            _LISTING.reset(token)

    def main(
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
        with contextlib.ExitStack() as cleanup:
            token = _CLEANUP.set(cleanup)
            try:
                code = self._run(args, prog_name or "threadloom", complete_var, extra)
            finally:
                _CLEANUP.reset(token)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Sequence[str] | None, prog_name: str, complete_var: str | None, extra: Any) -> int:
        argv = hoist_global_options(list(sys.argv[1:] if args is None else args))
        # --json is known before parsing, so that a parse error is reported as a JSON document as well; the store
        # URL's password too, so that even a parse error never echoes it (read only when there is an error).
        outcome = Outcome(json_output=_argv_wants_json(argv))
        token = OUTCOME.set(outcome)

        def fail(message: str, code: int, kind: str) -> int:
            line = _one_line(scrub(message, _argv_secrets(argv)))
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
        except (BrokenPipeError, _StdoutClosed):  # stdout closed early (``threadloom ... | head``): not ours
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except Exception as error:
            library = _library_error(error)
            if library is not None:
                return fail(str(error), *library)
            # Never a traceback: one line, and the traceback in the debug log.
            structlog = sys.modules.get("structlog")
            if structlog is not None and structlog.is_configured():  # else its defaults would print on stdout
                structlog.get_logger("threadloom.cli").debug("cli.unexpected_error", exc_info=True)
            return fail(
                f"unexpected {type(error).__name__}: {error} (run with --log-level debug for details)",
                EXIT_FAILED,
                "UnexpectedError",
            )
        finally:
            OUTCOME.reset(token)


def _library_error(error: Exception) -> tuple[int, str] | None:
    """The exit status and error kind of a library error (``ValidationError``: :data:`EXIT_USAGE`; any other
    ``ThreadloomError``: :data:`EXIT_FAILED`), or None for any other exception."""
    # A library error can only have been raised once its module was imported: do not import it to find out.
    errors = sys.modules.get("threadloom.domain.errors")
    if errors is None:
        return None
    if isinstance(error, errors.ValidationError):
        return EXIT_USAGE, "ValidationError"
    if isinstance(error, errors.ThreadloomError):
        return EXIT_FAILED, type(error).__name__
    return None


GLOBAL_OPTIONS = {"--json": False, "--store": True, "--log-level": True}
"""The group's options (and whether each takes a value), also accepted after the command name."""
OWN_STORE_OPTION = frozenset({"demo", "simulate"})
"""Commands with a ``--store`` of their own: after their name, ``--store`` is theirs."""


def hoist_global_options(argv: list[str]) -> list[str]:
    """``argv`` with the group's options given after the command name moved before it.

    ``threadloom threads --json --store URL`` then means ``threadloom --json --store URL threads``. Nothing after
    a ``--`` moves, and ``--store`` stays with the commands that have their own (:data:`OWN_STORE_OPTION`).
    """
    index = 0
    while index < len(argv):  # the group's own options, up to the command name
        arg = argv[index]
        if arg == "--" or not arg.startswith("-"):
            break
        index += 2 if GLOBAL_OPTIONS.get(arg) else 1
    if index >= len(argv) or argv[index] == "--":
        return argv
    command = argv[index]
    head, tail, moved = argv[: index], [command], []
    rest = argv[index + 1 :]
    position = 0
    while position < len(rest):
        arg = rest[position]
        if arg == "--":
            tail.extend(rest[position:])
            break
        name = arg.partition("=")[0]
        if name in GLOBAL_OPTIONS and not (name == "--store" and command in OWN_STORE_OPTION):
            if GLOBAL_OPTIONS[name] and "=" not in arg and position + 1 < len(rest):
                moved.extend(rest[position : position + 2])
                position += 2
                continue
            moved.append(arg)
        else:
            tail.append(arg)
        position += 1
    return head + moved + tail


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


def _argv_secrets(argv: Sequence[str]) -> tuple[str, ...]:
    """The password forms of every store URL on the command line or in ``$THREADLOOM_STORE``."""
    urls = [os.environ.get(STORE_ENV, "")]
    for index, arg in enumerate(argv):
        if arg.startswith("--store="):
            urls.append(arg.partition("=")[2])
        elif arg == "--store" and index + 1 < len(argv):
            urls.append(argv[index + 1])
    urls = [url for url in urls if url]
    if not urls:
        return ()
    from threadloom.persistence import url_secrets

    found = [secret for url in urls for secret in url_secrets(url)]
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
@click.version_option(__version__, prog_name="threadloom")
@click.pass_context
def cli(ctx: click.Context, store_url: str, json_output: bool, log_level: str) -> None:
    """threadloom: durable, fenced agent threads. Read a store, run its queue, and operate on it.

    Some commands only read the store: threads, tenants, show, history, events, queue list, stats, walks, check
    and backup. The others write to it: serve works the run queue; queue enqueue, retry and cancel change it;
    recover and delete act on a thread; sweep applies retention; demo runs the demonstration (simulate uses
    stores of its own).

    Exit status: 0 done; 1 the store refused or failed, or the thread is unknown; 2 bad command line, store URL
    or input; 130 interrupted.
    """
    from threadloom.cli.logs import configure_logging, logging_restored

    state = CliState(
        store_url=store_url,
        json_output=json_output,
        out=console(sys.stdout),
        err=console(sys.stderr, stderr=True),
    )
    cleanup = _CLEANUP.get()
    if cleanup is not None:
        cleanup.enter_context(logging_restored())
    configure_logging(log_level.lower(), secrets=state.secrets)
    ctx.obj = state
    ctx.call_on_close(state.close)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script ``threadloom`` (and ``python -m threadloom``): runs the command and exits."""
    cli.main(args=argv, prog_name="threadloom")


__all__ = [
    "GLOBAL_OPTIONS",
    "LAZY_COMMANDS",
    "LOG_LEVELS",
    "LOG_LEVEL_ENV",
    "OWN_STORE_OPTION",
    "LazyCommand",
    "ThreadloomGroup",
    "cli",
    "hoist_global_options",
    "main",
]
