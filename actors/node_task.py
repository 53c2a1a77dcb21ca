"""Running one node execution of a run, off its actor: a plain node on a task thread, an ``async def`` node on the
runtime's event loop.

A plain node's task thread also finishes the step: once the node returned it takes the run's lock and commits
the step itself, then runs the next node, on the same thread (:func:`run_chain`), so a superstep hands nothing to
the actor and waits for no other thread. The actor still serializes everything else of the run under the same
lock (its claim, renewals, cancels, retries of a commit), and a node never runs under the lock, so a renewal never
waits for a node. An ``async def`` node's end goes to the actor as a message (a commit must not block the loop).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from threadloom.actors.aio import RuntimeLoop
from threadloom.actors.graph import Graph, NodeContext, Step
from threadloom.domain.errors import CancelledError, ValidationError

Job = Callable[[], "Job | None"]
"""One node execution on a task thread; it returns the run's next one to run on the same thread, or None."""

Outcome = tuple[Step | None, BaseException | None]
"""How a node execution ended: its step, or the error it raised."""


def checked_step(result: Any, graph: Graph, node: str) -> Step:
    """``result`` if it is a ``Step`` whose ``next`` is a node of ``graph``.

    Raises:
        TypeError: the node returned something else than a ``Step``.
        ValidationError: ``step.next`` names no node of the graph.
    """
    if not isinstance(result, Step):
        raise TypeError(f"node {node!r} returned {type(result).__name__}, not a Step")
    if result.next is not None and result.next not in graph.nodes:
        raise ValidationError("step.next", (f"{result.next!r} is not a node of graph {graph.graph_id!r}",))
    return result


def _on_main_thread() -> bool:
    """True on the program's main thread, the only one a signal's ``KeyboardInterrupt`` or ``SystemExit`` reaches:
    there such an exception is the program's, not the node's (the runtime runs nodes on its own threads)."""
    return threading.current_thread() is threading.main_thread()


def escaped(caught: BaseException, node: str) -> Exception:
    """A ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, a stray
    ``asyncio.CancelledError``, a subclass of ``BaseException``) raised by a node or its effect, as the failure of
    that node: a ``RuntimeError`` naming it, whose ``__cause__`` is the original. Let through, it killed the node's
    task thread (or the runtime's event loop) and left the run RUNNING under a claim renewed forever (found by
    hostile testing). On the program's main thread it is left to the program (see :func:`_on_main_thread`)."""
    failure = RuntimeError(f"node {node!r} raised {type(caught).__name__}: {caught}")
    failure.__cause__ = caught
    return failure


def run_node(fn: Any, state: Any, ctx: NodeContext, graph: Graph, node: str, loop: RuntimeLoop | None) -> Outcome:
    """Calls the plain node ``fn(state, ctx)`` on the calling thread; a coroutine it returns runs on ``loop``.

    Whatever the node raises ends it failed, a ``BaseException`` too (see :func:`escaped`)."""
    try:
        result = fn(state, ctx)
        if type(result) is not Step and loop is not None and inspect.isawaitable(result):  # returned a coroutine
            ctx.is_async = True
            result = loop.run(result)
            step = checked_step(result, graph, node)
            ctx.check_effects_awaited()
            return step, None
        return checked_step(result, graph, node), None
    except Exception as caught:
        return None, caught
    except BaseException as caught:  # noqa: BLE001 - a node's, never the runtime's own: it ends the node failed
        if _on_main_thread():
            raise  # Ctrl-C, or a signal handler's SystemExit, meant for the program (a simulation runs nodes here)
        return None, escaped(caught, node)


async def run_async_node(fn: Any, state: Any, ctx: NodeContext, graph: Graph, node: str) -> Outcome:
    """Awaits the ``async def`` node ``fn(state, ctx)`` on the runtime's event loop.

    A cancellation of the loop's task (the runtime closed with the node in flight) ends it ``CancelledError``.
    """
    try:
        step = checked_step(await fn(state, ctx), graph, node)
        ctx.check_effects_awaited()
        return step, None
    except asyncio.CancelledError:
        return None, CancelledError("run")
    except Exception as caught:
        return None, caught
    except BaseException as caught:  # noqa: BLE001 - SystemExit... would stop the runtime's loop: see escaped()
        if _on_main_thread():
            raise  # as in run_node
        return None, escaped(caught, node)


def run_chain(first: Job) -> None:
    """A run's node task: runs ``first``, then each job the previous one returned, until one returns None."""
    job: Job | None = first
    while job is not None:
        job = job()
