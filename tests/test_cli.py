"""The ``threadloom`` command against a real SQLite file, populated through the library.

Every command is driven through click's ``CliRunner`` (in-process) except ``events --follow``, which runs as a
real process that the test interrupts with SIGINT.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner

from threadloom import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    PendingWrite,
)
from threadloom.cli.logs import DRIVER_LOGGERS, configure_logging
from threadloom.cli.main import cli
from threadloom.cli.output import EXIT_FAILED, EXIT_USAGE, parse_duration
from threadloom.persistence.sqlite.store import SqliteCheckpointer

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


pytestmark = pytest.mark.usefixtures("restore_cli_logging")


def step(store, thread_id: str, token: int, index: int, parent: str | None, *, tenant=None, status=None, origin=None):
    """Commits checkpoint ``cp-<index>`` (with one pending write and one event) on ``thread_id``."""
    checkpoint_id = f"cp-{index}"
    store.commit(
        thread_id,
        Commit(
            token=token,
            checkpoint=Checkpoint(
                id=checkpoint_id,
                parent=parent,
                thread_id=thread_id,
                run_id="run-1",
                status=status or CheckpointStatus.RUNNING,
                created_at=NOW,
                state={"step": index, "note": "[bold]not markup[/bold]"},
                tenant_id=tenant,
                origin=origin,
            ),
            pending_writes=[PendingWrite(checkpoint_id=checkpoint_id, task_id=f"task-{index}", node_id="answer",
                                         payload={"i": index})],
            events=[EventDraft(run_id="run-1", type="step", timestamp=NOW, payload={"i": index},
                               checkpoint_id=checkpoint_id, node_id="answer")],
        ),
    )
    return checkpoint_id


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite store file holding:

    - ``t1`` (tenant ``acme``): 5 checkpoints cp-0..cp-4, 5 events, a live claim (registry: running);
    - ``t2``, ``t3`` (no tenant): one completed checkpoint each, claim released;
    - ``child`` (no tenant): a child of ``t2``;
    - ``gone``: deleted (a tombstone).
    """
    path = tmp_path / "store.db"
    with SqliteCheckpointer.open(str(path)) as store:
        claim = store.claim("t1", ClaimRequest(holder="run-1", ttl=HOUR, tenant_id="acme"))
        parent = None
        for index in range(5):
            parent = step(store, "t1", claim.token, index, parent, tenant="acme")
        for thread_id in ("t2", "t3", "child", "gone"):
            claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=HOUR))
            origin = CheckpointOrigin(parent_thread="t2") if thread_id == "child" else None
            step(store, thread_id, claim.token, 0, None, status=CheckpointStatus.COMPLETED, origin=origin)
            if thread_id == "gone":
                store.delete_thread(thread_id, claim.token)
            else:
                store.release(thread_id, claim.token)
    return path


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"  # an absolute path: sqlite:////abs/path.db


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def run_json(db: Path, *args: str):
    result = run("--store", url_of(db), "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("threadloom: error: ")
    assert "Traceback" not in result.output
    return lines[0]


# -- threads ---------------------------------------------------------------------------------------------------------


def test_threads_lists_a_tenants_root_threads(db):
    doc = run_json(db, "threads", "--tenant", "acme")
    assert doc["tenant_id"] == "acme"
    assert [(t["thread_id"], t["status"], t["latest_checkpoint_id"]) for t in doc["threads"]] == [
        ("t1", "running", "cp-4")
    ]
    assert doc["next"] is None


def test_threads_without_tenant_lists_threads_of_no_tenant_and_filters_by_status(db):
    doc = run_json(db, "threads")
    assert {t["thread_id"] for t in doc["threads"]} == {"t2", "t3"}  # child threads are not listed
    assert run_json(db, "threads", "--status", "RUNNING")["threads"] == []
    completed = run_json(db, "threads", "--status", "completed", "--status", "failed")
    assert {t["thread_id"] for t in completed["threads"]} == {"t2", "t3"}


def test_threads_pages_with_a_cursor_or_all_pages(db):
    first = run_json(db, "threads", "--limit", "1")
    assert len(first["threads"]) == 1
    assert first["next"]["thread_id"] == first["threads"][0]["thread_id"]
    every = run_json(db, "threads", "--limit", "1", "--all-pages")
    assert {t["thread_id"] for t in every["threads"]} == {"t2", "t3"}
    assert every["next"] is None


def test_threads_table(db):
    result = run("--store", url_of(db), "threads", "--tenant", "acme")
    assert result.exit_code == 0, result.stderr
    assert "t1" in result.stdout and "running" in result.stdout and "cp-4" in result.stdout


def test_store_url_from_the_environment(db):
    result = run("--json", "threads", "--tenant", "acme", env={"THREADLOOM_STORE": url_of(db)})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["threads"][0]["thread_id"] == "t1"


# -- show ------------------------------------------------------------------------------------------------------------


def test_show_gives_the_latest_checkpoint_its_pending_writes_and_registry_row(db):
    doc = run_json(db, "show", "t1")
    assert doc["checkpoint"]["id"] == "cp-4"
    assert doc["checkpoint"]["parent"] == "cp-3"
    assert doc["checkpoint"]["state"] == {"step": 4, "note": "[bold]not markup[/bold]"}
    assert doc["checkpoint"]["tenant_id"] == "acme"
    assert doc["checkpoint"]["fencing_token"] >= 1
    assert doc["pending_writes"] == [{"checkpoint_id": "cp-4", "task_id": "task-4", "node_id": "answer",
                                      "payload": {"i": 4}}]
    assert doc["registry"]["status"] == "running"
    assert doc["claim"]["state"] == "live" and doc["claim"]["holder"] == "run-1"  # the claim is read now


def test_show_a_child_thread_says_it_is_not_in_the_registry(db):
    doc = run_json(db, "show", "child")
    assert doc["checkpoint"]["origin"] == {"parent_thread": "t2", "parent_checkpoint": None, "task_id": None}
    assert doc["registry"] is None
    assert any("child thread" in note for note in doc["notes"])


def test_show_table(db):
    result = run("--store", url_of(db), "show", "t1")
    assert result.exit_code == 0, result.stderr
    assert "cp-4" in result.stdout and "task-4" in result.stdout
    assert "[bold]not markup[/bold]" in result.stdout  # store data is printed, never read as rich markup


# -- history ---------------------------------------------------------------------------------------------------------


def test_history_newest_first_with_limit_and_before(db):
    doc = run_json(db, "history", "t1", "--limit", "3")
    assert [cp["id"] for cp in doc["checkpoints"]] == ["cp-4", "cp-3", "cp-2"]
    older = run_json(db, "history", "t1", "--before", "cp-2")
    assert [cp["id"] for cp in older["checkpoints"]] == ["cp-1", "cp-0"]


def test_history_table(db):
    result = run("--store", url_of(db), "history", "t1")
    assert result.exit_code == 0, result.stderr
    assert "cp-0" in result.stdout and "cp-4" in result.stdout


# -- events ----------------------------------------------------------------------------------------------------------


def test_events_after(db):
    doc = run_json(db, "events", "t1", "--after", "2")
    assert [(e["seq"], e["payload"], e["checkpoint_id"]) for e in doc["events"]] == [
        (3, {"i": 2}, "cp-2"), (4, {"i": 3}, "cp-3"), (5, {"i": 4}, "cp-4"),
    ]
    assert doc["last_seq"] == 5
    assert run_json(db, "events", "t1", "--after", "1", "--limit", "2")["last_seq"] == 3
    assert run_json(db, "events", "t1", "--after", "5") == {"thread_id": "t1", "events": [], "last_seq": 5, "next": None}


def test_events_table(db):
    result = run("--store", url_of(db), "events", "t1", "--after", "3")
    assert result.exit_code == 0, result.stderr
    assert "step" in result.stdout and '{"i":4}' in result.stdout
    assert '{"i":2}' not in result.stdout


def test_events_follow_with_a_limit_stops_after_that_many(db):
    result = run("--store", url_of(db), "--json", "events", "t1", "--after", "1", "--limit", "2", "--follow")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["seq"] for line in result.stdout.splitlines()] == [2, 3]


def test_events_follow_prints_new_commits_and_exits_cleanly_on_sigint(db, tmp_path):
    follower = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", url_of(db), "--json", "events", "t1", "--after", "5",
         "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout], daemon=True).start()
    try:
        with SqliteCheckpointer.open(str(db)) as store:
            token = store.latest("t1").checkpoint.fencing_token  # the live claim of the fixture
            step(store, "t1", token, 5, "cp-4", tenant="acme")
            first = json.loads(lines.get(timeout=30))
            # The follower printed seq 6 and went back to waiting: this commit lands during its wait.
            step(store, "t1", token, 6, "cp-5", tenant="acme")
            second = json.loads(lines.get(timeout=30))
        assert (first["thread_id"], first["seq"], first["checkpoint_id"], first["payload"]) == ("t1", 6, "cp-5", {"i": 5})
        assert (second["seq"], second["checkpoint_id"]) == (7, "cp-6")
        time.sleep(0.2)  # let it wait again, then interrupt it there
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 0
        assert "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


# -- sweep -----------------------------------------------------------------------------------------------------------


def test_sweep_prunes_and_reclaims_through_the_whole_store(db):
    time.sleep(0.01)  # let the tombstone of "gone" grow older than the 1 ms tombstone age below
    doc = run_json(db, "sweep", "--max-checkpoints", "2", "--tombstone-age", "1ms", "--batch-size", "2")
    assert doc["policy"]["max_checkpoints"] == 2 and doc["policy"]["tombstone_age_s"] == 0.001
    assert doc["visited"] == 5 and doc["pages"] == 3
    assert doc["pruned"] == 1  # only t1 holds more than 2 checkpoints
    assert doc["reclaimed"] == 1  # the tombstone of "gone"
    assert doc["complete"] is True
    assert [cp["id"] for cp in run_json(db, "history", "t1")["checkpoints"]] == ["cp-4", "cp-3"]
    assert run_json(db, "sweep")["visited"] == 4  # a policy that keeps everything only visits


def test_sweep_table_and_log_line(db):
    result = run("--store", url_of(db), "--log-level", "info", "sweep", "--max-age", "7d")
    assert result.exit_code == 0, result.stderr
    assert "visited" in result.stdout and "pruned" in result.stdout
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    finished = [entry for entry in logged if entry["event"] == "sweep.finished"]
    assert finished and finished[0]["visited"] == 5 and finished[0]["level"] == "info"


def test_no_log_lines_below_the_default_level(db):
    result = run("--store", url_of(db), "sweep")
    assert result.exit_code == 0
    assert result.stderr == ""


# -- errors ----------------------------------------------------------------------------------------------------------


def test_bad_store_url_is_one_line_and_exit_2():
    result = run("--store", "nosuchstore://x", "threads")
    assert result.exit_code == EXIT_USAGE
    assert "bad store URL" in one_error_line(result)


def test_unknown_thread_is_one_line_and_exit_1(db):
    for command in (["show", "nope"], ["history", "nope"], ["events", "nope"]):
        result = run("--store", url_of(db), *command)
        assert result.exit_code == EXIT_FAILED, command
        assert "unknown thread 'nope'" in one_error_line(result)


def test_bad_duration_is_one_line_and_exit_2(db):
    for bad in ("3x", "0s", "1.5h", "-1s"):
        result = run("--store", url_of(db), "sweep", "--max-age", bad)
        assert result.exit_code == EXIT_USAGE, bad
        assert "--max-age" in one_error_line(result)


def test_store_errors_are_one_line(db):
    result = run("--store", url_of(db), "history", "t1", "--before", "no-such-checkpoint")
    assert result.exit_code == EXIT_FAILED
    assert "no-such-checkpoint" in one_error_line(result)  # CheckpointNotFound
    result = run("--store", url_of(db), "show", "x" * 300)
    assert result.exit_code == EXIT_USAGE
    assert "thread_id" in one_error_line(result)  # ValidationError


def test_a_password_in_a_store_url_is_never_echoed_in_an_error():
    result = run("--store", "bogus://alice:s3cr3t-pw@127.0.0.1/db", "threads")
    assert result.exit_code == EXIT_USAGE
    assert "alice:***@" in one_error_line(result)
    assert "s3cr3t-pw" not in result.output


def test_a_password_in_a_postgresql_url_is_never_echoed_nor_logged(tmp_path):
    """Nothing listens on port 1: the store cannot open (after its connect timeout, so both runs go at once)."""
    url = "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db"
    runs = {
        level: subprocess.Popen(
            [sys.executable, "-m", "threadloom", "--store", url, "--log-level", level, "threads"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        for level in ("warning", "debug")
    }
    for level, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == EXIT_FAILED, (level, err)
        assert "s3cr3t-pw" not in out + err
        lines = err.strip().splitlines()
        assert lines[-1].startswith("threadloom: error: cannot open store 'postgresql://alice:***@127.0.0.1:1/db'")
        assert "Traceback" not in err
        if level == "warning":
            assert len(lines) == 1, err  # the driver's retry warnings show from --log-level info on


def test_a_password_is_not_echoed_by_a_command_line_error():
    result = run("--store", "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db", "no-such-command")
    assert result.exit_code == EXIT_USAGE
    assert "s3cr3t-pw" not in result.output
    one_error_line(result)


def test_logging_scrubs_a_secret_from_every_line_including_tracebacks_and_driver_lines(capsys):
    configure_logging("info", secrets=("hunter2",))
    log = structlog.get_logger("test")
    log.info("store.opened", url="postgresql://alice:hunter2@db/x")
    try:
        raise RuntimeError("could not connect with password hunter2")
    except RuntimeError:
        log.error("store.failed", exc_info=True)
    logging.getLogger("psycopg.pool").error("connection to hunter2 failed")
    logging.getLogger("psycopg.pool").warning("retrying")  # driver warnings show from info on
    log.debug("hidden")  # below the level
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines()]
    assert [line["event"] for line in lines] == [
        "store.opened", "store.failed", "connection to *** failed", "retrying",
    ]
    assert "hunter2" not in err
    assert "RuntimeError" in lines[1]["exception"] and lines[2]["logger"] == "psycopg.pool"


def test_the_command_leaves_the_logging_configuration_as_it_found_it(db):
    structlog.reset_defaults()
    root = logging.getLogger()
    before = (list(root.handlers), root.level, {name: logging.getLogger(name).level for name in DRIVER_LOGGERS})
    result = run("--store", url_of(db), "--log-level", "debug", "threads")
    assert result.exit_code == 0, result.output
    assert not structlog.is_configured()
    after = (list(root.handlers), root.level, {name: logging.getLogger(name).level for name in DRIVER_LOGGERS})
    assert after == before


def test_driver_warnings_are_quiet_at_the_default_level(capsys):
    configure_logging("warning")
    logging.getLogger("psycopg.pool").warning("retrying")
    logging.getLogger("psycopg.pool").error("gave up")
    structlog.get_logger("test").warning("store.slow")
    events = [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()]
    assert events == ["gave up", "store.slow"]


# -- durations -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("500ms", timedelta(milliseconds=500)),
        ("1h30m", timedelta(minutes=90)),
        (" 2H ", timedelta(hours=2)),
    ],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "s", "30", "3x", "0s", "0m0s", "1.5h", "-1s", "1h 30m", "99999999999999d"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_help_and_module_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "threadloom", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0
    for command in ("threads", "show", "history", "events", "sweep"):
        assert command in done.stdout
    assert not (tmp_path / "threadloom.db").exists()  # --help opens no store
    summary = " ".join(done.stdout.split())
    assert "Read and sweep a store" not in summary  # most commands do more: they write
    assert "Some commands only read the store" in summary and "The others write to it" in summary
    from threadloom.cli.main import LAZY_COMMANDS

    doc = " ".join((cli.help or "").split())
    named = doc.split("Some commands only read the store:", 1)[1].split("(simulate", 1)[0]
    for word in ("threads", "tenants", "show", "history", "events", "stats", "walks", "check", "backup", "serve",
                 "recover", "delete", "sweep", "demo"):
        assert word in named and word in LAZY_COMMANDS, word  # each command it names exists


def test_events_without_after_start_at_the_earliest_event_kept(db: Path) -> None:
    """A first-time user's finding: after a sweep, plain ``events THREAD`` failed with ReplayUnavailable."""
    with SqliteCheckpointer.open(str(db)) as store:
        store.compact_events("t1", 4)
    shown = run_json(db, "events", "t1")
    assert [event["seq"] for event in shown["events"]] == [4, 5]
    refused = run("--store", url_of(db), "events", "t1", "--after", "1")
    assert refused.exit_code == 1
    line = one_error_line(refused)
    assert "compacted or pruned" in line and "use --after 3 or more" in line and "after_seq" not in line


@pytest.mark.parametrize("args", [("threads",), ("--json", "threads"), ("queue", "list"), ("--json", "queue", "list")])
def test_output_cut_by_a_closed_pipe_exits_141_silently(tmp_path: Path, args: tuple[str, ...]) -> None:
    """``threadloom ... | head``: the reader went away. Not "the store refused or failed" (1): 141, as a tool that
    SIGPIPE ended, and nothing on stderr (found by a first-time user: exit 1 with no message)."""
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    store = SqliteCheckpointer.open(str(tmp_path / "pipe.db"))
    store.queue.enqueue("t1", graph_id="g")
    store.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--store", url, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command writes anything
    stderr = process.stderr.read()
    assert process.wait(60) == 141, stderr
    assert stderr == b""


def test_show_cuts_a_long_value_and_json_gives_all_of_it(tmp_path: Path) -> None:
    """A state of megabytes is shown cut, compact, with its length (found by hostile testing: rendering a decoded
    1.3 MB LangGraph list line by line took 36 s and 1.7 GB); ``--json`` gives every element."""
    from threadloom.cli.output import SHOWN_JSON_MAX

    path = tmp_path / "big.db"
    big = [0] * (SHOWN_JSON_MAX * 2)
    with SqliteCheckpointer.open(str(path)) as store:
        claim = store.claim("big", ClaimRequest(holder="run-1", ttl=HOUR))
        store.commit("big", Commit(token=claim.token, checkpoint=Checkpoint(
            id="cp-0", parent=None, thread_id="big", run_id="run-1", status=CheckpointStatus.COMPLETED,
            created_at=NOW, state={"items": big},
        ), pending_writes=[PendingWrite(checkpoint_id="cp-0", task_id="t", node_id="n", payload={"items": big})]))
    result = run("--store", url_of(path), "show", "big")
    assert result.exit_code == 0, result.stderr
    full = len(json.dumps({"items": big}, separators=(",", ":")))
    assert result.stdout.count(f"cut: {full:,} characters of JSON in all; --json gives all") == 2  # state, write
    assert len(result.stdout) < 4 * SHOWN_JSON_MAX
    assert run_json(path, "show", "big")["checkpoint"]["state"] == {"items": big}
