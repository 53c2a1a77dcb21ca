"""The ``Checkpointer`` contract and its stores (DESIGN §3)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.clock import SystemClock
from threadloom.persistence.memory import InMemoryCheckpointer

DEFAULT_SQLITE_PATH = "threadloom.db"
"""The file ``open_store("sqlite://")`` and the CLI use when no path is given: in the working directory."""


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages (DESIGN §3)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable store URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def open_store(url: str, **options: Any) -> Checkpointer:
    """Builds a store from a URL (DESIGN §3).

    Args:
        url: ``memory://``; ``sqlite:///relative/or//absolute/path.db`` (``sqlite://`` alone: ``threadloom.db``
            in the working directory); ``postgresql://…`` or ``postgres://…`` (needs the ``postgres`` extra).
        **options: passed to the store's constructor: ``clock`` for memory and SQLite, ``busy_timeout`` for
            SQLite, ``config`` for PostgreSQL.

    Raises:
        ValidationError: ``url`` is not a str or names no known store (the message never shows a password).
    """
    if not isinstance(url, str):
        raise ValidationError("url", (f"must be a str, got {type(url).__name__}",))
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        return InMemoryCheckpointer(**options)
    if scheme == "sqlite":
        from threadloom.persistence.sqlite import SqliteCheckpointer

        rest = url[len("sqlite:") :]
        if not rest.startswith("//"):
            raise ValidationError("url", (f"{url!r} is not of the form sqlite:///path/to/file.db",))
        path = unquote(rest[2:])
        if path.startswith("/"):
            path = path[1:] or DEFAULT_SQLITE_PATH  # sqlite:///rel.db → rel.db; sqlite:////abs.db → /abs.db
        return SqliteCheckpointer.open(path or DEFAULT_SQLITE_PATH, **options)
    if scheme in ("postgresql", "postgres"):
        try:
            from threadloom.persistence.postgres import PostgresCheckpointer
        except ImportError as error:
            raise ValidationError(
                "url", (f"PostgreSQL needs the postgres extra (pip install 'threadloom[postgres]'): {error}",)
            ) from error
        return PostgresCheckpointer.open(url, **options)
    raise ValidationError(
        "url", (f"{redact_url(url)!r} names no store; use memory://, sqlite:///path.db or postgresql://…",)
    )


__all__ = ["Checkpointer", "DEFAULT_SQLITE_PATH", "InMemoryCheckpointer", "SystemClock", "open_store", "redact_url"]
