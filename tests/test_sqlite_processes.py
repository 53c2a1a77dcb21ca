"""Several OS processes on one SQLite file behave as one store (DESIGN §3 rule 2 and "Stores").

Each worker is a real Python process (``subprocess``) that opens its own :class:`SqliteCheckpointer` on the file,
says ``ready``, waits for ``go`` on its stdin (so that all of them start their calls together), and prints one
JSON line with what it saw.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import sqlite3
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from threadloom.domain.values import ClaimRequest
from threadloom.persistence.sqlite.store import SCHEMA_VERSION, SqliteCheckpointer

pytestmark = pytest.mark.slow  # each worker is a fresh interpreter

WORKER = r"""
import json, sys
from datetime import datetime, timedelta, timezone
from threadloom import ClaimRequest, Commit, EventDraft, SqliteCheckpointer, ThreadBusy

job = json.loads(sys.argv[1])
path, kind = job["path"], job["kind"]
hour = timedelta(hours=1)
store = None if kind == "open" else SqliteCheckpointer.open(path, busy_timeout=timedelta(seconds=60))
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
out = {}
if kind == "open":
    with SqliteCheckpointer.open(path, busy_timeout=timedelta(seconds=60)) as opened:
        out["token"] = opened.claim("opened-" + job["tag"], ClaimRequest(holder=job["tag"], ttl=hour)).token
elif kind == "claim":
    try:
        out["token"] = store.claim(job["thread"], ClaimRequest(holder=job["tag"], ttl=hour)).token
    except ThreadBusy as busy:
        out["busy"] = str(busy.holder)
elif kind == "commit":
    seqs = []
    for n in range(job["commits"]):
        drafts = [
            EventDraft(run_id="shared-run", type="e", timestamp=datetime.now(timezone.utc), payload=[job["tag"], n, k])
            for k in range(1 + n % 3)
        ]
        seqs += [record.seq for record in store.commit(job["thread"], Commit(token=job["token"], events=drafts))]
    out["seqs"] = seqs
elif kind == "tokens":
    tokens = []
    for n in range(job["claims"]):
        thread = "%s-%d" % (job["tag"], n % 3) if n % 2 else "contended"
        try:
            claim = store.claim(thread, ClaimRequest(holder=job["tag"], ttl=hour))
        except ThreadBusy:
            continue
        tokens.append(claim.token)
        store.release(thread, claim.token)
    out["tokens"] = tokens
if store is not None:
    store.close()
print(json.dumps(out), flush=True)
"""


def _run_together(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Starts one worker process per job, waits until every one is ready, lets them all go, and collects."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    try:
        for process in processes:
            line = process.stdout.readline()  # type: ignore[union-attr]
            assert line.strip() == "ready", process.stderr.read()  # type: ignore[union-attr]
        for process in processes:
            process.stdin.write("go\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
        results = []
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def test_concurrent_claims_of_one_thread_from_two_processes_have_exactly_one_winner(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "store.db")
    SqliteCheckpointer.open(path).close()
    for round_ in range(2):
        thread = f"contended-{round_}"
        results = _run_together([{"path": path, "kind": "claim", "thread": thread, "tag": f"p{i}"} for i in range(2)])
        winners = [f"p{i}" for i, result in enumerate(results) if "token" in result]
        assert len(winners) == 1, results
        # The loser asked as the same (absent) tenant, so it is told who holds the thread.
        assert [result["busy"] for result in results if "busy" in result] == [f"held by run {winners[0]!r}"]


def test_two_processes_committing_under_one_claim_number_events_contiguously(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "store.db")
    with SqliteCheckpointer.open(path) as store:
        token = store.claim("shared", ClaimRequest(holder="shared-run", ttl=timedelta(hours=1))).token
    results = _run_together(
        [{"path": path, "kind": "commit", "thread": "shared", "token": token, "tag": f"p{i}", "commits": 60} for i in range(2)]
    )
    returned = [result["seqs"] for result in results]
    for seqs in returned:
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    with SqliteCheckpointer.open(path) as store:
        read = store.events_after("shared", 0, 10_000)
    total = sum(len(seqs) for seqs in returned)
    assert [record.seq for record in read] == list(range(1, total + 1))
    assert sorted(returned[0] + returned[1]) == list(range(1, total + 1))
    assert {record.token for record in read} == {token}
    # Each process's events are in its own commit order, and each commit's events are contiguous.
    for tag in ("p0", "p1"):
        mine = [record.payload for record in read if record.payload[0] == tag]
        assert mine == sorted(mine, key=lambda payload: (payload[1], payload[2]))


def test_tokens_from_two_processes_are_distinct_and_increase_in_each(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "store.db")
    with SqliteCheckpointer.open(path) as store:
        before = store.claim("before", ClaimRequest(holder="r", ttl=timedelta(hours=1))).token
    results = _run_together([{"path": path, "kind": "tokens", "tag": f"p{i}", "claims": 80} for i in range(2)])
    streams = [result["tokens"] for result in results]
    for stream in streams:
        assert stream and all(a < b for a, b in itertools.pairwise(stream))
    everything = streams[0] + streams[1]
    assert len(everything) == len(set(everything))
    assert min(everything) > before
    with SqliteCheckpointer.open(path) as store:
        after = store.claim("after", ClaimRequest(holder="r", ttl=timedelta(hours=1))).token
    assert after > max(everything)


def test_four_processes_opening_a_new_file_at_once_all_succeed(tmp_path: pathlib.Path) -> None:
    for round_ in range(2):
        path = str(tmp_path / f"new-{round_}.db")
        results = _run_together([{"path": path, "kind": "open", "tag": f"p{i}"} for i in range(4)])
        tokens = sorted(result["token"] for result in results)
        assert tokens == [1, 2, 3, 4]
        versions = sqlite3.connect(path).execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(version,) for version in range(1, SCHEMA_VERSION + 1)]
