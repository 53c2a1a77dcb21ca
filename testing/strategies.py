"""Hypothesis strategies for threadloom values, shipped with the test kit.

Every strategy draws only *valid* values: ids that :func:`~threadloom.domain.validation.check_id` accepts, JSON
values that :func:`~threadloom.domain.validation.check_json` accepts, aware datetimes. Tests of invalid input
build their bad values by hand.

Typical use::

    from hypothesis import given
    from threadloom.testing import strategies as tls

    @given(tls.checkpoints(thread_id="t1"))
    def test_round_trip(cp): ...
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
from hypothesis import strategies as st

from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
)

__all__ = [
    "aware_datetimes",
    "checkpoints",
    "commits",
    "effect_records",
    "event_drafts",
    "ids",
    "json_values",
    "metadata",
    "origins",
    "pending_writes",
    "retention_policies",
    "statuses",
    "TEXT_CHARACTERS",
]

TEXT_CHARACTERS = st.characters(exclude_categories=["Cs"])
"""Any code point but a surrogate: what a JSON string may hold (NUL included)."""

ID_CHARACTERS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
"""What an id may hold: no surrogate, no NUL."""

TIMEZONES = (
    UTC,
    timezone(timedelta(hours=2)),
    timezone(timedelta(hours=-5, minutes=-30)),
    timezone(timedelta(hours=14)),
)


def ids(*, max_size: int = 255) -> st.SearchStrategy[str]:
    """Valid ids: 1..``max_size`` characters, no NUL, no surrogate; mostly short, sometimes near the limit."""
    short = st.text(ID_CHARACTERS, min_size=1, max_size=min(12, max_size))
    if max_size <= 12:
        return short
    long = st.text(ID_CHARACTERS, min_size=max(1, max_size - 30), max_size=max_size)
    return st.one_of(short, short, short, long)


def aware_datetimes(
    *, min_year: int = 1900, max_year: int = 2200, timezones: tuple[timezone, ...] = TIMEZONES
) -> st.SearchStrategy[datetime]:
    """Timezone-aware datetimes (microsecond precision) in a few fixed offsets, UTC included."""
    return st.datetimes(
        min_value=datetime(min_year, 1, 2),
        max_value=datetime(max_year, 12, 30),
        timezones=st.sampled_from(timezones),
    )


def json_scalars() -> st.SearchStrategy[Any]:
    """JSON scalars: None, bools, 64-bit ints, finite floats and strings (any non-surrogate characters)."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(TEXT_CHARACTERS, max_size=16),
    )


def json_values(*, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """JSON values as a store keeps them: scalars, lists and dicts with str keys (never tuples, sets, bytes)."""
    return st.recursive(
        json_scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(TEXT_CHARACTERS, max_size=8), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def json_objects(*, max_leaves: int = 12) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects (a checkpoint's usual state)."""
    return st.dictionaries(st.text(TEXT_CHARACTERS, max_size=8), json_values(max_leaves=max_leaves), max_size=4)


def metadata() -> st.SearchStrategy[dict[str, str]]:
    """A metadata mapping: str keys and values without NUL or surrogates."""
    text = st.text(ID_CHARACTERS, max_size=12)
    return st.dictionaries(text, text, max_size=4)


def statuses() -> st.SearchStrategy[CheckpointStatus]:
    """Any checkpoint status."""
    return st.sampled_from(list(CheckpointStatus))


def origins() -> st.SearchStrategy[CheckpointOrigin]:
    """Where a child thread was spawned."""
    return st.builds(
        CheckpointOrigin,
        parent_thread=ids(max_size=40),
        parent_checkpoint=st.none() | ids(max_size=40),
        task_id=st.none() | ids(max_size=40),
    )


def checkpoints(
    *,
    thread_id: str | st.SearchStrategy[str] | None = None,
    id: str | st.SearchStrategy[str] | None = None,
    parent: str | None | st.SearchStrategy[str | None] = None,
    with_origin: bool | None = None,
) -> st.SearchStrategy[Checkpoint]:
    """Valid checkpoints. Fixed arguments are used as given (``parent=None`` means a root checkpoint).

    Args:
        thread_id, id: a value or a strategy; drawn as ids when None.
        parent: the parent id (a value, None, or a strategy).
        with_origin: True always sets an origin, False never, None sometimes.
    """

    def fixed(value: Any, default: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        if value is None:
            return default
        return value if isinstance(value, st.SearchStrategy) else st.just(value)

    origin = {True: origins(), False: st.none(), None: st.none() | origins()}[with_origin]
    return st.builds(
        Checkpoint,
        id=fixed(id, ids(max_size=64)),
        parent=parent if isinstance(parent, st.SearchStrategy) else st.just(parent),
        thread_id=fixed(thread_id, ids(max_size=64)),
        run_id=ids(max_size=40),
        status=statuses(),
        created_at=aware_datetimes(),
        state=json_objects(),
        graph_id=ids(max_size=40),
        tenant_id=st.none() | ids(max_size=40),
        fencing_token=st.none(),
        origin=origin,
        metadata=metadata(),
    )


def pending_writes(checkpoint_id: str | st.SearchStrategy[str] | None = None) -> st.SearchStrategy[PendingWrite]:
    """Pending writes, against ``checkpoint_id`` when given."""
    cp = (
        ids(max_size=64)
        if checkpoint_id is None
        else (checkpoint_id if isinstance(checkpoint_id, st.SearchStrategy) else st.just(checkpoint_id))
    )
    return st.builds(
        PendingWrite, checkpoint_id=cp, task_id=ids(max_size=40), node_id=ids(max_size=40), payload=json_values()
    )


def event_drafts(run_id: str | None = None) -> st.SearchStrategy[EventDraft]:
    """Event drafts with producer timestamps anywhere in 1900..2200 (a store must not judge by them)."""
    return st.builds(
        EventDraft,
        run_id=ids(max_size=40) if run_id is None else st.just(run_id),
        type=ids(max_size=40),
        timestamp=aware_datetimes(),
        payload=json_values(),
        checkpoint_id=st.none() | ids(max_size=40),
        task_id=st.none() | ids(max_size=40),
        node_id=st.none() | ids(max_size=40),
    )


def effect_records(key: str | st.SearchStrategy[str] | None = None) -> st.SearchStrategy[EffectRecord]:
    """Effect records, under ``key`` when given."""
    k = ids(max_size=64) if key is None else (key if isinstance(key, st.SearchStrategy) else st.just(key))
    return st.builds(
        EffectRecord,
        key=k,
        run_id=ids(max_size=40),
        recorded_at=aware_datetimes(),
        result=json_values(),
        checkpoint_id=st.none() | ids(max_size=40),
        task_id=st.none() | ids(max_size=40),
    )


def retention_policies(*, tick: timedelta = timedelta(seconds=1)) -> st.SearchStrategy[RetentionPolicy]:
    """Retention policies whose ages are whole multiples of ``tick`` (1..5)."""
    return st.builds(
        RetentionPolicy,
        max_age=st.none() | st.integers(1, 5).map(lambda n: n * tick),
        max_checkpoints=st.none() | st.integers(1, 4),
        max_events=st.none() | st.integers(0, 6),
    )


@st.composite
def commits(
    draw: st.DrawFn,
    *,
    thread_id: str,
    token: int,
    parent: str | None,
    checkpoint_id: str | st.SearchStrategy[str] | None = None,
    max_events: int = 4,
) -> Commit:
    """A commit that a store applies when ``token`` holds ``thread_id`` and ``parent`` is its latest.

    It carries a checkpoint with that parent (its id drawn, or ``checkpoint_id``), pending writes naming it,
    up to ``max_events`` event drafts and effect records with distinct keys; never ``retract_turn`` or a fence.
    """
    cp = draw(checkpoints(thread_id=thread_id, id=checkpoint_id, parent=parent))
    if cp.id == parent:  # a checkpoint cannot be its own parent
        cp = attrs.evolve(cp, id="x" if parent != "x" else "y")
    writes = draw(st.lists(pending_writes(cp.id), max_size=3))
    events = draw(st.lists(event_drafts(cp.run_id), max_size=max_events))
    effects = draw(st.lists(effect_records(), max_size=3, unique_by=lambda e: e.key))
    meta = draw(st.none() | metadata())
    return Commit(token=token, checkpoint=cp, pending_writes=writes, events=events, effects=effects, metadata=meta)
