"""How LangGraph's checkpoints, metadata and writes travel as threadloom data (README "LangGraph").

A LangGraph ``(thread_id, checkpoint_ns)`` is one threadloom thread: the root namespace ``""`` is the thread
``thread_id`` itself, a subgraph namespace is the child thread ``thread_id + "::ns::" + checkpoint_ns`` whose
checkpoints' origin names the root. Every value goes through the saver's serializer, which never falls back to
pickle: its typed bytes are stored as base64 text inside the checkpoint's JSON state (or a pending write's JSON
payload), and a stored value of type ``pickle`` is refused on read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, writes_sort_key

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.errors import StoreCorrupt, ValidationError
from threadloom.domain.values import PendingWrite, prevalidated_builder

NS_SEPARATOR = "::ns::"
"""Between a LangGraph thread id and a subgraph namespace in the child thread's id."""

FORMAT = "langgraph/1"
"""The ``format`` field of every state this saver writes."""

GRAPH_ID = "langgraph"
"""The ``graph_id`` of every checkpoint this saver writes."""

DELETED_RUN_KEY = "langgraph.deleted-run:"
"""The prefix of the effect record that hides a run's checkpoints (``delete_for_runs``)."""


SUPERSEDED_KEY = "langgraph.after"
"""The checkpoint metadata key naming the checkpoint this one superseded (the one before it in the store's
order), whose pending writes its state carries under ``"superseded"``."""

LATE_MARK = "langgraph.late"
"""The checkpoint metadata key (value ``"1"``) of a checkpoint whose carried writes (``superseded``) hold late
writes, for a checkpoint before the one it superseded: a read finds them by this key near that checkpoint."""

LATE_STATE = "late"
"""The state field (``true``) of every checkpoint stored once a checkpoint of its thread carries late writes: a
read of a thread whose latest has none never searches for them."""

METADATA_PREFIX = "langgraph.meta."
"""The prefix of the checkpoint metadata keys that hold LangGraph's filterable metadata, one per top-level key."""

MAX_FILTER_KEYS = rules.MAX_FILTER_KEYS

_quote = json.encoder.encode_basestring  # the C encoder json.dumps(value, ensure_ascii=False) uses for a str
"""Most keys of a ``list`` filter (the store's bound)."""


def filter_text(value: Any) -> str:
    """The canonical JSON text of a plain JSON value: two values are the same JSON value exactly when their texts
    are equal (README "LangGraph": objects by keys whatever their order, numbers by value, so ``1`` and ``1.0``
    are one value and ``true`` is not ``1``; lists in order)."""
    return json.dumps(_normal(value), ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _normal(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    return [_normal(item) for item in value]


def _plain(value: Any) -> bool:
    try:
        v.check_json("metadata", value)
    except ValidationError:
        return False
    return True


def filterable(metadata: Any) -> dict[str, str]:
    """The checkpoint metadata a LangGraph ``metadata`` is filtered by: each top-level key whose value is plain
    JSON, as :data:`METADATA_PREFIX` + key, holding :func:`filter_text` of the value (other keys are left out:
    they are not filterable)."""
    out: dict[str, str] = {}
    for key, value in metadata.items() if isinstance(metadata, dict) else ():
        kind = type(value)
        if type(key) is str and key.isascii() and key.isprintable():
            # the common values, without the walk: their JSON text is their canonical text (a str that is not
            # printable, which may hold a lone surrogate, takes the walk)
            if kind is int or kind is bool or value is None:
                out[METADATA_PREFIX + key] = json.dumps(value)
                continue
            if kind is str and value.isprintable():
                out[METADATA_PREFIX + key] = _quote(value)
                continue
            if kind is dict and not value:
                out[METADATA_PREFIX + key] = "{}"
                continue
        if isinstance(key, str) and _text(key) and _plain(value):
            out[METADATA_PREFIX + key] = filter_text(value)
    return out


def store_filter(wanted: Any) -> dict[str, str]:
    """The store's ``search_history`` filter of a LangGraph ``list`` filter (None: no filter).

    Raises:
        ValidationError: naming ``filter`` (not a mapping, more than 64 keys), ``filter key`` (not a str, or holds
            NUL or a surrogate) or ``filter[key]`` (a value that is not plain JSON: only such values are stored
            where the store can compare them).
    """
    if wanted is None:
        return {}
    if not isinstance(wanted, Mapping):
        raise ValidationError("filter", (f"must be a mapping of str to JSON values, got {type(wanted).__name__}",))
    if len(wanted) > MAX_FILTER_KEYS:
        raise ValidationError("filter", (f"must hold at most {MAX_FILTER_KEYS} keys, got {len(wanted)}",))
    out: dict[str, str] = {}
    for key, value in wanted.items():
        v.check_text("filter key", key)
        v.check_json(f"filter[{key!r}]", value)
        out[METADATA_PREFIX + key] = filter_text(value)
    return out


def _text(value: str) -> bool:
    try:
        v.check_text("key", value)
    except ValidationError:
        return False
    return True


def store_thread(thread_id: Any, checkpoint_ns: Any) -> str:
    """The threadloom thread of a LangGraph ``(thread_id, checkpoint_ns)``.

    Raises:
        ValidationError: ``thread_id`` is not an id, holds the namespace separator, or the pair is longer than an
            id may be (255 characters).
    """
    v.check_id("thread_id", thread_id)
    if NS_SEPARATOR in thread_id:
        raise ValidationError("thread_id", (f"must not contain {NS_SEPARATOR!r} (it names subgraph namespaces)",))
    if checkpoint_ns is None or checkpoint_ns == "":
        return str(thread_id)
    if not isinstance(checkpoint_ns, str):
        raise ValidationError("checkpoint_ns", (f"must be a str, got {type(checkpoint_ns).__name__}",))
    return v.check_id("checkpoint_ns", f"{thread_id}{NS_SEPARATOR}{checkpoint_ns}")


def split_thread(store_thread_id: str) -> tuple[str, str]:
    """The LangGraph ``(thread_id, checkpoint_ns)`` of a threadloom thread this saver wrote."""
    root, sep, ns = store_thread_id.partition(NS_SEPARATOR)
    return (root, ns) if sep else (store_thread_id, "")


def configurable(config: Any) -> dict[str, Any]:
    """``config["configurable"]``, checked to be a mapping with a ``thread_id``.

    Raises:
        ValidationError: ``config`` is not a LangGraph config naming a thread.
    """
    conf = config.get("configurable") if isinstance(config, dict) else None
    if not isinstance(conf, dict) or "thread_id" not in conf:
        raise ValidationError("config", ('must be a RunnableConfig with configurable["thread_id"]',))
    return conf


def encode(serde: Any, field: str, value: Any) -> dict[str, str]:
    """``value`` through ``serde.dumps_typed`` as ``{"type": ..., "data": base64}``.

    Raises:
        ValidationError: naming ``field`` when the serializer cannot encode the value as data (it never pickles).
    """
    try:
        kind, data = serde.dumps_typed(value)
    except Exception as error:  # the serializer raises TypeError and friends for a value it cannot encode
        raise ValidationError(
            field, (f"cannot be stored as data ({type(error).__name__}: {error}); nothing was written",)
        ) from error
    if kind == "pickle":
        raise ValidationError(field, ("the serializer produced pickle, which threadloom never stores",))
    return {"type": str(kind), "data": base64.b64encode(bytes(data)).decode("ascii")}


def encoded_text(encoded: dict[str, str]) -> str | None:
    """The JSON text of an :func:`encode` result, or None when its type is not printable ASCII (the caller then
    lets a validating constructor encode it): its data is base64, which JSON writes as it is."""
    kind = encoded["type"]
    if not (kind.isascii() and kind.isprintable()):
        return None
    return f'{{"type":{_quote(kind)},"data":"{encoded["data"]}"}}'


def decode(serde: Any, thread_id: str, value: Any) -> Any:
    """The value :func:`encode` stored.

    Raises:
        StoreCorrupt: the stored text is not of that form or names pickle (never loaded).
    """
    if not isinstance(value, dict) or not isinstance(value.get("type"), str) or not isinstance(value.get("data"), str):
        raise StoreCorrupt("langgraph", f"thread {thread_id!r} holds a value that is not an encoded LangGraph value")
    if value["type"] == "pickle":
        raise StoreCorrupt("langgraph", f"thread {thread_id!r} holds a pickled value; threadloom never loads pickle")
    return serde.loads_typed((value["type"], base64.b64decode(value["data"])))


def write_index(channel: str, position: int) -> int:
    """LangGraph's index of a write: a special channel's fixed negative index, else its position in the call."""
    return WRITES_IDX_MAP.get(channel, position)


_build_write = prevalidated_builder(PendingWrite)


def pending_writes(
    serde: Any, checkpoint_id: str, task_id: str, task_path: str, writes: Sequence[tuple[str, Any]], batch: str
) -> list[PendingWrite]:
    """The threadloom pending writes of one ``put_writes`` call (each value encoded, nothing written).

    ``checkpoint_id`` must be an id the caller validated, ``batch`` printable ASCII. Each write's payload is built
    of the parts validated here (the channel, the path, the serializer's base64 output) and its JSON text composed
    from them, so the payload is not walked and encoded again (``prevalidated_builder``); a path or an encoded
    type that is not plain ASCII goes through ``PendingWrite``'s validating constructor instead.

    Raises:
        ValidationError: a channel is not a non-empty str, or a value cannot be encoded.
    """
    v.check_id("task_id", task_id)
    path = task_path if isinstance(task_path, str) else ""
    fast = path.isascii()
    path_text = _quote(path)
    out = []
    for position, item in enumerate(writes):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValidationError(f"writes[{position}]", ("must be a (channel, value) pair",))
        channel, value = item
        v.check_id(f"writes[{position}] channel", channel)
        index = write_index(channel, position)
        encoded = encode(serde, f"writes[{position}] value", value)
        payload = {"idx": index, "channel": channel, "path": path, "batch": batch, "value": encoded}
        value_text = encoded_text(encoded) if fast and type(index) is int else None
        if value_text is None:
            out.append(PendingWrite(checkpoint_id=checkpoint_id, task_id=task_id, node_id=channel, payload=payload))
            continue
        text = (
            f'{{"idx":{index},"channel":{_quote(channel)},"path":{path_text},"batch":"{batch}",'
            f'"value":{value_text}}}'
        )
        out.append(_build_write(text, checkpoint_id, task_id, channel, payload))
    return out


def fold_writes(serde: Any, thread_id: str, stored: Iterable[tuple[str, Any]]) -> list[tuple[str, str, Any]]:
    """The LangGraph pending writes of a checkpoint from the ``(task_id, payload)`` of the threadloom writes stored
    against it, in commit order.

    Two executions of one task never mix: a task's regular writes (index >= 0) are those of the first
    ``put_writes`` call that stored any for it, whole; a later call's regular writes for that task are left out.
    A special write (error, interrupt, scheduled, resume) replaces the task's earlier one of the same channel.

    Returns:
        ``(task_id, channel, value)`` triples in LangGraph's ``writes_sort_key`` order (task path, task id, index).
    """
    first_batch: dict[str, str] = {}
    regular: dict[tuple[str, int], tuple[str, str, int, Any]] = {}
    special: dict[tuple[str, int], tuple[str, str, int, Any]] = {}
    for task_id, payload in stored:
        if not isinstance(payload, dict) or not isinstance(payload.get("idx"), int) or "value" not in payload:
            raise StoreCorrupt("langgraph", f"thread {thread_id!r} holds a pending write that is not LangGraph's")
        idx, batch = payload["idx"], str(payload.get("batch", ""))
        key = (task_id, idx)
        entry = (str(payload.get("path", "")), str(payload["channel"]), idx, payload["value"])
        if idx < 0:
            special[key] = entry
            continue
        owner = first_batch.setdefault(task_id, batch)
        if owner == batch and key not in regular:
            regular[key] = entry
    rows = [(key, entry) for key, entry in (*regular.items(), *special.items())]
    rows.sort(key=lambda row: writes_sort_key(row[1][0], row[0][0], row[1][2]))
    return [(task, entry[1], decode(serde, thread_id, entry[3])) for (task, _idx), entry in rows]


def regular_tasks(stored: Iterable[PendingWrite]) -> set[str]:
    """The tasks that already hold regular writes among ``stored``."""
    return {
        write.task_id
        for write in stored
        if isinstance(write.payload, dict) and isinstance(write.payload.get("idx"), int) and write.payload["idx"] >= 0
        and LATE_KEY not in write.payload
    }


LATE_KEY = "of"
"""The payload key of a write that came after its checkpoint was superseded, stored against the next one (the
latest then): it names the checkpoint the write is for."""


def late(write: PendingWrite, latest: str) -> PendingWrite:
    """``write`` (for a checkpoint before ``latest``) as a write stored against ``latest``, naming its own.

    ``latest`` must be an id the caller validated: the payload is a copy of ``write``'s with its checkpoint id
    added, and its text ``write``'s sealed text with that member added (``prevalidated_builder``).
    """
    payload = write.payload
    if isinstance(payload, dict) and payload and LATE_KEY not in payload:
        text = write.sealed_json()  # validated again if a field of write was replaced
        if text.endswith("}"):
            copy = v.copy_json(payload)
            copy[LATE_KEY] = write.checkpoint_id
            return _build_write(f'{text[:-1]},"{LATE_KEY}":{_quote(write.checkpoint_id)}}}', latest, write.task_id,
                                write.node_id, copy)
    return PendingWrite(checkpoint_id=latest, task_id=write.task_id, node_id=write.node_id,
                        payload={**payload, LATE_KEY: write.checkpoint_id})


def own(held: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Of the writes a checkpoint held, those for it (not late writes for a checkpoint before it)."""
    return [item for item in held if not (isinstance(item[1], dict) and LATE_KEY in item[1])]


def late_of(held: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Of the writes a checkpoint held, the late writes (each naming its checkpoint under :data:`LATE_KEY`)."""
    return [item for item in held if isinstance(item[1], dict) and isinstance(item[1].get(LATE_KEY), str)]


def holds_late(writes: Iterable[PendingWrite]) -> bool:
    """Whether any of the pending writes stored against a checkpoint is a late write for an earlier one."""
    return any(isinstance(w.payload, dict) and LATE_KEY in w.payload for w in writes)


def late_seen(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` (a threadloom checkpoint this saver stored) says a checkpoint of its thread, it or
    an earlier one, carries late writes (:data:`LATE_STATE`)."""
    state = getattr(checkpoint, "state", None)
    return isinstance(state, dict) and state.get(LATE_STATE) is True


def batch_order(item: tuple[str, Any]) -> int:
    """The position of a write's ``put_writes`` call among its saver's calls (its batch's count), for ordering
    a checkpoint's late writes, which one run sent, as they were sent."""
    batch = item[1].get("batch") if isinstance(item[1], dict) else None
    if isinstance(batch, str):
        try:
            return int(batch.rpartition("-")[2], 16)
        except ValueError:
            pass
    return 0


def superseded(writes: Iterable[PendingWrite], checkpoint_id: str) -> dict[str, Any]:
    """What a checkpoint's state carries of the pending writes of ``checkpoint_id``, the checkpoint it supersedes
    (the store keeps pending writes only for the latest checkpoint; README "LangGraph")."""
    return {"id": checkpoint_id, "writes": [[w.task_id, w.payload] for w in writes]}


def carried(thread_id: str, successor: Any, checkpoint_id: str) -> list[tuple[str, Any]]:
    """The ``(task_id, payload)`` of the pending writes ``checkpoint_id`` held when ``successor`` (the checkpoint
    after it in the store's order) superseded it; none when ``successor`` carries none for it.

    Raises:
        StoreCorrupt: the carried writes are not of the form :func:`superseded` gives.
    """
    found_id, writes = carried_by(thread_id, successor)
    return writes if found_id == checkpoint_id else []


def carried_by(thread_id: str, item: Any) -> tuple[str | None, list[tuple[str, Any]]]:
    """The id of the checkpoint ``item`` superseded and the ``(task_id, payload)`` of the pending writes that one
    held then (None and none when ``item`` carries none).

    Raises:
        StoreCorrupt: the carried writes are not of the form :func:`superseded` gives.
    """
    state = getattr(item, "state", None)
    found = state.get("superseded") if isinstance(state, dict) else None
    if not isinstance(found, dict) or not isinstance(found.get("id"), str):
        return None, []
    writes = found.get("writes")
    if not isinstance(writes, list) or not all(
        isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) for entry in writes
    ):
        raise StoreCorrupt("langgraph", f"thread {thread_id!r} carries pending writes that are not LangGraph's")
    return found["id"], [(entry[0], entry[1]) for entry in writes]
