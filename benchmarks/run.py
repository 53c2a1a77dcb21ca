"""Runs threadloom's benchmarks and prints one table: each figure next to a baseline measured in the same run.

Usage (from a clone, with the package installed)::

    python benchmarks/run.py                 # every section (about 2 minutes)
    python benchmarks/run.py --quick         # the same rows on smaller data (about a minute)
    python benchmarks/run.py --only sqlite   # one section (repeat --only for several)

Sections are the modules ``benchmarks/bench_<name>.py`` that define ``SECTION`` (see ``benchlib.py``); a new
section plugs in by adding such a module. Never run in CI's test suite: timings on a shared machine are
figures to read, not assertions.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from benchlib import Row, Section, SectionUnavailable, Settings, quiet_logs  # noqa: E402


def discover() -> dict[str, Section]:
    """Every section of ``benchmarks/bench_*.py``, by name, in print order."""
    found: list[Section] = []
    for path in sorted(HERE.glob("bench_*.py")):
        module = importlib.import_module(path.stem)
        section = getattr(module, "SECTION", None)
        if isinstance(section, Section):
            found.append(section)
    found.sort(key=lambda s: (s.order, s.name))
    return {section.name: section for section in found}


def _figure(value: float, unit: str) -> str:
    if math.isnan(value):
        return "—"  # no figure: a baseline that could not be measured here (its row says why)
    if math.isinf(value):
        return str(value)
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "µs":
        return f"{value:,.1f} µs" if value < 100 else f"{value:,.0f} µs"
    return f"{value:,.3g} {unit}"


def render(rows: list[Row], skipped: list[tuple[str, str]], settings: Settings, console: Console) -> None:
    """Prints the one table of the run."""
    mode = "quick" if settings.quick else "full"
    table = Table(title=f"threadloom benchmarks ({mode} run; ratio = threadloom / baseline, same run)",
                  title_justify="left", header_style="bold")
    for column, justify in (
        ("section", "left"), ("measure", "left"), ("threadloom", "right"), ("baseline", "left"),
        ("baseline figure", "right"), ("ratio", "right"), ("goal", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        verdict = "" if row.met is None else (" [green]met[/]" if row.met else " [red]missed[/]")
        table.add_row(
            row.section, escape(row.measure), _figure(row.value, row.unit), escape(row.baseline_label),
            _figure(row.baseline, row.unit), "—" if math.isnan(row.ratio) else f"{row.ratio:.2f}×",
            f"{escape(row.goal)}{verdict}",
        )
    for name, reason in skipped:
        table.add_row(name, f"[dim]skipped: {escape(reason)}[/]", "", "", "", "", "")
    console.print(table)
    notes = list(dict.fromkeys(row.note for row in rows if row.note))
    for note in notes:
        console.print(f"[dim]• {escape(note)}[/]")


def _number(value: float) -> float | None:
    """A figure for the JSON output: None for NaN (a baseline not measured here), which JSON cannot hold."""
    return None if math.isnan(value) else value


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=160 if wide else None)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="Smaller data and shorter measurements (about a minute).")
@click.option("--only", "only", multiple=True, metavar="SECTION", help="Run only this section (repeatable).")
@click.option("--seconds", type=click.FloatRange(min=0.05), default=None, help="Seconds per throughput measurement.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to put the benchmark's files (default: the system's temporary directory). "
                   "Use a directory on the disk you deploy on: a RAM file system makes fsync free.")
@click.option("--json", "json_output", is_flag=True, help="Print the rows as JSON instead of a table.")
def main(quick: bool, only: tuple[str, ...], seconds: float | None, directory: Path | None, json_output: bool) -> None:
    """Run threadloom's benchmarks and print one table of ratios against same-run baselines."""
    quiet_logs()  # the benchmark is an application: it shows warnings, not every store's info lines
    sections = discover()
    unknown = [name for name in only if name not in sections]
    if unknown:
        raise click.UsageError(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(sections)}")
    chosen = [sections[name] for name in (only or sections)]
    err = _console(stderr=True)
    rows: list[Row] = []
    skipped: list[tuple[str, str]] = []
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="threadloom-bench-", dir=directory) as workdir:
        for section in chosen:
            settings = Settings(
                quick=quick,
                workdir=Path(workdir) / section.name,
                seconds=seconds if seconds is not None else (0.5 if quick else 2.0),
            )
            settings.workdir.mkdir()
            with err.status(f"[bold]{section.name}[/]: {section.title}"):
                try:
                    rows.extend(section.run(settings))
                except SectionUnavailable as reason:
                    skipped.append((section.name, str(reason)))
    settings = Settings(quick=quick, workdir=Path("."), seconds=seconds or 0.0)
    if json_output:
        click.echo(json.dumps(
            {
                "quick": quick,
                "rows": [
                    {"section": r.section, "measure": r.measure, "value": _number(r.value), "unit": r.unit,
                     "baseline": _number(r.baseline), "baseline_label": r.baseline_label, "ratio": _number(r.ratio),
                     "goal": r.goal, "met": r.met, "note": r.note}
                    for r in rows
                ],
                "skipped": [{"section": name, "reason": reason} for name, reason in skipped],
                "elapsed_s": round(time.perf_counter() - began, 1),
            },
            ensure_ascii=False,
            indent=2,
        ))
        return
    render(rows, skipped, settings, _console())
    err.print(f"[dim]took {time.perf_counter() - began:.1f} s[/]")


if __name__ == "__main__":
    main()
