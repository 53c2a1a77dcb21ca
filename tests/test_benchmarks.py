"""The benchmark command runs and reports every row of its SQLite section (a smoke test: no speed asserted)."""

from __future__ import annotations

import json
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
    assert measures == [
        "fenced commits/s, 1 writer",
        "fenced commits/s, 8 writers",
        "latest median, 2,000-checkpoint thread",
        "history(limit=100) median, 2,000-checkpoint thread",
    ]
    for row in report["rows"]:
        assert row["value"] > 0 and row["baseline"] > 0
        assert row["ratio"] == row["value"] / row["baseline"]
        assert row["met"] in (True, False)
    assert "journal_mode=WAL" in report["rows"][0]["note"]
    assert list(tmp_path.iterdir()) == []  # the benchmark removes its files


def test_unknown_section_is_a_usage_error():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown section" in done.stderr
