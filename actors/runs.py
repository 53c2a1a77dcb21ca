"""What a run is asked to do and what its caller holds: ``RunKind``, ``RunSpec``, ``RunEnv`` and ``RunHandle``.

A :class:`~threadloom.actors.thread_actor.ThreadRun` resolves its handle's futures; callers of a
:class:`~threadloom.actors.runtime.GraphRuntime` only ever see the handle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import attrs

from threadloom.actors.aio import RuntimeLoop
from threadloom.actors.graph import Graph, NodeContext, RunOutcome
from threadloom.actors.metrics import RuntimeMetrics
from threadloom.actors.policies import ClaimPolicy
from threadloom.actors.scheduler import IdFactory, Scheduler
from threadloom.domain import validation as v
from threadloom.domain.clock import Clock
from threadloom.domain.values import CheckpointOrigin, RunClaim
from threadloom.persistence.base import Checkpointer


class RunKind(enum.Enum):
    """What a run does with the thread's latest checkpoint."""

    START = "start"
    """Admit the input on a new thread, or as a new turn of a settled one."""
    RESUME = "resume"
    """Admit the input into a SUSPENDED thread and continue at its next node."""
    RECOVER = "recover"
    """Continue an incomplete (RUNNING) thread at its next node, without new input."""
    ADMIT = "admit"
    """START or RESUME, whichever the latest checkpoint allows (what a run-queue attempt does)."""


@attrs.frozen(kw_only=True)
class RunSpec:
    """What a run is asked to do.

    Attributes:
        kind: start, resume, recover or admit.
        thread_id, tenant_id: the thread and the tenant the run is for.
        graph: the graph to run.
        input: the input a start or resume admits (JSON).
        run_id: the run's RunId (the claim's holder, every checkpoint's ``run_id``).
        origin: where a child thread was spawned (every checkpoint of the run carries it).
        before_admit: called on the actor's thread under the claim, after the thread was checked and before
            anything is committed; raising refuses the run (the claim is released). A run-queue attempt uses it
            to check that it still holds its lease.
        fence: ``(thread_id, token)`` of another claim that fences the run's first commit (``Commit.fence``):
            a child run carries its parent run's, so a parent that lost its thread cannot start a child.
    """

    kind: RunKind
    thread_id: str
    graph: Graph
    input: Any = None
    tenant_id: str | None = None
    run_id: str
    origin: CheckpointOrigin | None = None
    before_admit: Callable[[], None] | None = None
    fence: tuple[str, int] | None = None


@attrs.define
class RunEnv:
    """What a run needs of its runtime: the store, time, ids, policy and how to start a child run."""

    store: Checkpointer
    clock: Clock
    scheduler: Scheduler
    ids: IdFactory
    claim_policy: ClaimPolicy
    node_id: str
    start_child: Callable[[str, Graph, Any, NodeContext], RunHandle]
    track_thread: Callable[[threading.Thread], None] = lambda _thread: None
    metrics: RuntimeMetrics = attrs.field(factory=lambda: RuntimeMetrics(None, ""))
    """Where the run's events are counted (README "Metrics"); records nothing without a meter."""
    loop: RuntimeLoop | None = None
    """The event loop ``async def`` nodes run on (README "asyncio"); None: async nodes are not run."""


class RunHandle:
    """A run started by a :class:`~threadloom.actors.runtime.GraphRuntime`: wait for its outcome, or cancel it.

    Attributes:
        thread_id, run_id, tenant_id, graph_id: the run's.
    """

    def __init__(self, spec: RunSpec, scheduler: Scheduler | None = None) -> None:
        self._scheduler = scheduler  # waits go through it (a simulation's yields instead of blocking)
        self.thread_id = spec.thread_id
        self.run_id = spec.run_id
        self.tenant_id = spec.tenant_id
        self.graph_id = spec.graph.graph_id
        self.kind = spec.kind
        self._claimed: concurrent.futures.Future[RunClaim] = concurrent.futures.Future()
        self._done: concurrent.futures.Future[RunOutcome] = concurrent.futures.Future()
        self._cancel: Callable[[], None] = lambda: None

    @classmethod
    def ended(cls, spec: RunSpec, outcome: RunOutcome) -> RunHandle:
        """The handle of a run that had already ended well: ``wait`` returns ``outcome`` at once.

        Used by ``ctx.spawn`` for a child its step had already run to completion. The handle holds no claim
        (``token`` is None) and cancelling it does nothing.
        """
        handle = cls(spec)
        _set(handle._done, outcome)
        return handle

    def __repr__(self) -> str:
        state = "done" if self._done.done() else "running"
        return f"RunHandle(thread_id={self.thread_id!r}, run_id={self.run_id!r}, {state})"

    @property
    def token(self) -> int | None:
        """The fencing token of the run's claim once granted, else None."""
        if self._claimed.done() and self._claimed.exception() is None:
            return self._claimed.result().token
        return None

    def done(self) -> bool:
        """True once the run ended (completed, suspended, failed, lost its claim or was cancelled)."""
        return self._done.done()

    def wait(self, timeout: timedelta | None = None) -> RunOutcome:
        """Waits for the run to end and returns how it ended well.

        Args:
            timeout: how long to wait, a ``timedelta`` of zero or more (None: until it ends).

        Returns:
            The outcome: ``COMPLETED`` or ``SUSPENDED``, with the last checkpoint's state.

        Raises:
            RunFailed: a node raised; the run committed a FAILED checkpoint.
            ThreadBusy: a node's ``ctx.spawn`` found the child thread held by another live run; the run
                committed nothing for that step and the thread stays incomplete for a recovery.
            StaleClaim: the run lost its claim (another run took the thread over); it wrote nothing after. Also
                when the child run a node waits for lost its own thread: the run then ends as for ThreadBusy.
            CancelledError: the run was cancelled or its runtime closed; the thread stays incomplete (IDLE)
                for any runtime to recover.
            StoreUnavailable: the store stayed unreachable. A step's commit it refused is tried again with
                growing pauses (50 ms doubling to 2 s) for as long as the claim's ``ttl``; raised when it never
                applied, or when a node's own store call (``ctx.effect``, ``ctx.spawn``) met it. Retryable: the
                thread stays as its last commit left it (incomplete); ``recover`` it.
            StoreCorrupt: the store holds what the code cannot read (a damaged file or row, a schema newer
                than the code). Not retryable and not retried: raised as soon as the run meets it (a renewal
                meeting it ends the run at once, even while a node runs; that node's step is dropped). The
                thread stays as its last commit left it - no FAILED checkpoint, which the store could not take
                either - and can be recovered once the store is repaired.
            StoreClosed: the store was closed under the run (raised at the next commit or renewal, whichever
                comes first; the message names the run). The claim expires by itself; recover the thread with
                a runtime over an open store.
            ProcessingError: any other failure of the store (``OutcomeUnknown`` included), in the run's own calls
                or in a node's (``ctx.effect``, ``ctx.spawn``); the thread stays as its last commit left it
                (incomplete, for a recovery).
            TimeoutError: ``timeout`` passed first; the run goes on.
            ValidationError: ``timeout`` is not a ``timedelta`` (a number of seconds included) nor None, or is
                negative; nothing waited, the run goes on.
        """
        self._await(self._done, timeout)
        return self._done.result(0)

    def __await__(self) -> Generator[Any, None, RunOutcome]:
        """``outcome = await handle``: :meth:`wait` without blocking the event loop (README "asyncio").

        Returns and raises as :meth:`wait`. Cancelling the awaiting task stops the await only: the run goes on
        (call :meth:`cancel` to stop it).
        """
        return self._outcome().__await__()

    async def _outcome(self) -> RunOutcome:
        if not self._done.done():
            await asyncio.shield(asyncio.wrap_future(self._done))
        return self._done.result(0)

    def exception(self, timeout: timedelta | None = None) -> BaseException | None:
        """The error the run ended with, None if it ended well; waits like :meth:`wait` (``timeout`` as there:
        ``TimeoutError`` when it passes first, ``ValidationError`` when it is not a ``timedelta`` of zero or
        more nor None)."""
        self._await(self._done, timeout)
        return self._done.exception(0)

    def _await(self, future: concurrent.futures.Future[Any], timeout: timedelta | None) -> None:
        """Waits (through the runtime's scheduler) until ``future`` is done; TimeoutError after ``timeout``."""
        seconds = v.wait_seconds("timeout", timeout)
        if future.done():
            return
        if self._scheduler is not None:
            done = self._scheduler.wait_future(future, seconds)
        else:
            done = bool(concurrent.futures.wait([future], seconds)[0])
        if not done:
            raise TimeoutError(f"run {self.run_id!r} of thread {self.thread_id!r} is still running")

    def _wait_claimed(self) -> RunClaim:
        """Waits until the run holds its claim (or was refused) and returns it; raises the refusal."""
        self._await(self._claimed, None)
        return self._claimed.result(0)

    def cancel(self) -> None:
        """Asks the run to stop at its next step boundary (the node in flight finishes and is committed).

        The claim is released and the thread stays incomplete, so any runtime can recover it. Returns at once;
        :meth:`wait` then raises ``CancelledError``. Cancelling an ended run does nothing.
        """
        if not self._done.done():
            self._cancel()


def _set(future: concurrent.futures.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass
