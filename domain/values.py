"""The values of threadloom: attrs frozen classes that validate on construction.

Constructors take keywords. Times are timezone-aware ``datetime`` (UTC by convention), durations ``timedelta``,
ids non-empty ``str`` of at most 255 characters, JSON values plain ``dict``/``list``/``str``/``int``/``float``/
``bool``/``None``. A value that fails validation raises :class:`ValidationError` naming the field.
"""

from __future__ import annotations

import enum
import operator
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol, TypeVar

import attrs

from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError

_T = TypeVar("_T")


def _id(field: str):
    return lambda _inst, _attr, value: v.check_id(field, value)


def _opt_id(field: str):
    return lambda _inst, _attr, value: v.check_optional_id(field, value)


def trusted(cls: type[_T], **fields: Any) -> _T:
    """An instance of the attrs class ``cls`` from fields a store decoded from its own text, not validated.

    For stores only (reads decode the store's own text without validating it again): every field must be
    given, and valid. A sealed value built this way carries no encoded text (see :class:`_Sealed`).
    """
    value = object.__new__(cls)
    for name, item in fields.items():
        object.__setattr__(value, name, item)
    if isinstance(value, _Sealed):
        object.__setattr__(value, "_json", None)
        object.__setattr__(value, "_seal", ())
    return value


def trusted_builder(cls: type[_T]) -> Callable[..., _T]:
    """A function building ``cls`` as :func:`trusted` does, from its public fields given positionally in their
    declaration order: the same value, built faster (for stores decoding many rows).

    ``cls`` must be a slotted attrs class (every value class here is).
    """
    names = [field.name for field in attrs.fields(cls) if not field.name.startswith("_")]  # type: ignore[arg-type]
    tail: tuple[Any, ...] = (None, ()) if issubclass(cls, _Sealed) else ()
    setters = tuple(_slot(cls, name).__set__ for name in (*names, *(("_json", "_seal") if tail else ())))
    new = object.__new__

    def build(*values: Any) -> _T:
        value = new(cls)
        for put, item in zip(setters, values + tail, strict=True):
            put(value, item)
        return value

    return build


def _slot(cls: type, name: str) -> Any:
    """The slot descriptor of field ``name`` of ``cls``: the field's own, beneath a lazily decoded field's."""
    return vars(cls).get(f"_{name}_slot") or vars(cls)[name]


def intact(seal: tuple[Any, ...], fields: tuple[Any, ...]) -> bool:
    """True when each of ``fields`` is the very object ``seal`` recorded (a seal keeps the objects themselves, so
    no replaced field can pass for one freed and reallocated at the same address)."""
    return len(seal) == len(fields) and all(map(operator.is_, seal, fields))


class _Sealed:
    """A value whose JSON part is validated and encoded once, when it is constructed (encode once).

    The constructor encodes the JSON field strictly (:func:`~threadloom.domain.validation.encode_json`), keeps
    a fresh copy of it as the field's value (so the value never shares a dict or list with its caller: changing
    what you passed in changes nothing here) and keeps the text for the store, which writes it as is; given an
    :class:`~threadloom.domain.validation.EncodedJson` (validated and encoded already), it takes its text and copy
    as they are. A *seal*
    keeps every field's object (:func:`intact`): a value whose fields were replaced behind the constructor's back
    (``object.__setattr__``) no longer matches it and is validated and encoded again by :meth:`sealed_json`.
    Values a store decodes from its own text are built with :func:`trusted` and carry no text, but for a
    checkpoint read through :func:`lazy_checkpoint`: it keeps its state's stored text, decodes the state from it
    when ``state`` is first read (:class:`LazyJson`) and is sealed with it, so writing it again takes the text as
    it is.
    """

    __slots__ = ()
    _json: str | None
    _seal: tuple[Any, ...]
    _JSON_FIELD: ClassVar[str]
    _JSON_NAME: ClassVar[str]
    _GETTER: ClassVar[Any]
    _RAW: ClassVar[str]
    """The attribute reading the JSON field's slot as it is (a lazily decoded field's :class:`LazyJson` undecoded)."""

    def __attrs_post_init__(self) -> None:
        value = getattr(self, self._RAW)  # a LazyJson passed in is no JSON value: encode_json refuses it
        if value is None:
            object.__setattr__(self, "_json", "null")
        elif type(value) is v.EncodedJson:  # validated and encoded already (a node's step): taken as it is
            text, copy = value.take()
            object.__setattr__(self, self._JSON_FIELD, copy)
            object.__setattr__(self, "_json", text)
        else:
            text, copy = v.encode_json(self._JSON_NAME, value)
            object.__setattr__(self, self._JSON_FIELD, copy)
            object.__setattr__(self, "_json", text)
        object.__setattr__(self, "_seal", self._GETTER(self))

    def sealed_json(self) -> str:
        """The JSON text of the value's JSON field, validated: the constructor's, or made again if a field
        was replaced since (or the value was decoded by a store).

        Raises:
            ValidationError: a replaced field is not valid.
        """
        text = self._json
        if text is None or not intact(self._seal, self._GETTER(self)) or not self._checked(text):
            attrs.validate(self)  # type: ignore[arg-type]  # every _Sealed is an attrs class
            origin = getattr(self, "origin", None)
            if origin is not None:
                attrs.validate(origin)
            text, _copy = v.encode_json(self._JSON_NAME, getattr(self, self._JSON_FIELD))
        return text

    def _checked(self, text: str) -> bool:
        """Whether ``text``, the sealed text of an intact value, is written as it is: always, but for a lazily read
        JSON field not decoded yet, whose text is checked well-formed first (else it is decoded, validated and
        encoded again)."""
        raw = getattr(self, self._RAW)
        return type(raw) is not LazyJson or raw.check(text)



def _seal(cls: type) -> type:
    """Finishes a :class:`_Sealed` attrs class: the getter of its public fields, in order, as their slots hold them
    (a lazily decoded JSON field undecoded), and a lazily decoded field's descriptor (``_LAZY``, see
    :class:`LazyJson`)."""
    names = [a.name for a in attrs.fields(cls) if not a.name.startswith("_")]
    json_field: str = vars(cls)["_JSON_FIELD"]
    raw = json_field
    if cls.__dict__.get("_LAZY", False):
        slot = vars(cls)[json_field]
        raw = f"_{json_field}_slot"
        setattr(cls, raw, slot)  # the slot under a second name: read as it is, for the seal
        setattr(cls, json_field, _LazyField(slot, vars(cls)["_json"], vars(cls)["_seal"], names.index(json_field)))
    sealed: Any = cls
    sealed._RAW = raw
    sealed._GETTER = operator.attrgetter(*(raw if name == json_field else name for name in names))
    return cls


class LazyJson:
    """What the JSON field of a value read from a store holds until it is first read: the field decodes the
    value's ``_json`` text then, keeps what it decoded, and returns it from then on.

    ``decode(text, value)`` (the store's reader) returns the decoded value and whether ``text`` is its own text,
    strict JSON the value stays sealed with (else a commit validates and encodes the value again); it raises the
    store's error for text that does not decode. ``check(text)`` says whether text not decoded yet is strict JSON
    that a commit may write as it is (else the commit decodes it, validates and encodes it again).

    One shared instance per reader (it holds no text: the value does). Only :func:`lazy_checkpoint` puts one in a
    value. Two threads reading the field first at once may both decode; both get the one value kept (a lock
    guards the swap), so the field never changes once read.
    """

    __slots__ = ("check", "decode")

    def __init__(self, decode: Callable[[str, Any], tuple[Any, bool]], check: Callable[[str], bool]) -> None:
        self.decode = decode
        self.check = check

    def __repr__(self) -> str:
        return "LazyJson()"


_SWAP = threading.Lock()
"""Guards the swap of a :class:`LazyJson` for its decoded value (held for that swap only, never while decoding)."""


class _LazyField:
    """The data descriptor in front of a lazily decoded JSON field's slot (see :class:`LazyJson`)."""

    __slots__ = ("_get", "_set", "_delete", "_text", "_seal_get", "_seal_set", "_index")

    def __init__(self, slot: Any, text: Any, seal: Any, index: int) -> None:
        self._get, self._set, self._delete = slot.__get__, slot.__set__, slot.__delete__
        self._text = text.__get__
        self._seal_get, self._seal_set = seal.__get__, seal.__set__
        self._index = index

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        value = self._get(instance)
        if type(value) is LazyJson:
            return self._load(instance, value)
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        self._set(instance, value)

    def __delete__(self, instance: Any) -> None:
        self._delete(instance)

    def _load(self, instance: Any, lazy: LazyJson) -> Any:
        decoded, own_text = lazy.decode(self._text(instance), instance)
        with _SWAP:
            current = self._get(instance)
            if type(current) is not LazyJson:  # another thread's decode won: everyone gets the one value
                return current
            self._set(instance, decoded)
            seal, index = self._seal_get(instance), self._index
            if own_text and len(seal) > index and seal[index] is current:  # sealed with its text: still so
                self._seal_set(instance, (*seal[:index], decoded, *seal[index + 1 :]))
        return decoded


def _aware(field: str):
    return lambda _inst, _attr, value: v.check_aware(field, value)


def _str_map(value: Any) -> dict[str, str]:
    return v.check_str_map("metadata", value)


def _opt_str_map(value: Any) -> dict[str, str] | None:
    return None if value is None else v.check_str_map("metadata", value)


def _tuple_of(kind: type, field: str):
    def convert(value: Any) -> tuple:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise ValidationError(field, (f"must be a sequence of {kind.__name__}",))
        items = tuple(value)
        for index, item in enumerate(items):
            if not isinstance(item, kind):
                raise ValidationError(
                    f"{field}[{index}]", (f"must be a {kind.__name__}, got {type(item).__name__}",)
                )
        return items

    return convert


class CheckpointStatus(enum.Enum):
    """The status of a checkpoint; ``COMPLETED`` and ``FAILED`` are *settled*."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def settled(self) -> bool:
        """True for ``COMPLETED`` and ``FAILED``."""
        return self in (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED)


class ThreadStatus(enum.Enum):
    """A thread's status as the registry reports it."""

    RUNNING = "running"
    """A live claim holds it."""
    IDLE = "idle"
    """Its latest checkpoint is RUNNING and no live claim holds it."""
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    DELETED = "deleted"
    """A cascade delete has begun."""


@attrs.frozen(kw_only=True)
class CheckpointOrigin:
    """Where a child thread was spawned: the parent thread, and optionally its checkpoint and task."""

    parent_thread: str = attrs.field(validator=_id("origin.parent_thread"))
    parent_checkpoint: str | None = attrs.field(default=None, validator=_opt_id("origin.parent_checkpoint"))
    task_id: str | None = attrs.field(default=None, validator=_opt_id("origin.task_id"))


def _status(value: Any) -> CheckpointStatus:
    if isinstance(value, CheckpointStatus):
        return value
    raise ValidationError("status", (f"must be a CheckpointStatus, got {value!r}",))


def _optional(kind: type, field: str):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is not None and not isinstance(value, kind):
            raise ValidationError(field, (f"must be a {kind.__name__} or None, got {type(value).__name__}",))

    return check


def _check_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValidationError(field, (f"must be a bool, got {type(value).__name__}",))


def _check_instance(field: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ValidationError(field, (f"must be a {kind.__name__}, got {type(value).__name__}",))


def _opt_token(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None:
        v.check_int("fencing_token", value, low=1)


@_seal
@attrs.frozen(kw_only=True)
class Checkpoint(_Sealed):
    """One step of a thread's history.

    ``created_at`` is the producer's clock, kept as its record and never used for retention; the store stamps
    its own commit time. ``fencing_token`` is stamped by the store with the commit's token.
    """

    id: str = attrs.field(validator=_id("checkpoint.id"))
    parent: str | None = attrs.field(validator=_opt_id("checkpoint.parent"))
    thread_id: str = attrs.field(validator=_id("checkpoint.thread_id"))
    run_id: str = attrs.field(validator=_id("checkpoint.run_id"))
    status: CheckpointStatus = attrs.field(converter=_status)
    created_at: datetime = attrs.field(validator=_aware("checkpoint.created_at"))
    state: Any = attrs.field(factory=dict)
    graph_id: str = attrs.field(default="default", validator=_id("checkpoint.graph_id"))
    tenant_id: str | None = attrs.field(default=None, validator=_opt_id("checkpoint.tenant_id"))
    fencing_token: int | None = attrs.field(default=None, validator=_opt_token)
    origin: CheckpointOrigin | None = attrs.field(
        default=None, validator=_optional(CheckpointOrigin, "checkpoint.origin")
    )
    metadata: dict[str, str] = attrs.field(factory=dict, converter=_str_map)
    _json: str | None = attrs.field(init=False, default=None, eq=False, repr=False, hash=False)
    _seal: tuple[Any, ...] = attrs.field(init=False, default=(), eq=False, repr=False, hash=False)
    _JSON_FIELD: ClassVar[str] = "state"
    _JSON_NAME: ClassVar[str] = "checkpoint.state"
    _LAZY: ClassVar[bool] = True


_CHECKPOINT_FIELDS = (
    "id", "parent", "thread_id", "run_id", "status", "created_at", "state", "graph_id", "tenant_id", "fencing_token",
    "origin", "metadata",
)  # fmt: skip


def _lazy_checkpoint_builder() -> Callable[..., Checkpoint]:
    if tuple(a.name for a in attrs.fields(Checkpoint) if not a.name.startswith("_")) != _CHECKPOINT_FIELDS:
        raise TypeError("Checkpoint's fields changed: update lazy_checkpoint")  # pragma: no cover
    (put_id, put_parent, put_thread, put_run, put_status, put_created, put_state, put_graph, put_tenant, put_token,
     put_origin, put_metadata, put_json, put_seal) = (
        _slot(Checkpoint, name).__set__ for name in (*_CHECKPOINT_FIELDS, "_json", "_seal")
    )  # fmt: skip
    new = object.__new__

    def lazy_checkpoint(
        text: str, id: str, parent: str | None, thread_id: str, run_id: str, status: CheckpointStatus,
        created_at: datetime, state: LazyJson, graph_id: str, tenant_id: str | None, fencing_token: int | None,
        origin: CheckpointOrigin | None, metadata: dict[str, str],
    ) -> Checkpoint:  # fmt: skip
        value = new(Checkpoint)
        put_id(value, id)
        put_parent(value, parent)
        put_thread(value, thread_id)
        put_run(value, run_id)
        put_status(value, status)
        put_created(value, created_at)
        put_state(value, state)
        put_graph(value, graph_id)
        put_tenant(value, tenant_id)
        put_token(value, fencing_token)
        put_origin(value, origin)
        put_metadata(value, metadata)
        put_json(value, text)
        # Sealed with the fields as they are, the state its LazyJson: what _GETTER reads back until it is decoded.
        put_seal(
            value,
            (id, parent, thread_id, run_id, status, created_at, state, graph_id, tenant_id, fencing_token, origin,
             metadata),
        )  # fmt: skip
        return value

    return lazy_checkpoint


lazy_checkpoint = _lazy_checkpoint_builder()
"""``lazy_checkpoint(text, id, parent, thread_id, run_id, status, created_at, state, graph_id, tenant_id,
fencing_token, origin, metadata)``: a :class:`Checkpoint` read from a store, whose ``state`` (given as a
:class:`LazyJson`) is decoded from ``text``, its stored JSON text, when first read.

For stores only, as :func:`trusted` is: nothing is validated, every field must be valid and ``text`` JSON text the
store wrote. The value is sealed with ``text``, so writing it again takes the text as it is
(:meth:`_Sealed.sealed_json`), without decoding it.
"""


@_seal
@attrs.frozen(kw_only=True)
class PendingWrite(_Sealed):
    """A finished task's result, recorded against the checkpoint whose step it ran in."""

    checkpoint_id: str = attrs.field(validator=_id("pending_write.checkpoint_id"))
    task_id: str = attrs.field(validator=_id("pending_write.task_id"))
    node_id: str = attrs.field(validator=_id("pending_write.node_id"))
    payload: Any = attrs.field(default=None)
    _json: str | None = attrs.field(init=False, default=None, eq=False, repr=False, hash=False)
    _seal: tuple[Any, ...] = attrs.field(init=False, default=(), eq=False, repr=False, hash=False)
    _JSON_FIELD: ClassVar[str] = "payload"
    _JSON_NAME: ClassVar[str] = "pending_write.payload"


@_seal
@attrs.frozen(kw_only=True)
class EventDraft(_Sealed):
    """An event as a producer commits it; the store numbers it."""

    run_id: str = attrs.field(validator=_id("event.run_id"))
    type: str = attrs.field(validator=_id("event.type"))
    timestamp: datetime = attrs.field(validator=_aware("event.timestamp"))
    payload: Any = attrs.field(default=None)
    checkpoint_id: str | None = attrs.field(default=None, validator=_opt_id("event.checkpoint_id"))
    task_id: str | None = attrs.field(default=None, validator=_opt_id("event.task_id"))
    node_id: str | None = attrs.field(default=None, validator=_opt_id("event.node_id"))
    _json: str | None = attrs.field(init=False, default=None, eq=False, repr=False, hash=False)
    _seal: tuple[Any, ...] = attrs.field(init=False, default=(), eq=False, repr=False, hash=False)
    _JSON_FIELD: ClassVar[str] = "payload"
    _JSON_NAME: ClassVar[str] = "event.payload"


@attrs.frozen(kw_only=True)
class EventRecord:
    """A numbered event: the draft's fields plus ``thread_id``, ``seq`` and the commit's ``token``."""

    thread_id: str = attrs.field(validator=_id("event.thread_id"))
    seq: int = attrs.field()
    token: int = attrs.field()
    run_id: str = attrs.field(validator=_id("event.run_id"))
    type: str = attrs.field(validator=_id("event.type"))
    timestamp: datetime = attrs.field(validator=_aware("event.timestamp"))
    payload: Any = None
    checkpoint_id: str | None = None
    task_id: str | None = None
    node_id: str | None = None

    @classmethod
    def of(cls, draft: EventDraft, *, thread_id: str, seq: int, token: int) -> EventRecord:
        """The record a store returns for ``draft`` numbered ``seq`` by a commit under ``token``.

        The draft was validated when it was built; only ``thread_id`` is checked here.
        """
        v.check_id("event.thread_id", thread_id)
        return trusted(
            cls,
            thread_id=thread_id,
            seq=seq,
            token=token,
            run_id=draft.run_id,
            type=draft.type,
            timestamp=draft.timestamp,
            payload=draft.payload,
            checkpoint_id=draft.checkpoint_id,
            task_id=draft.task_id,
            node_id=draft.node_id,
        )


@_seal
@attrs.frozen(kw_only=True)
class EffectRecord(_Sealed):
    """The recorded result of a side effect under an idempotency ``key`` (first-wins)."""

    key: str = attrs.field(validator=_id("effect.key"))
    run_id: str = attrs.field(validator=_id("effect.run_id"))
    recorded_at: datetime = attrs.field(validator=_aware("effect.recorded_at"))
    result: Any = attrs.field(default=None)
    checkpoint_id: str | None = attrs.field(default=None, validator=_opt_id("effect.checkpoint_id"))
    task_id: str | None = attrs.field(default=None, validator=_opt_id("effect.task_id"))
    _json: str | None = attrs.field(init=False, default=None, eq=False, repr=False, hash=False)
    _seal: tuple[Any, ...] = attrs.field(init=False, default=(), eq=False, repr=False, hash=False)
    _JSON_FIELD: ClassVar[str] = "result"
    _JSON_NAME: ClassVar[str] = "effect.result"


def _token(_inst: Any, _attr: Any, value: Any) -> None:
    v.check_int("commit.token", value, low=1)


def _fence(value: Any) -> tuple[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise ValidationError("commit.fence", ("must be a (thread_id, token) pair or None",))
    other, token = value
    return (v.check_id("commit.fence thread_id", other), v.check_int("commit.fence token", token, low=1))


@attrs.frozen(kw_only=True)
class Commit:
    """One atomic, fenced write to a thread.

    Attributes:
        token: the fencing token of the writer's claim.
        checkpoint: a new latest checkpoint, or None.
        pending_writes: writes against the resulting latest checkpoint, in order.
        events: drafts the store numbers contiguously, in order.
        effects: effect records, written first-wins by key.
        retract_turn: cut the history back to its newest settled checkpoint before adding ``checkpoint`` (needs
            one, whose parent names the latest before the cut, as in every commit).
        fence: ``(other_thread_id, other_token)``: also require that claim, checked after the thread's own.
        metadata: keys merged into the thread's metadata (a metadata commit moves ``updated_at``).
    """

    token: int = attrs.field(validator=_token)
    checkpoint: Checkpoint | None = attrs.field(default=None, validator=_optional(Checkpoint, "commit.checkpoint"))
    # The attrs mypy plugin takes no converter built by a call (it types the argument as Any, as it would anyway).
    pending_writes: tuple[PendingWrite, ...] = attrs.field(
        default=(), converter=_tuple_of(PendingWrite, "commit.pending_writes")  # type: ignore[misc]
    )
    events: tuple[EventDraft, ...] = attrs.field(
        default=(), converter=_tuple_of(EventDraft, "commit.events")  # type: ignore[misc]
    )
    effects: tuple[EffectRecord, ...] = attrs.field(
        default=(), converter=_tuple_of(EffectRecord, "commit.effects")  # type: ignore[misc]
    )
    retract_turn: bool = attrs.field(
        default=False, validator=lambda _i, _a, value: _check_bool("commit.retract_turn", value)
    )
    fence: tuple[str, int] | None = attrs.field(default=None, converter=_fence)
    metadata: dict[str, str] | None = attrs.field(default=None, converter=_opt_str_map)
    _seal: tuple[Any, ...] = attrs.field(init=False, default=(), eq=False, repr=False, hash=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_seal", _COMMIT_GETTER(self))


def _public_getter(cls: type) -> Any:
    return operator.attrgetter(*(a.name for a in attrs.fields(cls) if not a.name.startswith("_")))


_COMMIT_GETTER = _public_getter(Commit)

def prevalidated_builder(cls: type[_T]) -> Callable[..., _T]:
    """A function building a :class:`Checkpoint`, :class:`EventDraft` or :class:`Commit` from fields its caller
    validated already: for the runtime's own records of each step, whose parts were each validated once, where
    they entered (the node's ``Step``, the graph, the run's first checkpoint, the ids and the clock the runtime
    checks itself).

    The function takes the public fields positionally, in their declaration order - after ``text`` for a
    checkpoint or an event draft: the JSON text of its JSON field, whose value must be a private copy that
    ``text`` encodes (an :class:`~threadloom.domain.validation.EncodedJson`'s); the store writes it as it is.
    Nothing is checked but the number of fields. The value is sealed as its constructor seals it (the seal is the
    fields themselves), so a field replaced later is validated again when it is stored.

    Raises (the function built):
        ValueError: not exactly one value per public field (a bug of the caller).
    """
    names = [a.name for a in attrs.fields(cls) if not a.name.startswith("_")]  # type: ignore[arg-type]
    setters = tuple(_slot(cls, name).__set__ for name in names)
    put_seal = _slot(cls, "_seal").__set__
    new = object.__new__

    if not issubclass(cls, _Sealed):

        def build_plain(*values: Any) -> _T:
            value = new(cls)
            for put, item in zip(setters, values, strict=True):
                put(value, item)
            put_seal(value, values)  # what the constructor's seal holds: the public fields, in order
            return value

        return build_plain
    put_json = _slot(cls, "_json").__set__

    def build(text: str, *values: Any) -> _T:
        value = new(cls)
        for put, item in zip(setters, values, strict=True):
            put(value, item)
        put_json(value, text)
        put_seal(value, values)
        return value

    return build


@attrs.frozen(kw_only=True)
class StoredCheckpoint:
    """A thread's latest checkpoint and its pending writes, in commit order."""

    checkpoint: Checkpoint
    pending_writes: tuple[PendingWrite, ...] = ()


@attrs.frozen(kw_only=True)
class CheckpointPage:
    """A page of ``search_history``: matching checkpoints newest first, and the ``before`` of the next page.

    ``next`` is None once the history holds nothing older than what this page examined; otherwise pass it as
    ``before`` to go on (a page may hold fewer than ``limit`` checkpoints, none at all, and still name a next).
    """

    items: tuple[Checkpoint, ...] = ()
    next: str | None = None

    @classmethod
    def of(cls, rows: list[Checkpoint], limit: int, floor: str | None) -> CheckpointPage:
        """The page of the first ``limit`` of ``rows`` (the matches, read one past ``limit`` to know whether more
        follow) from a window whose oldest checkpoint is ``floor`` (None: the window reached the history's start).
        """
        items = tuple(rows[:limit])
        if len(rows) > limit:
            return cls(items=items, next=items[-1].id)
        return cls(items=items, next=floor)


@attrs.frozen(kw_only=True)
class ClaimRequest:
    """A request to claim a thread for ``holder`` (a RunId) for ``ttl``, recording ``tenant_id``."""

    holder: str = attrs.field(validator=_id("request.holder"))
    ttl: timedelta = attrs.field(validator=lambda _i, _a, value: v.check_positive_duration("request.ttl", value))
    tenant_id: str | None = attrs.field(default=None, validator=_opt_id("request.tenant_id"))


@attrs.frozen(kw_only=True)
class RunClaim:
    """A granted claim: ``token`` fences the holder's writes until another claim replaces it."""

    thread_id: str
    holder: str
    token: int
    expires_at: datetime
    tenant_id: str | None = None
    taken_over_from: str | None = None


class BusyHolder:
    """Who holds a thread that refused a claim: ``BusyHolder.Run(holder)``, ``UNNAMED`` or ``LAPSED``.

    A store names the holder only to a request of the same tenant and never returns
    ``LAPSED`` (the runtime's: a claim that lapsed while a run still thinks it holds it).
    """

    Run: ClassVar[type[_Run]]
    UNNAMED: ClassVar[BusyHolder]
    LAPSED: ClassVar[BusyHolder]


@attrs.frozen
class _Run(BusyHolder):
    holder: str

    def __str__(self) -> str:
        return f"held by run {self.holder!r}"


@attrs.frozen
class _Named(BusyHolder):
    name: str

    def __str__(self) -> str:
        return "held by another tenant's run" if self.name == "unnamed" else "held by a claim that lapsed"

    def __repr__(self) -> str:
        return f"BusyHolder.{self.name.upper()}"


_Run.__name__ = _Run.__qualname__ = "BusyHolder.Run"
BusyHolder.Run = _Run
BusyHolder.UNNAMED = _Named("unnamed")
BusyHolder.LAPSED = _Named("lapsed")


def _opt_duration(field: str):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is not None:
            v.check_positive_duration(field, value)

    return check


def _opt_int(field: str, low: int):
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is not None:
            v.check_int(field, value, low=low)

    return check


@attrs.frozen(kw_only=True)
class RetentionPolicy:
    """What prune and sweep keep. ``RetentionPolicy()`` keeps everything.

    Attributes:
        max_age: checkpoints and events committed this long ago or longer (store clock) are removed. A thread's
            commit stamps never decrease (a clock that stepped back stamps the thread's last stamp again), so
            what goes is always the oldest part of its history and of its log.
        max_checkpoints: keep at most this many newest checkpoints (>= 1).
        max_events: keep at most this many newest events (>= 0).
    The latest checkpoint and its pending writes are always kept.
    """

    max_age: timedelta | None = attrs.field(default=None, validator=_opt_duration("retention.max_age"))
    max_checkpoints: int | None = attrs.field(default=None, validator=_opt_int("retention.max_checkpoints", 1))
    max_events: int | None = attrs.field(default=None, validator=_opt_int("retention.max_events", 0))

    @property
    def keeps_everything(self) -> bool:
        """True when no limit is set."""
        return self.max_age is None and self.max_checkpoints is None and self.max_events is None


@attrs.frozen(kw_only=True)
class SweepPolicy:
    """One sweep's policy: retention for each thread, page size, and the age after which tombstones go."""

    retention: RetentionPolicy = attrs.field(
        factory=RetentionPolicy,
        validator=lambda _i, _a, value: _check_instance("policy.retention", value, RetentionPolicy),
    )
    batch_size: int = attrs.field(
        default=100, validator=lambda _i, _a, value: v.check_int("policy.batch_size", value, low=1, high=10_000)
    )
    tombstone_age: timedelta | None = attrs.field(default=None, validator=_opt_duration("policy.tombstone_age"))


class SweepGuard(Protocol):
    """Says which threads of a sweep page are protected, and which of their runs.

    ``protected(thread_ids)`` returns a mapping from protected thread id to the run ids whose newest
    checkpoints must be kept; a thread absent from it is not protected. Raising ends the sweep call with
    nothing changed.
    """

    def protected(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]: ...


@attrs.frozen(kw_only=True)
class SweepPage:
    """What one sweep call did: the threads it visited, pruned and reclaimed, and the next page's cursor."""

    visited: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    reclaimed: tuple[str, ...] = ()
    next: str | None = None


@attrs.frozen(kw_only=True)
class ThreadSummary:
    """A registry row: a root thread as ``threads`` and ``incomplete`` list it."""

    thread_id: str
    tenant_id: str | None
    status: ThreadStatus
    updated_at: datetime
    latest_checkpoint_id: str
    latest_run_id: str
    graph_id: str
    metadata: dict[str, str] = attrs.field(factory=dict)

    @property
    def cursor(self) -> ThreadCursor:
        """The cursor that pages after this row."""
        return ThreadCursor(updated_at=self.updated_at, thread_id=self.thread_id)


@attrs.frozen(kw_only=True)
class ThreadCursor:
    """A position in the registry: ``(updated_at, thread_id)``."""

    updated_at: datetime = attrs.field(validator=_aware("after.updated_at"))
    thread_id: str = attrs.field(validator=_id("after.thread_id"))


def _statuses(value: Any) -> frozenset[ThreadStatus] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValidationError("query.statuses", ("must be a collection of ThreadStatus or None",))
    out = frozenset(value)
    for item in out:
        if not isinstance(item, ThreadStatus):
            raise ValidationError("query.statuses", (f"{item!r} is not a ThreadStatus",))
    return out


@attrs.frozen(kw_only=True)
class ThreadQuery:
    """A registry query: one tenant's root threads, newest first, filtered and paged."""

    MAX_LIMIT: ClassVar[int] = 1000

    tenant_id: str | None = attrs.field(validator=_opt_id("query.tenant_id"))
    limit: int = attrs.field(
        default=50, validator=lambda _i, _a, value: v.check_int("query.limit", value, low=1, high=1000)
    )
    after: ThreadCursor | None = attrs.field(default=None, validator=_optional(ThreadCursor, "query.after"))
    statuses: frozenset[ThreadStatus] | None = attrs.field(default=None, converter=_statuses)
    updated_since: datetime | None = attrs.field(
        default=None,
        validator=lambda _i, _a, value: value is None or v.check_aware("query.updated_since", value),
    )
    graph_id: str | None = attrs.field(default=None, validator=_opt_id("query.graph_id"))

    def matches(self, summary: ThreadSummary) -> bool:
        """True when ``summary`` passes every filter of this query (tenant, statuses, updated_since, graph)."""
        if summary.tenant_id != self.tenant_id:
            return False
        if self.statuses is not None and summary.status not in self.statuses:
            return False
        if self.updated_since is not None and summary.updated_at < self.updated_since:
            return False
        if self.graph_id is not None and summary.graph_id != self.graph_id:
            return False
        return True


@attrs.frozen(kw_only=True)
class ThreadPage:
    """A page of registry rows and the cursor of the next page (None when no more match)."""

    items: tuple[ThreadSummary, ...] = ()
    next: ThreadCursor | None = None

    @classmethod
    def of(cls, rows: list[ThreadSummary], limit: int) -> ThreadPage:
        """The page of the first ``limit`` of ``rows`` (read one past ``limit`` to know whether more follow)."""
        items = tuple(rows[:limit])
        more = len(rows) > limit
        return cls(items=items, next=items[-1].cursor if more and items else None)


@attrs.frozen(kw_only=True)
class TenantCount:
    """One tenant of the registry and how many root threads it holds.

    Attributes:
        tenant_id: the tenant; None for the threads that have no tenant.
        threads: how many root threads (threads with a checkpoint and no origin, as ``threads`` lists them, of
            every status) have this tenant on their latest checkpoint; at least 1.
    """

    tenant_id: str | None
    threads: int


@attrs.frozen(kw_only=True)
class TenantPage:
    """A page of :class:`TenantCount` rows, tenant ids ascending (code point order) and the tenant-less last,
    and the cursor of the next page: the ``after`` to pass for it, None when no more follow."""

    items: tuple[TenantCount, ...] = ()
    next: str | None = None

    MAX_LIMIT: ClassVar[int] = 1000
    """The largest page a store returns."""

    @classmethod
    def of(cls, named: list[TenantCount], tenantless: int, limit: int) -> TenantPage:
        """The page of ``limit`` rows from ``named`` (tenants in ascending order, read one past ``limit`` when
        more follow) and then the tenant-less group of ``tenantless`` threads (left out when 0).

        The tenant-less group comes last, so a cursor is always a tenant id: the last named tenant of a page
        after which rows follow.
        """
        rows = list(named)
        if len(rows) <= limit and tenantless > 0:
            rows.append(TenantCount(tenant_id=None, threads=tenantless))
        items = tuple(rows[:limit])
        more = len(rows) > limit
        return cls(items=items, next=items[-1].tenant_id if more and items else None)
