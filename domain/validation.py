"""Input validation shared by every value and every store.

Each check raises :class:`~threadloom.domain.errors.ValidationError` naming the field and the problem, and
never touches storage: stores call these before they read or write anything.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from threadloom.domain.errors import ValidationError

MAX_ID_LENGTH = 255
"""Longest id, in characters."""

MAX_INT = 2**63 - 1
"""Largest integer argument a store takes (tokens, sequence numbers, limits, entry ids): every store keeps 64 bits."""

MAX_DURATION = timedelta(days=36_500)
"""Longest duration a store takes (ttl, ages, timeouts, delays): 100 years, so no clock arithmetic overflows."""

MAX_JSON_INT_DIGITS = 4300
"""Most decimal digits of an integer inside a JSON value: Python's own limit for converting an int to text (the
default of ``sys.set_int_max_str_digits``), so no Python reader of the store refuses what was written."""

MAX_JSON_DEPTH = 256
"""Deepest nesting of a JSON value; deeper values are refused rather than overflowing the encoder."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def check_id(field: str, value: Any) -> str:
    """Validates an id: a non-empty ``str`` of at most 255 characters, without NUL or surrogates.

    Returns:
        The id unchanged.

    Raises:
        ValidationError: naming ``field`` when the id is not of that form.
    """
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_ID_LENGTH and "\x00" not in value:
        return value  # the common case, in constant time but for the NUL scan (ASCII holds no surrogates)
    if not isinstance(value, str):
        raise ValidationError(field, (f"must be a str, got {type(value).__name__}",))
    problems = []
    if not value:
        problems.append("must not be empty")
    if len(value) > MAX_ID_LENGTH:
        problems.append(f"must be at most {MAX_ID_LENGTH} characters, got {len(value)}")
    if "\x00" in value:
        problems.append("must not contain NUL")
    if _has_surrogate(value):
        problems.append("must not contain surrogate code points")
    if problems:
        raise ValidationError(field, tuple(problems))
    return value


def check_optional_id(field: str, value: Any) -> str | None:
    """Validates an id that may be ``None`` (see :func:`check_id`)."""
    return None if value is None else check_id(field, value)


def check_text(field: str, value: Any) -> str:
    """Validates free text: a ``str`` without NUL or surrogates (it may be empty)."""
    if not isinstance(value, str):
        raise ValidationError(field, (f"must be a str, got {type(value).__name__}",))
    if "\x00" in value:
        raise ValidationError(field, ("must not contain NUL",))
    if _has_surrogate(value):
        raise ValidationError(field, ("must not contain surrogate code points",))
    return value


def check_aware(field: str, value: Any) -> datetime:
    """Validates a timezone-aware ``datetime``; a naive one is refused."""
    if type(value) is datetime and value.tzinfo is UTC:
        return value  # the common case: aware, and its instant is its own
    if not isinstance(value, datetime):
        raise ValidationError(field, (f"must be a datetime, got {type(value).__name__}",))
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, ("must be timezone-aware (a naive datetime has no defined instant)",))
    try:  # 9999-12-31T23:00-05:00 is a valid datetime whose instant no UTC datetime holds
        value.astimezone(UTC)
    except OverflowError:
        raise ValidationError(field, ("must lie between the years 1 and 9999 in UTC",)) from None
    return value


def check_positive_duration(field: str, value: Any) -> timedelta:
    """Validates a ``timedelta`` greater than zero."""
    if not isinstance(value, timedelta):
        raise ValidationError(field, (f"must be a timedelta, got {type(value).__name__}",))
    if value <= timedelta(0):
        raise ValidationError(field, (f"must be greater than zero, got {value}",))
    if value > MAX_DURATION:
        raise ValidationError(field, (f"must be at most {MAX_DURATION.days} days, got {value}",))
    return value


def check_non_negative_duration(field: str, value: Any) -> timedelta:
    """Validates a ``timedelta`` of zero or more."""
    if not isinstance(value, timedelta):
        raise ValidationError(field, (f"must be a timedelta, got {type(value).__name__}",))
    if value < timedelta(0):
        raise ValidationError(field, (f"must not be negative, got {value}",))
    if value > MAX_DURATION:
        raise ValidationError(field, (f"must be at most {MAX_DURATION.days} days, got {value}",))
    return value


def wait_seconds(field: str, value: Any) -> float | None:
    """A wait's ``timeout`` as seconds for the threading primitives: None stays None (no bound), a ``timedelta``
    of zero or more (at most :data:`MAX_DURATION`) becomes its seconds.

    Raises:
        ValidationError: (``field``) not None nor a ``timedelta`` (a number of seconds included: durations are
            ``timedelta`` throughout the API), negative, or longer than :data:`MAX_DURATION`.
    """
    if value is None:
        return None
    return check_non_negative_duration(field, value).total_seconds()


def check_instance(field: str, value: Any, kind: type) -> Any:
    """``value`` when it is a ``kind`` (a subclass too), else ``ValidationError`` naming ``field``."""
    if not isinstance(value, kind):
        raise ValidationError(field, (f"must be a {kind.__name__}, got {type(value).__name__}",))
    return value


def check_int(field: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Validates an ``int`` (never a ``bool``) within ``low..high`` inclusive; ``high`` defaults to 2**63 - 1."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(field, (f"must be an int, got {type(value).__name__}",))
    if high is None:
        high = MAX_INT
    if low is None and value < -MAX_INT - 1:
        raise ValidationError(field, (f"must be at least {-MAX_INT - 1}, got {value}",))
    if low is not None and value < low:
        raise ValidationError(field, (f"must be at least {low}, got {value}",))
    if value > high:
        raise ValidationError(field, (f"must be at most {high}, got {value}",))
    return value


def check_str_map(field: str, value: Any) -> dict[str, str]:
    """Validates a ``dict[str, str]`` (metadata); returns a fresh copy."""
    if not isinstance(value, Mapping):
        raise ValidationError(field, (f"must be a mapping of str to str, got {type(value).__name__}",))
    out: dict[str, str] = {}
    for key, item in value.items():
        check_text(f"{field} key", key)
        check_text(f"{field}[{key!r}]", item)
        out[key] = item
    return out


def check_json(field: str, value: Any) -> Any:
    """Validates a JSON value: dict (str keys), list/tuple, str, int, finite float, bool or None.

    Returns:
        The value unchanged (tuples are encoded as JSON arrays and read back as lists).

    Raises:
        ValidationError: naming ``field`` and the path of the first bad part (NaN, infinity, bytes, sets,
            objects, non-string keys, strings with surrogate code points, integers over 4300 digits, nesting
            deeper than 256). NUL inside JSON strings is allowed: it is escaped in the stored text.
    """
    if _plain_json(value):
        return value
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValidationError(field, (f"{path}: nested deeper than {MAX_JSON_DEPTH}",))
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            if _has_surrogate(item):
                raise ValidationError(field, (f"{path}: string contains surrogate code points",))
            continue
        if isinstance(item, int):
            if type(item) is not int and not isinstance(item, bool):
                raise ValidationError(field, (f"{path}: {type(item).__name__} is not a JSON number",))
            if item.bit_length() > 14_000 and abs(item) >= _INT_LIMIT:
                raise ValidationError(field, (f"{path}: integer of more than {MAX_JSON_INT_DIGITS} digits",))
            continue
        if isinstance(item, float):
            if type(item) is not float:
                raise ValidationError(field, (f"{path}: {type(item).__name__} is not a JSON number",))
            if not math.isfinite(item):
                raise ValidationError(field, (f"{path}: {item!r} is not a finite number",))
            continue
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise ValidationError(field, (f"{path}: key {key!r} is not a str",))
                if _has_surrogate(key):
                    raise ValidationError(field, (f"{path}: key contains surrogate code points",))
                stack.append((sub, f"{path}.{key}", depth + 1))
            continue
        if isinstance(item, (list, tuple)):
            for index, sub in enumerate(item):
                stack.append((sub, f"{path}[{index}]", depth + 1))
            continue
        raise ValidationError(field, (f"{path}: {type(item).__name__} is not a JSON value",))
    return value


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not a JSON value")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_refuse)
_DECODER = json.JSONDecoder()
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # CPython's; not in the type stubs
_C_ENCODER = (
    None
    if _C_MAKE_ENCODER is None
    else _C_MAKE_ENCODER(None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False)
)
"""The C encoder of :data:`_ENCODER`, built once: the same output, without the setup of every ``encode`` call
(no circular-reference markers: a cycle ends in ``RecursionError``, which is refused like any bad value)."""


def dumps_compact(value: Any) -> str:
    """Compact JSON text of a value (NaN refused, non-JSON objects refused with ``TypeError``)."""
    if _C_ENCODER is None:  # pragma: no cover - CPython always has the C encoder
        return _ENCODER.encode(value)
    if isinstance(value, str):
        return json.encoder.encode_basestring(value)
    return "".join(_C_ENCODER(value, 0))


def scan_own(text: str) -> tuple[Any, int]:
    """The JSON value at the start of ``text`` and where it ends: the C scanner, without the white-space skipping
    of ``json.loads`` (for text this package encoded).

    Raises:
        StopIteration: no JSON value starts at 0.
        json.JSONDecodeError: a malformed value starts there.
    """
    return _DECODER.scan_once(text, 0)  # type: ignore[attr-defined]  # set by JSONDecoder(); not in the stubs


_INT_LIMIT = 10**MAX_JSON_INT_DIGITS


class _NotPlain(Exception):
    """Raised by :func:`_plain_copy` on anything it does not take as is (the slow path then decides)."""


_LEAVES = frozenset((str, int, float, bool, type(None)))


def _plain_copy(value: Any, depth: int) -> Any:
    """A fresh copy of ``value`` built of exact ``dict`` (exact ``str`` keys), ``list``, ``str``, ``int``, ``float``,
    ``bool`` and ``None`` only, nested at most :data:`MAX_JSON_DEPTH` deep (``depth`` is ``value``'s own).

    Raises:
        _NotPlain: on anything else (tuples, subclasses such as ``IntEnum``, non-``str`` keys, other objects,
            deeper nesting): the value is then walked by :func:`check_json`, which names what is wrong or lets it
            pass. Floats and integers are not looked at here: the encoder refuses NaN, infinities and integers
            of more digits than Python converts.
    """
    kind = type(value)
    if kind is dict:
        if depth >= MAX_JSON_DEPTH and value:
            raise _NotPlain
        out = value.copy()
        for key, item in out.items():
            if type(key) is not str:
                raise _NotPlain
            if type(item) not in _LEAVES:
                out[key] = _plain_copy(item, depth + 1)  # replaces a value: the dict keeps its size
        return out
    if kind is list:
        if depth >= MAX_JSON_DEPTH and value:
            raise _NotPlain
        items = value.copy()
        for index, item in enumerate(items):
            if type(item) not in _LEAVES:
                items[index] = _plain_copy(item, depth + 1)
        return items
    if kind in _LEAVES:
        return value
    raise _NotPlain


def _plain_walk(value: Any, depth: int) -> None:
    """Raises :class:`_NotPlain` unless ``value`` is built of exact ``dict`` (exact ``str`` keys), ``list``,
    ``str``, ``int``, ``float``, ``bool`` and ``None`` only, at most :data:`MAX_JSON_DEPTH` deep (no copy)."""
    kind = type(value)
    if kind is dict:
        if depth >= MAX_JSON_DEPTH and value:
            raise _NotPlain
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            if type(item) not in _LEAVES:
                _plain_walk(item, depth + 1)
    elif kind is list:
        if depth >= MAX_JSON_DEPTH and value:
            raise _NotPlain
        for item in value:
            if type(item) not in _LEAVES:
                _plain_walk(item, depth + 1)
    elif kind not in _LEAVES:
        raise _NotPlain


def _plain_json(value: Any) -> bool:
    """True when ``value`` is a valid JSON value by the fast strict path of :func:`encode_json` (exact built-in
    types, encodable: no NaN, infinity or over-long integer; no lone surrogate); False means "not decided here"
    (the caller walks it with the rules of :func:`check_json`)."""
    try:
        _plain_walk(value, 0)
        dumps_compact(value).encode("utf-8")
    except (_NotPlain, TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def copy_json(value: Any) -> Any:
    """A fresh copy of a valid JSON value that shares no ``dict`` or ``list`` with it (tuples stay tuples).

    Built-in JSON types are copied by one strict walk (several times faster than ``copy.deepcopy``); anything
    else (tuples, subclasses) by ``copy.deepcopy``.
    """
    try:
        return _plain_copy(value, 0)
    except _NotPlain:
        return copy.deepcopy(value)


def encode_json(field: str, value: Any) -> tuple[str, Any]:
    """Validates a JSON value and encodes it, in one strict pass (the rules of :func:`check_json`).

    One walk copies the value, taking only exact built-in JSON types (no ``IntEnum``, no ``float``, ``str``,
    ``dict`` or ``list`` subclass the encoder would silently flatten), ``str`` keys and at most
    :data:`MAX_JSON_DEPTH` levels; the C encoder encodes the copy and refuses NaN, infinities and integers of more
    than :data:`MAX_JSON_INT_DIGITS` digits; encoding the text to UTF-8 refuses lone surrogates. Only when one of
    those fails is the value walked by :func:`check_json`, which names the first bad part exactly (or lets a tuple
    or a ``dict``/``list``/``str`` subclass pass, encoded as its plain counterpart).

    Returns:
        ``(text, copy)``: compact JSON text (no NaN, UTF-8 safe) and a fresh copy of the value (lists for
        tuples) that shares no ``dict`` or ``list`` with ``value``; the text is the copy's.

    Raises:
        ValidationError: naming ``field`` and the path of the first bad part.
    """
    try:
        copy = _plain_copy(value, 0)
        text = dumps_compact(copy)
        text.encode("utf-8")
    except (_NotPlain, TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        check_json(field, value)  # names the bad part; passes for tuples and dict/list/str subclasses
        try:
            text = _ENCODER.encode(value)
            copy = _DECODER.decode(text)
        except (TypeError, ValueError, RecursionError) as error:  # pragma: no cover - check_json refused it first
            raise ValidationError(field, (f"is not a JSON value ({error})",)) from None
    return text, copy


class EncodedJson:
    """A JSON value validated and encoded once, by :func:`encode_json`, for a sealed value's constructor to take as
    it is: the runtime hands a node's ``Step`` state to the step's checkpoint this way, so a state is validated and
    encoded once per step (``Checkpoint(state=EncodedJson(...))`` is the same value as ``Checkpoint(state=value)``).

    Built only by validating: ``EncodedJson(field, value)`` raises what :func:`encode_json` raises, naming ``field``,
    and keeps the text and a private copy of the value (the caller's object is never shared). :meth:`take` hands
    both over; a second ``take`` hands a fresh copy decoded from the text, so two values never share one.
    """

    __slots__ = ("_taken", "_text", "_value")

    def __init__(self, field: str, value: Any) -> None:
        self._text, self._value = encode_json(field, value)
        self._taken = False

    def __repr__(self) -> str:
        return f"EncodedJson({self._text[:60]!r}{'…' if len(self._text) > 60 else ''})"

    @property
    def text(self) -> str:
        """The compact JSON text (as :func:`encode_json` makes it)."""
        return self._text

    def take(self) -> tuple[str, Any]:
        """``(text, value)``: the private copy the first time, a fresh decode of the text after that."""
        if self._taken:
            return self._text, _DECODER.decode(self._text)
        self._taken = True
        return self._text, self._value


def check_run_ids(field: str, value: Any) -> frozenset[str]:
    """Validates a collection of run ids (list, tuple, set or frozenset of ids, never a bare ``str``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValidationError(field, ("must be a collection of run ids",))
    return frozenset(check_id(f"{field} item", item) for item in value)
