"""The one place where psycopg's errors become threadloom's: :func:`map_error`.

Classified by SQLSTATE (never by message text), by why the client aborted the call, and, for an error the
client raised itself (no SQLSTATE), by the state of the call's connection. What a caller can do decides the
kind:

=====================  ===========================================================================================
kind                   when
=====================  ===========================================================================================
``StoreUnavailable``   nothing was applied and the same call may pass later: no connection within the connect
                       timeout, a lost connection on a read, the client's deadline on a read, the server's
                       statement or lock timeout, a serialization failure or deadlock, too few resources
                       (disk full, out of memory, too many connections), a server shutting down
``OutcomeUnknown``     a write whose statement (and so its COMMIT) was in flight when the connection was lost
                       or the client's deadline aborted it, or whose answer could not be read
``StoreCorrupt``       a schema or table missing, functions or columns that do not match this version, data
                       the server or the driver reports damaged: a person must look
``StoreClosed``        the pool the store calls through is closed
``CancelledError``     the call's ``cancel`` event was set
``ProcessingError``    anything else, e.g. a value the driver could not convert (nothing was sent)
=====================  ===========================================================================================

A connection that cannot be opened (:func:`connect_error`) is ``StoreUnavailable`` when waiting may heal it (the
server refused or did not answer, is starting or shutting down, has no free slot), a plain
``ProcessingError`` when it cannot (no such database or role, authentication refused, an unknown host): a
connection string that names what is not there does not work by waiting, and a ``ValidationError`` (field
``conninfo``) when libpq or the server refused one of the string's option values (``sslmode=bogus``, a port out of
range, ``keepalives=often``, an ``options`` setting the server rejects).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from datetime import timedelta

from threadloom.domain.errors import (
    CancelledError,
    OutcomeUnknown,
    ProcessingError,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
    ThreadloomError,
    ValidationError,
)
from threadloom.persistence.postgres.conninfo import first_line

_CONNECTION_LOST = frozenset({"57P01", "57P02", "57P03", "25P03"})
"""Besides class 08: admin, crash and cannot-connect-now shutdowns, and the idle-in-transaction timeout."""
_SCHEMA_MISSING = frozenset({"3F000", "42P01"})
_SCHEMA_MISMATCH = frozenset({"42883", "42703", "42804"})
_DATA_CORRUPT = frozenset({"XX001", "XX002"})


_CANNOT_HEAL = (
    "does not exist",  # 3D000 no such database, 28000 no such role
    "authentication failed",  # 28P01 password, and peer, ident, cert... authentication
    "no pg_hba.conf entry",  # 28000 the server admits no such connection
    "no password supplied",  # the server asks for a password the string does not give
    "not permitted to log in",  # 28000 a role without LOGIN
    "permission denied for database",  # 42501 no CONNECT privilege
    "does not support SSL",  # sslmode=require against a server without SSL
    f"[Errno {socket.EAI_NONAME}]",  # psycopg's "failed to resolve host": no such name
)
"""Parts of the first line of a failed connection's message that no wait can heal. libpq reports no SQLSTATE for
a connection the server refused (only its message, in the server's ``lc_messages``), so this is the one
classification by text; an unrecognised message counts as one that may heal."""

_OPTION_REFUSED = re.compile(
    r"\binvalid (?:\w+ |\"\" )?value\b"  # libpq: invalid sslmode value, invalid "ssl_min_protocol_version" value,
    # invalid integer value; the server: invalid value for parameter
    r"|\binvalid port number\b"
    r"|\binvalid require_auth method\b"
    r"|\bcould not match \d+ (?:host names|port numbers)\b"
    r"|\bcould not parse network address\b"  # hostaddr
    r"|\bunrecognized configuration parameter\b"  # options=-c name=value
    r"|\binvalid command-line argument"  # options that are not -c settings
    r"|\brequires a value\b"  # options=-c without name=value
    r"|\bparameter \"\" cannot be (?:changed|set)\b"
    r"|\bdefinition of service \"\" not found\b"
)
"""libpq's and the server's refusals of an option value of the connection string. libpq raises them before it
sends anything, the server (a setting in ``options``) as the connection's FATAL error; neither has a SQLSTATE
psycopg reports for a connection, so they are recognised by text: the text after libpq's ``connection to server
… failed:``, with every quoted name emptied (``""``), so a host, socket directory or database whose name reads
like a refusal is not taken for one. No retry heals them."""

_QUOTED = re.compile(r'"[^"]*"')


def connect_error(
    error: BaseException, *, operation: str, target: str, scrub: Callable[[str], str] = lambda text: text
) -> ThreadloomError:
    """The threadloom error for a connection to ``target`` (``user@host:port/dbname``) that could not be opened.

    Returns:
        :class:`StoreUnavailable` when the same attempt may pass later (refused, no answer within the connect
        timeout, the server starting up, shutting down or out of connection slots, a temporary name-service
        failure); a plain :class:`ProcessingError` (not retryable) when the connection string names what is not
        there or is not admitted (no such database, role or host, authentication refused). The message is
        psycopg's own first line (``database "x" does not exist``, ``Connection refused``…), ``scrub``-bed of
        secrets. A :class:`ValidationError` (field ``conninfo``) when libpq or the server refused an option value
        of the connection string (``invalid sslmode value``, ``invalid port number``, ``invalid integer value``,
        ``invalid value for parameter``…): its message names the refused value and says to check the string.
    """
    if isinstance(error, ThreadloomError):
        return error
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # libpq: 'connection to server at "h", port p failed: FATAL:  <why>', then hint lines; the target is known
    why = lines[0].rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip() if lines else type(error).__name__
    why = why.removeprefix("connection is bad:").strip()
    if lines and _OPTION_REFUSED.search(_QUOTED.sub('""', why)):
        return ValidationError(
            "conninfo",
            (
                f"PostgreSQL at {target} refused an option of the connection string: {scrub(why)}; "
                "check the connection string (it is not shown: it may hold a password)",
            ),
        )
    hints = [line for line in lines[1:] if not line.startswith("connection to server")]
    detail = scrub(why + (f" ({' '.join(hints)})" if hints else ""))
    if any(part in text for part in _CANNOT_HEAL):
        return ProcessingError(
            operation, f"cannot connect to PostgreSQL at {target}: {detail}; check the connection string"
        )
    return StoreUnavailable(operation, f"cannot connect to PostgreSQL at {target}: {detail}; retry later")


def _is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` is psycopg's own report of a connection that failed (``OperationalError``)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - then it cannot be one of psycopg's errors
        return False
    return isinstance(error, psycopg.OperationalError)


def map_error(
    error: BaseException,
    *,
    operation: str,
    thread_id: str | None,
    write: bool,
    aborted: str | None = None,
    call_timeout: timedelta | None = None,
    scrub: Callable[[str], str] = lambda text: text,
    broken: bool | None = None,
    answered: bool = False,
    connect_failure: str | None = None,
) -> ThreadloomError:
    """The threadloom error for a failure of a database call (see the module docstring for the kinds).

    * ``aborted == "cancel"``: :class:`CancelledError`.
    * ``aborted == "timeout"``, or a lost connection (class ``08``, ``57P01``-``57P03``, ``25P03``; or no SQLSTATE
      and the connection is broken, or, when ``broken`` is not known, psycopg's ``OperationalError``): for a
      write :class:`OutcomeUnknown` (its COMMIT may have landed), else :class:`StoreUnavailable`.
    * a client-side error on a connection that is still sound (no SQLSTATE: psycopg's ``DataError`` or
      ``ProgrammingError`` while converting a value, ``InterfaceError``, any other exception): nothing was sent,
      so :class:`ProcessingError` - except when the statement had already been ``answered`` (the error came
      while reading its rows): a write then applied (:class:`OutcomeUnknown`), a read met a stored value the
      driver cannot load (:class:`StoreCorrupt`).
    * a server error (any other SQLSTATE): the transaction rolled back. :class:`StoreUnavailable` for timeouts
      (``57014``, ``55P03``), conflicts (class ``40``) and resources (class ``53``); :class:`StoreCorrupt` for
      a missing schema or table (``3F000``, ``42P01``), a schema whose functions or columns do not match this
      version (``42883``, ``42703``, ``42804``) and damaged data (``XX001``, ``XX002``); else
      :class:`ProcessingError`.
    * the pool: ``PoolTimeout`` is :class:`StoreUnavailable`, ``PoolClosed`` :class:`StoreClosed`.
    * a :class:`ThreadloomError` is returned unchanged.

    Args:
        operation: the store method, named in the error.
        thread_id: the thread the call was about, named in the message when given.
        write: whether the call writes (only a write can be :class:`OutcomeUnknown`).
        aborted: ``"timeout"`` or ``"cancel"`` when the client aborted the call's connection.
        call_timeout: the bound, named in timeout messages.
        scrub: removes secrets (the connection string's password) from driver text.
        broken: whether the call's connection is closed or broken after the error (None: not known).
        answered: whether the server had answered the statement (the error came while reading its rows).
        connect_failure: why the pool's last attempt to open a connection failed, named when no connection came.

    Returns:
        The error to raise (the caller raises it ``from None``: driver text may hold a password).
    """
    if isinstance(error, ThreadloomError):
        return error
    where = f" on thread {thread_id!r}" if thread_id is not None else ""
    bound = f"{call_timeout.total_seconds():g} s" if call_timeout is not None else "the call timeout"
    if aborted == "cancel":
        return CancelledError(operation)
    sqlstate = getattr(error, "sqlstate", None)
    detail = scrub(first_line(error))
    kind = type(error).__name__
    if kind in ("PoolTimeout", "TooManyRequests"):
        if connect_failure:
            return StoreUnavailable(
                operation,
                f"no database connection within the connect timeout{where}: the last attempt to connect failed "
                f"({scrub(connect_failure)})",
            )
        return StoreUnavailable(
            operation, f"no database connection became free within the connect timeout{where} ({detail})"
        )
    if kind == "PoolClosed":
        return StoreClosed(operation, f"the connection pool is closed{where}; open a new store")
    if aborted == "timeout":
        message = f"no answer from the database within {bound}{where}; the connection was aborted and discarded"
        return OutcomeUnknown(operation, message) if write else StoreUnavailable(operation, message)
    if sqlstate is None:
        lost = broken if broken is not None else _is_connection_error(error)
    else:
        lost = sqlstate.startswith("08") or sqlstate in _CONNECTION_LOST
    if lost:
        message = f"the database connection was lost{where} ({detail or kind})"
        return OutcomeUnknown(operation, message) if write else StoreUnavailable(operation, message)
    if sqlstate is None:
        return _client_side(operation, where, f"{kind}: {detail}" if detail else kind, write, answered)
    return _server_side(operation, where, sqlstate, detail, bound, write)


def _client_side(operation: str, where: str, text: str, write: bool, answered: bool) -> ThreadloomError:
    """An error the driver raised on a sound connection: a value it could not convert or load, a misuse."""
    if answered and write:
        return OutcomeUnknown(
            operation, f"the database applied the call{where}, but its answer could not be read ({text})"
        )
    if answered:
        return StoreCorrupt(operation, f"the database's answer{where} could not be read ({text})")
    return ProcessingError(
        operation, f"the database driver refused the call's values{where}; nothing was sent ({text})"
    )


def _server_side(operation: str, where: str, sqlstate: str, detail: str, bound: str, write: bool) -> ThreadloomError:
    """An error the server answered: its transaction rolled back, nothing was written."""
    if sqlstate == "57014":
        return StoreUnavailable(operation, f"the database cancelled the call{where} after {bound} ({detail})")
    if sqlstate == "55P03":
        return StoreUnavailable(
            operation, f"a lock{where} stayed held by another transaction for {bound}; nothing was written"
        )
    if sqlstate.startswith("40"):
        return StoreUnavailable(operation, f"a conflicting transaction{where} made the database roll back ({detail})")
    if sqlstate.startswith("53"):
        return StoreUnavailable(operation, f"the database lacks resources{where}: [{sqlstate}] {detail}")
    if sqlstate in _SCHEMA_MISSING:
        return StoreCorrupt(
            operation, f"the store's schema or one of its tables is missing{where}: was it dropped? ({detail})"
        )
    if sqlstate in _SCHEMA_MISMATCH:
        return StoreCorrupt(
            operation,
            f"the store's schema or functions do not match this version{where} ([{sqlstate}] {detail})"
            + ("; nothing was written" if write else ""),
        )
    if sqlstate in _DATA_CORRUPT:
        return StoreCorrupt(operation, f"the database reports damaged data{where}: [{sqlstate}] {detail}")
    return ProcessingError(operation, f"the database failed{where}: [{sqlstate}] {detail}")


__all__ = ["connect_error", "map_error"]
