"""The worker processes of ``threadloom demo``: started as ``python -m threadloom demo-worker``, stopped with
SIGTERM (then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs

from threadloom.cli.demo.plan import DemoPlan
from threadloom.cli.output import STORE_ENV

STOP_GRACE_S = 30.0
"""How long (seconds) a worker may take to stop after SIGTERM before it is killed: more than a runtime's close
takes with its default ``close_timeout`` (10 s) behind a SQLite call waiting out its ``busy_timeout`` (5 s)."""
LOG_TAIL = 5
"""Lines of a worker's log shown when it exits unexpectedly."""


@attrs.define
class Worker:
    """One worker process the coordinator started."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self) -> str:
        """``up``, ``SIGKILLed``, ``stopped`` (exit 0) or ``exited N``."""
        code = self.process.poll()
        if self.killed:
            return "SIGKILLed"
        if code is None:
            return "up"
        return "stopped" if code == 0 else f"exited {code}"

    def log_tail(self) -> list[str]:
        """The last lines of its log."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return lines[-LOG_TAIL:]


def start_worker(
    name: str,
    store_url: str,
    folder: Path,
    ledger_path: Path,
    plan: DemoPlan,
    log_level: str,
    *,
    metrics_port: int | None = None,
) -> Worker:
    """Starts ``python -m threadloom demo-worker`` in a session of its own (Ctrl-C reaches the coordinator only).

    The store URL travels in the environment (never on a command line ``ps`` shows); the worker's log lines go
    to ``<folder>/logs/<name>.log``. With ``metrics_port`` the worker meters its store and serves the metrics on
    that port of :data:`METRICS_HOST`.
    """
    log_path = folder / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "threadloom", "--log-level", log_level, "demo-worker",
        "--name", name,
        "--ledger", str(ledger_path),
        "--concurrency", str(plan.concurrency),
        "--ttl", f"{int(plan.ttl.total_seconds() * 1000)}ms",
        "--renew-every", f"{int(plan.renew_every.total_seconds() * 1000)}ms",
        "--pace", str(plan.pace),
    ]  # fmt: skip
    if metrics_port is not None:
        command += ["--metrics-port", str(metrics_port)]
    env = {**os.environ, STORE_ENV: store_url}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return Worker(name=name, process=process, log_path=log_path)


def stop_workers(workers: list[Worker]) -> None:
    """SIGTERM to every live worker, then SIGKILL to any still running after :data:`STOP_GRACE_S`."""
    for worker in workers:
        if worker.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        try:
            worker.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
            worker.process.wait()


__all__ = ["LOG_TAIL", "STOP_GRACE_S", "Worker", "start_worker", "stop_workers"]
