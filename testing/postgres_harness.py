"""PostgreSQL store harnesses for the contract suite.

Tests find the server through the environment variable ``THREADLOOM_TEST_PG`` (default
``postgresql://postgres@127.0.0.1:5432/postgres``). Where it is not reachable they **skip** with a loud reason,
except when ``CI=true``, where that is a **failure**: :func:`postgres_dsn` is the one place that decides.

Every harness works in a schema of its own (``tl_test_<random>``), dropped in :meth:`StoreHarness.cleanup`.
The database decides time (``database_clock = True``): time-dependent contract tests use multiples of
``tick`` and :meth:`StoreHarness.advance` waits in real time, without changing any production SQL.

* :class:`PgHarness` - one :class:`PostgresCheckpointer`; :meth:`sibling` opens a second store on the schema.
* :class:`PgPairHarness` - two stores on one schema, calls alternating between them
  (:class:`AlternatingCheckpointer`): every rule must hold whichever store a call reaches.
* :class:`PgCallerPoolHarness` - a store over a pool the caller owns (:meth:`PostgresCheckpointer.create`),
  which takes the per-transaction path for the call limits.
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import select
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest

from threadloom.persistence import redact_url
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.postgres.store import (
    PostgresCheckpointer,
    PostgresCheckpointerConfig,
)
from threadloom.testing.harness import AlternatingCheckpointer, StoreHarness

ENV_DSN = "THREADLOOM_TEST_PG"
"""The environment variable naming the test server."""

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The test server when ``THREADLOOM_TEST_PG`` is not set."""


@functools.cache
def _probe(dsn: str) -> str | None:
    """None when ``dsn`` answers ``SELECT 1``, else why not (never showing a password)."""
    try:
        import psycopg
    except ImportError as error:
        return f"psycopg is not installed ({error}); install the postgres extra"
    try:
        with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        password = _password(dsn)
        return text.replace(password, "***") if password else text
    return None


def _password(dsn: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        password = conninfo_to_dict(dsn).get("password")
        return str(password) if password else None
    except Exception:
        return None


def postgres_dsn() -> str:
    """The test server's DSN; skips the test when it is unreachable, or fails it when ``CI=true``.

    Returns:
        ``THREADLOOM_TEST_PG`` or :data:`DEFAULT_DSN`.
    """
    dsn = os.environ.get(ENV_DSN) or DEFAULT_DSN
    problem = _probe(dsn)
    if problem is not None:
        reason = (
            f"PostgreSQL tests need a server: {redact_url(dsn)} is not reachable ({problem}); "
            f"set {ENV_DSN} to a postgresql:// URL"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return dsn


class _Dropper:
    """Drops the schemas of finished tests on a thread of its own, so a test does not wait for DROP SCHEMA.

    ``atexit`` waits (bounded) for the drops still queued.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, dsn: str, schema: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="threadloom-test-drop", daemon=True)
                self._thread.start()
                atexit.register(self.drain)
        self._queue.put((dsn, schema))

    def drain(self, timeout_s: float = 60.0) -> None:
        """Waits until every queued drop ran (at most ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is not None:
                    drop_schema(*item)
            except Exception:  # a schema left behind is only clutter; never fail a test for it
                pass
            finally:
                self._queue.task_done()


_dropper = _Dropper()


def drop_schema(dsn: str, schema: str) -> None:
    """Drops ``schema`` and everything in it (quoted with ``psycopg.sql.Identifier``)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
        conn.execute("SET lock_timeout = 10000")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def new_schema_name() -> str:
    """A fresh schema name for one test: ``tl_test_<12 hex digits>``."""
    return f"tl_test_{uuid.uuid4().hex[:12]}"


class _LoopbackProxy:
    """The part every test proxy shares: a listening socket on loopback in front of the server ``dsn`` names, and
    a thread accepting connections, each handed with its new upstream socket to :meth:`_connected`.

    Attributes:
        dsn: ``dsn`` with host and port replaced by the proxy's.
    """

    def __init__(self, dsn: str, thread_name: str) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
        self._upstream = (str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432))
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.05)
        parts.update(host="127.0.0.1", port=str(self._server.getsockname()[1]))
        self.dsn = make_conninfo("", **parts)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=thread_name, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self._connected(client, upstream)

    def _connected(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError


class StallingProxy(_LoopbackProxy):
    """A TCP proxy on loopback in front of the test server that can stall: a network that stops answering.

    While stalled it forwards nothing in either direction (bytes wait in the kernel's buffers); :meth:`resume`
    forwards them again. Every loop is bounded by :meth:`close`.

    Args:
        dsn: the server to forward to (its host and port).

    Attributes:
        dsn: ``dsn`` with host and port replaced by the proxy's.
    """

    def __init__(self, dsn: str) -> None:
        self._stalled = threading.Event()
        self._sockets: list[socket.socket] = []
        super().__init__(dsn, "threadloom-test-proxy")

    def stall(self) -> None:
        """Stops forwarding, in both directions, on every connection (new ones included)."""
        self._stalled.set()

    def resume(self) -> None:
        """Forwards again."""
        self._stalled.clear()

    def close(self) -> None:
        """Closes the proxy and every connection through it."""
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass
        self._server.close()

    def _connected(self, client: socket.socket, upstream: socket.socket) -> None:
        with self._lock:
            self._sockets += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                if self._stalled.is_set():
                    time.sleep(0.01)
                    continue
                readable, _, _ = select.select([src], [], [], 0.05)
                if not readable or self._stalled.is_set():  # a stall that began during select holds the bytes
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Pair:
    """One connection through a :class:`FaultProxy`: the client's socket and the server's."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.held = False  # stalled: nothing more is forwarded, and what it holds is never delivered
        self.used = False  # it carried a request before: an armed fault never hits a connection being opened

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass


class FaultProxy(_LoopbackProxy):
    """A TCP proxy on loopback in front of the test server that breaks connections at a chosen point of a call.

    A *stall* stops a connection: nothing more is forwarded either way, and what it held is never delivered (a
    path that went silent and then died). A *reset* closes both of its sockets at once. Either can hit every
    connection now (:meth:`stall_all`, :meth:`reset_all`), or be armed (:meth:`arm`) to hit the next request a
    client sends on a connection that carried one before (never one being opened): ``"request"`` before any of
    its bytes reach the server, ``"answer"`` after they did, when the server's first answer comes back (for a
    one-statement transaction: after it committed). :meth:`heal` drops the stalled connections and forwards
    again. Every loop is bounded by :meth:`close`.

    Args:
        dsn: the server to forward to (its host and port).

    Attributes:
        dsn: ``dsn`` with host and port replaced by the proxy's.
        fired: set once an armed fault hit.
    """

    def __init__(self, dsn: str) -> None:
        self.fired = threading.Event()
        self._armed: tuple[str, str] | None = None
        self._target: _Pair | None = None
        self._pairs: list[_Pair] = []
        super().__init__(dsn, "threadloom-test-fault-proxy")

    def arm(self, point: str, action: str) -> None:
        """The next request any client sends meets ``action`` (``"stall"``/``"reset"``) at ``point``
        (``"request"``: before it reaches the server; ``"answer"``: before the server's answer reaches it)."""
        assert point in ("request", "answer") and action in ("stall", "reset")
        with self._lock:
            self.fired.clear()
            self._armed, self._target = (point, action), None

    def stall_all(self) -> None:
        """Stalls every open connection (new ones are forwarded: a pool can replace what it gives up)."""
        with self._lock:
            for pair in self._pairs:
                pair.held = True

    def reset_all(self) -> None:
        """Resets every connection now."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def heal(self) -> None:
        """Drops every stalled connection, disarms, and forwards again."""
        with self._lock:
            self._armed, self._target = None, None
            held = [pair for pair in self._pairs if pair.held]
            self._pairs = [pair for pair in self._pairs if not pair.held]
        for pair in held:
            pair.close()

    def close(self) -> None:
        """Closes the proxy and every connection through it."""
        self._closed.set()
        self.reset_all()
        self._server.close()

    def _connected(self, client: socket.socket, upstream: socket.socket) -> None:
        pair = _Pair(client, upstream)
        with self._lock:
            self._pairs.append(pair)
        for upward in (True, False):
            threading.Thread(target=self._pump, args=(pair, upward), daemon=True).start()

    def _fault(self, pair: _Pair, upward: bool) -> str | None:
        """The action to take instead of forwarding a chunk (None: forward it)."""
        with self._lock:
            if self._armed is None:
                return None
            point, action = self._armed
            if upward and self._target is None:
                if not pair.used:
                    return None
                self._target = pair
                if point == "answer":
                    return None
            elif upward or pair is not self._target or point != "answer":
                return None
            self._armed = None
            self.fired.set()
            return action

    def _pump(self, pair: _Pair, upward: bool) -> None:
        src, dst = (pair.client, pair.upstream) if upward else (pair.upstream, pair.client)
        try:
            while not self._closed.is_set():
                if pair.held:
                    time.sleep(0.005)
                    continue
                readable, _, _ = select.select([src], [], [], 0.05)
                if not readable or pair.held:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                action = self._fault(pair, upward)
                if action == "reset":
                    break
                if action == "stall":
                    pair.held = True
                    continue
                dst.sendall(data)
                pair.used = pair.used or upward
        except (OSError, ValueError):  # closed by the other direction's pump or by a reset
            pass
        finally:
            if not pair.held:
                pair.close()


class PrivateServer:
    """A PostgreSQL server of one test's own, which it may stop, restart and throw away (never the shared one).

    ``initdb`` into a temporary directory and ``pg_ctl`` on a free loopback port, with password (SCRAM)
    authentication for TCP. Run as the ``postgres`` OS user (``runuser``) when the tests run as root, as the
    server refuses root. The binaries are found under ``/usr/lib/postgresql/<version>/bin`` or on ``PATH``;
    without them the test skips (fails when ``CI=true``), as :func:`postgres_dsn` does.

    Attributes:
        password: the ``postgres`` role's password.
        dsn: a ``postgresql://`` URL of the server's ``postgres`` database with that password.
        port: the server's port.
    """

    password = "s3cret-of-the-private-server"

    def __init__(self) -> None:
        import glob
        import shutil
        import subprocess
        import tempfile

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
        initdb = found[-1] if found else shutil.which("initdb")
        if initdb is None:
            reason = "a private PostgreSQL server needs initdb and pg_ctl (install the postgresql server package)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(reason)
            pytest.skip(reason)
        self._bin = os.path.dirname(initdb)
        self._run = subprocess.run
        self._prefix: list[str] = []
        self._dir = tempfile.mkdtemp(prefix="threadloom-pg-")
        if os.geteuid() == 0:
            self._prefix = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self._dir, "postgres", "postgres")
        self._data = os.path.join(self._dir, "data")
        with socket.create_server(("127.0.0.1", 0)) as probe:
            self.port = probe.getsockname()[1]
        pwfile = os.path.join(self._dir, "pw")
        with open(pwfile, "w") as handle:
            handle.write(self.password + "\n")
        if self._prefix:
            shutil.chown(pwfile, "postgres", "postgres")
        self._pg("initdb", "-D", self._data, "-U", "postgres", "--auth-host=scram-sha-256", "--auth-local=trust",
                 f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8")  # fmt: skip
        self.dsn = f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/postgres"
        self.start()

    def _pg(self, tool: str, *args: str) -> None:
        done = self._run([*self._prefix, os.path.join(self._bin, tool), *args], capture_output=True, text=True,
                         timeout=120, cwd=self._dir)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Starts the server and waits until it accepts connections."""
        options = f"-p {self.port} -k {self._dir} -c listen_addresses=127.0.0.1"
        self._pg("pg_ctl", "-D", self._data, "-o", options, "-l", os.path.join(self._dir, "log"), "-w", "-t", "60",
                 "start")  # fmt: skip

    def stop(self) -> None:
        """Stops the server the way a restart does (``-m fast``: sessions are ended, work is rolled back)."""
        self._pg("pg_ctl", "-D", self._data, "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        """Stops the server (immediately) and removes its directory."""
        import shutil

        try:
            self._pg("pg_ctl", "-D", self._data, "-m", "immediate", "-w", "-t", "60", "stop")
        except Exception:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)


def _version_key(path: str) -> tuple[int, ...]:
    part = path.split("/")[-3]
    return tuple(int(piece) for piece in part.split(".") if piece.isdigit())


class PgHarness(StoreHarness):
    """One :class:`PostgresCheckpointer` in a schema of its own; its sibling is a second store on the schema.

    Attributes:
        dsn: the test server (see :func:`postgres_dsn`).
        schema: this harness's schema, dropped by :meth:`cleanup`.
    """

    name = "postgres"
    database_clock = True
    tick = timedelta(milliseconds=200)
    reopenable = True
    shared = True
    call_timeout = timedelta(seconds=10)
    max_size = 4

    def __init__(self) -> None:
        super().__init__()
        self.dsn = postgres_dsn()
        self.schema = new_schema_name()

    def config(self, **changes: Any) -> PostgresCheckpointerConfig:
        """This harness's store configuration, with ``changes`` applied."""
        fields: dict[str, Any] = dict(
            schema=self.schema, min_size=1, max_size=self.max_size, call_timeout=self.call_timeout
        )
        fields.update(changes)
        return PostgresCheckpointerConfig(**fields)

    def open_pg(self, **changes: Any) -> PostgresCheckpointer:
        """A :class:`PostgresCheckpointer` on this harness's schema, closed by :meth:`cleanup`."""
        store = PostgresCheckpointer.open(self.dsn, self.config(**changes), access=self.access)
        self._opened.append(store)
        return store

    def _open(self) -> Checkpointer:
        return PostgresCheckpointer.open(self.dsn, self.config(), access=self.access)

    def _remove(self) -> None:
        _dropper.submit(self.dsn, self.schema)


class PgPairHarness(PgHarness):
    """Two PostgreSQL stores on one schema; each call goes to the next of them in turn."""

    name = "postgres-pair"

    def _open(self) -> Checkpointer:
        return AlternatingCheckpointer(
            PostgresCheckpointer.open(self.dsn, self.config(), access=self.access),
            PostgresCheckpointer.open(self.dsn, self.config(), access=self.access),
        )


class PgCallerPoolHarness(PgHarness):
    """A store built with :meth:`PostgresCheckpointer.create` over a pool the test owns (manual-commit
    connections, as a caller's pool may have): the store then sets its limits per transaction and leaves the
    connections' sessions alone. The pools are closed after the stores, by :meth:`cleanup`."""

    name = "postgres-caller-pool"

    def __init__(self) -> None:
        super().__init__()
        self._pools: list[Any] = []

    def _open(self) -> Checkpointer:
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(self.dsn, min_size=1, max_size=self.max_size, open=True, timeout=10)
        self._pools.append(pool)
        return PostgresCheckpointer.create(pool, self.config(), access=self.access)

    def _remove(self) -> None:
        for pool in self._pools:
            pool.close()
        super()._remove()


__all__ = [
    "DEFAULT_DSN",
    "ENV_DSN",
    "FaultProxy",
    "PgCallerPoolHarness",
    "PgHarness",
    "PgPairHarness",
    "PrivateServer",
    "StallingProxy",
    "drop_schema",
    "new_schema_name",
    "postgres_dsn",
]
