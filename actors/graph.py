"""Graphs in plain Python: named nodes, each ``node(state, ctx) -> Step``.

One node execution is one superstep and one commit: the run commits the node's new state, the next node to
run (in the checkpoint's metadata, so a recovered run continues there), the events the node emitted and the
effect records of the side effects it ran, all in one fenced commit.

Example::

    def fetch(state, ctx):
        page = ctx.effect("fetch:1", lambda: http_get(state["url"]))   # runs once, even across takeovers
        ctx.emit("fetched", {"size": len(page)})
        return Step.to("summarize", {**state, "page": page})

    def summarize(state, ctx):
        return Step.end({**state, "summary": state["page"][:100]})

    graph = Graph("summarizer", {"fetch": fetch, "summarize": summarize}, entry="fetch")
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from threadloom.actors.policies import ChildRetention
from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError
from threadloom.domain.values import CheckpointOrigin, CheckpointStatus, EffectRecord, EventDraft

if TYPE_CHECKING:
    from threadloom.actors.runs import RunHandle

NEXT_KEY = "threadloom.next"
"""Checkpoint metadata key: the node a run continues at ("" once the run ended)."""
STEP_KEY = "threadloom.step"
"""Checkpoint metadata key: the run's superstep that committed the checkpoint (0: the admission)."""
NODE_KEY = "threadloom.node"
"""Checkpoint metadata key: the node whose execution committed the checkpoint ("" for an admission)."""
ERROR_KEY = "threadloom.error"
"""Checkpoint metadata key of a FAILED checkpoint: the node's error."""

EVENT_RUN_STARTED = "threadloom.run_started"
EVENT_RUN_RESUMED = "threadloom.run_resumed"
EVENT_RUN_RECOVERED = "threadloom.run_recovered"
EVENT_RUN_COMPLETED = "threadloom.run_completed"
EVENT_RUN_SUSPENDED = "threadloom.run_suspended"
EVENT_RUN_FAILED = "threadloom.run_failed"
RUN_EVENTS = frozenset(
    {
        EVENT_RUN_STARTED,
        EVENT_RUN_RESUMED,
        EVENT_RUN_RECOVERED,
        EVENT_RUN_COMPLETED,
        EVENT_RUN_SUSPENDED,
        EVENT_RUN_FAILED,
    }
)
"""The event types the runtime itself writes into a thread's log, beside the nodes' own."""
END_EVENTS = frozenset({EVENT_RUN_COMPLETED, EVENT_RUN_SUSPENDED, EVENT_RUN_FAILED})
"""The run events that end a run's part of the log."""
RESERVED_EVENT_PREFIX = "threadloom."
"""Event types a node may not use: the runtime's own (``RUN_EVENTS``, and any it adds later)."""


def _node_event_type(field: str, value: Any) -> str:
    """A node's event type: an id outside the runtime's reserved ``threadloom.`` names."""
    kind = v.check_id(field, value)
    if kind.startswith(RESERVED_EVENT_PREFIX):
        raise ValidationError(field, (f"{kind!r}: types starting {RESERVED_EVENT_PREFIX!r} are the runtime's own",))
    return kind


def _events(value: Any) -> tuple[tuple[str, Any], ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValidationError("step.events", ("must be a sequence of (type, payload) pairs",))
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValidationError(f"step.events[{index}]", ("must be a (type, payload) pair",))
        kind = _node_event_type(f"step.events[{index}] type", item[0])
        out.append((kind, v.check_json(f"step.events[{index}]", item[1])))
    return tuple(out)


@attrs.frozen(kw_only=True)
class Step:
    """What a node returns: the new state, the node to run next (None: the run ends) and events.

    Attributes:
        state: the thread's new state (JSON).
        next: the next node, or None to end the run ``COMPLETED``.
        suspended: end the run ``SUSPENDED`` instead; ``GraphRuntime.resume`` continues at ``next`` with new
            input.
        events: ``(type, payload)`` pairs committed after the events the node emitted with ``ctx.emit``; a type
            starting ``threadloom.`` (the runtime's own events) is a ValidationError.
    """

    state: Any = attrs.field(validator=lambda _i, _a, value: v.check_json("step.state", value))
    next: str | None = attrs.field(
        default=None, validator=lambda _i, _a, value: v.check_optional_id("step.next", value)
    )
    suspended: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    events: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_events)

    def __attrs_post_init__(self) -> None:
        if self.suspended and self.next is None:
            raise ValidationError("step.next", ("a suspended step names the node to resume at",))

    @classmethod
    def to(cls, node: str, state: Any, *, events: Any = ()) -> Step:
        """Go on at ``node`` with ``state``."""
        return cls(state=state, next=node, events=events)

    @classmethod
    def end(cls, state: Any, *, events: Any = ()) -> Step:
        """End the run ``COMPLETED`` with ``state``."""
        return cls(state=state, events=events)

    @classmethod
    def suspend(cls, node: str, state: Any, *, events: Any = ()) -> Step:
        """End the run ``SUSPENDED`` with ``state``; ``resume`` continues at ``node``."""
        return cls(state=state, next=node, suspended=True, events=events)

    @property
    def status(self) -> CheckpointStatus:
        """The status of the checkpoint this step commits."""
        if self.next is None:
            return CheckpointStatus.COMPLETED
        return CheckpointStatus.SUSPENDED if self.suspended else CheckpointStatus.RUNNING


Node = Callable[[Any, "NodeContext"], Step]
"""A graph node: ``node(state, ctx) -> Step``. It runs off the actor's thread; it may block."""


def merge_input(state: Any, input: Any) -> Any:  # noqa: A002 - the public name
    """The default way a run's input enters the state: the input alone for a new thread; two dicts merge
    (the input's keys win); otherwise the input replaces the state. ``None`` input keeps the state."""
    if state is None:
        return input if input is not None else {}
    if input is None:
        return state
    if isinstance(state, dict) and isinstance(input, dict):
        return {**state, **input}
    return input


class Graph:
    """A graph of named nodes.

    Args:
        graph_id: the kind of graph (stored as each checkpoint's ``graph_id``; ``serve`` finds it by this id).
        nodes: node name → ``node(state, ctx) -> Step``.
        entry: the node a new run starts at.
        merge: ``merge(state, input) -> state``: how a start's or a resume's input enters the state
            (default :func:`merge_input`); ``state`` is None for a new thread. It runs on copies, before anything
            is committed: an exception it raises refuses the run with a ValidationError on ``input``.
        max_steps: a run that executes more nodes than this fails (default None: no limit).
        child_retention: which children of a thread to keep when a run of this graph on it ends
            ``COMPLETED`` or ``SUSPENDED`` (default None: every child is kept until it is deleted). See
            :class:`~threadloom.actors.policies.ChildRetention` and the README's "Child retention".

    Raises:
        ValidationError: a bad id, no nodes, a node that is not callable, ``entry`` not a node, a
            ``child_retention`` that is not a ChildRetention.
    """

    def __init__(
        self,
        graph_id: str,
        nodes: Mapping[str, Node],
        *,
        entry: str,
        merge: Callable[[Any, Any], Any] = merge_input,
        max_steps: int | None = None,
        child_retention: ChildRetention | None = None,
    ) -> None:
        self.graph_id = v.check_id("graph_id", graph_id)
        if not isinstance(nodes, Mapping) or not nodes:
            raise ValidationError("nodes", ("must be a non-empty mapping of node name to node function",))
        for name, fn in nodes.items():
            v.check_id("nodes key", name)
            if not callable(fn):
                raise ValidationError(f"nodes[{name!r}]", ("must be callable as node(state, ctx) -> Step",))
        self.nodes: dict[str, Node] = dict(nodes)
        if v.check_id("entry", entry) not in self.nodes:
            raise ValidationError("entry", (f"{entry!r} is not one of the graph's nodes",))
        self.entry = entry
        if not callable(merge):
            raise ValidationError("merge", ("must be callable as merge(state, input) -> state",))
        self.merge = merge
        if max_steps is not None:
            v.check_int("max_steps", max_steps, low=1)
        self.max_steps = max_steps
        if child_retention is not None and not isinstance(child_retention, ChildRetention):
            raise ValidationError(
                "child_retention", (f"must be a ChildRetention, got {type(child_retention).__name__}",)
            )
        self.child_retention = child_retention

    def __repr__(self) -> str:
        return f"Graph({self.graph_id!r}, nodes={sorted(self.nodes)}, entry={self.entry!r})"


class NodeContext:
    """What a node can do besides returning its step: emit events, run effects once, start child runs.

    A context belongs to one node execution (one superstep); it is used on the thread that runs the node.

    Attributes:
        thread_id, run_id, tenant_id: the run's.
        node: the node being executed.
        step: the run's superstep (1 for the first node this run executes).
        checkpoint_id: the id of the checkpoint this step will commit.
        parent_checkpoint_id: the checkpoint the step started from (the latest when the node began).
    """

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        tenant_id: str | None,
        node: str,
        step: int,
        checkpoint_id: str,
        parent_checkpoint_id: str | None,
        now: Callable[[], datetime],
        read_effect: Callable[[str], EffectRecord | None],
        start_child: Callable[..., RunHandle],
        token: int | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.node = node
        self.step = step
        self.checkpoint_id = checkpoint_id
        self.parent_checkpoint_id = parent_checkpoint_id
        self._now = now
        self._read_effect = read_effect
        self._start_child = start_child
        self._token = token  # the run's claim on this thread: it fences a child's admission
        self._events: list[EventDraft] = []
        self._effects: dict[str, EffectRecord] = {}

    @property
    def task_id(self) -> str:
        """This node execution's task id, ``<step>:<node>`` (on its events, effects and children's origins)."""
        return f"{self.step}:{self.node}"

    def emit(self, type: str, payload: Any = None) -> None:  # noqa: A002 - the event's field name
        """Adds an event to this step's commit (numbered by the store when the step commits).

        Raises:
            ValidationError: ``type`` is not an id or starts ``threadloom.`` (the runtime's own events), or
                ``payload`` is not JSON (the node then fails).
        """
        self._events.append(
            EventDraft(
                run_id=self.run_id,
                type=_node_event_type("type", type),
                timestamp=self._now(),
                payload=copy.deepcopy(payload),
                checkpoint_id=self.checkpoint_id,
                task_id=self.task_id,
                node_id=self.node,
            )
        )

    def effect(self, key: str, fn: Callable[[], Any]) -> Any:
        """Runs ``fn()`` once per ``key`` on this thread, across crashes and takeovers.

        If the thread holds an effect record under ``key`` (a step that called it committed, in this run or an
        earlier one), its recorded result is returned and ``fn`` is not called. Otherwise ``fn`` runs and its
        result is recorded in this step's commit, first-wins by key. ``fn`` runs again only when the step that
        called it never committed (the process died, or the run lost its claim, before the commit).

        Returns:
            ``fn``'s result (a JSON value), or the recorded one.

        Raises:
            ValidationError: a bad ``key``, or ``fn`` returned something that is not JSON.
            Whatever ``fn`` raises (nothing is recorded; the node fails unless it catches it).
        """
        v.check_id("key", key)
        if key in self._effects:
            return copy.deepcopy(self._effects[key].result)
        recorded = self._read_effect(key)
        if recorded is not None:
            return recorded.result
        result = fn()
        v.check_json(f"effect {key!r} result", result)
        self._effects[key] = EffectRecord(
            key=key,
            run_id=self.run_id,
            recorded_at=self._now(),
            result=copy.deepcopy(result),
            checkpoint_id=self.checkpoint_id,
            task_id=self.task_id,
        )
        return result

    def spawn(self, thread_id: str, graph: Graph, input: Any = None) -> RunHandle:  # noqa: A002
        """Starts a child run of ``graph`` on child thread ``thread_id``, for this run's tenant.

        Runs on the thread that runs this node (it blocks this node only). The child's checkpoints carry
        ``CheckpointOrigin(parent_thread=this thread, parent_checkpoint=the checkpoint this step started from,
        task_id=this task)``, so ``children`` lists it and a cascade delete of this thread removes it.

        A child this same step spawned in an earlier execution — the step did not commit because its process
        died or its run was cancelled, and a recovered run executes the node again from the same checkpoint — is
        taken up instead of started again:

        * latest checkpoint COMPLETED (and its origin names this step's checkpoint): its outcome is returned
          without running anything; the handle is already done (its ``run_id`` is the child run that completed).
        * latest checkpoint RUNNING (its origin names this thread and, where it records them, this step's
          checkpoint and node): the child is recovered as ``GraphRuntime.recover`` does, its committed nodes and
          effects not run again. A claim left by a run that is not live in this runtime (a dead process's) is
          waited out: the spawn asks again every
          :data:`~threadloom.actors.runtime.CHILD_BUSY_RETRY` by the runtime's clock, for at most the runtime's
          ``claim_policy.ttl`` after the first refusal.

        Any other child starts as ``GraphRuntime.start`` does (a new thread, a new turn of a settled one, or a
        resume of a suspended one) — a child this step left SUSPENDED or FAILED included.

        The child run's first commit (its admission, or the note of its recovery) is fenced by this run's claim
        on this thread (``Commit.fence``): a run that lost its thread — to a takeover, or to a delete
        — cannot start or take up a child, and leaves no child thread behind for its successor to trip over.

        So a node may spawn and wait for a child and still execute again after a crash. The usual pattern also
        records the child's result with the step, so any later use of the key reads it:
        ``ctx.effect("child", lambda: ctx.spawn("c1", g, x).wait().state)``.

        Returns:
            The child's run handle; ``wait()`` on it blocks this node only.

        Raises:
            ThreadBusy: as ``GraphRuntime.start``; for a child being recovered, only once its claim outlived the
                wait above (or is held by a run live in this runtime, or by another tenant's).
            InvalidRunState: as ``GraphRuntime.start`` — e.g. the child is RUNNING and was not spawned by this
                step (recover it yourself), or runs another graph.
            StaleClaim: this run no longer holds its thread (the fence refused the child's first commit; nothing
                was written to the child). The node ends without a FAILED checkpoint, as on any StaleClaim.
            CancelledError: the runtime closed while the spawn waited for the child's claim.
            TenantMismatch, ValidationError, ProcessingError: as ``GraphRuntime.start``; ``thread_id`` is this
                thread (ValidationError).
        """
        return self._start_child(thread_id, graph, input, self)

    def _child_origin(self) -> CheckpointOrigin:
        """The origin a child spawned by this step carries."""
        return CheckpointOrigin(
            parent_thread=self.thread_id, parent_checkpoint=self.parent_checkpoint_id, task_id=self.task_id
        )

    def _fence(self) -> tuple[str, int] | None:
        """The fence a child's first commit carries: this thread and the run's token (None outside a run)."""
        return (self.thread_id, self._token) if self._token is not None else None

    def _spawned_here(self, origin: CheckpointOrigin | None, *, exact: bool = False) -> bool:
        """True when ``origin`` names this step: this thread, and — where it records them — the checkpoint the
        step started from and this node. ``exact`` also requires it to record that checkpoint.

        The step number in ``task_id`` is not compared: a recovered run numbers its steps afresh, while the
        checkpoint a re-executed step starts from is the one the first execution started from.
        """
        if origin is None or origin.parent_thread != self.thread_id:
            return False
        if origin.parent_checkpoint is None:
            if exact:
                return False
        elif origin.parent_checkpoint != self.parent_checkpoint_id:
            return False
        return origin.task_id is None or origin.task_id.partition(":")[2] == self.node

    def _drain(self) -> tuple[list[EventDraft], list[EffectRecord]]:
        return list(self._events), list(self._effects.values())


@attrs.frozen(kw_only=True)
class RunOutcome:
    """How a run ended when it ended well: ``COMPLETED`` or ``SUSPENDED``.

    Attributes:
        thread_id, run_id: the run's.
        status: ``CheckpointStatus.COMPLETED`` or ``CheckpointStatus.SUSPENDED``.
        state: the state of the run's last checkpoint.
        checkpoint_id: the id of that checkpoint.
        steps: how many nodes this run executed (a recovered run counts only its own).
        next: the node a resume continues at (SUSPENDED only), else None.
    """

    thread_id: str
    run_id: str
    status: CheckpointStatus
    state: Any
    checkpoint_id: str
    steps: int
    next: str | None = None
