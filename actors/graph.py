"""Graphs in plain Python: named nodes, each ``node(state, ctx) -> Step``.

One node execution is one superstep and one commit: the run commits the node's new state, the next node to
run (in the checkpoint's metadata, so a recovered run continues there), the events the node emitted and the
effect records of the side effects it ran, all in one fenced commit.

Example::

    def fetch(state, ctx):
        # recorded once per turn; a crash before the step committed may call it again, with the same key
        page = ctx.effect("fetch", lambda idempotency_key: http_get(state["url"], idempotency_key))
        ctx.emit("fetched", {"size": len(page)})
        return Step.to("summarize", {**state, "page": page})

    def summarize(state, ctx):
        return Step.end({**state, "summary": state["page"][:100]})

    graph = Graph("summarizer", {"fetch": fetch, "summarize": summarize}, entry="fetch")
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import attrs

from threadloom.actors.aio import is_async_callable, refuse_async_effect
from threadloom.actors.logs import log as _log
from threadloom.actors.policies import ChildRetention
from threadloom.domain import validation as v
from threadloom.domain.errors import EffectMayHaveRun, ValidationError
from threadloom.domain.values import CheckpointOrigin, CheckpointStatus, EffectRecord, EventDraft
from threadloom.persistence.encoded import encode_effect

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
TURN_KEY = "threadloom.turn"
"""Checkpoint metadata key: the turn the checkpoint belongs to — the RunId of the ``start`` or ``resume`` that
began it. A ``recover`` continues the turn of the checkpoint it recovers from (see :meth:`NodeContext.effect`)."""

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


EffectScope = Literal["turn", "thread"]
"""What an effect key names: one effect of one turn (``"turn"``, the default) or of the whole thread."""

_EFFECT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "threadloom:effect")
INTENT_SUFFIX = "/intent"
"""The end of an effect's intent record key: its record key with this suffix."""


@attrs.frozen
class EffectKeys:
    """The keys one effect goes by (see :func:`effect_keys`).

    Attributes:
        record: the effect record holding its result (``store.effect(thread_id, record)``).
        intent: the effect record written before ``fn`` is called (its result names the effect).
        idempotency: the idempotency key ``fn`` receives: a UUID string (36 characters), the same on every
            execution of this effect, different for every other effect.
    """

    record: str
    intent: str
    idempotency: str


def effect_keys(thread_id: str, key: str, *, turn_id: str | None = None) -> EffectKeys:
    """The keys of effect ``key`` on ``thread_id``: of the turn ``turn_id``, or thread-wide when it is None.

    ``ctx.effect(key, fn)`` uses ``turn_id=ctx.turn_id``; ``ctx.effect(key, fn, scope="thread")`` uses None.
    The idempotency key is a name-based UUID (version 5) of the thread id, the turn (or none) and the key, so
    anyone can compute it again: a turn's keys never repeat (a turn is named by a fresh RunId); a thread-wide
    key repeats for a thread id used again (after a delete, or in another store).

    The record key is ``"<key>@<idempotency>"`` (``key`` cut to fit 255 characters), the intent's
    ``"<key>@<idempotency>/intent"``.

    Raises:
        ValidationError: ``thread_id``, ``key`` or ``turn_id`` is not an id.
    """
    v.check_id("thread_id", thread_id)
    v.check_id("key", key)
    v.check_optional_id("turn_id", turn_id)
    name = json.dumps(["turn" if turn_id is not None else "thread", thread_id, turn_id or "", key])
    idempotency = str(uuid.uuid5(_EFFECT_NAMESPACE, name))
    room = v.MAX_ID_LENGTH - len(idempotency) - 1 - len(INTENT_SUFFIX)
    record = f"{key[:room]}@{idempotency}"
    return EffectKeys(record=record, intent=record + INTENT_SUFFIX, idempotency=idempotency)


def _effect_call(fn: Any) -> Callable[[str], Any]:
    """``fn`` as a function of the idempotency key: passed as its one required positional argument, or by
    keyword to a parameter named ``idempotency_key``; a function of no argument is called without it.

    Raises:
        ValidationError: ``fn`` is not callable, or needs more than one argument.
    """
    if not callable(fn):
        raise ValidationError("fn", ("must be callable as fn() or fn(idempotency_key)",))
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called as it always was, without a key
        return lambda _key: fn()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.default is p.empty and p.kind in (*positional, p.KEYWORD_ONLY)]
    if len(required) == 1 and required[0].kind in positional:
        return lambda key: fn(key)
    if len(required) == 1 and required[0].name == "idempotency_key" or not required and any(
        p.name == "idempotency_key" and p.kind is not p.POSITIONAL_ONLY for p in parameters
    ):
        return lambda key: fn(idempotency_key=key)
    if not required:
        return lambda _key: fn()
    raise ValidationError("fn", ("must be callable as fn() or fn(idempotency_key): it needs more arguments",))


def _check_on_uncertain(on_uncertain: Any) -> None:
    """Checks ``ctx.effect``'s ``on_uncertain`` up front: ``"repeat"``, ``"raise"``, or a callable that takes the
    idempotency key as its one positional argument (it is called only on a re-execution, during a recovery).

    Raises:
        ValidationError: naming ``on_uncertain``.
    """
    if isinstance(on_uncertain, str) and on_uncertain in ("repeat", "raise"):
        return
    if not callable(on_uncertain):
        raise ValidationError("on_uncertain", ("must be 'repeat', 'raise' or a callable of the idempotency key",))
    try:
        signature = inspect.signature(on_uncertain)
    except (TypeError, ValueError):  # a builtin without a signature: called as given
        return
    try:
        signature.bind("idempotency-key")
    except TypeError as error:
        raise ValidationError(
            "on_uncertain", (f"must be callable as on_uncertain(idempotency_key), one positional argument: {error}",)
        ) from None


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
        out.append((_node_event_type(f"step.events[{index}] type", item[0]), item[1]))
    return tuple(out)  # the payloads are validated (and encoded, once) by Step.__attrs_post_init__


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

    state: Any
    next: str | None = attrs.field(
        default=None, validator=lambda _i, _a, value: v.check_optional_id("step.next", value)
    )
    suspended: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    events: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_events)
    _state_json: v.EncodedJson = attrs.field(init=False, eq=False, repr=False)
    """The state, validated and encoded once: the step's checkpoint takes it as it is."""
    _payloads_json: tuple[v.EncodedJson, ...] = attrs.field(init=False, eq=False, repr=False)
    """The events' payloads, likewise, in order."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_state_json", v.EncodedJson("step.state", self.state))
        payloads = tuple(v.EncodedJson(f"step.events[{i}]", payload) for i, (_kind, payload) in enumerate(self.events))
        object.__setattr__(self, "_payloads_json", payloads)
        if self.suspended and self.next is None:
            raise ValidationError("step.next", ("a suspended step names the node to resume at",))

    def encoded(self) -> tuple[v.EncodedJson, tuple[v.EncodedJson, ...]]:
        """The state and the events' payloads as validated and encoded when the step was built (the runtime builds
        the step's checkpoint and events from them, so nothing is validated twice); each is taken once."""
        return self._state_json, self._payloads_json

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


Node = Callable[[Any, "NodeContext"], Any]
"""A graph node: ``node(state, ctx) -> Step``, run on a task thread of its own (it may block), or
``async def node(state, ctx) -> Step``, run on the runtime's event loop (README "asyncio"; it must not block).
Neither runs on an actor's thread."""


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
        nodes: node name → ``node(state, ctx) -> Step`` or ``async def node(state, ctx) -> Step`` (both kinds
            may mix in one graph; README "asyncio").
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
    """What a node can do besides returning its step: emit events, run and record effects, start child runs.

    A context belongs to one node execution (one superstep); it is used on the thread that runs the node.

    Attributes:
        thread_id, run_id, tenant_id: the run's.
        turn_id: the turn the run belongs to: the RunId of the ``start`` or ``resume`` that began it (a
            ``recover`` continues the turn of the run it recovers, so this is then an earlier run's id).
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
        turn_id: str | None = None,
        record_intent: Callable[[EffectRecord], None] | None = None,
        max_json_size: int | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.turn_id = turn_id if turn_id is not None else run_id
        self.tenant_id = tenant_id
        self.node = node
        self.step = step
        self.checkpoint_id = checkpoint_id
        self.parent_checkpoint_id = parent_checkpoint_id
        self._now = now
        self._read_effect = read_effect
        self._record_intent = record_intent
        self._max_json_size = max_json_size  # the store's: an effect record longer than this is never committed
        self._start_child = start_child
        self._token = token  # the run's claim on this thread: it fences a child's admission
        self._events: list[EventDraft] = []
        self._effects: dict[str, EffectRecord] = {}
        self._awaitables: list[tuple[str, Any]] = []  # (key, coroutine) of each async ctx.effect, to check awaited
        self.is_async = False  # the node is ``async def``: ctx.effect may take an async function (README "asyncio")

    def check_effects_awaited(self) -> None:
        """Refuses the step of an async node that called ``ctx.effect`` with an async function and never awaited
        what it returned: the effect never ran and nothing was recorded (found by hostile testing: the run
        completed, with only Python's "never awaited" warning).

        Raises:
            ValidationError: naming the node and the effect's key; the node fails, nothing of its step committed.
        """
        pending = [key for key, awaitable in self._awaitables if inspect.getcoroutinestate(awaitable) == "CORO_CREATED"]
        for _key, awaitable in self._awaitables:
            if inspect.getcoroutinestate(awaitable) == "CORO_CREATED":
                awaitable.close()  # never started: no "never awaited" warning on top of this error
        self._awaitables.clear()
        if pending:
            raise ValidationError(
                "effect",
                (f"node {self.node!r} called ctx.effect({pending[0]!r}, ...) with an async function and did not "
                 "await it: the effect never ran; write 'await ctx.effect(...)'",),
            )  # fmt: skip

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
                payload=payload,  # the constructor keeps a copy of its own (and validates it)
                checkpoint_id=self.checkpoint_id,
                task_id=self.task_id,
                node_id=self.node,
            )
        )

    def effect(
        self,
        key: str,
        fn: Callable[[], Any] | Callable[[str], Any],
        *,
        scope: EffectScope = "turn",
        on_uncertain: Literal["repeat", "raise"] | Callable[[str], Any] = "repeat",
    ) -> Any:
        """Runs a side effect and records its result once, in this step's fenced commit.

        **What a key names.** By default (``scope="turn"``) one effect of one *turn*: a ``start`` or a
        ``resume`` begins a new turn, so the same key in the next turn runs ``fn`` afresh; a ``recover`` (or a
        takeover) continues the turn it recovers, so it finds the records of that turn. ``scope="thread"``
        names one effect of the whole thread: recorded once, read back by every later turn, until the thread is
        deleted.

        **What happens.** If the key's effect record exists (a step that ran it committed), its result is
        returned and ``fn`` is not called. Otherwise an *intent* is committed first (fenced by the run's claim,
        before every call: a run whose thread was already taken over fails here with ``StaleClaim`` and does not
        call ``fn``), then ``fn`` is called and its result is recorded with the step's commit (first-wins by
        key).

        **What a crash can repeat.** Execution is at least once, the record is written once: if the process
        dies (or the run loses its claim) after the intent and before the step committed, the re-executed step
        finds the intent without a record, and by default calls ``fn`` again (a run that lost its claim just
        after its intent may even call ``fn`` after its successor did). Every execution of one effect gets the
        same *idempotency key* (see :func:`effect_keys`): ``fn`` receives it when it takes an argument
        (``fn(idempotency_key)``; ``fn()`` is called without it); hand it to a provider that accepts one (many
        payment, e-mail and LLM batch APIs do) and the effect happens once at the provider. A node that cannot
        repeat the call chooses with ``on_uncertain``. The README's "Effects" section says the same.

        Args:
            key: names the effect within its scope (an id).
            fn: ``fn()`` or ``fn(idempotency_key)``; returns a JSON value whose effect record fits the store's
                ``max_json_size`` (README "Limits"). Runs on the node's thread. An ``async def`` function
                (or an async ``on_uncertain``) is accepted from an ``async def`` node only: ``effect`` then
                returns an awaitable - ``await ctx.effect(key, fn)`` - whose store calls run off the event loop
                (README "asyncio").
            scope: ``"turn"`` (default) or ``"thread"``.
            on_uncertain: what to do when an intent was recorded but no result (an earlier execution may have
                called ``fn``): ``"repeat"`` (default) calls ``fn`` again with the same idempotency key;
                ``"raise"`` raises :class:`~threadloom.domain.errors.EffectMayHaveRun` instead (the node may
                catch it, e.g. to suspend for a person to check); a callable ``on_uncertain(idempotency_key)``
                is called instead of ``fn`` (e.g. to ask the provider what happened) and its JSON result is
                recorded as the effect's; it must take the key as one positional argument (checked at once).

        Returns:
            The effect's result (a JSON value): ``fn``'s, ``on_uncertain``'s, or the recorded one.

        Raises:
            ValidationError: a bad ``key``, ``scope`` or ``on_uncertain`` (also a callable that cannot take the
                idempotency key as one positional argument); ``fn`` takes more than one argument; ``fn`` is an
                async function and the node is not ``async def`` (refused before anything is recorded, naming
                the node); ``fn`` returned an awaitable nobody awaited (a coroutine);
                or the result is not JSON or its record would be longer than the store's ``max_json_size``
                (nothing is recorded then; the node fails unless it catches it, and a re-execution of the step
                finds the intent without a result).
            EffectMayHaveRun: ``on_uncertain="raise"`` and an earlier execution may have called ``fn``.
            StaleClaim: the run lost its thread before ``fn`` was called (the node ends without a FAILED
                checkpoint).
            ProcessingError: the store failed reading the record or writing the intent (``fn`` was not called;
                the run ends and the thread stays recoverable).
            Whatever ``fn`` raises (no result is recorded; the node fails unless it catches it).
        """
        if scope not in ("turn", "thread"):
            raise ValidationError("scope", (f"must be 'turn' or 'thread', got {scope!r}",))
        _check_on_uncertain(on_uncertain)
        keys = effect_keys(self.thread_id, key, turn_id=self.turn_id if scope == "turn" else None)
        call = _effect_call(fn)
        if is_async_callable(fn) or is_async_callable(on_uncertain):
            if not self.is_async:
                raise refuse_async_effect(self.node, key)
            awaitable = self._effect_async(key, scope, on_uncertain, keys, call)
            self._awaitables.append((key, awaitable))
            return awaitable
        if keys.record in self._effects:
            return v.copy_json(self._effects[keys.record].result)
        recorded = self._read_effect(keys.record)
        if recorded is not None:
            return recorded.result
        call = self._uncertain(key, keys, on_uncertain, self._read_effect(keys.intent), call)
        # Always, even over an earlier intent (first-wins keeps that one): the write is fenced, so a run whose
        # thread was taken over since it read the records above stops here instead of calling.
        self._intend(key, scope, keys)
        result = call(keys.idempotency)
        return self._record(key, keys, result)

    async def _effect_async(
        self, key: str, scope: str, on_uncertain: Any, keys: EffectKeys, call: Callable[[str], Any]
    ) -> Any:
        """``ctx.effect`` of an async node given an async function: the same steps, the store calls off the loop."""
        loop = asyncio.get_running_loop()
        if keys.record in self._effects:
            return v.copy_json(self._effects[keys.record].result)
        recorded = await loop.run_in_executor(None, self._read_effect, keys.record)
        if recorded is not None:
            return recorded.result
        intent = await loop.run_in_executor(None, self._read_effect, keys.intent)
        call = self._uncertain(key, keys, on_uncertain, intent, call)
        await loop.run_in_executor(None, self._intend, key, scope, keys)
        result = call(keys.idempotency)
        if inspect.isawaitable(result):
            result = await result
        return self._record(key, keys, result)

    def _uncertain(
        self, key: str, keys: EffectKeys, on_uncertain: Any, intent: EffectRecord | None, call: Callable[[str], Any]
    ) -> Callable[[str], Any]:
        """What ``ctx.effect`` calls, given the intent an earlier execution recorded (or None): ``call`` when there
        is none; else, after an ``effect.uncertain`` warning, ``call`` again (``"repeat"``), ``on_uncertain`` (a
        callable), or ``EffectMayHaveRun`` (``"raise"``)."""
        if intent is None:
            return call
        _log.warning(
            "effect.uncertain",
            thread_id=self.thread_id,
            run_id=self.run_id,
            graph_node=self.node,
            key=key,
            idempotency_key=keys.idempotency,
            intent_run=intent.run_id,
            on_uncertain=on_uncertain if isinstance(on_uncertain, str) else "callable",
        )
        if on_uncertain == "raise":
            raise EffectMayHaveRun(self.thread_id, key, keys.idempotency, intent.run_id, intent.recorded_at)
        return on_uncertain if callable(on_uncertain) else call

    def _record(self, key: str, keys: EffectKeys, result: Any) -> Any:
        """Checks an effect's result (JSON, within the store's limit) and keeps its record for the step's commit."""
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: close it so it does not warn later
            fix = (
                "pass the async function itself, not a function returning its coroutine, and await ctx.effect"
                if self.is_async
                else "declare the node `async def` and await ctx.effect"
            )
            raise ValidationError(
                f"effect {key!r} result",
                (
                    f"is {type(result).__name__}, an awaitable nobody awaited, not a JSON value (node "
                    f"{self.node!r}): {fix}; nothing was recorded",
                ),
            )
        v.check_json(f"effect {key!r} result", result)
        record = EffectRecord(
            key=keys.record,
            run_id=self.run_id,
            recorded_at=self._now(),
            result=result,  # the constructor keeps a copy of its own
            checkpoint_id=self.checkpoint_id,
            task_id=self.task_id,
        )
        self._check_size(key, record)
        self._effects[keys.record] = record
        return result

    def _check_size(self, key: str, record: EffectRecord) -> None:
        """Refuses an effect record the step's commit would refuse as longer than the store's ``max_json_size``
        (measured as the commit measures it), so the node fails now instead of every commit of its step."""
        limit = self._max_json_size
        if limit is None:
            return
        size = len(encode_effect(record).text)
        if size > limit:
            raise ValidationError(
                f"effect {key!r} result",
                (
                    f"is {size:,} characters of JSON as stored, over the store's limit of {limit:,} per record "
                    "(max_json_size); the result was not recorded",
                ),
            )

    def _intend(self, key: str, scope: str, keys: EffectKeys) -> None:
        """Records the intent to call an effect's function (a commit of its own, fenced by the run's claim)
        before the call; over an existing intent it changes nothing but still checks the claim."""
        if self._record_intent is None:
            return
        self._record_intent(
            EffectRecord(
                key=keys.intent,
                run_id=self.run_id,
                recorded_at=self._now(),
                result={
                    "key": key,
                    "scope": scope,
                    "turn_id": self.turn_id if scope == "turn" else None,
                    "idempotency_key": keys.idempotency,
                },
                checkpoint_id=self.checkpoint_id,
                task_id=self.task_id,
            )
        )

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

    async def aspawn(self, thread_id: str, graph: Graph, input: Any = None) -> RunHandle:  # noqa: A002
        """:meth:`spawn` for an ``async def`` node: the child's admission runs off the event loop; ``await`` the
        returned handle for the child's outcome (README "asyncio"). Same errors as :meth:`spawn`."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.spawn, thread_id, graph, input)

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
