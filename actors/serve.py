"""The run-queue worker of ``GraphRuntime.serve``.

Each worker loops: lease the oldest leasable entry of the graphs it serves, record the attempt's RunId on the
entry, ask ``lookup_run`` whether an earlier attempt's input was admitted (then recover the thread, or finish the
entry if the thread already went past it), otherwise admit the input (a start, or a resume of a suspended
thread); renew the lease while the run goes on; finish the entry with the run's outcome. The admission checks,
under the thread's claim, that the attempt still holds its lease, so two attempts never both admit the input.

A worker that stops (``close``) cancels its run at the next step and hands the entry back at once, without counting
the lease as a try (``release_lease(..., refund=True)``: ``ServePolicy.max_attempts`` counts only the others); a worker
whose process dies leaves a lease and a claim that expire, and the next attempt recovers the run without
re-running its completed nodes. A blocking ``serve`` on the main thread stops on SIGINT or SIGTERM
(:func:`wait_until_signalled`): the first lets each node in flight finish and commit, then releases the claim and
hands the entry back; a second abandons the nodes in flight (their steps are dropped) and hands back at once.

Store failures: one that may pass (``StoreUnavailable``, ``OutcomeUnknown``, a ``ProcessingError`` of unknown
kind) hands the entry back for a later attempt (``ServePolicy.max_attempts`` bounds them). A damaged store
(``StoreCorrupt``) met while working an entry finishes that entry ``FAILED`` with the error's text - it is never
leased again in a loop; the thread stays as it is, to be recovered once the store is repaired - and the worker
goes on with the next entry. A store the worker cannot use at all - ``StoreClosed``, or ``StoreCorrupt`` while
leasing or finishing - stops every worker of the server: ``queue.worker_stopped`` at error level,
:attr:`Server.error` holds the error, and a blocking ``serve`` raises it. An entry it held keeps its lease until
the lease expires; then a worker over an open store takes it over.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from threadloom.actors._failures import closed_under, error_kind, is_fatal
from threadloom.actors.graph import ERROR_KEY, Graph
from threadloom.actors.logs import describe as _describe
from threadloom.actors.logs import log as _log
from threadloom.actors.policies import ServePolicy
from threadloom.actors.runs import RunHandle, RunKind
from threadloom.actors.scheduler import Task
from threadloom.domain import validation as v
from threadloom.domain.errors import (
    CancelledError,
    InvalidRunState,
    RunFailed,
    StaleClaim,
    StaleLease,
    TenantMismatch,
    ThreadBusy,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.queue import EntryStatus, Lease
from threadloom.domain.values import CheckpointStatus
from threadloom.persistence.queue import RunQueue

if TYPE_CHECKING:
    from types import FrameType

    from threadloom.actors.runtime import GraphRuntime


class Server:
    """The workers of one ``GraphRuntime.serve`` call: stop them, wait for them, read what they did.

    Attributes:
        completed, failed, handed_back: entries this server's workers finished COMPLETED, FAILED, or gave back.
        error: the store failure that stopped the workers (``StoreClosed``, ``StoreCorrupt``), else None.
    """

    def __init__(self, abandon: Callable[[RunHandle], None] | None = None) -> None:
        self.stop_event = threading.Event()
        self._tasks: list[Task] = []
        self._lock = threading.Lock()
        self._abandon = abandon
        self._interrupted = 0  # 1: cancel the runs being worked at their next step; 2: abandon them now
        self._runs: list[RunHandle] = []  # the runs the workers are waiting for
        self.completed = 0
        self.failed = 0
        self.handed_back = 0
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        error = f", error={type(self.error).__name__}" if self.error is not None else ""
        return f"Server(completed={self.completed}, failed={self.failed}, stopped={self.stopped}{error})"

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called (or the runtime closed)."""
        return self.stop_event.is_set()

    def stop(self) -> None:
        """Asks every worker to stop after its current entry (safe from a signal handler: only sets a flag)."""
        self.stop_event.set()

    def join(self, timeout: timedelta | None = None) -> None:
        """Waits for the background workers to end (not a worker running on the calling thread), each up to
        ``timeout`` (a ``timedelta`` of zero or more; None: no bound); returns even if some still run.

        Raises:
            ValidationError: ``timeout`` is not a ``timedelta`` (a number of seconds included) nor None, or is
                negative; nothing waited.
        """
        seconds = v.wait_seconds("timeout", timeout)
        for task in list(self._tasks):
            task.join(seconds)

    def _alive(self) -> bool:
        return any(task.alive for task in self._tasks)

    def _interrupt(self, *, abandon: bool) -> None:
        """Stops the workers and ends the runs they work: at their next step boundary (the node in flight
        finishes and commits), or at once with ``abandon`` (the node in flight is left to finish unheard, its
        step dropped). Either way the run releases its claim and its worker hands the entry back with no delay.
        Runs on the thread that handles the signals (never inside a signal handler)."""
        with self._lock:
            self._interrupted = max(self._interrupted, 2 if abandon else 1)
            runs = list(self._runs)
        self.stop_event.set()
        for handle in runs:
            self._end(handle)

    def _end(self, handle: RunHandle) -> None:
        if self._interrupted >= 2 and self._abandon is not None:
            self._abandon(handle)
        elif self._interrupted >= 1:
            handle.cancel()

    def _watch(self, handle: RunHandle) -> None:
        """A worker waits for ``handle``: an interrupt ends it (also one that came first)."""
        with self._lock:
            self._runs.append(handle)
        if self._interrupted:
            self._end(handle)

    def _unwatch(self, handle: RunHandle) -> None:
        with self._lock:
            if handle in self._runs:
                self._runs.remove(handle)

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def _fail(self, error: BaseException) -> None:
        """Stops every worker because of ``error`` (the first one is kept)."""
        with self._lock:
            if self.error is None:
                self.error = error
        self.stop_event.set()


class _StopWorker(Exception):
    """Raised inside a worker when the store can no longer be used at all: the worker loop stops the server."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class QueueWorker:
    """One worker loop over the run queue (plain methods).

    Args:
        runtime: the runtime that runs the entries.
        queue: the store's run queue.
        graphs: graph id → graph; only entries of these kinds are leased.
        policy: lease ttl, renewal, polling, busy delay and attempt limit.
        server: the server the worker belongs to (its stop flag and counters).
        holder: the name the worker leases under.
    """

    def __init__(
        self,
        runtime: GraphRuntime,
        queue: RunQueue,
        graphs: Mapping[str, Graph],
        policy: ServePolicy,
        server: Server,
        holder: str,
    ) -> None:
        self.runtime = runtime
        self.queue = queue
        self.graphs = dict(graphs)
        self.policy = policy
        self.server = server
        self.holder = holder
        self._env = runtime._env
        self._log = _log.bind(node_id=self._env.node_id, worker=holder)

    def run(self) -> None:
        """The loop: runs on the worker's own thread (or the caller's, for a blocking ``serve``) until stopped,
        or until the store cannot be used at all (then it stops the whole server, see :attr:`Server.error`)."""
        stop = self.server.stop_event
        while not stop.is_set():
            self._sample_depth()
            try:
                worked = self.poll_once()
            except _StopWorker as stopping:
                self._stop_server(stopping.error)
                return
            except ThreadloomError as error:
                if self._fatal(error):
                    self._stop_server(error)
                    return
                self._log.warning("queue.lease_failed", op="lease", error=_describe(error))  # wait, ask again
                worked = False
            if not worked:
                self._env.scheduler.wait(stop, self._env.clock.now() + self.policy.poll_interval)

    def _sample_depth(self) -> None:
        """Reads the queue's depth into the runtime's metrics when a meter records and a reading is due (one
        worker of the runtime reads it at most once a ``QUEUE_SAMPLE_INTERVAL``). A failed read is logged
        (``queue.depth_failed``) and the worker goes on."""
        metrics = self._env.metrics
        if not metrics.queue_due(self._env.clock.now()):
            return
        try:
            depth = self.queue.depth()
        except ThreadloomError as error:
            self._log.warning("queue.depth_failed", op="depth", error=_describe(error))
            return
        metrics.queue_depth(depth)

    def _fatal(self, error: BaseException) -> bool:
        """True for a store failure no retry gets past (a damaged store, or one closed under the worker)."""
        return is_fatal(error, self._env.store) or is_fatal(error, self.queue)

    def _closed(self) -> bool:
        return bool(self._env.store.closed or self.queue.closed)

    def _stop_server(self, error: BaseException) -> None:
        store = self.queue if self.queue.closed else self._env.store
        error = closed_under(
            error,
            store,
            f"queue worker {self.holder!r}",
            "the leases it held expire by themselves: serve the queue with a runtime over an open store",
        )
        self._log.error("queue.worker_stopped", error=_describe(error), error_kind=error_kind(error))
        self.server._fail(error)

    def poll_once(self) -> bool:
        """Leases one entry and works it to its end; False when nothing was leasable."""
        lease = self.queue.lease(self.holder, self.policy.lease_ttl, graph_ids=self.graphs.keys())
        if lease is None:
            return False
        self.work(lease)
        return True

    # -- one attempt ------------------------------------------------------------------------------------------

    def work(self, lease: Lease) -> None:
        """Works one leased entry: record, look up, admit or recover, wait (renewing the lease), finish."""
        entry = lease.entry
        log = self._log.bind(
            thread_id=entry.thread_id, tenant_id=entry.tenant_id, entry_id=entry.entry_id, attempt=lease.attempt
        )
        log.info("queue.leased", op="lease", taken_over_from=lease.taken_over_from, graph_id=entry.graph_id)
        if self.server.stopped:  # stopped while leasing: give the entry back untouched (no try spent)
            self._hand_back(lease, timedelta(0), log, CancelledError("serve"))
            return
        if self.policy.max_attempts is not None and lease.entry.counted_attempts > self.policy.max_attempts:
            self._finish(lease, EntryStatus.FAILED, f"gave up after {self.policy.max_attempts} attempts", log)
            return
        graph = self.graphs[entry.graph_id]
        store = self._env.store
        run_id = self._env.ids.run_id(self._env.node_id)
        handle: RunHandle | None
        try:
            recorded = self.queue.record_run(entry.entry_id, lease.attempt, run_id)
            earlier = [run for run in recorded.run_ids if run != run_id]
            admitted = store.lookup_run(entry.thread_id, earlier) if earlier else None
            if admitted is not None:
                latest = store.latest(entry.thread_id)
                status = latest.checkpoint.status if latest is not None else None
                if status is not CheckpointStatus.RUNNING:
                    # The input was admitted and the thread went past it: the entry's work is done.
                    assert latest is not None
                    if status is CheckpointStatus.FAILED:
                        error = latest.checkpoint.metadata.get(ERROR_KEY, "the run failed")
                        self._finish(lease, EntryStatus.FAILED, error, log)
                    else:
                        self._finish(lease, EntryStatus.COMPLETED, None, log)
                    return
                log.info("queue.recovering", run_id=run_id, admitted_by=admitted.run_id)
                handle = self._run(RunKind.RECOVER, lease, graph, run_id)
            else:
                handle = self._admit(lease, graph, run_id, log)
                if handle is None:
                    return
            self._await(handle, lease, log)
            handle.wait()
        except RunFailed as error:
            self._finish(lease, EntryStatus.FAILED, str(error), log)
            return
        except (TenantMismatch, ValidationError) as error:
            self._finish(lease, EntryStatus.FAILED, str(error), log)
            return
        except StaleLease as error:
            log.info("queue.lease_lost", op="record_run", error=str(error))
            return
        except ThreadBusy as error:
            self._hand_back(lease, self.policy.busy_delay, log, error)
            return
        except (CancelledError, StaleClaim, InvalidRunState) as error:
            self._hand_back(lease, timedelta(0), log, error)
            return
        except Exception as error:
            if isinstance(error, _StopWorker):
                raise
            if self._fatal(error):
                self._give_up(lease, error, log)
                return
            # A store failure that may pass, or a bug: hand the entry back for a later attempt (max_attempts).
            self._hand_back(lease, self.policy.busy_delay, log, error)
            return
        self._finish(lease, EntryStatus.COMPLETED, None, log)

    def _give_up(self, lease: Lease, error: BaseException, log: Any) -> None:
        """The entry met a damaged or closed store: never lease it again in a loop.

        A closed store stops the worker (nothing can be written; the lease expires by itself). A damaged one
        finishes the entry FAILED with the error's text; if even that fails on the store, the worker stops.
        """
        if self._closed():
            raise _StopWorker(error)
        log.error("queue.entry_failed", op="run", error=_describe(error), error_kind=error_kind(error))
        self._finish(lease, EntryStatus.FAILED, _describe(error), log)

    def _check_lease(self, lease: Lease) -> None:
        self.queue.renew_lease(lease.entry_id, lease.attempt, self.policy.lease_ttl)

    def _run(self, kind: RunKind, lease: Lease, graph: Graph, run_id: str | None) -> RunHandle:
        entry = lease.entry
        return self.runtime._run(
            kind,
            entry.thread_id,
            graph,
            entry.input if kind is not RunKind.RECOVER else None,
            entry.tenant_id,
            run_id=run_id,
            before_admit=lambda: self._check_lease(lease),
        )

    def _admit(self, lease: Lease, graph: Graph, run_id: str, log: Any) -> RunHandle | None:
        """Admits the entry's input; first recovers an incomplete run another caller left on the thread."""
        try:
            return self._run(RunKind.ADMIT, lease, graph, run_id)
        except InvalidRunState as error:
            latest = self._env.store.latest(lease.entry.thread_id)
            if latest is None or latest.checkpoint.status is not CheckpointStatus.RUNNING:
                self._finish(lease, EntryStatus.FAILED, str(error), log)
                return None
            if latest.checkpoint.graph_id != graph.graph_id:
                self._finish(lease, EntryStatus.FAILED, str(error), log)
                return None
        log.info("queue.recovering_first", from_run=latest.checkpoint.run_id)
        first = self._run(RunKind.RECOVER, lease, graph, None)  # its RunId is not the entry's: not recorded
        self._await(first, lease, log)
        try:
            first.wait()
        except RunFailed:
            pass  # the earlier run failed: the thread is settled and takes the entry's input as a new turn
        return self._run(RunKind.ADMIT, lease, graph, run_id)

    def _await(self, handle: RunHandle, lease: Lease, log: Any) -> None:
        """Waits for the run to end, renewing the lease every ``renew_every`` (by the runtime's clock)."""
        self.server._watch(handle)
        try:
            self._renew_until_done(handle, lease, log)
        finally:
            self.server._unwatch(handle)

    def _renew_until_done(self, handle: RunHandle, lease: Lease, log: Any) -> None:
        done = threading.Event()
        handle._done.add_done_callback(lambda _future: done.set())
        renewing = True
        while not done.is_set():
            if self._env.scheduler.wait(done, self._env.clock.now() + self.policy.renew_every):
                break
            if not renewing:
                continue
            try:
                self.queue.renew_lease(lease.entry_id, lease.attempt, self.policy.lease_ttl)
            except StaleLease as error:
                renewing = False  # the run goes on under its claim; another attempt will find it admitted
                log.warning("queue.lease_lost", op="renew_lease", error=str(error))
            except ThreadloomError as error:
                if self._fatal(error):
                    renewing = False  # the run meets the same store and ends; the worker decides then
                    log.error(
                        "queue.renew_failed", op="renew_lease", error=_describe(error), error_kind=error_kind(error)
                    )
                    continue
                log.warning("queue.renew_failed", op="renew_lease", error=_describe(error))

    def _finish(self, lease: Lease, status: EntryStatus, error: str | None, log: Any) -> None:
        """Finishes the entry; a damaged or closed store stops the worker (``_StopWorker``)."""
        try:
            self.queue.finish(lease.entry_id, lease.attempt, status=status, error=error)
        except ThreadloomError as failure:
            if self._fatal(failure):
                log.error("queue.finish_failed", op="finish", error=_describe(failure), error_kind=error_kind(failure))
                raise _StopWorker(failure) from failure
            log.warning("queue.finish_failed", op="finish", error=_describe(failure))
            return
        self.server._count("completed" if status is EntryStatus.COMPLETED else "failed")
        log.info("queue.finished", op="finish", status=status.value, error=error)

    def _stopping(self) -> bool:
        """True once the server was stopped (a signal, ``Server.stop``) or the runtime is closing."""
        return self.server.stopped or self.runtime.closed

    def _hand_back(self, lease: Lease, delay: timedelta, log: Any, error: BaseException) -> None:
        """Gives the entry back for a later attempt; a damaged or closed store stops the worker (``_StopWorker``).

        A run cancelled because the worker stops (a signal, ``Server.stop``, ``GraphRuntime.close``) is handed back
        with a refund: the entry did nothing wrong, so the lease does not count against ``max_attempts``.
        """
        refund = isinstance(error, CancelledError) and self._stopping()
        try:
            self.queue.release_lease(lease.entry_id, lease.attempt, delay=delay, refund=refund)
        except ThreadloomError as failure:
            if self._fatal(failure):
                log.error(
                    "queue.release_failed", op="release_lease", error=_describe(failure), error_kind=error_kind(failure)
                )
                raise _StopWorker(failure) from failure
            log.warning("queue.release_failed", op="release_lease", error=_describe(failure))
            return
        self.server._count("handed_back")
        why = {"reason": "stopped"} if refund else {"error": _describe(error)}
        log.info("queue.handed_back", op="release_lease", delay_ms=delay.total_seconds() * 1000, refund=refund, **why)


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))
"""The signals a blocking ``serve`` on the main thread handles: Ctrl-C and a service manager's stop."""
SIGNAL_POLL_S = 0.1
"""How often (seconds) the main thread of a blocking ``serve`` looks at the signals it received."""


def wait_until_signalled(
    server: Server,
    join_timeout: timedelta,
    node_id: str,
    on_started: Callable[[Server], None] | None = None,
) -> None:
    """Waits on the main thread for ``server``'s workers (already started as tasks) to end, stopping them on
    SIGINT or SIGTERM; the handlers it installs are put back on return. ``on_started`` is called once the
    handlers are in place (an exception from it stops and joins the workers, then propagates).

    The signal handler only records the signal; this loop acts on it within :data:`SIGNAL_POLL_S`. First signal:
    ``queue.serve_interrupted``, every node in flight finishes and commits, then each run releases its claim and
    its worker hands the entry back (no delay). Second signal: ``queue.serve_abandoned``, the nodes in flight are
    abandoned (their steps dropped; a node's side effect that ran may run again on the next attempt, as after a
    crash), claims released and entries handed back at once. Later signals are ignored while the workers end.

    Raises:
        KeyboardInterrupt: after the hand-back, when the second signal was SIGINT.
        SystemExit: after the hand-back, when the second signal was SIGTERM (status 143).
    """
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)  # nothing else here: the main thread may hold any lock when it runs

    previous: dict[int, Any] = {}
    handled = 0
    log = _log.bind(node_id=node_id)
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, on_signal)
        if on_started is not None:
            on_started(server)
        while server._alive():
            while handled < len(received):
                name = signal.Signals(received[handled]).name
                handled += 1
                if handled == 1:
                    log.info("queue.serve_interrupted", signal=name, then="finishing the nodes in flight")
                    server._interrupt(abandon=False)
                elif handled == 2:
                    log.warning("queue.serve_abandoned", signal=name, then="abandoning the nodes in flight")
                    server._interrupt(abandon=True)
            for task in server._tasks:
                if task.alive:
                    task.join(SIGNAL_POLL_S)
                    break
    finally:
        server.stop()
        server.join(join_timeout)
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if handled >= 2:
        if received[1] == getattr(signal, "SIGTERM", None):
            raise SystemExit(128 + received[1])
        raise KeyboardInterrupt
