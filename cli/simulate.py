"""``threadloom simulate``: run seeds of the deterministic simulation and report them.

Prints a verdict per failing seed, the probe histogram (how often each interesting situation occurred, and in
how many seeds), and for a failure the shortest failing trace with the exact command that replays it. One seed
(``--seed S`` alone) prints its whole trace. ``--jobs`` spreads the seeds over worker processes; the verdicts do
not depend on it.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from threadloom.cli.output import EXIT_FAILED, CliError, CliState, printable, state_of
from threadloom.domain.errors import ValidationError
from threadloom.simulations.checkers import CHECKS
from threadloom.simulations.regressions import REGRESSION_SEEDS
from threadloom.simulations.run import FAULT_KINDS, PLANTED_BUGS, STORES, SeedResult, SimConfig, load_graph, simulate

BATCH = 25
"""Seeds per task sent to a worker process."""


def _parse_faults(text: str) -> frozenset[str]:
    if text.strip() == "all":
        return frozenset(FAULT_KINDS)
    if text.strip() == "none":
        return frozenset()
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS]
    if unknown or not kinds:
        raise ValidationError(
            "faults", (f"must be all, none or a comma list of {', '.join(FAULT_KINDS)}; got {text!r}",)
        )
    return frozenset(kinds)


def _batch(config: SimConfig, seeds: Sequence[int], path: Sequence[str], keep_trace: bool) -> list[SeedResult]:
    """Runs ``seeds`` in a worker process (its import path as the parent's, for ``--graph``)."""
    for entry in reversed(path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return [result if keep_trace else _slim(result) for result in simulate(seeds, config)]


def _slim(result: SeedResult) -> SeedResult:
    """A passing seed's result without its trace (the hash stays): what crosses process boundaries."""
    if result.ok:
        return SeedResult(
            seed=result.seed,
            ok=True,
            invariant=None,
            detail=None,
            trace=(),
            trace_hash=result.trace_hash,
            probes=result.probes,
            steps=result.steps,
            virtual_s=result.virtual_s,
        )
    return result


def run_seeds(config: SimConfig, seeds: Sequence[int], jobs: int, keep_trace: bool = False) -> Iterator[SeedResult]:
    """Runs ``seeds`` (on ``jobs`` processes) and yields their results in seed order."""
    if jobs <= 1 or len(seeds) <= BATCH:
        for result in simulate(seeds, config):
            yield result if keep_trace else _slim(result)
        return
    batches = [list(seeds[index : index + BATCH]) for index in range(0, len(seeds), BATCH)]
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context)
    try:
        futures = [pool.submit(_batch, config, batch, list(sys.path), keep_trace) for batch in batches]
        for future in futures:
            yield from future.result()
    except (EOFError, concurrent.futures.process.BrokenProcessPool) as error:
        # The forkserver or a worker died (EOFError: before a worker started). click would call an EOFError
        # an interrupt; it is a failure of the workers.
        raise CliError(
            f"the worker processes failed ({type(error).__name__}: {error or 'no detail'}); a module of the "
            "working directory may shadow a standard one, or the graph's module may end its process. Try --jobs 1",
            exit_code=EXIT_FAILED,
            kind="WorkersFailed",
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # Ctrl-C: the batches not started yet are dropped


@click.command()
@click.option(
    "--seeds",
    "count",
    type=click.IntRange(1, 1_000_000),
    default=None,
    help="How many seeds (default 100; 1 with --seed).",
)
@click.option(
    "--seed",
    "first",
    type=click.IntRange(min=0),
    default=None,
    help="The first seed (default 0); alone, runs just this seed and prints its trace.",
)
@click.option(
    "--store",
    "store_kind",
    type=click.Choice(STORES),
    default="memory",
    show_default=True,
    help="The store the nodes share (sqlite: a temporary file per seed).",
)
@click.option(
    "--faults",
    default="all",
    show_default=True,
    metavar="KINDS",
    help=f"Fault kinds seeds may suffer: all, none, or a comma list of {', '.join(FAULT_KINDS)}.",
)
@click.option(
    "--graph",
    default=None,
    metavar="MODULE:ATTR",
    help="Run your Graph (importable from the current directory) instead of the built-in workload graph.",
)
@click.option("--jobs", type=click.IntRange(1, 64), default=1, show_default=True, help="Worker processes.")
@click.option(
    "--regressions",
    is_flag=True,
    help="Replay the kept regression seeds instead (each must give its recorded verdict).",
)
@click.option("--trace", "show_trace", is_flag=True, help="Print the trace of every seed run (long).")
@click.option(
    "--plant",
    multiple=True,
    hidden=True,
    type=click.Choice(PLANTED_BUGS),
    help="Test only: plant a bug in the memory store.",
)
@click.pass_context
def simulate_command(
    ctx: click.Context,
    count: int | None,
    first: int | None,
    store_kind: str,
    faults: str,
    graph: str | None,
    jobs: int,
    regressions: bool,
    show_trace: bool,
    plant: tuple[str, ...],
) -> None:
    """Run the deterministic simulation of crashes and takeovers over seeds.

    Each seed runs 2-3 simulated nodes (runtimes with their own clocks) over one store on a single thread with a
    virtual clock: queued runs with effects and child threads, direct starts, deletes, subscriptions and sweeps,
    under the faults the seed picks (crashes, pauses past the claim ttl, clock jumps, store writes failing
    before or after they applied, slow calls). About one seed in five also runs access walks: a rolling release
    from v1 to v2 nodes, walkers paused or crashed mid-page, tenant-scoped reads. Every store call is checked
    against the invariants (listed as "checks"); once the faults heal, every queued run and the last release's
    walk must complete. Exits 1 if any seed failed, printing the shortest failing
    trace and the command that replays it. The same seed always gives the same trace. --store here names the
    simulated store (memory or sqlite); the global --store URL does not apply.
    """
    state = state_of(ctx)
    if graph is not None and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if regressions:
        given = [
            name
            for name, value in (("--seeds", count), ("--seed", first), ("--graph", graph), ("--plant", plant or None))
            if value is not None
        ]
        if jobs != 1:
            given.append("--jobs")
        if show_trace:
            given.append("--trace")
        if store_kind != "memory":
            given.append("--store")
        if faults != "all":
            given.append("--faults")
        if given:
            raise click.UsageError(
                f"--regressions replays each kept seed with its own options; drop {', '.join(given)}"
            )
        _replay_regressions(state)
        return
    config = SimConfig(store=store_kind, faults=_parse_faults(faults), graph=graph, plant=frozenset(plant))
    if graph is not None:
        load_graph(graph)  # a bad --graph is reported here, before any worker process starts
    start = first if first is not None else 0
    total = count if count is not None else (1 if first is not None else 100)
    seeds = list(range(start, start + total))
    single = total == 1
    began = time.perf_counter()
    results = _with_progress(state, run_seeds(config, seeds, jobs, keep_trace=single or show_trace), len(seeds))
    elapsed = time.perf_counter() - began
    failed = [result for result in results if not result.ok]
    if state.json_output:
        state.emit(_document(config, results, failed, elapsed, traces=single or show_trace))
    else:
        _print(state, config, results, failed, elapsed, single or show_trace)
    if failed:
        raise CliError(
            f"{len(failed)} of {len(results)} seed(s) failed; replay the shortest: "
            f"{config.command(min(failed, key=lambda r: len(r.trace)).seed)}",
            exit_code=EXIT_FAILED,
            kind="SimulationFailed",
        )


def _with_progress(state: CliState, results: Iterator[SeedResult], total: int) -> list[SeedResult]:
    """Collects the results, with a progress bar on stderr when it is a terminal and there are many seeds."""
    if total < 50 or state.json_output or not state.err.is_terminal:
        return list(results)
    collected = []
    with Progress(
        TextColumn("seeds"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(), console=state.err, transient=True,
    ) as progress:
        task = progress.add_task("seeds", total=total, failed=0)
        failed = 0
        for result in results:
            collected.append(result)
            failed += not result.ok
            progress.update(task, advance=1, failed=failed)
    return collected


def _histogram(results: Sequence[SeedResult]) -> list[tuple[str, int, int]]:
    total: Counter[str] = Counter()
    seeds: Counter[str] = Counter()
    for result in results:
        total.update(result.probes)
        seeds.update(result.probes.keys())
    return [(name, total[name], seeds[name]) for name in sorted(total)]


def _histogram_totals(results: Sequence[SeedResult]) -> Counter[str]:
    total: Counter[str] = Counter()
    for result in results:
        total.update(result.probes)
    return total


def _document(
    config: SimConfig, results: Sequence[SeedResult], failed: Sequence[SeedResult], elapsed: float, *, traces: bool
) -> dict[str, Any]:
    """The JSON document: the summary, the probes, the failures, and every seed's trace when ``traces``
    (``--seed S`` alone, or ``--trace``)."""
    shortest = min(failed, key=lambda r: len(r.trace)) if failed else None
    return {
        "store": config.store,
        "faults": [kind for kind in FAULT_KINDS if kind in config.faults],
        "graph": config.graph,
        "seeds": len(results),
        "first_seed": results[0].seed if results else None,
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "seconds": round(elapsed, 3),
        "seeds_per_second": round(len(results) / elapsed, 2) if elapsed > 0 else None,
        "runs_failed": sum(result.probes.get("entry_failed", 0) for result in results),
        "checks": list(CHECKS),
        "steps": sum(result.steps for result in results),
        "virtual_seconds": round(sum(result.virtual_s for result in results), 3),
        "probes": {name: {"count": count, "seeds": seeds} for name, count, seeds in _histogram(results)},
        "failures": [
            {"seed": r.seed, "invariant": r.invariant, "detail": r.detail, "command": config.command(r.seed)}
            for r in failed
        ],
        "shortest": None if shortest is None else {
            "seed": shortest.seed,
            "command": config.command(shortest.seed),
            "trace": list(shortest.trace),
        },
        "trace_hashes": {str(r.seed): r.trace_hash for r in results} if len(results) <= 100 else None,
        "traces": {str(r.seed): list(r.trace) for r in results} if traces else None,
    }


def _print(
    state: CliState,
    config: SimConfig,
    results: Sequence[SeedResult],
    failed: Sequence[SeedResult],
    elapsed: float,
    show_trace: bool,
) -> None:
    out = state.out
    if show_trace:
        for result in results:
            out.print(Text(f"seed {result.seed}: trace {result.trace_hash}", style="bold"))
            for line in result.trace:
                out.print(Text(printable(line)), soft_wrap=True)
    rate = len(results) / elapsed if elapsed > 0 else float("inf")
    kinds = ",".join(kind for kind in FAULT_KINDS if kind in config.faults) or "none"
    out.print(
        Text(
            f"{len(results)} seed(s) from {results[0].seed} on {config.store}, faults {kinds}"
            + (f", graph {config.graph}" if config.graph else "")
            + f": {len(results) - len(failed)} passed, {len(failed)} failed in {elapsed:.2f} s ({rate:.1f} seeds/s; "
            f"{sum(r.steps for r in results):,} steps, {sum(r.virtual_s for r in results):,.0f} virtual s)",
            style="red" if failed else "green",
        )
    )
    out.print(Text(f"checks: {'; '.join(CHECKS)}"), soft_wrap=False)
    table = Table(title="probes: how often each situation occurred", title_justify="left", header_style="bold")
    for column in ("probe", "count", "seeds"):
        table.add_column(column, justify="left" if column == "probe" else "right")
    for name, count, seeds in _histogram(results):
        table.add_row(Text(name), Text(f"{count:,}"), Text(f"{seeds:,}"))
    out.print(table)
    runs = _histogram_totals(results)
    if config.graph is not None and runs["entry_failed"]:
        out.print(
            Text(
                f"note: {runs['entry_failed']:,} of {runs['entry_enqueued']:,} queued runs of your graph ended FAILED "
                "(allowed: a graph may fail; the runs got input {\"n\": i}). Run one seed with --seed to see why "
                "in its trace.",
                style="yellow",
            )
        )
    if not failed:
        return
    verdicts = Table(title="failing seeds", title_justify="left", header_style="bold")
    for column in ("seed", "invariant", "detail"):
        verdicts.add_column(column)
    for result in failed[:50]:
        verdicts.add_row(Text(str(result.seed)), Text(result.invariant or ""), Text(printable(result.detail or "")))
    out.print(verdicts)
    shortest = min(failed, key=lambda r: len(r.trace))
    if show_trace:
        out.print(Text(f"shortest failing trace: seed {shortest.seed} (printed above)", style="bold"))
    else:
        out.print(Text(f"shortest failing trace: seed {shortest.seed}, {len(shortest.trace)} lines", style="bold"))
        for line in shortest.trace:
            out.print(Text(printable(line)), soft_wrap=True)
    out.print(Text(f"replay: {config.command(shortest.seed)}", style="bold"))


def _replay_regressions(state: CliState) -> None:
    rows = []
    wrong = []
    for kept in REGRESSION_SEEDS:
        config = SimConfig(store=kept.store, plant=frozenset(kept.plant))
        result = next(iter(run_seeds(config, [kept.seed], 1)))
        expected_ok = not kept.plant
        good = result.ok == expected_ok
        rows.append((kept, result, good, config.command(kept.seed)))
        if not good:
            wrong.append(config.command(kept.seed))
    if state.json_output:
        state.emit(
            [
                {
                    "seed": kept.seed,
                    "store": kept.store,
                    "plant": list(kept.plant),
                    "expected": "pass" if not kept.plant else "caught",
                    "verdict": "pass" if result.ok else f"failed: {result.invariant}",
                    "ok": good,
                    "found": kept.found,
                    "command": command,
                }
                for kept, result, good, command in rows
            ]
        )
    else:
        table = Table(title="regression seeds", title_justify="left", header_style="bold")
        for column in ("seed", "store", "plant", "expected", "verdict", "found"):
            table.add_column(column)
        for kept, result, good, _command in rows:
            table.add_row(
                Text(str(kept.seed)),
                Text(kept.store),
                Text(",".join(kept.plant) or "-"),
                Text("pass" if not kept.plant else "caught"),
                Text("pass" if result.ok else f"failed: {result.invariant}", style="green" if good else "red"),
                Text(kept.found),
            )
        state.out.print(table)
        state.out.print(
            Text(f"{len(rows) - len(wrong)} of {len(rows)} regression seeds gave their recorded verdict",
                 style="red" if wrong else "green")
        )
    if wrong:
        raise CliError(f"{len(wrong)} regression seed(s) changed verdict; replay: {wrong[0]}", kind="SimulationFailed")


simulate_command.name = "simulate"

__all__ = ["run_seeds", "simulate_command"]
