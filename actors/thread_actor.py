"""``ThreadActor``: one per thread with a live run in this runtime.

It claims the thread, commits each superstep (checkpoint + events + effect records) fenced by the claim's token,
renews the claim every ``renew_every`` on a timer outside the actor that ``tell``s it, stops the run at its next
step once a renewal or a commit says ``StaleClaim``, and releases the claim at the end. The run's lock serializes
the thread's claims and commits inside the process; the token serializes them across processes.

The logic is the plain class :class:`ThreadRun` (its commits in :mod:`~threadloom.actors.run_commits`), whose
methods run one at a time under the run's lock; :class:`ThreadActor` is the pykka shell that feeds it its messages.
Nodes run off the actor's thread, never under the lock (as tasks of the runtime's
:class:`~threadloom.actors.scheduler.Scheduler`), so renewals are never stuck behind a long node: a plain node's
task thread then commits the step itself and runs the next node (:mod:`~threadloom.actors.node_task`); an
``async def`` node's end comes back as a ``_NodeDone`` message. The actor never asks itself or waits on a future
of its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import pykka

from threadloom.actors import admission
from threadloom.actors import graph as g
from threadloom.actors._failures import (
    closed_under,
    error_kind,
    is_fatal,
    is_transient,
    store_closed,
)
from threadloom.actors.admission import Plan
from threadloom.actors.aio import is_async_callable
from threadloom.actors.graph import NodeContext, RunOutcome, Step
from threadloom.actors.logs import describe as _describe
from threadloom.actors.logs import log as _log
from threadloom.actors.node_task import Job, run_async_node, run_chain, run_node
from threadloom.actors.retention import retain_children
from threadloom.actors.run_commits import RunCommits, _PendingCommit, _RetryDue
from threadloom.actors.runs import RunEnv, RunHandle, RunSpec, _set
from threadloom.actors.scheduler import Cancellable
from threadloom.domain import validation as v
from threadloom.domain.errors import (
    CancelledError,
    RunFailed,
    StaleClaim,
    ThreadBusy,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    prevalidated_builder,
)

_build_checkpoint = prevalidated_builder(Checkpoint)
_build_event = prevalidated_builder(EventDraft)
_build_commit = prevalidated_builder(Commit)

# -- messages ---------------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _Begin:
    """Claim the thread and start the run."""


@attrs.frozen(eq=False)
class _RenewDue:
    """The renewal timer fired (``generation`` tells a stale timer from the current one)."""

    generation: int


@attrs.frozen(eq=False)
class _NodeDone:
    """A node execution ended: its step, or the error it raised."""

    step: int
    node: str
    ctx: NodeContext
    result: Step | None
    error: BaseException | None


@attrs.frozen(eq=False)
class _Cancel:
    """Stop the run at its next step boundary."""


@attrs.frozen(eq=False)
class _Ended:
    """The run ended on its node's thread: the actor stops (it has nothing more to do)."""


class ThreadRun(RunCommits):
    """The logic of one run on one thread: plain methods, each called under the run's :attr:`lock` - by the actor
    for its messages, or by a plain node's task thread finishing its step (:meth:`_finish_step`).

    Args:
        spec: what the run is asked to do.
        env: the runtime's store, clock, scheduler, ids and policy.
        handle: the handle whose futures the run resolves.
        send: delivers a message to this run's actor (called from timers and node tasks).
        ended: told once when the run ended, whatever the way (the supervisor's registry forgets it).
    """

    def __init__(
        self,
        spec: RunSpec,
        env: RunEnv,
        handle: RunHandle,
        send: Callable[[object], None],
        ended: Callable[[ThreadRun], None],
    ) -> None:
        self.spec = spec
        self.env = env
        self.handle = handle
        self._send = send
        self._ended = ended
        self.token: int | None = None
        self.base: Checkpoint | None = None  # the run's latest checkpoint: the parent of its next one
        self.state: Any = None  # the run's state (see _hand_state and _own_state)
        self._state_text: str | None = None  # its JSON text, when it is the state of a checkpoint this run built
        self._state_lent = False  # handed to a node as it is: read it back from _state_text
        self.next_node: str | None = None
        self.origin: CheckpointOrigin | None = spec.origin
        self.turn = spec.run_id  # the turn the run belongs to (see admission.Plan.turn)
        self.step = 0
        self.steps_run = 0
        self.in_flight = False
        self.lost: StaleClaim | None = None
        self.cancelled = False
        self.finished = False
        self._timer: Cancellable | None = None
        self._generation = 0
        self._pending: _PendingCommit | None = None
        self._retry_timer: Cancellable | None = None
        self._retry_generation = 0
        self._started_at: datetime | None = None
        self.lock = env.scheduler.lock()
        """Held by whoever runs the run's logic: the actor for each message, a node's thread finishing its step."""
        self._on_node_thread = False  # the node's thread is finishing its step: the next node continues there
        self._next_job: Job | None = None
        self._cancel_asked = False  # set at once by ask_cancel, from any thread (the _Cancel message comes later)
        self._node_job: tuple[Any, Any, NodeContext, int, str] | None = None  # what _run_node runs next
        self._execute: Job = self._run_node  # bound once: a run's node task runs it for every node
        self._checked_once = False  # a checkpoint of this run passed the public constructor (see _step_commit)
        self._async_nodes: dict[str, tuple[Any, bool]] = {}  # node -> (its function, whether it is async def)
        self._read_effect = lambda key: self.env.store.effect(spec.thread_id, key)  # a node's ctx reads effects so
        self._start_child = lambda thread_id, graph, input_, ctx: self.env.start_child(thread_id, graph, input_, ctx)
        self._log = _log.bind(
            thread_id=spec.thread_id, run_id=spec.run_id, tenant_id=spec.tenant_id, node_id=env.node_id
        )
        self._info = self._log.enabled_for(logging.INFO)

    # -- helpers ------------------------------------------------------------------------------------------------

    def _schedule_renewal(self) -> None:
        self._generation += 1
        generation = self._generation
        when = self.env.clock.now() + self.env.claim_policy.renew_every
        self._timer = self.env.scheduler.call_at(when, lambda: self._send(_RenewDue(generation)))

    def _stop_timer(self) -> None:
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop_retry()

    def _release(self) -> None:
        if self.token is None:
            return
        if store_closed(self.env.store):
            return  # nothing can be written any more: the claim expires by itself
        started = self.env.clock.now()
        try:
            self.env.store.release(self.spec.thread_id, self.token)
        except ThreadloomError as error:
            self._log.warning(
                "claim.release_failed",
                op="release",
                token=self.token,
                error=_describe(error),
                duration_ms=self._ms(started),
            )
            return
        self._log.info("claim.released", op="release", token=self.token, duration_ms=self._ms(started))

    def _event(self, type_: str, payload: Any, checkpoint_id: str | None, node: str | None = None) -> EventDraft:
        return EventDraft(
            run_id=self.spec.run_id,
            type=type_,
            timestamp=self.env.clock.now(),
            payload=payload,
            checkpoint_id=checkpoint_id,
            node_id=node,
        )

    def _checkpoint(
        self,
        *,
        step: int,
        status: CheckpointStatus,
        state: Any,
        next_node: str | None,
        node: str,
        extra: dict[str, str] | None = None,
        now: datetime | None = None,
    ) -> Checkpoint:
        metadata = {g.NEXT_KEY: next_node or "", g.STEP_KEY: str(step), g.NODE_KEY: node, g.TURN_KEY: self.turn}
        if extra:
            metadata.update(extra)
        if self._checked_once and not extra and type(state) is v.EncodedJson:
            # What is the same in every checkpoint of the run passed the constructor once; the state, the node and
            # the next node passed the step's (or the graph's): only the new id and the clock's reading are checked.
            spec, (text, copy) = self.spec, state.take()
            return _build_checkpoint(
                text,
                v.check_id("checkpoint.id", self.env.ids.checkpoint_id(spec.run_id, step)),
                self.base.id if self.base is not None else None,
                spec.thread_id,
                spec.run_id,
                status,
                v.check_aware("checkpoint.created_at", self.env.clock.now() if now is None else now),
                copy,
                spec.graph.graph_id,
                spec.tenant_id,
                None,  # fencing_token: the store stamps the commit's
                self.origin,
                metadata,
            )
        cp = Checkpoint(
            id=self.env.ids.checkpoint_id(self.spec.run_id, step),
            parent=self.base.id if self.base is not None else None,
            thread_id=self.spec.thread_id,
            run_id=self.spec.run_id,
            status=status,
            created_at=self.env.clock.now() if now is None else now,
            state=state,
            graph_id=self.spec.graph.graph_id,
            tenant_id=self.spec.tenant_id,
            origin=self.origin,
            metadata=metadata,
        )
        self._checked_once = True
        return cp

    # -- the run ------------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Claims the thread, checks it under the claim, admits the input (or notes the recovery), and starts
        the first node. A refusal resolves the handle with the error and ends the run."""
        spec, store = self.spec, self.env.store
        self._started_at = started = self.env.clock.now()
        try:
            claim = store.claim(
                spec.thread_id,
                ClaimRequest(holder=spec.run_id, ttl=self.env.claim_policy.ttl, tenant_id=spec.tenant_id),
            )
        except ThreadBusy as error:
            self._log.info("claim.busy", op="claim", holder=str(error.holder), duration_ms=self._ms(started))
            self._refuse(error)
            return
        except Exception as error:
            self._log.warning("claim.failed", op="claim", error=_describe(error), duration_ms=self._ms(started))
            self._refuse(error)
            return
        self.token = claim.token
        if claim.taken_over_from is not None:
            self.env.metrics.run("taken_over", spec.graph.graph_id)
            self._log.info(
                "claim.taken_over",
                op="claim",
                token=claim.token,
                taken_over_from=claim.taken_over_from,
                duration_ms=self._ms(started),
            )
        else:
            self._log.info("claim.granted", op="claim", token=claim.token, duration_ms=self._ms(started))
        self._schedule_renewal()
        try:
            plan = admission.plan(spec, store.latest(spec.thread_id))
            if spec.before_admit is not None:
                spec.before_admit()
            self._admit(plan)
        except Exception as error:
            if not self._own_claim_lost(error):
                self._release()  # a fence's StaleClaim is the parent's: this run still holds its thread
            self._refuse(error)
            return
        _set(self.handle._claimed, claim)
        self.env.metrics.run("recovered" if plan.mode == "recover" else "started", spec.graph.graph_id)
        self._log.info(
            "run.recovered" if plan.mode == "recover" else "run.started",
            op=plan.mode,
            token=self.token,
            graph_id=spec.graph.graph_id,
            graph_node=self.next_node,
            from_run=plan.base.run_id if plan.mode == "recover" and plan.base is not None else None,
        )
        self._dispatch()

    def _admit(self, plan: Plan) -> None:
        self.base, self.origin, self.turn = plan.base, plan.origin, plan.turn
        self.state, self.next_node = plan.state, plan.next_node
        assert self.token is not None
        if plan.mode == "recover":
            assert plan.base is not None
            payload = {"from_run": plan.base.run_id, "checkpoint_id": plan.base.id, "node": plan.next_node}
            event = self._event(g.EVENT_RUN_RECOVERED, payload, plan.base.id)
            self._commit(Commit(token=self.token, events=(event,), fence=self.spec.fence), None)
            return
        cp = self._checkpoint(
            step=0, status=CheckpointStatus.RUNNING, state=plan.state, next_node=plan.next_node, node=""
        )
        kind = g.EVENT_RUN_STARTED if plan.mode == "start" else g.EVENT_RUN_RESUMED
        event = self._event(kind, {"graph_id": self.spec.graph.graph_id, "node": plan.next_node}, cp.id)
        self._commit(Commit(token=self.token, checkpoint=cp, events=(event,), fence=self.spec.fence), None)
        self._keep_state(cp)

    def _keep_state(self, cp: Checkpoint, text: str | None = None) -> None:
        """Makes the state of ``cp``, a checkpoint this run built and committed, the run's base and state (``text``:
        the state's JSON text, when the caller has it at hand)."""
        self.base, self.state, self._state_lent = cp, cp.state, False
        self._state_text = cp.sealed_json() if text is None else text

    def _hand_state(self) -> Any:
        """The state the next node gets: the committed checkpoint's own copy as it is, once (its text keeps the
        state for a FAILED checkpoint, whatever the node does to it), else a fresh copy of the run's state."""
        if self._state_text is not None and not self._state_lent:
            self._state_lent = True
            return self.state
        return v.copy_json(self._own_state())

    def _own_state(self) -> Any:
        """The run's state as committed (decoded again from its text once a node was handed it)."""
        if self._state_lent:
            assert self._state_text is not None
            return v.scan_own(self._state_text)[0]
        return self.state

    def _dispatch(self) -> None:
        """Starts the next node off the actor's thread: a plain node on a task thread (the one that finished the
        previous step, when it is the caller), which then finishes its step; an async node on the runtime's loop,
        whose end comes back as ``_NodeDone``."""
        spec, graph = self.spec, self.spec.graph
        node = self.next_node
        assert node is not None and self.base is not None
        if graph.max_steps is not None and self.steps_run >= graph.max_steps:
            self.step += 1  # the FAILED checkpoint takes the next step's id
            self._fail_node(node, f"the run reached max_steps ({graph.max_steps}) of graph {graph.graph_id!r}", [], [])
            return
        self.step += 1
        step = self.step
        ctx = NodeContext(
            thread_id=spec.thread_id,
            run_id=spec.run_id,
            tenant_id=spec.tenant_id,
            node=node,
            step=step,
            checkpoint_id=self.env.ids.checkpoint_id(spec.run_id, step),
            parent_checkpoint_id=self.base.id,
            now=self.env.clock.now,
            read_effect=self._read_effect,
            start_child=self._start_child,
            token=self.token,
            turn_id=self.turn,
            record_intent=self._record_intent,
            max_json_size=getattr(self.env.store, "max_json_size", None),
        )
        fn = graph.nodes[node]
        state = self._hand_state()
        loop = self.env.loop
        self.in_flight = True
        known = self._async_nodes.get(node)
        if known is None or known[0] is not fn:  # remembered per node function: inspecting it costs a little
            known = self._async_nodes[node] = (fn, is_async_callable(fn))
        if loop is not None and known[1]:
            ctx.is_async = True
            send = self._send

            async def execute_async() -> None:
                """Runs the async node on the runtime's event loop and tells the actor how it ended."""
                result, error = await run_async_node(fn, state, ctx, graph, node)
                send(_NodeDone(step, node, ctx, result, error))

            loop.submit(execute_async())
            return

        self._node_job = (fn, state, ctx, step, node)  # one node in flight at a time: its job reads it once
        if self._on_node_thread:
            self._next_job = self._execute  # the node's thread that finished this step runs the next node as well
        else:
            execute = self._execute
            self.env.scheduler.spawn(f"node-{spec.thread_id}", lambda: run_chain(execute))

    def _run_node(self) -> Job | None:
        """Runs the plain node :meth:`_dispatch` set up, on the calling task thread, then finishes its step there
        (see :meth:`_finish_step`); returns the run's next node execution, or None."""
        job, self._node_job = self._node_job, None
        assert job is not None
        fn, state, ctx, step, node = job
        result, error = run_node(fn, state, ctx, self.spec.graph, node, self.env.loop)
        return self._finish_step(step, node, ctx, result, error)

    def _finish_step(
        self, step: int, node: str, ctx: NodeContext, result: Step | None, error: BaseException | None
    ) -> Job | None:
        """Handles a plain node's end on its own task thread, under the run's lock (as the actor would handle a
        ``_NodeDone``): commits the step and returns the run's next node execution for this thread to run, or None.

        A run that ended here tells its actor, which then stops (as after any message that ended the run).
        """
        with self.lock:
            self._on_node_thread = True
            try:
                self._node_ended(step, node, ctx, result, error)
            except Exception as error:  # a bug in the run's own code must still end the run cleanly
                self.crash(error)
            finally:
                self._on_node_thread = False
            job, self._next_job = self._next_job, None
            finished = self.finished
        if finished:
            self._send(_Ended())
            return None
        return job

    def _record_intent(self, record: EffectRecord) -> None:
        """Commits an effect's intent, fenced by the run's claim. Called on the node's thread, before the
        effect's function: a run that lost its thread gets ``StaleClaim`` here and never calls it."""
        assert self.token is not None
        started = self.env.clock.now()
        try:
            self.env.store.commit(self.spec.thread_id, Commit(token=self.token, effects=(record,)))
        except ThreadloomError as error:
            self._log.warning(
                "effect.intent_refused",
                op="commit",
                token=self.token,
                key=record.key,
                error=_describe(error),
                duration_ms=self._ms(started),
            )
            raise
        self._log.info("effect.intent", op="commit", token=self.token, key=record.key, duration_ms=self._ms(started))

    def node_done(self, message: _NodeDone) -> None:
        """Handles the ``_NodeDone`` of an async node (see :meth:`_node_ended`)."""
        self._node_ended(message.step, message.node, message.ctx, message.result, message.error)

    def _node_ended(
        self, step_no: int, node: str, ctx: NodeContext, result: Step | None, error: BaseException | None
    ) -> None:
        """Commits the node's step (or its failure) and goes on, ends, or stops as the run now must."""
        if self.finished or step_no != self.step:
            return
        self.in_flight = False
        if self.lost is not None:
            self._finish_error(self.lost, release=False)
            return
        events, effects = ctx._drain()
        if error is not None and (self.cancelled or self._cancel_asked):
            # Stopping (cancel or close) can make a node fail (a child run it waits for was cancelled too):
            # never commit FAILED for that; the thread stays incomplete and a recovery runs the node again.
            self._finish_error(CancelledError("run"), release=True)
            return
        if error is not None and is_transient(error, self.env.store):
            # The node failed because the store did (or a child thread was held by another run), not because
            # of its own logic: commit nothing, release, and leave the thread incomplete for a recovery to run
            # the node again (found by the simulation).
            self._log.warning("run.interrupted", op="run", token=self.token, graph_node=node, error=_describe(error))
            self._finish_error(error, release=True)
            return
        if error is not None and is_fatal(error, self.env.store):
            # The store is damaged or closed: not the node's fault, and no FAILED checkpoint could be written
            # either. End at once; the thread stays as it is, recoverable once the store is repaired.
            self._finish_error(error, release=True)
            return
        if error is not None:
            self._fail_node(node, _describe(error), events, effects, cause=error)
            return
        assert result is not None
        try:
            cp, commit, text = self._step_commit(node, ctx.task_id, result, events, effects)
        except Exception as failure:
            self._finish_error(failure, release=True)
            return
        # A step the store refuses as invalid (a record over max_json_size) would be refused on every retry
        # and by every recovery, which would run the node again: the run fails instead, without the step.
        self._commit_then(commit, node, self._step_applied, self._step_refused, (cp, result, text), cp.created_at)

    def _step_refused(self, refusal: ValidationError, cp: Checkpoint, step: Step, text: str) -> None:
        """The store refused a step's commit as invalid: the run fails at the step's node, without the step."""
        self._fail_node(cp.metadata[g.NODE_KEY], _describe(refusal), [], [], cause=refusal)

    def _step_commit(
        self, node: str, task_id: str, step: Step, events: list[EventDraft], effects: list[EffectRecord]
    ) -> tuple[Checkpoint, Commit, str]:
        """The commit of a node's step: its checkpoint, the node's events (emitted, then returned, then the run's
        end event) and effects; and the JSON text of the checkpoint's state.

        The step's state and event payloads were validated and encoded when the node built the step; they are
        not again. Once the run's first checkpoint passed the public constructor (its ids, tenant, origin and
        turn, the same in every checkpoint of the run), each later step checks only what is new in it - the
        checkpoint's id, the clock's reading, the task id - and builds the rest as it is (``prevalidated_builder``).
        """
        status = step.status
        state, payloads = step.encoded()
        now = self.env.clock.now()
        cp = self._checkpoint(step=self.step, status=status, state=state, next_node=step.next, node=node, now=now)
        spec = self.spec
        if self._checked_once:
            if payloads:
                v.check_id("event.task_id", task_id)
            for (kind, _payload), payload in zip(step.events, payloads, strict=True):
                text, copy = payload.take()
                events.append(_build_event(text, spec.run_id, kind, now, copy, cp.id, task_id, node))
        else:
            events += [
                EventDraft(run_id=spec.run_id, type=kind, timestamp=now, payload=payload, checkpoint_id=cp.id,
                           task_id=task_id, node_id=node)
                for (kind, _payload), payload in zip(step.events, payloads, strict=True)
            ]
        if status is CheckpointStatus.COMPLETED:
            events.append(self._event(g.EVENT_RUN_COMPLETED, {"steps": self.steps_run + 1}, cp.id, node))
        elif status is CheckpointStatus.SUSPENDED:
            events.append(self._event(g.EVENT_RUN_SUSPENDED, {"next": step.next}, cp.id, node))
        assert self.token is not None
        if self._checked_once:
            # token, checkpoint, pending_writes, events, effects, retract_turn, fence, metadata
            commit = _build_commit(self.token, cp, (), tuple(events), tuple(effects), False, None, None)
        else:
            commit = Commit(token=self.token, checkpoint=cp, events=events, effects=effects)
        return cp, commit, state.text

    def _step_applied(self, cp: Checkpoint, step: Step, text: str) -> None:
        """Goes on after a step's commit applied: the next node, the run's end, or the stop a cancel asked for."""
        status = step.status
        self._keep_state(cp, text)
        self.next_node = step.next
        self.steps_run += 1
        if status is not CheckpointStatus.RUNNING:
            self._finish_ok(status)
        elif self.cancelled or self._cancel_asked:
            self._finish_error(CancelledError("run"), release=True)
        else:
            self._dispatch()

    def _fail_node(
        self, node: str, message: str, events: list, effects: list, cause: BaseException | None = None
    ) -> None:
        """Commits a FAILED checkpoint (state unchanged, the node's events and effects kept) and ends the run.

        If the store refuses the node's events or effects as invalid (over ``max_json_size``), the FAILED
        checkpoint is committed without them.
        """
        error = RunFailed(self.spec.thread_id, self.spec.run_id, node, message)
        if cause is not None:
            error.__cause__ = cause
        try:
            cp = self._checkpoint(
                step=self.step,
                status=CheckpointStatus.FAILED,
                state=self._own_state(),
                next_node=node,
                node=node,
                extra={g.ERROR_KEY: message[:4000]},
            )
            drafts = list(events) + [
                self._event(g.EVENT_RUN_FAILED, {"node": node, "error": message[:4000]}, cp.id, node)
            ]
            assert self.token is not None
            commit = Commit(token=self.token, checkpoint=cp, events=drafts, effects=effects)
        except Exception as failure:
            self._finish_error(failure, release=True)
            return

        def applied() -> None:
            self.base = cp
            self._finish_error(error, release=True)

        def refused(_refusal: ValidationError) -> None:
            self._fail_node(node, message, [], [], cause=cause)

        self._commit_then(commit, node, applied, refused if events or effects else None)

    def renew_due(self, generation: int) -> None:
        """Renews the claim (the renewal timer fired); a ``StaleClaim`` marks the run lost."""
        if self.finished or generation != self._generation or self.token is None:
            return
        started = self.env.clock.now()
        try:
            self.env.store.renew(self.spec.thread_id, self.token, self.env.claim_policy.ttl)
        except StaleClaim as error:
            self._note_lost(error, "renew")
            if not self.in_flight:
                self._finish_error(error, release=False)
            return
        except ThreadloomError as error:
            if is_fatal(error, self.env.store):
                # The store is damaged or closed: the claim cannot be kept and no step could commit. End at once,
                # even with a node in flight (its step is dropped; a recovery runs the node again).
                self._log.error(
                    "claim.renew_failed",
                    op="renew",
                    token=self.token,
                    error=_describe(error),
                    error_kind=error_kind(error),
                )
                self._finish_error(error, release=True)
                return
            self._log.warning("claim.renew_failed", op="renew", token=self.token, error=_describe(error))
            self._schedule_renewal()
            return
        self._log.debug("claim.renewed", op="renew", token=self.token, duration_ms=self._ms(started))
        self._schedule_renewal()

    def ask_cancel(self) -> None:
        """Asks the run to stop at its next step boundary (the handle's ``cancel``; any thread). A step that ends
        after this returned sees it at once, even on its node's thread; the actor then handles ``_Cancel``."""
        self._cancel_asked = True
        self._send(_Cancel())

    def cancel(self) -> None:
        """Stops the run at its next step boundary (at once when no node is in flight, and during the pause
        before a commit is tried again: that step is dropped)."""
        if self.finished:
            return
        self.cancelled = True
        if not self.in_flight:
            self._finish_error(CancelledError("run"), release=True)

    def crash(self, error: BaseException) -> None:
        """Ends the run after an unexpected error in the actor's own code (a bug): releases, fails the handle."""
        self._log.error("run.crashed", error=_describe(error))
        if not self.finished:
            self._finish_error(error, release=self.lost is None)

    def shutdown(self) -> None:
        """Ends a run still going when its actor stops: releases the claim; the handle says ``CancelledError``."""
        if self.finished:
            return
        self._finish_error(CancelledError("run"), release=self.lost is None)

    # -- endings ------------------------------------------------------------------------------------------------

    def _refuse(self, error: BaseException) -> None:
        self.finished = True
        if is_fatal(error, self.env.store):
            error = self._reported(error)
            self.env.metrics.run("failed", self.spec.graph.graph_id)
            self._log.error(
                "run.failed",
                op=self.spec.kind.value,
                error=_describe(error),
                error_type=type(error).__name__,
                error_kind=error_kind(error),
                steps=0,
            )
        else:
            self._log.info(
                "run.refused", op=self.spec.kind.value, error=_describe(error), error_type=type(error).__name__
            )
        self._stop_timer()
        _set(self.handle._claimed, error=error)
        _set(self.handle._done, error=error)
        self._ended(self)

    def _finish_ok(self, status: CheckpointStatus) -> None:
        self.finished = True
        self._stop_timer()
        self._retain_children()
        if self.lost is None:  # retention can find the claim lost: then there is nothing to release
            self._release()
        assert self.base is not None
        outcome = RunOutcome(
            thread_id=self.spec.thread_id,
            run_id=self.spec.run_id,
            status=status,
            state=v.copy_json(self._own_state()),
            checkpoint_id=self.base.id,
            steps=self.steps_run,
            next=self.next_node if status is CheckpointStatus.SUSPENDED else None,
        )
        completed = status is CheckpointStatus.COMPLETED
        self.env.metrics.run("completed" if completed else "suspended", self.spec.graph.graph_id)
        self._log.info(
            "run.completed" if completed else "run.suspended",
            op="run",
            token=self.token,
            status=status.value,
            steps=self.steps_run,
            checkpoint_id=self.base.id,
            duration_ms=self._ms(self._started_at) if self._started_at else None,
        )
        _set(self.handle._done, outcome)
        self._ended(self)

    def _retain_children(self) -> None:
        """Applies the graph's child retention under the run's claim, before it is released.

        It never changes how the run ended: a failure (the parent's claim lost, the store failing) is logged as
        ``retention.stopped`` and the rest is left to the next run's end.
        """
        policy = self.spec.graph.child_retention
        if policy is None or self.token is None:
            return
        started = self.env.clock.now()
        try:
            deleted = retain_children(
                self.env,
                policy,
                parent=self.spec.thread_id,
                token=self.token,
                run_id=self.spec.run_id,
                tenant_id=self.spec.tenant_id,
                log=self._log,
            )
        except Exception as error:  # noqa: BLE001 - the run's outcome is committed: report, never fail it
            if self._own_claim_lost(error):
                assert isinstance(error, StaleClaim)
                self._note_lost(error, "retention")
            self._log.warning(
                "retention.stopped",
                op="delete_thread",
                token=self.token,
                error=_describe(error),
                error_kind=error_kind(error),
                duration_ms=self._ms(started),
            )
            return
        if deleted:
            self._log.info(
                "retention.applied", op="delete_thread", token=self.token, deleted=len(deleted),
                duration_ms=self._ms(started),
            )

    def _reported(self, error: BaseException) -> BaseException:
        """The error the handle raises: a failure of a store closed under the run says so (``StoreClosed``)."""
        what = f"run {self.spec.run_id!r} of thread {self.spec.thread_id!r}"
        advice = "the thread stays as its last commit left it: recover it with a runtime over an open store"
        return closed_under(error, self.env.store, what, advice)

    def _finish_error(self, error: BaseException, *, release: bool) -> None:
        """Ends the run with ``error``; a fatal store failure (damaged or closed store) is logged at error level."""
        self.finished = True
        self._stop_timer()
        fatal = is_fatal(error, self.env.store)
        if fatal:
            error = self._reported(error)
        if release:
            self._release()
        timing = {"steps": self.steps_run, "duration_ms": self._ms(self._started_at) if self._started_at else None}
        if isinstance(error, CancelledError) and not fatal:
            # Cancelled by a stop or close: not a failure; the thread stays incomplete for a recovery.
            self.env.metrics.run("stopped", self.spec.graph.graph_id)
            self._log.info("run.stopped", op="run", token=self.token, reason="cancelled", **timing)
        else:
            self.env.metrics.run("failed", self.spec.graph.graph_id)
            (self._log.error if fatal else self._log.warning)(
                "run.failed",
                op="run",
                token=self.token,
                error=_describe(error),
                error_type=type(error).__name__,
                error_kind=error_kind(error),
                **timing,
            )
        _set(self.handle._claimed, error=error)
        _set(self.handle._done, error=error)
        self._ended(self)


class ThreadActor(pykka.ThreadingActor):
    """The pykka actor of one run: feeds :class:`ThreadRun` its messages, one at a time, on its own thread.

    Started by the :class:`~threadloom.actors.supervisor.Supervisor`, which keeps its reference; it stops itself
    once its run ended and tells the supervisor through ``on_ended``.
    """

    use_daemon_thread = True  # a host that never calls close() still exits; its claims then expire

    def __init__(self, spec: RunSpec, env: RunEnv, handle: RunHandle, on_ended: Callable[[str], None]) -> None:
        super().__init__()
        ref = self.actor_ref
        self._env = env
        self._stopping = False

        def send(message: object) -> None:
            try:
                ref.tell(message)
            except pykka.ActorDeadError:
                pass  # the run ended already: a late timer or node result has nothing to do

        self.run = ThreadRun(spec, env, handle, send, lambda run: on_ended(run.spec.run_id))
        handle._cancel = self.run.ask_cancel

    def on_start(self) -> None:
        """Runs on the actor's own thread before its first message: makes the thread known for shutdown.

        The run itself begins with the ``_Begin`` message, so a refused claim is handled like any message.
        """
        self._env.track_thread(threading.current_thread())

    def on_receive(self, message: Any) -> Any:
        """Runs on the actor's own thread, one message at a time: hands the message to the run, under its lock."""
        run = self.run
        with run.lock:
            try:
                if isinstance(message, _Begin):
                    run.begin()
                elif isinstance(message, _RenewDue):
                    run.renew_due(message.generation)
                elif isinstance(message, _NodeDone):
                    run.node_done(message)
                elif isinstance(message, _Cancel):
                    run.cancel()
                elif isinstance(message, _RetryDue):
                    run.retry_due(message.generation)
            except Exception as error:  # a bug in the run's own code must still end the run cleanly
                run.crash(error)
        if run.finished and not self._stopping:
            self._stopping = True
            self.stop()
        return None

    def on_stop(self) -> None:
        """Runs on the actor's own thread just before it exits: ends a run still going (releasing its claim)."""
        with self.run.lock:
            self.run.shutdown()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """Runs on the actor's own thread after an unhandled error, just before it exits: as :meth:`on_stop`."""
        with self.run.lock:
            self.run.shutdown()


BEGIN = _Begin()
"""The message that starts a :class:`ThreadActor`'s run (sent by the supervisor)."""
