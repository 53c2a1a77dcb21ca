"""``threadloom demo-walk-worker`` (hidden): one node of release v1 or v2 in ``threadloom demo --walk``.

The coordinator starts it as ``python -m threadloom demo-walk-worker`` with the store URL in ``$THREADLOOM_STORE``.
It opens the store with its release's access schemas (:func:`~threadloom.cli.demo.walk_plan.release_access`), runs a
``GraphRuntime`` over it - which heartbeats the membership and runs the walker of the demo's graph kind - and makes
live commits to random threads of the kind (claim, one checkpoint and one event keeping the thread's tenant and
region, release) until SIGTERM or until its coordinator is gone. Several times a second it replaces its status
file (JSON: live commits, the walk's share on this node, whether the store's writes are pressed).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import structlog

from threadloom.actors.policies import ClaimPolicy
from threadloom.actors.runtime import GraphRuntime
from threadloom.cli.demo.walk_plan import RELEASES, WALK_DEMO_GRAPH, release_access
from threadloom.cli.output import DURATION, STORE_ENV, CliError
from threadloom.domain.access import AccessStampOptions
from threadloom.domain.errors import StaleClaim, ThreadBusy, ThreadloomError
from threadloom.domain.values import Checkpoint, ClaimRequest, Commit, EventDraft
from threadloom.persistence import open_store

STATUS_EVERY_S = 0.25
"""How often (seconds) a worker replaces its status file."""


SLOW_STOP_S = 5.0
"""A stop (the runtime's close, then the store's) slower than this many seconds is logged as a warning."""


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replaces ``path`` with ``status`` as JSON (written aside, then renamed: a reader never sees half of it)."""
    aside = path.with_suffix(".tmp")
    aside.write_text(json.dumps(status))
    os.replace(aside, path)


def live_commit(store: Any, thread_id: str, holder: str, ttl: timedelta) -> bool:
    """One live commit to ``thread_id``: claims it, commits a checkpoint after its latest (same tenant, state
    and metadata but for the turn count and the release) with one event, releases it. False when another worker
    holds the thread (nothing written)."""
    latest = store.latest(thread_id)
    if latest is None:
        return False
    previous = latest.checkpoint
    try:
        claim = store.claim(thread_id, ClaimRequest(holder=holder, ttl=ttl, tenant_id=previous.tenant_id))
    except ThreadBusy:
        return False
    try:
        latest = store.latest(thread_id)  # what the claim now protects
        assert latest is not None
        previous = latest.checkpoint
        now = datetime.now(UTC)
        state = dict(previous.state) if isinstance(previous.state, dict) else {}
        state["turns"] = int(state.get("turns", 0)) + 1
        checkpoint = Checkpoint(
            id=f"{thread_id}-{holder}-{claim.token}",
            parent=previous.id,
            thread_id=thread_id,
            run_id=holder,
            status=previous.status,
            created_at=now,
            state=state,
            graph_id=previous.graph_id,
            tenant_id=previous.tenant_id,
            metadata={**previous.metadata, "release": holder.split("-", 1)[0]},
        )
        event = EventDraft(run_id=holder, type="turn", timestamp=now, payload={"turns": state["turns"]},
                           checkpoint_id=checkpoint.id)  # fmt: skip
        store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint, events=(event,)))
    finally:
        with contextlib.suppress(StaleClaim, ThreadloomError):
            store.release(thread_id, claim.token)
    return True


@click.command(name="demo-walk-worker", hidden=True)
@click.option("--name", required=True, help="The node id (v1-1, v2-1, …).")
@click.option("--release", type=click.Choice(RELEASES), required=True, help="The release it runs.")
@click.option("--graph", "graph_id", default=WALK_DEMO_GRAPH, show_default=True, help="The demo's graph kind.")
@click.option("--status", "status_path", required=True, type=click.Path(dir_okay=False), help="Its status file.")
@click.option("--ttl", type=DURATION, default="2s", show_default=True)
@click.option("--renew-every", type=DURATION, default="500ms", show_default=True)
@click.option("--walk-share", type=click.FloatRange(0, 1, min_open=True), default=0.1, show_default=True)
@click.option("--walk-rate", type=click.FloatRange(0, min_open=True), default=40.0, show_default=True)
@click.option("--interval", type=DURATION, default="1s", show_default=True)
@click.option("--commits-per-s", type=click.FloatRange(0), default=10.0, show_default=True)
def demo_walk_worker(
    name: str,
    release: str,
    graph_id: str,
    status_path: str,
    ttl: timedelta,
    renew_every: timedelta,
    walk_share: float,
    walk_rate: float,
    interval: timedelta,
    commits_per_s: float,
) -> None:
    """A node of ``threadloom demo --walk``: walks its release's schema and commits live until SIGTERM."""
    url = os.environ.get(STORE_ENV)
    if not url:
        raise CliError(f"${STORE_ENV} names no store", 2)
    store = open_store(url, access=release_access(release, graph_id))
    stop = threading.Event()

    def stopping(*_: object) -> None:
        stop.set()
        # A stop that hangs leaves every thread's stack in the worker's log before the coordinator's SIGKILL.
        faulthandler.dump_traceback_later(SLOW_STOP_S * 2)

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    options = AccessStampOptions(interval=interval, walk_batch=1000, walk_share=walk_share, walk_rate=walk_rate)
    policy = ClaimPolicy(ttl=ttl, renew_every=renew_every)
    runtime = GraphRuntime(store, node_id=name, claim_policy=policy, access_options=options)
    log = structlog.get_logger("threadloom.demo")
    status = Path(status_path)
    commits = busy = failed = 0
    threads: list[str] = []
    after: str | None = None
    while True:  # v1 filled the store before any worker started
        page = store.graph_threads(graph_id, after=after, limit=1000)
        threads += page
        if len(page) < 1000:
            break
        after = page[-1]
    rng = random.Random(f"{name}-{os.getpid()}")
    log.info("demo.walk_worker_serving", worker=name, release=release, pid=os.getpid(), threads=len(threads))
    parent = os.getppid()
    gap = 1.0 / commits_per_s if commits_per_s > 0 else None
    next_commit = time.monotonic()
    next_status = 0.0
    try:
        while not stop.is_set() and os.getppid() == parent:
            now = time.monotonic()
            if gap is not None and threads and now >= next_commit:
                next_commit = max(next_commit + gap, now - 1.0)
                try:
                    if live_commit(store, rng.choice(threads), f"{name}-live", ttl):
                        commits += 1
                    else:
                        busy += 1
                except ThreadloomError as error:  # a busy store, a claim lost mid-commit: the next one goes on
                    failed += 1
                    log.warning("demo.live_commit_failed", worker=name, error=str(error))
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                write_status(
                    status,
                    {
                        "name": name,
                        "release": release,
                        "pid": os.getpid(),
                        "commits": commits,
                        "busy": busy,
                        "failed": failed,
                        "share": runtime.share(graph_id),
                        "pressed": store.pressed(),
                    },
                )
            wake = min(next_status, next_commit if gap is not None else next_status)
            stop.wait(max(0.0, min(0.05, wake - time.monotonic())))
    finally:
        began = time.monotonic()
        runtime.close()
        closed = time.monotonic()
        store.close()
        took = {"runtime_close_s": round(closed - began, 3), "store_close_s": round(time.monotonic() - closed, 3)}
        faulthandler.cancel_dump_traceback_later()
    # A slow stop is worth a warning (the coordinator SIGKILLs a worker that does not stop in time): where it went.
    report = log.warning if sum(took.values()) > SLOW_STOP_S else log.info
    report("demo.walk_worker_stopped", worker=name, pid=os.getpid(), commits=commits, **took)


__all__ = ["SLOW_STOP_S", "STATUS_EVERY_S", "demo_walk_worker", "live_commit", "write_status"]
