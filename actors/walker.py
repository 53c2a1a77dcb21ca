"""Access walks: the ``Walker`` actor of one graph kind and ``Walks``, what the supervisor keeps of them.

A walk re-stamps the stored rows of one graph kind with the node's access schema (README "Access walks"). One
:class:`Walker` runs per declared graph kind in every runtime whose store declares access schemas; the walk
lease - a claim on the reserved thread ``<group>#access-walk/<graph_id>`` - decides which of them walks:

- **membership**: the runtime heartbeats, in the store, that it serves ``<graph_id>@<schema hash>`` of each
  declared schema, in group ``<group>#access`` (every ``claim_policy.renew_every``, expiring after
  ``claim_policy.ttl`` by the store's clock);
- **claim rules**: a walker claims its own schema's walk when none is recorded; it replaces another schema's
  only once no live member serves that schema (a rolling release starts its walk after the last node of the
  old one stopped); a completed walk of its own schema is not read again; a graph kind with no stored thread is
  not claimed (asked again every ``interval``);
- **the walk**: ``heads`` is the storage-wide token high-water mark when the walk was claimed; the walker pages
  the kind's threads ascending by id (``graph_threads``), stamps each (``stamp_thread`` fenced by the lease, under
  the store's history bulkhead: a refusal presses the pace and the thread is stamped again), renews the lease
  within a page and commits the record (cursor, count) after each page, fenced: the cursor never moves back, and a
  takeover redoes at most one page; past the last page the record is completed and the lease released;
- **pace**: :class:`~threadloom.domain.pace.WalkPace` - it waits after each thread, reads ``store.pressed`` each
  second, and sizes each page to what it stamps in ``interval``;
- **reports**: a :class:`~threadloom.domain.pace.WalkPaceReport` to the supervisor after each page, when the
  walk is claimed or done, and after a thread when the share or the pressed reading changed or the last report is
  :data:`REPORT_EVERY` old; and the record as last read or claimed; logs ``access.walked`` (per page),
  ``access.stamped`` (debug, per thread); metrics through the runtime's meter.

A walker that crashes is not restarted blindly: the supervisor starts a new one after ``interval``, which claims
the lease like any walker (the crashed one's lease expires first). A stored record that does not decode is a
``ProcessingError`` logged as ``access.walk_failed`` and asked again every ``interval``; nothing else stops.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import pykka

from threadloom.actors._failures import is_fatal
from threadloom.actors.logs import describe
from threadloom.actors.logs import log as _log
from threadloom.actors.runs import RunEnv
from threadloom.actors.scheduler import Cancellable
from threadloom.domain.access import (
    WALK_GRAPH_ID,
    AccessSchema,
    AccessSchemas,
    AccessStampOptions,
    WalkRecord,
    member_group,
    serves,
    walk_thread_id,
)
from threadloom.domain.errors import (
    CheckpointConflict,
    InvalidCommit,
    ProcessingError,
    StaleClaim,
    ThreadBusy,
)
from threadloom.domain.pace import WalkPace, WalkPaceReport
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit
from threadloom.persistence.metrics.meter import Meter, MetricSpec
from threadloom.persistence.pressure import Bulkhead

WALK_THREADS = "threadloom_walk_threads_stamped_total"
WALK_ROWS = "threadloom_walk_rows_stamped_total"
WALK_SHARE = "threadloom_walk_share"
WALK_PRESSED = "threadloom_walk_pressed_seconds_total"
WALK_PAGES = "threadloom_walk_pages_total"

WALK_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(name=WALK_THREADS, kind="counter", help="Threads stamped by access walks.", labels=("graph_id",)),
    MetricSpec(name=WALK_ROWS, kind="counter", help="Rows whose stamp access walks changed.", labels=("graph_id",)),
    MetricSpec(name=WALK_PAGES, kind="counter", help="Access walk pages recorded.", labels=("graph_id",)),
    MetricSpec(
        name=WALK_SHARE,
        kind="histogram",
        help="The share of its time an access walker may spend stamping, observed once a second.",
        labels=("graph_id",),
        # the attrs mypy plugin types the optional(tuple) converter's argument oddly; the value is a tuple
        buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),  # type: ignore[arg-type]
    ),
    MetricSpec(
        name=WALK_PRESSED,
        kind="counter",
        help="Seconds an access walker read the store's writes as pressed.",
        labels=("graph_id",),
    ),
)
"""The metrics the walkers record through the runtime's meter (docs/operations.md "Access walks")."""

SHARE_KEY = "threadloom.walk.share"
"""A walk record checkpoint's metadata key: the share of the pace that recorded it (``threadloom walks``)."""
RATE_KEY = "threadloom.walk.rate"
"""A walk record checkpoint's metadata key: the threads a second that pace allowed."""
NODE_KEY = "threadloom.walk.node"
"""A walk record checkpoint's metadata key: the node that recorded it."""
DEFAULT_GROUP = "threadloom"
"""The default walk group: the runtimes sharing one store walk as one group."""
REFUSED_PAUSE = timedelta(milliseconds=50)
"""The least pause after the history bulkhead refused a thread, before it is stamped again."""
REPORT_EVERY = timedelta(milliseconds=100)
"""The longest a walker goes without reporting its pace while nothing in it changed (a report wakes the
supervisor's thread: one per thread stamped cost a fast walk about a tenth of its time)."""


# -- messages -----------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class _Tick:
    """Tell (from the walker's timer): take the next step."""

    generation: int


@attrs.frozen(eq=False)
class WalkSeen:
    """Tell (walker -> supervisor): the record of a walk as this node last read or claimed it."""

    record: WalkRecord


@attrs.frozen(eq=False)
class WalkerCrashed:
    """Tell (walker -> supervisor): the walker of ``graph_id`` failed unexpectedly and stopped."""

    graph_id: str
    incarnation: int
    error: str


@attrs.frozen(eq=False)
class WalksQuery:
    """Ask (runtime -> supervisor): graph id -> the walk record as this node last read or claimed it."""


@attrs.frozen(eq=False)
class ShareQuery:
    """Ask (runtime -> supervisor): the share the walk of ``graph_id`` takes now on this node, or None."""

    graph_id: str


@attrs.frozen(eq=False)
class _Heartbeat:
    """Tell (from the supervisor's timer): heartbeat the membership."""

    generation: int


@attrs.frozen(eq=False)
class _Restart:
    """Tell (from the supervisor's timer): start a new walker of ``graph_id``."""

    graph_id: str


# -- the walker ---------------------------------------------------------------------------------------------


def _inner_attr(store: Any, name: str) -> Any:
    """``name`` of ``store`` or of the store it wraps (wrappers keep the concrete store as ``inner``)."""
    seen = 0
    while store is not None and seen < 16:
        found = getattr(store, name, None)
        if found is not None:
            return found
        store = getattr(store, "inner", None)
        seen += 1
    return None


class Walker(pykka.ThreadingActor):
    """The walker of one graph kind in one runtime (see the module docstring).

    Args:
        env: the runtime's environment (store, clock, scheduler, claim policy for the lease, node id).
        schema: this node's schema of the graph kind.
        options: the pace and page options.
        group: the walk group.
        tell: delivers a message to the supervisor (never raises).
        meter: where the metrics go, or None.
        incarnation: counts the walkers of this graph kind this runtime started (names the lease holder).
    """

    use_daemon_thread = True

    def __init__(
        self,
        env: RunEnv,
        schema: AccessSchema,
        options: AccessStampOptions,
        group: str,
        tell: Callable[[Any], None],
        meter: Meter | None,
        incarnation: int = 1,
    ) -> None:
        super().__init__()
        self._env = env
        self._store = env.store
        self._schema = schema
        self._graph_id = schema.graph_id
        self._options = options
        self._group = group
        self._walk_thread = walk_thread_id(group, schema.graph_id)
        self._members = member_group(group)
        self._tell = tell
        self._incarnation = incarnation
        self._holder = f"{env.node_id}/walker-{incarnation}"[:255]
        self._log = _log.bind(node_id=env.node_id, graph_id=schema.graph_id, walk=self._walk_thread)
        found = _inner_attr(env.store, "history_bulkhead")
        self._bulkhead: Bulkhead | None = found if isinstance(found, Bulkhead) else None
        self._pace = WalkPace.from_options(options, env.clock.now())
        self._pressure_read = env.clock.now()
        # the lease and the walk
        self._token: int | None = None
        self._renewed_at = env.clock.now()
        self._not_before = env.clock.now()  # the pace's wait after the last thread ends then
        self._record: WalkRecord | None = None
        self._latest_id: str | None = None
        self._page: collections.deque[str] = collections.deque()
        self._page_stamped = 0
        self._page_last: str | None = None
        self._commits = 0
        self._reported: tuple[datetime, float, bool] | None = None  # when, share, pressed of the last report
        self._done = False
        self._generation = 0
        self._timer: Cancellable | None = None
        self._stopped = False
        labels = (("graph_id", schema.graph_id),)
        self._meter = meter
        if meter is not None:
            self._m_threads = meter.counter(WALK_THREADS, labels)
            self._m_rows = meter.counter(WALK_ROWS, labels)
            self._m_pages = meter.counter(WALK_PAGES, labels)
            self._m_share = meter.histogram(WALK_SHARE, labels)
            self._m_pressed = meter.counter(WALK_PRESSED, labels)

    # -- lifecycle --------------------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Runs on the walker's own thread: takes the first step at once."""
        self._env.track_thread(threading.current_thread())
        self._schedule(0.0)

    def on_receive(self, message: Any) -> Any:
        """One message at a time: the timer's ticks."""
        if isinstance(message, _Tick):
            if message.generation == self._generation and not self._stopped:
                self._schedule(self.step())
            return None
        return super().on_receive(message)

    def on_stop(self) -> None:
        """A walker stopped on purpose releases its lease (the next walker resumes at the recorded cursor)."""
        self._stopped = True
        self._cancel()
        token, self._token = self._token, None
        if token is not None:
            try:
                self._store.release(self._walk_thread, token)
            except Exception as error:  # noqa: BLE001 - the lease then expires by itself
                self._log.warning("access.release_failed", op="release", token=token, error=describe(error))

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """An unexpected error: the lease is left to expire and the supervisor starts a new walker later."""
        self._stopped = True
        self._cancel()
        self._log.error("access.walker_crashed", error=describe(exception_value), token=self._token)
        self._tell(WalkerCrashed(self._graph_id, self._incarnation, describe(exception_value)))

    def _schedule(self, delay: float | None) -> None:
        self._cancel()
        if delay is None or self._stopped:
            return
        self._generation += 1
        generation, ref = self._generation, self.actor_ref
        if delay <= 0:  # no wait: straight to the mailbox (a stop or another message still comes in between)
            ref.tell(_Tick(generation))
            return

        def due() -> None:
            try:
                ref.tell(_Tick(generation))
            except pykka.ActorDeadError:
                pass

        self._timer = self._env.scheduler.call_at(self._env.clock.now() + timedelta(seconds=delay), due)

    def _cancel(self) -> None:
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- one step ---------------------------------------------------------------------------------------------

    @property
    def _retry_s(self) -> float:
        """How long until a walker without the lease asks again: ``interval``, at most the lease's renewal."""
        return min(self._options.interval, self._env.claim_policy.renew_every).total_seconds()

    def step(self) -> float | None:
        """Takes one step - a claim attempt, or one thread of the walk - and returns the seconds until the next
        (None: no more steps). Store failures are logged and the step is taken again later; a lost lease drops
        the walk (another walker goes on from the recorded cursor)."""
        try:
            if self._token is None:
                return self._try_claim()
            return self._walk_one()
        except StaleClaim as error:
            self._deposed(error)
            return self._retry_s
        except (CheckpointConflict, InvalidCommit) as error:  # the record moved: the lease is not ours any more
            self._deposed(error)
            self._give_up_lease()  # (a release with a token that lost the lease changes nothing)
            return self._retry_s
        except ProcessingError as error:
            if error.operation == "walk":  # the stored record does not decode: asked again every interval
                self._log.error("access.walk_failed", error=describe(error), token=self._token)
                self._give_up_lease()
                return self._options.interval.total_seconds()
            if is_fatal(error, self._store):  # a closed or damaged store: no step helps
                self._log.error("access.walk_stopped", error=describe(error), error_kind=type(error).__name__)
                return None
            self._log.warning("access.walk_failed", error=describe(error), token=self._token)
            return self._options.interval.total_seconds()

    def _deposed(self, error: BaseException) -> None:
        self._log.warning("access.deposed", token=self._token, error=describe(error))
        self._page.clear()
        if not isinstance(error, (CheckpointConflict, InvalidCommit)):
            self._token = None

    def _give_up_lease(self) -> None:
        token, self._token = self._token, None
        self._page.clear()
        if token is not None:
            try:
                self._store.release(self._walk_thread, token)
            except Exception as error:  # noqa: BLE001 - it expires then
                self._log.warning("access.release_failed", op="release", token=token, error=describe(error))

    # -- claiming ---------------------------------------------------------------------------------------------

    def _read_record(self) -> WalkRecord | None:
        """The stored record (None: none); tells the supervisor. ProcessingError (op ``walk``): undecodable."""
        latest = self._store.latest(self._walk_thread)
        if latest is None:
            self._latest_id = None
            return None
        self._latest_id = latest.checkpoint.id
        record = WalkRecord.from_state(self._walk_thread, latest.checkpoint.state)
        if record.graph_id != self._graph_id:
            raise ProcessingError(
                "walk", f"the walk record of {self._walk_thread!r} names graph {record.graph_id!r}; it is damaged"
            )
        self._tell(WalkSeen(record))
        return record

    def _may_claim(self, record: WalkRecord | None) -> str | None:
        """None when this walker may hold the walk of ``record``; else why not (a log word)."""
        if record is None:
            return None
        if record.schema == self._schema.hash:
            return "completed" if record.completed else None
        other = f"{self._graph_id}@{record.schema}"
        for member in self._store.members(self._members):
            if other in member.serves:
                return "other_schema_served"
        return None

    def _try_claim(self) -> float | None:
        if self._done:
            return None
        if not self._store.graph_threads(self._graph_id, after=None, limit=1):
            return self._options.interval.total_seconds()  # nothing stored yet: not claimed
        record = self._read_record()
        why = self._may_claim(record)
        if why == "completed":
            self._finish_done(record)
            return None
        if why is not None:
            self._log.debug("access.walk_waiting", reason=why, schema=record.schema if record else None)
            return self._retry_s
        policy = self._env.claim_policy
        try:
            claim = self._store.claim(self._walk_thread, ClaimRequest(holder=self._holder, ttl=policy.ttl))
        except ThreadBusy:
            return self._retry_s
        self._token = claim.token
        self._renewed_at = self._env.clock.now()
        record = self._read_record()  # again, under the lease: it may have moved since
        why = self._may_claim(record)
        if why is not None:
            self._give_up_lease()
            if why == "completed":
                self._finish_done(record)
                return None
            return self._retry_s
        if record is None or record.schema != self._schema.hash:
            replaced = record.schema if record is not None else None
            heads = self._store.token_high_water()
            record = WalkRecord(graph_id=self._graph_id, schema=self._schema.hash, heads=heads)
            self._commit_record(record)
            self._log.info("access.walk_started", schema=record.schema, heads=heads, replaced=replaced)
        else:
            self._record = record
            self._log.info("access.walk_resumed", schema=record.schema, cursor=record.cursor, count=record.count)
        self._pace = WalkPace.from_options(self._options, self._env.clock.now())
        self._pressure_read = self._env.clock.now()
        self._report()
        return 0.0

    def _finish_done(self, record: WalkRecord | None) -> None:
        self._done = True
        if record is not None:
            self._record = record
            self._tell(WalkSeen(record))
        self._report()

    # -- walking ----------------------------------------------------------------------------------------------

    def _commit_record(self, record: WalkRecord) -> None:
        """Commits ``record`` as the walk thread's next checkpoint, fenced by the lease (StaleClaim: lost)."""
        assert self._token is not None
        self._commits += 1
        checkpoint = Checkpoint(
            id=f"{self._holder}.{self._token}.{self._commits}"[-255:],
            parent=self._latest_id,
            thread_id=self._walk_thread,
            run_id=self._holder,
            status=CheckpointStatus.COMPLETED if record.completed else CheckpointStatus.RUNNING,
            created_at=self._env.clock.now(),
            state=record.to_state(),
            graph_id=WALK_GRAPH_ID,
            metadata={
                SHARE_KEY: f"{self._pace.share:.6g}",
                RATE_KEY: f"{self._pace.rate():.6g}",
                NODE_KEY: self._env.node_id,
            },
        )
        self._store.commit(self._walk_thread, Commit(token=self._token, checkpoint=checkpoint))
        self._latest_id = checkpoint.id
        self._record = record
        self._tell(WalkSeen(record))

    def _tick_pace(self, now: datetime) -> None:
        if not self._pace.due(now):
            return
        window = max(now - self._pressure_read, timedelta(seconds=1))
        pressed = self._store.pressed(window)
        self._pressure_read = now
        seconds = self._pace.tick(now, pressed)
        if self._meter is not None and seconds:
            self._m_share.observe(self._pace.share)
            if pressed:
                self._m_pressed.add(seconds)

    def _renew_if_due(self, now: datetime) -> None:
        policy = self._env.claim_policy
        if self._token is not None and now - self._renewed_at >= policy.renew_every:
            self._store.renew(self._walk_thread, self._token, policy.ttl)
            self._renewed_at = now

    def _walk_one(self) -> float | None:
        assert self._token is not None and self._record is not None
        clock = self._env.clock
        now = clock.now()
        self._tick_pace(now)
        self._renew_if_due(now)
        if now < self._not_before:  # still waiting out the pace: woken to renew and to read the pressure
            return self._wake_in((self._not_before - now).total_seconds())
        record = self._record
        if not self._page:
            page = self._store.graph_threads(self._graph_id, after=record.cursor, limit=self._pace.page_size())
            if not page:
                done = attrs.evolve(record, completed=True)
                self._commit_record(done)
                self._log.info(
                    "access.walked", schema=done.schema, cursor=done.cursor, count=done.count, threads=0, completed=True
                )
                self._give_up_lease()
                self._finish_done(done)
                return None
            self._page.extend(page)
            self._page_stamped = 0
            self._page_last = None
        thread_id = self._page[0]
        if self._bulkhead is not None and not self._bulkhead.try_enter():
            self._report()
            pause = max(REFUSED_PAUSE.total_seconds(), 1.0 / self._pace.walk_rate)
            self._not_before = now + timedelta(seconds=pause)
            return self._wake_in(pause)  # the thread is stamped again then
        started = clock.now()
        try:
            rows = self._store.stamp_thread(thread_id, fence=(self._walk_thread, self._token))
        finally:
            if self._bulkhead is not None:
                self._bulkhead.leave()
        took = max(0.0, (clock.now() - started).total_seconds())
        self._page.popleft()
        self._page_stamped += 1
        self._page_last = thread_id
        ended = clock.now()
        wait = self._pace.stamped(took, ended)
        self._not_before = ended + timedelta(seconds=wait)
        self._log.debug("access.stamped", thread_id=thread_id, rows=rows, duration_ms=round(took * 1000, 3))
        if self._meter is not None:
            self._m_threads.add(1)
            if rows:
                self._m_rows.add(rows)
        paged = not self._page
        if paged:
            after = attrs.evolve(record, cursor=self._page_last, count=record.count + self._page_stamped)
            self._commit_record(after)
            self._log.info(
                "access.walked",
                schema=after.schema,
                cursor=after.cursor,
                count=after.count,
                threads=self._page_stamped,
                share=round(self._pace.share, 6),
                pressed=self._pace.pressed,
                completed=False,
            )
            if self._meter is not None:
                self._m_pages.add(1)
        self._report(force=paged)
        return self._wake_in(wait)

    def _wake_in(self, seconds: float) -> float:
        """``seconds``, at most a second and at most the lease's renewal period: a long wait of the pace is cut
        into wake-ups that renew the lease and read the pressure."""
        return min(seconds, 1.0, self._env.claim_policy.renew_every.total_seconds())

    def _report(self, *, force: bool = True) -> None:
        """Tells the supervisor the pace; unless ``force``, only when the share or the pressed reading changed
        since the last report or that is :data:`REPORT_EVERY` old."""
        now = self._env.clock.now()
        last = self._reported
        if (
            not force
            and last is not None
            and (last[1], last[2]) == (self._pace.share, self._pace.pressed)
            and timedelta(0) <= now - last[0] < REPORT_EVERY
        ):
            return
        self._reported = (now, self._pace.share, self._pace.pressed)
        record = self._record
        self._tell(
            WalkPaceReport(
                graph_id=self._graph_id,
                share=self._pace.share,
                rate=self._pace.rate(),
                pressed=self._pace.pressed,
                cursor=record.cursor if record is not None else None,
                count=record.count + (self._page_stamped if self._page else 0) if record is not None else 0,
                schema=record.schema if record is not None else self._schema.hash,
                completed=record.completed if record is not None else False,
            )
        )


# -- what the supervisor keeps ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class WalkSetup:
    """What a runtime walks: its declared schemas, the options, the group and the meter."""

    access: AccessSchemas
    options: AccessStampOptions
    group: str = DEFAULT_GROUP
    meter: Meter | None = None


class Walks:
    """The supervisor's part of the walks: membership heartbeats, the walkers, their reports. Runs on the
    supervisor's thread (plain methods the supervisor calls).

    Args:
        env: the runtime's environment.
        setup: what to walk.
        tell_self: sends a message to the supervisor (never raises).
    """

    def __init__(self, env: RunEnv, setup: WalkSetup, tell_self: Callable[[Any], None]) -> None:
        self._env = env
        self._setup = setup
        self._tell = tell_self
        self._walkers: dict[str, pykka.ActorRef[Any]] = {}
        self._incarnations: dict[str, int] = {}
        self._records: dict[str, WalkRecord] = {}
        self._reports: dict[str, WalkPaceReport] = {}
        self._timers: list[Cancellable] = []
        self._heartbeat_generation = 0
        self._closing = False
        self._log = _log.bind(node_id=env.node_id)
        if setup.meter is not None:
            for spec in WALK_METRICS:
                setup.meter.describe(spec)

    @property
    def schemas(self) -> Sequence[AccessSchema]:
        """The declared schemas walked (one walker each)."""
        return self._setup.access.schemas

    def start(self) -> None:
        """Heartbeats once, then starts a walker per declared schema."""
        self.heartbeat(self._heartbeat_generation)
        for schema in self.schemas:
            self._start_walker(schema.graph_id)

    def _start_walker(self, graph_id: str) -> None:
        if self._closing:
            return
        schema = self._setup.access.for_graph(graph_id)
        incarnation = self._incarnations.get(graph_id, 0) + 1
        self._incarnations[graph_id] = incarnation
        self._walkers[graph_id] = self._env.scheduler.actor_class(Walker).start(
            self._env, schema, self._setup.options, self._setup.group, self._tell, self._setup.meter, incarnation
        )

    def heartbeat(self, generation: int) -> None:
        """Heartbeats the membership (a failure is logged; the next comes ``renew_every`` later)."""
        if self._closing or generation != self._heartbeat_generation:
            return
        policy = self._env.claim_policy
        try:
            self._env.store.heartbeat(
                member_group(self._setup.group),
                self._env.node_id,
                [serves(schema) for schema in self.schemas],
                policy.ttl,
            )
        except Exception as error:  # noqa: BLE001 - a missed heartbeat must not stop the supervisor
            self._log.warning("access.heartbeat_failed", op="heartbeat", error=describe(error))
        self._heartbeat_generation += 1
        self._later(policy.renew_every, _Heartbeat(self._heartbeat_generation))

    def _later(self, delay: timedelta, message: Any) -> None:
        tell = self._tell
        self._timers = [timer for timer in self._timers if timer is not None][-64:]
        self._timers.append(self._env.scheduler.call_at(self._env.clock.now() + delay, lambda: tell(message)))

    def receive(self, message: Any) -> tuple[bool, Any]:
        """Handles a walk message: ``(True, answer)``, or ``(False, None)`` for another message."""
        if isinstance(message, WalkPaceReport):
            self._reports[message.graph_id] = message
            return True, None
        if isinstance(message, WalkSeen):
            self._records[message.record.graph_id] = message.record
            return True, None
        if isinstance(message, WalksQuery):
            return True, dict(self._records)
        if isinstance(message, ShareQuery):
            report = self._reports.get(message.graph_id)
            return True, (report.share if report is not None else None)
        if isinstance(message, _Heartbeat):
            self.heartbeat(message.generation)
            return True, None
        if isinstance(message, WalkerCrashed):
            if self._incarnations.get(message.graph_id) == message.incarnation and not self._closing:
                self._walkers.pop(message.graph_id, None)
                self._later(self._setup.options.interval, _Restart(message.graph_id))
            return True, None
        if isinstance(message, _Restart):
            if message.graph_id not in self._walkers:
                self._log.info("access.walker_restarted", graph_id=message.graph_id)
                self._start_walker(message.graph_id)
            return True, None
        return False, None

    def walker(self, graph_id: str) -> pykka.ActorRef[Any] | None:
        """The live walker of ``graph_id`` (for tests and tools), or None."""
        return self._walkers.get(graph_id)

    def stop(self, timeout: timedelta) -> None:
        """Stops the heartbeats and every walker (each releases its lease)."""
        self._closing = True
        self._heartbeat_generation += 1
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for ref in list(self._walkers.values()):
            try:
                ref.stop(block=True, timeout=timeout.total_seconds())
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
        self._walkers.clear()


def store_access(store: Any) -> AccessSchemas | None:
    """The access schemas ``store`` (or the store it wraps) was opened with, or None when it says none."""
    found = _inner_attr(store, "access")
    return found if isinstance(found, AccessSchemas) else None
