"""The planted bugs live in PlantedMemoryStore only: each one, switched on, breaks exactly the rule it names, and the
reference store (and a planted store with no bug switched on) keeps every rule."""

from __future__ import annotations

from datetime import timedelta

import pytest

from threadloom.domain.access import AccessAttribute, AccessSchema, AccessSchemas
from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import StaleClaim, ValidationError
from threadloom.domain.values import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    RetentionPolicy,
    SweepPolicy,
)
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.simulations.planted import PLANTED_BUGS, PlantedMemoryStore
from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.harness import START, MemoryHarness

TTL = timedelta(seconds=30)
CLOCK = ManualClock(START)  # only ever moved forward: each test's claims start from where it stands


class PlantedNothingHarness(MemoryHarness):
    """The planted store with no bug switched on: it must be the reference store exactly."""

    name = "planted-nothing"

    def _open(self) -> InMemoryCheckpointer:
        self._store = PlantedMemoryStore(self.clock, ())
        return self._store


class TestPlantedNothingContract(CheckpointerContract):
    harness_class = PlantedNothingHarness


def _stores(bug: str) -> tuple[InMemoryCheckpointer, InMemoryCheckpointer]:
    """The reference store and the store with ``bug`` planted, on one clock."""
    return InMemoryCheckpointer(CLOCK), PlantedMemoryStore(CLOCK, [bug])


def _draft() -> EventDraft:
    return EventDraft(run_id="run-1", type="e", timestamp=START)


def _taken_over(store: InMemoryCheckpointer) -> tuple[int, int]:
    """Thread ``t`` claimed by run-1, then run-2 takes it over: (run-1's stale token, run-2's token)."""
    first = store.claim("t", ClaimRequest(holder="run-1", ttl=timedelta(seconds=1)))
    CLOCK.advance(timedelta(seconds=2))
    second = store.claim("t", ClaimRequest(holder="run-2", ttl=TTL))
    return first.token, second.token


def test_the_reference_store_keeps_no_trace_of_planted_bugs():
    store = InMemoryCheckpointer()
    assert not [name for name in vars(store) if "plant" in name or "bug" in name]
    assert not [name for name in dir(InMemoryCheckpointer) if "plant" in name or "bug" in name]


def test_an_unknown_bug_is_refused():
    with pytest.raises(ValidationError) as caught:
        PlantedMemoryStore(ManualClock(START), ["no_such_bug"])
    assert caught.value.field == "bugs"
    assert set(PlantedMemoryStore(None, PLANTED_BUGS).bugs) == set(PLANTED_BUGS)


def test_commit_unfenced_applies_a_stale_tokens_commit():
    reference, planted = _stores("commit_unfenced")
    for store in (reference, planted):
        _taken_over(store)
    with pytest.raises(StaleClaim):
        reference.commit("t", Commit(token=1, events=[_draft()]))
    assert [e.token for e in planted.commit("t", Commit(token=1, events=[_draft()]))] == [1]


def test_renew_unfenced_renews_with_any_token():
    reference, planted = _stores("renew_unfenced")
    for store in (reference, planted):
        _taken_over(store)
    with pytest.raises(StaleClaim):
        reference.renew("t", 1, TTL)
    assert planted.renew("t", 1, TTL).token == 2  # the successor's claim, extended by a stale holder
    with pytest.raises(StaleClaim):
        planted.renew("unknown", 1, TTL)


def test_effect_unfenced_records_a_refused_commits_effects():
    reference, planted = _stores("effect_unfenced")
    effect = EffectRecord(key="k", run_id="run-1", recorded_at=START, result=1)
    for store in (reference, planted):
        _taken_over(store)
        with pytest.raises(StaleClaim):
            store.commit("t", Commit(token=1, effects=[effect]))
    assert reference.effect("t", "k") is None
    assert planted.effect("t", "k") == effect


def test_seq_reuse_after_delete_numbers_the_next_incarnation_from_one():
    reference, planted = _stores("seq_reuse_after_delete")
    for store in (reference, planted):
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        store.commit("t", Commit(token=claim.token, events=[_draft(), _draft()]))
        store.delete_thread("t", claim.token)
        again = store.claim("t", ClaimRequest(holder="run-2", ttl=TTL))
        store.commit("t", Commit(token=again.token, events=[_draft()]))
    assert [e.seq for e in reference.events_after("t", 0, 10)] == [4]  # one number skipped past the deleted log
    assert [e.seq for e in planted.events_after("t", 0, 10)] == [1]


class _Protect:
    def protected(self, thread_ids):
        return {thread_id: ["run-1"] for thread_id in thread_ids}


def test_sweep_unguarded_prunes_what_the_guard_protects():
    reference, planted = _stores("sweep_unguarded")
    for store in (reference, planted):
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        parent = None
        for index, run in enumerate(("run-1", "run-2", "run-2")):
            cp = Checkpoint(
                id=f"c{index}", parent=parent, thread_id="t", run_id=run, status=CheckpointStatus.RUNNING,
                created_at=START,
            )
            store.commit("t", Commit(token=claim.token, checkpoint=cp))
            parent = cp.id
        store.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), _Protect())
    assert [cp.id for cp in reference.history("t", limit=10)] == ["c2", "c0"]  # run-1's newest kept
    assert [cp.id for cp in planted.history("t", limit=10)] == ["c2"]


STEPPED = AccessSchemas([AccessSchema("g", (AccessAttribute(name="step", source="metadata", key="step"),))])


def _step(store: InMemoryCheckpointer, token: int, number: int) -> None:
    """Commits checkpoint ``c<number>`` of thread ``t`` (graph kind ``g``, metadata ``step``) with one event."""
    checkpoint = Checkpoint(
        id=f"c{number}", parent=f"c{number - 1}" if number > 1 else None, thread_id="t", run_id="run-1",
        status=CheckpointStatus.RUNNING, created_at=START, graph_id="g", metadata={"step": str(number)},
    )
    store.commit("t", Commit(token=token, checkpoint=checkpoint, events=[_draft()]))


def _stamps(store: InMemoryCheckpointer) -> set[str]:
    _, checkpoints, _, events, _ = store._stamped_thread("t")
    return {stamp[2] for _, stamp in [*checkpoints, *events]}


def test_stamp_unfenced_stamps_under_a_deposed_walk_lease():
    reference = InMemoryCheckpointer(CLOCK, access=STEPPED)
    planted = PlantedMemoryStore(CLOCK, ["stamp_unfenced"], access=STEPPED)
    for store in (reference, planted):
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        _step(store, claim.token, 1)
        stale = store.claim("w", ClaimRequest(holder="walker-1", ttl=timedelta(seconds=1)))
        CLOCK.advance(timedelta(seconds=2))
        store.claim("w", ClaimRequest(holder="walker-2", ttl=TTL))
        if store is reference:
            with pytest.raises(StaleClaim):
                store.stamp_thread("t", fence=("w", stale.token))
        else:
            store.stamp_thread("t", fence=("w", stale.token))  # the deposed walker's stamp applies


def test_stamp_unlocked_overwrites_a_commit_that_landed_between_derivation_and_write():
    reference = InMemoryCheckpointer(CLOCK, access=STEPPED)
    planted = PlantedMemoryStore(CLOCK, ["stamp_unlocked"], access=STEPPED)
    for store in (reference, planted):
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
        _step(store, claim.token, 1)
        planted.between = lambda store=store, token=claim.token: _step(store, token, 2)  # noqa: B023
        if store is reference:
            _step(store, claim.token, 2)  # the reference derives and writes in one step: nothing comes between
        store.stamp_thread("t")
    assert _stamps(reference) == {'{"step":"2"}'}  # every row carries the latest checkpoint's attributes
    assert _stamps(planted) == {'{"step":"1"}'}  # the commit that came between was overwritten with older ones
