"""``open_store(url)``: a store from a URL. The SQLite and PostgreSQL stores are imported only when a URL names
them, so that no store module imports this one back.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs

from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import Checkpointer, StoreBase
from threadloom.persistence.logs import slow_call_seconds
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.urls import redact_url, sqlite_file


def _check_postgres_url(url: str) -> None:
    """Refuses a ``postgresql://`` URL whose user name or password holds a raw ``/`` or ``@``.

    libpq ends the user info at the first ``@`` or ``/``, so such a password would be read as a host, port or
    database name (and shown in its error messages in pieces no scrubbing recognises); :func:`redact_url` reads
    up to the last ``@``. Where the two readings differ, and the last ``@`` is not in the query, the URL is
    refused.
    """
    _head, sep, rest = url.partition("://")
    if not sep:
        raise ValidationError("url", (f"{redact_url(url)!r} is not of the form postgresql://user@host:5432/db",))
    last_at = rest.rfind("@")
    if last_at < 0 or ":" not in rest[:last_at]:
        return
    scan = next((i for i, ch in enumerate(rest) if ch in "@/"), len(rest))
    libpq_at = scan if scan < len(rest) and rest[scan] == "@" else -1
    host_start = libpq_at + 1
    query = rest.find("?", host_start)
    if last_at != libpq_at and (query < 0 or last_at < query):
        raise ValidationError(
            "url",
            (
                (
                    f"{redact_url(url)!r}: the user name or password holds a raw '/' or '@', which PostgreSQL "
                    "would read as part of the host or database; percent-encode them ('/' as %2F, '@' as %40)"
                ),
            ),
        )


def _take_options(store: str, factory: Callable[..., Any], options: dict[str, Any]) -> None:
    """Refuses an option ``factory`` (a store's constructor) does not take, naming it."""
    parameters = list(inspect.signature(factory).parameters.values())[1:]  # after the path / conninfo / self
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in options:
        if name not in accepted:
            takes = ", ".join(accepted) if accepted else "no option"
            raise ValidationError(name, (f"is not an option of a {store} store (it takes: {takes})",))


SLOW_CALL_ENV = "THREADLOOM_SLOW_CALL_MS"
"""The environment variable ``open_store`` reads when no ``slow_call`` option is given: milliseconds (0: off)."""
_UNSET: Any = object()


def _slow_call_from_env() -> timedelta | None | Any:
    text = os.environ.get(SLOW_CALL_ENV, "").strip()
    if not text:
        return _UNSET
    try:
        millis = float(text)
    except ValueError:
        millis = -1.0
    if not millis >= 0 or millis == float("inf"):
        raise ValidationError(SLOW_CALL_ENV, (f"must be a number of milliseconds >= 0 (0: off), got {text!r}",))
    return timedelta(milliseconds=millis)


def open_store(url: str, **options: Any) -> Checkpointer:
    """Builds a store from a URL.

    Args:
        url: ``memory://``; ``sqlite:///relative/or//absolute/path.db`` (``sqlite://`` alone: ``threadloom.db``
            in the working directory; ``sqlite:///`` with no path is refused; no ``?`` query or ``#`` fragment:
            percent-encode those characters in a file name); ``postgresql://…`` or ``postgres://…`` (needs the
            ``postgres`` extra; percent-encode ``/`` and ``@`` in a user name or password).
        **options: ``slow_call`` (every store): log ``store.call_slow`` for a call slower than this
            ``timedelta`` (default: ``$THREADLOOM_SLOW_CALL_MS`` milliseconds if set, else 1 s; None or
            ``timedelta(0)``: never). The others go to the store's constructor: ``clock`` for memory;
            ``clock``, ``busy_timeout``, ``synchronous``, ``read_only`` for SQLite; ``config`` for PostgreSQL
            (``config.create=False``: never create or migrate the schema). Every store takes
            ``max_json_size``, the longest JSON text in characters of one stored record (default 16 MiB; for
            PostgreSQL it sets ``config.max_json_size``), and ``access``, the node's ``AccessSchemas`` (README
            "Access schemas"; default: none declared).

    Returns:
        The open store (a SQLite file is created and migrated if it does not exist; with ``read_only=True``
        nothing is created, migrated or written, and a file that holds no threadloom store is refused).

    Raises:
        ValidationError: ``url`` is not a str, names no known store or is malformed (field ``url``; the message
            never shows a password), an option is one the chosen store does not take (field: the option), or
            ``slow_call`` / ``$THREADLOOM_SLOW_CALL_MS`` is not a duration >= 0; nothing is opened. For SQLite
            also (field ``path``) a path that names no file (a directory, a FIFO), or a file whose directory does
            not exist: not retryable, nothing is created.
        ProcessingError: the store cannot be opened (as its constructor documents).
    """
    if not isinstance(url, str):
        raise ValidationError("url", (f"must be a str, got {type(url).__name__}",))
    slow_call = options.pop("slow_call", _UNSET)
    if slow_call is _UNSET:
        slow_call = _slow_call_from_env()
    if slow_call is not _UNSET:
        slow_call_seconds(slow_call)  # refused before anything is opened
    store = _open(url, options)
    if slow_call is not _UNSET and isinstance(store, StoreBase):
        store.slow_call = slow_call
    return store


def _open(url: str, options: dict[str, Any]) -> Checkpointer:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        _take_options("memory", InMemoryCheckpointer.__init__, options)
        return InMemoryCheckpointer(**options)
    if scheme == "sqlite":
        from threadloom.persistence.sqlite.store import SqliteCheckpointer

        path = sqlite_file(url)
        assert path is not None
        _take_options("SQLite", SqliteCheckpointer.open, options)
        return SqliteCheckpointer.open(path, **options)
    if scheme in ("postgresql", "postgres"):
        _check_postgres_url(url)
        try:
            from threadloom.persistence.postgres.store import PostgresCheckpointer
        except ImportError as error:
            raise ValidationError(
                "url", (f"PostgreSQL needs the postgres extra (pip install 'threadloom[postgres]'): {error}",)
            ) from error
        if "max_json_size" in options:  # a field of the PostgreSQL config, as every store's option
            from threadloom.persistence.postgres.config import PostgresCheckpointerConfig

            config = options.get("config") or PostgresCheckpointerConfig()
            if isinstance(config, PostgresCheckpointerConfig):
                options["config"] = attrs.evolve(config, max_json_size=options.pop("max_json_size"))
        _take_options("PostgreSQL", PostgresCheckpointer.open, options)
        return PostgresCheckpointer.open(url, **options)
    raise ValidationError(
        "url", (f"{redact_url(url)!r} names no store; use memory://, sqlite:///path.db or postgresql://…",)
    )
