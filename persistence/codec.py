"""JSON text codec for everything a store keeps (data only, never pickle).

Every value is encoded as compact JSON text and decoded on read, so nothing returned aliases stored state and
nothing executable is ever stored or loaded. Times are integer microseconds since the Unix epoch (UTC).
A stored row that does not decode raises :class:`StoreCorrupt` naming the thread. Reads decode the store's own
text without validating it again (:func:`~threadloom.domain.values.trusted_builder`), through a C JSON reader
(msgspec) that yields exactly the values ``json.loads`` would. A checkpoint read keeps its state as the text it is
stored as and decodes it when ``state`` is first read (:class:`~threadloom.domain.values.LazyJson`): a read that
never looks at a state never pays for building it, and writing the checkpoint again takes the text as it is.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

import attrs
import msgspec

from threadloom.domain import validation as v
from threadloom.domain.clock import from_micros, to_micros  # one definition (re-exported)
from threadloom.domain.errors import StoreCorrupt, ValidationError
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    EffectRecord,
    EventRecord,
    LazyJson,
    PendingWrite,
    lazy_checkpoint,
    trusted,
    trusted_builder,
)
from threadloom.persistence import encoded


def dumps(value: Any) -> str:
    """Compact JSON text of an already validated JSON value (NaN refused, keys as given)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


_FAST_LOADS = msgspec.json.Decoder().decode


def loads(text: str) -> Any:
    """The JSON value of ``text``, exactly as ``json.loads`` reads it (strict: one JSON value, white space around it
    allowed): a C reader takes what it can, ``json.loads`` decides what it refuses (a lone surrogate escape, NaN,
    an overflowing float, nesting it does not follow), so the value, or the error, is ``json.loads``'s."""
    try:
        return _FAST_LOADS(text)
    except (ValueError, RecursionError):
        return json.loads(text)


_CHECKPOINT_KEYS = frozenset(
    ("id", "parent", "thread_id", "run_id", "status", "created_at", "state", "graph_id", "tenant_id",
     "fencing_token", "origin", "metadata")
)
_WRITE_KEYS = frozenset(("checkpoint_id", "task_id", "node_id", "payload"))
_EVENT_KEYS = frozenset(
    ("seq", "thread_id", "token", "run_id", "type", "timestamp", "payload", "checkpoint_id", "task_id", "node_id")
)
_EFFECT_KEYS = frozenset(("key", "run_id", "recorded_at", "result", "checkpoint_id", "task_id"))


def _fields(raw: Any, keys: frozenset[str]) -> dict[str, Any]:
    """``raw`` as a stored row's fields: a JSON object with exactly ``keys`` (else a damaged row)."""
    if not isinstance(raw, dict) or raw.keys() != keys:
        raise ValueError(f"expected the fields {sorted(keys)}, got {sorted(raw) if isinstance(raw, dict) else raw!r}")
    return raw


def _checked(value: Any) -> Any:
    """``value`` with its field validators run: ids, times and tokens. Its JSON part is not walked again: the
    store wrote text only a validated value produced, and JSON text decodes only to JSON values."""
    attrs.validate(value)
    return value


def encode_checkpoint(cp: Checkpoint) -> str:
    """JSON text of a checkpoint (every field; its own ``fencing_token``). The write path uses
    :mod:`threadloom.persistence.encoded`; this is for tools that store a checkpoint as it is."""
    return encoded.encode_checkpoint(cp, cp.fencing_token).text


_STATUSES = {status.value: status for status in CheckpointStatus}


_CHECKPOINT_FIELDS = operator.itemgetter(
    "id", "parent", "thread_id", "run_id", "status", "created_at", "state", "graph_id", "tenant_id", "fencing_token",
    "origin", "metadata",
)
_NEW_CHECKPOINT = trusted_builder(Checkpoint)


_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=v.MAX_ID_LENGTH)]


class _Origin(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A stored checkpoint's origin as the fast readers take it: exactly these keys, ids of 1 to 255 characters."""

    parent_thread: _Id
    parent_checkpoint: _Id | None
    task_id: _Id | None


_NEW_ORIGIN = trusted_builder(CheckpointOrigin)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, gc=False):  # short-lived: in no cycle
    """A stored checkpoint's fields but its state, as the fast readers take them: exactly these keys (none has a
    default), of these types, ids of 1 to 255 characters, a token from 1 to 2**63 - 1. They take a subset of what
    :func:`_decode_checkpoint_strictly` does, and read it to the same values."""

    id: _Id
    parent: _Id | None
    thread_id: _Id
    run_id: _Id
    status: CheckpointStatus
    created_at: int
    graph_id: _Id
    tenant_id: _Id | None
    fencing_token: Annotated[int, msgspec.Meta(ge=1, le=v.MAX_INT)] | None
    origin: _Origin | None
    metadata: dict[str, str]


class _CheckpointRow(_Envelope, forbid_unknown_fields=True, gc=False):
    """A stored checkpoint's fields in any order, its state checked to be well-formed JSON text and kept as that
    text (not built)."""

    state: msgspec.Raw


_READ_ENVELOPE = msgspec.json.Decoder(_Envelope).decode
_READ_CHECKPOINT = msgspec.json.Decoder(_CheckpointRow).decode
_CHECK_JSON = msgspec.json.Decoder(msgspec.Raw).decode
_STATE_KEY = ',"state":'
_NUL_ESCAPE = "\\u0000"
"""The only way a NUL reaches a string the C reader takes (it refuses a raw one)."""
"""How the state's key follows the other fields in the text the store writes (the state last: see
:func:`~threadloom.persistence.encoded.encode_checkpoint`)."""


def _decode_state(text: str, checkpoint: Checkpoint) -> tuple[Any, bool]:
    """The state of a checkpoint read lazily, decoded from its stored ``text`` when ``state`` is first read, and
    whether ``text`` is the state's own text: True when the C reader took it (strict JSON); else the value
    ``json.loads`` reads (a damaged row's NaN, overflowing float or lone surrogate), which a commit of the
    checkpoint then validates and encodes again (and refuses). Text no reader takes is a ``StoreCorrupt`` naming the
    checkpoint's thread."""
    try:
        return _FAST_LOADS(text), True
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(text), False
    except _DAMAGE as error:
        raise _corrupt("checkpoint state", checkpoint.thread_id, error) from error


def _is_json(text: str) -> bool:
    """Whether ``text`` is one well-formed JSON value (strict: no NaN, no lone surrogate), checked by the C reader
    without building it."""
    try:
        _CHECK_JSON(text)
    except (ValueError, RecursionError):
        return False
    return True


_LAZY_STATE = LazyJson(_decode_state, _is_json)


def _fast_row(text: str) -> tuple[_Envelope, str, bool] | None:
    """The fields of a stored checkpoint, its state's text, and whether the fields may hold a NUL, read by the C
    reader; None when it does not take the row (the strict reader decides).

    The store writes the state last: the text up to the first ``,"state":`` (a key: the quote of a JSON string
    never follows a comma unescaped but to open one) closed with ``}`` is the other fields, and the rest but the
    closing brace the state, read as it is (checked when it is decoded or written again). Any other layout
    (an older version's, white space) is read whole, its state checked well-formed. The C reader refuses a raw
    NUL in a string, so a NUL in a field can only come from the escape ``\\u0000``: when the fields' text has
    none, no field holds one (one scan instead of one per field).
    """
    cut = text.find(_STATE_KEY)
    if cut > 0 and text[-1] == "}":
        head = text[:cut] + "}"
        try:
            return _READ_ENVELOPE(head), text[cut + len(_STATE_KEY) : -1], _NUL_ESCAPE in head
        except (ValueError, RecursionError):  # a "state" key of a nested object, or the state not last
            pass
    try:
        row = _READ_CHECKPOINT(text)
    except (ValueError, RecursionError):
        return None
    return row, str(row.state, "utf-8"), True


def _holds_nul(row: Any) -> bool:
    """Whether any string field of a stored checkpoint's fields (its origin's and metadata's included) holds NUL."""
    origin, metadata = row.origin, row.metadata
    texts = [row.id, row.parent or "", row.thread_id, row.run_id, row.graph_id, row.tenant_id or ""]
    if origin is not None:
        texts += (origin.parent_thread, origin.parent_checkpoint or "", origin.task_id or "")
    if metadata:
        texts += (*metadata, *metadata.values())
    return "\x00" in "".join(texts)


def decode_checkpoint(text: str, thread_id: str) -> Checkpoint:
    """The checkpoint of ``text`` (the store's own, not validated again but for its ids, times, token and
    metadata, which a damaged row may hold); an undecodable row is a ``StoreCorrupt`` naming ``thread_id``.

    Its ``state`` is kept as its text and decoded when first read (:class:`~threadloom.domain.values.LazyJson`),
    once; a state that does not decode is a ``StoreCorrupt`` then. Writing the checkpoint again writes the text
    as it is once it is checked to be well-formed JSON. A row the fast reader does not take is read by the strict
    one, state and all.
    """
    fast = _fast_row(text)
    if fast is None:  # not as the fast reader takes it: the strict path decides
        return _decode_checkpoint_strictly(text, thread_id)
    row, state, may_hold_nul = fast
    # The C reader took strings of the right lengths and types, without lone surrogates (it refuses their escapes):
    # what is left of an id's or metadata's checks is NUL, which a damaged row may hold (the strict path names it).
    parent, tenant_id, stored_origin, metadata = row.parent, row.tenant_id, row.origin, row.metadata
    if may_hold_nul and _holds_nul(row):
        return _decode_checkpoint_strictly(text, thread_id)
    origin = None
    if stored_origin is not None:
        origin = _NEW_ORIGIN(stored_origin.parent_thread, stored_origin.parent_checkpoint, stored_origin.task_id)
    try:
        created_at = from_micros(row.created_at)
    except _DAMAGE as error:  # out of datetime's range
        raise _corrupt("checkpoint", thread_id, error) from error
    return lazy_checkpoint(
        state, row.id, parent, row.thread_id, row.run_id, row.status, created_at, _LAZY_STATE, row.graph_id,
        tenant_id, row.fencing_token, origin, metadata,
    )


def _decode_checkpoint_strictly(text: str, thread_id: str) -> Checkpoint:
    """:func:`decode_checkpoint` through :func:`loads` and checks in Python: it decides what the fast reader
    refuses."""
    try:
        raw = loads(text)
        if type(raw) is not dict or len(raw) != len(_CHECKPOINT_KEYS):
            _fields(raw, _CHECKPOINT_KEYS)  # raises, naming the fields
        # As many keys as expected, and each expected one present (else KeyError): exactly the expected keys.
        (id_, parent, of_thread, run_id, status, created_at, state, graph_id, tenant_id, fencing_token, origin,
         metadata) = _CHECKPOINT_FIELDS(raw)
        if origin is not None:
            origin = _checked(CheckpointOrigin(**origin))
        if fencing_token is not None:
            v.check_int("fencing_token", fencing_token, low=1)
        return _NEW_CHECKPOINT(
            v.check_id("checkpoint.id", id_),
            None if parent is None else v.check_id("checkpoint.parent", parent),
            v.check_id("checkpoint.thread_id", of_thread),
            v.check_id("checkpoint.run_id", run_id),
            _STATUSES[status],
            from_micros(created_at),
            state,
            v.check_id("checkpoint.graph_id", graph_id),
            None if tenant_id is None else v.check_id("checkpoint.tenant_id", tenant_id),
            fencing_token,
            origin,
            v.check_str_map("metadata", metadata),
        )
    except _DAMAGE as error:
        raise _corrupt("checkpoint", thread_id, error) from error


class _WriteRow(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A stored pending write as the fast reader takes it: exactly these keys, ids of 1 to 255 characters."""

    checkpoint_id: _Id
    task_id: _Id
    node_id: _Id
    payload: Any


_READ_WRITE = msgspec.json.Decoder(_WriteRow).decode
_NEW_WRITE = trusted_builder(PendingWrite)


def decode_pending_write(text: str, thread_id: str) -> PendingWrite:
    """The pending write of ``text`` (the store's own, not validated again but for NUL in its ids); undecodable →
    ``StoreCorrupt`` naming ``thread_id``. A row the C reader does not take is read by ``json.loads`` and checked
    in Python, which decides."""
    try:
        row = _READ_WRITE(text)
    except (ValueError, RecursionError):
        pass
    else:
        if "\x00" not in "".join((row.checkpoint_id, row.task_id, row.node_id)):
            return _NEW_WRITE(row.checkpoint_id, row.task_id, row.node_id, row.payload)
    return _decode_pending_write_strictly(text, thread_id)


def _decode_pending_write_strictly(text: str, thread_id: str) -> PendingWrite:
    """:func:`decode_pending_write` through :func:`loads` and checks in Python: it decides what the fast reader
    refuses."""
    with _decoding("pending write", thread_id):
        raw = _fields(loads(text), _WRITE_KEYS)
        return _checked(trusted(
            PendingWrite,
            checkpoint_id=raw["checkpoint_id"], task_id=raw["task_id"], node_id=raw["node_id"],
            payload=raw["payload"],
        ))


def encode_pending_write(pw: PendingWrite) -> str:
    """JSON text of a pending write."""
    return encoded.encode_pending_write(pw).text


def stamp_token(cp: Checkpoint, token: int) -> Checkpoint:
    """``cp`` with ``fencing_token`` = ``token``, not validated again (transitional: for stores that do not
    yet write :class:`~threadloom.persistence.encoded.EncodedCommit` texts)."""
    if cp.fencing_token == token:
        return cp
    return trusted(Checkpoint, **{**attrs.asdict(cp, recurse=False), "fencing_token": token})


def encode_event(record: EventRecord) -> str:
    """JSON text of an event record (every field). The write path uses :mod:`threadloom.persistence.encoded`."""
    return dumps(
        {
            "thread_id": record.thread_id,
            "seq": record.seq,
            "token": record.token,
            "run_id": record.run_id,
            "type": record.type,
            "timestamp": to_micros(record.timestamp),
            "payload": record.payload,
            "checkpoint_id": record.checkpoint_id,
            "task_id": record.task_id,
            "node_id": record.node_id,
        }
    )


def decode_event(text: str, thread_id: str) -> EventRecord:
    """The event record of ``text``; undecodable → ``StoreCorrupt`` naming ``thread_id``."""
    with _decoding("event", thread_id):
        return _event(loads(text))


def decode_events(text: str, thread_id: str) -> list[EventRecord]:
    """The event records of ``text``, a JSON array of event texts (a commit's notification on PostgreSQL), in its
    order; undecodable, or not an array → ``StoreCorrupt`` naming ``thread_id``."""
    with _decoding("event", thread_id):
        values = loads(text)
        if not isinstance(values, list):
            raise ValueError("not an array of events")
        return [_event(value) for value in values]


def _event(value: Any) -> EventRecord:
    raw = _fields(value, _EVENT_KEYS)
    return _checked(trusted(
        EventRecord,
        thread_id=raw["thread_id"],
        seq=raw["seq"],
        token=raw["token"],
        run_id=raw["run_id"],
        type=raw["type"],
        timestamp=from_micros(raw["timestamp"]),
        payload=raw["payload"],
        checkpoint_id=raw["checkpoint_id"],
        task_id=raw["task_id"],
        node_id=raw["node_id"],
    ))


def encode_effect(effect: EffectRecord) -> str:
    """JSON text of an effect record."""
    return encoded.encode_effect(effect).text


def decode_effect(text: str, thread_id: str) -> EffectRecord:
    """The effect record of ``text``; undecodable → ``StoreCorrupt`` naming ``thread_id``."""
    with _decoding("effect", thread_id):
        raw = _fields(loads(text), _EFFECT_KEYS)
        return _checked(trusted(
            EffectRecord,
            key=raw["key"],
            run_id=raw["run_id"],
            recorded_at=from_micros(raw["recorded_at"]),
            result=raw["result"],
            checkpoint_id=raw["checkpoint_id"],
            task_id=raw["task_id"],
        ))


def decode_queue_entry(
    row: tuple[Any, ...], run_ids: Iterable[str], when: Callable[[Any], datetime]
) -> QueueEntry:
    """The run-queue entry of a stored row; undecodable → ``ProcessingError`` naming the thread.

    Args:
        row: ``(entry_id, thread_id, graph_id, input_text, tenant_id, status, attempts, leased_by,
            lease_expires_at, available_at, enqueued_at, finished_at, error, refunded)``, optionally followed by
            ``retried_as``, times as the store keeps them.
        run_ids: the RunIds the entry recorded, in order.
        when: turns one stored time (never None) into an aware UTC datetime.
    """
    (entry_id, thread_id, graph_id, input_text, tenant_id, status, attempts, leased_by, lease_expires_at,
     available_at, enqueued_at, finished_at, error, refunded) = row[:14]
    retried_as = row[14] if len(row) > 14 else None
    with _decoding("run-queue entry", thread_id):
        return QueueEntry(
            entry_id=entry_id,
            thread_id=thread_id,
            graph_id=graph_id,
            input=loads(input_text),
            tenant_id=tenant_id,
            status=EntryStatus(status),
            attempts=attempts,
            refunded=refunded,
            run_ids=tuple(run_ids),
            enqueued_at=when(enqueued_at),
            available_at=when(available_at),
            leased_by=leased_by,
            lease_expires_at=None if lease_expires_at is None else when(lease_expires_at),
            finished_at=None if finished_at is None else when(finished_at),
            error=error,
            retried_as=retried_as,
        )


def encode_metadata(metadata: dict[str, str]) -> str:
    """JSON text of a thread's metadata."""
    return dumps(metadata)


def decode_metadata(text: str | None, thread_id: str) -> dict[str, str]:
    """A thread's metadata; ``None`` reads as empty."""
    if text is None:
        return {}
    with _decoding("metadata", thread_id):
        raw = loads(text)
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in raw.items()):
            raise TypeError("metadata is not a mapping of str to str")
        return raw


_DAMAGE = (ValueError, TypeError, KeyError, ValidationError, AttributeError, RecursionError, OverflowError)
"""What decoding a damaged row raises (any other error is not about the row and passes unchanged)."""


def _corrupt(what: str, thread_id: str, error: BaseException) -> StoreCorrupt:
    return StoreCorrupt(
        "decode",
        f"a stored {what} of thread {thread_id!r} does not decode ({type(error).__name__}: {error}); the row is "
        "damaged or was written by an incompatible version",
    )


class _decoding:
    """Turns any failure while decoding a stored row into a ``ProcessingError`` naming the thread."""

    def __init__(self, what: str, thread_id: str) -> None:
        self.what = what
        self.thread_id = thread_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, _tb: Any) -> Literal[False]:
        if isinstance(error, _DAMAGE):
            raise _corrupt(self.what, self.thread_id, error) from error
        return False
