"""Limits and errors that tell the truth: record sizes per store, a full disk under SQLite, skewed clocks on one
SQLite file (README "Limits")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    PostgresCheckpointerConfig,
    ValidationError,
    open_store,
)
from threadloom.persistence.base import DEFAULT_MAX_JSON_SIZE, MAX_MAX_JSON_SIZE

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _checkpoint(cp_id: str, parent: str | None, state: object) -> Checkpoint:
    return Checkpoint(id=cp_id, parent=parent, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING,
                      created_at=NOW, state=state)  # fmt: skip


def _stores(tmp_path: Path, **options: object):
    yield "memory", open_store("memory://", **options)
    yield "sqlite", open_store(f"sqlite:///{tmp_path}/s.db", **options)


# -- sizes ---------------------------------------------------------------------------------------------------------


def test_max_json_size_is_an_option_of_every_store_and_refuses_a_larger_record_up_front(tmp_path: Path) -> None:
    for name, store in _stores(tmp_path, max_json_size=1000):
        with store:
            assert store.max_json_size == 1000, name
            token = store.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5))).token
            store.commit("t", Commit(token=token, checkpoint=_checkpoint("c1", None, {"x": "a" * 500})))
            with pytest.raises(ValidationError) as info:
                store.commit("t", Commit(token=token, checkpoint=_checkpoint("c2", "c1", {"x": "a" * 1000})))
            assert info.value.field == "commit.checkpoint.state", name
            assert "1,000 per record (max_json_size)" in info.value.problems[0], name
            with pytest.raises(ValidationError) as info:
                store.commit("t", Commit(token=token, events=[
                    EventDraft(run_id="r", type="e", timestamp=NOW), EventDraft(run_id="r", type="e" * 255,
                                                                               timestamp=NOW, payload="a" * 700)]))  # fmt: skip
            assert info.value.field == "commit.events[1].payload", name
            assert store.latest("t").checkpoint.id == "c1" and store.events_after("t", 0, 10) == [], name
    for name, store in _stores(tmp_path):
        with store:
            assert store.max_json_size == DEFAULT_MAX_JSON_SIZE == 16 * 1024 * 1024, name


def test_the_limit_counts_the_stored_record_not_the_state_alone(tmp_path: Path) -> None:
    """README "Limits": a checkpoint record is its state plus about 200 characters of its other fields."""
    for name, store in _stores(tmp_path, max_json_size=1000):
        with store:
            token = store.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5))).token
            state = {"x": "a" * 900}  # 910 characters of JSON: under the limit by itself
            assert len(json.dumps(state, separators=(",", ":"))) < 1000
            with pytest.raises(ValidationError) as info:
                store.commit("t", Commit(token=token, checkpoint=_checkpoint("c1", None, state)))
            assert info.value.field == "commit.checkpoint.state", name
            stored = int(info.value.problems[0].split(" characters")[0].replace("is ", "").replace(",", ""))
            assert 900 + 150 < stored < 900 + 250, (name, info.value.problems)  # about 200 more than the state
            fits = {"x": "a" * (1000 - 200 - 20)}
            store.commit("t", Commit(token=token, checkpoint=_checkpoint("c1", None, fits)))
            assert store.latest("t").checkpoint.state == fits, name


@pytest.mark.parametrize("bad", [0, -1, True, "16", 1.5, MAX_MAX_JSON_SIZE + 1])
def test_a_bad_max_json_size_is_refused_naming_it(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValidationError) as info:
        open_store("memory://", max_json_size=bad)
    assert info.value.field == "max_json_size"
    with pytest.raises(ValidationError) as info:
        open_store(f"sqlite:///{tmp_path}/bad.db", max_json_size=bad)
    assert info.value.field == "max_json_size"
    assert not (tmp_path / "bad.db").exists()
    with pytest.raises(ValidationError) as info:
        PostgresCheckpointerConfig(max_json_size=bad)
    assert info.value.field == "config.max_json_size"


def test_postgres_takes_max_json_size_through_open_store_and_its_config() -> None:
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        harness.open()  # skips (or fails under CI) without a server
        url = f"{harness.dsn}{'&' if '?' in harness.dsn else '?'}schema={harness.schema}"
        with open_store(url, max_json_size=2000) as store:
            assert store.max_json_size == 2000
            token = store.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5))).token
            with pytest.raises(ValidationError) as info:
                store.commit("t", Commit(token=token, checkpoint=_checkpoint("c1", None, ["a" * 2000])))
            assert info.value.field == "commit.checkpoint.state"
            assert store.latest("t") is None
        assert harness.open_pg(max_json_size=5000).max_json_size == 5000
    finally:
        harness.cleanup()


# -- a full disk (SQLite) ------------------------------------------------------------------------------------------

_FULL_DISK = textwrap.dedent(
    """
    import json, os, sqlite3, subprocess, sys
    from datetime import datetime, timedelta, timezone
    from threadloom import (Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft, OutcomeUnknown,
                            ProcessingError, open_store)

    mount = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=448k", "tmpfs", mount], check=True)
    with open(os.path.join(mount, "ballast"), "wb") as f:
        f.write(b"x" * 64 * 1024)
    now = datetime.now(timezone.utc)
    store = open_store(f"sqlite:///{mount}/store.db")
    token = store.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5))).token
    acked, latest, failure, commit = [], None, None, None
    for i in range(10_000):
        cp = Checkpoint(id=f"c{i}", parent=latest, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING,
                        created_at=now, state={"step": i, "pad": "p" * 1500})
        commit = Commit(token=token, checkpoint=cp, events=[EventDraft(run_id="r", type="e", timestamp=now, payload=i)])
        try:
            acked.extend(r.seq for r in store.commit("t", commit))
        except ProcessingError as error:
            failure = {"type": type(error).__name__, "retryable": error.retryable, "message": str(error),
                       "cause": repr(error.__cause__)}
            break
        latest = cp.id
    after = store.latest("t")
    seqs = [r.seq for r in store.events_after("t", 0, 10_000)]
    check = sqlite3.connect(os.path.join(mount, "store.db")).execute("PRAGMA integrity_check").fetchall()
    os.remove(os.path.join(mount, "ballast"))
    retried = [r.seq for r in store.commit("t", commit)]  # the same commit: applies once, since it did not before
    print(json.dumps({"acked": acked, "latest_acked": latest, "failure": failure,
                      "after_latest": after.checkpoint.id, "after_seqs": seqs, "integrity": check,
                      "retried": retried, "final_seqs": [r.seq for r in store.events_after("t", 0, 10_000)],
                      "final_latest": store.latest("t").checkpoint.id, "tried": commit.checkpoint.id}))
    """
)


def _in_a_mount_namespace(tmp_path: Path, script: str, *args: str) -> dict:
    """Runs ``script`` in a new mount namespace (``unshare``: root in a user namespace of its own) where it may
    mount a small tmpfs; skips, or fails under ``CI=true``, where the system allows neither."""
    unshare = shutil.which("unshare")
    probe = (
        subprocess.run([unshare, "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
        if unshare
        else None
    )
    if probe is None or probe.returncode != 0:
        reason = f"a full-disk test needs unshare and a tmpfs mount: {probe.stderr.strip() if probe else 'no unshare'}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert unshare is not None
    done = subprocess.run([unshare, "-rm", sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_full_disk_refuses_a_sqlite_commit_as_not_applied_and_nothing_is_half_written(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    got = _in_a_mount_namespace(tmp_path, _FULL_DISK, str(mount))
    failure = got["failure"]
    assert failure is not None, "the disk never filled"
    assert failure["type"] == "StoreUnavailable" and failure["retryable"], failure
    assert "full" in failure["message"] and "nothing was written" in failure["message"], failure
    assert "disk is full" in failure["cause"], failure
    assert len(got["acked"]) >= 3  # the store held some commits before the disk filled
    # Nothing half-written: the refused commit left no checkpoint and spent no number; the file is sound.
    assert got["after_latest"] == got["latest_acked"]
    assert got["after_seqs"] == got["acked"] == list(range(1, len(got["acked"]) + 1))
    assert got["integrity"] == [["ok"]]
    # Space freed, the same commit applies, once (it had not applied: a fenced retry of an applied one is refused).
    assert got["retried"] == [len(got["acked"]) + 1]
    assert got["final_latest"] == got["tried"]
    assert got["final_seqs"] == list(range(1, len(got["acked"]) + 2))


# -- skewed clocks on one SQLite file ------------------------------------------------------------------------------


def _skew_reports(logs: list[dict]) -> list[tuple[str, str | None, int]]:
    return [(e["op"], e["holder"], e["skew_ms"]) for e in logs if e["event"] == "clock.skew_detected"]


def test_a_process_that_reads_a_claim_or_commit_stamped_in_its_future_reports_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import structlog

    from threadloom import InMemoryMeter, ManualClock, MeteredCheckpointer, SqliteCheckpointer, ThreadBusy
    from threadloom.persistence.sqlite import skew

    path = tmp_path / "one.db"
    behind, ahead = ManualClock(NOW), ManualClock(NOW + timedelta(seconds=60))
    meter = InMemoryMeter()
    slow = MeteredCheckpointer(SqliteCheckpointer.open(path, clock=behind), meter)
    fast = SqliteCheckpointer.open(path, clock=ahead)
    near = SqliteCheckpointer.open(path, clock=ManualClock(NOW + timedelta(seconds=4)))  # within the 5 s tolerance
    ttl = timedelta(seconds=30)
    with structlog.testing.capture_logs() as logs:
        claim = fast.claim("t", ClaimRequest(holder="run-fast", ttl=ttl))
        fast.commit("t", Commit(token=claim.token, checkpoint=Checkpoint(
            id="c1", parent=None, thread_id="t", run_id="run-fast", status=CheckpointStatus.RUNNING, created_at=NOW)))
        for _ in range(3):  # the fast process's claim, renewed a moment ago, is in the slow one's future
            with pytest.raises(ThreadBusy):
                slow.claim("t", ClaimRequest(holder="run-slow", ttl=ttl))
        assert _skew_reports(logs) == [("claim", "run-fast", 60_000)]  # once per holder per period
        report = next(e for e in logs if e["event"] == "clock.skew_detected")
        assert report["thread_id"] == "t" and report["tolerance_ms"] == 5000 and report["log_level"] == "warning"
        assert str(path) in report["path"]
        # The near process's stamps are within the tolerance, and the fast one sees only stamps in its past.
        near_claim = near.claim("u", ClaimRequest(holder="run-near", ttl=ttl))
        near.commit("u", Commit(token=near_claim.token, checkpoint=Checkpoint(
            id="u1", parent=None, thread_id="u", run_id="run-near", status=CheckpointStatus.RUNNING, created_at=NOW)))
        near.release("u", near_claim.token)
        slow.claim("u", ClaimRequest(holder="run-slow", ttl=ttl))
        # The harm the README warns of: the fast process takes over a claim granted a moment ago, unaware.
        assert fast.claim("u", ClaimRequest(holder="run-fast", ttl=ttl)).taken_over_from == "run-slow"
        assert _skew_reports(logs) == [("claim", "run-fast", 60_000)]
        # Each period the holder is reported again: here a commit on a thread the fast process committed to.
        monkeypatch.setattr(skew, "SKEW_REPORT_PERIOD", timedelta(0))
        fast.release("t", claim.token)
        ahead.advance(timedelta(seconds=1))
        behind.advance(timedelta(seconds=1))
        mine = slow.claim("t", ClaimRequest(holder="run-slow", ttl=ttl))
        slow.commit("t", Commit(token=mine.token, events=[EventDraft(run_id="run-slow", type="e", timestamp=NOW)]))
    assert _skew_reports(logs) == [("claim", "run-fast", 60_000), ("claim", "run-fast", 59_000),
                                   ("commit", "run-fast", 59_000)]  # fmt: skip
    snapshot = meter.snapshot()
    assert snapshot.counter("threadloom_clock_skew_detected_total", op="claim") == 2
    assert snapshot.counter("threadloom_clock_skew_detected_total", op="commit") == 1
    for store in (slow, fast, near):
        store.close()


def test_clock_skew_tolerance_is_an_option_and_is_checked(tmp_path: Path) -> None:
    from threadloom import ManualClock

    with pytest.raises(ValidationError) as info:
        open_store(f"sqlite:///{tmp_path}/x.db", clock_skew_tolerance=timedelta(0))
    assert info.value.field == "clock_skew_tolerance" and not (tmp_path / "x.db").exists()
    with open_store(f"sqlite:///{tmp_path}/x.db", clock=ManualClock(NOW), clock_skew_tolerance=timedelta(minutes=2)) as a:
        assert a.skew_watch.tolerance == timedelta(minutes=2)
