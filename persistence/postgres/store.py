"""``PostgresCheckpointer``: the store shared by every runtime on every machine.

Threads, checkpoint histories, pending writes, event logs, effect records and claims live in one PostgreSQL
schema (``PostgresCheckpointerConfig.schema``, or ``?schema=name`` in the URL given to
:meth:`PostgresCheckpointer.open`) that the store creates and migrates itself
(:mod:`~threadloom.persistence.postgres.schema`). It behaves exactly like
:class:`~threadloom.persistence.memory.InMemoryCheckpointer` except that **the database decides time**: claim
expiry, ``updated_at``, tombstone age and retention age are judged by the server's ``clock_timestamp()``, read
once a call holds its row locks.

Every call is one bounded call of :class:`~threadloom.persistence.postgres.calls.Database`: one pooled
connection, one transaction, one round trip. A write is one PL/pgSQL function (``tl_claim``, ``tl_commit``,
``tl_delete``…, in ``migrations/functions/``) that locks the thread's row first; a read is one ``SELECT``.

**A commit writes what was encoded once.** :meth:`~threadloom.persistence.base.Checkpointer.commit` validates
and encodes the commit (:mod:`~threadloom.persistence.encoded`); ``_commit`` sends those texts as they are -
the checkpoint (its ``fencing_token`` already the commit's token), the pending writes, the effect records - in
one statement. Event numbers are known only inside the transaction, under the thread's row lock, so each event
goes as its text without the number (what :meth:`EncodedEvent.text <threadloom.persistence.encoded.EncodedEvent.text>`
puts after ``{"seq":<n>,``); ``tl_commit`` stores ``{"seq":<n>,`` followed by it - exactly ``text(n)`` - and
answers the first number, from which ``EncodedEvent.record`` builds the returned records. One round trip,
nothing parsed on either side. When a check fails, ``tl_commit`` writes nothing and answers what each check
read (the claim's token, the fence's, the parent the checkpoint must name, whether its id is taken, the latest
id); the store raises through :func:`threadloom.domain.rules.check_commit`, the one definition of the checks'
order and messages. A commit without a checkpoint to a thread whose latest checkpoint another access schema
stamped (an older node committed it) takes one more round trip: ``tl_commit`` answers that checkpoint instead of
applying, and the commit goes again with the stamp derived from it, which it writes on its rows and on the
thread's older ones in its one transaction (:mod:`~threadloom.persistence.postgres.access`).

``await_events_after`` waits on ``LISTEN`` (:mod:`~threadloom.persistence.postgres.listener`); the durable run
queue is ``store.queue`` (:mod:`~threadloom.persistence.postgres.queue`), in the same schema.

psycopg is imported lazily, so ``from threadloom import PostgresCheckpointer`` works without the ``postgres``
extra; :meth:`PostgresCheckpointer.open` then raises ``ProcessingError`` naming the extra.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs

from threadloom.domain import rules
from threadloom.domain.access import AccessSchemas
from threadloom.domain.clock import duration_micros
from threadloom.domain.errors import (
    CancelledError,
    CheckpointNotFound,
    ProcessingError,
    StaleClaim,
    StoreCorrupt,
    StoreUnavailable,
    ThreadBusy,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    CheckpointPage,
    ClaimRequest,
    EffectRecord,
    EventRecord,
    RetentionPolicy,
    RunClaim,
    StoredCheckpoint,
    SweepGuard,
    SweepPage,
    SweepPolicy,
    TenantCount,
    TenantPage,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
)
from threadloom.persistence import codec
from threadloom.persistence.access import check_access
from threadloom.persistence.base import StoreBase, ask_guard
from threadloom.persistence.check import CheckReport
from threadloom.persistence.encoded import EncodedCommit, EncodedEvent
from threadloom.persistence.postgres import conninfo as libpq
from threadloom.persistence.postgres import sql as q
from threadloom.persistence.postgres.access import (
    ACCESS_STATEMENTS,
    STAMP_ATTEMPTS,
    PostgresAccess,
    declared_hashes,
    moving_latest,
)
from threadloom.persistence.postgres.calls import (
    ConnectFailures,
    Database,
    TextArray,
    as_utc,
    text_array_dumper,
)
from threadloom.persistence.postgres.check import check as check_store
from threadloom.persistence.postgres.config import (
    MAX_CALL_TIMEOUT,
    MAX_CONNECT_TIMEOUT,
    MIN_CALL_TIMEOUT,
    MIN_CONNECT_TIMEOUT,
    PostgresCheckpointerConfig,
    session_settings,
)
from threadloom.persistence.postgres.errors import connect_error, map_error
from threadloom.persistence.postgres.listener import Listener, Waiters, listen_connection
from threadloom.persistence.postgres.listener import log as listener_log
from threadloom.persistence.postgres.queue import PostgresRunQueue
from threadloom.persistence.postgres.registry import Registry
from threadloom.persistence.postgres.schema import migrate
from threadloom.persistence.wakeups import Wakeups

if TYPE_CHECKING:  # pragma: no cover
    from psycopg_pool import ConnectionPool

_SEQ_ZERO = '{"seq":0,'
"""How :meth:`EncodedEvent.text` begins for number 0: what ``tl_commit`` writes again with the real number."""

_STATEMENTS = (
    "CLAIM", "RENEW", "RELEASE", "CURRENT_CLAIM", "COMMIT", "DELETE", "COMPACT", "PRUNE", "SWEEP", "LATEST",
    "CHECKPOINT", "HISTORY", "HISTORY_BEFORE", "SEARCH_HISTORY", "CHILDREN", "CHILDREN_AFTER", "EVENTS", "EFFECT",
    "LOOKUP_RUN", "SWEEP_PAGE", "TENANTS", "TENANTLESS", *ACCESS_STATEMENTS,
)  # fmt: skip


def _unnumbered(event: EncodedEvent) -> str:
    """The event's stored text without its leading ``{"seq":<n>,`` (``tl_commit`` puts it back numbered)."""
    text = event.text(0)
    if not text.startswith(_SEQ_ZERO):  # the encoder's layout is what the server completes
        raise ProcessingError("commit", "the event encoder's layout changed; the store cannot number events")
    return text[len(_SEQ_ZERO) :]



def _url_connect_timeout(config: PostgresCheckpointerConfig, parts: dict[str, Any]) -> PostgresCheckpointerConfig:
    """``config`` with the connection string's ``connect_timeout`` (whole seconds), when it has one.

    The store's own bound replaces libpq's on every connection it opens, so a value libpq would take silently (its
    own reading ignores what follows the digits, and waits forever for 0) is refused here instead of ignored.

    Raises:
        ValidationError: (field ``conninfo``) not a whole number of seconds, or outside ``config.connect_timeout``'s
            bounds.
    """
    raw = parts.get("connect_timeout")
    if raw is None:
        return config
    value = str(raw).strip()
    if not value.isascii() or not value.isdigit():
        raise ValidationError(
            "conninfo", (f"its connect_timeout parameter must be a whole number of seconds, got {value!r}",)
        )
    try:
        return attrs.evolve(config, connect_timeout=timedelta(seconds=int(value)))
    except ValidationError as error:
        raise ValidationError(
            "conninfo", tuple(f"its connect_timeout parameter {problem}" for problem in error.problems)
        ) from None


def _check_config(config: Any) -> PostgresCheckpointerConfig:
    if config is None:
        return PostgresCheckpointerConfig()
    if not isinstance(config, PostgresCheckpointerConfig):
        raise ValidationError("config", (f"must be a PostgresCheckpointerConfig, got {type(config).__name__}",))
    return config


class PostgresCheckpointer(PostgresAccess, StoreBase):
    """The store contract in a PostgreSQL schema, shared by every store over it.

    Build it with :meth:`open` (a pool of its own) or :meth:`create` (the caller's pool); safe to call from any
    number of threads, each call on a connection of its own. Stores on one database and schema behave as one
    store: tokens come from one sequence, each write locks the thread's row, and ``await_events_after`` wakes
    on commits and deletes made through any of them (``LISTEN``/``NOTIFY``; a lost notification costs at most
    one ``timeout``).

    Every method behaves as :class:`~threadloom.persistence.base.Checkpointer` documents, with the database's
    clock as the store's clock, and in addition:

    * returns within ``connect_timeout`` (waiting for a connection) plus ``call_timeout`` (plus a margin of at
      most 250 ms); past that it raises, its connection aborted and discarded;
    * runs on a connection the server has not ended: pooled connections that a restart, a failover,
      ``pg_terminate_backend`` or a reset path ended while idle are found before anything is sent and replaced,
      so such a fault between calls fails no call and the store need not be reopened;
    * a failure is a ``ProcessingError`` of the kind a caller can act on, naming the operation and thread:
      ``StoreUnavailable`` when nothing was applied and the call may pass later (no connection, a lost
      connection or the deadline on a read, the server's statement or lock timeout, a deadlock) - retry it;
      ``OutcomeUnknown`` when a write's connection was lost or timed out after it was sent - it may have
      applied: read the thread, or retry (fencing refuses or applies it once); ``StoreCorrupt`` for a schema that
      is missing, newer than this code or does not match it, or a row that does not decode - do not retry;
      ``StoreClosed`` after :meth:`close`;
    * ``await_events_after(..., cancel=event)`` raises ``CancelledError`` within milliseconds of ``event`` being
      set, also in the middle of a read, whose connection is then discarded.

    Attributes:
        queue: the store's durable run queue, in the same schema: its open entries' runs survive retention.
    """

    def __init__(self, db: Database, *, target: str, access: AccessSchemas | None = None) -> None:
        """Internal: use :meth:`open` or :meth:`create`."""
        super().__init__(max_json_size=db.config.max_json_size, access=access)
        from psycopg.types.json import Jsonb

        self._db = db
        self._config = db.config
        self._target = target
        self._jsonb = lambda value: Jsonb(value, dumps=codec.dumps)
        self._sql = {name: db.render(getattr(q, name)) for name in _STATEMENTS}
        self._declared = declared_hashes(self._access)
        self._registry = Registry(db)
        self._waiters = Waiters()
        self._listener = Listener(
            lambda: listen_connection(db.pool, db.config.connect_timeout),
            db.config.channel,
            self._waiters.notify,
            self._waiters.wake_all,
            db.config.schema,
            events_channel=db.config.events_channel,
            on_events=self._carried,
            register=db.render(q.LISTEN_REGISTER),
        )
        self.queue = PostgresRunQueue(self, db)

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, conninfo: str, config: PostgresCheckpointerConfig | None = None, *, access: AccessSchemas | None = None
    ) -> PostgresCheckpointer:
        """Opens a store over a connection pool of its own, creating or migrating the schema.

        Args:
            conninfo: a libpq connection string (``host=… dbname=…``) or ``postgresql://`` URL (percent-encode
                ``/`` and ``@`` in its user name or password). A URL may name the schema in its query,
                ``postgresql://…/db?schema=name``: it overrides ``config.schema``, is checked like it, and is
                taken out before libpq sees the URL. A ``connect_timeout`` option (whole seconds, in a URL or a
                connection string) overrides ``config.connect_timeout`` and is checked like it. The password never
                appears in an error, a log line or the store's ``repr`` (which show only ``user@host:port/dbname``),
                and a string libpq cannot parse is refused before any connection is tried, without showing any of
                it.
            config: schema, pool sizes and timeouts; ``PostgresCheckpointerConfig()`` by default.
            access: the access schemas this store stamps every commit's rows with and checks tenant-scoped reads
                against (README "Access schemas"); default: none declared (every graph kind tenant-only).

        Returns:
            The open store; :meth:`close` closes its pool too.

        Raises:
            ValidationError: ``conninfo`` is not a str or not a connection string libpq can parse, its
                ``schema`` parameter is not a valid schema name (field ``conninfo``), or ``config`` is not a
                ``PostgresCheckpointerConfig``, or its ``connect_timeout`` is not a whole number of seconds within
                ``config.connect_timeout``'s bounds: nothing was connected to. Also (field ``conninfo``) when libpq or
                the server refuses one of its option values (``sslmode``, ``port``, ``keepalives``, a setting in
                ``options``…): the message names the value, never the password; nothing was written.
            StoreUnavailable: the server refused the first connection in a way waiting may heal (refused, no
                answer within ``connect_timeout``, starting up or shutting down, no free connection slot) -
                reported at once with psycopg's reason - or did not answer while migrating. Retrying is safe
                (opening writes nothing a retry could repeat).
            StoreCorrupt: the schema is at a version newer than this code.
            ProcessingError: (plain, not retryable) the connection string names what is not there or is not
                admitted - no such database, role or host, authentication refused - reported at once with the
                server's reason, never the password; the ``postgres`` extra is missing; or the schema holds no
                store and ``config.create`` is False.
        """
        if not isinstance(conninfo, str):
            raise ValidationError("conninfo", (f"must be a str, got {type(conninfo).__name__}",))
        config = _check_config(config)
        check_access(access)
        libpq.require_psycopg()
        from psycopg_pool import ConnectionPool

        text, schema = libpq.take_schema(conninfo)
        if schema is not None:
            try:
                config = attrs.evolve(config, schema=schema)
            except ValidationError as error:
                raise ValidationError(
                    "conninfo", tuple(f"its schema parameter {problem}" for problem in error.problems)
                ) from None
        parts = libpq.parse(text)
        config = _url_connect_timeout(config, parts)
        secrets = libpq.secrets_of(text, parts)
        target = libpq.target_of(parts, secrets)
        settings = session_settings(config)

        def configure(conn: Any) -> None:  # runs on the pool's worker thread, once per new connection
            from psycopg import ClientCursor

            ClientCursor(conn).execute(settings)
            conn.adapters.register_dumper(TextArray, text_array_dumper())

        kwargs = {"autocommit": True, "connect_timeout": max(2, math.ceil(config.connect_timeout.total_seconds()))}
        failures = ConnectFailures()
        connection_class = failures.connection_class()
        try:  # one connection first: a refusal is reported at once, with its cause, not after connect_timeout
            connection_class.connect(text, **kwargs).close()
        except Exception as error:
            raise connect_error(
                error, operation="open", target=target, scrub=lambda line: libpq.scrub(secrets, line)
            ) from None
        try:
            pool = ConnectionPool(
                text,
                min_size=config.min_size,
                max_size=config.max_size,
                kwargs=kwargs,
                connection_class=connection_class,
                configure=configure,
                timeout=config.connect_timeout.total_seconds(),
                open=False,
                name=f"threadloom[{config.schema}]",
            )
        except Exception as error:
            raise ProcessingError(
                "open", f"invalid connection string for {target}: {libpq.scrub(secrets, libpq.first_line(error))}"
            ) from None
        try:
            pool.open(wait=config.min_size > 0, timeout=config.connect_timeout.total_seconds())
        except Exception as error:
            pool.close(timeout=0)
            cause = failures.last or libpq.first_line(error)
            raise StoreUnavailable(
                "open",
                f"cannot connect to PostgreSQL at {target} within {config.connect_timeout.total_seconds():g} s "
                f"({libpq.scrub(secrets, cause)})",
            ) from None
        return cls._migrated(
            pool, config, owns_pool=True, secrets=secrets, target=target, failures=failures, access=access
        )

    @classmethod
    def create(
        cls, pool: ConnectionPool, config: PostgresCheckpointerConfig | None = None, *,
        access: AccessSchemas | None = None,
    ) -> PostgresCheckpointer:  # fmt: skip
        """A store over the caller's open ``psycopg_pool.ConnectionPool``, creating or migrating the schema.

        The store uses each connection in autocommit mode for the length of a call and restores the mode when
        it gives the connection back. :meth:`close` leaves the pool open. ``config.min_size`` and
        ``config.max_size`` are the pool's business and are ignored.

        Raises:
            ValidationError: ``pool`` is not a ``ConnectionPool`` or ``config`` not a config.
            ProcessingError: as for :meth:`open` (its kinds).
        """
        config = _check_config(config)
        check_access(access)
        libpq.require_psycopg()
        from psycopg_pool import ConnectionPool

        if not isinstance(pool, ConnectionPool):
            raise ValidationError("pool", (f"must be a psycopg_pool.ConnectionPool, got {type(pool).__name__}",))
        text = pool.conninfo if isinstance(pool.conninfo, str) else ""
        try:
            parts: dict[str, Any] | None = libpq.parse(text)
        except ValidationError:  # the pool's business: it fails to connect and says so
            parts = None
        # psycopg_pool may take callables for conninfo and kwargs: it calls them itself, their secrets are unknown here
        kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
        secrets = libpq.secrets_of(text, parts, dict(kwargs))
        target = libpq.target_of(parts, secrets)
        return cls._migrated(pool, config, owns_pool=False, secrets=secrets, target=target, access=access)

    @classmethod
    def _migrated(
        cls, pool: ConnectionPool, config: PostgresCheckpointerConfig, *, owns_pool: bool, secrets: tuple[str, ...],
        target: str, failures: ConnectFailures | None = None, access: AccessSchemas | None = None,
    ) -> PostgresCheckpointer:  # fmt: skip
        db = Database(pool, config, owns_pool=owns_pool, secrets=secrets, failures=failures)
        store = cls(db, target=target, access=access)
        try:
            migrate(store._db, target)
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def session_settings(config: PostgresCheckpointerConfig) -> str:
        """What the store's own pool runs on each new connection (see
        :func:`~threadloom.persistence.postgres.config.session_settings`)."""
        return session_settings(config)

    @property
    def config(self) -> PostgresCheckpointerConfig:
        """The configuration the store was opened with."""
        return self._config

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool the store takes its connections from (its own, or the caller's)."""
        return self._db.pool

    def __repr__(self) -> str:
        return f"PostgresCheckpointer(target={self._target!r}, schema={self._config.schema!r})"

    def _call(self, operation: str, thread_id: str | None, name: str, params: Any, **kwargs: Any) -> Any:
        return self._db.call(operation, thread_id, self._sql[name], params, **kwargs)

    # -- claims ----------------------------------------------------------------------------------------------------

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        rows = self._call(
            "claim", thread_id, "CLAIM", (thread_id, request.holder, duration_micros(request.ttl), request.tenant_id),
            write=True,
        )  # fmt: skip
        code, token, expires_at, old_holder, old_tenant, latest = rows[0]
        if code == 1:
            raise ThreadBusy(thread_id, latest, rules.busy_holder(old_holder, old_tenant, request.tenant_id))
        return RunClaim(
            thread_id=thread_id,
            holder=request.holder,
            token=token,
            expires_at=as_utc(expires_at),
            tenant_id=request.tenant_id,
            taken_over_from=rules.taken_over_from(old_holder, old_tenant, request.tenant_id),
        )

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        rows = self._call("renew", thread_id, "RENEW", (thread_id, token, duration_micros(ttl)), write=True)
        code, current, holder, expires_at, tenant = rows[0]
        if code == 1:
            raise StaleClaim(thread_id, token, current)
        return RunClaim(
            thread_id=thread_id, holder=holder, token=token, expires_at=as_utc(expires_at), tenant_id=tenant
        )

    def _release(self, thread_id: str, token: int) -> None:
        self._call("release", thread_id, "RELEASE", (thread_id, token), write=True)

    def _current_claim(self, thread_id: str) -> RunClaim | None:
        rows = self._call("current_claim", thread_id, "CURRENT_CLAIM", (thread_id,), write=False)
        if not rows:
            return None
        holder, token, expires_at, tenant = rows[0]
        return RunClaim(
            thread_id=thread_id, holder=holder, token=token, expires_at=as_utc(expires_at), tenant_id=tenant
        )

    # -- commits -----------------------------------------------------------------------------------------------------

    def _commit(self, thread_id: str, encoded: EncodedCommit) -> list[EventRecord]:
        cp = encoded.checkpoint
        fence_thread, fence_token = encoded.fence if encoded.fence is not None else (None, None)
        params = (
            thread_id,
            encoded.token,
            fence_thread,
            fence_token,
            *(
                (cp.id, cp.parent, cp.run_id, cp.status, cp.tenant_id, cp.graph_id, cp.origin_parent, cp.text,
                 cp.metadata)
                if cp is not None
                else (None,) * 9
            ),
            encoded.retract_turn,
            TextArray([write.checkpoint_id for write in encoded.pending_writes]),
            TextArray([write.text for write in encoded.pending_writes]),
            TextArray([_unnumbered(event) for event in encoded.events]),
            TextArray([effect.key for effect in encoded.effects]),
            TextArray([effect.text for effect in encoded.effects]),
            self._jsonb(encoded.metadata) if encoded.metadata else None,
        )
        stamp: tuple[Any, Any, Any] = encoded.stamp or (None, None, None)
        schemas = self._declared if cp is None else None  # what a commit without a checkpoint checks its stamp by
        stamp_pos = None
        for _attempt in range(STAMP_ATTEMPTS):
            rows = self._call("commit", thread_id, "COMMIT", (*params, *stamp, schemas, stamp_pos), write=True)
            first_seq, current, fence_current, _base, duplicate, latest, stamp_pos, stamp_body = rows[0]
            if first_seq is not None:
                return [event.record(first_seq + index) for index, event in enumerate(encoded.events)]
            if stamp_pos is None:  # a check failed
                break
            # Every check passed, but the thread's stamp is another schema's: derive it from the latest checkpoint
            # answered, and send the commit again with it (applied with it only while that is still the latest).
            stamp = self._log_stamp(thread_id, stamp_body)
        else:
            raise moving_latest("commit", thread_id)
        rules.check_commit(
            thread_id,
            token=encoded.token,
            current=current,
            fence=encoded.fence,
            fence_current=lambda _other: fence_current,
            checkpoint=None if cp is None else (cp.id, cp.parent),
            contains=lambda _id: bool(duplicate),
            latest_id=lambda: latest,
            pending_targets=encoded.pending_targets,
            retract_turn=encoded.retract_turn,
        )
        raise StoreCorrupt(
            "commit",
            f"the database refused the commit on thread {thread_id!r} though every check passes on what it read; "
            "its commit function does not match this version",
        )

    # -- reads -------------------------------------------------------------------------------------------------------

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        rows = self._call("latest", thread_id, "LATEST", (thread_id,), write=False, single=True)
        if not rows:
            return None
        body, pending = rows[0]
        return StoredCheckpoint(
            checkpoint=codec.decode_checkpoint(body, thread_id),
            pending_writes=tuple(codec.decode_pending_write(text, thread_id) for text in pending),
        )

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        rows = self._call(
            "checkpoint", thread_id, "CHECKPOINT", (thread_id, checkpoint_id), write=False, single=True
        )
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        if before is None:
            rows = self._call("history", thread_id, "HISTORY", (thread_id, limit), write=False, single=True)
            bodies = [row[0] for row in rows]
        else:
            rows = self._call(
                "history", thread_id, "HISTORY_BEFORE", (limit, thread_id, before), write=False, single=True
            )
            if not rows:
                raise CheckpointNotFound(thread_id, before)
            bodies = rows[0][0]
        return [codec.decode_checkpoint(text, thread_id) for text in bodies]

    def _search_history(
        self, thread_id: str, metadata: dict[str, str], limit: int, before: str | None, scan: int
    ) -> CheckpointPage:
        wanted = codec.encode_metadata(metadata) if metadata else "{}"
        params = (before, thread_id, before, thread_id, scan - 1, thread_id, thread_id, wanted, limit + 1)
        found, floor, bodies = self._call("search_history", thread_id, "SEARCH_HISTORY", params, write=False)[0]
        if not found:
            raise CheckpointNotFound(thread_id, before or "")
        return CheckpointPage.of([codec.decode_checkpoint(text, thread_id) for text in bodies], limit, floor)

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        if after is None:
            return [row[0] for row in self._call("children", parent, "CHILDREN", (parent, limit), write=False)]
        rows = self._call("children", parent, "CHILDREN_AFTER", (limit, parent, after), write=False)
        if not rows:
            raise ValidationError("after", (f"{after!r} is not known as a child of {parent!r}",))
        return list(rows[0][0])

    def _read_events(
        self, operation: str, thread_id: str, after_seq: int, limit: int, cancel: threading.Event | None = None
    ) -> list[EventRecord]:
        rows = self._call(
            operation, thread_id, "EVENTS", (thread_id, after_seq, limit, thread_id), write=False, cancel=cancel
        )
        first_seq, floor, mark, bodies = rows[0]
        if first_seq is None:
            first_seq = floor = max(1, mark)
        rules.read_start(thread_id, after_seq, first_seq=first_seq, floor=floor)
        return [codec.decode_event(text, thread_id) for text in bodies]

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        return self._read_events("events_after", thread_id, after_seq, limit)

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        """Reads, and while it finds nothing waits for a notification naming the thread.

        Holds no connection while it waits. ``cancel`` ends it promptly with ``CancelledError``, also in the
        middle of a read (whose connection is then discarded).
        """
        operation = "await_events_after"
        deadline = time.monotonic() + timeout.total_seconds()
        if timeout <= timedelta(0):
            return self._read_events(operation, thread_id, after_seq, limit, cancel)
        wake = self._waiters.add(thread_id)
        watch = self._db.watchdog.enter(None, math.inf, cancel, wake) if cancel is not None else None
        try:
            self._listener.start()
            poll = self.poll_interval.total_seconds()
            while True:
                wake.clear()
                self._ensure_open(operation)
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                found = self._read_events(operation, thread_id, after_seq, limit, cancel)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found
                listening = self._listener.ready.is_set()
                woke = wake.wait(min(remaining, threading.TIMEOUT_MAX) if listening else min(remaining, poll))
                if cancel is not None and cancel.is_set():
                    raise CancelledError(operation)
                if not woke and listening and time.monotonic() >= deadline:
                    return []  # no notification named the thread: nothing landed (a lost one costs this timeout)
        finally:
            if watch is not None:
                self._db.watchdog.leave(watch)
            self._waiters.remove(thread_id, wake)

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        rows = self._call("effect", thread_id, "EFFECT", (thread_id, key), write=False)
        return codec.decode_effect(rows[0][0], thread_id) if rows else None

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        rows = self._call("lookup_run", thread_id, "LOOKUP_RUN", (sorted(run_ids), thread_id), write=False)
        return codec.decode_checkpoint(rows[0][0], thread_id) if rows else None

    # -- writes without a claim, deletes, retention ------------------------------------------------------------------

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        self._call("compact_events", thread_id, "COMPACT", (thread_id, before_seq), write=True)

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        fence_thread, fence_token = fence if fence is not None else (None, None)
        rows = self._call(
            "delete_thread", thread_id, "DELETE", (thread_id, token, fence_thread, fence_token), write=True
        )
        code, current = rows[0]
        if code == 1:
            raise StaleClaim(thread_id, token, current)
        if code == 2:
            assert fence is not None
            raise StaleClaim(fence[0], fence[1], current)

    @staticmethod
    def _policy_params(policy: RetentionPolicy) -> tuple[int | None, int | None, int | None]:
        return (
            duration_micros(policy.max_age) if policy.max_age is not None else None,
            policy.max_checkpoints,
            policy.max_events,
        )

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        if not policy.keeps_everything:
            self._call("prune", thread_id, "PRUNE", (thread_id, *self._policy_params(policy)), write=True)

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        rows = self._call("sweep", None, "SWEEP_PAGE", (after or "", policy.batch_size + 1), write=False)
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        more = len(ids) > policy.batch_size
        protected = ask_guard(guard, page)
        pruned: tuple[str, ...] = ()
        reclaimed: tuple[str, ...] = ()
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            tombstone_us = duration_micros(policy.tombstone_age) if policy.tombstone_age is not None else None
            protected_runs = self._jsonb({key: sorted(runs) for key, runs in protected.items()})
            params = (list(page), protected_runs, *self._policy_params(policy.retention), tombstone_us)
            pruned, reclaimed = (tuple(names) for names in self._call("sweep", None, "SWEEP", params, write=True)[0])
        return SweepPage(visited=page, pruned=pruned, reclaimed=reclaimed, next=page[-1] if more and page else None)

    def _preview_sweep(self, policy: SweepPolicy, after: str | None) -> SweepPage:
        rows = self._call("preview_sweep", None, "SWEEP_PAGE", (after or "", policy.batch_size + 1), write=False)
        ids = [row[0] for row in rows]
        page = tuple(ids[: policy.batch_size])
        more = len(ids) > policy.batch_size
        pruned: tuple[str, ...] = ()
        reclaimed: tuple[str, ...] = ()
        if page and (not policy.retention.keeps_everything or policy.tombstone_age is not None):
            tombstone_us = duration_micros(policy.tombstone_age) if policy.tombstone_age is not None else None
            params = (list(page), self._jsonb({}), *self._policy_params(policy.retention), tombstone_us)
            found = self._call("preview_sweep", None, "SWEEP", params, write=True, rollback=True)[0]
            pruned, reclaimed = (tuple(names) for names in found)
        return SweepPage(visited=page, pruned=pruned, reclaimed=reclaimed, next=page[-1] if more and page else None)

    # -- registry ------------------------------------------------------------------------------------------------

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        return self._registry.threads(query)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        return self._registry.incomplete(tenant_id, limit, after)

    def _tenants(self, limit: int, after: str | None) -> TenantPage:
        rows = self._call("tenants", None, "TENANTS", (after or "", limit + 1), write=False)
        named = [TenantCount(tenant_id=tenant, threads=n) for tenant, n in rows]
        tenantless = 0
        if len(named) <= limit:
            tenantless = self._call("tenants", None, "TENANTLESS", (), write=False)[0][0]
        return TenantPage.of(named, tenantless, limit)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def check(self) -> CheckReport:
        """Checks the store's invariants on one snapshot of its schema (README "Backup, restore and check" lists
        them). Reads only, in one REPEATABLE READ READ ONLY transaction; writers go on meanwhile.

        Returns:
            ``CheckReport``: the problems found (empty when sound; ``report.ok``) and the rows read.

        Raises:
            ProcessingError: the database failed or could not be reached; nothing was written.
        """
        self._ensure_open("check")
        return check_store(self._db)

    def _carried(self, payload: str) -> None:
        """On the listener's thread: a commit's notification that carried its events (a JSON array of their
        texts). Decoded once (only while someone waits), they are offered to the waiters of their thread; a payload
        that does not decode to one thread's consecutive events wakes every waiter instead (each re-reads)."""
        if not self._waiters.count():
            return
        try:
            events = codec.decode_events(payload, "(notification)")
            first = events[0]
            if any(e.thread_id != first.thread_id or e.seq != first.seq + i for i, e in enumerate(events)):
                raise ValueError("not one thread's consecutive events")
        except (StoreCorrupt, ValueError, IndexError) as error:
            listener_log.warning("store.notification_undecodable", op="await_events_after", error=type(error).__name__)
            self._waiters.wake_all()
            return
        self._waiters.notify(first.thread_id, tuple(events))

    def wakeups(self) -> Wakeups:
        """The store's waiters and its ``LISTEN`` connection, for waiting without a thread per waiter (README
        "asyncio"): a wake for a thread is set when a notification names it, every wake when the listening
        connection is (re-)established or lost. A commit's notification that carried its events offers them to
        the wakes it sets (``LoopWake.offered``)."""
        return Wakeups(self._waiters, start=self._listener.start, listening=self._listener.ready.is_set)

    def _close(self) -> None:
        # A listening store removes its registration, so commits stop notifying for it (only while it listens, so
        # the server was reachable just now; a row left behind is removed by the next registration on the schema).
        registered = self._listener.backend_pid if self._listener.ready.is_set() else None
        self._listener.stop()
        self._waiters.wake_all()
        if registered is not None:
            try:
                self._db.call("close", None, self._db.render(q.UNLISTEN), (registered,), write=True)
            except ThreadloomError:
                pass
        self._db.close()


__all__ = [
    "MAX_CALL_TIMEOUT",
    "MAX_CONNECT_TIMEOUT",
    "MIN_CALL_TIMEOUT",
    "MIN_CONNECT_TIMEOUT",
    "PostgresCheckpointer",
    "PostgresCheckpointerConfig",
    "map_error",
]
