"""The claims a LangGraph saver holds on its threads while runs write (README "LangGraph", "Fencing").

A *hold* is one claim of one threadloom thread by one saver: taken at the first write of a run (or by
``ThreadloomSaver.hold``), renewed by one background thread per saver every ``renew_every``, and released when
the run has written nothing for ``idle_release`` (or when the ``hold`` block ends). A hold whose claim was lost
(taken over after a pause, or the thread deleted) refuses every later write of the run with ``StaleClaim`` until
the run has been quiet for ``idle_release``: it never claims the thread again behind the run's back.

A ``hold`` block is a :class:`Block`, the *turn* of its thread within the saver: one block at a time per thread
(a second waits for the first to end, or is ``ThreadBusy``), so runs in blocks of one saver follow each other.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs

from threadloom.domain.errors import ProcessingError, StaleClaim, StoreClosed, TenantMismatch, ThreadBusy
from threadloom.domain.validation import wait_seconds
from threadloom.domain.values import BusyHolder, ClaimRequest, PendingWrite
from threadloom.langgraph import _mapping
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.logs import get_logger

log = get_logger("threadloom.langgraph")

TURN_POLL_S = 0.01
"""How often a block waiting for its thread's turn looks again, in seconds."""

CLAIM_POLL_S = 0.05
"""How often a claim waiting for another run's claim to end tries again, in seconds."""

LATE_WINDOW = 64
"""How many checkpoints late a run's write may reach the saver and still be kept: a hold remembers the checkpoints
it stored, the latest and the ``LATE_WINDOW`` before it (README "LangGraph", Limits)."""


@attrs.define(eq=False)
class Block:
    """One ``hold`` block of a saver on one thread: the thread's turn in that saver while it lasts."""

    owner: Holds
    thread_id: str
    adopted: bool = False  # the block took over the claim of a run of the saver that began outside any block


BLOCKS: contextvars.ContextVar[tuple[Block, ...]] = contextvars.ContextVar("threadloom_langgraph_blocks", default=())
"""The ``hold`` blocks the current context runs inside (innermost last): a block inside one of the same saver and
thread shares it."""


@attrs.define(eq=False)
class Hold:
    """One claim a saver holds, and what the saver knows of the thread under it."""

    thread_id: str
    holder: str
    token: int
    latest: str | None
    explicit: bool = False
    lock: threading.RLock = attrs.field(factory=threading.RLock)
    regular_tasks: set[str] = attrs.field(factory=set)
    writes: list[PendingWrite] = attrs.field(factory=list)  # the pending writes stored against ``latest``
    committed: list[str] = attrs.field(factory=list)
    early: dict[str, list[PendingWrite]] = attrs.field(factory=dict)
    # the latest holds late writes (for a checkpoint before it): the next checkpoint carries them, marked
    holds_late: bool = False
    # a checkpoint of the thread carries late writes: every later one says so (state "late"), so a read of a
    # thread without any searches for none
    late_seen: bool = False
    moved: tuple[str | None, str | None] | None = None
    lost: StaleClaim | None = None
    # lost because this saver deleted the thread: a run that begins the thread anew need not wait for idle_release
    deleted: bool = False
    # the hold such a delete lost, when this one began the thread anew: that run's writes stay refused
    gone: Hold | None = None
    # the run id of checkpoints whose metadata names none (the holder until delete_for_runs hides that run)
    run_id: str | None = None
    released: bool = False  # the saver let the claim go (block end, idle, drop): a write takes the thread's new hold
    last_used: float = attrs.field(factory=time.monotonic)
    renewed_at: float = attrs.field(factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def superseded(self, checkpoint_id: str) -> bool:
        """Whether ``checkpoint_id`` is one of the ``LATE_WINDOW`` checkpoints before the latest, stored under
        this hold (or the latest when it was taken): a write for it is late and kept."""
        return checkpoint_id != self.latest and checkpoint_id in self.committed

    def refuses(self, checkpoint_id: str | None) -> StaleClaim | None:
        """The error for a write naming ``checkpoint_id`` when it is one of the checkpoints the run this hold's
        saver deleted stored (that run's writes stay refused after a new run began the thread), else None."""
        gone = self.gone
        if gone is None or checkpoint_id is None:
            return None
        if checkpoint_id == gone.latest or checkpoint_id in gone.committed:
            return gone.lost
        return None

    def stored(self, checkpoint_id: str) -> None:
        """Records that ``checkpoint_id`` is now the thread's latest (committed under this hold)."""
        self.latest = checkpoint_id
        self.regular_tasks = set()
        self.writes = []
        self.holds_late = False
        self.committed.append(checkpoint_id)
        del self.committed[: -(LATE_WINDOW + 1)]


class Holds:
    """Every hold of one saver, with the thread that renews them and releases idle ones."""

    def __init__(
        self, store: Checkpointer, *, ttl: timedelta, renew_every: timedelta, idle_release: timedelta,
        tenant_id: str | None,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._renew_s = renew_every.total_seconds()
        self._idle_s = idle_release.total_seconds()
        self._tenant = tenant_id
        self._lock = threading.Lock()
        self._gates: dict[str, list[Any]] = {}  # thread -> [lock, users]: one claim per thread at a time
        self._turns: dict[str, Block] = {}  # thread -> the hold block whose turn it is
        self._holds: dict[str, Hold] = {}
        self._deleted: dict[str, None] = {}  # threads this saver deleted and no run has begun again (oldest first)
        self._ever_deleted: dict[str, None] = {}  # threads this saver deleted, since (the last 10,000; oldest first)
        self._seen: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the saver asks ---------------------------------------------------------------------------------------

    def get(self, thread_id: str) -> Hold | None:
        """The hold on ``thread_id``, or None."""
        with self._lock:
            return self._holds.get(thread_id)

    def seen(self, thread_id: str, latest: str | None) -> None:
        """Records the latest checkpoint a read of this saver returned for ``thread_id`` (see :meth:`acquire`)."""
        with self._lock:
            self._seen[thread_id] = latest
            if len(self._seen) > 10_000:
                self._seen.pop(next(iter(self._seen)))
            hold = self._holds.get(thread_id)
        if hold is not None and hold.moved is not None and hold.moved[1] == latest:
            hold.moved = None  # the run read the thread as it now is

    def mark_deleted(self, thread_id: str) -> None:
        """Records that this saver deleted ``thread_id`` (see :meth:`was_deleted`)."""
        with self._lock:
            for marks in (self._deleted, self._ever_deleted):
                marks.pop(thread_id, None)
                marks[thread_id] = None
                if len(marks) > 10_000:
                    marks.pop(next(iter(marks)))

    def ever_deleted(self, thread_id: str) -> bool:
        """Whether this saver deleted ``thread_id`` (one of the last 10,000 threads it deleted), whatever came after:
        a checkpoint there whose parent the thread does not hold may continue a run the delete stopped."""
        with self._lock:
            return thread_id in self._ever_deleted

    def was_deleted(self, thread_id: str) -> bool:
        """Whether this saver deleted ``thread_id`` and no first checkpoint began it again since."""
        with self._lock:
            return thread_id in self._deleted

    def forget_deleted(self, thread_id: str) -> None:
        with self._lock:
            self._deleted.pop(thread_id, None)

    def acquire(self, thread_id: str, *, explicit: bool = False, wait: timedelta | None = None) -> Hold:
        """The saver's hold on ``thread_id``, claiming the thread when the saver holds none.

        Raises:
            StaleClaim: the saver's claim on the thread was lost (taken over or deleted) and the run has not been
                quiet for ``idle_release`` since (an ``explicit`` hold starts a new run instead); nothing written.
            StoreClosed: the saver was closed.
            TenantMismatch: the thread's latest checkpoint is another tenant's than the saver's; no claim is kept.
            ThreadBusy: another run holds the thread (after waiting up to ``wait`` when given).
            ValidationError: ``wait`` is not a ``timedelta`` (a number of seconds included) nor None, or is
                negative; nothing claimed.
        """
        wait_seconds("wait", wait)
        if self._stop.is_set():
            raise StoreClosed("langgraph", "the saver is closed; nothing written")
        with self._lock:
            hold = self._holds.get(thread_id)
            if hold is not None and hold.lost is not None and explicit:
                del self._holds[thread_id]  # a new run begins explicitly: the lost run's marker ends here
                hold = None
        if hold is not None:
            if hold.lost is not None:
                hold.touch()
                raise hold.lost
            if explicit:
                hold.explicit = True
            return hold
        with self._gate(thread_id):  # one claim per thread at a time from this saver (its own would refuse another)
            return self._claim(thread_id, explicit, wait)

    @contextlib.contextmanager
    def _gate(self, thread_id: str) -> Iterator[None]:
        """The thread's gate: its claims by this saver, and the releases of its holds, one at a time. Never held
        while waiting for a hold's lock (a drop takes the hold's lock first)."""
        with self._lock:
            gate = self._gates.setdefault(thread_id, [threading.Lock(), 0])
            gate[1] += 1
        try:
            with gate[0]:
                yield
        finally:
            with self._lock:
                gate[1] -= 1
                if gate[1] == 0:
                    self._gates.pop(thread_id, None)

    def inside(self, thread_id: str) -> bool:
        """Whether the current context runs inside a hold block of this saver on ``thread_id`` that still has the
        thread's turn."""
        with self._lock:
            turn = self._turns.get(thread_id)
        return turn is not None and turn in BLOCKS.get()

    def take_turn(self, thread_id: str) -> Block | None:
        """The thread's turn for a new block, or None while another block of this saver has it (never waits).

        Raises:
            StoreClosed: the saver was closed.
        """
        if self._stop.is_set():
            raise StoreClosed("langgraph", "the saver is closed; nothing written")
        with self._lock:
            if thread_id in self._turns:
                return None
            block = self._turns[thread_id] = Block(owner=self, thread_id=thread_id)
            return block

    def give_turn(self, block: Block) -> None:
        """Ends ``block``'s turn (the saver's next block on the thread may begin); nothing else."""
        with self._lock:
            if self._turns.get(block.thread_id) is block:
                del self._turns[block.thread_id]

    def busy(self, thread_id: str) -> ThreadBusy:
        """The ``ThreadBusy`` of a block that did not get its thread's turn in time."""
        hold = self.get(thread_id)
        return ThreadBusy(
            thread_id,
            hold.latest if hold is not None else None,
            BusyHolder.Run(hold.holder if hold is not None else "another hold block of this saver"),
        )

    def begin(self, thread_id: str, wait: timedelta | None) -> Block:
        """Begins a hold block on ``thread_id`` (blocking): waits up to ``wait`` for the thread's turn, then holds
        the thread's claim for the block (explicitly: not released while idle). The caller calls :meth:`end`.

        Raises:
            ThreadBusy: another block of this saver, or another run's claim, holds the thread past ``wait``.
            StoreClosed: the saver was closed (also while waiting).
            TenantMismatch, ValidationError: as :meth:`acquire`.
        """
        seconds = wait_seconds("wait", wait)
        deadline = time.monotonic() + (seconds or 0.0)
        while True:
            block = self.take_turn(thread_id)
            if block is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.busy(thread_id)
            self._stop.wait(min(TURN_POLL_S, left))
        try:
            left = max(0.0, deadline - time.monotonic())
            self.claim_for(block, timedelta(seconds=left) if seconds else None)
        except BaseException:
            self.give_turn(block)
            raise
        return block

    def claim_for(self, block: Block, wait: timedelta | None = None) -> None:
        """Holds ``block``'s thread for it (explicitly: not released while idle): the saver's hold on the thread,
        claimed when it has none (waiting up to ``wait`` for another run's claim to end).

        Raises:
            ThreadBusy, StaleClaim, StoreClosed, TenantMismatch, ValidationError: as :meth:`acquire`.
        """
        existing = self.get(block.thread_id)
        was_explicit = existing is not None and existing.explicit
        hold = self.acquire(block.thread_id, explicit=True, wait=wait)
        block.adopted = hold is existing and not was_explicit

    def end(self, block: Block) -> None:
        """Ends ``block``: releases the thread's claim, then lets the saver's next block on the thread begin."""
        try:
            with self._lock:
                current = self._turns.get(block.thread_id) is block
                hold = self._holds.get(block.thread_id)
            if current and block.adopted and hold is not None:
                # the claim is still the run's that began outside the block: it goes on, released when idle
                hold.explicit = False
                hold.touch()
            elif current:
                self.drop(block.thread_id, release=True)
        finally:
            self.give_turn(block)

    def _claim(self, thread_id: str, explicit: bool, wait: timedelta | None) -> Hold:
        with self._lock:
            hold = self._holds.get(thread_id)
        if hold is not None:  # another call of this saver claimed it meanwhile
            if hold.lost is not None:
                raise hold.lost
            hold.explicit = hold.explicit or explicit
            return hold
        holder = f"langgraph-{uuid.uuid4().hex}"
        request = ClaimRequest(holder=holder, ttl=self._ttl, tenant_id=self._tenant)
        deadline = time.monotonic() + (wait.total_seconds() if wait is not None else 0.0)
        while True:
            try:
                claim = self._store.claim(thread_id, request)
                break
            except ThreadBusy:
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise
                time.sleep(min(CLAIM_POLL_S, max(0.0, deadline - time.monotonic())))
        with self._lock:
            known_empty = thread_id in self._seen and self._seen[thread_id] is None
        if known_empty:
            # a read of this saver found the thread empty (a new thread): no second read; should a checkpoint
            # have come meanwhile, the store refuses the first put (its parent is not the latest) and the saver
            # drops this hold (CheckpointConflict, nothing written)
            hold = Hold(thread_id=thread_id, holder=holder, token=claim.token, latest=None, explicit=explicit)
            with self._lock:
                self._holds[thread_id] = hold
            self._ensure_renewer()
            return hold
        try:
            stored = self._store.latest(thread_id)
            if stored is not None and stored.checkpoint.tenant_id != self._tenant:
                # a thread belongs to the tenant of its first run (README "LangGraph"): never write onto another's
                raise TenantMismatch(thread_id, self._tenant)
        except BaseException:
            self._quiet_release(thread_id, claim.token)
            raise
        latest = stored.checkpoint.id if stored is not None else None
        hold = Hold(thread_id=thread_id, holder=holder, token=claim.token, latest=latest, explicit=explicit)
        if latest is not None:
            hold.committed.append(latest)
        if stored is not None:
            hold.regular_tasks = _mapping.regular_tasks(stored.pending_writes)
            hold.writes = list(stored.pending_writes)
            hold.holds_late = _mapping.holds_late(hold.writes)
            hold.late_seen = _mapping.late_seen(stored.checkpoint)
        with self._lock:
            known = self._seen.get(thread_id, latest)
            if known != latest:
                hold.moved = (known, latest)
            self._holds[thread_id] = hold
        self._ensure_renewer()
        return hold

    def lose(self, hold: Hold, error: StaleClaim, *, deleted: bool = False) -> None:
        """Marks ``hold`` lost: every later write of the run is refused with ``error`` (``deleted``: lost because
        this saver deleted the thread, see :meth:`begin_again`)."""
        hold.lost = error
        hold.deleted = hold.deleted or deleted
        hold.touch()

    def begin_again(self, thread_id: str) -> Hold | None:
        """A run begins ``thread_id`` anew (its first checkpoint names no parent) after this saver deleted the
        thread: the hold that delete lost is let go (its claim went with the thread), so the run claims the thread
        at once instead of after ``idle_release``. Returns that hold, for the new one to keep refusing its run's
        writes (:meth:`Hold.refuses`) and to take the early writes it kept; None when there is no such hold."""
        with self._lock:
            hold = self._holds.get(thread_id)
            if hold is None or not hold.deleted:
                return None
        with hold.lock:
            with self._lock:
                if self._holds.get(thread_id) is not hold:
                    return None
                del self._holds[thread_id]
            hold.released = True
            return hold

    def keep_early(self, thread_id: str, checkpoint_id: str, writes: list[PendingWrite]) -> bool:
        """Keeps in memory ``writes`` for ``checkpoint_id`` when the saver's hold on ``thread_id`` was lost by its
        own delete and never stored that checkpoint: they may be a new run's first writes, sent before its first
        checkpoint (which then carries them, see :meth:`begin_again`). Whether they were kept."""
        hold = self.get(thread_id)
        if hold is None or not hold.deleted:
            return False
        with hold.lock:
            if hold.released or checkpoint_id == hold.latest or checkpoint_id in hold.committed:
                return False  # let go meanwhile (the new hold takes them), or the deleted run's own: refused
            kept = hold.early.setdefault(checkpoint_id, [])
            tasks = _mapping.regular_tasks(kept)  # a task's regular writes: those of its first call that sent any
            kept.extend([w for w in writes if w.payload["idx"] < 0 or w.task_id not in tasks])
            hold.touch()
            return True

    def drop(self, thread_id: str, *, release: bool) -> None:
        """Forgets the hold on ``thread_id``, releasing its claim first when ``release``. A claim of the thread by
        this saver that comes meanwhile waits for the release (it never meets the old claim still live)."""
        with self._lock:
            hold = self._holds.get(thread_id)
        if hold is None:
            return
        with hold.lock, self._gate(thread_id):
            with self._lock:
                if self._holds.get(thread_id) is hold:
                    del self._holds[thread_id]
            if release and hold.lost is None and not hold.released:
                self._report_early(hold)
                self._quiet_release(thread_id, hold.token)
            hold.released = True

    def close(self) -> None:
        """Stops renewing and releases every claim still held."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            names = list(self._holds)
        for name in names:
            self.drop(name, release=True)

    # -- the renewer -------------------------------------------------------------------------------------------------

    def _ensure_renewer(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="threadloom-langgraph-renew", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(min(self._renew_s, self._idle_s) / 4, 0.02)):
            with self._lock:
                holds = list(self._holds.values())
            now = time.monotonic()
            for hold in holds:
                if self._stop.is_set():
                    return
                self._tend(hold, now)

    def _tend(self, hold: Hold, now: float) -> None:
        if not hold.lock.acquire(timeout=self._renew_s):
            return  # a long commit holds it; the next round renews
        try:
            idle = now - hold.last_used >= self._idle_s
            if hold.lost is not None:
                if idle:
                    with self._lock:
                        if self._holds.get(hold.thread_id) is hold:
                            del self._holds[hold.thread_id]
                return
            if idle and not hold.explicit:
                with self._lock:
                    if self._holds.get(hold.thread_id) is hold:
                        del self._holds[hold.thread_id]
                self._report_early(hold)
                self._quiet_release(hold.thread_id, hold.token)
                hold.released = True
                return
            if now - hold.renewed_at < self._renew_s:
                return
            try:
                self._store.renew(hold.thread_id, hold.token, self._ttl)
                hold.renewed_at = now
            except StaleClaim as error:
                self.lose(hold, error)
                log.warning("langgraph.claim_lost", thread_id=hold.thread_id, token=hold.token)
            except ProcessingError as error:
                log.warning("langgraph.renew_failed", thread_id=hold.thread_id, error=str(error))
        finally:
            hold.lock.release()

    def _report_early(self, hold: Hold) -> None:
        """Forgets the writes still waiting for their checkpoint: late ones (their checkpoint was stored before
        the hold, so it is not among the checkpoints the hold keeps late writes for) quietly, ones whose checkpoint
        never came with a warning."""
        early, hold.early = hold.early, {}
        dropped = 0
        for checkpoint_id, writes in early.items():
            try:
                stored = self._store.checkpoint(hold.thread_id, checkpoint_id) is not None
            except ProcessingError:
                stored = False
            if stored:
                log.debug("langgraph.late_writes", thread_id=hold.thread_id, checkpoint_id=checkpoint_id,
                          writes=len(writes))
            else:
                dropped += len(writes)
        if dropped:
            log.warning("langgraph.early_writes_dropped", thread_id=hold.thread_id, writes=dropped)

    def _quiet_release(self, thread_id: str, token: int) -> None:
        try:
            self._store.release(thread_id, token)
        except ProcessingError as error:  # the claim then expires after its ttl
            log.warning("langgraph.release_failed", thread_id=thread_id, error=str(error))
