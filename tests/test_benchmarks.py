"""The benchmark command runs and reports the rows of its sections (smoke tests: no speed is ever asserted)."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sqlite_section_reports_ratios_against_same_run_baselines(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", "sqlite", "--seconds", "0.05",
         "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"] == []
    measures = [row["measure"] for row in report["rows"]]
    commits = [f"fenced commits/s, {who}, synchronous={mode}" for mode in ("NORMAL", "FULL")
               for who in ("1 writer", "8 writers")]
    reads = [f"{name} median, 2,000-checkpoint thread" for name in ("latest", "history(limit=100)")]
    assert measures == [
        *(measure for measure in commits for _ in range(2)),  # against LangGraph, then against raw sqlite3
        "WAL pages per commit",
        *(measure for measure in reads for _ in range(2)),  # against a short thread, then against LangGraph
    ]
    langgraph = [row for row in report["rows"] if "LangGraph" in row["baseline_label"]]
    assert len(langgraph) == 6
    for row in report["rows"]:
        if "not installed" in row["baseline_label"]:  # LangGraph's saver is never a dependency
            assert row["baseline"] is None and row["ratio"] is None and row["met"] is None
            continue
        assert row["value"] > 0 and row["baseline"] > 0
        assert row["ratio"] == row["value"] / row["baseline"]
        assert row["met"] in (True, False)
    goals = {row["measure"]: row["goal"] for row in langgraph if "commits" in row["measure"]}
    assert {goal for measure, goal in goals.items() if "NORMAL" in measure} == {"≥ 1.5×"}
    assert {goal for measure, goal in goals.items() if "FULL" in measure} == {"≥ 1.8×"}
    wal = next(row for row in report["rows"] if row["measure"] == "WAL pages per commit")
    assert wal["unit"] == "pages" and wal["goal"] == "≤ 2×" and "raw" in wal["baseline_label"]
    assert "journal_mode=WAL" in report["rows"][0]["note"]
    assert list(tmp_path.iterdir()) == []  # the benchmark removes its files


def test_unknown_section_is_a_usage_error():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown section" in done.stderr


def _bench_module(name: str):
    """Imports ``benchmarks/<name>.py`` (the benchmarks are scripts, not a package)."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_runtime_section_reports_supersteps_and_memory_per_live_run(tmp_path):
    bench = _bench_module("bench_runtime")
    benchlib = _bench_module("benchlib")
    settings = benchlib.Settings(quick=True, workdir=tmp_path, seconds=0.05)
    rows = bench.run(settings, runs=4, parked=5)
    assert [row.measure for row in rows] == [
        "supersteps/s, 4 concurrent runs (sqlite)",
        "supersteps/s, 4 concurrent runs (memory)",
        "Python heap per live run (tracemalloc)",
        "RSS per live run",
    ]
    for row in rows[:2]:
        assert row.section == "runtime" and row.unit == "/s"
        assert row.value > 0 and row.baseline > 0
        assert row.met in (True, False) and row.goal == "≥ 0.8×"
        assert "4 writer threads" in row.baseline_label
    for row in rows[2:]:
        assert row.unit == "KiB" and row.goal == "report" and row.met is None
        assert math.isfinite(row.value) and math.isfinite(row.baseline)
    assert rows[2].value > 0 and rows[2].baseline > 0  # a live run and a stored thread both hold Python objects
    assert "stored thread" in rows[2].baseline_label and "bare Python thread" in rows[3].baseline_label


def test_walks_section_reports_live_commits_share_and_walk_speed(tmp_path):
    bench = _bench_module("bench_walks")
    benchlib = _bench_module("benchlib")
    settings = benchlib.Settings(quick=True, workdir=tmp_path, seconds=0.05)
    rows = bench.run(settings)
    measures = [row.measure for row in rows]
    assert measures[:2] == ["live commits/s, walk at share 0.1", "commit p99, walk at share 0.1"]
    assert measures[2].startswith("walk's measured share") and measures[3] == "walk threads/s at share 1.0"
    assert len(rows) in (4, 8)  # PostgreSQL's rows too when THREADLOOM_BENCH_PG names a server
    for row in rows:
        assert row.value > 0 and row.baseline > 0
    assert 0 < rows[2].value <= 1.0 and 0.1 / 8 <= rows[2].baseline <= 0.1 + 1e-9  # the share in force


def test_async_section_reports_runs_threads_and_the_pool(tmp_path, monkeypatch):
    monkeypatch.delenv("THREADLOOM_BENCH_PG", raising=False)
    bench = _bench_module("bench_async")
    benchlib = _bench_module("benchlib")
    rows = bench.run(benchlib.Settings(quick=True, workdir=tmp_path, seconds=0.05), runs=8, calls=40)
    assert [row.measure for row in rows] == [
        "completed runs/s, 8 concurrent async runs",
        "OS threads added, 8 parked async runs",
        "RSS per parked async run",
        "OS threads with 8 idle async subscriptions",
        "AsyncStore current_claim calls/s, 40 concurrent, max_workers=2",
        "AsyncStore current_claim calls/s, 40 concurrent, max_workers=32",
        "wake latency of idle async subscriptions (PostgreSQL)",
    ]
    assert rows[0].value > 0 and rows[0].baseline > 0
    # A thread actor per run (give or take an exiting warm-up thread); a sync node adds a thread of its own.
    assert 6 <= rows[1].value <= 10 and 14 <= rows[1].baseline <= 18
    assert rows[3].met is True  # no thread per subscription
    assert list(tmp_path.iterdir()) == []  # the benchmark removes its files


def test_langgraph_graph_rows_show_both_figures_of_the_median_round(monkeypatch):
    bench = _bench_module("bench_langgraph")
    order: list[str] = []
    # per round (ours, theirs): ratios 2.0, 0.5, 1.0, 4.0, 0.8 -> the median round is the third
    figures = {"ours": iter([200.0, 50.0, 300.0, 400.0, 80.0]), "theirs": iter([100.0, 100.0, 300.0, 100.0, 100.0])}

    def supersteps(saver, seconds):
        assert seconds == 0.25
        order.append(saver)
        return next(figures[saver])

    monkeypatch.setattr(bench, "_supersteps", supersteps)
    assert bench._rates("ours", "theirs", 0.25, 5) == (300.0, 300.0)
    # both savers each round, the first alternating
    assert order == ["ours", "theirs", "theirs", "ours", "ours", "theirs", "theirs", "ours", "ours", "theirs"]
