"""The ``threadloom`` command and ``open_store`` against hostile input.

Passwords in every place a store URL can hold one (never printed nor logged), stored text that carries terminal
escape sequences (escaped in tables and error lines), ``--json`` error documents, mistyped SQLite paths (never
created by a command that only reads) and options a store does not take.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner

from threadloom import Checkpoint, CheckpointStatus, ClaimRequest, Commit, EventDraft, PendingWrite
from threadloom.cli.logs import configure_logging
from threadloom.cli.main import cli
from threadloom.cli.output import EXIT_FAILED, EXIT_USAGE, printable
from threadloom.domain.errors import ValidationError
from threadloom.persistence import open_store, redact_url, sqlite_file, url_secrets
from threadloom.persistence.sqlite.store import SqliteCheckpointer

SECRET = "s3cretPW"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)

# What a terminal acts on: C0 controls, DEL, C1 controls (and the bidi overrides and isolates).
TERMINAL_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


pytestmark = pytest.mark.usefixtures("restore_cli_logging")


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("threadloom: error: ")
    assert "Traceback" not in result.output
    return lines[0]


# -- 1. passwords ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://127.0.0.1:1/db?password=s3cretPW", "postgresql://127.0.0.1:1/db?password=***"),
        (
            "postgresql://u@h/db?sslmode=require&password=s3cretPW&application_name=x",
            "postgresql://u@h/db?sslmode=require&password=***&application_name=x",
        ),
        ("postgresql://u@h/db?sslpassword=s3cretPW", "postgresql://u@h/db?sslpassword=***"),
        ("postgresql://u@h/db?pass%77ord=s3cretPW", "postgresql://u@h/db?pass%77ord=***"),  # libpq decodes keys
        ("postgresql://u@h/db?a=b?password=s3cretPW", "postgresql://u@h/db?a=b?password=***"),
        ("host=127.0.0.1 port=1 password=s3cretPW dbname=x", "host=127.0.0.1 port=1 password=*** dbname=x"),
        ("host=h password = 's3cretPW \\'x' dbname=x", "host=h password = '***' dbname=x"),
        ("postgresql://user:ab/s3cretPW@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("postgresql://user:ab?s3cretPW@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("postgresql://user:ab#s3cretPW@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("postgresql://user:s3c@retPW@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
        ("postgresql://user:s3cretPW@[::1", "postgresql://user:***@[::1"),  # no parser accepts it
        ("bogus://alice:s3cretPW@127.0.0.1/db", "bogus://alice:***@127.0.0.1/db"),
        ("postgresql://alice@127.0.0.1/db", "postgresql://alice@127.0.0.1/db"),  # no password: unchanged
    ],
)
def test_redact_url_hides_a_password_wherever_the_url_holds_it(url, redacted):
    assert redact_url(url) == redacted
    forms = url_secrets(url)
    assert bool(forms) == ("***" in redacted)
    for form in forms:
        assert form not in redacted


def test_url_secrets_gives_the_forms_a_password_may_be_printed_in():
    assert set(url_secrets("postgresql://u:s3cret%2FPW@h/db")) >= {"s3cret%2FPW", "s3cret/PW"}
    assert set(url_secrets("postgresql://u:s3cret/PW@h/db")) >= {"s3cret%2FPW", "s3cret/PW"}
    assert "a'b c" in url_secrets("host=h password='a\\'b c'")
    forms = url_secrets("postgresql://u:ab/s3cretPW@h/db?password=other")
    assert forms == tuple(sorted(forms, key=len, reverse=True))  # longest first: scrub them in that order
    assert url_secrets("memory://") == () and url_secrets("sqlite:///x.db") == ()


def test_a_password_in_a_conninfo_string_is_not_echoed_as_a_bad_store_url():
    result = run("--store", f"host=127.0.0.1 port=1 password={SECRET}", "threads")
    assert result.exit_code == EXIT_USAGE
    line = one_error_line(result)
    assert "bad store URL" in line and "password=***" in line
    assert SECRET not in result.output


@pytest.mark.parametrize("password", ["ab/s3cretPW", "s3c@retPW"])
def test_a_raw_slash_or_at_in_a_postgresql_password_is_refused_before_connecting(password):
    """libpq would read such a password as a host or database name (and show its pieces in errors)."""
    url = f"postgresql://user:{password}@127.0.0.1:1/db"
    with pytest.raises(ValidationError) as caught:
        open_store(url)
    assert caught.value.field == "url" and "percent-encode" in str(caught.value)
    assert "s3c" not in str(caught.value) and "retPW" not in str(caught.value)
    result = run("--store", url, "threads")
    assert result.exit_code == EXIT_USAGE
    assert "user:***@127.0.0.1:1/db" in one_error_line(result)
    assert "s3c" not in result.output and "retPW" not in result.output


def test_a_password_with_a_hash_is_not_echoed_by_a_command_line_error():
    result = run("--store", f"postgresql://user:ab#{SECRET}@127.0.0.1:1/db", "no-such-command")
    assert result.exit_code == EXIT_USAGE
    one_error_line(result)
    assert SECRET not in result.output


def test_passwords_urlsplit_misses_are_never_printed_nor_logged(tmp_path):
    """Nothing listens on port 1: each store fails to open after its connect timeout (all runs go at once).

    A URL no parser accepts may be refused up front or reach the driver, which logs it whole: either way the
    password shows nowhere.
    """
    urls = {
        "query": f"postgresql://127.0.0.1:1/db?password={SECRET}",
        "question mark": f"postgresql://user:ab?{SECRET}@127.0.0.1:1/db",
        "unparseable": f"postgresql://user:{SECRET}@[::1",
    }
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "threadloom", "--store", url, "--log-level", "debug", "threads"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        for name, url in urls.items()
    }
    for name, process in runs.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode in (EXIT_FAILED, EXIT_USAGE), (name, err)
        assert SECRET not in out + err, name
        assert "Traceback" not in err
        if name != "unparseable":
            last = err.strip().splitlines()[-1]
            assert process.returncode == EXIT_FAILED, (name, err)
            assert last.startswith(f"threadloom: error: cannot open store {redact_url(urls[name])!r}"), name


def test_log_lines_are_scrubbed_of_a_password_no_url_parser_finds(capsys):
    """What psycopg_pool logs for a URL it cannot parse: the URL whole, in its error text."""
    url = f"postgresql://user:{SECRET}@[::1"
    configure_logging("info", secrets=url_secrets(url))
    logging.getLogger("psycopg.pool").warning(f"error connecting: end of string reached in URI: {url!r}")
    structlog.get_logger("test").info("store.opening", url=url)
    err = capsys.readouterr().err
    assert SECRET not in err
    assert err.count("user:***@[::1") == 2


# -- 2. terminal escapes ---------------------------------------------------------------------------------------------

EVIL = "evil\x1b[2J\x9b31m"
HOSTILE = "\x1b]0;pwned\x07\x1b[31m\x9b2J\x7f\u202e\n"


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    """A SQLite store whose one thread carries escape sequences in every text field the commands print."""
    path = tmp_path / "hostile.db"
    with SqliteCheckpointer.open(str(path)) as store:
        claim = store.claim(EVIL, ClaimRequest(holder="h", ttl=HOUR))
        store.commit(
            EVIL,
            Commit(
                token=claim.token,
                checkpoint=Checkpoint(
                    id=f"cp{HOSTILE}".strip(), parent=None, thread_id=EVIL, run_id=f"run{HOSTILE}".strip(),
                    status=CheckpointStatus.RUNNING, created_at=NOW, state={f"k{HOSTILE}": HOSTILE},
                    graph_id=f"g{HOSTILE}".strip(),
                    metadata={f"m{HOSTILE}": HOSTILE},
                ),
                pending_writes=[PendingWrite(checkpoint_id=f"cp{HOSTILE}".strip(), task_id=f"t{HOSTILE}".strip(),
                                             node_id=f"n{HOSTILE}".strip(), payload=[HOSTILE])],
                events=[EventDraft(run_id=f"run{HOSTILE}".strip(), type=f"ty{HOSTILE}".strip(), timestamp=NOW,
                                   payload={"p": HOSTILE}, node_id=f"n{HOSTILE}".strip())],
                metadata={f"tm{HOSTILE}": HOSTILE},
            ),
        )
    return path


def assert_no_terminal_controls(text: str) -> None:
    found = TERMINAL_CONTROLS.findall(text)
    assert not found, f"raw control characters printed: {found!r}"


@pytest.mark.parametrize(
    "command",
    [
        ["threads"],
        ["show", EVIL],
        ["history", EVIL],
        ["events", EVIL],
        ["events", EVIL, "--follow", "--limit", "1"],
    ],
    ids=["threads", "show", "history", "events", "events-follow"],
)
def test_tables_escape_control_characters_of_stored_text(hostile_db, command):
    result = run("--store", url_of(hostile_db), *command)
    assert result.exit_code == 0, result.stderr
    assert_no_terminal_controls(result.stdout)
    assert "\\x1b" in result.stdout or "\\u001b" in result.stdout  # shown, escaped
    assert result.stderr == ""


def test_json_output_escapes_del_c1_and_bidi_and_still_decodes_to_the_stored_text(hostile_db):
    for command in (["threads"], ["show", EVIL], ["history", EVIL], ["events", EVIL]):
        result = run("--store", url_of(hostile_db), "--json", *command)
        assert result.exit_code == 0, result.stderr
        assert_no_terminal_controls(result.stdout.replace("\n", ""))
    doc = json.loads(run("--store", url_of(hostile_db), "--json", "show", EVIL).stdout)
    assert doc["thread_id"] == EVIL
    assert doc["checkpoint"]["state"] == {f"k{HOSTILE}": HOSTILE}
    assert doc["registry"]["metadata"] == {f"tm{HOSTILE}": HOSTILE}
    follow = run("--store", url_of(hostile_db), "--json", "events", EVIL, "--follow", "--limit", "1")
    assert_no_terminal_controls(follow.stdout.replace("\n", ""))
    assert json.loads(follow.stdout)["payload"] == {"p": HOSTILE}


def test_error_lines_escape_control_characters(hostile_db, tmp_path):
    not_a_db = tmp_path / f"x{HOSTILE.strip()}.db"
    not_a_db.write_bytes(b"\x1b[2J" * 1000)  # not a SQLite file: the driver's error names it
    for args in (
        ["--store", url_of(hostile_db), "show", EVIL + "x"],
        ["--store", url_of(hostile_db), "history", EVIL, "--before", HOSTILE],
        ["--store", url_of(not_a_db), "threads"],
        ["--store", url_of(hostile_db), "--json", "events", EVIL, "--after", HOSTILE],
    ):
        result = run(*args)
        assert result.exit_code in (EXIT_FAILED, EXIT_USAGE), args
        assert_no_terminal_controls(one_error_line(result))
        assert_no_terminal_controls(result.stdout.replace("\n", ""))


def test_printable_escapes_what_drives_a_terminal_and_keeps_the_rest():
    assert printable("a\x1b[31mb\x9b\x7f\x00\t\n\r\u202e") == "a\\x1b[31mb\\x9b\\x7f\\x00\\t\\n\\r\\u202e"
    assert printable("naïve 日本 \\x1b") == "naïve 日本 \\x1b"


# -- 3. --json errors ------------------------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    with SqliteCheckpointer.open(str(path)) as store:
        claim = store.claim("t1", ClaimRequest(holder="h", ttl=HOUR))
        store.commit("t1", Commit(token=claim.token, checkpoint=Checkpoint(
            id="cp-0", parent=None, thread_id="t1", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
            state={})))
    return path


@pytest.mark.parametrize(
    ("args", "code", "kind"),
    [
        (["show", "nope"], EXIT_FAILED, "UnknownThread"),
        (["history", "t1", "--before", "nope"], EXIT_FAILED, "CheckpointNotFound"),
        (["show", "x" * 300], EXIT_USAGE, "ValidationError"),
        (["threads", "--limit", "0"], EXIT_USAGE, "UsageError"),
        (["no-such-command"], EXIT_USAGE, "UsageError"),
        ([], EXIT_USAGE, "UsageError"),
    ],
)
def test_json_errors_print_an_error_document_on_stdout_and_the_line_on_stderr(db, args, code, kind):
    result = run("--store", url_of(db), "--json", *args)
    assert result.exit_code == code
    line = one_error_line(result)
    doc = json.loads(result.stdout)
    assert doc == {"error": {"type": kind, "message": line.removeprefix("threadloom: error: ")}}
    assert len(result.stdout.strip().splitlines()) == 1  # one line, also after events --follow's JSON lines


def test_json_error_for_a_bad_store_url_hides_the_password():
    result = run("--json", "--store", f"bogus://alice:{SECRET}@h/db", "threads")
    assert result.exit_code == EXIT_USAGE
    doc = json.loads(result.stdout)
    assert doc["error"]["type"] == "ValidationError" and "alice:***@h" in doc["error"]["message"]
    assert SECRET not in result.output


def test_without_json_an_error_leaves_stdout_empty(db):
    result = run("--store", url_of(db), "show", "nope")
    assert result.exit_code == EXIT_FAILED
    assert result.stdout == ""


# -- 4. mistyped SQLite paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["threads"], ["show", "x"], ["history", "x"], ["events", "x"], ["stats"], ["sweep"]],
    ids=lambda command: command[0],
)
def test_a_command_never_creates_a_missing_sqlite_file(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    for url, _created in (("sqlite:///typo.db", tmp_path / "typo.db"), (url_of(tmp_path / "abs.db"), None)):
        result = run("--store", url, *command)
        assert result.exit_code == EXIT_FAILED, result.output
        line = one_error_line(result)
        assert "no store at" in line and "check the path" in line
        assert list(tmp_path.iterdir()) == []
    result = run("--store", "sqlite:///typo.db", "--json", *command)
    assert json.loads(result.stdout)["error"]["type"] == "StoreNotFound"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [["threads"], ["events", "x"], ["walks"], ["sweep"], ["queue", "enqueue", "t", "--graph", "g"]],
    ids=lambda command: command[0] if command[0] != "queue" else "enqueue",
)
def test_a_sqlite_file_in_a_missing_directory_is_a_usage_error_naming_the_directory(tmp_path, monkeypatch, command):
    """Found by a user: a command that creates its store said 'cannot open store' (a retryable failure) and a
    command that reads suggested creating a store where no file can be."""
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///missing/x.db", url_of(tmp_path / "missing" / "x.db")):
        result = run("--store", url, *command)
        assert result.exit_code == EXIT_USAGE, result.output
        line = one_error_line(result)
        assert f"the directory {str(tmp_path / 'missing')!r}" in line and "does not exist" in line, line
    result = run("--store", "sqlite:///missing/x.db", "--json", *command)
    assert json.loads(result.stdout)["error"]["type"] == "ValidationError"
    assert list(tmp_path.iterdir()) == []


STORE_PATH_COMMANDS = [
    ["threads"], ["sweep", "--dry-run"], ["delete", "x", "--yes"], ["queue", "cancel", "1"], ["queue", "retry", "1"],
    ["queue", "enqueue", "t", "--graph", "g"],
]


def test_a_directory_or_a_fifo_as_the_sqlite_path_is_a_bad_url_for_every_command(tmp_path):
    """Found by an operator: the commands that write to an existing store (sweep, delete, queue cancel/retry) said
    "cannot open store ... is not a threadloom store" with exit status 1, as for a store that failed; the path is
    looked at with os.stat before anything opens it (a FIFO would block), so it is a bad URL (exit 2)."""
    directory = tmp_path / "dir.db"
    directory.mkdir()
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    for command in STORE_PATH_COMMANDS:
        result = run("--store", url_of(directory), *command)
        assert result.exit_code == EXIT_USAGE, (command, result.output)
        line = one_error_line(result)
        assert "bad store URL" in line and "is a directory" in line, (command, line)
        done = subprocess.run(  # a real process: opening the FIFO would hang it (the timeout fails the test)
            [sys.executable, "-m", "threadloom", "--store", url_of(fifo), *command],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == EXIT_USAGE, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "bad store URL" in lines[0] and "not a regular file" in lines[0], done.stderr
    assert directory.is_dir() and list(directory.iterdir()) == [] and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.db", "pipe.db"]


@pytest.mark.parametrize("url", ["sqlite:///x.db?mode=ro", "sqlite:///x.db#frag", "sqlite:///x.db?"])
def test_a_sqlite_url_with_a_query_or_fragment_is_refused(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as caught:
        open_store(url)
    assert caught.value.field == "url"
    assert "query" in str(caught.value) or "fragment" in str(caught.value)
    result = run("--store", url, "threads")
    assert result.exit_code == EXIT_USAGE
    assert "bad store URL" in one_error_line(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["threads"], ["queue", "enqueue", "t", "--graph", "g"]], ids=["threads", "enqueue"])
def test_a_sqlite_url_with_no_path_is_a_bad_url(tmp_path, monkeypatch, command):
    """Found by an operator: ``sqlite:///`` (the path left out) opened, or created, ``threadloom.db`` in the working
    directory as if ``sqlite://`` had been meant."""
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///", "SQLite:///"):
        with pytest.raises(ValidationError) as caught:
            open_store(url)
        assert caught.value.field == "url" and url in str(caught.value) and "names no file" in str(caught.value)
        result = run("--store", url, *command)
        assert result.exit_code == EXIT_USAGE, result.output
        line = one_error_line(result)
        assert "bad store URL" in line and repr(url) in line, line
    result = run("--store", "sqlite:///", "--json", *command)
    assert json.loads(result.stdout)["error"]["type"] == "ValidationError"
    assert list(tmp_path.iterdir()) == []


def test_a_percent_encoded_question_mark_is_a_file_name(tmp_path):
    assert sqlite_file(f"sqlite:///{tmp_path}/a%3Fb.db") == f"{tmp_path}/a?b.db"
    assert sqlite_file("sqlite://") == "threadloom.db" and sqlite_file("memory://") is None


# -- 5. options a store does not take --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "option"),
    [
        ("memory://", "busy_timeout"),
        ("memory://", "config"),
        ("sqlite:///{tmp}/x.db", "config"),
        ("sqlite:///{tmp}/x.db", "pool"),
        ("postgresql://127.0.0.1:1/db", "clock"),
    ],
)
def test_open_store_refuses_an_option_the_store_does_not_take(tmp_path, url, option):
    with pytest.raises(ValidationError) as caught:
        open_store(url.format(tmp=tmp_path), **{option: object()})
    assert caught.value.field == option
    assert "not an option" in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # refused before the file is created


def test_open_store_still_passes_the_options_a_store_takes(tmp_path):
    with open_store(f"sqlite:///{tmp_path}/x.db", busy_timeout=timedelta(seconds=1), synchronous="FULL") as store:
        assert store.path == str(tmp_path / "x.db")
    with open_store("memory://", clock=None) as store:
        assert store.latest("t") is None
