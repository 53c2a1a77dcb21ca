"""The operator docs name what the code has: every metric, every run event type, every command, the license."""

from __future__ import annotations

import tomllib
from pathlib import Path

from threadloom.actors.graph import RUN_EVENTS
from threadloom.actors.metrics import RUNTIME_METRICS
from threadloom.actors.walker import WALK_METRICS
from threadloom.cli.main import LAZY_COMMANDS
from threadloom.persistence.metrics.metered import STORE_METRICS
from threadloom.persistence.metrics.metered_queue import QUEUE_METRICS

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_metric_and_run_event_type_is_in_the_operator_docs() -> None:
    metrics = (*STORE_METRICS, *QUEUE_METRICS, *RUNTIME_METRICS, *WALK_METRICS)
    missing = [spec.name for spec in metrics if f"`{spec.name}`" not in OPERATIONS]
    assert missing == []
    assert [kind for kind in sorted(RUN_EVENTS) if f"`{kind}`" not in OPERATIONS] == []


def test_the_readme_links_the_docs_and_lists_every_command() -> None:
    assert "docs/operations.md" in README
    # Hidden ones too: `demo-worker` is not listed by --help, but the README says it writes.
    assert [name for name in LAZY_COMMANDS if f"| `{name} " not in README and f"| `{name}`" not in README] == []


def test_the_license_file_is_the_one_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")
