"""A LangGraph saver's stored checkpoint as readable JSON: what ``threadloom show`` prints of one.

The saver stores each value as its serializer's typed bytes in base64 (``_mapping.encode``); here they are decoded
with :func:`~threadloom.langgraph.saver.strict_serde` (never pickle, no callable a value names is called) and
turned into plain JSON values.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

from threadloom.domain.values import Checkpoint, PendingWrite
from threadloom.langgraph import _mapping as m
from threadloom.langgraph.saver import strict_serde

_MAX_DEPTH = 100
"""Deeper than this, a decoded value is shown by its ``repr`` (msgpack nests no deeper in practice)."""


def decode_stored(
    checkpoint: Checkpoint, pending_writes: Iterable[PendingWrite] = (), *, serde: Any = None
) -> dict[str, Any] | None:
    """The LangGraph values a threadloom checkpoint of the saver holds, decoded, as plain JSON values.

    Args:
        checkpoint: a checkpoint the saver wrote (``graph_id`` ``"langgraph"``, state format ``langgraph/1``).
        pending_writes: its pending writes (each a LangGraph write's channel and encoded value).
        serde: the serializer to decode with; :func:`~threadloom.langgraph.saver.strict_serde` by default.

    Returns:
        None when ``checkpoint`` is not the saver's; else ``{"checkpoint": …, "metadata": …, "parent": …,
        "pending_writes": [{"task_id", "channel", "value"}, …]}``. Values that are not JSON are shown as JSON:
        a model or dataclass as an object of its fields, a date or time in ISO 8601, bytes in base64, a set as a
        list, anything else by its ``repr``.

    Raises:
        StoreCorrupt: a stored value is not an encoded LangGraph value, or names pickle (never loaded).
        Exception: the serializer's own error for bytes it cannot decode.
    """
    state = checkpoint.state
    if checkpoint.graph_id != m.GRAPH_ID or not isinstance(state, Mapping) or state.get("format") != m.FORMAT:
        return None
    serde = strict_serde() if serde is None else serde
    thread_id = checkpoint.thread_id
    writes = []
    for pw in pending_writes:
        payload = pw.payload if isinstance(pw.payload, Mapping) else {}
        writes.append(
            {
                "task_id": pw.task_id,
                "channel": payload.get("channel", pw.node_id),
                "value": _json(m.decode(serde, thread_id, payload.get("value"))),
            }
        )
    return {
        "checkpoint": _json(m.decode(serde, thread_id, state.get("checkpoint"))),
        "metadata": _json(m.decode(serde, thread_id, state.get("metadata"))),
        "parent": state.get("parent"),
        "pending_writes": writes,
    }


def _json(value: Any, depth: int = 0) -> Any:
    """``value`` as a plain JSON value (see :func:`decode_stored`)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth > _MAX_DEPTH:
        return repr(value)
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(_json(k, depth + 1)): _json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        items = [_json(item, depth + 1) for item in value]
        return sorted(items, key=repr)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return _json(value.value, depth + 1)
    dump = getattr(value, "model_dump", None)  # a pydantic model: LangChain's messages
    if callable(dump):
        try:
            return _json(dump(), depth + 1)
        except Exception:  # a model that cannot dump itself is shown by its repr
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
    return repr(value)


__all__ = ["decode_stored"]
