"""``threadloom recover`` and ``threadloom delete``: act on one thread through the runtime.

``recover THREAD --graph module:attr`` continues a thread whose run died (latest checkpoint RUNNING, no live
claim) at the node after its last commit, in this process, and waits for the run to end. With ``--wait`` it first
waits, with a countdown, for a dead run's claim to expire (bounded by ``--timeout``); a claim that keeps being
renewed is a live run: exit status 1 naming its holder, nothing changed.

``delete THREAD`` is the runtime's cascade delete: the thread and all its descendants, each delete fenced by the
root's claim; it asks for confirmation unless ``--yes``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta

import click
from rich.text import Text

from threadloom.cli.output import DURATION, TENANT, CliError, CliState, cell, state_of
from threadloom.domain.errors import RunFailed, TenantMismatch, ThreadBusy, ValidationError
from threadloom.domain.values import CheckpointStatus, RunClaim
from threadloom.persistence.base import Checkpointer

WAIT_POLL_S = 0.5
"""How often, in seconds, ``recover --wait`` reads the claim again while it waits for it to expire."""


def _graph(spec: str) -> object:
    from threadloom.simulations.run import load_graph

    if os.getcwd() not in sys.path:  # a graph importable from the working directory, as with ``python -m``
        sys.path.insert(0, os.getcwd())
    try:
        return load_graph(spec)
    except ValidationError as error:
        raise CliError(f"--graph {spec}: {'; '.join(error.problems)}", 2, kind="ValidationError") from error


def _tenant_of(state: CliState, store: Checkpointer, thread: str, tenant: str | None) -> str | None:
    """The tenant to act for: ``--tenant``, else the thread's own (its latest checkpoint's).

    Another tenant's thread is refused here, before the command looks at its status or its claim, so nothing of
    it (not whether a run holds it) is told to that tenant and no claim is taken.
    """
    latest = store.latest(thread)
    claim = store.current_claim(thread) if latest is None else None
    if latest is None and claim is None:
        raise CliError(f"unknown thread {thread!r}: it has no checkpoint in {state.safe_url}", kind="UnknownThread")
    if tenant is not None:
        owner = latest.checkpoint.tenant_id if latest is not None else claim.tenant_id  # type: ignore[union-attr]
        if owner != tenant:  # before its first checkpoint: the tenant of the run starting it
            raise TenantMismatch(thread, tenant)
        return tenant
    return latest.checkpoint.tenant_id if latest is not None else claim.tenant_id  # type: ignore[union-attr]


def _holder_text(claim: RunClaim | None) -> str:
    if claim is None:
        return "a run whose claim just ended"
    return f"run {claim.holder!r} (claim token {claim.token}, expires at {claim.expires_at.isoformat()})"


def _wait_for_expiry(state: CliState, store: Checkpointer, thread: str, deadline: float) -> None:
    """Waits until the thread's claim has expired (by this host's clock against the store's expiry) or is gone,
    printing a countdown on stderr; raises CliError naming the holder when ``deadline`` passes first."""
    import contextlib

    from rich.live import Live

    live = Live(Text(""), console=state.err, transient=True) if state.err.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            claim = store.current_claim(thread)
            if claim is None:
                return
            left = (claim.expires_at - datetime.now(UTC)).total_seconds()
            if left <= 0:
                return
            if time.monotonic() >= deadline:
                raise CliError(
                    f"thread {thread!r} is still held by {_holder_text(claim)} when --timeout ran out (a claim "
                    "that keeps being renewed is a live run); nothing changed",
                    kind="ThreadBusy",
                )
            if live is not None:
                live.update(Text(f"waiting for the claim of {claim.holder} to expire: {left:4.1f} s", style="dim"))
            time.sleep(min(WAIT_POLL_S, max(0.01, left), max(0.01, deadline - time.monotonic())))


@click.command()
@click.argument("thread")
@click.option("--graph", "graph_spec", required=True, metavar="MODULE:ATTR",
              help="The thread's Graph (or a function returning it), importable from the working directory.")
@click.option("--tenant", default=None, type=TENANT, metavar="TENANT",
              help="Act for this tenant [default: the thread's own].")
@click.option("--wait", "wait", is_flag=True, help="Wait (with a countdown) for a dead run's claim to expire first.")
@click.option("--timeout", type=DURATION, default=timedelta(minutes=5), show_default="5m",
              help="With --wait: give up after this long (a claim renewed meanwhile is a live run).")
@click.pass_context
def recover(
    ctx: click.Context, thread: str, graph_spec: str, tenant: str | None, wait: bool, timeout: timedelta
) -> None:
    """Continue THREAD's incomplete run at the node after its last commit, and wait for it to end.

    For a thread whose run died (its latest checkpoint is running and no live claim holds it). A live claim
    refuses it (exit 1, naming the holder) unless --wait, which waits for that claim to expire, up to --timeout.
    Exit status: 0 the run completed (or suspended); 1 it failed, the thread is unknown, has nothing to recover,
    or is held; 2 a bad --graph.
    """
    from threadloom.actors.runtime import GraphRuntime

    state = state_of(ctx)
    graph = _graph(graph_spec)
    store = state.store()
    tenant_id = _tenant_of(state, store, thread, tenant)
    latest = store.latest(thread)
    if latest is None or latest.checkpoint.status is not CheckpointStatus.RUNNING:
        status = "no checkpoint" if latest is None else f"its latest checkpoint is {latest.checkpoint.status.value}"
        raise CliError(f"thread {thread!r} has no run to recover ({status}); nothing changed", kind="InvalidRunState")
    deadline = time.monotonic() + timeout.total_seconds()
    with GraphRuntime(store) as runtime:
        while True:
            try:
                handle = runtime.recover(thread, graph, tenant_id)  # type: ignore[arg-type]
                break
            except ThreadBusy as error:
                if not wait:
                    raise CliError(
                        f"thread {thread!r} is held by {_holder_text(store.current_claim(thread))}; nothing changed; "
                        "add --wait to wait for a dead run's claim to expire",
                        kind="ThreadBusy",
                    ) from error
                _wait_for_expiry(state, store, thread, deadline)
                time.sleep(0.05)  # the store's clock may trail this host's a little: ask again shortly
        try:
            outcome = handle.wait()
        except RunFailed as error:
            raise CliError(f"the recovered run of {thread!r} failed: {error}", kind="RunFailed") from error
    if state.json_output:
        state.emit({"thread_id": thread, "run_id": handle.run_id, "status": outcome.status.value})
        return
    state.out.print(cell(f"thread {thread} recovered by run {handle.run_id}: {outcome.status.value}"))


@click.command()
@click.argument("thread")
@click.option("--tenant", default=None, type=TENANT, metavar="TENANT",
              help="Act for this tenant [default: the thread's own].")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, thread: str, tenant: str | None, yes: bool) -> None:
    """Delete THREAD and all its descendants (the runtime's fenced cascade); asks first unless --yes.

    Another tenant's thread (--tenant) is refused first, with nothing written. Then the thread is claimed, so a
    live run anywhere refuses the delete (exit 1, nothing deleted); a cascade
    stopped half-way leaves the thread listed as deleted, and deleting again finishes it. Refused without --yes
    when stdin is not a terminal.
    """
    from threadloom.actors.runtime import GraphRuntime

    state = state_of(ctx)
    store = state.store()
    tenant_id = _tenant_of(state, store, thread, tenant)
    if not yes:
        question = f"delete thread {thread!r} and all its descendants?"
        if not sys.stdin.isatty() or state.json_output:
            raise CliError(f"nothing deleted: add --yes to {question[:-1]}", kind="NotConfirmed")
        if not click.confirm(question, default=False, err=True):
            raise CliError("nothing deleted: not confirmed", kind="NotConfirmed")
    with GraphRuntime(store) as runtime:
        deleted = runtime.delete_thread(thread, tenant_id)
    if state.json_output:
        state.emit({"thread_id": thread, "deleted": deleted})
        return
    state.out.print(cell(f"deleted {len(deleted)} thread(s): {', '.join(deleted)}"))


__all__ = ["WAIT_POLL_S", "delete", "recover"]
