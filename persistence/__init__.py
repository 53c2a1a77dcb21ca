"""The ``Checkpointer`` contract and its stores (DESIGN §3)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import attrs

from threadloom.domain.errors import ValidationError
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.clock import SystemClock
from threadloom.persistence.memory.store import InMemoryCheckpointer

DEFAULT_SQLITE_PATH = "threadloom.db"
"""The file ``open_store("sqlite://")`` and the CLI use when no path is given: in the working directory."""

REDACTED = "***"
"""What :func:`redact_url` writes in place of a password."""

# A ``?key=value`` / ``&key=value`` pair of a URL's query: the value runs to the next ``&`` (or the end). A
# lookahead, so that a pair inside another's value (``?a=b?password=x``) is found too.
_QUERY_PARAMETER = re.compile(r"(?=[?&]([^?&=]*)=([^&]*))")
_PASSWORD_KEYS = frozenset({"password", "sslpassword"})
# ``password=…`` in a libpq key=value string: a quoted value (backslash escapes; unterminated: to the end), or a
# run of non-blanks in which a backslash escapes the next character.
_CONNINFO_PASSWORD = re.compile(r"(?i)(?:^|(?<=\s))(?:ssl)?password\s*=\s*('(?:\\.|[^'\\])*'?|(?:\\.|\S)+)")


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where ``url`` holds a password, as ``[start, end)`` index pairs in order, merged where they overlap.

    Read from the text itself, so that a URL no parser accepts is covered too:

    - with ``scheme://``: everything between the first ``:`` after ``//`` and the **last** ``@`` (a password
      may hold ``/ ? # @``; a ``:``/``@`` pair further on, e.g. in a query, makes this hide more, never less),
      and the value of each ``password=`` / ``sslpassword=`` query parameter;
    - without (a libpq ``key=value`` string): the value of each ``password`` / ``sslpassword`` key.
    """
    spans: list[tuple[int, int]] = []
    head, sep, rest = url.partition("://")
    if sep:
        start = len(head) + len(sep)
        at = rest.rfind("@")
        colon = rest.find(":", 0, at) if at > 0 else -1
        if 0 <= colon < at - 1:
            spans.append((start + colon + 1, start + at))
        spans.extend(
            match.span(2)
            for match in _QUERY_PARAMETER.finditer(url, start)
            if match.group(2) and unquote(match.group(1)).strip().lower() in _PASSWORD_KEYS  # libpq decodes keys
        )
    else:
        for match in _CONNINFO_PASSWORD.finditer(url):
            begin, end = match.span(1)
            if url[begin] == "'":  # the quotes themselves are no secret
                begin, end = begin + 1, end - 1 if end - begin > 1 and url[end - 1] == "'" else end
            if end > begin:
                spans.append((begin, end))
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((begin, end))
    return merged


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***``, for logs and error messages (DESIGN §3).

    Covers ``user:password@`` (a password may hold ``/ ? # @``), ``password=`` query parameters and libpq
    ``key=value`` strings, and works on text no URL parser accepts (``postgresql://u:pw@[::1``). Where the text
    is ambiguous it hides more rather than less.

    Returns:
        The redacted text; ``url`` itself when it holds no password.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    out = []
    last = 0
    for begin, end in _secret_spans(url):
        out.append(url[last:begin] + REDACTED)
        last = end
    out.append(url[last:])
    return "".join(out)


def url_secrets(url: str) -> tuple[str, ...]:
    """The strings that must never be printed for ``url``: each password in the forms it may be shown in.

    Each password found by :func:`redact_url`'s reading of the text, as written, percent-decoded and
    re-encoded (``%2F`` and ``+`` forms); for a ``key=value`` string also with its backslash escapes undone.

    Returns:
        Distinct non-empty strings, longest first (scrub them in that order). Empty when ``url`` holds none.
    """
    if not isinstance(url, str):
        return ()
    forms: set[str] = set()
    conninfo = "://" not in url
    for begin, end in _secret_spans(url):
        written = url[begin:end]
        plain = re.sub(r"\\(.)", r"\1", written) if conninfo else unquote(written)
        forms.update((written, plain, quote(plain, safe=""), quote_plus(plain)))
    return tuple(sorted((form for form in forms if form), key=lambda form: (-len(form), form)))


def sqlite_file(url: str) -> str | None:
    """The path of the file a ``sqlite:`` URL names, as :func:`open_store` opens it; None for other stores.

    ``sqlite:///rel.db`` → ``rel.db`` (the working directory), ``sqlite:////abs/x.db`` → ``/abs/x.db``,
    ``sqlite://`` → :data:`DEFAULT_SQLITE_PATH`. Percent escapes are decoded (``%3F`` → ``?``).

    Raises:
        ValidationError: (field ``url``) a ``sqlite:`` URL without ``//``, or with a query (``?…``) or fragment
            (``#…``): SQLite would create a file with that text in its name.
    """
    if not isinstance(url, str) or url.split(":", 1)[0].lower() != "sqlite" or ":" not in url:
        return None
    rest = url[len("sqlite:") :]
    if not rest.startswith("//"):
        raise ValidationError("url", (f"{redact_url(url)!r} is not of the form sqlite:///path/to/file.db",))
    for mark, name in (("?", "query"), ("#", "fragment")):
        if mark in rest:
            raise ValidationError(
                "url",
                (
                    (
                        f"{redact_url(url)!r} has a {name} ({mark!r}…): a sqlite URL takes none (no URI options); "
                        f"to put {mark!r} in a file name, write it as {quote(mark, safe='')}"
                    ),
                ),
            )
    path = unquote(rest[2:])
    path = path.removeprefix("/")  # sqlite:///rel.db → rel.db; sqlite:////abs.db → /abs.db
    return path or DEFAULT_SQLITE_PATH


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


def open_store(url: str, **options: Any) -> Checkpointer:
    """Builds a store from a URL (DESIGN §3).

    Args:
        url: ``memory://``; ``sqlite:///relative/or//absolute/path.db`` (``sqlite://`` alone: ``threadloom.db``
            in the working directory; no ``?`` query or ``#`` fragment: percent-encode those characters in a
            file name); ``postgresql://…`` or ``postgres://…`` (needs the ``postgres`` extra; percent-encode
            ``/`` and ``@`` in a user name or password).
        **options: passed to the store's constructor: ``clock`` for memory; ``clock``, ``busy_timeout``,
            ``synchronous`` for SQLite; ``config`` for PostgreSQL. Every store takes ``max_json_size``, the
            longest JSON text in characters of one stored record (default 16 MiB; for PostgreSQL it sets
            ``config.max_json_size``).

    Returns:
        The open store (a SQLite file is created and migrated if it does not exist).

    Raises:
        ValidationError: ``url`` is not a str, names no known store or is malformed (field ``url``; the message
            never shows a password), or an option is one the chosen store does not take (field: the option).
        ProcessingError: the store cannot be opened (as its constructor documents).
    """
    if not isinstance(url, str):
        raise ValidationError("url", (f"must be a str, got {type(url).__name__}",))
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


__all__ = [
    "DEFAULT_SQLITE_PATH",
    "Checkpointer",
    "InMemoryCheckpointer",
    "SystemClock",
    "open_store",
    "redact_url",
    "sqlite_file",
    "url_secrets",
]
