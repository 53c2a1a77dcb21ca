"""``threadloom demo --walk``: the command's part - options to a :class:`~threadloom.cli.demo.walk_plan.WalkPlan`,
the store, the display, the audit, the result table or JSON document, the exit status.

See :mod:`threadloom.cli.demo.walk` for what runs.
"""

from __future__ import annotations

import secrets as _secrets
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from threadloom.cli.demo.audit import AuditResult, audit, misstamp_one
from threadloom.cli.demo.processes import Worker
from threadloom.cli.demo.verify import Check
from threadloom.cli.demo.walk import (
    WalkDisplay,
    WalkRun,
    audit_checks,
    audit_table,
    fill,
    run_walk_demo,
    scenario_checks,
)
from threadloom.cli.demo.walk_plan import TENANTS, WALK_DEMO_GRAPH, WalkPlan, release_access
from threadloom.cli.logs import configure_logging
from threadloom.cli.output import EXIT_FAILED, CliError, state_of
from threadloom.domain.errors import ThreadloomError, ValidationError
from threadloom.persistence import open_store, redact_url, url_secrets


@attrs.frozen(kw_only=True)
class WalkResult:
    """What ``demo --walk`` prints."""

    plan: WalkPlan
    store_label: str
    folder: Path | None
    run: WalkRun
    workers: list[Worker]
    audit: AuditResult | None
    checks: list[Check]
    duration_s: float
    inspect: str

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks) and not self.run.timed_out

    def json(self) -> dict[str, Any]:
        record = self.run.record
        return {
            "passed": self.passed,
            "store": self.store_label,
            "folder": None if self.folder is None else str(self.folder),
            "graph_id": self.plan.graph_id,
            "threads": self.plan.threads,
            "tenants": list(TENANTS),
            "schemas": {
                release: release_access(release, self.plan.graph_id).for_graph(self.plan.graph_id).hash
                for release in ("v1", "v2")
            },
            "workers": [{"name": w.name, "pid": w.pid, "status": w.status()} for w in self.workers],
            "v1_stopped_s": self.run.v1_stopped_s,
            "v1_stop_took_s": self.run.v1_stop_took_s,
            "walk_started_s": self.run.walk_started_s,
            "v1_stopped_at": None if self.run.v1_stopped_at is None else self.run.v1_stopped_at.isoformat(),
            "walk_claimed_at": None if self.run.walk_claimed_at is None else self.run.walk_claimed_at.isoformat(),
            "walk_started_by": self.run.walk_started_by,
            "killed": self.run.killed,
            "resumed": self.run.resumed,
            "completed_s": self.run.completed_s,
            "walk": None if record is None else {**record.to_state(), "graph_id": record.graph_id},
            "audit": None if self.audit is None else self.audit.json(),
            "checks": [check.json() for check in self.checks],
            "timed_out": self.run.timed_out,
            "duration_s": round(self.duration_s, 3),
            "inspect": self.inspect,
        }


def print_walk_result(console: Console, result: WalkResult) -> None:
    """The audit table, the checks, the verdict."""
    if result.audit is not None:
        console.print(audit_table(result.audit))
    table = Table(title="checks", title_justify="left", header_style="bold")
    table.add_column("check")
    table.add_column("result")
    table.add_column("figure", overflow="fold")
    for check in result.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(Text(check.name), verdict, Text(check.figure))
        for problem in check.problems:
            table.add_row(Text(""), Text(""), Text(problem, style="red"))
    console.print(table)
    summary = "audit clean, all checks passed" if result.passed else "SOME CHECKS FAILED"
    console.print(Text(f"{summary} in {result.duration_s:.1f}s", style="bold green" if result.passed else "bold red"))
    if result.folder is not None:
        console.print(Text(f"kept {result.folder} (worker logs in logs/, status files in status/)"))
    if result.inspect:
        console.print(Text(f"inspect: {result.inspect}"), soft_wrap=True)


def _open(url: str, plan: WalkPlan) -> Any:
    safe = redact_url(url)
    if url.split(":", 1)[0].lower() not in ("sqlite", "postgresql", "postgres"):
        raise CliError("the walk demo's workers are separate processes: use a sqlite:/// or postgresql:// store", 2)
    try:
        return open_store(url, access=release_access("v2", plan.graph_id))
    except ValidationError as error:
        reason = "; ".join(error.problems) if error.field == "url" else str(error)
        raise CliError(f"bad store URL: {reason}", 2) from error
    except (ThreadloomError, OSError) as error:
        raise CliError(f"cannot open store {safe!r}: {error}") from error


def run_walk_command(ctx: click.Context, named: str | None, plan: WalkPlan, *, keep: bool, plant: bool) -> None:
    """``demo --walk`` with ``plan``: fills, runs, audits, prints; exit status 1 unless everything passed.

    ``plant`` re-stamps one checkpoint row for another tenant before the audit (the audit must then fail).
    """
    state = state_of(ctx)
    folder = Path(tempfile.mkdtemp(prefix="threadloom-walk-demo-"))
    url = named if named is not None else f"sqlite:///{(folder / 'demo.db').resolve()}"
    if named is not None:  # a store the user named may hold earlier runs: a graph kind and threads of our own
        suffix = _secrets.token_hex(3)
        plan = attrs.evolve(plan, prefix=f"chat-{suffix}", graph_id=f"{WALK_DEMO_GRAPH}-{suffix}")
    level = str((ctx.parent.params.get("log_level") if ctx.parent else None) or "warning").lower()
    configure_logging(level, secrets=tuple({*state.secrets, *url_secrets(url)}))
    label = redact_url(url)
    console = state.err if state.json_output else state.out
    started = time.monotonic()
    store = None
    audited: AuditResult | None = None
    try:
        store = _open(url, plan)  # before the fill: a bad URL is refused before anything is written
        display = WalkDisplay(console, plan, label, live=console.is_terminal and not state.json_output)
        with display:
            display.note(f"store {label}")
            display.note(f"release v1 fills {plan.threads} threads of {plan.graph_id} for {len(TENANTS)} tenants")
            owners = fill(url, plan)
            run, workers = run_walk_demo(store, url, plan, folder, display, level)
            if plant:
                victim = plan.thread_id(0)
                other = next(t for t in TENANTS if t != owners[victim])
                misstamp_one(store, victim, other)
                display.note(f"planted: one checkpoint row of {victim} re-stamped for {other}")
            audited = audit(store, release_access("v2", plan.graph_id), plan.graph_id, owners, TENANTS)
        checks = scenario_checks(run, plan) + audit_checks(audited)
        inspect = (
            f"threadloom --store {shlex.quote(label)} walks --graph {shlex.quote(plan.graph_id)}"
            if keep or named is not None
            else ""
        )
        result = WalkResult(
            plan=plan, store_label=label, folder=folder if keep else None, run=run, workers=workers,
            audit=audited, checks=checks, duration_s=time.monotonic() - started, inspect=inspect,
        )  # fmt: skip
    finally:
        if store is not None:
            store.close()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if state.json_output:
        state.emit(result.json())
    else:
        print_walk_result(state.out, result)
    if not result.passed:
        ctx.exit(EXIT_FAILED)


__all__ = ["WalkResult", "print_walk_result", "run_walk_command"]
