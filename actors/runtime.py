"""``GraphRuntime``: the facade an agent host embeds.

It runs graphs on threads for tenants — ``start``, ``recover``, ``resume`` → :class:`RunHandle` — through a
:class:`~threadloom.actors.supervisor.Supervisor` and one :class:`~threadloom.actors.thread_actor.ThreadActor`
per live run; it streams a thread's events (``subscribe`` → :class:`Subscription`), deletes threads with their
descendants (``delete_thread``), lists them with tenant checks (``children``, ``threads``, ``incomplete``), works
the store's run queue (``serve``) and shuts down cleanly (``close``: no thread of its own left running, no claim
left held).

Several runtimes — in one process or many, on one machine or several — may share one store: the store's claims
and tokens decide which run holds a thread; a runtime never trusts its own memory for that.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import pykka

from threadloom.actors.aio import AsyncRuntimeMixin, RuntimeLoop, running_loop
from threadloom.actors.cascade import CascadeDelete
from threadloom.actors.graph import STEP_KEY, Graph, NodeContext, RunOutcome
from threadloom.actors.logs import log as _log
from threadloom.actors.metrics import RuntimeMetrics
from threadloom.actors.policies import ClaimPolicy, ServePolicy, SweepSchedule, WatchPolicy
from threadloom.actors.runs import RunEnv, RunHandle, RunKind, RunSpec
from threadloom.actors.scheduler import IdFactory, RandomIds, Scheduler, ThreadScheduler
from threadloom.actors.serve import QueueWorker, Server, wait_until_signalled
from threadloom.actors.subscription import Subscription, Tail, check_tenant
from threadloom.actors.supervisor import Abandon, Drain, LiveRuns, Spawn, Supervisor, SweepOnce
from threadloom.actors.thread_reads import ThreadReadsMixin
from threadloom.actors.walker import DEFAULT_GROUP, ShareQuery, WalkSetup, WalksQuery, store_access
from threadloom.domain import validation as v
from threadloom.domain.access import AccessSchemas, AccessStampOptions, WalkRecord, member_group
from threadloom.domain.clock import Clock
from threadloom.domain.errors import (
    CancelledError,
    InvalidRunState,
    ProcessingError,
    ThreadBusy,
    ValidationError,
)
from threadloom.domain.queue import QueueEntry
from threadloom.domain.values import (
    BusyHolder,
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    SweepPage,
    SweepPolicy,
)
from threadloom.persistence.aio import AsyncStore
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.clock import SystemClock
from threadloom.persistence.metrics.meter import Meter
from threadloom.persistence.queue import RunQueue

CHILD_BUSY_RETRY = timedelta(milliseconds=100)
"""How long ``ctx.spawn`` waits, by the runtime's clock, before it asks again for a child thread it is recovering
while a claim left by a run not live in this runtime (a dead process's) still holds it. It gives up once the
runtime's ``claim_policy.ttl`` has passed since the first refusal."""
ABANDONED_GRACE = timedelta(seconds=1)
"""After ``serve`` abandoned runs with their nodes in flight (a second signal), how long :meth:`GraphRuntime.close`
waits for the runtime's tasks: an abandoned node's thread is left running (it is a daemon thread; the process may
exit under it) rather than waited for."""
SPAWN_RELOOKS = 3
"""How often ``ctx.spawn`` looks at a child thread again when the child moved on between its look and its claim."""


def default_node_id() -> str:
    """``<host>-<pid>``: names this process's runtime in RunIds and log lines."""
    return f"{socket.gethostname()}-{os.getpid()}"[:200]


class GraphRuntime(ThreadReadsMixin, AsyncRuntimeMixin):
    """Runs graphs on durable, fenced threads.

    Args:
        store: the store (shared with other runtimes and processes as it allows). The runtime never closes it.
        clock: the runtime's clock: it schedules renewals, sweeps and waits, and stamps ``created_at`` and event
            timestamps (claim expiry is the store's clock). Default: the system clock.
        node_id: names this runtime in its RunIds and log lines (default ``<host>-<pid>``).
        claim_policy: claim ttl and renewal period (default 30 s / 10 s).
        watch_policy: how subscriptions watch (default on, 250 ms).
        queue: the run queue ``serve`` works and the sweep guard reads (default: ``store.queue`` if it has one).
        ids: RunId and checkpoint-id factory (default random).
        scheduler: timers, background tasks and waits (default real threads by ``clock``).
        sweep: a periodic retention sweep run by the supervisor (default None: none).
        close_timeout: how long :meth:`close` waits for runs, workers and threads to end (default 10 s).
        access: the node's access schemas (README "Access walks"); default: the store's (``open_store(url,
            access=...)``). When given, they must equal the store's: the store stamps with its own. A runtime
            with declared schemas heartbeats its membership and runs one walker per declared graph kind.
        access_options: the walks' pace and page options (default ``AccessStampOptions()``: 10 s, 1000, 0.10,
            100 threads/s).
        access_group: the walk group: runtimes sharing a store share its walks (default ``"threadloom"``;
            no ``#``).
        meter: where the runtime's own metrics go (runs started, completed, failed, recovered and taken over,
            claims lost, the run queue's depth and oldest entry's age while it serves, subscription lag) and the
            walkers' (docs/operations.md "Metrics"). None (default): no runtime metrics are recorded, and the
            walkers' go to the store's ``meter`` when it is a metered store. Store calls are metered by wrapping
            the store in a ``MeteredCheckpointer`` (share the meter to export both).

    Raises:
        ValidationError: a bad argument.
    """

    def __init__(
        self,
        store: Checkpointer,
        clock: Clock | None = None,
        node_id: str | None = None,
        claim_policy: ClaimPolicy | None = None,
        watch_policy: WatchPolicy | None = None,
        *,
        queue: RunQueue | None = None,
        ids: IdFactory | None = None,
        scheduler: Scheduler | None = None,
        sweep: SweepSchedule | None = None,
        close_timeout: timedelta = timedelta(seconds=10),
        access: AccessSchemas | None = None,
        access_options: AccessStampOptions | None = None,
        access_group: str = DEFAULT_GROUP,
        meter: Meter | None = None,
    ) -> None:
        v.check_instance("store", store, Checkpointer)
        self.store = store
        self.clock = clock if clock is not None else SystemClock()
        if not callable(getattr(self.clock, "now", None)):
            raise ValidationError("clock", ("must have a now() method returning an aware datetime",))
        self.node_id = v.check_id("node_id", node_id if node_id is not None else default_node_id())
        self.claim_policy = v.check_instance("claim_policy", claim_policy or ClaimPolicy(), ClaimPolicy)
        self.watch_policy = v.check_instance("watch_policy", watch_policy or WatchPolicy(), WatchPolicy)
        if queue is None:
            found = getattr(store, "queue", None)
            queue = found if isinstance(found, RunQueue) else None
        elif not isinstance(queue, RunQueue):
            raise ValidationError("queue", (f"must be a RunQueue, got {type(queue).__name__}",))
        self.queue = queue
        if sweep is not None:
            v.check_instance("sweep", sweep, SweepSchedule)
        v.check_positive_duration("close_timeout", close_timeout)
        if meter is not None:
            v.check_instance("meter", meter, Meter)
        self.metrics = RuntimeMetrics(meter, self.node_id)
        """The runtime's metrics (``metrics.meter`` is the meter given, or None)."""
        self._close_timeout = close_timeout
        self._scheduler = scheduler if scheduler is not None else ThreadScheduler(self.clock)
        if not isinstance(self._scheduler, Scheduler):
            raise ValidationError("scheduler", ("must be a Scheduler",))
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._subscriptions: dict[Subscription, None] = {}  # in subscription order: close cancels in that order
        self._servers: list[Server] = []
        self._closed = False
        self._abandoned = False  # a run was abandoned with its node in flight (a second signal to serve)
        self._stopping = threading.Event()  # set by close() once every live run was told to stop
        self._aio = RuntimeLoop(self.node_id)  # async nodes' event loop, started by the first (README "asyncio")
        self._astore: AsyncStore | None = None  # async subscriptions' reads, made by the first
        self._tails: dict[tuple[int, str], Tail] = {}  # one shared watch per thread and event loop
        self._env = RunEnv(
            store=store,
            clock=self.clock,
            scheduler=self._scheduler,
            ids=ids if ids is not None else RandomIds(),
            claim_policy=self.claim_policy,
            node_id=self.node_id,
            start_child=self._start_child,
            track_thread=self._track_thread,
            metrics=self.metrics,
            loop=self._aio,
        )
        walks = self._walk_setup(store, access, access_options, access_group, meter)
        self.access = walks.access if walks is not None else access
        self._walks_on = walks is not None
        self._supervisor = self._scheduler.actor_class(Supervisor).start(self._env, queue, sweep, walks)

    def __repr__(self) -> str:
        return f"GraphRuntime(node_id={self.node_id!r}, store={self.store!r})"

    @staticmethod
    def _walk_setup(
        store: Checkpointer,
        access: AccessSchemas | None,
        options: AccessStampOptions | None,
        group: str,
        meter: Meter | None,
    ) -> WalkSetup | None:
        """What this runtime walks (None: nothing declared); validates the access arguments."""
        member_group(group)  # ValidationError naming "group" for a bad one
        options = v.check_instance("access_options", options or AccessStampOptions(), AccessStampOptions)
        if meter is not None:
            v.check_instance("meter", meter, Meter)
        else:
            found = getattr(store, "meter", None)
            meter = found if isinstance(found, Meter) else None
        stored = store_access(store)
        if access is not None:
            v.check_instance("access", access, AccessSchemas)
            if stored is not None and stored != access:
                raise ValidationError(
                    "access",
                    (
                        "must be the store's access schemas (the store stamps with its own); open the "
                        "store with access=... instead",
                    ),
                )
        else:
            access = stored
        if access is None or not access.schemas:
            return None
        return WalkSetup(access=access, options=options, group=group, meter=meter)

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _track_thread(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads = [known for known in self._threads if known.is_alive()]
            self._threads.append(thread)

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise ProcessingError(operation, "the runtime is closed; make a new GraphRuntime")

    def _ask(self, operation: str, message: Any) -> Any:
        try:
            return self._supervisor.ask(message)
        except pykka.ActorDeadError:
            raise ProcessingError(operation, "the runtime is closed; make a new GraphRuntime") from None

    # -- runs -------------------------------------------------------------------------------------------------

    def _run(
        self,
        kind: RunKind,
        thread_id: str,
        graph: Graph,
        input: Any,  # noqa: A002
        tenant_id: str | None,
        *,
        run_id: str | None = None,
        origin: CheckpointOrigin | None = None,
        before_admit: Any = None,
        fence: tuple[str, int] | None = None,
    ) -> RunHandle:
        operation = kind.value
        v.check_id("thread_id", thread_id)
        v.check_instance("graph", graph, Graph)
        v.check_json("input", input)
        v.check_optional_id("tenant_id", tenant_id)
        v.check_optional_id("run_id", run_id)
        self._ensure_open(operation)
        spec = RunSpec(
            kind=kind,
            thread_id=thread_id,
            graph=graph,
            input=input,
            tenant_id=tenant_id,
            run_id=run_id if run_id is not None else self._env.ids.run_id(self.node_id),
            origin=origin,
            before_admit=before_admit,
            fence=fence,
        )
        handle: RunHandle = self._ask(operation, Spawn(spec))
        handle._wait_claimed()  # raises the refusal: ThreadBusy, TenantMismatch, InvalidRunState, …
        return handle

    def start(
        self,
        thread_id: str,
        graph: Graph,
        input: Any = None,
        tenant_id: str | None = None,
        *,
        run_id: str | None = None,  # noqa: A002
    ) -> RunHandle:
        """Starts a run of ``graph`` on ``thread_id`` for ``tenant_id`` and returns once it holds the thread.

        A new thread starts at the graph's entry with ``graph.merge(None, input)``; a settled thread (latest
        COMPLETED or FAILED) starts a new turn from its state (``ctx.effect`` keys name effects of one turn
        unless ``scope="thread"``: the new turn runs them afresh). The input is *admitted* by the run's first commit
        (a RUNNING checkpoint at step 0 with the next node in its metadata, and a ``threadloom.run_started``
        event); each node then commits one checkpoint.

        Args:
            thread_id: the thread (created by the first commit if new).
            graph: the graph to run; an existing thread must run the same ``graph_id``.
            input: the run's input (JSON).
            tenant_id: the tenant the run is for (None: the tenant-less); the thread must be this tenant's.
            run_id: the RunId to run under (default: a new one from the runtime's id factory).

        Returns:
            The run's handle; the run goes on in the background.

        Raises:
            ThreadBusy: a live claim holds the thread — a run in this or any other runtime or process; its
                holder's RunId is named to the same tenant only. Nothing changed; retry once it ended.
            InvalidRunState: the thread has an incomplete run (``recover`` it) or a suspended one (``resume``
                it), or runs another graph; nothing changed.
            TenantMismatch: the thread is another tenant's; nothing of it read or changed. Found once the run
                holds the thread, as is ``InvalidRunState``: the claim taken and released spends a fencing token
                (``ThreadBusy`` spends none).
            ValidationError: a bad argument (``input`` not JSON, or refused by the graph's ``merge``, …);
                nothing changed. ProcessingError: the store failed, or the runtime is closed:
                ``StoreUnavailable`` admitted nothing (call again later); ``StoreCorrupt`` and ``StoreClosed``
                are not retryable (logged as ``run.failed`` at error level).
        """
        return self._run(RunKind.START, thread_id, graph, input, tenant_id, run_id=run_id)

    def recover(
        self, thread_id: str, graph: Graph, tenant_id: str | None = None, *, run_id: str | None = None
    ) -> RunHandle:
        """Continues the thread's incomplete run at the node its latest checkpoint names.

        For a thread whose run crashed, was cancelled or whose runtime closed (latest checkpoint RUNNING, no
        live claim): a new run claims it — taking over an expired claim — and goes on from the latest
        checkpoint's state, without re-running a node that committed. The run continues the same turn: effects
        recorded by earlier runs of the turn are read, never run again; an effect whose intent was committed but
        not its result (the node that ran it never committed) is handled as ``ctx.effect``'s ``on_uncertain``
        says (by default called again with the same idempotency key). The run that held the thread before is
        fenced: its next commit is ``StaleClaim``.

        Raises:
            ThreadBusy: a live claim holds the thread (the holder named to the same tenant); of several
                runtimes recovering at once exactly one is admitted.
            InvalidRunState: the latest checkpoint is not RUNNING (nothing to recover) or names no node of
                ``graph``.
            TenantMismatch, ValidationError, ProcessingError: as :meth:`start`.
        """
        return self._run(RunKind.RECOVER, thread_id, graph, None, tenant_id, run_id=run_id)

    def resume(
        self,
        thread_id: str,
        graph: Graph,
        input: Any = None,
        tenant_id: str | None = None,
        *,
        run_id: str | None = None,  # noqa: A002
    ) -> RunHandle:
        """Resumes a SUSPENDED thread with ``input`` at the node its suspending step named.

        The state becomes ``graph.merge(state, input)``, admitted by a step-0 checkpoint as :meth:`start` does.
        A resume begins a new turn, as a start does (effect keys of the suspended turn are not read back unless
        they were thread-scoped).

        Raises:
            InvalidRunState: the latest checkpoint is not SUSPENDED.
            ThreadBusy, TenantMismatch, ValidationError, ProcessingError: as :meth:`start`.
        """
        return self._run(RunKind.RESUME, thread_id, graph, input, tenant_id, run_id=run_id)

    def _start_child(self, thread_id: str, graph: Graph, input: Any, ctx: NodeContext) -> RunHandle:  # noqa: A002
        """``ctx.spawn``: starts a child run, or takes up the child this same step spawned before.

        Runs on the thread that runs the parent's node (never an actor's thread); it blocks only that node. It
        looks at the child's latest checkpoint first: COMPLETED by this step's child → its outcome, nothing run;
        RUNNING and spawned by this step → ``recover``, waiting out a claim that no run of this runtime holds
        (retrying every ``CHILD_BUSY_RETRY`` by the runtime's clock, for at most ``claim_policy.ttl`` after the
        first refusal); anything else → admitted as ``start`` does, with this step's origin. If the child moved on
        between that look and the claim (another runtime recovered or ended it), it looks again (at most
        ``SPAWN_RELOOKS`` times). The child run's first commit is fenced by the parent run's claim.

        Raises:
            As :meth:`NodeContext.spawn`.
        """
        v.check_id("thread_id", thread_id)
        v.check_instance("graph", graph, Graph)
        v.check_json("input", input)
        if thread_id == ctx.thread_id:
            raise ValidationError("thread_id", ("a child thread must be another thread than its parent",))
        self._ensure_open("spawn")
        busy_until: datetime | None = None
        relooks = 0
        while True:
            stored = self._check_tenant(thread_id, ctx.tenant_id)
            cp = stored.checkpoint if stored is not None else None
            if (
                cp is not None
                and cp.status is CheckpointStatus.COMPLETED
                and cp.graph_id == graph.graph_id
                and ctx._spawned_here(cp.origin, exact=True)
            ):
                return self._completed_child(cp, graph, ctx)
            recover = cp is not None and cp.status is CheckpointStatus.RUNNING and ctx._spawned_here(cp.origin)
            try:
                if recover:
                    return self._run(RunKind.RECOVER, thread_id, graph, None, ctx.tenant_id, fence=ctx._fence())
                origin, fence = ctx._child_origin(), ctx._fence()
                return self._run(RunKind.ADMIT, thread_id, graph, input, ctx.tenant_id, origin=origin, fence=fence)
            except ThreadBusy as busy:
                if not recover or not self._held_elsewhere(busy):
                    raise
                now = self.clock.now()
                if busy_until is None:
                    busy_until = now + self.claim_policy.ttl
                elif now >= busy_until:
                    raise
                self._pause(min(now + CHILD_BUSY_RETRY, busy_until))
            except InvalidRunState:
                again = self.store.latest(thread_id)
                moved = (again.checkpoint.id if again is not None else None) != (cp.id if cp is not None else None)
                relooks += 1
                if not moved or relooks > SPAWN_RELOOKS:
                    raise

    def _completed_child(self, cp: Checkpoint, graph: Graph, ctx: NodeContext) -> RunHandle:
        """The ended handle of the child run ``cp`` completed (spawned by ``ctx``'s step). Runs on the node's thread."""
        step = cp.metadata.get(STEP_KEY, "")
        outcome = RunOutcome(
            thread_id=cp.thread_id,
            run_id=cp.run_id,
            status=CheckpointStatus.COMPLETED,
            state=cp.state,
            checkpoint_id=cp.id,
            steps=int(step) if step.isdigit() else 0,
        )
        spec = RunSpec(
            kind=RunKind.ADMIT,
            thread_id=cp.thread_id,
            graph=graph,
            tenant_id=ctx.tenant_id,
            run_id=cp.run_id,
            origin=cp.origin,
        )
        _log.info(
            "spawn.completed_before",
            op="spawn",
            thread_id=cp.thread_id,
            run_id=cp.run_id,
            tenant_id=ctx.tenant_id,
            node_id=self.node_id,
            checkpoint_id=cp.id,
            parent_thread=ctx.thread_id,
            parent_run=ctx.run_id,
        )
        return RunHandle.ended(spec, outcome)

    def _held_elsewhere(self, busy: ThreadBusy) -> bool:
        """True when ``busy`` names a holder that is no run live in this runtime: a claim worth waiting out."""
        if not isinstance(busy.holder, BusyHolder.Run):
            return False  # another tenant's claim, or one that recorded no tenant: not this step's child's
        try:
            live: dict[str, frozenset[str]] = self._ask("spawn", LiveRuns())
        except ProcessingError:
            return True  # the runtime is closing: the pause that follows ends the spawn cancelled
        return busy.holder.holder not in live.get(busy.thread_id, frozenset())

    def _pause(self, until: datetime) -> None:
        """Waits on the calling (node) thread until the clock reads ``until``, or the runtime closes.

        Raises:
            CancelledError: the runtime is closing (raised once every live run was told to stop, so the parent
                run ends cancelled, never FAILED, and stays recoverable).
        """
        self._scheduler.wait(self._stopping, until)
        if self._closed:
            self._scheduler.wait(self._stopping, self.clock.now() + self._close_timeout)
            raise CancelledError("spawn")

    def live_runs(self) -> dict[str, frozenset[str]]:
        """Thread id → RunIds of the runs live in this runtime (the supervisor's registry)."""
        self._ensure_open("live_runs")
        return dict(self._ask("live_runs", LiveRuns()))

    # -- events -----------------------------------------------------------------------------------------------

    def subscribe(
        self, thread_id: str, after_seq: int = 0, *, tenant_id: str | None = None, until_run_end: str | None = None
    ) -> Subscription:
        """The thread's events with ``seq > after_seq``: replayed, then watched.

        Every event is delivered once, in order, without gap, whichever runtime or process committed it; to go
        on after a restart, subscribe again with the last ``seq`` handled. A subscription made before the
        thread exists sees its events from the first.

        Called on a running event loop (from a coroutine), the subscription watches from a task on that loop
        and holds no thread of its own: consume it with ``async for`` (README "asyncio"). Called from plain
        code, it watches from a thread of its own; either kind may be consumed both ways.

        Args:
            thread_id: the thread.
            after_seq: deliver events after this number (0: from the first).
            tenant_id: the caller's tenant; the thread must be this tenant's (checked now, or at its first event
                for a thread that has no checkpoint yet).
            until_run_end: a RunId: the subscription ends once it delivered that run's end event
                (``threadloom.run_completed``, ``run_suspended`` or ``run_failed``). A run that is cancelled,
                loses its claim or dies writes none: the subscription then goes on (cancel it, e.g. when the
                run's handle ends with an error). None (default): it ends only when cancelled or on an error.

        Raises:
            TenantMismatch: the thread is another tenant's.
            ValidationError, ProcessingError: a bad argument; the store failed or the runtime is closed.
        """
        v.check_id("thread_id", thread_id)
        v.check_int("after_seq", after_seq, low=0)
        v.check_optional_id("tenant_id", tenant_id)
        v.check_optional_id("until_run_end", until_run_end)
        self._ensure_open("subscribe")
        check = check_tenant(self.store, thread_id, tenant_id)
        check()

        def ended(sub: Subscription) -> None:
            with self._lock:
                self._subscriptions.pop(sub, None)
            self._report_lag()

        subscription = Subscription(
            self.store,
            self._scheduler,
            thread_id,
            after_seq,
            policy=self.watch_policy,
            tenant_check=check,
            on_end=ended,
            on_lag=self._report_lag if self.metrics.enabled else None,
            until_run_end=until_run_end,
        )
        with self._lock:
            self._subscriptions[subscription] = None
        if running_loop() is not None:
            with self._lock:
                if self._astore is None:
                    self._astore = AsyncStore(self.store, own_store=False)
            return subscription.start_async(self._astore, self._tails)
        return subscription.start()

    def _report_lag(self) -> None:
        """Sets the subscription lag gauge: the most events any live subscription holds undelivered."""
        if not self.metrics.enabled:
            return
        with self._lock:
            subscriptions = list(self._subscriptions)
        self.metrics.subscription_lag(max((sub.lag for sub in subscriptions), default=0))

    # -- threads ----------------------------------------------------------------------------------------------

    def delete_thread(self, thread_id: str, tenant_id: str | None = None) -> list[str]:
        """Deletes the thread and all its descendants, each delete fenced by the root's claim.

        The root's tenant is checked first (its latest checkpoint's, or before its first checkpoint the tenant of
        the claim on it): another tenant's delete is refused before anything is written. Then the root is claimed
        (a live run in any runtime refuses the delete), its tenant checked again, and marked
        ``{"threadloom.deleting": "true"}`` by a fenced metadata commit: the registry reports it ``DELETED`` and
        ``incomplete`` leaves it out while the cascade runs. Children are deleted before their parents (paged
        through ``children``), the root last. Runs on the calling thread.

        Returns:
            The deleted thread ids, descendants first, the root last.

        Raises:
            ThreadBusy: the root or a descendant is held by a live run (named to the same tenant). A cascade
                stopped half-way leaves the root marked DELETED; deleting again finishes it.
            TenantMismatch: the root is another tenant's; nothing was written (no claim either), and nothing is
                told of a run holding it.
            StaleClaim: the root was taken over during the cascade.
            ValidationError, ProcessingError: a bad argument; the store failed or the runtime is closed.
        """
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("delete_thread")
        return CascadeDelete(self._env, thread_id, tenant_id).run()

    # -- access walks -------------------------------------------------------------------------------------------

    def walks(self) -> dict[str, WalkRecord]:
        """The walk of each declared graph kind, as this node last read or claimed it (README "Access walks").

        Returns:
            graph id -> its :class:`~threadloom.domain.access.WalkRecord` (schema, heads, cursor, count,
            completed); a kind this node has not read a record of yet is missing. Empty without declared schemas.
            Reads no storage.
        """
        self._ensure_open("walks")
        if not self._walks_on:
            return {}
        answer: dict[str, WalkRecord] = self._ask("walks", WalksQuery())
        return answer

    def share(self, graph_id: str) -> float | None:
        """The share of its time the walk of ``graph_id`` may take now on this node (``WalkPace.share``, in
        (0, 1]); None before it walked here. Reads no storage."""
        v.check_id("graph_id", graph_id)
        self._ensure_open("share")
        if not self._walks_on:
            return None
        answer: float | None = self._ask("share", ShareQuery(graph_id))
        return answer

    # -- retention --------------------------------------------------------------------------------------------

    def sweep(self, policy: SweepPolicy) -> list[SweepPage]:
        """One whole retention pass over the store, page by page, through the supervisor.

        Its guard protects the newest checkpoint of every run live in this runtime and of every run an open
        queue entry names. Logs ``sweep.page`` per page and ``tombstone.reclaimed`` per reclaimed tombstone.

        Returns:
            The pages, in order.
        """
        v.check_instance("policy", policy, SweepPolicy)
        self._ensure_open("sweep")
        pages: list[SweepPage] = []
        after: str | None = None
        while True:
            page: SweepPage = self._ask("sweep", SweepOnce(policy, after))
            pages.append(page)
            if page.next is None:
                return pages
            after = page.next

    # -- the run queue ----------------------------------------------------------------------------------------

    def _queue(self, operation: str) -> RunQueue:
        if self.queue is None:
            raise ValidationError("store", (f"{type(self.store).__name__} has no run queue; {operation} needs one",))
        return self.queue

    def enqueue(
        self,
        thread_id: str,
        graph_id: str,
        input: Any = None,  # noqa: A002
        tenant_id: str | None = None,
        *,
        delay: timedelta = timedelta(0),
    ) -> QueueEntry:
        """Adds a run-queue entry: a run of ``graph_id`` on ``thread_id`` with ``input`` for ``tenant_id``.

        A worker (``serve``) admits the input once — a start, or a resume of a suspended thread — and runs it
        to its end, recovering it across worker crashes.
        """
        self._ensure_open("enqueue")
        return self._queue("enqueue").enqueue(
            thread_id, graph_id=graph_id, input=input, tenant_id=tenant_id, delay=delay
        )

    def serve(
        self,
        graphs: Mapping[str, Graph] | Iterable[Graph],
        *,
        concurrency: int = 1,
        policy: ServePolicy | None = None,
        block: bool = True,
        signals: bool = True,
        on_started: Callable[[Server], None] | None = None,
    ) -> Server:
        """Works the store's run queue with ``concurrency`` workers until stopped.

        Each worker leases an entry of one of ``graphs``, records its attempt's RunId, asks ``lookup_run``
        whether an earlier attempt admitted the input (then recovers, or finishes the entry), else admits it;
        renews the lease while the run goes on; and finishes the entry COMPLETED or FAILED. A thread held by
        another run, a lost claim, a stop or a store failure that may pass (``StoreUnavailable``,
        ``OutcomeUnknown``) hands the entry back for a later attempt. A damaged store (``StoreCorrupt``) met
        while working an entry finishes it FAILED with the error's text (never leased again in a loop); a store
        the workers cannot use at all (closed under them, or damaged where the queue itself is kept) stops every
        worker: ``Server.error`` holds the error.

        Args:
            graphs: the graphs served, by id (a mapping) or as a collection (keyed by ``graph_id``).
            concurrency: how many workers (>= 1).
            policy: lease and polling policy (default :class:`ServePolicy`).
            block: return once stopped (``Server.stop()`` — safe from a signal handler — :meth:`close`, or a
                signal, see ``signals``), running one worker on the calling thread (on the main thread with
                ``signals``, every worker runs on its own thread); False returns at once with the workers in the
                background.
            signals: with ``block`` on the main thread, stop on SIGINT (Ctrl-C) and SIGTERM while serving (the
                previous handlers are put back on return; the workers then run on their own threads). The first
                signal lets each node in flight finish and commit, then releases the run's claim and hands its
                entry back at once (another worker takes it up without waiting for the lease to expire), and
                ``serve`` returns. A second signal abandons the nodes in flight - their steps are dropped, and a
                side effect they ran may run again on the next attempt, as after a crash - hands back at once,
                and raises ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM). False: signals are
                left to the caller's handlers.
            on_started: called once on the calling thread with the :class:`Server` when the workers run and (with
                ``signals``) the stop signals are handled, before ``serve`` blocks: the place to announce
                readiness, since a signal from then on stops the workers cleanly. An exception it raises stops and
                joins the workers, then propagates.

        Returns:
            The :class:`Server` (stopped, when ``block``).

        Raises:
            ValidationError: no run queue, no graph, or a bad argument; ProcessingError: the runtime is closed.
            StoreClosed, StoreCorrupt: (``block`` only) the store stopped the workers, as ``Server.error`` says;
                the other workers were stopped and joined first.
            KeyboardInterrupt, SystemExit: a second SIGINT or SIGTERM (``signals``), after the hand-back.
        """
        if isinstance(graphs, Mapping):
            served = dict(graphs)
        else:
            if isinstance(graphs, (str, bytes)) or not isinstance(graphs, Iterable):
                raise ValidationError("graphs", ("must be a mapping of graph id to Graph, or a collection of Graph",))
            served = {}
            for graph in graphs:
                v.check_instance("graphs item", graph, Graph)
                served[graph.graph_id] = graph
        if not served:
            raise ValidationError("graphs", ("must name at least one graph",))
        for key, graph in served.items():
            v.check_instance(f"graphs[{key!r}]", graph, Graph)
            if key != graph.graph_id:
                raise ValidationError(f"graphs[{key!r}]", (f"is graph {graph.graph_id!r}: key it by its graph_id",))
        v.check_int("concurrency", concurrency, low=1, high=256)
        policy = v.check_instance("policy", policy or ServePolicy(), ServePolicy)
        queue = self._queue("serve")
        self._ensure_open("serve")
        server = Server(abandon=self._abandon)
        with self._lock:
            self._servers.append(server)
        workers = [
            QueueWorker(self, queue, served, policy, server, f"{self.node_id}#{index}") for index in range(concurrency)
        ]
        signalled = block and signals and threading.current_thread() is threading.main_thread()
        background = workers[1:] if block and not signalled else workers
        for worker in background:
            server._tasks.append(self._scheduler.spawn(f"serve-{worker.holder}", worker.run))
        if signalled:
            wait_until_signalled(server, self._close_timeout, self.node_id, on_started)
            if server.error is not None:
                raise server.error
        elif block:
            try:
                if on_started is not None:
                    on_started(server)
                workers[0].run()
            finally:
                server.stop()
                server.join(self._close_timeout)
            if server.error is not None:
                raise server.error
        elif on_started is not None:
            try:
                on_started(server)
            except BaseException:
                server.stop()
                server.join(self._close_timeout)
                raise
        return server

    def _abandon(self, handle: RunHandle) -> None:
        """Ends a run at once, its node in flight left to finish unheard: its actor stops and releases the claim.

        ``close`` then waits at most :data:`ABANDONED_GRACE` for the abandoned nodes' threads."""
        self._abandoned = True
        try:
            self._supervisor.tell(Abandon(handle.run_id))
        except pykka.ActorDeadError:
            pass  # the runtime closed: its runs were ended already

    # -- shutdown ---------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stops everything this runtime runs and releases every claim it holds.

        In order: the queue workers are told to stop; subscriptions are cancelled; every live run is cancelled
        at its next step boundary (its node in flight finishes and is committed; the thread stays incomplete
        for any runtime to recover) and its claim released; the workers hand their entries back; the actors,
        the timer thread and every task are stopped and joined, each within ``close_timeout``. The store stays
        open (the caller owns it). Closing twice does nothing. Safe to call from a signal handler's thread only
        as ``Server.stop()``; call ``close`` from the thread that owns the runtime.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            servers, subscriptions = list(self._servers), list(self._subscriptions)
        timeout = self._close_timeout
        for server in servers:
            server.stop()
        for subscription in subscriptions:
            subscription.cancel(timeout)
        try:
            handles: list[RunHandle] = self._supervisor.ask(Drain(), block=True)
        except pykka.ActorDeadError:
            handles = []
        for handle in handles:
            handle.cancel()
        self._stopping.set()  # after the cancels: a node's spawn waiting on it ends its run cancelled
        for handle in handles:
            try:
                handle.exception(timeout)
            except TimeoutError:
                _log.warning(
                    "runtime.close_slow", node_id=self.node_id, thread_id=handle.thread_id, run_id=handle.run_id
                )
        for server in servers:
            server.join(timeout)
        try:
            self._supervisor.stop(block=True, timeout=timeout.total_seconds())
        except (pykka.ActorDeadError, pykka.Timeout):
            pass
        left = self._scheduler.close(min(timeout, ABANDONED_GRACE) if self._abandoned else timeout)
        left += self._aio.close(timeout.total_seconds())
        if self._astore is not None:
            self._astore.shutdown()
        with self._lock:
            threads = list(self._threads)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(timeout.total_seconds())
                if thread.is_alive():
                    left.append(thread.name)
        if left:
            _log.warning("runtime.close_incomplete", node_id=self.node_id, threads=left)

    def __enter__(self) -> GraphRuntime:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
