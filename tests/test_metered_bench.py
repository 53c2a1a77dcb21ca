"""The benchmark's ``metered`` section runs and reports the wrapper's commit overhead (no speed asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_metered_section_reports_wrapped_against_bare_commits(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", "metered", "--seconds", "0.05",
         "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"] == []
    labels = [row["measure"] for row in report["rows"]]
    assert "commits per CPU-second through MeteredCheckpointer (memory, 1 writer)" in labels
    assert "commits per CPU-second through MeteredCheckpointer (sqlite, 1 writer)" in labels
    for row in report["rows"]:
        assert row["section"] == "metered" and row["unit"] == "/s"
        assert row["value"] > 0 and row["baseline"] > 0 and row["met"] in (True, False)
        assert row["ratio"] == row["value"] / row["baseline"]
    assert list(tmp_path.iterdir()) == []  # the benchmark removes its files
