"""How a run admits itself onto its thread: the pure decision a :class:`~threadloom.actors.thread_actor.ThreadRun`
makes under its claim, from the thread's latest checkpoint and what the run was asked to do.
"""

from __future__ import annotations

from typing import Any

import attrs

from threadloom.actors import graph as g
from threadloom.actors.graph import Graph
from threadloom.actors.runs import RunKind, RunSpec
from threadloom.domain import validation as v
from threadloom.domain.errors import InvalidRunState, TenantMismatch, ValidationError
from threadloom.domain.values import Checkpoint, CheckpointOrigin, CheckpointStatus, StoredCheckpoint


def _merged(graph: Graph, state: Any, update: Any) -> Any:
    """``graph.merge(state, update)`` on copies; an exception of the user's merge refuses the input
    (ValidationError on ``input``, nothing written) instead of escaping as a bare error of the runtime."""
    try:
        return graph.merge(v.copy_json(state), v.copy_json(update))
    except Exception as error:
        raise ValidationError(
            "input", (f"graph {graph.graph_id!r}'s merge refused it: {type(error).__name__}: {error}",)
        ) from error


@attrs.define
class Plan:
    """How a run begins: its mode, the state and node it starts from, its base checkpoint, its origin and its turn
    (the RunId of the start or resume that began the turn: this run's own, or for a recovery the base's)."""

    mode: str  # "start", "resume" or "recover"
    state: Any
    next_node: str
    base: Checkpoint | None
    origin: CheckpointOrigin | None
    turn: str


def plan(spec: RunSpec, stored: StoredCheckpoint | None) -> Plan:
    """How a run of ``spec`` admits itself onto the thread whose latest checkpoint is ``stored``.

    Raises:
        TenantMismatch: the thread belongs to another tenant.
        InvalidRunState: the thread runs another graph, or its latest checkpoint does not allow ``spec.kind``.
        ValidationError: the graph's merge refused the input (field ``input``).
    """
    graph = spec.graph
    op = spec.kind.value
    cp = stored.checkpoint if stored is not None else None
    if cp is not None and cp.tenant_id != spec.tenant_id:
        raise TenantMismatch(spec.thread_id, spec.tenant_id)
    if cp is not None and cp.graph_id != graph.graph_id:
        raise InvalidRunState(spec.thread_id, op, f"the thread runs graph {cp.graph_id!r}, not {graph.graph_id!r}")
    status = cp.status if cp is not None else None
    origin = spec.origin if spec.origin is not None else (cp.origin if cp is not None else None)
    kind = spec.kind
    if kind is RunKind.ADMIT:
        if status is CheckpointStatus.RUNNING:
            raise InvalidRunState(
                spec.thread_id, op, "it has an incomplete run (latest checkpoint RUNNING); recover it first"
            )
        kind = RunKind.RESUME if status is CheckpointStatus.SUSPENDED else RunKind.START
    if kind is RunKind.START:
        if status is CheckpointStatus.RUNNING:
            raise InvalidRunState(
                spec.thread_id, op, "it has an incomplete run (latest checkpoint RUNNING); recover it instead"
            )
        if status is CheckpointStatus.SUSPENDED:
            raise InvalidRunState(spec.thread_id, op, "its run is suspended; resume it instead")
        state = _merged(graph, cp.state if cp is not None else None, spec.input)
        return Plan("start", state, graph.entry, cp, origin, spec.run_id)
    assert cp is not None or status is None
    if kind is RunKind.RESUME and status is not CheckpointStatus.SUSPENDED:
        what = "it has no checkpoint" if cp is None else f"its latest checkpoint is {cp.status.value}"
        raise InvalidRunState(spec.thread_id, op, f"{what}, not a suspended run; start or recover instead")
    if kind is RunKind.RECOVER and status is not CheckpointStatus.RUNNING:
        what = "it has no checkpoint" if cp is None else f"its latest checkpoint is {cp.status.value}"
        raise InvalidRunState(spec.thread_id, op, f"{what}, not an incomplete run: nothing to recover")
    assert cp is not None
    next_node = cp.metadata.get(g.NEXT_KEY, "")
    if next_node not in graph.nodes:
        raise InvalidRunState(
            spec.thread_id, op, f"its latest checkpoint names no node of graph {graph.graph_id!r} to go on at"
        )
    if kind is RunKind.RESUME:
        return Plan("resume", _merged(graph, cp.state, spec.input), next_node, cp, origin, spec.run_id)
    # A checkpoint written before turns were recorded names none: its run is the best guess of the turn.
    return Plan("recover", cp.state, next_node, cp, origin, cp.metadata.get(g.TURN_KEY) or cp.run_id)
