"""Planted bugs: an in-memory store with deliberate bugs the simulation must catch (test-only).

The simulation's own tests run seeds over :class:`PlantedMemoryStore` to prove its checkers work: every bug in
:data:`PLANTED_BUGS` must make some seed fail (``threadloom simulate --plant BUG``). The reference store,
:class:`~threadloom.persistence.memory.store.InMemoryCheckpointer`, holds none of this: the bugs live in this
subclass only, each in one of the reference store's overridable decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from threadloom.domain.access import AccessSchemas
from threadloom.domain.clock import Clock
from threadloom.domain.errors import StaleClaim, ValidationError
from threadloom.persistence.encoded import EncodedCommit
from threadloom.persistence.memory.store import InMemoryCheckpointer

if TYPE_CHECKING:
    from threadloom.persistence.memory.store import _Thread

PLANTED_BUGS: tuple[str, ...] = (
    "commit_unfenced",
    "renew_unfenced",
    "effect_unfenced",
    "sweep_unguarded",
    "seq_reuse_after_delete",
    "stamp_unfenced",
    "stamp_unlocked",
)
"""The bugs a simulation can plant: a commit that does not check its token; a renew that does not check its
token; effect records written before (outside) the fenced commit; a sweep that ignores its guard and the run
queue; event numbers that start again from 1 after a delete; a ``stamp_thread`` that ignores its fence (a deposed
walker's stamp applies); a ``stamp_thread`` that derives the stamp in one step and writes it in a later one,
outside the thread's lock (a commit landing in between has its newer stamp overwritten)."""

WALK_BUGS = frozenset({"stamp_unfenced", "stamp_unlocked"})
"""The planted bugs only an access walk (or a stamp-checked read) reaches: a seed runs walks only when none of
the other bugs is planted, so a kept seed of those replays the workload it was found with."""


class PlantedMemoryStore(InMemoryCheckpointer):
    """The in-memory store with the planted ``bugs`` switched on (test-only; never for real data).

    Args:
        clock: the store's clock, as for :class:`InMemoryCheckpointer`.
        bugs: the bugs to plant, each a name in :data:`PLANTED_BUGS` (none: it behaves as the reference).

    Raises:
        ValidationError: ``bugs`` names an unknown bug.
    """

    def __init__(
        self,
        clock: Clock | None,
        bugs: Iterable[str],
        *,
        access: AccessSchemas | None = None,
        shared: InMemoryCheckpointer | None = None,
    ) -> None:
        super().__init__(clock, access=access, shared=shared)
        self.bugs = frozenset(bugs)
        self.between: Callable[[], None] = lambda: None
        """Runs between the derivation and the write of ``stamp_unlocked`` (the simulation yields there)."""
        unknown = sorted(self.bugs - set(PLANTED_BUGS))
        if unknown:
            raise ValidationError("bugs", (f"unknown planted bug {unknown[0]!r}; known: {', '.join(PLANTED_BUGS)}",))

    def __repr__(self) -> str:
        return f"PlantedMemoryStore(clock={self._clock!r}, bugs={sorted(self.bugs)!r})"

    def _renewing(self, thread_id: str, token: int) -> _Thread:
        row = self._rows.get(thread_id)
        if "renew_unfenced" in self.bugs and row is not None:
            if row.claim is None:
                raise StaleClaim(thread_id, token, None)
            return row  # the bug: any token renews the thread's claim
        return super()._renewing(thread_id, token)

    def _committing(self, thread_id: str, commit: EncodedCommit) -> tuple[_Thread | None, int | None]:
        if "effect_unfenced" in self.bugs and thread_id in self._rows:
            for effect in commit.effects:  # the bug: effects recorded before (outside) the fence
                self._rows[thread_id].effects.setdefault(effect.key, effect.text)
        if "commit_unfenced" in self.bugs:
            return self._row(thread_id), commit.token  # the bug: no token check
        return super()._committing(thread_id, commit)

    def _next_incarnation(self, row: _Thread) -> int | None:
        start = super()._next_incarnation(row)
        if "seq_reuse_after_delete" in self.bugs and start is not None:
            return 1  # the bug: the next incarnation numbers from 1 again
        return start

    def _stamp_thread(self, thread_id: str, fence: tuple[str, int] | None) -> int:
        if "stamp_unfenced" in self.bugs:
            fence = None  # the bug: a deposed walker's stamp applies
        if "stamp_unlocked" not in self.bugs:
            return super()._stamp_thread(thread_id, fence)
        with self._lock:
            self._check_fence(fence)
            row = self._rows.get(thread_id)
            stamp = self._latest_stamp(row, thread_id) if row is not None else None
        if stamp is None:
            return 0
        self.between()  # the bug: the write happens later, outside the lock the derivation held
        with self._lock:
            row = self._rows.get(thread_id)
            return 0 if row is None else self._restamp(row, stamp)

    def _kept_runs(self, thread_id: str, protected: Mapping[str, frozenset[str]]) -> frozenset[str]:
        if "sweep_unguarded" in self.bugs:
            return frozenset()  # the bug: the guard's answer (and the open entries' runs) are ignored
        return super()._kept_runs(thread_id, protected)


__all__ = ["PLANTED_BUGS", "WALK_BUGS", "PlantedMemoryStore"]
