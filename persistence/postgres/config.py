"""``PostgresCheckpointerConfig``: how a PostgreSQL store reaches and bounds its database, and its limits.

Imports nothing of psycopg, so the configuration can be built without the ``postgres`` extra.
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import timedelta
from typing import Any

import attrs

from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import DEFAULT_MAX_JSON_SIZE, MAX_MAX_JSON_SIZE

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

MIN_CALL_TIMEOUT = timedelta(milliseconds=10)
"""Shortest ``call_timeout``: below it a call cannot even reach a nearby server (and the migration at
:meth:`~threadloom.persistence.postgres.PostgresCheckpointer.open` would always time out)."""

MAX_CALL_TIMEOUT = timedelta(days=1)
"""Longest ``call_timeout``: it is set on the server in milliseconds (``statement_timeout`` and the other two
limits are ``int4``, at most about 24.8 days), and a call that may run a day is no longer bounded in any
useful sense."""

MIN_CONNECT_TIMEOUT = timedelta(milliseconds=10)
"""Shortest ``connect_timeout``: the wait for a pooled connection."""

MAX_CONNECT_TIMEOUT = timedelta(minutes=10)
"""Longest ``connect_timeout``: :meth:`~threadloom.persistence.postgres.PostgresCheckpointer.open` may wait this
long for a server, and every call this long for a free connection."""

DEADLINE_MARGIN = timedelta(milliseconds=250)
"""How long after ``call_timeout`` the client aborts a call the server has not answered (the server's own
``statement_timeout``/``lock_timeout`` answer first when it is reachable). Capped at a quarter of
``call_timeout``."""

_LIMITS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
"""The server-side limits a call runs under, each set to ``call_timeout``."""


def _check_schema(_inst: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise ValidationError("config.schema", (f"must be a str, got {type(value).__name__}",))
    problems = []
    if not _SCHEMA_RE.fullmatch(value):
        problems.append("must be an identifier: a letter or underscore, then letters, digits or underscores")
    if len(value.encode()) > 63:
        problems.append("must be at most 63 bytes (PostgreSQL's identifier limit)")
    if value.lower().startswith("pg_"):
        problems.append("must not start with pg_ (reserved for system schemas)")
    if value.lower() == "information_schema":
        problems.append("must not be information_schema (a system schema)")
    if problems:
        raise ValidationError("config.schema", tuple(problems))


def _check_size(field: str, low: int):
    return lambda _inst, _attr, value: v.check_int(field, value, low=low, high=10_000)


def _check_bounded(field: str, low: timedelta, high: timedelta):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if isinstance(value, timedelta) and value > high:
            raise ValidationError(field, (f"must be at most {high.total_seconds():g} s ({high}), got {value}",))
        v.check_positive_duration(field, value)
        if value < low:
            raise ValidationError(field, (f"must be at least {low.total_seconds():g} s, got {value}",))

    return check


def _check_flag(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValidationError(field, (f"must be True or False, got {type(value).__name__}",))


@attrs.frozen(kw_only=True)
class PostgresCheckpointerConfig:
    """How a :class:`~threadloom.persistence.postgres.PostgresCheckpointer` reaches and bounds its database.

    Attributes:
        schema: the schema holding the store's tables: an identifier (letters, digits, underscores; not
            ``pg_…`` nor ``information_schema``, in any case; at most 63 bytes), always quoted in SQL. Stores on
            one schema share one storage.
        min_size: connections the store's own pool keeps open (>= 0).
        max_size: most connections that pool opens (>= 1, >= ``min_size``). The listener of
            ``await_events_after`` uses one more, outside the pool.
        connect_timeout: longest wait for a connection (opening one, or taking one from the pool): 10 ms to
            10 minutes (:data:`MIN_CONNECT_TIMEOUT`, :data:`MAX_CONNECT_TIMEOUT`).
        call_timeout: longest a call may run on its connection: set on the server for each transaction
            (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``) and enforced on
            the client, so every call returns within a bound: 10 ms to 1 day (:data:`MIN_CALL_TIMEOUT`,
            :data:`MAX_CALL_TIMEOUT`; the server takes these limits in ``int4`` milliseconds).
        create: create the schema and its tables when it holds no store yet (default). False: such a schema is
            refused with a ProcessingError and nothing is created, as a read-only tool wants (a store already
            there is still migrated to this version).
        max_json_size: the longest JSON text, in characters, of one record a commit stores (a checkpoint with
            its state, a pending write, an event, an effect record); default 16 MiB, at most 128 MiB. A longer
            one is a ``ValidationError`` before anything is sent (README "Limits").

    Raises:
        ValidationError: a field out of range, naming it (``config.schema``, ``config.max_size``…).
    """

    schema: str = attrs.field(default="threadloom", validator=_check_schema)
    min_size: int = attrs.field(default=1, validator=_check_size("config.min_size", 0))
    max_size: int = attrs.field(default=10, validator=_check_size("config.max_size", 1))
    connect_timeout: timedelta = attrs.field(
        default=timedelta(seconds=5),
        validator=_check_bounded("config.connect_timeout", MIN_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT),
    )
    call_timeout: timedelta = attrs.field(
        default=timedelta(seconds=10),
        validator=_check_bounded("config.call_timeout", MIN_CALL_TIMEOUT, MAX_CALL_TIMEOUT),
    )
    create: bool = attrs.field(default=True, validator=lambda _i, _a, value: _check_flag("config.create", value))
    max_json_size: int = attrs.field(
        default=DEFAULT_MAX_JSON_SIZE,
        validator=lambda _i, _a, value: v.check_int("config.max_json_size", value, low=1, high=MAX_MAX_JSON_SIZE),
    )

    def __attrs_post_init__(self) -> None:
        if self.max_size < self.min_size:
            raise ValidationError(
                "config.max_size", (f"must be at least min_size ({self.min_size}), got {self.max_size}",)
            )

    @property
    def channel(self) -> str:
        """The ``LISTEN``/``NOTIFY`` channel of the schema: ``threadloom.<schema>`` (hashed when too long)."""
        name = f"threadloom.{self.schema}"
        if len(name.encode()) <= 63:
            return name
        return "threadloom." + hashlib.sha256(self.schema.encode()).hexdigest()[:40]

    @property
    def events_channel(self) -> str:
        """The channel a commit whose events fit a notification sends them on (a JSON array of the stored event
        texts, in ``seq`` order): ``threadloom-events.<schema>`` (hashed when too long)."""
        name = f"threadloom-events.{self.schema}"
        if len(name.encode()) <= 63:
            return name
        return "threadloom-events." + hashlib.sha256(self.schema.encode()).hexdigest()[:40]

    @property
    def call_timeout_ms(self) -> int:
        """``call_timeout`` in whole milliseconds (at least 1), as the server's limits take it."""
        return max(1, math.ceil(self.call_timeout.total_seconds() * 1000))

    @property
    def deadline_s(self) -> float:
        """Seconds after which the client aborts a call: ``call_timeout`` plus :data:`DEADLINE_MARGIN` (capped)."""
        call_s = self.call_timeout.total_seconds()
        return call_s + min(DEADLINE_MARGIN.total_seconds(), call_s / 4)

    def limits(self, verb: str) -> str:
        """The three server-side limits of a call at ``call_timeout``, as ``SET`` or ``SET LOCAL`` statements."""
        return "".join(f"{verb} {name} = {self.call_timeout_ms}; " for name in _LIMITS)


def session_settings(config: PostgresCheckpointerConfig) -> str:
    """What a store's own pool runs on each new connection: the call limits and READ COMMITTED writes.

    Returns:
        ``SET`` statements: ``statement_timeout``, ``lock_timeout`` and ``idle_in_transaction_session_timeout``
        at ``config.call_timeout`` (milliseconds), and ``default_transaction_isolation`` READ COMMITTED.
    """
    return config.limits("SET") + "SET default_transaction_isolation = 'read committed'"


__all__ = [
    "DEADLINE_MARGIN",
    "MAX_CALL_TIMEOUT",
    "MAX_CONNECT_TIMEOUT",
    "MIN_CALL_TIMEOUT",
    "MIN_CONNECT_TIMEOUT",
    "PostgresCheckpointerConfig",
    "session_settings",
]
