"""``threadloom backup`` and ``threadloom check``: consistent copies of a live store, and damage found.

Real files and real processes: the backup is taken by a ``threadloom`` process while another process keeps
committing; damage is planted by editing rows (or bytes) of the file directly.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    ProcessingError,
    ThreadQuery,
    open_store,
)
from threadloom.cli.main import EXIT_FAILED, EXIT_USAGE, cli
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.harness import START

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_sqlite_read_only import Writer, as_nobody, digest, needs_root  # noqa: E402  (shared with the read-only tests)

LONG = timedelta(minutes=5)


def threadloom(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``threadloom`` command in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "threadloom", *args], capture_output=True, text=True, timeout=120, check=False
    )


def thread_ids(path: pathlib.Path) -> set[str]:
    with open_store(f"sqlite:///{path}", read_only=True) as store:
        return {s.thread_id for s in store.threads(ThreadQuery(tenant_id="acme", limit=1000)).items}


# -- backup -----------------------------------------------------------------------------------------------------------


def test_a_backup_taken_while_another_process_commits_holds_every_acknowledged_thread(tmp_path: pathlib.Path) -> None:
    """Copying the file of a running store loses what still sits in its -wal; the backup command does not."""
    path = tmp_path / "store.db"
    writer = Writer(path, pause_s=0.002)
    try:
        writer.wait_for(40)
        shutil.copyfile(path, tmp_path / "plain-copy.db")  # what a user would try first
        acknowledged = set(writer.wait_for(len(writer.acknowledged) + 1))  # every id printed before the backup
        result = threadloom("--store", f"sqlite:///{path}", "--json", "backup", str(tmp_path / "backup.db"))
        writer.wait_for(len(writer.acknowledged) + 20)  # the writer went on during and after the backup
    finally:
        writer.kill()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["backup"]
    assert report["path"] == str(tmp_path / "backup.db") and report["threads"] >= len(acknowledged)
    backed_up = thread_ids(tmp_path / "backup.db")
    assert acknowledged <= backed_up
    assert backed_up <= set(writer.acknowledged) | {f"w-{len(writer.acknowledged)}"}  # at most the one in flight
    # The plain copy holds the file without its -wal: not even the schema, or far from every thread.
    try:
        plain = thread_ids(tmp_path / "plain-copy.db")
    except ProcessingError:
        plain = set()
    assert not acknowledged <= plain
    # Restore: the copy, put where a store is expected, opens and works as a store.
    restored = tmp_path / "restored.db"
    shutil.copyfile(tmp_path / "backup.db", restored)
    with open_store(f"sqlite:///{restored}") as store:
        assert store.check().ok
        for thread_id in acknowledged:
            latest = store.latest(thread_id)
            assert latest is not None and latest.checkpoint.state["i"] == int(thread_id.removeprefix("w-"))
        claim = store.claim("after-restore", ClaimRequest(holder="r", ttl=LONG))
        assert claim.token > max(cp.checkpoint.fencing_token or 0 for cp in map(store.latest, acknowledged) if cp)


def test_a_backup_refuses_an_existing_file_unless_forced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store:
        store.commit("t", Commit(token=store.claim("t", ClaimRequest(holder="r", ttl=LONG)).token, metadata={"a": "b"}))
    dest = tmp_path / "backup.db"
    dest.write_text("precious")
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", str(dest)])
    assert result.exit_code == EXIT_USAGE and "exists" in result.output and "--force" in result.output
    assert dest.read_text() == "precious"
    assert [n for n in os.listdir(tmp_path) if not n.startswith("store.db")] == ["backup.db"]  # no partial copy
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", "--force", str(dest)])
    assert result.exit_code == 0, result.output
    with open_store(f"sqlite:///{dest}", read_only=True) as copy:
        assert copy.check().ok and copy.check().threads == 1
    assert [n for n in os.listdir(tmp_path) if n.startswith("backup")] == ["backup.db"]  # self-contained: no -wal
    with pytest.raises(Exception, match="the store's own file"):
        with SqliteCheckpointer.open(path) as store:
            store.backup(path, overwrite=True)


@pytest.mark.parametrize("mode", [0o640, 0o444], ids=["0640", "0444"])
def test_a_backup_gets_the_permission_bits_of_the_store_file(tmp_path: pathlib.Path, mode: int) -> None:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store:
        store.commit("t", Commit(token=store.claim("t", ClaimRequest(holder="r", ttl=LONG)).token, metadata={"a": "b"}))
    os.chmod(path, mode)
    dest = tmp_path / "backup.db"
    done = threadloom("--store", f"sqlite:///{path}", "backup", str(dest))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(dest).st_mode) == mode  # not the temporary file's 0600
    with open_store(f"sqlite:///{dest}", read_only=True) as copy:
        assert copy.check().ok and copy.check().threads == 1


def _small_store(path: pathlib.Path) -> None:
    with open_store(f"sqlite:///{path}") as store:
        store.commit("t", Commit(token=store.claim("t", ClaimRequest(holder="r", ttl=LONG)).token, metadata={"a": "b"}))


@pytest.mark.parametrize("companion", ["-wal", "-shm", "-journal"])
def test_a_backup_never_writes_over_the_stores_companion_files_even_forced(
    tmp_path: pathlib.Path, companion: str
) -> None:
    """A backup written over the store's -wal would lose every commit in it once the writer stops."""
    path = tmp_path / "store.db"
    _small_store(path)
    with open_store(f"sqlite:///{path}") as writer:  # a writer keeps the -wal and -shm in place
        writer.commit("u", Commit(token=writer.claim("u", ClaimRequest(holder="r", ttl=LONG)).token))
        own = pathlib.Path(str(path) + companion)
        if not own.exists():
            own.write_bytes(b"")  # a -journal exists only while a rollback-journal transaction runs
        link = tmp_path / "link-to-companion"
        link.symlink_to(own)
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("store.db")}
        for dest in (own, link):
            result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", "--force", str(dest)])
            assert result.exit_code == EXIT_USAGE, result.output
            assert f"the store's {companion} file" in result.output
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("store.db")} == before
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
    with open_store(f"sqlite:///{path}", read_only=True) as store:
        assert store.check().ok and store.check().threads == 2


def test_a_backup_never_replaces_what_is_not_a_regular_file_even_forced(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    _small_store(path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    hard = tmp_path / "hard-link.db"
    os.link(path, hard)
    for dest, says in ((fifo, "not a regular file"), (tmp_path, "is a directory"), (hard, "the store's own file")):
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", "--force", str(dest)])
        assert result.exit_code == EXIT_USAGE and says in result.output, (dest, result.output)
    assert fifo.is_fifo()
    with open_store(f"sqlite:///{path}", read_only=True) as store:
        assert store.check().ok and store.check().threads == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


@needs_root
def test_a_backup_into_a_directory_it_cannot_write_says_so() -> None:
    """Found by a tester: "unexpected PermissionError ... .part"; the user 'nobody' cannot write a 755 directory."""
    shared = pathlib.Path(tempfile.mkdtemp(prefix="threadloom-ro-"))
    try:
        shared.chmod(0o755)
        path = shared / "store.db"
        _small_store(path)
        dest = shared / "backup.db"

        def run() -> list[Any]:
            result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", str(dest)])
            return [result.exit_code, result.output]

        code, output = as_nobody(run)["ok"]
    finally:
        shutil.rmtree(shared)
    assert code == EXIT_FAILED and "cannot write DEST's directory" in output and "Permission denied" in output
    assert "unexpected" not in output and len(output.strip().splitlines()) == 1, output


def test_a_backup_to_a_dangling_symbolic_link_says_what_it_is(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    _small_store(path)
    dest = tmp_path / "backup.db"
    dest.symlink_to(tmp_path / "gone" / "where.db")
    for force in ([], ["--force"]):
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "backup", *force, str(dest)])
        assert result.exit_code == EXIT_USAGE and "dangling symbolic link" in result.output, result.output
        assert "appeared" not in result.output
    assert dest.is_symlink() and not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_a_postgres_backup_prints_the_pg_dump_command_without_the_password() -> None:
    url = "postgresql://tl:s3cr%2Fet@db.example:5433/agents?schema=prod"
    result = CliRunner().invoke(cli, ["--store", url, "--json", "backup", "/backups/agents.dump"])
    assert result.exit_code == EXIT_FAILED  # nothing was copied
    document = json.loads(result.stdout)
    assert document["backup"] is None
    dump = document["pg_dump"]
    assert dump[0] == "pg_dump" and "--schema=prod" in dump and "--file=/backups/agents.dump" in dump
    assert "host=db.example" in dump[1] and "port=5433" in dump[1] and "dbname=agents" in dump[1]
    assert document["pg_restore"][0] == "pg_restore"
    assert "s3cr" not in result.output


# -- check ------------------------------------------------------------------------------------------------------------


def _checkpoint(thread_id: str, cp_id: str, parent: str | None) -> Checkpoint:
    return Checkpoint(
        id=cp_id, parent=parent, thread_id=thread_id, run_id="run-1", status=CheckpointStatus.RUNNING,
        created_at=START, state={"at": cp_id}, tenant_id="acme",
    )


def build(store: Any) -> None:
    """A store with every kind of row: histories, pending writes, events, effects, a tombstone, compaction."""
    for name in ("a", "b", "c", "gone"):
        token = store.claim(name, ClaimRequest(holder="run-1", ttl=LONG, tenant_id="acme")).token
        parent = None
        for step in range(3):
            cp_id = f"{name}-{step}"
            store.commit(
                name,
                Commit(
                    token=token,
                    checkpoint=_checkpoint(name, cp_id, parent),
                    pending_writes=[PendingWrite(checkpoint_id=cp_id, task_id="k", node_id="n", payload=step)],
                    events=[EventDraft(run_id="run-1", type="step", timestamp=START, payload=step)] * 2,
                    effects=[EffectRecord(key=f"e{step}", run_id="run-1", checkpoint_id=cp_id, task_id="k",
                                          result=step, recorded_at=START)],
                ),
            )
            parent = cp_id
        if name == "gone":
            store.delete_thread(name, token)
        else:
            store.release(name, token)
    store.compact_events("a", 3)


def check_json(path: pathlib.Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "--json", "check"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def good(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store:
        build(store)
    return path


def test_check_passes_on_a_sound_store_and_reads_only(good: pathlib.Path) -> None:
    before = digest(good)
    code, report = check_json(good)
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["counts"] == {"threads": 4, "checkpoints": 9, "events": 16, "pending_writes": 3, "effects": 9}
    assert digest(good) == before
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{good}", "check"])
    assert result.exit_code == 0 and "sound: 4 thread(s)" in result.output


DAMAGE: dict[str, tuple[str, str | None, str]] = {
    "an event deleted": ("DELETE FROM events WHERE thread_id = 'b' AND seq = 3", "events", "b"),
    "a checkpoint that does not decode": (
        "UPDATE checkpoints SET body = '{\"id\": ' WHERE thread_id = 'c' AND id = 'c-1'", "decode", "c",
    ),
    "a claim above the token counter": (
        "UPDATE threads SET claim_holder = 'x', claim_token = 999, claim_expires = 1 WHERE thread_id = 'a'",
        "tokens", "a",
    ),
    "a registry row naming another latest": ("UPDATE threads SET latest_id = 'b-0' WHERE thread_id = 'b'",
                                             "registry", "b"),
    "a pending write pointing elsewhere": (
        "UPDATE pending SET body = json_set(body, '$.checkpoint_id', 'c-0') WHERE thread_id = 'c'", "pending", "c",
    ),
    "a tombstone holding a checkpoint": (
        "INSERT INTO checkpoints (thread_id, position, id, run_id, settled, committed_at, seq_mark, body)"
        " SELECT 'gone', position, id, run_id, settled, committed_at, seq_mark, body"
        " FROM checkpoints WHERE thread_id = 'a' AND id = 'a-0'", "tombstone", "gone",
    ),
    "an effect of no thread": ("INSERT INTO effects (thread_id, key, body) VALUES ('ghost', 'k', '{}')", "orphan", "ghost"),
    # Found by a tester: check said sound, then `threads` and `show` failed on the row.
    "a registry row with an unknown status": (
        "UPDATE threads SET latest_status = 'weird' WHERE thread_id = 'b'", "decode", "b",
    ),
    "a registry row with another status than its checkpoint": (
        "UPDATE threads SET latest_status = 'completed' WHERE thread_id = 'b'", "registry", "b",
    ),
    "a tombstone keeping a status": ("UPDATE threads SET latest_status = 'running' WHERE thread_id = 'gone'",
                                     "registry", "gone"),
    # Found by a tester: check stopped with "unexpected TypeError".
    "a registry row with text for a number": ("UPDATE threads SET next_seq = 'abc' WHERE thread_id = 'c'", "decode",
                                              "c"),
    "a registry row with a real for a count": ("UPDATE threads SET n_pending = 1.5 WHERE thread_id = 'c'", "decode",
                                               "c"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_check_finds_damage_planted_in_the_rows(good: pathlib.Path, damage: str) -> None:
    statement, kind, thread = DAMAGE[damage]
    conn = sqlite3.connect(good)
    conn.execute(statement)
    conn.commit()
    conn.close()
    code, report = check_json(good)
    assert code == EXIT_FAILED and not report["ok"]
    assert {(p["check"], p["thread_id"]) for p in report["problems"]} >= {(kind, thread)}, report["problems"]


def test_check_finds_a_token_going_backwards(good: pathlib.Path) -> None:
    conn = sqlite3.connect(good)
    # Every event of 'b' carries its one claim's token: the last one's, lowered, goes below the one before it.
    conn.execute("UPDATE events SET body = json_set(body, '$.token', 1) WHERE thread_id = 'b' AND seq = 6")
    conn.commit()
    conn.close()
    code, report = check_json(good)
    problems = [p for p in report["problems"] if p["check"] == "tokens"]
    assert code == EXIT_FAILED and problems and problems[0]["thread_id"] == "b"
    assert "below the token" in problems[0]["detail"]


def _damage_a_page(path: pathlib.Path) -> None:
    conn = sqlite3.connect(path)
    (page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'checkpoints_id'").fetchone()
    (size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with open(path, "r+b") as file:
        file.seek((page - 1) * size + 8)
        file.write(b"\xde\xad\xbe\xef" * 64)


def test_a_damaged_file_fails_check_and_sweep(tmp_path: pathlib.Path) -> None:
    """``sweep`` used to visit every thread of a damaged file and exit 0."""
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store:
        build(store)
        for i in range(200):  # enough rows for the index to span pages
            store.commit(f"x{i}", Commit(token=store.claim(f"x{i}", ClaimRequest(holder="r", ttl=LONG)).token,
                                         checkpoint=_checkpoint(f"x{i}", "c", None)))
    _damage_a_page(path)
    code, report = check_json(path)
    assert code == EXIT_FAILED and any(p["check"] == "integrity" for p in report["problems"])
    before = digest(path)
    swept = threadloom("--store", f"sqlite:///{path}", "sweep")
    assert swept.returncode == EXIT_FAILED and "is damaged" in swept.stderr and "nothing was swept" in swept.stderr
    assert digest(path) == before  # the check ran before anything could change the file


def test_sweep_leaves_a_damaged_file_of_rollback_journal_mode_byte_for_byte(tmp_path: pathlib.Path) -> None:
    """A damaged copy in rollback-journal mode: ``sweep`` used to switch it to WAL before checking it."""
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as store:
        build(store)
        for i in range(200):
            store.commit(f"x{i}", Commit(token=store.claim(f"x{i}", ClaimRequest(holder="r", ttl=LONG)).token,
                                         checkpoint=_checkpoint(f"x{i}", "c", None)))
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    _damage_a_page(path)
    before = digest(path)
    swept = threadloom("--store", f"sqlite:///{path}", "sweep")
    assert swept.returncode == EXIT_FAILED and "nothing was swept" in swept.stderr, swept.stderr
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]


def _foreign_db(path: pathlib.Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    "make",
    [_foreign_db, lambda path: path.write_bytes(b""), lambda path: path.write_text("not a database\n")],
    ids=["another-apps-db", "empty-file", "text-file"],
)
def test_sweep_refuses_a_file_that_holds_no_threadloom_store_and_changes_nothing(tmp_path: pathlib.Path, make) -> None:
    path = tmp_path / "other.db"
    make(path)
    before = digest(path)
    swept = threadloom("--store", f"sqlite:///{path}", "sweep")
    assert swept.returncode == EXIT_FAILED, swept.stderr
    assert "is not a threadloom store" in swept.stderr and "Traceback" not in swept.stderr
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


def test_the_library_reports_what_check_found(good: pathlib.Path) -> None:
    with SqliteCheckpointer.open(good) as store:
        assert store.check().ok and store.integrity_check(quick=False) == []
    conn = sqlite3.connect(good)
    conn.execute("DELETE FROM events WHERE thread_id = 'c' AND seq = 1")
    conn.commit()
    conn.close()
    with SqliteCheckpointer.open(good, read_only=True) as store:
        report = store.check()
    assert [(p.check, p.thread_id) for p in report.problems] == [("events", "c")]
    assert "event 1 is missing" in report.problems[0].detail

