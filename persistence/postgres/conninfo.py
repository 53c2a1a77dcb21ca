"""Connection strings: the schema named in a URL, libpq's reading of a string, and keeping passwords out of text.

A connection string's password never appears in an error, a log line or a ``repr``: what is shown of a string
is :func:`target_of` (``user@host:port/dbname``), and driver text passes through :func:`scrub` first.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from threadloom.domain.errors import ProcessingError, ValidationError
from threadloom.persistence.urls import url_secrets

_URI_PREFIXES = ("postgresql://", "postgres://")  # as libpq spells them (case-sensitive)
_PARSE_REFUSAL = re.compile(r'invalid (?:connection option|URI query parameter):? "([A-Za-z_][A-Za-z0-9_]*)"')


def require_psycopg() -> None:
    """Raises ``ProcessingError`` naming the ``postgres`` extra when psycopg or psycopg_pool is missing."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as error:
        raise ProcessingError(
            "open", f"PostgreSQL needs the postgres extra (pip install 'threadloom[postgres]'): {error}"
        ) from error


def _problem(why: str) -> ValidationError:
    return ValidationError("conninfo", (f"{why} (the string is not shown: it may hold a password)",))


def take_schema(conninfo: str) -> tuple[str, str | None]:
    """``conninfo`` without its ``schema`` query parameter, and that parameter (None when absent).

    Only a ``postgresql://`` (or ``postgres://``) URL has a query; its parts are found as libpq finds them: the
    user info ends at the first ``@`` before any ``/`` (a password may hold ``?`` and ``#``), and the query
    starts at the first ``?`` after it. The value is percent-decoded, as libpq decodes the other parameters.

    Raises:
        ValidationError: (field ``conninfo``) the user info holds a raw ``/`` or ``@``, which libpq would read
            as part of the host or database (so a password would be shown as one), or ``schema`` is given twice.
    """
    prefix = next((p for p in _URI_PREFIXES if conninfo.startswith(p)), None)
    if prefix is None:
        return conninfo, None
    rest = conninfo[len(prefix) :]
    stop = next((i for i, ch in enumerate(rest) if ch in "@/"), len(rest))
    host_start = stop + 1 if stop < len(rest) and rest[stop] == "@" else 0
    mark = rest.find("?", host_start)
    last_at = rest.rfind("@", 0, mark if mark >= 0 else len(rest))
    if last_at >= host_start and ":" in rest[:last_at]:
        raise _problem(
            "the user name or password holds a raw '/' or '@', which PostgreSQL would read as part of the host "
            "or database; percent-encode them ('/' as %2F, '@' as %40)"
        )
    if mark < 0:
        return conninfo, None
    kept: list[str] = []
    found: list[str] = []
    for item in rest[mark + 1 :].split("&"):
        key, _sep, value = item.partition("=")
        if unquote(key) == "schema":
            found.append(unquote(value))
        else:
            kept.append(item)
    if not found:
        return conninfo, None
    if len(found) > 1:
        raise ValidationError("conninfo", ("the schema query parameter is given more than once",))
    query = "&".join(item for item in kept if item)
    return prefix + rest[:mark] + ("?" + query if query else ""), found[0]


def parse(conninfo: str) -> dict[str, Any]:
    """libpq's reading of ``conninfo`` (psycopg's ``conninfo_to_dict``), refused up front when it has none.

    Raises:
        ValidationError: (field ``conninfo``) libpq cannot parse it. The message never shows any part of the
            string (libpq's own message repeats it, password included); it names an unknown option.
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        return conninfo_to_dict(conninfo)
    except Exception as error:
        unknown = _PARSE_REFUSAL.search(str(error))
        if unknown is not None:
            name = unknown.group(1)
            hint = ""
            if name == "schema":
                hint = "; name the schema in a postgresql:// URL (?schema=name) or in config.schema"
            raise _problem(f"{name!r} is not a connection option libpq knows{hint}") from None
        raise _problem("is not a valid libpq connection string or postgresql:// URL") from None


def secrets_of(conninfo: str, parts: dict[str, Any] | None, kwargs: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Every form of every password ``conninfo`` (read as ``parts``) and ``kwargs`` hold, longest first."""
    found = set(url_secrets(conninfo))
    for source in (parts or {}, kwargs or {}):
        for key in ("password", "sslpassword"):
            if source.get(key):
                found.add(str(source[key]))
    return tuple(sorted(found, key=lambda text: (-len(text), text)))


def scrub(secrets: tuple[str, ...], text: str) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***`` (longest first: a shorter form inside a longer
    one goes with it)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def target_of(parts: dict[str, Any] | None, secrets: tuple[str, ...] = ()) -> str:
    """Where a connection string points, from libpq's reading of it: ``user@host:port/dbname``.

    Only those four values are shown - never a password, an option or the string itself; ``<unparsed
    conninfo>`` when there is no reading. Any password form found in them anyway is replaced by ``***``.
    """
    if parts is None:
        return "<unparsed conninfo>"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    user = parts.get("user")
    return scrub(secrets, f"{user + '@' if user else ''}{host}:{port}/{parts.get('dbname') or ''}")


def first_line(error: BaseException) -> str:
    """The first line of an error's text ('' when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


__all__ = ["first_line", "parse", "require_psycopg", "scrub", "secrets_of", "take_schema", "target_of"]
