"""The start-up benchmark section runs and reports its rows (a smoke test: no speed is ever asserted)."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench_module(name: str):
    """Imports ``benchmarks/<name>.py`` (the benchmarks are scripts, not a package)."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_startup_section_reports_help_and_version_against_an_interpreter_importing_click(tmp_path):
    bench = _bench_module("bench_startup")
    benchlib = _bench_module("benchlib")
    rows = bench.run(benchlib.Settings(quick=True, workdir=tmp_path, seconds=0.05), rounds=1)
    assert [row.measure for row in rows] == [
        "threadloom --help",
        "threadloom --version",
        'python -c "import click"',
    ]
    for row in rows:
        assert row.section == "startup" and row.unit == "ms"
        assert math.isfinite(row.value) and row.value > 0 and row.baseline > 0
    help_row, version_row, click_row = rows
    assert help_row.baseline == version_row.baseline == click_row.value  # one baseline, measured in this run
    for row in (help_row, version_row):
        assert row.goal == "≤ 2×" and row.met == (row.ratio <= 2.0)
        assert row.baseline_label == "python -c pass + import click"
    assert click_row.met is None and click_row.baseline_label == "python -c pass"
    assert "python -c pass" in help_row.note
    assert list(tmp_path.iterdir()) == []  # --help opened no store in the working directory


def test_the_section_is_found_by_the_benchmark_command():
    run = _bench_module("run")
    assert "startup" in run.discover()
