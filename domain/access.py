"""Access schemas and stamps: which access attributes every stored row of a graph kind carries (README "Access
schemas").

An :class:`AccessSchema` declares, for one graph kind (``graph_id``), the attributes taken from a thread's latest
checkpoint - ``tenant_id`` always, more by declaration (a metadata key, or a JSON pointer into the state). Its
:attr:`~AccessSchema.hash` names it. :meth:`AccessSchema.derive` gives the :class:`AccessStamp` a store writes on
every row of the thread (its columns ``access_schema``, ``access_tenant``, ``access_attrs``). The walk of a graph
kind keeps its progress in a :class:`WalkRecord`, the state of the walk's own thread.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

import attrs

from threadloom.domain import validation as v
from threadloom.domain.errors import ProcessingError, ValidationError
from threadloom.domain.values import Checkpoint

ATTRIBUTE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")
"""An attribute's name: a lower-case identifier of at most 63 characters (a column name in every database)."""

SOURCES = ("metadata", "state")
"""Where an attribute is taken from: a checkpoint metadata key, or an RFC 6901 JSON pointer into its state."""

WALK_GRAPH_ID = "threadloom.access-walk"
"""The reserved ``graph_id`` of a walk thread's checkpoints: the stores never stamp, list or walk such a thread."""

WALK_MARK = "#access-walk/"
"""What a walk thread's id holds between its group and its graph kind (:func:`walk_thread_id`)."""

HASH_PREFIX = "a1"
"""The version prefix of a schema hash (the canonical form's version)."""

JSON = Any

StampColumns = tuple[str, str | None, str]
"""An access stamp as a store writes it: ``(access_schema, access_tenant, access_attrs)``, the last JSON text."""


def _name(_inst: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str) or ATTRIBUTE_NAME.match(value) is None:
        raise ValidationError(
            "access_attribute.name",
            (f"must be a lower-case identifier ([a-z_][a-z0-9_]{{0,62}}), got {value!r}",),
        )
    if value == "tenant_id":
        raise ValidationError("access_attribute.name", ("tenant_id is always an attribute; do not declare it",))


def _source(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in SOURCES:
        raise ValidationError("access_attribute.source", (f"must be one of {list(SOURCES)}, got {value!r}",))


def _pointer_tokens(pointer: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer (``""`` is the whole state: no tokens)."""
    if pointer == "":
        return ()
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/"))


_BAD_ESCAPE = re.compile(r"~(?![01])")


@attrs.frozen
class AccessAttribute:
    """One declared access attribute.

    Attributes:
        name: the attribute's name, a lower-case identifier (``[a-z_][a-z0-9_]{0,62}``), not ``tenant_id``.
        source: ``"metadata"`` (``key`` is a checkpoint metadata key) or ``"state"`` (``key`` is an RFC 6901
            JSON pointer into ``checkpoint.state``, e.g. ``"/customer/region"``).
        key: the metadata key or the pointer. A value missing from the checkpoint derives as JSON ``null``.

    Raises:
        ValidationError: naming ``access_attribute.name``, ``.source`` or ``.key``.
    """

    name: str = attrs.field(validator=_name)
    source: Literal["metadata", "state"] = attrs.field(validator=_source)
    key: str = attrs.field()
    _tokens: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False, hash=False)

    @key.validator
    def _check_key(self, _attr: Any, value: Any) -> None:
        v.check_text("access_attribute.key", value)
        if self.source == "metadata":
            if not value:
                raise ValidationError("access_attribute.key", ("a metadata key must not be empty",))
        elif value and (not value.startswith("/") or _BAD_ESCAPE.search(value)):
            raise ValidationError(
                "access_attribute.key",
                (f"must be an RFC 6901 JSON pointer ('' or '/a/b', '~' only as ~0 or ~1), got {value!r}",),
            )

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_tokens", _pointer_tokens(self.key) if self.source == "state" else ())

    def value_of(self, checkpoint: Checkpoint) -> JSON:
        """This attribute's value in ``checkpoint``: JSON, ``None`` when it is missing there."""
        if self.source == "metadata":
            return checkpoint.metadata.get(self.key)
        node: Any = checkpoint.state
        for token in self._tokens:
            if isinstance(node, dict):
                if token not in node:
                    return None
                node = node[token]
            elif isinstance(node, list):
                if not token.isdigit() or (token != "0" and token.startswith("0")) or int(token) >= len(node):
                    return None
                node = node[int(token)]
            else:
                return None
        return node

    def canonical(self) -> dict[str, str]:
        """The attribute in the canonical form its schema's hash covers."""
        return {"key": self.key, "name": self.name, "source": self.source}


def _stamp_attrs(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError("access_stamp.attributes", (f"must be a mapping, got {type(value).__name__}",))
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or ATTRIBUTE_NAME.match(key) is None:
            raise ValidationError("access_stamp.attributes", (f"key {key!r} is not an attribute name",))
        v.check_json(f"access_stamp.attributes.{key}", item)
        out[key] = item
    return out


@attrs.frozen
class AccessStamp:
    """The access attributes a store writes on every row of a thread: its stamp.

    Attributes:
        schema: the hash of the schema that derived it (column ``access_schema``).
        tenant_id: the thread's tenant (column ``access_tenant``).
        attributes: the declared attributes' values, by name (column ``access_attrs``, JSON).

    Raises:
        ValidationError: a bad schema hash, tenant id, or a non-JSON attribute value, naming the field.
    """

    schema: str = attrs.field(validator=lambda _i, _a, value: v.check_id("access_stamp.schema", value))
    tenant_id: str | None = attrs.field(
        validator=lambda _i, _a, value: v.check_optional_id("access_stamp.tenant_id", value)
    )
    attributes: dict[str, JSON] = attrs.field(factory=dict, converter=_stamp_attrs)

    @property
    def attributes_text(self) -> str:
        """``attributes`` as canonical JSON text (keys sorted, compact): what a store writes and compares."""
        return canonical_json(self.attributes)

    def columns(self) -> tuple[str, str | None, str]:
        """``(access_schema, access_tenant, access_attrs)`` as a store writes them."""
        return (self.schema, self.tenant_id, self.attributes_text)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """Canonical JSON text: keys sorted, compact separators, no ASCII escaping."""
    return _CANONICAL.encode(value)


def _attributes(value: Any) -> tuple[AccessAttribute, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValidationError("access_schema.attributes", ("must be a sequence of AccessAttribute",))
    items = tuple(value)
    for item in items:
        if not isinstance(item, AccessAttribute):
            raise ValidationError(
                "access_schema.attributes", (f"must hold AccessAttribute values, got {type(item).__name__}",)
            )
    names = [item.name for item in items]
    if len(set(names)) != len(names):
        raise ValidationError("access_schema.attributes", ("two attributes share a name",))
    return tuple(sorted(items, key=lambda item: item.name))


@attrs.frozen
class AccessSchema:
    """The access attributes of one graph kind (README "Access schemas").

    ``tenant_id`` (the checkpoint's) is always an attribute; ``attributes`` add to it. Two schemas that declare
    the same attributes in another order are equal and share a hash.

    Attributes:
        graph_id: the graph kind.
        attributes: the declared attributes (kept sorted by name; names unique).

    Raises:
        ValidationError: a bad ``graph_id`` or attributes (two sharing a name), naming the field.
    """

    graph_id: str = attrs.field(validator=lambda _i, _a, value: v.check_id("access_schema.graph_id", value))
    attributes: tuple[AccessAttribute, ...] = attrs.field(default=(), converter=_attributes)
    _hash: str = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        if self.graph_id == WALK_GRAPH_ID:
            raise ValidationError("access_schema.graph_id", (f"{WALK_GRAPH_ID!r} is reserved for the walks",))
        digest = hashlib.sha256(self.canonical().encode("utf-8")).hexdigest()
        object.__setattr__(self, "_hash", HASH_PREFIX + digest[:14])

    def canonical(self) -> str:
        """The canonical form the hash covers: sorted JSON of the graph kind and its attributes."""
        return canonical_json(
            {"attributes": [item.canonical() for item in self.attributes], "graph_id": self.graph_id, "v": 1}
        )

    @property
    def hash(self) -> str:
        """The schema's name: ``"a1"`` and 14 hex digits of the SHA-256 of :meth:`canonical`. Stable across
        processes, versions and the order the attributes were declared in."""
        return self._hash

    def derive(self, checkpoint: Checkpoint) -> AccessStamp:
        """The stamp of a thread whose latest checkpoint is ``checkpoint``: its tenant and each attribute's value
        (JSON ``null`` when missing)."""
        return AccessStamp(
            schema=self._hash,
            tenant_id=checkpoint.tenant_id,
            attributes={item.name: item.value_of(checkpoint) for item in self.attributes},
        )

    def columns(self, checkpoint: Checkpoint) -> tuple[str, str | None, str]:
        """``derive(checkpoint).columns()``, without building the stamp for a schema of the tenant only."""
        if not self.attributes:
            return (self._hash, checkpoint.tenant_id, "{}")
        # the values come from a validated checkpoint: JSON already, nothing to check again
        values = {item.name: item.value_of(checkpoint) for item in self.attributes}
        return (self._hash, checkpoint.tenant_id, canonical_json(values))


def _schemas(value: Any) -> tuple[AccessSchema, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValidationError("access_schemas", ("must be a sequence of AccessSchema",))
    items = tuple(value)
    by_graph: dict[str, AccessSchema] = {}
    by_hash: dict[str, AccessSchema] = {}
    for item in items:
        if not isinstance(item, AccessSchema):
            raise ValidationError("access_schemas", (f"must hold AccessSchema values, got {type(item).__name__}",))
        other = by_graph.get(item.graph_id)
        if other is not None and other != item:
            raise ValidationError(
                "access_schemas.graph_id", (f"{item.graph_id!r} is declared twice, with different attributes",)
            )
        other = by_hash.get(item.hash)
        if other is not None and other != item:
            raise ValidationError(
                "access_schemas.hash", (f"{item.hash!r} names two different declarations; rename an attribute",)
            )
        by_graph[item.graph_id] = by_hash[item.hash] = item
    return tuple(sorted(by_graph.values(), key=lambda item: item.graph_id))


@attrs.frozen
class AccessSchemas:
    """A node's access schemas: at most one per graph kind; a kind nobody declared has ``AccessSchema(graph_id)``.

    Raises:
        ValidationError: two different declarations of one graph kind (``access_schemas.graph_id``) or of one
            hash (``access_schemas.hash``), or a value that is not an ``AccessSchema``.
    """

    schemas: tuple[AccessSchema, ...] = attrs.field(default=(), converter=_schemas)
    _by_graph: dict[str, AccessSchema] = attrs.field(init=False, eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_graph", {item.graph_id: item for item in self.schemas})

    def for_graph(self, graph_id: str) -> AccessSchema:
        """The schema of ``graph_id``: the declared one, else the implicit tenant-only ``AccessSchema(graph_id)``."""
        found = self._by_graph.get(graph_id)
        if found is None:
            found = AccessSchema(graph_id)
            self._by_graph[graph_id] = found  # a cache of implicit schemas (equal whoever builds them)
        return found

    def declared(self, graph_id: str) -> bool:
        """True when ``graph_id`` has a declared schema (not only the implicit one)."""
        return any(item.graph_id == graph_id for item in self.schemas)


NO_ACCESS = AccessSchemas()
"""No schema declared: every graph kind has its implicit tenant-only schema (a store's default)."""


def _positive_interval(_inst: Any, _attr: Any, value: Any) -> None:
    v.check_positive_duration("access_stamp_options.interval", value)


def _batch(_inst: Any, _attr: Any, value: Any) -> None:
    v.check_int("access_stamp_options.walk_batch", value, low=1, high=1000)


def _share(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValidationError("access_stamp_options.walk_share", (f"must be in (0, 1], got {value!r}",))


def _rate(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValidationError("access_stamp_options.walk_rate", (f"must be a finite number > 0, got {value!r}",))


@attrs.frozen(kw_only=True)
class AccessStampOptions:
    """How the walks of a node run (README "Access schemas").

    Attributes:
        interval: about how often a walk records its cursor (a page holds what the pace stamps in it); > 0.
        walk_batch: most threads in one page, 1..1000.
        walk_share: the largest share of its time a walker spends stamping, in (0, 1].
        walk_rate: the most threads a walker stamps a second, > 0.

    Raises:
        ValidationError: a value out of range, naming ``access_stamp_options.<field>``.
    """

    interval: timedelta = attrs.field(default=timedelta(seconds=10), validator=_positive_interval)
    walk_batch: int = attrs.field(default=1000, validator=_batch)
    walk_share: float = attrs.field(default=0.10, validator=_share)
    walk_rate: float = attrs.field(default=100.0, validator=_rate)


def _opt_cursor(_inst: Any, _attr: Any, value: Any) -> None:
    v.check_optional_id("walk_record.cursor", value)


@attrs.frozen(kw_only=True)
class WalkRecord:
    """The progress of one walk of a graph kind: the state of the walk's own thread (:func:`walk_thread_id`).

    Attributes:
        graph_id: the graph kind walked.
        schema: the hash of the schema the walk stamps with.
        heads: the storage-wide token high-water mark when the walk was claimed: the walk stamps rows up to it.
        cursor: the last thread id stamped (threads are walked ascending by id), None before the first.
        count: threads stamped so far.
        completed: True once past the last page.

    Raises:
        ValidationError: naming ``walk_record.<field>``.
    """

    graph_id: str = attrs.field(validator=lambda _i, _a, value: v.check_id("walk_record.graph_id", value))
    schema: str = attrs.field(validator=lambda _i, _a, value: v.check_id("walk_record.schema", value))
    heads: int = attrs.field(validator=lambda _i, _a, value: v.check_int("walk_record.heads", value, low=0))
    cursor: str | None = attrs.field(default=None, validator=_opt_cursor)
    count: int = attrs.field(default=0, validator=lambda _i, _a, value: v.check_int("walk_record.count", value, low=0))
    completed: bool = attrs.field(default=False)

    @completed.validator
    def _check_completed(self, _attr: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise ValidationError("walk_record.completed", (f"must be a bool, got {type(value).__name__}",))

    def to_state(self) -> dict[str, Any]:
        """The record as the walk thread's checkpoint state (JSON)."""
        return {
            "graph_id": self.graph_id,
            "schema": self.schema,
            "heads": self.heads,
            "cursor": self.cursor,
            "count": self.count,
            "completed": self.completed,
        }

    def checkpoint(
        self, walk_thread_id: str, *, id: str, parent: str | None, run_id: str, created_at: datetime
    ) -> Checkpoint:
        """The walk thread's checkpoint holding this record (graph kind :data:`WALK_GRAPH_ID`, no tenant): what a
        walker commits, fenced by its lease, with the ordinary ``commit``.

        Raises:
            ValidationError: a bad id, run id or time, naming the field.
        """
        from threadloom.domain.values import CheckpointStatus

        return Checkpoint(
            id=id, parent=parent, thread_id=walk_thread_id, run_id=run_id, status=CheckpointStatus.RUNNING,
            created_at=created_at, state=self.to_state(), graph_id=WALK_GRAPH_ID,
        )

    @classmethod
    def from_state(cls, walk_thread_id: str, state: Any) -> WalkRecord:
        """The record a walk thread's checkpoint state holds.

        Raises:
            ProcessingError: (operation ``"walk"``) the state does not decode as a walk record; the message
                names the walk thread. Not retryable: the stored record is damaged or of another version.
        """
        try:
            if not isinstance(state, dict):
                raise ValidationError("walk_record", (f"must be a JSON object, got {type(state).__name__}",))
            unknown = set(state) - {"graph_id", "schema", "heads", "cursor", "count", "completed"}
            if unknown:
                raise ValidationError("walk_record", (f"holds unknown fields {sorted(unknown)}",))
            fields: Any = state
            return cls(
                graph_id=fields.get("graph_id"),
                schema=fields.get("schema"),
                heads=fields.get("heads"),
                cursor=fields.get("cursor"),
                count=fields.get("count"),
                completed=fields.get("completed"),
            )
        except ValidationError as error:
            raise ProcessingError(
                "walk", f"the walk record of {walk_thread_id!r} does not decode ({error}); it is damaged"
            ) from error


def _group(group: Any) -> str:
    v.check_id("group", group)
    if "#" in group:
        raise ValidationError("group", (f"must not contain '#', got {group!r}",))
    return group


def walk_thread_id(group: str, graph_id: str) -> str:
    """The reserved thread whose claim is the walk lease of ``graph_id`` in ``group``:
    ``"<group>#access-walk/<graph_id>"``.

    Raises:
        ValidationError: a bad ``group`` (it may not hold ``#``) or ``graph_id``, or a result over 255 characters.
    """
    v.check_id("graph_id", graph_id)
    return v.check_id("walk thread id", f"{_group(group)}{WALK_MARK}{graph_id}")


def member_group(group: str) -> str:
    """The membership group of ``group``'s access walks: ``"<group>#access"``."""
    return v.check_id("member group", f"{_group(group)}#access")


def serves(schema: AccessSchema) -> str:
    """What a member serving ``schema`` heartbeats: ``"<graph_id>@<hash>"``."""
    return f"{schema.graph_id}@{schema.hash}"


def is_walk_thread(thread_id: str) -> bool:
    """True for a reserved walk thread id (:func:`walk_thread_id`)."""
    return WALK_MARK in thread_id


@attrs.frozen
class Member:
    """A live member of a group (:meth:`Checkpointer.members`).

    Attributes:
        member: the member's name.
        serves: what it serves (``"<graph_id>@<hash>"`` each), sorted.
        expires_at: when its last heartbeat expires, by the store's clock (UTC).
    """

    member: str
    serves: tuple[str, ...]
    expires_at: datetime


@attrs.frozen
class TenantThread:
    """One thread of a tenant's export: the rows stamped for the tenant, in the store's order.

    Attributes:
        thread_id: the thread.
        checkpoints: its history, oldest first.
        pending_writes: the latest checkpoint's pending writes, in commit order.
        events: its events, ascending by ``seq``.
        effects: its effect records, by key ascending.
    """

    thread_id: str
    checkpoints: tuple[Any, ...] = ()
    pending_writes: tuple[Any, ...] = ()
    events: tuple[Any, ...] = ()
    effects: tuple[Any, ...] = ()


@attrs.frozen
class TenantExportPage:
    """A page of :meth:`Checkpointer.export_tenant`: threads ascending by id, and ``next`` (pass as ``after``)
    while more may follow, else None."""

    threads: tuple[TenantThread, ...] = ()
    next: str | None = None


__all__ = [
    "NO_ACCESS",
    "WALK_GRAPH_ID",
    "AccessAttribute",
    "AccessSchema",
    "AccessSchemas",
    "AccessStamp",
    "AccessStampOptions",
    "Member",
    "TenantExportPage",
    "TenantThread",
    "WalkRecord",
    "canonical_json",
    "is_walk_thread",
    "member_group",
    "serves",
    "walk_thread_id",
]
