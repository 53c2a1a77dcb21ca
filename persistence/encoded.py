"""The encode-once step of the write path: a commit, validated and encoded into the text every store writes.

:meth:`Checkpointer.commit <threadloom.persistence.base.Checkpointer.commit>` calls :func:`encode_commit` once;
the store then writes the texts as they are. Nothing downstream validates, encodes or parses the commit again:

- each JSON part (a checkpoint's state, a pending write's payload, an event's payload, an effect's result) was
  validated and encoded by its constructor (``sealed_json``); only a value whose fields were replaced since is
  encoded again;
- the envelope of each stored row (ids, times, the commit's fencing token) is small and encoded here, with the
  JSON part placed in it as the text it already is;
- an event's number is known only inside the store's transaction: :meth:`EncodedEvent.text` puts it in front.

Stored texts keep the shape the codec decodes (:mod:`threadloom.persistence.codec`), so older rows and rows of
other versions read alike.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from threadloom.domain import validation as v
from threadloom.domain.access import WALK_GRAPH_ID, AccessSchemas, StampColumns
from threadloom.domain.clock import to_micros
from threadloom.domain.errors import ValidationError
from threadloom.domain.validation import dumps_compact
from threadloom.domain.values import (
    _COMMIT_GETTER,
    Checkpoint,
    CheckpointStatus,
    Commit,
    EffectRecord,
    EventDraft,
    EventRecord,
    PendingWrite,
    intact,
)

_quote = json.encoder.encode_basestring  # the C string encoder (ensure_ascii=False): quotes and escapes a str


_STATUS_TEXT = {status: status.value for status in CheckpointStatus}
_SETTLED = frozenset(status.value for status in CheckpointStatus if status.settled)


def _q(text: str | None) -> str:
    """JSON text of a validated id or None (ids hold no surrogates: the constructors refused them)."""
    return "null" if text is None else _quote(text)


@attrs.frozen(slots=True)
class EncodedCheckpoint:
    """A commit's checkpoint as a store writes it: the columns it indexes, and the row's text."""

    id: str
    parent: str | None
    run_id: str
    status: str
    """The status's stored value (``"running"`` …)."""
    settled: bool
    tenant_id: str | None
    graph_id: str
    origin_parent: str | None
    """The parent thread of a child's origin (the ``children`` index), or None."""
    text: str
    """The whole checkpoint as JSON, ``fencing_token`` set to the commit's token."""
    metadata: str = "{}"
    """The checkpoint's ``metadata`` as a JSON object (``{}`` when empty): the column ``search_history`` reads."""


@attrs.frozen(slots=True)
class EncodedWrite:
    """A pending write as a store writes it."""

    checkpoint_id: str
    task_id: str
    text: str


@attrs.frozen(slots=True)
class EncodedEvent:
    """An event draft numbered by the store inside its transaction."""

    draft: EventDraft
    thread_id: str
    token: int
    _tail: str
    """The event's JSON object without its ``seq``, from the first key on (``"thread_id":…}``)."""

    def text(self, seq: int) -> str:
        """The stored text of the event numbered ``seq``."""
        return f'{{"seq":{seq},{self._tail}'

    def record(self, seq: int) -> EventRecord:
        """The record a later read of the event numbered ``seq`` returns (nothing validated again)."""
        return EventRecord.of(self.draft, thread_id=self.thread_id, seq=seq, token=self.token)


@attrs.frozen(slots=True)
class EncodedEffect:
    """An effect record as a store writes it (first-wins by ``key``)."""

    key: str
    text: str


@attrs.frozen(slots=True)
class EncodedCommit:
    """One commit, validated and encoded: what a store's ``_commit`` receives (see the module docstring).

    Attributes:
        thread_id: the thread committed to.
        token, fence, retract_turn, metadata: the commit's own (``metadata`` a fresh dict or None).
        checkpoint, pending_writes, events, effects: the encoded parts, in commit order.
        source: the ``Commit`` as the caller built it.
    """

    thread_id: str
    token: int
    fence: tuple[str, int] | None
    retract_turn: bool
    metadata: dict[str, str] | None
    checkpoint: EncodedCheckpoint | None
    pending_writes: tuple[EncodedWrite, ...]
    events: tuple[EncodedEvent, ...]
    effects: tuple[EncodedEffect, ...]
    source: Commit
    pending_targets: tuple[tuple[str, str], ...]
    """``(task_id, checkpoint_id)`` of each pending write, in order (what commit rule 3 checks)."""
    stamp: StampColumns | None = None
    """The access stamp ``(access_schema, access_tenant, access_attrs)`` derived once from the commit's checkpoint
    by the store's schema of its graph kind; None for a commit without a checkpoint (the store stamps its rows with
    the thread's latest checkpoint's stamp) or to a walk thread (never stamped)."""


def _check_size(field: str, part: str, record: str, limit: int | None, record_field: str) -> None:
    """Refuses a stored record's text longer than ``limit`` characters (one length compare: no extra pass).

    The error names the JSON part (``field``) when it is most of the record, else the record (``record_field``:
    its ids and metadata made it large).
    """
    if limit is not None and len(record) > limit:
        name = field if 2 * len(part) >= len(record) else record_field
        part_name = field.rsplit(".", 1)[-1]
        raise ValidationError(
            name,
            (
                f"is {len(record):,} characters of JSON as stored ({len(part):,} of them the {part_name}), "
                f"over the store's limit of {limit:,} per record (max_json_size); nothing was written",
            ),
        )


def _instance(field: str, value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise ValidationError(field, (f"must be a {kind.__name__}, got {type(value).__name__}",))
    return value


def encode_checkpoint(cp: Checkpoint, token: int | None, limit: int | None = None) -> EncodedCheckpoint:
    """``cp`` encoded for storage with ``fencing_token`` = ``token`` (the store stamps the commit's token).

    Raises:
        ValidationError: the stored text would be longer than ``limit`` characters (None: no limit).
    """
    state = cp.sealed_json()
    origin = cp.origin
    origin_text = (
        "null"
        if origin is None
        else f'{{"parent_thread":{_q(origin.parent_thread)},"parent_checkpoint":{_q(origin.parent_checkpoint)},'
        f'"task_id":{_q(origin.task_id)}}}'
    )
    metadata = dumps_compact(cp.metadata) if cp.metadata else "{}"
    status = _STATUS_TEXT[cp.status]
    text = (
        f'{{"id":{_q(cp.id)},"parent":{_q(cp.parent)},"thread_id":{_q(cp.thread_id)},"run_id":{_q(cp.run_id)},'
        f'"status":"{status}","created_at":{to_micros(cp.created_at)},"graph_id":{_q(cp.graph_id)},'
        f'"tenant_id":{_q(cp.tenant_id)},"fencing_token":{"null" if token is None else int(token)},'
        f'"origin":{origin_text},"metadata":{metadata},"state":{state}}}'
    )
    _check_size("commit.checkpoint.state", state, text, limit, "commit.checkpoint")
    return EncodedCheckpoint(
        id=cp.id,
        parent=cp.parent,
        run_id=cp.run_id,
        status=status,
        settled=status in _SETTLED,
        tenant_id=cp.tenant_id,
        graph_id=cp.graph_id,
        origin_parent=None if origin is None else origin.parent_thread,
        text=text,
        metadata=metadata,
    )


def encode_pending_write(pw: PendingWrite, limit: int | None = None, index: int = 0) -> EncodedWrite:
    """A pending write encoded for storage (``limit`` and ``index``: as :func:`encode_commit` checks sizes)."""
    payload = pw.sealed_json()
    text = (
        f'{{"checkpoint_id":{_q(pw.checkpoint_id)},"task_id":{_q(pw.task_id)},"node_id":{_q(pw.node_id)},'
        f'"payload":{payload}}}'
    )
    _check_size(f"commit.pending_writes[{index}].payload", payload, text, limit, f"commit.pending_writes[{index}]")
    return EncodedWrite(checkpoint_id=pw.checkpoint_id, task_id=pw.task_id, text=text)


def encode_event(
    draft: EventDraft, thread_id: str, token: int, limit: int | None = None, index: int = 0
) -> EncodedEvent:
    """An event draft encoded for storage, to be numbered by the store (:meth:`EncodedEvent.text`)."""
    payload = draft.sealed_json()
    tail = (
        f'"thread_id":{_q(thread_id)},"token":{int(token)},"run_id":{_q(draft.run_id)},"type":{_q(draft.type)},'
        f'"timestamp":{to_micros(draft.timestamp)},"checkpoint_id":{_q(draft.checkpoint_id)},'
        f'"task_id":{_q(draft.task_id)},"node_id":{_q(draft.node_id)},"payload":{payload}}}'
    )
    # The number in front (at most 28 characters) is left out of the count.
    _check_size(f"commit.events[{index}].payload", payload, tail, limit, f"commit.events[{index}]")
    return EncodedEvent(draft, thread_id, token, tail)


def encode_effect(effect: EffectRecord, limit: int | None = None, index: int = 0) -> EncodedEffect:
    """An effect record encoded for storage (``limit`` and ``index``: as :func:`encode_commit` checks sizes)."""
    result = effect.sealed_json()
    text = (
        f'{{"key":{_q(effect.key)},"run_id":{_q(effect.run_id)},"recorded_at":{to_micros(effect.recorded_at)},'
        f'"checkpoint_id":{_q(effect.checkpoint_id)},"task_id":{_q(effect.task_id)},"result":{result}}}'
    )
    _check_size(f"commit.effects[{index}].result", result, text, limit, f"commit.effects[{index}]")
    return EncodedEffect(key=effect.key, text=text)


def encode_commit(
    thread_id: str, commit: Any, max_json_size: int | None = None, access: AccessSchemas | None = None
) -> EncodedCommit:
    """Validates ``commit`` for ``thread_id`` and encodes it, once (see the module docstring).

    Checks what no constructor can: the checkpoint names ``thread_id`` and carries no other token, is not its
    own parent; the fence names another thread; no two effect records share a key; no stored record (the
    checkpoint with its state, a pending write, an event, an effect record) is longer than ``max_json_size``
    characters of JSON (None: no limit). A part whose fields were replaced after it was built (bypassing its
    validators) is validated again. With ``access``, the checkpoint's access stamp is derived here, once.

    Returns:
        The encoded commit a store's ``_commit`` writes as is.

    Raises:
        ValidationError: naming the field; nothing was read or written.
    """
    _instance("commit", commit, Commit)
    if not intact(commit._seal, _COMMIT_GETTER(commit)):
        attrs.validate(commit)  # replaced behind the constructor's back
    v.check_int("commit.token", commit.token, low=1)
    token = commit.token
    cp = commit.checkpoint
    encoded_cp = None
    if cp is not None:
        _instance("commit.checkpoint", cp, Checkpoint)
        encoded_cp = encode_checkpoint(cp, token, max_json_size)  # validates a replaced field first
        if cp.thread_id != thread_id:
            raise ValidationError(
                "commit.checkpoint.thread_id", (f"names thread {cp.thread_id!r}, but the commit is to {thread_id!r}",)
            )
        if cp.fencing_token is not None and cp.fencing_token != token:
            raise ValidationError(
                "commit.checkpoint.fencing_token",
                (f"is {cp.fencing_token}, but the commit's token is {token} (leave it None)",),
            )
        if cp.parent == cp.id:
            raise ValidationError("commit.checkpoint.parent", ("must not be the checkpoint itself",))
    if commit.fence is not None and commit.fence[0] == thread_id:
        raise ValidationError("commit.fence", ("must name another thread than the one committed to",))
    writes = tuple([encode_pending_write(_instance("commit.pending_writes", pw, PendingWrite), max_json_size, i)
                    for i, pw in enumerate(commit.pending_writes)])
    events = tuple([encode_event(_instance("commit.events", draft, EventDraft), thread_id, token, max_json_size, i)
                    for i, draft in enumerate(commit.events)])
    effects = tuple([encode_effect(_instance("commit.effects", effect, EffectRecord), max_json_size, i)
                     for i, effect in enumerate(commit.effects)])
    if len({effect.key for effect in effects}) != len(effects):
        raise ValidationError("commit.effects", ("two effect records share a key",))
    return EncodedCommit(
        thread_id=thread_id,
        token=token,
        fence=commit.fence,
        retract_turn=commit.retract_turn,
        metadata=None if commit.metadata is None else dict(commit.metadata),
        checkpoint=encoded_cp,
        pending_writes=writes,
        events=events,
        effects=effects,
        source=commit,
        pending_targets=tuple((w.task_id, w.checkpoint_id) for w in writes),
        stamp=(
            None
            if access is None or cp is None or cp.graph_id == WALK_GRAPH_ID
            else access.for_graph(cp.graph_id).columns(cp)
        ),
    )
