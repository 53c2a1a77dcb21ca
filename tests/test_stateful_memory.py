"""The stateful comparison machine: memory against memory, and proof that it catches broken stores.

The SQLite and PostgreSQL stores reuse the machine (``make_state_machine``); here it runs against a second
in-memory store, which must agree with the reference step by step, and against deliberately broken variants of
it, which it must catch. The broken variants reach into the reference store's private rows: they exist only to
show that a divergence of that kind is found.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing.harness import MemoryHarness
from threadloom.testing.stateful import make_state_machine

TestMemoryMatchesReference = make_state_machine(MemoryHarness).TestCase


class _NoSkippedNumber(InMemoryCheckpointer):
    """Numbers a new incarnation right after the deleted log instead of skipping one number."""

    def _delete_thread(self, thread_id, token, fence):
        with self._lock:
            row = self._rows.get(thread_id)
            numbered = (
                row is not None and row.claim is not None and row.claim.token == token and row.next_seq > row.first_seq
            )
        super()._delete_thread(thread_id, token, fence)
        if numbered:
            with self._lock:
                row = self._rows[thread_id]
                row.first_seq = row.next_seq = row.floor = row.first_seq - 1


class _NoTakeoverName(InMemoryCheckpointer):
    """Never names the holder a claim took over from."""

    def _claim(self, thread_id, request):
        return attrs.evolve(super()._claim(thread_id, request), taken_over_from=None)


class _EffectsLastWins(InMemoryCheckpointer):
    """Overwrites effect records instead of keeping the first."""

    def _commit(self, thread_id, commit):
        records = super()._commit(thread_id, commit)
        with self._lock:
            row = self._rows[thread_id]
            for effect in commit.effects:
                row.effects[effect.key] = effect.text
        return records


class _PendingWritesKept(InMemoryCheckpointer):
    """Keeps the old latest's pending writes under a new checkpoint."""

    def _commit(self, thread_id, commit):
        with self._lock:
            row = self._rows.get(thread_id)
            old = list(row.pending) if row is not None else []
        records = super()._commit(thread_id, commit)
        if commit.checkpoint is not None and old:
            with self._lock:
                row = self._rows[thread_id]
                row.pending = old + row.pending
        return records


@pytest.mark.parametrize(
    "broken",
    [_NoSkippedNumber, _NoTakeoverName, _EffectsLastWins, _PendingWritesKept],
    ids=lambda kind: kind.__name__.strip("_"),
)
def test_the_machine_catches_a_broken_store(broken: type[InMemoryCheckpointer]) -> None:
    machine = make_state_machine(lambda clock: broken(clock))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=200,
                stateful_step_count=30,
                deadline=None,
                derandomize=True,
                phases=[Phase.generate],
                database=None,
                print_blob=False,
            ),
        )
