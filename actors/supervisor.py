"""``Supervisor``: the registry of a runtime's thread actors and its retention sweep.

It spawns a :class:`~threadloom.actors.thread_actor.ThreadActor` per run and keeps its reference (never a
global registry lookup), forgets it when the run ends, restarts nothing blindly (a crashed run is recovered
through its claim, by whoever calls ``recover``), runs the retention sweep page by page (its guard protects the
runs of live actors and of open queue entries), and answers registry queries. It never asks a thread actor:
thread actors only ``tell`` it, so neither waits on the other.

The registry and the sweep are plain methods of :class:`Registry` and :class:`Supervisor` that a
deterministic scheduler can call directly.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import attrs
import pykka

from threadloom.actors._failures import error_kind, is_fatal
from threadloom.actors.logs import elapsed_ms
from threadloom.actors.logs import log as _log
from threadloom.actors.policies import SweepSchedule
from threadloom.actors.runs import RunEnv, RunHandle, RunSpec
from threadloom.actors.scheduler import Cancellable
from threadloom.actors.thread_actor import BEGIN, ThreadActor
from threadloom.actors.walker import Walks, WalkSetup
from threadloom.domain.errors import ProcessingError
from threadloom.domain.values import SweepPage, SweepPolicy
from threadloom.persistence.queue import RunQueue


@attrs.define
class LiveRun:
    """A run the registry knows: its thread, tenant, handle and actor reference."""

    run_id: str
    thread_id: str
    tenant_id: str | None
    handle: RunHandle
    ref: pykka.ActorRef[Any]


class Registry:
    """The runs of one runtime's live thread actors, by RunId (plain data; the supervisor owns it)."""

    def __init__(self) -> None:
        self._runs: dict[str, LiveRun] = {}

    def add(self, run: LiveRun) -> None:
        """Registers a run."""
        self._runs[run.run_id] = run

    def remove(self, run_id: str) -> LiveRun | None:
        """Forgets a run (its actor stops by itself); None if it was not registered."""
        return self._runs.pop(run_id, None)

    def get(self, run_id: str) -> LiveRun | None:
        """The registered run ``run_id``, or None."""
        return self._runs.get(run_id)

    def runs(self) -> list[LiveRun]:
        """Every registered run, in registration order."""
        return list(self._runs.values())

    def by_thread(self, thread_ids: tuple[str, ...] | None = None) -> dict[str, frozenset[str]]:
        """Thread id → RunIds of the runs still going on it (of ``thread_ids`` when given)."""
        wanted = None if thread_ids is None else set(thread_ids)
        out: dict[str, set[str]] = {}
        for run in self._runs.values():
            if run.handle.done():
                continue  # ended: its RunEnded message is on its way
            if wanted is None or run.thread_id in wanted:
                out.setdefault(run.thread_id, set()).add(run.run_id)
        return {thread_id: frozenset(runs) for thread_id, runs in out.items()}


class RuntimeGuard:
    """The sweep guard of a runtime: protects the runs of live actors and of open entries.

    Called by the store's ``sweep`` on the supervisor's thread (the store asks it outside its write lock).
    """

    def __init__(self, registry: Registry, queue: RunQueue | None) -> None:
        self._registry = registry
        self._queue = queue

    def protected(self, thread_ids: tuple[str, ...]) -> Mapping[str, frozenset[str]]:
        """Thread id → the RunIds whose newest checkpoints the sweep must keep."""
        out = dict(self._registry.by_thread(tuple(thread_ids)))
        if self._queue is not None:
            for thread_id, runs in self._queue.open_runs(thread_ids).items():
                out[thread_id] = out.get(thread_id, frozenset()) | runs
        return out


@attrs.frozen(eq=False)
class Spawn:
    """Ask: start a thread actor for ``spec``; the answer is its :class:`RunHandle`."""

    spec: RunSpec


@attrs.frozen(eq=False)
class RunEnded:
    """Tell (from a thread actor): the run ended; forget it."""

    run_id: str


@attrs.frozen(eq=False)
class Drain:
    """Ask: refuse new runs from now on; the answer is every live run."""


@attrs.frozen(eq=False)
class Abandon:
    """Tell: end run ``run_id`` at once, its node in flight left unheard (its actor stops, releasing the claim)."""

    run_id: str


@attrs.frozen(eq=False)
class LiveRuns:
    """Ask: thread id → RunIds of this runtime's live runs."""


@attrs.frozen(eq=False)
class SweepOnce:
    """Ask: sweep one page with ``policy`` after ``after``; the answer is the :class:`SweepPage`."""

    policy: SweepPolicy
    after: str | None


@attrs.frozen(eq=False)
class _SweepTick:
    """Tell (from the sweep timer, or from the supervisor itself between pages): sweep the next page."""

    generation: int
    after: str | None


class Supervisor(pykka.ThreadingActor):
    """The registry of a runtime's thread actors and its periodic sweep.

    Args:
        env: the runtime's environment (store, clock, scheduler, ids, policy).
        queue: the store's run queue, whose open entries' runs the sweep guard protects (None: none).
        sweep: the periodic sweep, or None for none.
        walks: the access walks to run (membership heartbeats and a walker per declared schema), or None.

    Attributes:
        sweep_error: the store failure that stopped the periodic sweep for good (a damaged or closed store),
            else None.
    """

    use_daemon_thread = True  # a host that never calls close() still exits; its claims then expire

    def __init__(
        self, env: RunEnv, queue: RunQueue | None, sweep: SweepSchedule | None, walks: WalkSetup | None = None
    ) -> None:
        super().__init__()
        self._env = env
        self._queue = queue
        self._schedule = sweep
        self.registry = Registry()
        self.guard = RuntimeGuard(self.registry, queue)
        self._closing = False
        self.sweep_error: BaseException | None = None
        self._timer: Cancellable | None = None
        self._generation = 0
        self._log = _log.bind(node_id=env.node_id)
        self._walk_setup = walks
        self.walks: Walks | None = None

    # -- lifecycle hooks --------------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Runs on the supervisor's own thread before its first message: schedules the first sweep."""
        self._env.track_thread(threading.current_thread())
        self._schedule_sweep()
        if self._walk_setup is not None:
            ref = self.actor_ref

            def tell(message: Any) -> None:
                try:
                    ref.tell(message)
                except pykka.ActorDeadError:
                    pass

            self.walks = Walks(self._env, self._walk_setup, tell)
            self.walks.start()

    def on_receive(self, message: Any) -> Any:
        """Runs on the supervisor's own thread, one message at a time."""
        if isinstance(message, Spawn):
            return self.spawn(message.spec)
        if isinstance(message, RunEnded):
            self.registry.remove(message.run_id)
            return None
        if isinstance(message, Drain):
            return self.drain()
        if isinstance(message, LiveRuns):
            return self.registry.by_thread()
        if isinstance(message, Abandon):
            self.abandon(message.run_id)
            return None
        if isinstance(message, SweepOnce):
            return self.sweep_page(message.policy, message.after)
        if isinstance(message, _SweepTick):
            self.sweep_tick(message.generation, message.after)
            return None
        if self.walks is not None:
            handled, answer = self.walks.receive(message)
            if handled:
                return answer
        return super().on_receive(message)

    def on_stop(self) -> None:
        """Runs on the supervisor's own thread just before it exits: stops the sweep timer and every thread actor
        still registered (each ends its run and releases its claim in its own ``on_stop``)."""
        self._closing = True
        self._cancel_timer()
        if self.walks is not None:
            self.walks.stop(self._env.claim_policy.ttl)
        for run in self.registry.runs():
            try:
                run.ref.stop(block=True, timeout=self._env.claim_policy.ttl.total_seconds())
            except pykka.ActorDeadError:
                pass
            self.registry.remove(run.run_id)

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """Runs on the supervisor's own thread after an unhandled error, just before it exits: as :meth:`on_stop`."""
        self.on_stop()

    # -- registry ---------------------------------------------------------------------------------------------

    def spawn(self, spec: RunSpec) -> RunHandle:
        """Starts a thread actor for ``spec``, registers it and tells it to begin; returns its handle.

        Raises:
            ProcessingError: the runtime is closing.
        """
        if self._closing:
            raise ProcessingError(spec.kind.value, "the runtime is closed; start the run on an open runtime")
        handle = RunHandle(spec, self._env.scheduler)
        supervisor = self.actor_ref

        def ended(run_id: str) -> None:
            try:
                supervisor.tell(RunEnded(run_id))
            except pykka.ActorDeadError:
                pass

        ref = self._env.scheduler.actor_class(ThreadActor).start(spec, self._env, handle, ended)
        self.registry.add(LiveRun(spec.run_id, spec.thread_id, spec.tenant_id, handle, ref))
        ref.tell(BEGIN)
        return handle

    def abandon(self, run_id: str) -> None:
        """Stops the actor of run ``run_id`` without waiting: its ``on_stop`` ends the run ``CancelledError`` and
        releases the claim; the node in flight, if any, finishes unheard. An unknown or ended run: nothing."""
        run = self.registry.get(run_id)
        if run is not None:
            try:
                run.ref.stop(block=False)
            except pykka.ActorDeadError:
                pass

    def drain(self) -> list[RunHandle]:
        """Refuses new runs from now on and stops the periodic sweep; returns the handles of the live runs."""
        self._closing = True
        self._cancel_timer()
        return [run.handle for run in self.registry.runs()]

    # -- the sweep --------------------------------------------------------------------------------------------

    def sweep_page(self, policy: SweepPolicy, after: str | None) -> SweepPage:
        """Sweeps one page of the store after ``after`` with this runtime's guard; logs ``sweep.page`` and a
        ``tombstone.reclaimed`` per reclaimed thread. Raises what the store raised."""
        clock = self._env.clock
        started = clock.now()
        page = self._env.store.sweep(policy, self.guard, after=after)
        self._log.info(
            "sweep.page",
            op="sweep",
            after=after,
            visited=len(page.visited),
            pruned=len(page.pruned),
            reclaimed=len(page.reclaimed),
            next=page.next,
            duration_ms=elapsed_ms(clock, started),
        )
        for thread_id in page.reclaimed:
            self._log.info("tombstone.reclaimed", op="sweep", thread_id=thread_id)
        return page

    def sweep_tick(self, generation: int, after: str | None) -> None:
        """One page of the periodic pass; the next page comes back as a message, so registry requests are
        answered between pages. After the last page the next pass is scheduled ``every`` later.

        A page that fails never stops the supervisor. A transient failure (the store unavailable, or failing in
        a way it does not name) logs ``sweep.failed`` and the next pass comes ``every`` later. A damaged or
        closed store (``StoreCorrupt``, ``StoreClosed``) logs ``sweep.stopped`` at error level and stops the
        periodic sweep for good (:attr:`sweep_error` holds the error): sweeping again would only fail again.
        ``GraphRuntime.sweep`` still sweeps on demand.
        """
        if self._closing or self._schedule is None or generation != self._generation:
            return
        try:
            page = self.sweep_page(self._schedule.policy, after)
        except Exception as error:  # a failed page must not stop the supervisor
            if is_fatal(error, self._env.store):
                self.sweep_error = error
                self._cancel_timer()
                self._log.error(
                    "sweep.stopped",
                    op="sweep",
                    after=after,
                    error=f"{type(error).__name__}: {error}",
                    error_kind=error_kind(error),
                )
                return
            self._log.warning("sweep.failed", op="sweep", error=f"{type(error).__name__}: {error}")
            self._schedule_sweep()
            return
        if page.next is not None:
            self.actor_ref.tell(_SweepTick(generation, page.next))
        else:
            self._schedule_sweep()

    def _schedule_sweep(self) -> None:
        if self._schedule is None or self._closing or self.sweep_error is not None:
            return
        self._generation += 1
        generation, ref = self._generation, self.actor_ref

        def due() -> None:
            try:
                ref.tell(_SweepTick(generation, None))
            except pykka.ActorDeadError:
                pass

        self._timer = self._env.scheduler.call_at(self._env.clock.now() + self._schedule.every, due)

    def _cancel_timer(self) -> None:
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
