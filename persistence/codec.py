"""JSON text codec for everything a store keeps (DESIGN §3 rule 10: data only, never pickle).

Every value is encoded as compact JSON text and decoded on read, so nothing returned aliases stored state and
nothing executable is ever stored or loaded. Times are integer microseconds since the Unix epoch (UTC).
A stored row that does not decode raises :class:`ProcessingError` naming the thread.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from collections.abc import Callable, Iterable
from typing import Any

from threadloom.domain.errors import StoreCorrupt, ValidationError
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    EffectRecord,
    EventRecord,
    PendingWrite,
)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_micros(when: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch."""
    delta = when - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """Integer microseconds since the epoch as an aware UTC datetime."""
    return EPOCH + timedelta(microseconds=micros)


def dumps(value: Any) -> str:
    """Compact JSON text of an already validated JSON value (NaN refused, keys as given)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def loads(text: str) -> Any:
    """The JSON value of ``text``."""
    return json.loads(text)


def stamp_token(cp: Checkpoint, token: int) -> Checkpoint:
    """``cp`` with ``fencing_token`` = ``token`` (DESIGN §2: the store stamps the commit's token).

    A shallow copy that does not validate the state again: the commit was validated just before. Never the
    caller's own value.
    """
    if cp.fencing_token == token:
        return cp
    stamped = copy.copy(cp)
    object.__setattr__(stamped, "fencing_token", token)
    return stamped


def encode_checkpoint(cp: Checkpoint) -> str:
    """JSON text of a checkpoint (every field)."""
    origin = cp.origin
    return dumps(
        {
            "id": cp.id,
            "parent": cp.parent,
            "thread_id": cp.thread_id,
            "run_id": cp.run_id,
            "status": cp.status.value,
            "created_at": to_micros(cp.created_at),
            "state": cp.state,
            "graph_id": cp.graph_id,
            "tenant_id": cp.tenant_id,
            "fencing_token": cp.fencing_token,
            "origin": None
            if origin is None
            else {
                "parent_thread": origin.parent_thread,
                "parent_checkpoint": origin.parent_checkpoint,
                "task_id": origin.task_id,
            },
            "metadata": cp.metadata,
        }
    )


def decode_checkpoint(text: str, thread_id: str) -> Checkpoint:
    """The checkpoint of ``text``; an undecodable row is a ``ProcessingError`` naming ``thread_id``."""
    with _decoding("checkpoint", thread_id):
        raw = loads(text)
        origin = raw["origin"]
        return Checkpoint(
            id=raw["id"],
            parent=raw["parent"],
            thread_id=raw["thread_id"],
            run_id=raw["run_id"],
            status=CheckpointStatus(raw["status"]),
            created_at=from_micros(raw["created_at"]),
            state=raw["state"],
            graph_id=raw["graph_id"],
            tenant_id=raw["tenant_id"],
            fencing_token=raw["fencing_token"],
            origin=None if origin is None else CheckpointOrigin(**origin),
            metadata=raw["metadata"],
        )


def encode_pending_write(pw: PendingWrite) -> str:
    """JSON text of a pending write."""
    return dumps(
        {"checkpoint_id": pw.checkpoint_id, "task_id": pw.task_id, "node_id": pw.node_id, "payload": pw.payload}
    )


def decode_pending_write(text: str, thread_id: str) -> PendingWrite:
    """The pending write of ``text``; undecodable → ``ProcessingError`` naming ``thread_id``."""
    with _decoding("pending write", thread_id):
        return PendingWrite(**loads(text))


def encode_event(record: EventRecord) -> str:
    """JSON text of an event record (every field)."""
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
    """The event record of ``text``; undecodable → ``ProcessingError`` naming ``thread_id``."""
    with _decoding("event", thread_id):
        raw = loads(text)
        raw["timestamp"] = from_micros(raw["timestamp"])
        return EventRecord(**raw)


def encode_effect(effect: EffectRecord) -> str:
    """JSON text of an effect record."""
    return dumps(
        {
            "key": effect.key,
            "run_id": effect.run_id,
            "recorded_at": to_micros(effect.recorded_at),
            "result": effect.result,
            "checkpoint_id": effect.checkpoint_id,
            "task_id": effect.task_id,
        }
    )


def decode_effect(text: str, thread_id: str) -> EffectRecord:
    """The effect record of ``text``; undecodable → ``ProcessingError`` naming ``thread_id``."""
    with _decoding("effect", thread_id):
        raw = loads(text)
        raw["recorded_at"] = from_micros(raw["recorded_at"])
        return EffectRecord(**raw)


def decode_queue_entry(
    row: tuple[Any, ...], run_ids: Iterable[str], when: Callable[[Any], datetime]
) -> QueueEntry:
    """The run-queue entry of a stored row (DESIGN §4); undecodable → ``ProcessingError`` naming the thread.

    Args:
        row: ``(entry_id, thread_id, graph_id, input_text, tenant_id, status, attempts, leased_by,
            lease_expires_at, available_at, enqueued_at, finished_at, error)``, times as the store keeps them.
        run_ids: the RunIds the entry recorded, in order.
        when: turns one stored time (never None) into an aware UTC datetime.
    """
    (entry_id, thread_id, graph_id, input_text, tenant_id, status, attempts, leased_by, lease_expires_at,
     available_at, enqueued_at, finished_at, error) = row
    with _decoding("run-queue entry", thread_id):
        return QueueEntry(
            entry_id=entry_id,
            thread_id=thread_id,
            graph_id=graph_id,
            input=loads(input_text),
            tenant_id=tenant_id,
            status=EntryStatus(status),
            attempts=attempts,
            run_ids=tuple(run_ids),
            enqueued_at=when(enqueued_at),
            available_at=when(available_at),
            leased_by=leased_by,
            lease_expires_at=None if lease_expires_at is None else when(lease_expires_at),
            finished_at=None if finished_at is None else when(finished_at),
            error=error,
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


class _decoding:
    """Turns any failure while decoding a stored row into a ``ProcessingError`` naming the thread."""

    def __init__(self, what: str, thread_id: str) -> None:
        self.what = what
        self.thread_id = thread_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, _tb: Any) -> bool:
        if error is None:
            return False
        if isinstance(error, (ValueError, TypeError, KeyError, ValidationError, AttributeError, RecursionError)):
            raise StoreCorrupt(
                "decode",
                f"a stored {self.what} of thread {self.thread_id!r} does not decode ({type(error).__name__}: "
                f"{error}); the row is damaged or was written by an incompatible version",
            ) from error
        return False
