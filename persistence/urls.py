"""Store URLs as text: where a ``sqlite:`` URL points, and hiding the passwords a URL or conninfo string holds.

Imports nothing but ``domain``, so a store (or the CLI) can use it without importing :func:`open_store`.
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus, unquote

from threadloom.domain.errors import ValidationError

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
    """``url`` with every password replaced by ``***``, for logs and error messages.

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
        ValidationError: (field ``url``) a ``sqlite:`` URL without ``//``, ``sqlite:///`` with no path after it
            (a path left out, not the default file), or a URL with a query (``?…``) or fragment (``#…``): SQLite
            would create a file with that text in its name.
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
    if rest == "///":
        raise ValidationError(
            "url",
            (
                (
                    f"{redact_url(url)!r} names no file: write the path after the third slash "
                    "(sqlite:///relative.db, sqlite:////absolute/path.db), or sqlite:// for the default file"
                ),
            ),
        )
    path = unquote(rest[2:])
    path = path.removeprefix("/")  # sqlite:///rel.db → rel.db; sqlite:////abs.db → /abs.db
    return path or DEFAULT_SQLITE_PATH
