"""One simulated seed, end to end: the swarm of faults, the workload, the checks, the verdict.

A seed decides everything: how many nodes (runtimes, each a simulated process with its own clock and store
connection) share the store, which faults this seed suffers (a *swarm*: each enabled fault kind is on for about
half of the seeds, so rare combinations get seeds of their own), the workload (queued runs with effects and
child threads, in about half of the seeds under a child retention that deletes a parent's older children; direct
starts, deletes and re-runs of deleted threads, subscriptions, periodic sweeps; in about one seed in five, access
walks through a rolling release and tenant-scoped reads: :mod:`threadloom.simulations.walks`), and the order of
every step. Faults stop at the heal time; the seed then runs until every queued run finished and the last
release's walk completed (liveness) or the deadline passed.

Run from Python with :func:`simulate_seed`, or from the command line with ``threadloom simulate``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
import random
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import structlog

from threadloom.actors.graph import Graph, NodeContext, Step, effect_keys
from threadloom.actors.graph import _effect_call as effect_call
from threadloom.actors.policies import ChildRetention, ClaimPolicy, ServePolicy, SweepSchedule, WatchPolicy
from threadloom.actors.runs import RunHandle
from threadloom.actors.runtime import GraphRuntime
from threadloom.actors.scheduler import SequentialIds
from threadloom.domain.access import AccessSchemas
from threadloom.domain.errors import ThreadloomError, ValidationError
from threadloom.domain.queue import EntryStatus
from threadloom.domain.values import RetentionPolicy, SweepPolicy
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.logs import structlog_restored
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.simulations.checkers import Oracle
from threadloom.simulations.planted import PLANTED_BUGS, WALK_BUGS, PlantedMemoryStore
from threadloom.simulations.store import Faults, SimStore
from threadloom.simulations.walks import (
    WALK_OPTIONS,
    is_walk_seed,
    releases,
    tenant_of,
    tenant_read,
    walk_completed,
)
from threadloom.simulations.world import (
    EPOCH,
    NodeClock,
    SimForeignThread,
    SimNode,
    SimScheduler,
    SimStuck,
    SimTaskError,
    World,
)

FAULT_KINDS: tuple[str, ...] = ("crash", "pause", "clock", "store", "slow")
"""The fault kinds a seed may suffer: a node crashes (its actors vanish without releasing); a node pauses past
its claims' ttl and resumes; clocks jump forward and back; a store write fails before or after it applied (the
caller sees ``OutcomeUnknown``); store calls are slow."""

STORES: tuple[str, ...] = ("memory", "sqlite")
"""The stores a simulation can run over."""

TTL = timedelta(seconds=2)
RENEW_EVERY = timedelta(milliseconds=600)
HEAL_AT = timedelta(seconds=12)
DEADLINE = timedelta(seconds=90)
JOB, CHILD = "sim-job", "sim-child"


@attrs.frozen(kw_only=True)
class SimConfig:
    """What every seed of a run shares.

    Attributes:
        store: ``memory`` or ``sqlite`` (a temporary file each seed; every node opens its own store on it).
        faults: the fault kinds seeds may suffer (a subset of :data:`FAULT_KINDS`).
        graph: ``module:attr`` naming a user's :class:`~threadloom.actors.graph.Graph` that the queued runs run
            instead of the built-in one (None: built-in).
        plant: test-only planted bugs (a subset of :data:`~threadloom.simulations.planted.PLANTED_BUGS`; memory
            store only: the seed then runs over a :class:`~threadloom.simulations.planted.PlantedMemoryStore`).
    """

    store: str = "memory"
    faults: frozenset[str] = frozenset(FAULT_KINDS)
    graph: str | None = None
    plant: frozenset[str] = frozenset()

    def __attrs_post_init__(self) -> None:
        if self.store not in STORES:
            raise ValidationError("store", (f"must be one of {', '.join(STORES)}, got {self.store!r}",))
        unknown = sorted(set(self.faults) - set(FAULT_KINDS))
        if unknown:
            raise ValidationError("faults", (f"unknown fault kind {unknown[0]!r}; known: {', '.join(FAULT_KINDS)}",))
        bad = sorted(set(self.plant) - set(PLANTED_BUGS))
        if bad:
            raise ValidationError("plant", (f"unknown planted bug {bad[0]!r}; known: {', '.join(PLANTED_BUGS)}",))
        if self.plant and self.store != "memory":
            raise ValidationError("plant", ("planted bugs live in the memory store: use --store memory",))

    def command(self, seed: int) -> str:
        """The command that replays ``seed`` under this configuration."""
        parts = ["threadloom", "simulate", "--seed", str(seed)]
        if self.store != "memory":
            parts += ["--store", self.store]
        if set(self.faults) != set(FAULT_KINDS):
            parts += ["--faults", ",".join(kind for kind in FAULT_KINDS if kind in self.faults) or "none"]
        if self.graph is not None:
            parts += ["--graph", self.graph]
        for bug in sorted(self.plant):
            parts += ["--plant", bug]
        return " ".join(parts)


@attrs.frozen(kw_only=True)
class SeedResult:
    """The verdict of one seed.

    Attributes:
        seed: the seed.
        ok: True when no invariant failed and every queued run finished.
        invariant, detail: the first violation (None when ok).
        trace: the trace, up to and including the violation when there is one.
        trace_hash: SHA-256 of the whole trace (the same seed gives the same hash in any process).
        probes: how often each interesting situation occurred.
        steps: scheduler steps taken; virtual_s: virtual seconds simulated.
    """

    seed: int
    ok: bool
    invariant: str | None
    detail: str | None
    trace: tuple[str, ...]
    trace_hash: str
    probes: dict[str, int]
    steps: int
    virtual_s: float


def load_graph(spec: str) -> Graph:
    """The :class:`Graph` named by ``module:attr``.

    Raises:
        ValidationError: the spec is malformed, the module cannot be imported, or the attribute is no Graph.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValidationError("graph", (f"must be module:attr, got {spec!r}",))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValidationError("graph", (f"cannot import {module_name!r}: {error}",)) from None
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - the user's module: a SyntaxError or sys.exit() on import
        raise ValidationError("graph", (f"importing {module_name!r} raised {type(error).__name__}: {error}",)) from None
    if not hasattr(module, attr):
        raise ValidationError("graph", (f"module {module_name!r} has no attribute {attr!r}",))
    found = getattr(module, attr)
    if callable(found) and not isinstance(found, Graph):
        try:
            found = found()
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - the user's factory (sys.exit() included): one line
            raise ValidationError("graph", (f"{spec}() raised {type(error).__name__}: {error}",)) from None
    if not isinstance(found, Graph):
        raise ValidationError("graph", (f"{spec!r} is not a threadloom Graph",))
    return found


# -- the workload's graphs --------------------------------------------------------------------------------------


def _observer(world: World, oracle: Oracle) -> Callable[[Graph], Graph]:
    """A function giving a graph whose every ``ctx.effect`` call is reported to the oracle when its function
    really runs — in the child graphs its nodes spawn too."""
    seen: dict[int, tuple[Graph, Graph]] = {}  # id -> (the graph, kept so its id is not reused; the observed one)

    def observe(target: Graph) -> Graph:
        if id(target) not in seen:
            observed = Graph(
                target.graph_id,
                {name: wrap(fn) for name, fn in target.nodes.items()},
                entry=target.entry,
                merge=target.merge,
                max_steps=target.max_steps,
                child_retention=target.child_retention,
            )
            seen[id(target)] = (target, observed)
        return seen[id(target)][1]

    def wrap(fn: Callable[[Any, NodeContext], Step]) -> Callable[[Any, NodeContext], Step]:
        def node(state: Any, ctx: NodeContext) -> Step:
            real_effect, real_spawn = ctx.effect, ctx.spawn

            def effect(key: str, fn: Any, **options: Any) -> Any:
                call = effect_call(fn)  # raises for a bad fn as ctx.effect would, before anything else

                def observed(idempotency_key: str) -> Any:
                    who = world.current.node.name if world.current is not None else "?"
                    turn = ctx.turn_id if options.get("scope", "turn") == "turn" else None
                    record = effect_keys(ctx.thread_id, key, turn_id=turn).record
                    oracle.effect_ran(who, ctx.thread_id, record, ctx.run_id, idempotency_key)
                    return call(idempotency_key)

                return real_effect(key, observed, **options)

            def spawn(thread_id: str, graph: Graph, input: Any = None) -> RunHandle:  # noqa: A002
                return real_spawn(thread_id, observe(graph) if isinstance(graph, Graph) else graph, input)

            ctx.effect = effect  # type: ignore[method-assign]
            ctx.spawn = spawn  # type: ignore[method-assign]
            return fn(state, ctx)

        return node

    return observe


def _builtin_graphs(world: World, keep: int | None) -> tuple[Graph, Graph]:
    """The job graph (plan -> act -> finish; ``act`` may spawn a child) and the child graph.

    With ``keep`` (child retention on), each job run spawns a child of its own, ``<thread>.c<n>``, and the job
    graph keeps the newest ``keep`` children of a thread; without it every run of a thread spawns ``<thread>.c``.
    """

    def work(most_ms: int) -> None:
        world.sleep(timedelta(milliseconds=world.rng.randrange(0, most_ms + 1)))

    def plan(state: Any, ctx: NodeContext) -> Step:
        work(400)
        ctx.emit("sim.planned", {"n": state.get("n")})
        return Step(state={**state, "planned": True}, next="act")

    def act(state: Any, ctx: NodeContext) -> Step:
        work(400)
        charged = ctx.effect("charge", lambda: {"charged": state.get("n")})
        work(400)  # reading the tool's answer: a pause here makes the step's commit (with its effect) stale
        if state.get("child"):
            name = f"{ctx.thread_id}.c" if keep is None else f"{ctx.thread_id}.c{state.get('n')}"
            outcome = ctx.spawn(name, child, {"n": state.get("n")}).wait()
            charged = {**charged, "child": outcome.state.get("done")}
        return Step(state={**state, "charged": charged}, next="finish")

    def finish(state: Any, ctx: NodeContext) -> Step:
        work(200)
        return Step(state={**state, "finished": True}, events=[("sim.finished", {"n": state.get("n")})])

    def child_work(state: Any, ctx: NodeContext) -> Step:
        work(400)
        done = ctx.effect("child_charge", lambda: True, scope="thread")  # once for every turn of the child
        return Step(state={**state, "done": done})

    def merge(state: Any, update: Any) -> Any:
        return {**(state or {}), **(update or {})}

    child = Graph(CHILD, {"work": child_work}, entry="work", merge=merge)
    retention = ChildRetention(keep=keep) if keep is not None else None
    job = Graph(
        JOB, {"plan": plan, "act": act, "finish": finish}, entry="plan", merge=merge, child_retention=retention
    )
    return job, child


# -- one seed -----------------------------------------------------------------------------------------------------


class _Seed:
    """The state of one seed's run (the world, the store, the nodes, the workload)."""

    def __init__(self, seed: int, config: SimConfig, user_graph: Graph | None, workdir: str | None) -> None:
        self.seed = seed
        self.config = config
        self.world = world = World(seed)
        rng = world.rng
        self.store_node = world.node("store")
        self.store_clock = NodeClock(self.store_node)
        self.workdir = workdir
        self.opened: list[Checkpointer] = []
        # Walks (about one seed in five, drawn apart so the other seeds run as before; never with a user's graph,
        # nor with a planted bug they cannot reach, so each kept planted seed replays its workload)
        self.walking = user_graph is None and config.plant <= WALK_BUGS and is_walk_seed(seed)
        self.releases = releases(JOB)
        self.rolled = False  # the rolling release to v2 began: nodes booted from now on run v2
        self.release_of: dict[str, int] = {}  # node -> 1 or 2
        self.retired: set[str] = set()  # v1 nodes the rolling release stopped
        self.stores: dict[str, SimStore] = {}
        self.inner = self._open_store("store", self.store_clock, self.releases[0] if self.walking else None)
        self.oracle = Oracle(world, self.inner)
        self.faults = Faults()
        self.kinds = [kind for kind in FAULT_KINDS if kind in config.faults and rng.random() < 0.5]
        if "store" in self.kinds:
            self.faults.fail_before = rng.choice((0.02, 0.05, 0.1))
            self.faults.fail_after = rng.choice((0.02, 0.05, 0.1))
        if "slow" in self.kinds:
            self.faults.slow = rng.choice((0.02, 0.05, 0.1))
            self.faults.slow_for = TTL * rng.choice((0.5, 1, 2))
        if self.walking:
            self.faults.walk_pause = 0.15 if "pause" in self.kinds else 0.0
            self.faults.walk_crash = 0.05 if "crash" in self.kinds else 0.0
            self.faults.pause_node = self.pause
            self.faults.crash_node = self.crash
        # Child retention (about half of the seeds) is drawn from a generator of its own, so that a seed without
        # it runs as it did before retention existed; seeds with planted bugs never use it, so each kept planted
        # seed replays the workload it was found with.
        own = random.Random(f"child-retention:{seed}")
        drawn = own.choice((0, 1, 2)) if own.random() < 0.5 else None
        self.child_keep = drawn if user_graph is None and not config.plant else None
        job, child = _builtin_graphs(world, self.child_keep)
        observe = _observer(world, self.oracle)
        self.graphs = [observe(user_graph)] if user_graph is not None else [observe(job), observe(child)]
        self.main_graph = self.graphs[0]
        self.node_count = rng.choice((2, 2, 3))
        self.retention = RetentionPolicy(max_checkpoints=rng.choice((1, 2, 3)))
        self.sweep_every = timedelta(milliseconds=rng.choice((500, 1000, 3000)))
        self.runtimes: dict[str, GraphRuntime] = {}
        self.entries: list[int] = []
        self.restarts = 0
        self.threads = [f"t{index}" for index in range(1, rng.choice((3, 4, 6)) + 1)]
        self.oracle.log(
            "SEED",
            f"{seed} store={config.store} nodes={self.node_count} faults={','.join(self.kinds) or 'none'} "
            f"threads={len(self.threads)} retention={self.retention.max_checkpoints} "
            f"sweep_every_ms={self.sweep_every // timedelta(milliseconds=1)}"
            + (f" child_keep={self.child_keep}" if self.child_keep is not None else "")
            + (f" planted={','.join(sorted(config.plant))}" if config.plant else "")
            + (" walks" if self.walking else ""),
        )

    def _open_store(self, name: str, clock: NodeClock, access: AccessSchemas | None = None) -> Checkpointer:
        """The real store node ``name`` uses: the shared memory store (in a walk seed, a store of its own with the
        node's declarations over the shared storage), or its own SQLite store on the file."""
        if self.config.store == "memory":
            if name != "store" and not self.walking:
                return self.inner
            shared = self.inner if name != "store" and isinstance(self.inner, InMemoryCheckpointer) else None
            opened: Checkpointer
            if self.config.plant:
                planted = PlantedMemoryStore(self.store_clock, self.config.plant, access=access, shared=shared)
                planted.between = self._stamp_gap
                opened = planted
            else:
                opened = InMemoryCheckpointer(clock=self.store_clock, access=access, shared=shared)
        else:
            from threadloom.persistence.sqlite.store import SqliteCheckpointer

            assert self.workdir is not None
            opened = SqliteCheckpointer.open(os.path.join(self.workdir, "sim.db"), clock=clock, access=access)
        self.opened.append(opened)
        return opened

    def _stamp_gap(self) -> None:
        """The planted ``stamp_unlocked`` bug's gap between deriving a stamp and writing it: other tasks run."""
        self.world.sleep(timedelta(milliseconds=self.world.rng.randrange(0, 300)))

    # -- nodes ------------------------------------------------------------------------------------------------

    def boot(self, name: str) -> None:
        """Starts node ``name``: its store view, its runtime, its queue workers (a task of the world)."""
        world = self.world
        node = world.node(name)
        clock = NodeClock(node)
        release = 2 if self.rolled else 1
        access = self.releases[release - 1] if self.walking else None
        real = self._open_store(name, clock, access)
        memory = self.config.store == "memory"
        store = SimStore(real, node, self.oracle, self.faults, self.store_clock if memory else clock)
        scheduler = SimScheduler(node)
        self.stores[name] = store
        if self.walking:
            self.release_of[name] = release
            self.oracle.log("SEED", f"boot {name} release v{release}")
        walks: dict[str, Any] = {"access_options": WALK_OPTIONS} if self.walking else {}

        def start() -> None:
            runtime = GraphRuntime(
                store,
                clock=clock,
                node_id=name,
                claim_policy=ClaimPolicy(ttl=TTL, renew_every=RENEW_EVERY),
                watch_policy=WatchPolicy(poll_interval=timedelta(seconds=1)),
                ids=SequentialIds(),
                scheduler=scheduler,
                sweep=SweepSchedule(
                    policy=SweepPolicy(retention=self.retention, batch_size=4, tombstone_age=timedelta(seconds=1)),
                    every=self.sweep_every,
                ),
                close_timeout=timedelta(seconds=5),
                **walks,
            )
            self.runtimes[name] = runtime
            runtime.serve(
                {graph.graph_id: graph for graph in self.graphs},
                concurrency=2,
                block=False,
                policy=ServePolicy(
                    lease_ttl=TTL,
                    renew_every=RENEW_EVERY,
                    poll_interval=timedelta(milliseconds=200),
                    busy_delay=timedelta(milliseconds=300),
                    max_attempts=None,
                ),
            )

        world.spawn(node, "boot", start)

    def live_nodes(self) -> list[SimNode]:
        return [
            node
            for name, node in self.world.nodes.items()
            if name in self.runtimes and not node.dead and name not in self.retired
        ]

    def on_some_node(self, name: str, fn: Callable[[GraphRuntime, SimNode], None]) -> None:
        nodes = self.live_nodes()
        if not nodes:
            return
        node = self.world.rng.choice(nodes)
        runtime = self.runtimes[node.name]
        self.world.spawn(node, name, lambda: fn(runtime, node))

    # -- the workload -------------------------------------------------------------------------------------------

    def plan(self) -> None:
        """Schedules the workload and the faults (all chosen by the seed)."""
        rng = self.world.rng
        heal = HEAL_AT
        for index in range(rng.randrange(3, 9)):
            thread = rng.choice(self.threads)
            child = self.config.graph is None and rng.random() < 0.3
            self.at(rng.uniform(0, 0.8) * heal, functools.partial(self.enqueue, thread, index, child))
        for index in range(rng.randrange(0, 3)):
            thread = rng.choice(self.threads)
            self.at(rng.uniform(0, 0.8) * heal, functools.partial(self.direct_start, thread, 100 + index))
        for _ in range(rng.randrange(0, 3)):
            thread = rng.choice(self.threads)
            when = rng.uniform(0.1, 0.7) * heal
            self.at(when, functools.partial(self.delete, thread))
            self.at(when + timedelta(seconds=rng.uniform(0.2, 2)), functools.partial(self.enqueue, thread, 200, False))
        for _ in range(rng.randrange(0, 3)):
            thread = rng.choice(self.threads)
            self.at(rng.uniform(0, 0.8) * heal, functools.partial(self.subscribe, thread))
        if "crash" in self.kinds:
            for _ in range(rng.randrange(1, 3)):
                self.at(rng.uniform(0.05, 0.8) * heal, self.crash)
        if "pause" in self.kinds:
            for _ in range(rng.randrange(1, 4)):
                self.at(rng.uniform(0.05, 0.8) * heal, self.pause)
        if "clock" in self.kinds:
            for _ in range(rng.randrange(1, 4)):
                self.at(rng.uniform(0.05, 0.8) * heal, self.jump)
        if self.walking:
            self.at(rng.uniform(0.15, 0.6) * heal, self.roll)
            for _ in range(rng.randrange(2, 7)):
                self.at(rng.uniform(0, 1.3) * heal, functools.partial(self.read_as_tenant, rng.choice(self.threads)))
        self.at(heal, self.heal)

    def at(self, offset: timedelta, fn: Callable[[], None]) -> None:
        self.world.call_at(EPOCH + offset, fn)

    def tenant(self, thread: str) -> str | None:
        """The tenant of a workload thread: in a walk seed each thread is a tenant's (or the tenant-less)."""
        return tenant_of(thread) if self.walking else None

    def enqueue(self, thread: str, n: int, child: bool) -> None:
        payload: dict[str, Any] = {"n": n}
        if child:
            payload["child"] = True

        def run(runtime: GraphRuntime, _node: SimNode) -> None:
            try:
                entry = runtime.enqueue(thread, self.main_graph.graph_id, payload, self.tenant(thread))
            except ThreadloomError:
                self.oracle.probe("enqueue_failed")
                return
            self.entries.append(entry.entry_id)
            self.oracle.probe("entry_enqueued")

        self.on_some_node("enqueue", run)

    def direct_start(self, thread: str, n: int) -> None:
        def run(runtime: GraphRuntime, _node: SimNode) -> None:
            try:
                handle = runtime.start(thread, self.main_graph, {"n": n}, self.tenant(thread))
            except ThreadloomError as error:
                self.oracle.probe(f"direct_start_refused.{type(error).__name__}")
                return
            try:
                handle.wait()
                self.oracle.probe("direct_run_completed")
            except ThreadloomError as error:
                self.oracle.probe(f"direct_run_ended.{type(error).__name__}")

        self.on_some_node("start", run)

    def delete(self, thread: str) -> None:
        def run(runtime: GraphRuntime, _node: SimNode) -> None:
            try:
                runtime.delete_thread(thread, self.tenant(thread))
                self.oracle.probe("delete_applied")
            except ThreadloomError as error:
                self.oracle.probe(f"delete_refused.{type(error).__name__}")

        self.on_some_node("delete", run)

    def subscribe(self, thread: str) -> None:
        def run(runtime: GraphRuntime, node: SimNode) -> None:
            try:
                subscription = runtime.subscribe(thread, tenant_id=self.tenant(thread))
            except ThreadloomError as error:
                self.oracle.probe(f"subscribe_refused.{type(error).__name__}")
                return
            last = 0
            deadline = self.world.now + HEAL_AT
            while self.world.now < deadline:
                try:
                    event = subscription.get(timeout=timedelta(seconds=1))
                except ThreadloomError as error:
                    self.oracle.probe(f"subscription_ended.{type(error).__name__}")
                    return
                if event is None:
                    if not subscription.active:
                        return
                    continue
                self.oracle.delivered(node.name, thread, last, event)
                last = event.seq
            subscription.cancel()

        self.on_some_node("subscriber", run)

    def read_as_tenant(self, thread: str) -> None:
        """A client's stamp-checked read of ``thread`` (now and then as another tenant) on some node."""
        rng = self.world.rng
        tenant = self.tenant(thread) if rng.random() < 0.7 else rng.choice(("acme", "globex", None))

        def run(_runtime: GraphRuntime, node: SimNode) -> None:
            self.oracle.probe(tenant_read(self.stores[node.name], rng, thread, tenant))

        self.on_some_node("tenant-read", run)

    # -- the rolling release ------------------------------------------------------------------------------------

    def roll(self) -> None:
        """Starts release v2: a v2 node for each live v1 node, and each v1 node stopped a little later."""
        self.rolled = True
        rng = self.world.rng
        old = sorted(node.name for node in self.live_nodes() if self.release_of.get(node.name) == 1)
        self.oracle.log("SEED", f"rolling release to v2: stopping {','.join(old) or 'none'}")
        self.oracle.probe("rolling_release")
        for index, name in enumerate(old, start=1):
            self.boot(f"m{index}")
            later = self.world.now - EPOCH + timedelta(seconds=rng.uniform(0.5, 3))
            self.at(later, functools.partial(self.retire, name))

    def retire(self, name: str) -> None:
        """Stops v1 node ``name`` cleanly (its runtime closes on the node; then the process exits)."""
        node = self.world.nodes[name]
        if node.dead or name in self.retired:
            return
        self.retired.add(name)
        runtime = self.runtimes[name]

        def stop() -> None:
            runtime.close()
            self.oracle.log("SEED", f"retired {name}")
            self.oracle.probe("v1_retired")
            node.dead = True

        self.world.spawn(node, "retire", stop)

    # -- faults -----------------------------------------------------------------------------------------------

    def crash(self, node: SimNode | None = None) -> None:
        if node is None:
            nodes = self.live_nodes()
            if len(nodes) < 1:
                return
            node = self.world.rng.choice(nodes)
        elif node.dead or node.name not in self.runtimes:
            return
        node.dead = True
        self.oracle.log("FAULT", f"crash {node.name}")
        self.oracle.probe("node_crashed")
        self.restarts += 1
        name = f"{node.name.split('r')[0]}r{self.restarts}"
        self.at(self.world.now - EPOCH + TTL * self.world.rng.uniform(0.5, 2), lambda: self.boot(name))

    def pause(self, node: SimNode | None = None) -> None:
        if node is None:
            nodes = [
                node for node in self.live_nodes() if node.paused_until is None or node.paused_until <= self.world.now
            ]
            if not nodes:
                return
            node = self.world.rng.choice(nodes)
        length = TTL * self.world.rng.uniform(1.2, 3)
        node.paused_until = self.world.now + length
        self.oracle.log("FAULT", f"pause {node.name} for {length.total_seconds():.3f}s")
        self.oracle.probe("node_paused")

    def jump(self) -> None:
        rng = self.world.rng
        candidates = self.live_nodes() + ([self.store_node] if self.config.store == "memory" else [])
        if not candidates:
            return
        node = rng.choice(candidates)
        delta = TTL * rng.uniform(-1.5, 1.5)
        node.offset += delta
        self.oracle.log("FAULT", f"clock {node.name} {delta.total_seconds():+.3f}s")
        self.oracle.probe("clock_jumped_back" if delta < timedelta(0) else "clock_jumped_forward")

    def heal(self) -> None:
        self.faults.active = False
        for node in self.world.nodes.values():
            if node.paused_until is not None and node.paused_until > self.world.now:
                node.paused_until = self.world.now
        self.oracle.log("FAULT", "healed")

    # -- the run --------------------------------------------------------------------------------------------------

    def main(self) -> None:
        for index in range(1, self.node_count + 1):
            self.boot(f"n{index}")
        self.plan()
        queue = getattr(self.inner, "queue", None)
        assert queue is not None
        while True:
            self.world.sleep(timedelta(seconds=1))
            if self.world.now - EPOCH < HEAL_AT + TTL:
                continue
            entries = [queue.entry(entry_id) for entry_id in self.entries]
            walked = not self.walking or walk_completed(self.inner, JOB, self.releases[1].for_graph(JOB).hash)
            if walked and all(entry is not None and entry.status.finished for entry in entries):
                for entry in entries:
                    assert entry is not None
                    self.oracle.probe(f"entry_{entry.status.value}")
                    if entry.status is EntryStatus.FAILED:
                        self.oracle.log("SEED", f"entry {entry.entry_id} on {entry.thread_id} FAILED: {entry.error}")
                    if entry.attempts > 1:
                        self.oracle.probe("entry_retried")
                    if entry.status is EntryStatus.FAILED and self.config.graph is None:
                        # The built-in graph's nodes never fail by themselves: a FAILED run is the runtime's.
                        self.oracle.fail(
                            "every queued run completes",
                            f"entry {entry.entry_id} on {entry.thread_id} failed: {entry.error}",
                        )
                self.close_all()
                self.world.stop()
                return
            if self.world.now - EPOCH > DEADLINE:
                open_ = [entry for entry in entries if entry is None or entry.status is EntryStatus.OPEN]
                if not open_:
                    self.oracle.fail("every walk completes", f"the v2 walk of {JOB} is not completed by the deadline")
                    self.world.stop()
                    return
                first = open_[0]
                detail = "an entry vanished" if first is None else (
                    f"entry {first.entry_id} on {first.thread_id} still open after {first.attempts} attempts "
                    f"at the deadline"
                )
                self.oracle.fail("every queued run completes", detail)
                self.world.stop()
                return

    def close_all(self) -> None:
        """Closes every live node's runtime (a clean shutdown, each on its own node) and checks that afterwards
        no claim is held by a run of a closed node."""
        world = self.world
        closing = []
        for name in sorted(self.runtimes):
            node = world.nodes[name]
            if not node.dead:
                closing.append(world.spawn(node, "close", self.runtimes[name].close))
        world.block(lambda: all(task.done for task in closing), world.now + DEADLINE)
        if not all(task.done for task in closing):
            self.oracle.fail("clean shutdown", "a runtime's close() did not return")
            return
        closed = {world.nodes[name].name for name in self.runtimes if not world.nodes[name].dead}
        self.oracle.log("SEED", f"closed {','.join(sorted(closed))}")
        self.oracle.check_released(closed)

    def run(self) -> SeedResult:
        world, oracle = self.world, self.oracle

        def after_step() -> None:
            if oracle.violation is not None:
                world.stop()

        world.after_step = after_step
        try:
            world.run(self.main, until=EPOCH + DEADLINE + timedelta(seconds=30))
            if oracle.violation is None:
                oracle.final_check()
        except SimStuck as error:
            oracle.fail("progress", str(error))
        except SimTaskError as error:
            oracle.fail("tasks end cleanly", str(error))
        finally:
            world.teardown()
            for opened in self.opened:
                opened.close()
        trace = oracle.trace
        digest = hashlib.sha256("\n".join(trace).encode()).hexdigest()
        violation = oracle.violation
        shown = tuple(trace[: oracle.violation_at]) if violation is not None else tuple(trace)
        return SeedResult(
            seed=self.seed,
            ok=violation is None,
            invariant=violation.invariant if violation is not None else None,
            detail=violation.detail if violation is not None else None,
            trace=shown,
            trace_hash=digest,
            probes=dict(sorted(oracle.probes.items())),
            steps=world.steps,
            virtual_s=(world.now - EPOCH).total_seconds(),
        )


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Drops the library's log lines while a seed runs (the trace is the seed's record), then restores
    structlog's configuration as it was: thousands of simulated runs would otherwise flood stderr. pykka's own
    debug lines (actors starting and stopping) are held back too, and so is the report of a thread a node started
    that met :class:`SimForeignThread` (the seed fails with it instead)."""
    pykka_logger = logging.getLogger("pykka")
    pykka_level = pykka_logger.level
    hook = threading.excepthook

    def quiet_hook(args: Any) -> None:
        if not isinstance(args.exc_value, SimForeignThread):
            hook(args)

    with structlog_restored():
        structlog.configure(
            processors=[],
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
            logger_factory=structlog.ReturnLoggerFactory(),
            cache_logger_on_first_use=False,
        )
        pykka_logger.setLevel(logging.WARNING)
        threading.excepthook = quiet_hook
        try:
            yield
        finally:
            threading.excepthook = hook
            pykka_logger.setLevel(pykka_level)


def simulate_seed(seed: int, config: SimConfig | None = None, *, graph: Graph | None = None) -> SeedResult:
    """Runs one seed and returns its verdict (the same seed always gives the same trace and verdict).

    Args:
        seed: the seed, an int >= 0 (what ``threadloom simulate --seed`` takes).
        config: the store, fault kinds, user graph and planted bugs (default: memory, every fault).
        graph: the user graph already loaded (else ``config.graph`` is loaded).

    Raises:
        ValidationError: a bad seed, configuration or graph.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValidationError("seed", (f"must be an int >= 0; got {seed!r}",))
    config = config or SimConfig()
    if graph is None and config.graph is not None:
        graph = load_graph(config.graph)
    workdir = tempfile.mkdtemp(prefix="threadloom-sim-") if config.store == "sqlite" else None
    try:
        with _quiet_logs():
            return _Seed(seed, config, graph, workdir).run()
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def simulate(seeds: Iterable[int], config: SimConfig | None = None) -> Iterable[SeedResult]:
    """Runs each seed in turn, yielding each verdict as it is known."""
    config = config or SimConfig()
    graph = load_graph(config.graph) if config.graph is not None else None
    for seed in seeds:
        yield simulate_seed(seed, config, graph=graph)


def probe_histogram(results: Iterable[SeedResult]) -> Counter[str]:
    """The probes of many seeds added up."""
    total: Counter[str] = Counter()
    for result in results:
        total.update(result.probes)
    return total
