"""Shared fixtures of threadloom's own tests (kept small: the contract suite brings its own)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# ``python -m pytest`` puts the working directory on sys.path; from the repository root (the package threadloom
# itself) that would make threadloom's ./langgraph shadow the real LangGraph package. threadloom is imported
# through its installation, never through that entry.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

from threadloom.domain.clock import ManualClock  # noqa: E402
from threadloom.testing.harness import START  # noqa: E402

# The machine is small and shared: a property test never fails on wall-clock time.
settings.register_profile("threadloom", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples on every run, so a red build is reproducible and never a coin toss.
settings.register_profile("ci", parent=settings.get_profile("threadloom"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "threadloom")


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock at the harness's start instant."""
    return ManualClock(START)


@pytest.fixture
def restore_cli_logging():
    """The ``threadloom`` command configures structlog and the root logger; give the next test the defaults back."""
    import logging

    import structlog

    from threadloom.cli.logs import DRIVER_LOGGERS

    root = logging.getLogger()
    level = root.level
    drivers = {name: logging.getLogger(name).level for name in DRIVER_LOGGERS}
    yield
    structlog.reset_defaults()
    for handler in [h for h in root.handlers if h.get_name() == "threadloom-cli"]:
        root.removeHandler(handler)
    root.setLevel(level)
    for name, driver_level in drivers.items():
        logging.getLogger(name).setLevel(driver_level)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def each_store(request, tmp_path):
    """A fresh store of each kind: memory, a SQLite file under ``tmp_path``, a PostgreSQL schema dropped after."""
    if request.param == "postgres":
        from threadloom.testing.postgres_harness import PgHarness

        harness = PgHarness()
        try:
            yield harness.open_pg()
        finally:
            harness.cleanup()
        return
    from threadloom.persistence.memory.store import InMemoryCheckpointer
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    opened = InMemoryCheckpointer() if request.param == "memory" else SqliteCheckpointer.open(tmp_path / "store.db")
    yield opened
    opened.close()
