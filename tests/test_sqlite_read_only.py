"""Reading a SQLite store never writes: read-only opens, foreign files left byte for byte, other users' stores.

The permission cases run the reader in a forked OS process that drops to the ``nobody`` user, so the file system
refuses it for real (root would pass every permission check).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    ProcessingError,
    RetentionPolicy,
    StoreCorrupt,
    StoreUnavailable,
    SweepPolicy,
    ThreadQuery,
    open_store,
)
from threadloom.cli.main import EXIT_FAILED, cli
from threadloom.persistence.sqlite.store import SqliteCheckpointer
from threadloom.testing.harness import START

LONG = timedelta(minutes=5)


def digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fill(path: pathlib.Path, threads: int, *, tenant: str = "acme") -> None:
    with open_store(f"sqlite:///{path}") as store:
        for i in range(threads):
            commit_one(store, f"t-{i}", tenant)


def commit_one(store: Any, thread_id: str, tenant: str = "acme") -> None:
    claim = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=LONG, tenant_id=tenant))
    cp = Checkpoint(
        id="cp-1", parent=None, thread_id=thread_id, run_id="run-1", status=CheckpointStatus.COMPLETED,
        created_at=START, state={"n": thread_id}, tenant_id=tenant,
    )
    store.commit(
        thread_id,
        Commit(token=claim.token, checkpoint=cp, events=[EventDraft(run_id="run-1", type="e", timestamp=START)]),
    )
    store.release(thread_id, claim.token)


# -- foreign files ---------------------------------------------------------------------------------------------------


def _wal_database(path: pathlib.Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()


def _rollback_database(path: pathlib.Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER)")  # a name another application may well use
    conn.execute("INSERT INTO schema_version VALUES (7)")
    conn.commit()
    conn.close()


FOREIGN: dict[str, Callable[[pathlib.Path], None]] = {
    "wal_database": _wal_database,
    "rollback_database": _rollback_database,
    "empty_file": lambda path: path.write_bytes(b""),
}

READ_COMMANDS = [["threads"], ["show", "x"], ["history", "x"], ["events", "x"], ["stats"], ["check"],
                 ["backup", "copy.db"]]


@pytest.mark.parametrize("kind", sorted(FOREIGN))
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda command: command[0])
def test_a_read_command_leaves_a_foreign_file_byte_identical(
    tmp_path: pathlib.Path, kind: str, command: list[str]
) -> None:
    """Found by a new user: the read commands migrated another application's database (12 tables, WAL mode)."""
    path = tmp_path / "app.db"
    FOREIGN[kind](path)
    before, listing = digest(path), sorted(os.listdir(tmp_path))
    argv = [str(tmp_path / arg) if arg == "copy.db" else arg for arg in command]
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", *argv])
    assert result.exit_code == EXIT_FAILED, result.output
    assert "is not a threadloom store" in result.output and "nothing was changed" in result.output
    assert digest(path) == before
    assert sorted(os.listdir(tmp_path)) == listing  # no -wal, no -shm, no backup copy


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database\n" * 100)
    with pytest.raises(StoreCorrupt, match="is not a threadloom store .not a SQLite database"):
        open_store(f"sqlite:///{path}", read_only=True)
    assert path.read_text() == "not a database\n" * 100 and os.listdir(tmp_path) == ["notes.db"]


PROBE = "import sys; from threadloom.persistence.sqlite import readonly; readonly.probe(sys.argv[1], 1.0, 1)"


def test_a_fifo_at_the_store_path_is_refused_at_once_not_waited_on(tmp_path: pathlib.Path) -> None:
    """Found by a tester: a read command on a FIFO waited forever for a writer to open it."""
    path = tmp_path / "f.db"
    os.mkfifo(path)
    for args in (["threadloom", "--store", f"sqlite:///{path}", "threads"],
                 ["threadloom", "--store", f"sqlite:///{path}", "sweep"],
                 ["-c", PROBE, str(path)]):  # the probe itself: a FIFO put there after the path was looked at
        argv = [sys.executable, *(["-m", *args] if args[0] == "threadloom" else args)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)  # a hang fails here
        assert result.returncode != 0 and "not a regular file" in result.stderr, (args, result.stderr)
        if args[0] == "threadloom":  # one line, no traceback
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert path.is_fifo() and os.listdir(tmp_path) == ["f.db"]


def test_a_read_only_open_of_a_missing_file_creates_nothing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreUnavailable, match="no SQLite file at .*creates nothing"):
        SqliteCheckpointer.open(tmp_path / "typo.db", read_only=True)
    assert os.listdir(tmp_path) == []


def test_a_read_never_migrates_an_older_schema(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "old.db"
    fill(path, 1)
    conn = sqlite3.connect(path)
    latest = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    conn.execute("DELETE FROM schema_version WHERE version = ?", (latest,))
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(ProcessingError, match=f"schema version {latest - 1}, older .* does not migrate"):
        open_store(f"sqlite:///{path}", read_only=True)
    assert digest(path) == before


def test_a_read_only_store_reads_and_refuses_every_write_before_touching_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "store.db"
    fill(path, 3)
    before = digest(path)
    with open_store(f"sqlite:///{path}", read_only=True) as store:
        assert isinstance(store, SqliteCheckpointer) and store.read_only
        assert [s.thread_id for s in store.threads(ThreadQuery(tenant_id="acme")).items] == ["t-2", "t-1", "t-0"]
        assert store.latest("t-0") is not None and len(store.events_after("t-0", 0, 10)) == 1
        writes: dict[str, Callable[[], Any]] = {
            "claim": lambda: store.claim("t-0", ClaimRequest(holder="r", ttl=LONG)),
            "commit": lambda: store.commit("t-0", Commit(token=1, metadata={"k": "v"})),
            "renew": lambda: store.renew("t-0", 1, LONG),
            "release": lambda: store.release("t-0", 1),
            "delete_thread": lambda: store.delete_thread("t-0", 1),
            "compact_events": lambda: store.compact_events("t-0", 2),
            "prune": lambda: store.prune("t-0", RetentionPolicy(max_checkpoints=1)),
            "sweep": lambda: store.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), None),
            "enqueue": lambda: store.queue.enqueue("t-9", graph_id="g"),
        }
        for name, call in writes.items():
            with pytest.raises(ProcessingError, match="opened read-only; nothing was written") as info:
                call()
            assert type(info.value) is ProcessingError and not info.value.retryable, name
    assert digest(path) == before


# -- other users, read-only directories (a real second user) ----------------------------------------------------------

_NOBODY = None
try:
    _NOBODY = pwd.getpwnam("nobody")
except KeyError:
    pass
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or _NOBODY is None,
    reason="permission cases need root, to run the reader as the user 'nobody' (root passes every check)",
)


def as_nobody(call: Callable[[], Any]) -> dict[str, Any]:
    """Runs ``call`` in a forked process as the user ``nobody``: ``{"ok": value}`` or ``{"error", "message"}``."""
    assert _NOBODY is not None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for real, then read
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(_NOBODY.pw_gid)
            os.setuid(_NOBODY.pw_uid)
            try:
                out: dict[str, Any] = {"ok": call()}
            except Exception as error:  # reported to the parent
                out = {"error": type(error).__name__, "message": str(error)}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


@pytest.fixture
def shared_dir() -> Iterator[pathlib.Path]:
    """A directory root owns (mode 755: the user nobody can read it, not write it)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="threadloom-ro-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        path.chmod(0o755)
        shutil.rmtree(path)


def _read_threads(path: pathlib.Path) -> Callable[[], list[str]]:
    def read() -> list[str]:
        with open_store(f"sqlite:///{path}", read_only=True) as store:
            page = store.threads(ThreadQuery(tenant_id="acme", limit=1000))
            assert store.latest(page.items[0].thread_id) is not None
            return sorted(s.thread_id for s in page.items)

    return read


WRITER = textwrap.dedent(
    """
    import sys, time
    from datetime import timedelta
    from threadloom import Checkpoint, CheckpointStatus, ClaimRequest, Commit, open_store
    from threadloom.testing.harness import START
    store = open_store(sys.argv[1])
    i = 0
    while True:
        tid = f"w-{i}"
        claim = store.claim(tid, ClaimRequest(holder="w", ttl=timedelta(minutes=5), tenant_id="acme"))
        cp = Checkpoint(id="c", parent=None, thread_id=tid, run_id="w", status=CheckpointStatus.COMPLETED,
                        created_at=START, state={"i": i, "pad": "x" * 2000}, tenant_id="acme")
        store.commit(tid, Commit(token=claim.token, checkpoint=cp))
        print(tid, flush=True)  # acknowledged: the commit returned
        i += 1
        time.sleep(float(sys.argv[2]))
    """
)


class Writer:
    """Another OS process committing one thread after another to a store, printing each acknowledged id."""

    def __init__(self, path: pathlib.Path, pause_s: float = 0.005) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, f"sqlite:///{path}", str(pause_s)], stdout=subprocess.PIPE, text=True
        )
        self.acknowledged: list[str] = []

    def wait_for(self, count: int, timeout_s: float = 60.0) -> list[str]:
        """Reads acknowledged ids until ``count`` were read in all; returns them all."""
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while len(self.acknowledged) < count:
            assert time.monotonic() < deadline, "the writer did not acknowledge in time"
            line = self.proc.stdout.readline()
            assert line, f"the writer ended: {self.proc.wait()}"
            self.acknowledged.append(line.strip())
        return list(self.acknowledged)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self.proc.stdout is not None
        self.acknowledged.extend(line.strip() for line in self.proc.stdout.read().splitlines())


@needs_root
def test_another_users_store_is_read_without_writing_when_no_writer_runs(shared_dir: pathlib.Path) -> None:
    path = shared_dir / "store.db"
    fill(path, 4)
    listing, before = sorted(os.listdir(shared_dir)), digest(path)
    assert "store.db-wal" not in listing  # the last writer closed: no log, and nobody cannot create one
    assert as_nobody(_read_threads(path)) == {"ok": ["t-0", "t-1", "t-2", "t-3"]}

    def cli_threads() -> Any:
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "--json", "threads", "--tenant", "acme"])
        return [result.exit_code, [t["thread_id"] for t in json.loads(result.output)["threads"]]]

    assert as_nobody(cli_threads) == {"ok": [0, ["t-3", "t-2", "t-1", "t-0"]]}
    assert sorted(os.listdir(shared_dir)) == listing and digest(path) == before


@needs_root
def test_another_users_store_is_read_while_its_writer_commits(shared_dir: pathlib.Path) -> None:
    path = shared_dir / "store.db"
    fill(path, 1)
    writer = Writer(path)
    try:
        seen = writer.wait_for(20)
        found = as_nobody(_read_threads(path))
    finally:
        writer.kill()
    assert "ok" in found, found
    assert set(seen) | {"t-0"} <= set(found["ok"])  # every commit acknowledged before the read began


@needs_root
def test_a_store_in_a_read_only_directory_is_read_with_a_crashed_writers_log(shared_dir: pathlib.Path) -> None:
    """The writer was SIGKILLed: its last commits are only in the -wal file, which the reader must apply."""
    path = shared_dir / "store.db"
    fill(path, 1)
    writer = Writer(path)
    writer.wait_for(10)
    writer.kill()
    assert (shared_dir / "store.db-wal").stat().st_size > 0 and (shared_dir / "store.db-shm").exists()
    shared_dir.chmod(0o555)
    before = {name: digest(shared_dir / name) for name in ("store.db", "store.db-wal")}
    found = as_nobody(_read_threads(path))
    assert found == {"ok": sorted(["t-0", *writer.acknowledged])}
    assert {name: digest(shared_dir / name) for name in before} == before


@needs_root
def test_a_log_without_its_index_in_an_unwritable_directory_is_refused_with_advice(shared_dir: pathlib.Path) -> None:
    path = shared_dir / "store.db"
    fill(path, 1)
    writer = Writer(path)
    writer.wait_for(5)
    writer.kill()
    (shared_dir / "store.db-shm").unlink()
    found = as_nobody(_read_threads(path))
    assert found["error"] == "ProcessingError", found
    assert "copy the file together with its -wal" in found["message"]


@needs_root
def test_root_reading_another_users_store_leaves_no_file_that_locks_its_owner_out(shared_dir: pathlib.Path) -> None:
    """SQLite makes a WAL file's -wal and -shm as the user who opens it: made by root, the owner could not write."""
    assert _NOBODY is not None
    path = shared_dir / "store.db"
    fill(path, 2)
    for item in (shared_dir, path):
        os.chown(item, _NOBODY.pw_uid, _NOBODY.pw_gid)
    assert sorted(_read_threads(path)()) == ["t-0", "t-1"]  # root reads...
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{path}", "check"])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(shared_dir)) == ["store.db"]  # ...and leaves no file behind

    def owner_writes() -> list[str]:
        with open_store(f"sqlite:///{path}") as store:
            commit_one(store, "t-2")
        return _read_threads(path)()

    assert as_nobody(owner_writes) == {"ok": ["t-0", "t-1", "t-2"]}


@needs_root
def test_opening_to_write_in_a_read_only_directory_says_what_to_do(shared_dir: pathlib.Path) -> None:
    """The advice names the directory and the read-only way in, not "make it writable" for the file."""
    assert _NOBODY is not None
    path = shared_dir / "store.db"
    fill(path, 1)
    for item in (shared_dir, path):
        os.chown(item, _NOBODY.pw_uid, _NOBODY.pw_gid)
    shared_dir.chmod(0o555)

    def open_to_write() -> None:
        open_store(f"sqlite:///{path}").close()

    found = as_nobody(open_to_write)
    assert found["error"] == "StoreUnavailable", found
    assert "directory" in found["message"] and "open it read-only" in found["message"], found
    assert as_nobody(_read_threads(path)) == {"ok": ["t-0"]}
