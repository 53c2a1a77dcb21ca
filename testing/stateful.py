"""A hypothesis state machine that checks a store against the in-memory reference.

The machine drives a *subject* store and an :class:`~threadloom.persistence.memory.InMemoryCheckpointer` with the
same random operations - claims, renewals, releases, commits (checkpoints, pending writes, events, effects,
``retract_turn``, fences, metadata), deletes, prunes, compactions, whole sweep passes with guards and
``tombstone_age``, clock advances and every kind of read - and asserts after each that both answered the same:
equal return values, or the same error class with the same fields. Both stores share one
:class:`~threadloom.domain.clock.ManualClock`.

Tokens may differ between stores (a database sequence can skip numbers), so the machine pairs the subject's
tokens with the reference's as claims are granted and compares through that pairing; it also checks that the
subject's tokens strictly increase. Free-text fields that name no rule (``InvalidCommit.reason``,
``ValidationError.problems``, ``ProcessingError.message``) are not compared.

A sweep is compared by whole passes (paging until ``next`` is None): the union of threads pruned and of
tombstones reclaimed must be equal, while ``visited`` only has to be ordered and bounded by ``batch_size`` (which
threads with nothing but a released claim a store still "holds" is its own affair; the contract suite checks
visiting on threads that hold data).

Use::

    from threadloom.testing.stateful import make_state_machine
    from threadloom.testing.harness import MemoryHarness

    TestMemoryAgainstReference = make_state_machine(MemoryHarness).TestCase
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import (
    InvalidCommit,
    OutcomeUnknown,
    ProcessingError,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.rules import DELETING_KEY
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
    TenantPage,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing.harness import START, AlternatingCheckpointer, StoreHarness

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["make_state_machine", "normalize"]

THREADS = ("t0", "t1", "t2", "t3")
PARENTS = (*THREADS, "p")
HOLDERS = ("r0", "r1", "r2")
TENANTS = (None, "a", "b")
KEYS = ("k0", "k1", "k2")
GRAPHS = ("g0", "g1")
TICK = timedelta(seconds=1)
READS = (
    "checkpoint", "history", "search_history", "children", "events", "effect", "lookup_run", "threads", "incomplete",
    "tenants",
)
CP_METADATA: tuple[dict[str, str], ...] = ({}, {"kind": "x"}, {"kind": "y", "n": "1"}, {"n": "1"})
"""The metadata a committed checkpoint carries (``search_history`` filters by it)."""
FULL_EVERY = 4
"""Every how many steps the machine compares everything (effects, registries, children), not only the logs."""
BOGUS = 999_999_999
"""A token no store issues in a test (the same on both sides)."""

Handle = tuple[int, int]
"""A granted claim's token on the reference and on the subject."""

_TOKEN_FIELDS = frozenset({"token", "fencing_token", "current"})
_FREE_TEXT = {
    InvalidCommit: {"reason"},
    ValidationError: {"problems"},
    ProcessingError: {"message"},
    OutcomeUnknown: {"message"},
}


def normalize(value: Any, tokens: dict[int, int] | None = None) -> Any:
    """A comparable form of a store's answer: attrs values as ``(class name, fields)``, tokens translated.

    Args:
        value: a return value or a threadloom error.
        tokens: the subject's tokens to the reference's (None: the value is the reference's own).
    """
    kind = type(value)
    if attrs.has(kind):
        drop = _FREE_TEXT.get(kind, ())
        fields = []
        for field in attrs.fields(kind):
            if field.name in drop:
                continue
            item = getattr(value, field.name)
            if field.name in _TOKEN_FIELDS and isinstance(item, int) and tokens is not None:
                item = tokens.get(item, ("unpaired subject token", item))
            fields.append((field.name, normalize(item, tokens)))
        return (kind.__name__, tuple(fields))
    if isinstance(value, list):
        return [normalize(item, tokens) for item in value]
    if isinstance(value, tuple):
        return tuple(normalize(item, tokens) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(normalize(item, tokens) for item in value)
    if isinstance(value, dict):
        return {key: normalize(item, tokens) for key, item in value.items()}
    return value


def _run(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except ThreadloomError as error:
        return ("error", error)


class _Guard:
    """A deterministic sweep guard: fixed protected runs per thread, or an error."""

    def __init__(self, protected: dict[str, frozenset[str]], fail: bool) -> None:
        self.protected_runs = protected
        self.fail = fail

    def protected(self, thread_ids: tuple[str, ...]) -> dict[str, frozenset[str]]:
        if self.fail:
            raise RuntimeError("the guard is down")
        return {key: value for key, value in self.protected_runs.items() if key in thread_ids}


_SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=4)
JSON = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=2),
    st.dictionaries(st.text(max_size=3), _SCALARS | st.lists(_SCALARS, max_size=2), max_size=2),
)
"""Small JSON values (built once: building strategies on every draw is what makes a machine slow)."""

THREAD = st.sampled_from(THREADS)
HOLDER = st.sampled_from(HOLDERS)
TENANT = st.sampled_from(TENANTS)
GRAPH = st.sampled_from(GRAPHS)
STATUS = st.sampled_from(list(CheckpointStatus))
STATE = st.dictionaries(st.sampled_from("xyz"), JSON, max_size=2)
OTHER_THREAD = {thread: st.sampled_from([t for t in THREADS if t != thread]) for thread in THREADS}
OTHER_PARENT = {thread: st.sampled_from([p for p in PARENTS if p != thread]) for thread in THREADS}
SMALL = {n: st.integers(0, n) for n in range(1, 16)}
EFFECT_KEYS = st.lists(st.sampled_from(KEYS), unique=True, max_size=2)
PROTECTED = st.dictionaries(THREAD, st.frozensets(HOLDER, max_size=2), max_size=2)
RUNS = st.frozensets(HOLDER)
STATUSES = st.none() | st.frozensets(st.sampled_from(list(ThreadStatus)))
RETENTION = st.builds(
    RetentionPolicy,
    max_age=st.none() | st.integers(1, 4).map(lambda n: n * TICK),
    max_checkpoints=st.none() | st.integers(1, 3),
    max_events=st.none() | st.integers(0, 4),
)


@functools.cache
def _index(size: int) -> st.SearchStrategy[int]:
    return st.integers(0, size - 1)


def pick(data: st.DataObject, items: Any, label: str) -> Any:
    """One of ``items`` (a sequence), drawn through a cached strategy."""
    items = list(items)
    return items[data.draw(_index(len(items)), label=label)]


def _is_harness_class(subject: object) -> TypeIs[type[StoreHarness]]:
    """True for a :class:`StoreHarness` subclass; False for a callable that builds a store."""
    return isinstance(subject, type) and issubclass(subject, StoreHarness)


def make_state_machine(
    subject: type[StoreHarness] | Callable[[ManualClock], Checkpointer],
    *,
    cleanup: Callable[[Checkpointer], None] | None = None,
    pair: bool = False,
    max_examples: int = 100,
    step_count: int = 30,
) -> type[RuleBasedStateMachine]:
    """Builds a state machine that compares ``subject`` with the reference store, step by step.

    Args:
        subject: a :class:`StoreHarness` subclass whose stores take its ``clock`` (not a database clock), or a
            callable that builds the subject store over the clock it is given.
        cleanup: called with the subject store after each example (callable subjects only; a harness cleans up
            itself).
        pair: with a harness whose storage is shared, the subject sends each call to ``open()`` or ``sibling()``
            in turn (:class:`AlternatingCheckpointer`).
        max_examples, step_count: the default hypothesis settings of the returned machine's ``TestCase``.

    Returns:
        A ``RuleBasedStateMachine`` subclass; use its ``TestCase`` as a test class.
    """

    class StoreMatchesReference(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.harness: StoreHarness | None = None
            if _is_harness_class(subject):
                self.harness = subject()
                if self.harness.database_clock:
                    raise ValueError(f"{subject.__name__} reads a database clock: it cannot share a ManualClock")
                self.clock = self.harness.clock
                opened = self.harness.open()
                self.subject = AlternatingCheckpointer(opened, self.harness.sibling()) if pair else opened
            else:
                self.clock = ManualClock(START)
                self.subject = subject(self.clock)
            self.reference = InMemoryCheckpointer(self.clock)
            self.handles: dict[str, list[Handle]] = {thread_id: [] for thread_id in THREADS}
            self.paired: dict[int, int] = {BOGUS: BOGUS}
            self.last_subject_token = 0
            self.counter = 0
            self.checkpoint_ids: list[str] = []
            self.top_seq: dict[str, int] = {}
            self.steps = 0
            self.spawned: dict[str, list[str]] = {parent: [] for parent in PARENTS}

        def teardown(self) -> None:
            self.reference.close()
            try:
                self.subject.close()
            finally:
                if self.harness is not None:
                    self.harness.cleanup()
                elif cleanup is not None:
                    cleanup(self.subject)

        # -- comparing ----------------------------------------------------------------------------------------------

        def both(
            self,
            label: str,
            call: Callable[[Checkpointer, Callable[[Handle], int]], Any],
            on_ok: Callable[[Any, Any], None] | None = None,
        ) -> tuple[tuple[str, Any], tuple[str, Any]]:
            """Runs ``call`` on both stores (with each store's tokens) and asserts they answered the same."""
            ref = _run(lambda: call(self.reference, lambda handle: handle[0]))
            sub = _run(lambda: call(self.subject, lambda handle: handle[1]))
            if ref[0] == sub[0] == "ok" and on_ok is not None:
                on_ok(ref[1], sub[1])
            if "(" not in label:  # a rule's own call, not the invariant's
                event(f"{label}: " + ("ok" if ref[0] == "ok" else type(ref[1]).__name__))
            expected = (ref[0], normalize(ref[1]))
            actual = (sub[0], normalize(sub[1], self.paired))
            assert expected == actual, f"{label}:\n  reference: {ref[1]!r}\n  subject:   {sub[1]!r}"
            return ref, sub

        def note_events(self, records: Any) -> None:
            for record in records or ():
                self.top_seq[record.thread_id] = max(self.top_seq.get(record.thread_id, 0), record.seq)

        def seq(self, data: st.DataObject, thread_id: str, label: str) -> int:
            """An event number around the thread's log: inside it, at its end, past it, or inside a deleted log."""
            return pick(data, range(self.top_seq.get(thread_id, 0) + 3), label)

        # -- drawing ------------------------------------------------------------------------------------------------

        def handle(self, data: st.DataObject, thread_id: str) -> Handle:
            own = self.handles[thread_id]
            anyone = [handle for handles in self.handles.values() for handle in handles]
            choice = data.draw(SMALL[15], label="handle kind")
            if choice <= 11 and own:
                return own[-1]
            if choice <= 13 and own:
                return pick(data, own, "older handle")
            if choice == 14 and anyone:
                return pick(data, anyone, "another thread's handle")
            return (BOGUS, BOGUS)

        def ticks(self, data: st.DataObject, low: int, high: int, label: str) -> timedelta:
            return TICK * (low + pick(data, range(high - low + 1), label))

        def retention(self, data: st.DataObject) -> RetentionPolicy:
            return data.draw(RETENTION, label="retention")

        # -- claims ---------------------------------------------------------------------------------------------------

        @initialize(data=st.data())
        def claim_every_thread(self, data: st.DataObject) -> None:
            for thread_id in THREADS:
                self.claim_thread(data, thread_id)

        @rule(data=st.data())
        def claim(self, data: st.DataObject) -> None:
            self.claim_thread(data, data.draw(THREAD, label="thread"))

        def claim_thread(self, data: st.DataObject, thread_id: str) -> None:
            request = ClaimRequest(
                holder=data.draw(HOLDER, label="holder"),
                ttl=self.ticks(data, 1, 4, "ttl"),
                tenant_id=data.draw(TENANT, label="tenant"),
            )

            def granted(ref: Any, sub: Any) -> None:
                assert sub.token > self.last_subject_token, (
                    f"subject token {sub.token} does not exceed {self.last_subject_token}"
                )
                self.last_subject_token = sub.token
                self.paired[sub.token] = ref.token
                self.handles[thread_id].append((ref.token, sub.token))

            self.both("claim", lambda s, _tok: s.claim(thread_id, request), granted)

        @rule(data=st.data())
        def renew(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            handle = self.handle(data, thread_id)
            ttl = self.ticks(data, 1, 4, "ttl")
            self.both("renew", lambda s, tok: s.renew(thread_id, tok(handle), ttl))

        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            handle = self.handle(data, thread_id)
            self.both("release", lambda s, tok: s.release(thread_id, tok(handle)))

        @rule(half_ticks=st.integers(1, 6))
        def advance(self, half_ticks: int) -> None:
            self.clock.advance(TICK * half_ticks / 2)

        # -- commits and deletes -----------------------------------------------------------------------------------

        @rule(data=st.data())
        def commit(self, data: st.DataObject) -> None:
            self.clock.advance(TICK / 2 * pick(data, (0, 0, 1), "time passes"))
            thread_id = data.draw(THREAD, label="thread")
            handle = self.handle(data, thread_id)
            history = self.reference.history(thread_id, limit=1000)
            latest = history[0].id if history else None
            with_checkpoint = data.draw(SMALL[3], label="checkpoint?") > 0
            retract = data.draw(SMALL[5], label="retract?") == 0
            cp = None
            if with_checkpoint:
                parent = latest  # with retract_turn too: the cut comes after the checks
                if data.draw(SMALL[9], label="wrong parent?") == 0:
                    parent = pick(data, [None, *self.checkpoint_ids], "wrong parent")
                cp_id = None
                if history and data.draw(SMALL[9], label="duplicate id?") == 0:
                    cp_id = pick(data, [c.id for c in history], "duplicate id")
                if cp_id is None or cp_id == parent:
                    self.counter += 1
                    cp_id = f"c{self.counter}"
                origin = None
                if data.draw(SMALL[2], label="origin?") == 0:
                    origin = CheckpointOrigin(
                        parent_thread=data.draw(OTHER_PARENT[thread_id], label="parent"),
                        parent_checkpoint=pick(data, [None, "x1", "x2"], "parent cp"),
                    )
                cp = Checkpoint(
                    id=cp_id,
                    parent=parent,
                    thread_id=thread_id,
                    run_id=data.draw(HOLDER, label="run"),
                    status=data.draw(STATUS, label="status"),
                    created_at=self.clock.now() + timedelta(days=pick(data, range(-3, 4), "skew")),
                    state=data.draw(STATE, label="state"),
                    graph_id=data.draw(GRAPH, label="graph"),
                    tenant_id=data.draw(TENANT, label="cp tenant"),
                    origin=origin,
                    metadata=pick(data, CP_METADATA, "cp metadata"),
                )
            resulting = cp.id if cp is not None else latest
            writes = []
            for index in range(data.draw(SMALL[2], label="pending writes")):
                target = resulting
                if target is None or data.draw(SMALL[7], label="misdirect?") == 0:
                    target = pick(data, ["c0", *self.checkpoint_ids], "misdirected")
                writes.append(
                    PendingWrite(
                        checkpoint_id=target,
                        task_id=f"task{index}",
                        node_id="n",
                        payload=data.draw(JSON, label="payload"),
                    )
                )
            drafts = [
                EventDraft(
                    run_id=data.draw(HOLDER, label="event run"),
                    type="e",
                    timestamp=self.clock.now() - timedelta(days=pick(data, range(-2, 3), "ts")),
                    payload=data.draw(JSON, label="event payload"),
                )
                for _ in range(data.draw(SMALL[3], label="events"))
            ]
            keys = data.draw(EFFECT_KEYS, label="effects")
            effects = [
                EffectRecord(key=key, run_id="r0", recorded_at=self.clock.now(), result=data.draw(JSON, label="result"))
                for key in keys
            ]
            fence = None
            if data.draw(SMALL[4], label="fence?") == 0:
                other = data.draw(OTHER_THREAD[thread_id], label="fence thread")
                fence = (other, self.handle(data, other))
            metadata = pick(
                data, [None, None, None, {"m": "1"}, {"m": "2", "n": "x"}, {DELETING_KEY: "true"}], "metadata"
            )

            def call(s: Checkpointer, tok: Callable[[Handle], int]) -> Any:
                return s.commit(
                    thread_id,
                    Commit(
                        token=tok(handle),
                        checkpoint=cp,
                        pending_writes=writes,
                        events=drafts,
                        effects=effects,
                        retract_turn=retract,
                        fence=None if fence is None else (fence[0], tok(fence[1])),
                        metadata=metadata,
                    ),
                )

            def applied(ref: Any, _sub: Any) -> None:
                if cp is not None:
                    self.checkpoint_ids.append(cp.id)
                    if cp.origin is not None and thread_id not in self.spawned[cp.origin.parent_thread]:
                        self.spawned[cp.origin.parent_thread].append(thread_id)
                self.note_events(ref)

            self.both("commit", call, applied)

        # The same operations under second names weight them up among the rules hypothesis picks from.
        @rule(data=st.data())
        def commit_again(self, data: st.DataObject) -> None:
            self.commit(data)

        @rule(data=st.data())
        def commit_once_more(self, data: st.DataObject) -> None:
            self.commit(data)

        @rule(data=st.data())
        def claim_again(self, data: st.DataObject) -> None:
            self.claim(data)

        @rule(data=st.data())
        def delete(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            handle = self.handle(data, thread_id)
            fence = None
            if data.draw(SMALL[3], label="fence?") == 0:
                other = data.draw(OTHER_THREAD[thread_id], label="fence thread")
                fence = (other, self.handle(data, other))
            self.both(
                "delete_thread",
                lambda s, tok: s.delete_thread(
                    thread_id, tok(handle), fence=None if fence is None else (fence[0], tok(fence[1]))
                ),
            )

        @rule(data=st.data())
        def retire(self, data: st.DataObject) -> None:
            """Deletes a thread under its newest claim, lets its tombstone age and sweeps: reclamation happens."""
            thread_id = data.draw(THREAD, label="thread")
            if self.handles[thread_id]:
                handle = self.handles[thread_id][-1]
                self.both("delete_thread", lambda s, tok: s.delete_thread(thread_id, tok(handle)))
            self.clock.advance(TICK * 2)
            policy = SweepPolicy(
                tombstone_age=pick(data, (TICK, TICK * 2), "tombstone_age"),  # 2 ticks: exactly its age, kept
                batch_size=1 + pick(data, range(3), "batch_size"),
            )

            def whole_pass(s: Checkpointer, _tok: Any) -> frozenset[str]:
                gone: set[str] = set()
                after = None
                while True:
                    page = s.sweep(policy, None, after=after)
                    gone.update(page.reclaimed)
                    if page.next is None:
                        return frozenset(gone)
                    after = page.next

            ref, _sub = self.both("sweep", whole_pass)
            if ref[0] == "ok":
                event(f"retire reclaimed {bool(ref[1])}")

        # -- retention ---------------------------------------------------------------------------------------------

        @rule(data=st.data())
        def prune(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            policy = self.retention(data)
            self.both("prune", lambda s, _tok: s.prune(thread_id, policy))

        @rule(data=st.data())
        def compact(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            before_seq = self.seq(data, thread_id, "before_seq")
            self.both("compact_events", lambda s, _tok: s.compact_events(thread_id, before_seq))

        @rule(data=st.data())
        def sweep(self, data: st.DataObject) -> None:
            # Sweeps run on a schedule, after time has passed: that is when tombstones come of age.
            self.clock.advance(TICK * pick(data, (0, 0, 1, 2, 4), "age first"))
            policy = SweepPolicy(
                retention=self.retention(data),
                batch_size=1 + pick(data, range(3), "batch_size"),
                tombstone_age=pick(data, [None, TICK / 2, TICK, TICK * 2, TICK * 3], "tombstone_age"),
            )
            protected = data.draw(PROTECTED, label="protected")
            guard = _Guard(protected, fail=data.draw(SMALL[9], label="guard fails?") == 0)

            def whole_pass(s: Checkpointer, _tok: Any) -> tuple[frozenset[str], frozenset[str]]:
                pruned: set[str] = set()
                gone: set[str] = set()
                after = None
                for _ in range(10_000):
                    page = s.sweep(policy, guard, after=after)
                    assert len(page.visited) <= policy.batch_size, page
                    assert list(page.visited) == sorted(page.visited), page
                    assert after is None or all(thread_id > after for thread_id in page.visited), page
                    assert set(page.pruned) | set(page.reclaimed) <= set(page.visited), page
                    pruned.update(page.pruned)
                    gone.update(page.reclaimed)
                    if page.next is None:
                        return frozenset(pruned), frozenset(gone)
                    after = page.next
                raise AssertionError("the sweep never ended")

            if not guard.fail:
                ref, _sub = self.both("sweep", whole_pass)
                if ref[0] == "ok":
                    event(f"sweep pruned {bool(ref[1][0])} reclaimed {bool(ref[1][1])}")
                return
            # A failing guard fails the first page that holds a thread; a store that holds no thread at all
            # never asks it, and which threads with nothing but a released claim a store holds is its own affair.
            ref = _run(lambda: whole_pass(self.reference, None))
            sub = _run(lambda: whole_pass(self.subject, None))
            for outcome in (ref, sub):
                if outcome[0] == "error":
                    assert isinstance(outcome[1], ProcessingError), outcome
                else:
                    assert outcome[1] == (frozenset(), frozenset()), outcome

        # -- reads -------------------------------------------------------------------------------------------------
        # One rule draws the kind of read, so that reads do not crowd out the steps that change state.

        @rule(data=st.data())
        def read(self, data: st.DataObject) -> None:
            kind = pick(data, READS, "read")
            getattr(self, f"read_{kind}")(data)

        def read_checkpoint(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            cp_id = pick(data, ["nope", *self.checkpoint_ids], "checkpoint")
            self.both("checkpoint", lambda s, _tok: s.checkpoint(thread_id, cp_id))

        def read_history(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            limit = 1 + pick(data, range(4), "limit")
            before = pick(data, [None, "nope", *self.checkpoint_ids], "before")
            self.both("history", lambda s, _tok: s.history(thread_id, limit=limit, before=before))

        def read_search_history(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            metadata = pick(data, [*CP_METADATA, {"kind": "z"}], "filter")
            limit = 1 + pick(data, range(3), "limit")
            scan = 1 + pick(data, range(4), "scan")
            before = pick(data, [None, "nope", *self.checkpoint_ids], "before")
            self.both(
                "search_history",
                lambda s, _tok: s.search_history(thread_id, metadata=metadata, limit=limit, before=before, scan=scan),
            )

        def read_children(self, data: st.DataObject) -> None:
            parent = pick(data, PARENTS, "parent")
            limit = data.draw(SMALL[3], label="limit")
            after = pick(data, (None, *THREADS, *self.spawned[parent], *self.spawned[parent]), "after")
            self.both("children", lambda s, _tok: s.children(parent, limit=limit, after=after))

        def read_events(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            after_seq = self.seq(data, thread_id, "after_seq")
            limit = 1 + pick(data, range(5), "limit")
            self.both("events_after", lambda s, _tok: s.events_after(thread_id, after_seq, limit))
            self.both(
                "await_events_after",
                lambda s, _tok: s.await_events_after(
                    thread_id, after_seq, limit, timedelta(0), cancel=threading.Event()
                ),
            )

        def read_effect(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            key = pick(data, KEYS, "key")
            self.both("effect", lambda s, _tok: s.effect(thread_id, key))

        def read_lookup_run(self, data: st.DataObject) -> None:
            thread_id = data.draw(THREAD, label="thread")
            runs = data.draw(RUNS, label="runs")
            self.both("lookup_run", lambda s, _tok: s.lookup_run(thread_id, runs))

        def cursor(self, data: st.DataObject) -> ThreadCursor | None:
            if pick(data, (True, False), "cursor?"):
                return None
            return ThreadCursor(
                updated_at=self.clock.now() - TICK * pick(data, range(9), "cursor age") / 2,
                thread_id=data.draw(THREAD, label="cursor thread"),
            )

        def read_threads(self, data: st.DataObject) -> None:
            since = pick(data, (None, *range(9)), "since")
            query = ThreadQuery(
                tenant_id=data.draw(TENANT, label="tenant"),
                limit=1 + pick(data, range(3), "limit"),
                after=self.cursor(data),
                statuses=data.draw(STATUSES, label="statuses"),
                updated_since=None if since is None else self.clock.now() - TICK * since / 2,
                graph_id=pick(data, (None, *GRAPHS), "graph"),
            )
            self.both("threads", lambda s, _tok: s.threads(query))

        def read_incomplete(self, data: st.DataObject) -> None:
            tenant = data.draw(TENANT, label="tenant")
            limit = 1 + pick(data, range(3), "limit")
            after = self.cursor(data)
            self.both("incomplete", lambda s, _tok: s.incomplete(tenant, limit=limit, after=after))

        def read_tenants(self, data: st.DataObject) -> None:
            limit = 1 + pick(data, range(3), "limit")
            after = pick(data, (None, "a", "b", "c"), "after")
            self.both("tenants", lambda s, _tok: s.tenants(limit=limit, after=after))

        @invariant()
        def every_thread_reads_the_same(self) -> None:
            self.steps += 1
            for thread_id in THREADS:
                self.both(f"latest({thread_id})", lambda s, _tok: s.latest(thread_id))
                self.both(f"events_after({thread_id}, 0)", lambda s, _tok: s.events_after(thread_id, 0, 10_000))
            if self.steps % FULL_EVERY == 0:
                self.everything_reads_the_same()

        def everything_reads_the_same(self) -> None:
            """Effects, the registry of every tenant and every parent's children (every few steps: it costs)."""
            for thread_id in THREADS:
                for key in KEYS:
                    self.both(f"effect({thread_id}, {key})", lambda s, _tok: s.effect(thread_id, key))
            for tenant in TENANTS:
                query = ThreadQuery(tenant_id=tenant, limit=ThreadQuery.MAX_LIMIT)
                self.both(f"threads({tenant})", lambda s, _tok: s.threads(query))
                self.both(f"incomplete({tenant})", lambda s, _tok: s.incomplete(tenant, limit=ThreadQuery.MAX_LIMIT))
            self.both("tenants()", lambda s, _tok: s.tenants(limit=TenantPage.MAX_LIMIT))
            for parent in PARENTS:
                for after in (None, *self.spawned[parent]):
                    self.both(
                        f"children({parent}, after={after})",
                        lambda s, _tok: s.children(parent, limit=1000, after=after),
                    )
            for thread_id in THREADS:  # inside a deleted or reclaimed log, and at the end of the log
                for after_seq in sorted({1, self.top_seq.get(thread_id, 0)}):
                    self.both(
                        f"events_after({thread_id}, {after_seq})",
                        lambda s, _tok: s.events_after(thread_id, after_seq, 10_000),
                    )

    StoreMatchesReference.__name__ = StoreMatchesReference.__qualname__ = (
        f"{getattr(subject, '__name__', 'Store')}MatchesReference"
    )
    StoreMatchesReference.TestCase.settings = settings(
        max_examples=max_examples, stateful_step_count=step_count, deadline=None
    )
    return StoreMatchesReference
