"""``threadloom demo --walk``: the rolling-release demonstration across real OS processes (a real SIGKILL of the
walking process), on SQLite and PostgreSQL, and its audit, which must fail when a row is stamped wrongly.

The end-to-end tests assert on what the demo recorded (the walk record, the moments it saw, the audit's counts),
never on their own duration.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner

from threadloom.cli.demo.audit import audit, misstamp_one
from threadloom.cli.demo.walk_plan import TENANTS, WalkPlan, fill_v1, release_access
from threadloom.cli.main import cli
from threadloom.persistence import open_store

AUDIT = ["rows unstamped", "rows mis-stamped", "cross-tenant reads", "rows hidden from their tenant", "rows audited"]


def run_demo(*args: str, timeout: float = 240) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "threadloom", "--json", "demo", "--walk", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {}
    return done.returncode, report, done.stderr + done.stdout


def assert_clean_run(report: dict[str, Any], threads: int) -> None:
    assert report["passed"] is True
    assert all(check["passed"] for check in report["checks"]), report["checks"]
    assert [check["name"] for check in report["checks"]][-len(AUDIT) :] == AUDIT
    found = report["audit"]
    assert found["clean"] and found["cross_tenant_reads"] == 0 and found["hidden"] == 0
    assert sum(found["unstamped"].values()) == 0 and sum(found["misstamped"].values()) == 0
    rows = found["rows"]
    assert rows["thread rows"] == threads and rows["checkpoints"] >= 3 * threads and rows["effect records"] >= threads
    walk = report["walk"]
    assert walk["completed"] and walk["schema"] == report["schemas"]["v2"] and walk["count"] >= threads
    # the v2 walk was claimed (its first record's time) only once the v1 process had exited
    assert datetime.fromisoformat(report["walk_claimed_at"]) >= datetime.fromisoformat(report["v1_stopped_at"])
    killed, resumed = report["killed"], report["resumed"]
    assert killed is not None and resumed is not None, "no walker was killed mid-walk"
    assert killed["worker"].startswith("v2-") and resumed["worker"].startswith("v2-")
    assert resumed["worker"] != killed["worker"] and resumed["count"] > killed["count"]
    statuses = {w["name"]: w["status"] for w in report["workers"]}
    assert statuses["v1-1"] == "stopped" and statuses[killed["worker"]] == "SIGKILLed"
    assert statuses[resumed["worker"]] == "stopped"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_walk_demo_on_sqlite_exits_0_with_a_clean_audit(tmp_path: Any) -> None:
    code, report, output = run_demo("--threads", "90", "--overlap", "1s")
    assert code == 0, output
    assert_clean_run(report, 90)
    assert report["folder"] is None and report["inspect"] == ""  # nothing kept without --keep


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_walk_demo_on_postgresql_exits_0_with_a_clean_audit() -> None:
    """In a throwaway schema named in the store URL (``?schema=``), dropped afterwards."""
    from threadloom.testing.postgres_harness import drop_schema, new_schema_name, postgres_dsn

    dsn = postgres_dsn()
    if not dsn.startswith(("postgresql://", "postgres://")):
        pytest.skip("the demo takes a postgresql:// URL; the test server is named by a key=value string")
    schema = new_schema_name()
    url = f"{dsn}{'&' if '?' in dsn.split('@')[-1] else '?'}schema={schema}"
    try:
        code, report, output = run_demo(
            "--store", url, "--threads", "60", "--walk-rate", "20", "--walk-share", "0.5", "--overlap", "1s"
        )  # fmt: skip
        assert code == 0, output
        assert_clean_run(report, 60)
        assert report["graph_id"].startswith("support-agent-")  # a named store: a graph kind of its own
        assert "walks --graph" in report["inspect"]
    finally:
        drop_schema(dsn, schema)


@pytest.mark.slow
def test_a_row_stamped_for_another_tenant_fails_the_demo() -> None:
    code, report, output = run_demo("--threads", "24", "--overlap", "500ms", "--no-crash", "--plant-misstamp")
    assert code == 1, output
    assert report["passed"] is False
    found = report["audit"]
    assert sum(found["misstamped"].values()) == 1 and found["misstamped"]["checkpoints"] == 1
    # The store never returns a checkpoint committed for another tenant, whatever its stamp says: the row is hidden
    # from its own tenant (stamped for another) and not read by the other one (committed for the first).
    assert found["cross_tenant_reads"] == 0 and found["hidden"] >= 1
    failed = {check["name"] for check in report["checks"] if not check["passed"]}
    assert {"rows mis-stamped", "rows hidden from their tenant"} <= failed
    assert "v2's walk completed over every thread" not in failed  # the scenario itself went well


def test_the_audit_counts_rows_an_older_schema_stamped_then_none_once_stamped(tmp_path: Any) -> None:
    """The audit reads the stamp columns before any tenant read (whose follower would fix them first)."""
    plan = WalkPlan(threads=8)
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    v1 = open_store(url, access=release_access("v1"))
    owners = fill_v1(v1, plan)
    v1.close()
    v2_access = release_access("v2")
    store = open_store(url, access=v2_access)
    try:
        before = audit(store, v2_access, plan.graph_id, owners, TENANTS)
        assert not before.clean
        assert before.unstamped["checkpoints"] == before.rows["checkpoints"] == 8 * 3
        assert before.unstamped["thread rows"] == 8 and sum(before.misstamped.values()) == 0
        assert before.cross_tenant == 0  # tenant reads stamp (the follower) and never cross tenants
        after = audit(store, v2_access, plan.graph_id, owners, TENANTS)  # the follower stamped every thread
        assert after.clean, after.examples
        assert misstamp_one(store, plan.thread_id(1), "acme") == 1  # thread 1 is globex's
        planted = audit(store, v2_access, plan.graph_id, owners, TENANTS)
        assert planted.misstamped["checkpoints"] == 1 and not planted.clean
        assert planted.cross_tenant == 0 and planted.hidden == 1  # shown to neither tenant
        assert any("mis-stamped checkpoints row of" in example for example in planted.examples)
    finally:
        store.close()


def test_the_walk_demo_refuses_what_it_cannot_run() -> None:
    runner = CliRunner()
    memory = runner.invoke(cli, ["demo", "--walk", "--store", "memory://"])
    assert memory.exit_code == 2 and "sqlite" in memory.output
    metrics = runner.invoke(cli, ["demo", "--walk", "--metrics-port", "9999"])
    assert metrics.exit_code == 2 and "--metrics-port" in metrics.output
    listed = runner.invoke(cli, ["--help"])
    assert "demo-walk-worker" not in listed.output


def test_the_audit_of_a_rerun_on_the_same_store_judges_earlier_threads_by_their_own_tenant(tmp_path: Any) -> None:
    """Found by a new user: ``demo --walk`` run a second time on one schema counted the first run's threads, which
    its tenants' exports rightly return, as cross-tenant reads ("acme read chat-…-0001 of None")."""
    url = f"sqlite:///{tmp_path / 'rerun.db'}"
    earlier = WalkPlan(threads=6, prefix="chat-aaa", graph_id="demo-aaa")
    later = WalkPlan(threads=6, prefix="chat-bbb", graph_id="demo-bbb")
    v2_access = release_access("v2")
    store = open_store(url, access=v2_access)
    try:
        fill_v1(store, earlier)
        owners = fill_v1(store, later)
        audit(store, v2_access, later.graph_id, owners, TENANTS)  # the follower stamps what tenant reads touch
        found = audit(store, v2_access, later.graph_id, owners, TENANTS)
        assert found.clean and found.cross_tenant == 0, found.examples
        exported = {t.thread_id for t in store.export_tenant("acme", limit=100).threads}
        assert any(t.startswith("chat-aaa") for t in exported)  # the earlier run's threads were in the export
    finally:
        store.close()
