"""``ThreadloomSaver``: a LangGraph checkpoint saver over any threadloom store, fenced by claims.

README "LangGraph" documents the mapping, the fencing and the limits; this module's docstrings give the shapes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import functools
import itertools
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import attrs
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.base import Checkpoint as LgCheckpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    OutcomeUnknown,
    StaleClaim,
    ThreadBusy,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointPage,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
    StoredCheckpoint,
    ThreadQuery,
    prevalidated_builder,
)
from threadloom.langgraph import _mapping as m
from threadloom.langgraph._holds import (
    BLOCKS,
    CLAIM_POLL_S,
    TURN_POLL_S,
    Block,
    Hold,
    Holds,
)
from threadloom.persistence.aio import AsyncStore, open_async_store
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.logs import get_logger

log = get_logger("threadloom.langgraph")
_T = TypeVar("_T")
_PAGE = 100
_build_checkpoint = prevalidated_builder(Checkpoint)
_build_event = prevalidated_builder(EventDraft)
_build_commit = prevalidated_builder(Commit)
_quote = json.encoder.encode_basestring  # as the store's JSON encoder writes a str
_STEP_LIMIT = 2**53  # a step number the event's JSON text writes as it is (larger ones take the constructor)


def strict_serde() -> JsonPlusSerializer:
    """The serializer the saver uses by default, and ``threadloom show`` decodes a stored checkpoint with.

    ``JsonPlusSerializer(pickle_fallback=False, allowed_json_modules=None, allowed_msgpack_modules=None)``: it
    never pickles nor unpickles, and only LangGraph's safe types are rebuilt on read; a stored value naming any
    other type or callable comes back as its argument (data), it is never imported and called.

    Returns:
        A new serializer.
    """
    return JsonPlusSerializer(pickle_fallback=False, allowed_json_modules=None, allowed_msgpack_modules=None)


def _check_serde(serde: Any) -> Any:
    """Refuses a serializer that would load pickle or call any callable a stored value names."""
    if getattr(serde, "pickle_fallback", False) is True:
        raise ValidationError("serde", ("must not fall back to pickle (pickle_fallback=False)",))
    if getattr(serde, "_allowed_msgpack_modules", None) is True:
        raise ValidationError(
            "serde",
            (
                "must not rebuild every type a stored value names (allowed_msgpack_modules=True calls any callable "
                "on read); list the types to rebuild in allowed_msgpack_modules",
            ),
        )
    return serde


class ThreadloomSaver(BaseCheckpointSaver[str]):
    """A LangGraph ``BaseCheckpointSaver`` over a threadloom store: ``graph.compile(checkpointer=saver)``.

    Every write is fenced by a claim of the thread (README "LangGraph"): the saver claims a thread at the first
    write of a run, renews the claim every ``renew_every`` while the run writes, and releases it once the run has
    written nothing for ``idle_release`` (or when a :meth:`hold` block ends). A second host's run on a held thread
    fails with ``ThreadBusy`` at its first write; a run whose claim was taken over (it paused past ``ttl``) or whose
    thread was deleted gets ``StaleClaim`` and writes nothing; the store orders each thread's history.

    Safe to use from any number of threads and from asyncio: the ``a``-methods run the same code, with the same
    results and errors, on the bounded pool of a threadloom :class:`~threadloom.persistence.aio.AsyncStore` (the
    one given as ``store``, or one the saver makes around its store), so the event loop never blocks on the store.
    Use as a (sync or async) context manager, or call :meth:`close` / :meth:`aclose`: it releases the claims still
    held and closes the store when the saver opened it (:meth:`from_url`, :meth:`afrom_url`).

    Args:
        store: any threadloom store, or an ``AsyncStore`` (its pool then runs the async methods, shared with the
            rest of the program's async calls, and ``workers`` is not used).
        serde: LangGraph serializer; default :func:`strict_serde`, ``JsonPlusSerializer(pickle_fallback=False,
            allowed_msgpack_modules=None)`` (only LangGraph's safe types are rebuilt on read; any other type a stored
            value names comes back as data). A serializer with ``pickle_fallback=True`` or
            ``allowed_msgpack_modules=True`` is refused (``ValidationError`` naming ``serde``). Whatever is given, a
            value the serializer would pickle is refused (``ValidationError``) before anything is written.
        ttl: the claim's time to live (default 30 s): how long after a host dies before another may take over.
        renew_every: how often held claims are renewed (default ``ttl / 3``); must be below ``ttl``.
        idle_release: a run that has written nothing for this long ends: its claim is released (default 5 s).
        tenant_id: the tenant recorded with each claim and checkpoint (also the tenant ``delete_for_runs`` visits).
        workers: threads of the ``AsyncStore`` the saver makes around a sync store for the async methods (1..64,
            default 4).
    """

    def __init__(
        self,
        store: Checkpointer | AsyncStore,
        *,
        serde: Any = None,
        ttl: timedelta = timedelta(seconds=30),
        renew_every: timedelta | None = None,
        idle_release: timedelta = timedelta(seconds=5),
        tenant_id: str | None = None,
        workers: int = 4,
    ) -> None:
        given = store if isinstance(store, AsyncStore) else None
        if given is not None:
            store = given.store
        if not isinstance(store, Checkpointer):
            raise ValidationError("store", (f"must be a threadloom store, got {type(store).__name__}",))
        v.check_positive_duration("ttl", ttl)
        renew = renew_every if renew_every is not None else ttl / 3
        v.check_positive_duration("renew_every", renew)
        if renew >= ttl:
            raise ValidationError("renew_every", ("must be shorter than ttl",))
        v.check_positive_duration("idle_release", idle_release)
        v.check_optional_id("tenant_id", tenant_id)
        v.check_int("workers", workers, low=1, high=64)
        super().__init__(serde=_check_serde(serde) if serde is not None else strict_serde())
        self.store = store
        self.tenant_id = tenant_id
        self._owns_store = False
        # tells one put_writes call's writes from another's (fold_writes keeps a task's first call whole): unique
        # across savers by the random prefix, within the saver by the count (no uuid per call)
        self._batch_prefix = f"{uuid.uuid4().hex[:16]}-"
        self._batches = itertools.count()
        self._holds = Holds(store, ttl=ttl, renew_every=renew, idle_release=idle_release, tenant_id=tenant_id)
        # the async methods' pool: the AsyncStore given, or one around the store (closing it leaves the store open)
        self._aio = given if given is not None else AsyncStore(store, max_workers=workers, own_store=False)
        self._owns_aio = given is None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ThreadloomSaver:
        """A saver over ``open_store(url)`` (``memory://``, ``sqlite:///path.db``, ``postgresql://…``).

        ``options`` for the saver (``serde``, ``ttl``, ``renew_every``, ``idle_release``, ``tenant_id``,
        ``workers``) go to it, the rest to ``open_store``. :meth:`close` closes the store too.
        """
        from threadloom.persistence.opening import open_store

        names = ("serde", "ttl", "renew_every", "idle_release", "tenant_id", "workers")
        mine = {name: options.pop(name) for name in names if name in options}
        store = open_store(url, **options)
        try:
            saver = cls(store, **mine)
        except BaseException:
            store.close()
            raise
        saver._owns_store = True
        return saver

    @classmethod
    async def afrom_url(cls, url: str, **options: Any) -> ThreadloomSaver:
        """A saver over ``await open_async_store(url)``, opened off the event loop (opening may create and migrate
        a file or a schema); its async methods run on that async store's pool of ``workers`` threads.

        ``options`` as :meth:`from_url`. :meth:`close` / :meth:`aclose` close the store too.
        """
        names = ("serde", "ttl", "renew_every", "idle_release", "tenant_id")
        mine = {name: options.pop(name) for name in names if name in options}
        workers = options.pop("workers", 4)
        v.check_int("workers", workers, low=1, high=64)
        astore = await open_async_store(url, max_workers=workers, **options)
        try:
            saver = cls(astore, **mine)
        except BaseException:
            await astore.close()
            raise
        saver._owns_store = saver._owns_aio = True
        return saver

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Releases every claim the saver holds, stops its threads, and closes the store if it opened it (an
        ``AsyncStore`` given to the saver stays open). Closing twice does nothing more."""
        self._holds.close()
        if self._owns_aio:
            self._aio.shutdown()  # later async calls raise StoreClosed
        if self._owns_store:
            self.store.close()

    async def aclose(self) -> None:
        """:meth:`close`, off the event loop (releasing claims is a store call each)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> ThreadloomSaver:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> ThreadloomSaver:
        return self

    async def __aexit__(self, *_exc: Any) -> None:
        await self.aclose()

    @contextlib.contextmanager
    def hold(self, thread_id: str, *, wait: timedelta | None = None) -> Iterator[None]:
        """Holds the claim of LangGraph thread ``thread_id`` (root namespace) for the block, released at its end.

        Use it around a run (``with saver.hold(tid): graph.invoke(..., config)``) to claim before the run reads the
        thread, to wait for another host's run to end (``wait``), and to release as soon as the run ends.

        Blocks of one saver on one thread take turns: a second block waits up to ``wait`` for the first to end (in
        no promised order among several waiting), so runs in blocks follow each other. A block inside a block of the
        same saver and thread (in its code, or a thread or task that inherits its ``contextvars``) shares the outer
        one. A run of the same saver outside any block is not held back by a block: it shares the saver's claim, so
        two runs of one thread through one saver at once, one of them outside any block, can fork the history (README
        "LangGraph"). A block that begins while such a run holds the saver's claim shares that claim and leaves it to
        the run at its end (released once the run is idle).

        A block begins a new run: a run of this saver that lost the thread before it (``StaleClaim``) no longer
        blocks the thread's next claim.

        Args:
            thread_id: the LangGraph thread.
            wait: how long to wait for another run's claim (another host's, or another block of this saver) to end,
                a ``timedelta`` of zero or more (default None: no wait).

        Raises:
            ThreadBusy: another run holds the thread (another host's, or another block of this saver) and did not
                end within ``wait`` (default: no wait); nothing changed, retrying later is safe.
            StoreClosed: the saver was closed.
            ValidationError: ``wait`` is not a ``timedelta`` (a number of seconds included) nor None, or is
                negative; nothing changed.
        """
        name = m.store_thread(thread_id, "")
        if self._holds.inside(name):  # a block inside this saver's block on the thread: the outer one holds it
            v.wait_seconds("wait", wait)
            yield
            return
        block = self._holds.begin(name, wait)
        token = BLOCKS.set((*BLOCKS.get(), block))
        try:
            yield
        finally:
            try:
                self._holds.end(block)
            finally:
                _reset(BLOCKS, token)

    @contextlib.asynccontextmanager
    async def ahold(self, thread_id: str, *, wait: timedelta | None = None) -> AsyncIterator[None]:
        """The async form of :meth:`hold` (``wait`` and errors as there)."""
        v.wait_seconds("wait", wait)  # refused on the caller's loop, before any claim
        name = m.store_thread(thread_id, "")
        if self._holds.inside(name):  # a block inside this saver's block on the thread: the outer one holds it
            yield
            return
        block = await self._abegin(name, wait)
        token = BLOCKS.set((*BLOCKS.get(), block))
        try:
            yield
        finally:
            try:
                await asyncio.shield(self._run(functools.partial(self._holds.end, block)))
            finally:
                _reset(BLOCKS, token)

    async def _abegin(self, name: str, wait: timedelta | None) -> Block:
        """:meth:`Holds.begin` without holding a pool thread while it waits for the turn, and safe to cancel: a
        block cancelled while it claims ends once the claim returns (it never keeps the turn or the claim)."""
        seconds = v.wait_seconds("wait", wait) or 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            block = self._holds.take_turn(name)
            if block is not None:
                break
            left = deadline - loop.time()
            if left <= 0:
                raise self._holds.busy(name)
            await asyncio.sleep(min(TURN_POLL_S, left))
        while True:  # the claim: another host's run may hold the thread; waited for here, not on a pool thread
            claiming = asyncio.ensure_future(self._run(functools.partial(self._holds.claim_for, block)))
            try:
                await asyncio.shield(claiming)
                return block
            except asyncio.CancelledError:
                claiming.add_done_callback(functools.partial(self._after_cancelled_claim, block))
                raise
            except ThreadBusy:
                left = deadline - loop.time()
                if left <= 0:
                    self._holds.give_turn(block)
                    raise
            except BaseException:
                self._holds.give_turn(block)
                raise
            try:
                await asyncio.sleep(min(CLAIM_POLL_S, left))
            except BaseException:
                self._holds.give_turn(block)
                raise

    def _after_cancelled_claim(self, block: Block, claiming: asyncio.Future[Any]) -> None:
        """A block cancelled while it claimed: once the claim returns, the block ends (its claim released on a thread
        of its own, off the loop), or only gives its turn back when the claim failed."""
        if claiming.cancelled() or claiming.exception() is not None:
            self._holds.give_turn(block)
        else:
            self._end_off_loop(block)

    def _end_off_loop(self, block: Block) -> None:
        """Ends ``block`` on a thread of its own (a cancelled block's claim is released without the loop)."""
        threading.Thread(target=self._holds.end, args=(block,), name="threadloom-langgraph-end", daemon=True).start()

    # -- writes --------------------------------------------------------------------------------------------------

    def put(
        self, config: RunnableConfig, checkpoint: LgCheckpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Stores ``checkpoint`` as the thread's (namespace's) new latest, fenced by the run's claim.

        Returns:
            The config naming the stored checkpoint.

        Raises:
            ValidationError: a value the serializer cannot encode as data (nothing written).
            ThreadBusy: another run holds the thread; StaleClaim: this run's claim was lost (nothing written).
            CheckpointConflict: another run wrote the thread between this run's read and its first write.
            OutcomeUnknown: the store failed while the commit was in flight and a read could not show it applied
                (a retry is safe: fencing and the checkpoint id refuse a second copy).
        """
        return self._put_encoded(config, checkpoint, *self._encode_put(config, checkpoint, metadata))

    def _encode_put(
        self, config: RunnableConfig, checkpoint: LgCheckpoint, metadata: CheckpointMetadata
    ) -> tuple[CheckpointMetadata, dict[str, str], dict[str, str]]:
        """The full metadata of a :meth:`put` and the serializer's encoding of the checkpoint and of it: made
        when the call comes (``aput`` makes them on the loop, before the rest runs on a thread of the pool, as
        LangGraph's own savers serialize in the call: LangGraph may change a channel's value object after it)."""
        conf = m.configurable(config)
        m.store_thread(conf["thread_id"], conf.get("checkpoint_ns") or "")
        v.check_id("checkpoint.id", checkpoint.get("id") if isinstance(checkpoint, dict) else None)
        full_metadata = get_checkpoint_metadata(config, metadata)
        return (full_metadata, m.encode(self.serde, "checkpoint", checkpoint),
                m.encode(self.serde, "metadata", full_metadata))

    def _put_encoded(
        self, config: RunnableConfig, checkpoint: LgCheckpoint, full_metadata: CheckpointMetadata,
        encoded_checkpoint: dict[str, str], encoded_metadata: dict[str, str],
    ) -> RunnableConfig:
        """:meth:`put` of what :meth:`_encode_put` made (``checkpoint`` read for its id and ``ts`` only)."""
        conf = m.configurable(config)
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns") or ""
        name = m.store_thread(thread_id, ns)
        checkpoint_id = checkpoint["id"]  # validated by _encode_put
        parent = conf.get("checkpoint_id")
        state = {"format": m.FORMAT, "checkpoint": encoded_checkpoint, "metadata": encoded_metadata, "parent": parent}
        run = full_metadata.get("run_id")
        step = full_metadata.get("step")
        created = _producer_time(checkpoint.get("ts"))
        root_hold = self._holds.acquire(thread_id) if ns else None
        # a run beginning the thread anew after this saver deleted it claims it at once (README "LangGraph")
        gone = self._holds.begin_again(name) if parent is None else None
        filterable = m.filterable(full_metadata)
        with self._locked(name) as hold:
            self._check_live(hold)
            if gone is not None:
                hold.gone = gone
                for kept_for, kept in gone.early.items():  # the new run's first writes, sent before this put
                    hold.early.setdefault(kept_for, []).extend(kept)
            self._check_not_gone(hold, parent)
            if hold.moved is not None:
                raise CheckpointConflict(name, hold.moved[0], hold.moved[1])
            if hold.latest is None and parent is not None and self._holds.was_deleted(name):
                # the run continues from a checkpoint of the thread this saver deleted since the run read it (the
                # saver then knows the thread empty, so no read shows the move). Stored, the run's state would
                # bring the deleted thread back as a new one (found by hostile testing, durability="exit"):
                # refused, nothing written, and the claim released
                self._holds.drop(name, release=True)
                raise CheckpointConflict(name, parent, None)
            if (parent is not None and parent != hold.latest and self._holds.ever_deleted(name)
                    and self.store.checkpoint(name, parent) is None):
                # on a thread this saver deleted, a parent the thread does not hold: a run that began before the
                # delete, continuing after a new run began the thread again (found by hostile testing: after a
                # second delete, once the new run's hold was let go idle, or from a checkpoint far back, the old
                # run's state came back on top of the new history): refused, nothing written
                raise CheckpointConflict(name, parent, hold.latest)
            if hold.latest is not None:
                # the store keeps pending writes for the latest checkpoint only: the one this supersedes keeps
                # its writes here, found by the metadata key (README "LangGraph", pending writes)
                state["superseded"] = m.superseded(hold.writes, hold.latest)
                filterable[m.SUPERSEDED_KEY] = hold.latest
                if hold.holds_late:  # late writes for earlier checkpoints among them: found by this key
                    filterable[m.LATE_MARK] = "1"
            if hold.holds_late or hold.late_seen:
                state[m.LATE_STATE] = True
            run_id = str(run) if isinstance(run, str) and run else hold.run_id or hold.holder
            text = _state_text(state, encoded_checkpoint, encoded_metadata, parent, hold)
            if text is None:  # a part the saver did not make itself: the constructor validates and encodes it
                stored = Checkpoint(
                    id=checkpoint_id,
                    parent=hold.latest,
                    thread_id=name,
                    run_id=run_id,
                    status=CheckpointStatus.COMPLETED,
                    created_at=created,
                    state=state,
                    graph_id=m.GRAPH_ID,
                    tenant_id=self.tenant_id,
                    origin=CheckpointOrigin(parent_thread=thread_id) if ns else None,
                    metadata=filterable,
                )
            else:
                # every part validated already (the ids here and by the hold, the serializer's base64 output, the
                # filterable metadata m.filterable makes of plain JSON, the carried writes' sealed text): built as
                # it is, with the state's composed text (prevalidated_builder); the run id and the producer's
                # time come from the metadata and the checkpoint, so they are checked here
                v.check_id("checkpoint.run_id", run_id)
                v.check_aware("checkpoint.created_at", created)
                v.check_optional_id("checkpoint.tenant_id", self.tenant_id)  # a public attribute: may be replaced
                stored = _build_checkpoint(
                    text, checkpoint_id, hold.latest, name, run_id, CheckpointStatus.COMPLETED, created, state,
                    m.GRAPH_ID, self.tenant_id, None, CheckpointOrigin(parent_thread=thread_id) if ns else None,
                    filterable,
                )
            early = hold.early.pop(checkpoint_id, [])
            event = _event(run_id, datetime.now(UTC), ns, step, full_metadata.get("source"), checkpoint_id)
            fence = (thread_id, root_hold.token) if root_hold is not None else None
            try:
                # token, checkpoint, pending_writes, events, effects, retract_turn, fence, metadata: each the saver's
                # own (the claim's token and the fence's, the writes it built), validated where they were made
                self._commit(hold, _build_commit(hold.token, stored, tuple(early), (event,), (), False, fence, None))
            except CheckpointConflict:
                # the thread is not as the hold knew it (a checkpoint came between this saver's read of an empty
                # thread and its claim): nothing written; the run's next write claims again and reads the thread
                self._holds.drop(name, release=True)
                raise
            except OutcomeUnknown:
                # the commit may have applied: the store knows (its latest is this checkpoint only if it did)
                after = self.store.latest(name)
                if after is None or after.checkpoint.id != checkpoint_id:
                    hold.early[checkpoint_id] = early
                    raise
            if hold.latest is None:
                self._holds.forget_deleted(name)  # the thread begins again: a new run's first checkpoint
            hold.late_seen = hold.late_seen or hold.holds_late
            hold.stored(checkpoint_id)
            hold.regular_tasks = m.regular_tasks(early)
            hold.writes = list(early)
            hold.touch()
        self._holds.seen(name, checkpoint_id)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Stores a task's writes against the checkpoint ``config`` names, fenced by the run's claim.

        Writes for the namespace's latest checkpoint are stored at once. Writes for a checkpoint this run has not
        stored yet (LangGraph may send them first) wait in memory and are committed with that checkpoint. Writes
        for one of the 64 checkpoints this run stored before the latest (LangGraph may send them after the next
        checkpoints) are stored at once against the latest, naming their own, and read with their own (README
        "LangGraph"); writes for an older checkpoint are accepted and not kept. A task's second execution never
        mixes its regular writes with the first's (the first's are kept).

        Raises:
            ValidationError: a value the serializer cannot encode (nothing written); ThreadBusy, StaleClaim: as
                :meth:`put`. CheckpointConflict: another run wrote the thread between this run's read and this
                write, which names a checkpoint that is no longer the latest (nothing written).
        """
        self._put_encoded_writes(config, self._encode_writes(config, writes, task_id, task_path))

    def _encode_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> list[PendingWrite]:
        """The pending writes of a :meth:`put_writes`, encoded when the call comes (see :meth:`_encode_put`)."""
        conf = m.configurable(config)
        m.store_thread(conf["thread_id"], conf.get("checkpoint_ns") or "")
        checkpoint_id = v.check_id("checkpoint_id", conf.get("checkpoint_id"))
        batch = f"{self._batch_prefix}{next(self._batches):x}"
        return m.pending_writes(self.serde, checkpoint_id, task_id, task_path, writes, batch)

    def _put_encoded_writes(self, config: RunnableConfig, encoded: list[PendingWrite]) -> None:
        """:meth:`put_writes` of what :meth:`_encode_writes` made."""
        if not encoded:
            return
        conf = m.configurable(config)
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns") or ""
        name = m.store_thread(thread_id, ns)
        checkpoint_id = conf["checkpoint_id"]
        if self._holds.keep_early(name, checkpoint_id, encoded):
            return  # the thread this saver deleted: possibly a new run's first writes, kept for its first put
        root_hold = self._holds.acquire(thread_id) if ns else None
        with self._locked(name) as hold:
            self._check_live(hold)
            self._check_not_gone(hold, checkpoint_id)
            hold.touch()
            if hold.moved is not None and checkpoint_id != hold.latest:
                # another run wrote the thread since this run read it: its writes name a view that is gone
                raise CheckpointConflict(name, checkpoint_id, hold.latest)
            if checkpoint_id != hold.latest:
                if hold.superseded(checkpoint_id):
                    # late (LangGraph's default durability may store the next checkpoints first): kept against the
                    # latest, naming its own checkpoint; the next checkpoint carries them, marked, and a read of
                    # their checkpoint finds them there (README "LangGraph", pending writes)
                    assert hold.latest is not None  # a superseded checkpoint has a latest after it
                    late = [m.late(write, hold.latest) for write in encoded]
                    fence = (thread_id, root_hold.token) if root_hold is not None else None
                    self._commit(hold, _build_commit(hold.token, None, tuple(late), (), (), False, fence, None))
                    hold.writes.extend(late)
                    hold.holds_late = True
                    return
                # early (its checkpoint is still to come), or late for a checkpoint stored before this hold or more
                # than LATE_WINDOW checkpoints before the latest: kept in memory until that checkpoint's put, told
                # apart only when the hold ends (no read per write; a late one is then reported, not kept)
                hold.early.setdefault(checkpoint_id, []).extend(self._keep(encoded, m.regular_tasks(
                    hold.early.get(checkpoint_id, ()))))
                return
            kept = self._keep(encoded, hold.regular_tasks)
            if not kept:
                return
            fence = (thread_id, root_hold.token) if root_hold is not None else None
            self._commit(hold, _build_commit(hold.token, None, tuple(kept), (), (), False, fence, None))
            hold.regular_tasks |= m.regular_tasks(kept)
            hold.writes.extend(kept)

    @staticmethod
    def _keep(encoded: list[PendingWrite], tasks_with_writes: Any) -> list[PendingWrite]:
        """The writes of one call worth storing: its regular writes only when the task stored none before."""
        return [w for w in encoded if w.payload["idx"] < 0 or w.task_id not in tasks_with_writes]

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[Hold]:
        """The saver's hold on ``name`` (claiming the thread when it has none), locked for the block: a hold the
        saver let go meanwhile (a ``hold`` block's end, idle release) is left for the thread's new one, so a write
        never commits under a claim the saver released."""
        while True:
            hold = self._holds.acquire(name)
            with hold.lock:
                if not hold.released:
                    yield hold
                    return

    def _check_live(self, hold: Hold) -> None:
        if hold.lost is not None:
            hold.touch()
            raise hold.lost

    @staticmethod
    def _check_not_gone(hold: Hold, checkpoint_id: str | None) -> None:
        """Refuses a write naming a checkpoint of the run this saver's delete stopped, once a new run began the
        thread again (that run stays stopped: its writes never join the new history)."""
        refused = hold.refuses(checkpoint_id)
        if refused is not None:
            raise refused

    def _commit(self, hold: Hold, commit: Commit) -> None:
        try:
            self.store.commit(hold.thread_id, commit)
        except StaleClaim as error:
            self._holds.lose(hold, error)
            raise

    # -- reads ---------------------------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the namespace's latest; None if absent.

        Every checkpoint comes with its pending writes, as LangGraph's own savers return them: the latest with
        those stored so far, an earlier one with those it held when the next checkpoint was stored (carried by
        that one), then the run's late writes for it (up to 64 checkpoints late, carried by the checkpoints after
        it). Finding them costs one more store call per 1000 checkpoints between it and the latest, and at most
        two more once the thread has a checkpoint that carries late writes; none for the latest's parent. A
        checkpoint of a run removed by :meth:`delete_for_runs` is absent. Needs no claim.
        """
        conf = m.configurable(config)
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns") or ""
        name = m.store_thread(thread_id, ns)
        wanted = conf.get("checkpoint_id")
        latest = self.store.latest(name)
        self._holds.seen(name, latest.checkpoint.id if latest is not None else None)
        if wanted is None:
            if latest is None:
                return None
            if not self._hidden(name, {latest.checkpoint.run_id}):
                return self._tuple(latest.checkpoint, m.own(_held(latest)))
            for item, _newer in self._walk(name, latest.checkpoint, None):
                return self._tuple(item, self._writes_of(name, item.id, None, None, latest, _Late(name, latest)))
            return None
        v.check_id("checkpoint_id", wanted)
        if latest is not None and latest.checkpoint.id == wanted:
            if self._hidden(name, {latest.checkpoint.run_id}):
                return None
            return self._tuple(latest.checkpoint, m.own(_held(latest)))
        found = self.store.checkpoint(name, wanted)
        if found is None or self._hidden(name, {found.run_id}):
            return None
        return self._tuple(found, self._writes_of(name, wanted, None, None, latest, _Late(name, latest)))

    def list(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first in the store's order, whose metadata matches ``filter``; at most ``limit``.

        ``config`` picks what is listed: with a ``checkpoint_ns``, that namespace of the thread; without one,
        every namespace of the thread (the root first, then its subgraphs' in the order they first wrote); with a
        ``checkpoint_id``, that checkpoint only. ``config=None`` lists every LangGraph thread of the saver's tenant,
        thread by thread, the most recently written first (each thread as without a ``checkpoint_ns``).

        ``before`` (a config whose ``checkpoint_id`` names a checkpoint) lists what is older than it in its
        namespace (``before``'s ``checkpoint_ns`` when the listing spans namespaces, else the listed one), then
        the namespaces listed after that one; nothing when it is not there (listing several namespaces). Listing
        one namespace ``before`` a checkpoint id it does not hold, as LangGraph's replay of a persistent subgraph
        does with one of the root namespace's, lists the namespace's checkpoints whose ids sort below it when it is
        a LangGraph id (a version-6 UUID, compared as LangGraph's own savers compare them, stored or not); for
        another id, those made (the producers' ``ts``) before that checkpoint of the root namespace (or of
        ``before``'s ``checkpoint_ns``), nothing when it is not there. ``filter`` keeps the
        checkpoints whose metadata holds every key with the same JSON value (README "LangGraph": ``1`` and ``1.0``
        are one value, ``true`` is not ``1``, objects compare whatever their key order, ``None`` matches only a
        stored ``None``).

        The store answers filter, ``before`` and ``limit`` (``search_history``: each call examines at most 1000
        checkpoints and reads only those that match), so a filter that matches little costs one store call per
        1000 checkpoints; a checkpoint of a run removed by :meth:`delete_for_runs` is left out and the listing
        reads on until ``limit`` visible ones. Every checkpoint comes with its pending writes (as :meth:`get_tuple`;
        unfiltered, they come with the page; filtered, a match whose next checkpoint is not also a match costs a
        search for that one, as :meth:`get_tuple`; ``before`` costs a read of it and of the latest, a search for
        the checkpoint after it, and at most two more calls once the thread has a checkpoint that carries late
        writes).

        Raises:
            ValidationError: ``filter`` is not a mapping of at most 64 str keys to plain JSON values; ``limit``
                is negative; ``before`` with ``config=None`` or with a config naming a ``checkpoint_id``.
        """
        wanted = m.store_filter(filter)
        if limit is not None:
            v.check_int("limit", limit, low=0)
        after_id, after_ns = _before(before)
        only: str | None = None
        if config is None:
            if after_id is not None:
                raise ValidationError("before", ("listing every thread (config None) takes no before; list a thread",))
            names: Iterator[str] | builtins.list[str] = self._tenant_namespaces()
        else:
            conf = m.configurable(config)
            thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns")
            only = conf.get("checkpoint_id")
            if only is not None:
                v.check_id("checkpoint_id", only)
                if after_id is not None:
                    raise ValidationError("before", ("a config naming a checkpoint_id lists that one; drop before",))
            if ns is None:
                names = self._namespaces(thread_id, root_first=True)
                if after_id is not None:  # resume in before's namespace, then the ones after it
                    start = m.store_thread(thread_id, after_ns or "")
                    names = names[names.index(start):] if start in names else []
            else:
                names = [m.store_thread(thread_id, ns)]
        if limit == 0:
            return
        page = _PAGE if limit is None else min(limit, rules.MAX_PAGE)
        count = 0
        try:
            for name in names:
                for found in self._matching(name, wanted, after_id, only, page):
                    yield found
                    count += 1
                    if limit is not None and count >= limit:
                        return
                after_id = None
        except CheckpointNotFound:
            if count or config is None or conf.get("checkpoint_ns") is None or after_id is None:
                return  # before is not there (or the page's last checkpoint was pruned meanwhile): nothing more
        else:
            return
        # a single namespace listed below a checkpoint it does not hold: LangGraph's replay of a persistent subgraph
        # names the parent's checkpoint; its namespace's checkpoints made before that one, as LangGraph's savers
        # answer (they compare the ids)
        listed = m.store_thread(thread_id, conf["checkpoint_ns"])
        yield from self._made_before(thread_id, after_ns or "", after_id, listed, wanted, page, limit)

    def _made_before(
        self, thread_id: str, before_ns: str, before_id: str, name: str, wanted: dict[str, str], page: int,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of namespace ``name`` made before checkpoint ``before_id`` of the thread's namespace
        ``before_ns``, newest first, at most ``limit``. For an id LangGraph made (a version-6 UUID, whose text
        order is its making order) those whose ids sort below it, as LangGraph's own savers compare, whether or not
        that checkpoint is stored (with ``durability="exit"`` the replay names one never stored, or one stored with
        a later ``ts`` than its id's time); for another id, those whose producers' times come before its stored
        checkpoint's, nothing when it is not there."""
        if _uuid6(before_id):
            # found by fuzzing against InMemorySaver: a persistent subgraph replayed from a checkpoint "exit"
            # durability did not store (or stored late) kept the wrong state
            matching: Iterator[CheckpointTuple] = (
                found for found in self._matching(name, wanted, None, None, page)
                if found.config["configurable"]["checkpoint_id"] < before_id)
        else:
            marker = self.store.checkpoint(m.store_thread(thread_id, before_ns), before_id)
            if marker is None:
                return
            matching = self._matching(name, wanted, None, None, page, made_before=marker.created_at)
        count = 0
        try:
            for found in matching:
                yield found
                count += 1
                if limit is not None and count >= limit:
                    return
        except CheckpointNotFound:
            return

    def _tenant_namespaces(self) -> Iterator[str]:
        """Every namespace of the saver tenant's LangGraph threads, thread by thread, most recently written first."""
        query = ThreadQuery(tenant_id=self.tenant_id, graph_id=m.GRAPH_ID, limit=ThreadQuery.MAX_LIMIT)
        while True:
            threads = self.store.threads(query)
            for summary in threads.items:
                yield from self._namespaces(summary.thread_id, root_first=True)
            if threads.next is None:
                return
            query = attrs.evolve(query, after=threads.next)

    def _matching(
        self, name: str, wanted: dict[str, str], after: str | None, only: str | None, page: int,
        made_before: datetime | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The visible checkpoints of ``name`` matching ``wanted`` (store metadata), newest first, below ``after``
        (or only checkpoint ``only``), made before ``made_before`` when given (the stored producer's time), read from
        the store ``page`` matches at a time."""
        visible = self._visibility(name)
        # read below before too: the latest holds (and says whether any checkpoint carries) late writes
        latest = self.store.latest(name)
        if latest is None:
            return
        if only is not None:
            found: Checkpoint | None
            if latest is not None and latest.checkpoint.id == only:
                found = latest.checkpoint
            else:
                found = self.store.checkpoint(name, only)
            if found is not None and visible(found) and wanted.items() <= found.metadata.items():
                yield self._tuple(found, self._writes_of(name, only, None, None, latest, _Late(name, latest)))
            return
        cursor = after
        # the late writes found so far; unfiltered, the pages read every checkpoint from the top, which carry
        # every late write of the checkpoints below them (with those found near before, when given)
        late = _Late(name, latest, complete=not wanted)
        # the checkpoint read just before (newer than) the next one, and where a search for a successor starts
        newer: Checkpoint | None = latest.checkpoint if after is None else None
        anchor: str | None = after
        while True:
            if wanted:
                matches = self.store.search_history(name, metadata=wanted, limit=page, before=cursor)
            else:  # no filter: plain pages of the history
                items = self.store.history(name, limit=page, before=cursor)
                matches = CheckpointPage(items=tuple(items), next=items[-1].id if len(items) == page else None)
            shown = 0
            for item in matches.items:
                if newer is None and after is not None:  # the first below before: before is the one after it
                    newer = self._near(name, after, latest, late)
                late.carrier(item)
                if visible(item) and (made_before is None or item.created_at < made_before):
                    yield self._tuple(item, self._writes_of(name, item.id, newer, anchor, latest, late))
                    shown += 1
                newer, anchor = item, item.id
            if matches.next is None:
                return
            cursor = matches.next
            if shown < len(matches.items):  # a removed run's checkpoints: read larger pages past them
                page = min(2 * page, rules.MAX_PAGE)

    def _near(self, name: str, before: str, latest: StoredCheckpoint, late: _Late) -> Checkpoint | None:
        """Checkpoint ``before`` (None: not there), read for a listing below it, with the late writes carried
        near it added to ``late``: those the checkpoints after it carry for the ones below it (README
        "LangGraph": the search for the one after it, and at most two more store calls when the latest says a
        checkpoint carries late writes)."""
        if before == latest.checkpoint.id:
            return latest.checkpoint  # ``late`` has what the latest holds and carries
        found = self.store.checkpoint(name, before)
        if found is not None:
            late.carrier(found)
            successor, windows = self._successor(name, before, None, None, latest)
            if successor is not None:
                late.carrier(successor)
                late.search(self.store, windows)
        return found

    def _listing(
        self, name: str, first: StoredCheckpoint | None, after: str | None
    ) -> Iterator[tuple[Checkpoint, tuple[PendingWrite, ...]]]:
        visible = self._visibility(name)
        start: Checkpoint | str | None = after
        if first is not None:
            if visible(first.checkpoint):
                yield first.checkpoint, first.pending_writes
            start = first.checkpoint
        assert start is not None
        for item, _newer in self._walk(name, start, visible):
            yield item, ()

    def _visibility(self, name: str) -> Callable[[Checkpoint], bool]:
        """A test of whether a checkpoint of ``name`` is visible (its run not deleted), asking once per run."""
        hidden: dict[str, bool] = {}

        def visible(item: Checkpoint) -> bool:
            if item.run_id not in hidden:
                hidden[item.run_id] = self._hidden(name, {item.run_id})
            return not hidden[item.run_id]

        return visible

    def _walk(
        self, name: str, after: Checkpoint | str, visible: Callable[[Checkpoint], bool] | None
    ) -> Iterator[tuple[Checkpoint, Checkpoint | None]]:
        """The history of ``name`` older than ``after``, newest first, page by page (visible ones only), each with
        the checkpoint just newer than it in the store's order (visible or not; None when ``after`` is an id and
        the item is the first)."""
        test = visible if visible is not None else self._visibility(name)
        newer: Checkpoint | None = after if isinstance(after, Checkpoint) else None
        cursor: str | None = after.id if isinstance(after, Checkpoint) else after
        while cursor is not None:
            try:
                page = self.store.history(name, limit=_PAGE, before=cursor)
            except CheckpointNotFound:
                return
            for item in page:
                if test(item):
                    yield item, newer
                newer = item
            cursor = page[-1].id if len(page) == _PAGE else None

    def _successor(
        self, name: str, checkpoint_id: str, newer: Checkpoint | None, anchor: str | None,
        latest: StoredCheckpoint | None,
    ) -> tuple[Checkpoint | None, tuple[str | None, ...]]:
        """The checkpoint stored just after ``checkpoint_id`` (None: none found), and the ``before`` of the
        search windows that hold the checkpoints up to 1000 after it (none when no search was made).

        ``newer`` is a checkpoint read already that may be it (so may the latest); else the store is searched for
        the checkpoint whose metadata names ``checkpoint_id`` superseded, from just older than ``anchor`` (None:
        from the latest), one call per 1000 checkpoints examined. The windows are that search's: the one it was
        found in and the one before (the first window alone when it was found there).
        """
        if newer is not None and newer.parent == checkpoint_id:
            return newer, ()
        if latest is not None and latest.checkpoint.parent == checkpoint_id:
            return latest.checkpoint, ()
        cursor = anchor
        windows: builtins.list[str | None] = []
        while True:
            try:
                page = self.store.search_history(name, metadata={m.SUPERSEDED_KEY: checkpoint_id}, limit=1,
                                                 before=cursor)
            except CheckpointNotFound:
                return None, ()
            windows.append(cursor)
            if page.items:
                return page.items[0], tuple(windows[-2:])
            if page.next is None or page.next == checkpoint_id:
                return None, ()
            cursor = page.next

    def _writes_of(
        self, name: str, checkpoint_id: str, newer: Checkpoint | None, anchor: str | None,
        latest: StoredCheckpoint | None, late: _Late,
    ) -> builtins.list[tuple[str, Any]]:
        """The pending writes of checkpoint ``checkpoint_id`` as ``(task_id, payload)``, in the order they were
        stored.

        A checkpoint's writes are those it held when the next checkpoint was stored (that one carries them; the
        latest holds its own), then the late ones for it that the checkpoints after it held (README "LangGraph"):
        at most ``LATE_WINDOW + 1`` after it, carried by checkpoints that ``late`` knows already or that a search
        of the windows around the next one finds (at most two store calls, none when the thread's latest says no
        checkpoint carries late writes).
        """
        if latest is not None and checkpoint_id == latest.checkpoint.id:
            return m.own(_held(latest))
        successor, windows = self._successor(name, checkpoint_id, newer, anchor, latest)
        if successor is None:
            return []
        late.carrier(successor)
        if not late.complete:
            late.search(self.store, windows)
        return m.own(m.carried(name, successor, checkpoint_id)) + late.late_for(checkpoint_id)

    def _hidden(self, name: str, runs: set[str]) -> bool:
        return any(self.store.effect(name, m.DELETED_RUN_KEY + run) is not None for run in runs)

    def _tuple(self, item: Checkpoint, writes: Sequence[tuple[str, Any]]) -> CheckpointTuple:
        state = item.state
        if not isinstance(state, dict) or state.get("format") != m.FORMAT:
            from threadloom.domain.errors import StoreCorrupt

            raise StoreCorrupt("langgraph", f"checkpoint {item.id!r} of thread {item.thread_id!r} is not LangGraph's")
        thread_id, ns = m.split_thread(item.thread_id)
        checkpoint = m.decode(self.serde, item.thread_id, state["checkpoint"])
        metadata = m.decode(self.serde, item.thread_id, state["metadata"])
        parent = state.get("parent")
        config: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": item.id}
        }
        parent_config: RunnableConfig | None = (
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
            if parent else None
        )
        pending = m.fold_writes(self.serde, item.thread_id, writes) if writes else []
        return CheckpointTuple(config, checkpoint, metadata, parent_config, pending)

    # -- thread-wide operations ------------------------------------------------------------------------------------

    def _namespaces(self, thread_id: str, *, root_first: bool = False) -> builtins.list[str]:
        """The threadloom threads of LangGraph thread ``thread_id``: its subgraph namespaces, then the root (or
        the root first)."""
        root = m.store_thread(thread_id, "")
        found: builtins.list[str] = []
        after: str | None = None
        while True:
            page = self.store.children(root, limit=rules.MAX_PAGE, after=after)
            found.extend(page)
            if len(page) < rules.MAX_PAGE:
                break
            after = page[-1]
        return [root, *found] if root_first else [*found, root]

    @contextlib.contextmanager
    def _claimed(self, name: str) -> Iterator[int]:
        """The token of this saver's hold on ``name``, or of a claim taken for the block and released after it."""
        hold = self._holds.get(name)
        if hold is not None and not hold.deleted:  # a hold this saver's delete lost holds nothing: claimed anew
            self._check_live(hold)
            with hold.lock:
                yield hold.token
            return
        claim = self.store.claim(name, ClaimRequest(holder=f"langgraph-admin-{uuid.uuid4().hex}",
                                                    ttl=timedelta(seconds=60), tenant_id=self.tenant_id))
        try:
            yield claim.token
        finally:
            self.store.release(name, claim.token)

    def delete_thread(self, thread_id: str) -> None:
        """Deletes the LangGraph thread: every namespace's history, writes and events, fenced by claims.

        A run of this saver writing the thread afterwards gets ``StaleClaim`` (the thread is not brought back);
        a run that had read the thread but not written it yet (as with ``durability="exit"``) gets
        ``CheckpointConflict`` at its first checkpoint, which names one the thread no longer has. A new run, whose
        first checkpoint names none, writes the thread anew at once (the same conversation started again); a run
        that began before the delete then gets ``CheckpointConflict`` for a checkpoint whose parent the thread does
        not hold (README "LangGraph", Fencing). Deleting a thread that holds nothing does nothing.

        Raises:
            ThreadBusy: another run holds the thread or one of its namespaces (nothing more deleted; retry later).
        """
        for name in self._namespaces(thread_id):
            hold = self._holds.get(name)
            if (hold is None or hold.deleted) and self.store.latest(name) is None:
                continue  # nothing stored (deleted already, by this saver or another)
            with self._claimed(name) as token:
                try:
                    self.store.delete_thread(name, token)
                except StaleClaim as error:
                    if hold is not None and not hold.deleted:
                        self._holds.lose(hold, error)
                    raise
            self._holds.seen(name, None)
            self._holds.mark_deleted(name)
            if hold is not None:
                self._holds.lose(hold, StaleClaim(name, hold.token, None), deleted=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Removes the checkpoints (and their writes) of runs ``run_ids`` from every thread of the saver's tenant.

        Each affected namespace records, under its claim, that the run is deleted; every read then leaves the run's
        checkpoints out (their storage is reclaimed by ``prune`` or ``delete_thread``). Visits the tenant's
        threads page by page: the cost grows with the number of threads.

        Raises:
            ThreadBusy: another run holds an affected thread (threads visited before it are done; a retry is safe).
        """
        runs = [v.check_id("run_ids", run) for run in run_ids]
        if not runs:
            return
        query = ThreadQuery(tenant_id=self.tenant_id, limit=ThreadQuery.MAX_LIMIT)
        while True:
            page = self.store.threads(query)
            for summary in page.items:
                for name in self._namespaces(summary.thread_id):
                    self._hide_runs(name, runs)
            if page.next is None:
                break
            query = ThreadQuery(tenant_id=self.tenant_id, limit=ThreadQuery.MAX_LIMIT, after=page.next)

    def _hide_runs(self, name: str, runs: builtins.list[str]) -> None:
        present = [run for run in runs if self.store.lookup_run(name, [run]) is not None]
        if not present:
            return
        now = datetime.now(UTC)
        effects = [
            EffectRecord(key=m.DELETED_RUN_KEY + run, run_id=run, recorded_at=now, result={"deleted": True})
            for run in present
        ]
        with self._claimed(name) as token:
            self.store.commit(name, Commit(token=token, effects=effects))
        hold = self._holds.get(name)
        if hold is not None and (hold.run_id or hold.holder) in present:
            # the hidden run is the one this hold's checkpoints without a run id of their own are recorded under:
            # the conversation's next checkpoints are another run's, not hidden with it (found by hostile testing)
            hold.run_id = f"langgraph-run-{uuid.uuid4().hex}"

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every namespace's visible history of one LangGraph thread onto another, in the store's order.

        The latest checkpoint's pending writes are copied with it. Reads the whole history of each namespace
        (memory grows with it). Each checkpoint is one commit on the target, under the target's claim.

        Raises:
            ThreadBusy: another run holds the target.
        """
        for name in self._namespaces(source_thread_id):
            _root, ns = m.split_thread(name)
            latest = self.store.latest(name)
            if latest is None:
                continue
            items = [item for item, _w in self._listing(name, latest, None)]
            items.reverse()
            writes = latest.pending_writes if items and items[-1].id == latest.checkpoint.id else ()
            target = m.store_thread(target_thread_id, ns)
            self._holds.begin_again(target)  # a hold this saver's delete lost: the copy writes the thread anew
            with self._claimed(target) as token:
                parent = self.store.latest(target)
                parent_id = parent.checkpoint.id if parent is not None else None
                # the target's own checkpoints may carry late writes: its copied ones say so too
                late_seen = parent is not None and m.late_seen(parent.checkpoint)
                for index, item in enumerate(items):
                    state = item.state
                    if late_seen and isinstance(state, dict) and not m.late_seen(item):
                        state = {**state, m.LATE_STATE: True}
                    copied = Checkpoint(
                        id=item.id, parent=parent_id, thread_id=target, run_id=item.run_id, status=item.status,
                        created_at=item.created_at, state=state, graph_id=item.graph_id,
                        tenant_id=self.tenant_id,
                        origin=CheckpointOrigin(parent_thread=target_thread_id) if ns else None,
                        metadata=item.metadata,
                    )
                    last = index == len(items) - 1
                    self.store.commit(target, Commit(token=token, checkpoint=copied, pending_writes=tuple(
                        PendingWrite(checkpoint_id=w.checkpoint_id, task_id=w.task_id, node_id=w.node_id,
                                     payload=w.payload) for w in writes) if last else ()))
                    parent_id = item.id
                self._holds.forget_deleted(target)  # written anew: a run continuing from the copy is no stale one
                hold = self._holds.get(target)
                if parent_id is not None:
                    self._holds.seen(target, parent_id)
                if hold is not None and not hold.deleted and parent_id is not None:
                    hold.stored(parent_id)
                    hold.writes = list(writes) if items else []
                    hold.regular_tasks = m.regular_tasks(hold.writes)
                    hold.holds_late = m.holds_late(hold.writes)
                    hold.late_seen = late_seen or (bool(items) and m.late_seen(items[-1]))
                    self._holds.seen(target, parent_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prunes LangGraph threads: ``"keep_latest"`` keeps each namespace's latest checkpoint (and its writes),
        ``"delete"`` deletes the threads (:meth:`delete_thread`).

        Raises:
            ValidationError: an unknown ``strategy``. ThreadBusy: as :meth:`delete_thread`.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValidationError("strategy", (f"must be 'keep_latest' or 'delete', got {strategy!r}",))
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            for name in self._namespaces(thread_id):
                self.store.prune(name, RetentionPolicy(max_checkpoints=1))

    def get_next_version(self, current: str | int | float | None, channel: None = None) -> str:
        """The next channel version: ``current``'s integer part plus one, zero-padded to 32 digits (a str)."""
        if current is None:
            number = 0
        elif isinstance(current, (int, float)):
            number = int(current)
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}"

    # -- async forms (the AsyncStore's bounded pool runs the sync code) ----------------------------------------------
    # Every async method hands its sync form to the AsyncStore's pool: a store call blocks one of its threads, never
    # the event loop (a call whose task is cancelled runs to its end on the pool, as any AsyncStore call). Once the
    # stores have awaitable forms of their own, ``_run`` is the one place to change.

    @property
    def async_store(self) -> AsyncStore:
        """The ``AsyncStore`` whose pool runs the async methods."""
        return self._aio

    async def _run(self, call: Callable[[], _T]) -> _T:
        # in the caller's context: the sync method sees the caller's contextvars, as when it is called directly
        return await self._aio.call(contextvars.copy_context().run, call)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(functools.partial(self.get_tuple, config))

    async def alist(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = self.list(config, filter=filter, before=before, limit=limit)
        done = object()
        while True:
            item = await self._run(functools.partial(next, items, done))
            if item is done:
                return
            yield item

    async def aput(
        self, config: RunnableConfig, checkpoint: LgCheckpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        encoded = self._encode_put(config, checkpoint, metadata)  # now, on the loop (see _encode_put)
        return await self._run(functools.partial(self._put_encoded, config, checkpoint, *encoded))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        encoded = self._encode_writes(config, writes, task_id, task_path)  # now, on the loop (see _encode_put)
        await self._run(functools.partial(self._put_encoded_writes, config, encoded))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(functools.partial(self.delete_thread, thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(functools.partial(self.delete_for_runs, list(run_ids)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(functools.partial(self.copy_thread, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(functools.partial(self.prune, list(thread_ids), strategy=strategy))


class _Late:
    """The late writes one read of a namespace has found so far, by the checkpoint they are for.

    A late write for checkpoint C is stored against the latest of the moment (at most ``LATE_WINDOW``
    checkpoints after C), and the checkpoint after that one carries it, marked (metadata ``langgraph.late``).
    ``complete``: the read has seen every checkpoint above the ones it asks about (a listing from the top), so it
    never searches. ``search_needed`` is False when the namespace's latest says no checkpoint carries late writes
    (True when the read has not read the latest).
    """

    def __init__(self, name: str, latest: StoredCheckpoint | None, *, complete: bool = False) -> None:
        self.name = name
        self.complete = complete
        self.search_needed = latest is None or m.late_seen(latest.checkpoint)
        self._holders: set[str] = set()
        self._by_target: dict[str, builtins.list[tuple[str, Any]]] = {}
        self._searched: set[str | None] = set()
        self._latest_read = latest is not None
        if latest is not None:
            self.latest(latest)

    def latest(self, latest: StoredCheckpoint) -> None:
        """Adds the late writes the latest checkpoint holds and carries."""
        self.held(latest.checkpoint.id, _held(latest))
        self.carrier(latest.checkpoint)

    def held(self, holder: str | None, writes: Sequence[tuple[str, Any]]) -> None:
        """Adds the late writes among ``writes``, the pending writes checkpoint ``holder`` held."""
        if holder is None or holder in self._holders:
            return
        self._holders.add(holder)
        for item in m.late_of(writes):
            self._by_target.setdefault(item[1][m.LATE_KEY], []).append(item)

    def carrier(self, item: Checkpoint) -> None:
        """Adds the late writes ``item`` carries (the checkpoint it superseded held them)."""
        holder, writes = m.carried_by(self.name, item)
        if writes:
            self.held(holder, writes)

    def search(self, store: Checkpointer, windows: Sequence[str | None]) -> None:
        """Adds the late writes carried by the checkpoints of the search windows below each of ``windows`` (a
        ``before``; None: from the latest, with those the latest holds), one store call per window not searched
        before (and one to read the latest when not read yet)."""
        if not self.search_needed:
            return
        for before in windows:
            if before in self._searched:
                continue
            self._searched.add(before)
            if before is None and not self._latest_read:
                self._latest_read = True
                latest = store.latest(self.name)
                if latest is not None:
                    self.latest(latest)
            try:
                page = store.search_history(self.name, metadata={m.LATE_MARK: "1"}, limit=rules.MAX_PAGE,
                                            before=before)
            except CheckpointNotFound:
                continue  # pruned meanwhile: nothing to add
            for item in page.items:
                self.carrier(item)

    def late_for(self, checkpoint_id: str) -> builtins.list[tuple[str, Any]]:
        """The late writes found for ``checkpoint_id``, in the order the run sent them."""
        found = self._by_target.get(checkpoint_id)
        return sorted(found, key=m.batch_order) if found else []


def _uuid6(text: str) -> bool:
    """Whether ``text`` is a version-6 UUID in LangGraph's form (lower-case hex, hyphenated), as its checkpoint
    ids are: their text order is the order they were made in."""
    try:
        return len(text) == 36 and text == text.lower() and uuid.UUID(text).version == 6
    except ValueError:
        return False


def _reset(var: contextvars.ContextVar[Any], token: contextvars.Token[Any]) -> None:
    """``var.reset(token)``, or nothing when the block ends in another context than it began in (an async generator
    closed by another task): the block has ended either way."""
    try:
        var.reset(token)
    except ValueError:
        pass


def _held(latest: StoredCheckpoint) -> builtins.list[tuple[str, Any]]:
    """The ``(task_id, payload)`` of the pending writes stored against the latest checkpoint."""
    own = latest.checkpoint.id
    return [(w.task_id, w.payload) for w in latest.pending_writes if w.checkpoint_id == own]


def _before(before: Any) -> tuple[str | None, str | None]:
    """The ``checkpoint_id`` and ``checkpoint_ns`` a ``before`` config names (None, None: no ``before``; a config
    without a ``checkpoint_id`` is no ``before``, as for LangGraph's in-memory saver).

    Raises:
        ValidationError: ``before`` is not a config, or names a checkpoint id or namespace that is not one.
    """
    if before is None:
        return None, None
    conf = before.get("configurable") if isinstance(before, dict) else None
    if not isinstance(conf, dict):
        raise ValidationError("before", ('must be a RunnableConfig with configurable["checkpoint_id"]',))
    checkpoint_id, ns = conf.get("checkpoint_id"), conf.get("checkpoint_ns")
    if checkpoint_id is None:
        return None, None
    v.check_id("before", checkpoint_id)
    if ns is not None and not isinstance(ns, str):
        raise ValidationError("before", (f"checkpoint_ns must be a str, got {type(ns).__name__}",))
    return checkpoint_id, ns


def _state_text(
    state: dict[str, Any], checkpoint: dict[str, str], metadata: dict[str, str], parent: Any, hold: Hold
) -> str | None:
    """The JSON text of the state :meth:`ThreadloomSaver.put` built, composed of the texts of its parts, and the
    carried writes in the state replaced by private copies; None (the state left as it is) when a part is not
    one the saver made or validated itself (an encoded type or a parent id that is not plain ASCII text).
    """
    checkpoint_text, metadata_text = m.encoded_text(checkpoint), m.encoded_text(metadata)
    if checkpoint_text is None or metadata_text is None:
        return None
    if parent is None:
        parent_text = "null"
    elif type(parent) is str and parent.isascii():
        parent_text = _quote(parent)
    else:
        return None
    parts = [f'{{"format":{_quote(m.FORMAT)},"checkpoint":{checkpoint_text},"metadata":{metadata_text},'
             f'"parent":{parent_text}']
    carried = state.get("superseded")
    if carried is not None:
        writes = hold.writes
        # the writes' payloads are sealed values of their own: the state holds copies, never the objects
        carried["writes"] = [[w.task_id, v.copy_json(w.payload)] for w in writes]
        parts.append(f',"superseded":{{"id":{_quote(carried["id"])},"writes":[')
        parts.append(",".join(f"[{_quote(w.task_id)},{w.sealed_json()}]" for w in writes))
        parts.append("]}")
    if m.LATE_STATE in state:
        parts.append(f',"{m.LATE_STATE}":true')
    parts.append("}")
    return "".join(parts)


def _event(run_id: str, now: datetime, ns: str, step: Any, source: Any, checkpoint_id: str) -> EventDraft:
    """The ``langgraph.checkpoint`` event of a checkpoint :meth:`ThreadloomSaver.put` stores (``run_id``,
    ``ns`` and ``checkpoint_id`` validated by the caller): built as it is, with its composed text, when the step
    and the source are plain; through the validating constructor otherwise."""
    number = step if isinstance(step, int) else None
    label = str(source)
    payload = {"checkpoint_ns": ns, "step": number, "source": label}
    if (number is None or (type(number) is int and -_STEP_LIMIT < number < _STEP_LIMIT)) and label.isascii():
        text = (f'{{"checkpoint_ns":{_quote(ns)},"step":{"null" if number is None else number},'
                f'"source":{_quote(label)}}}')
        return _build_event(text, run_id, "langgraph.checkpoint", now, payload, checkpoint_id, None, None)
    return EventDraft(run_id=run_id, type="langgraph.checkpoint", timestamp=now, payload=payload,
                      checkpoint_id=checkpoint_id)


def _producer_time(text: Any) -> datetime:
    """The checkpoint's ``ts`` (the producer's clock, kept as a record only), or now when it is not a time."""
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            parsed = datetime.fromisoformat(text)
            if parsed.tzinfo is not None:
                return parsed
    return datetime.now(UTC)


__all__ = ["ThreadBusy", "ThreadloomSaver"]
