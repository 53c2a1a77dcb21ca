"""The deterministic simulation (DESIGN §7): determinism, thousands of clean seeds, planted bugs caught,
regression seeds replayed, the world's own mechanics, and ``threadloom simulate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from threadloom.cli.main import cli
from threadloom.cli.simulate import run_seeds
from threadloom.domain.access import WalkRecord
from threadloom.domain.errors import ValidationError
from threadloom.domain.values import Checkpoint, CheckpointStatus, ClaimRequest, Commit
from threadloom.persistence import base
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.simulations.checkers import CHECKS, Oracle
from threadloom.simulations.planted import PlantedMemoryStore
from threadloom.simulations.regressions import REGRESSION_SEEDS
from threadloom.simulations.run import FAULT_KINDS, JOB, PLANTED_BUGS, SimConfig, load_graph, simulate_seed
from threadloom.simulations.walks import is_walk_seed, releases, walk_thread
from threadloom.simulations.world import EPOCH, SimCrash, SimScheduler, SimStuck, SimTaskError, World

CI_SEEDS = 2000
"""Seeds the clean run covers (the issue asks for at least 2,000 in CI)."""


def _hashes(seeds: range, hash_seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-m", "threadloom", "--json", "simulate", "--seeds", str(len(seeds)), "--seed", str(seeds[0])],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["trace_hashes"]


# -- determinism ------------------------------------------------------------------------------------------------------


def test_the_same_seeds_give_the_same_traces_in_processes_with_different_hash_seeds():
    first = _hashes(range(0, 30), "1")
    second = _hashes(range(0, 30), "4242")
    assert len(first) == 30
    assert first == second
    assert len(set(first.values())) == 30  # every seed is its own run


def test_a_seed_replayed_in_process_gives_the_same_trace_byte_for_byte():
    one = simulate_seed(17)
    two = simulate_seed(17)
    assert one.trace == two.trace and one.trace_hash == two.trace_hash
    assert one.steps == two.steps and one.probes == two.probes


def test_different_seeds_run_differently():
    assert simulate_seed(1).trace_hash != simulate_seed(2).trace_hash


# -- the clean run ----------------------------------------------------------------------------------------------------


@pytest.mark.timeout(1200)  # about 3 minutes on two quiet cores; a loaded machine takes twice that
def test_two_thousand_seeds_pass_with_every_fault_kind():
    results = list(run_seeds(SimConfig(), range(CI_SEEDS), jobs=2))
    failed = [(r.seed, r.invariant, r.detail) for r in results if not r.ok]
    assert len(results) == CI_SEEDS
    assert failed == []
    probes: Counter[str] = Counter()
    for result in results:
        probes.update(result.probes)
    # The workload must stay interesting: each situation the checkers exist for occurs, many times.
    for probe in (
        "takeover",
        "run_recovered",
        "stale_token_refused.commit",
        "stale_token_refused.renew",
        "outcome_unknown_applied.commit",
        "outcome_unknown_not_applied.commit",
        "lease_taken_over",
        "effect_rerun_uncommitted",
        "thread_deleted",
        "tombstone_reclaimed",
        "thread_pruned",
        "subscription_event",
        "child_checkpoint",
        "child_deleted_fenced_by_parent",
        "node_crashed",
        "node_paused",
        "clock_jumped_back",
        "clock_jumped_forward",
        "slow_call",
        # access walks (about one seed in five)
        "rolling_release",
        "v1_retired",
        "walk_completed",
        "walk_replaced",
        "walk_lease_takeover",
        "walk_thread_checked",
        "fence_refused.stamp_thread",
        "walker_paused_mid_page",
        "walker_crashed_mid_page",
        "outcome_unknown_applied.stamp_thread",
        "tenant_rows_returned",
        "tenant_read.export_tenant",
    ):
        assert probes[probe] >= 10, (probe, probes[probe])
    walked = sum(1 for r in results if r.probes.get("rolling_release"))
    assert CI_SEEDS // 10 < walked < CI_SEEDS // 3  # walks in a fraction of the seeds (CI time)


def test_seeds_pass_over_sqlite():
    results = list(run_seeds(SimConfig(store="sqlite"), range(40), jobs=1))
    assert [(r.seed, r.invariant, r.detail) for r in results if not r.ok] == []
    assert sum(r.probes.get("takeover", 0) for r in results) > 0


# -- planted bugs -------------------------------------------------------------------------------------------------------


EXPECTED_INVARIANTS = {
    "commit_unfenced": {"no stale-token write applied"},
    "renew_unfenced": {"no stale-token write applied"},
    "effect_unfenced": {"effects recorded only by fenced commits", "effects never run again once recorded"},
    "sweep_unguarded": {"retention keeps protected checkpoints"},
    "seq_reuse_after_delete": {"event numbers never reused", "tombstone numbering"},
    "stamp_unfenced": {"no stamp from a deposed walker"},
    # deriving outside the write transaction: a commit landing in between is overwritten with older attributes
    # (and the fence, checked with the derivation, may be lost by the time the stamp is written)
    "stamp_unlocked": {"a stamp equals its thread's attributes", "no stamp from a deposed walker"},
}


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_each_planted_bug_is_caught_within_a_thousand_seeds(bug):
    config = SimConfig(plant=frozenset([bug]))
    caught = None
    for seed in range(1000):
        result = simulate_seed(seed, config)
        if not result.ok and result.invariant in EXPECTED_INVARIANTS[bug]:
            caught = result
            break
    assert caught is not None, f"{bug} was not caught within 1000 seeds"
    assert caught.trace[-1].split()[1] == "CHECK"  # the trace ends with the violation
    assert config.command(caught.seed) == f"threadloom simulate --seed {caught.seed} --plant {bug}"


def test_a_seed_that_plants_bugs_runs_over_the_planted_store_and_a_clean_seed_over_the_reference(monkeypatch):
    built: list[type] = []
    real_init = InMemoryCheckpointer.__init__

    def recording_init(self, *args, **kwargs):
        built.append(type(self))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(InMemoryCheckpointer, "__init__", recording_init)
    assert is_walk_seed(3) and not is_walk_seed(4)
    simulate_seed(3, SimConfig(plant=frozenset(["sweep_unguarded"])))  # a bug walks cannot reach: no walks
    assert built == [PlantedMemoryStore]
    built.clear()
    simulate_seed(4)
    assert built == [InMemoryCheckpointer]
    built.clear()
    simulate_seed(3, SimConfig(plant=frozenset(["stamp_unfenced"])))  # a walk seed: a planted store per node
    assert len(built) > 2 and set(built) == {PlantedMemoryStore}
    built.clear()
    simulate_seed(3)
    assert len(built) > 2 and set(built) == {InMemoryCheckpointer}


def test_planted_bugs_need_the_memory_store():
    with pytest.raises(ValidationError, match="plant"):
        SimConfig(store="sqlite", plant=frozenset(["commit_unfenced"]))


# -- regression seeds ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kept", REGRESSION_SEEDS, ids=lambda k: f"{k.seed}-{k.store}-{'+'.join(k.plant) or 'real'}")
def test_regression_seeds_keep_their_verdicts(kept):
    result = simulate_seed(kept.seed, SimConfig(store=kept.store, plant=frozenset(kept.plant)))
    if kept.plant:
        assert not result.ok, f"seed {kept.seed} no longer catches {kept.plant}"
    else:
        assert result.ok, (result.invariant, result.detail)


# -- access walks ------------------------------------------------------------------------------------------------------


def test_a_walk_seed_rolls_from_v1_to_v2_and_completes_the_v2_walk():
    assert is_walk_seed(13)
    result = simulate_seed(13)
    assert result.ok, (result.invariant, result.detail)
    trace = "\n".join(result.trace)
    assert " walks" in result.trace[0]
    assert "boot n1 release v1" in trace and "release v2" in trace and "rolling release to v2" in trace
    assert "stamp_thread t" in trace and "fence=threadloom#access-walk/sim-job:" in trace
    assert result.probes["walk_completed"] >= 1 and result.probes["walk_replaced"] >= 1
    assert result.probes["walk_thread_checked"] >= 1 and result.probes["v1_retired"] >= 1


def test_walk_seeds_pass_over_sqlite():
    seeds = [seed for seed in range(60) if is_walk_seed(seed)][:6]
    results = [simulate_seed(seed, SimConfig(store="sqlite")) for seed in seeds]
    assert [(r.seed, r.invariant, r.detail) for r in results if not r.ok] == []
    assert sum(r.probes.get("walk_completed", 0) for r in results) >= len(seeds)
    assert sum(r.probes.get("walk_stamp", 0) for r in results) > 0


def test_a_seed_without_walks_makes_no_walk_calls():
    assert not is_walk_seed(4)
    trace = "\n".join(simulate_seed(4).trace)
    assert "stamp_thread" not in trace and "heartbeat" not in trace and "walks" not in trace.splitlines()[0]


class _Caller:
    """What the oracle reads of the simulated store that made a call: its node's name, declarations, clock."""

    def __init__(self, store: InMemoryCheckpointer, access) -> None:
        self.node = SimpleNamespace(name="n1")
        self.access = access
        self.store_clock = store._clock


def _walk_oracle():
    v1, v2 = releases(JOB)
    store = InMemoryCheckpointer(access=v1)
    oracle = Oracle(World(0), store)
    claim = store.claim("t1", ClaimRequest(holder="n1:run-1", ttl=timedelta(seconds=30)))
    cp = Checkpoint(
        id="c1", parent=None, thread_id="t1", run_id="run-1", status=CheckpointStatus.RUNNING,
        created_at=EPOCH, state={"n": 1}, graph_id=JOB, tenant_id="acme",
    )
    store.commit("t1", Commit(token=claim.token, checkpoint=cp))
    return store, oracle, cp, v1, v2


def _note_walk_claim(store, oracle, caller):
    walk = walk_thread(JOB)
    request = ClaimRequest(holder="n1/walker-1", ttl=timedelta(seconds=30))
    claim = store.claim(walk, request)
    oracle.note(caller, "claim", walk, (walk, request), result=claim)
    return walk, claim.token


def _note_record(oracle, caller, walk, token, number, **fields):
    record = WalkRecord(graph_id=JOB, **fields)
    cp = record.checkpoint(walk, id=f"w{number}", parent=None, run_id="n1/walker-1", created_at=EPOCH)
    oracle.note(caller, "commit", walk, (walk, Commit(token=token, checkpoint=cp)), result=[])


def test_the_tenant_read_checker_fails_a_row_of_another_tenant():
    store, oracle, cp, v1, _ = _walk_oracle()
    caller = _Caller(store, v1)
    read = store.tenant_history("t1", "acme", limit=5)
    oracle.note(caller, "tenant_history", "t1", ("t1", "acme"), result=read)
    assert read and oracle.violation is None
    oracle.note(caller, "tenant_history", "t1", ("t1", "globex"), result=[cp])  # a store that leaked the row
    assert oracle.violation is not None and oracle.violation.invariant == "tenant reads fail closed"


def test_the_stamp_checkers_fail_a_deposed_walker_and_a_stale_stamp():
    store, oracle, _, v1, v2 = _walk_oracle()
    caller = _Caller(store, v1)
    walk, token = _note_walk_claim(store, oracle, caller)
    store.stamp_thread("t1", fence=(walk, token))
    oracle.note(caller, "stamp_thread", "t1", ("t1", (walk, token)), result=0)
    assert oracle.violation is None
    oracle.note(caller, "stamp_thread", "t1", ("t1", (walk, token - 1)), result=0)  # applied with an old lease
    assert oracle.violation is not None and oracle.violation.invariant == "no stamp from a deposed walker"

    store, oracle, _, v1, v2 = _walk_oracle()
    oracle.note(_Caller(store, v2), "stamp_thread", "t1", ("t1", None), result=1)  # v1's stamps left in place
    assert oracle.violation is not None and oracle.violation.invariant == "a stamp equals its thread's attributes"


def test_the_walk_record_checkers_fail_a_cursor_moving_back_and_an_unstamped_completed_walk():
    store, oracle, _, v1, v2 = _walk_oracle()
    caller = _Caller(store, v1)
    walk, token = _note_walk_claim(store, oracle, caller)
    schema = v1.for_graph(JOB).hash
    _note_record(oracle, caller, walk, token, 1, schema=schema, heads=1)
    _note_record(oracle, caller, walk, token, 2, schema=schema, heads=1, cursor="t3", count=2)
    assert oracle.violation is None
    _note_record(oracle, caller, walk, token, 3, schema=schema, heads=1, cursor="t2", count=2)
    assert oracle.violation is not None and oracle.violation.invariant == "walk cursor monotone"

    store, oracle, _, v1, v2 = _walk_oracle()
    caller = _Caller(store, v2)
    walk, token = _note_walk_claim(store, oracle, caller)
    schema = v2.for_graph(JOB).hash
    _note_record(oracle, caller, walk, token, 1, schema=schema, heads=1)
    _note_record(oracle, caller, walk, token, 2, schema=schema, heads=1, cursor="t9", count=0, completed=True)
    assert oracle.violation is not None
    assert oracle.violation.invariant == "a completed walk leaves every row stamped"  # t1 still carries v1


def test_every_invariant_the_simulation_checks_is_listed():
    import re
    from pathlib import Path

    import threadloom.simulations as package

    used = set()
    for path in Path(package.__file__).parent.glob("*.py"):
        used |= set(re.findall(r'fail\(\s*"([^"]+)"', path.read_text()))
    assert used and used <= set(CHECKS), sorted(used - set(CHECKS))
    assert {"no stamp from a deposed walker", "tenant reads fail closed"} <= set(CHECKS)


# -- the simulated store ---------------------------------------------------------------------------------------------


def test_the_simulated_store_validates_nothing_itself(monkeypatch):
    """Each commit is checked once, by the real store: never by the simulated store in front of it (seed 0 also
    loses several commits before they reach the store, which the simulated store then never checks)."""
    counts = Counter()
    real_check, real_commit = base.check_commit, InMemoryCheckpointer._commit

    def check(*args):
        counts["checked"] += 1
        return real_check(*args)

    def commit(self, *args):
        counts["applied"] += 1
        return real_commit(self, *args)

    monkeypatch.setattr(base, "check_commit", check)
    monkeypatch.setattr(InMemoryCheckpointer, "_commit", commit)
    result = simulate_seed(0)
    assert result.ok and result.probes["outcome_unknown_not_applied.commit"] > 0
    assert counts["applied"] > 0 and counts["checked"] == counts["applied"]


# -- the world ------------------------------------------------------------------------------------------------------------


def test_tasks_interleave_only_at_blocking_points_in_seeded_order():
    def order(seed: int) -> list[str]:
        world = World(seed)
        seen: list[str] = []

        def main() -> None:
            node = world.node("a")
            for name in "xyz":
                world.spawn(node, name, lambda n=name: [seen.append(f"{n}{i}") or world.sleep(timedelta(0)) for i in range(3)])

        world.run(main, until=EPOCH + timedelta(seconds=1))
        return seen

    assert order(3) == order(3)
    assert sorted(order(3)) == sorted(f"{n}{i}" for n in "xyz" for i in range(3))
    assert len({tuple(order(seed)) for seed in range(10)}) > 1
    for seen in (order(3), order(4)):  # each task's own steps stay in program order
        for name in "xyz":
            assert [s for s in seen if s[0] == name] == [f"{name}{i}" for i in range(3)]


def test_virtual_time_jumps_to_the_next_timer_and_paused_nodes_wait():
    world = World(0)
    log: list[tuple[str, float]] = []

    def main() -> None:
        busy = world.node("busy")
        sleepy = world.node("sleepy")
        sleepy.paused_until = EPOCH + timedelta(seconds=10)

        def note(name: str) -> None:
            log.append((name, (world.now - EPOCH).total_seconds()))

        world.spawn(busy, "b", lambda: (world.sleep(timedelta(seconds=3)), note("busy")))
        world.spawn(sleepy, "s", lambda: note("sleepy"))

    world.run(main, until=EPOCH + timedelta(minutes=1))
    assert log == [("busy", 3.0), ("sleepy", 10.0)]


def test_a_crashed_node_runs_nothing_more_and_unwinds_at_teardown_without_its_finally_writing():
    world = World(0)
    ran: list[str] = []

    def main() -> None:
        node = world.node("n")

        def task() -> None:
            try:
                ran.append("before")
                world.sleep(timedelta(seconds=5))
                ran.append("after")  # never: the node died while it slept
            finally:
                try:
                    world.sleep(timedelta(0))  # a finally that blocks is unwound too
                    ran.append("finally-ran-on")
                except SimCrash:
                    ran.append("unwound")
                    raise

        world.spawn(node, "t", task)
        world.call_at(EPOCH + timedelta(seconds=1), lambda: setattr(node, "dead", True))

    world.run(main, until=EPOCH + timedelta(seconds=30))
    assert ran == ["before"]
    world.teardown()
    assert ran == ["before", "unwound"]


def test_a_simulated_condition_wakes_on_notify_or_its_timeout():
    world = World(0)
    woke: list[tuple[str, float]] = []

    def main() -> None:
        node = world.node("n")
        condition = SimScheduler(node).condition()

        def waiter(name: str, timeout: float) -> None:
            with condition:
                condition.wait(timeout)
            woke.append((name, (world.now - EPOCH).total_seconds()))

        def notifier() -> None:
            world.sleep(timedelta(seconds=1))
            with condition:
                condition.notify_all()

        world.spawn(node, "early", lambda: waiter("notified", 5))
        world.spawn(node, "notifier", notifier)

    world.run(main, until=EPOCH + timedelta(seconds=30))
    assert woke == [("notified", 1.0)]


def test_a_simulated_lock_is_held_across_a_yield_and_its_waiter_runs_after_the_release():
    world = World(0)
    order: list[tuple[str, float]] = []

    def main() -> None:
        node = world.node("n")
        lock = SimScheduler(node).lock()

        def holder() -> None:
            with lock:
                order.append(("holder in", (world.now - EPOCH).total_seconds()))
                world.sleep(timedelta(seconds=2))  # a store call inside the lock yields like this
                order.append(("holder out", (world.now - EPOCH).total_seconds()))

        def waiter() -> None:
            world.sleep(timedelta(seconds=1))
            with lock:
                order.append(("waiter in", (world.now - EPOCH).total_seconds()))

        world.spawn(node, "holder", holder)
        world.spawn(node, "waiter", waiter)

    world.run(main, until=EPOCH + timedelta(seconds=30))
    assert order == [("holder in", 0.0), ("holder out", 2.0), ("waiter in", 2.0)]


def test_a_node_starting_an_os_thread_that_blocks_gets_a_clear_error():
    import threading as real_threading

    world = World(0)
    errors: list[str] = []

    def main() -> None:
        node = world.node("n")

        def task() -> None:
            def elsewhere() -> None:
                try:
                    world.block(None)
                except RuntimeError as error:
                    errors.append(str(error))

            thread = real_threading.Thread(target=elsewhere)
            thread.start()
            thread.join()

        world.spawn(node, "t", task)

    with pytest.raises(SimTaskError, match="another OS thread .* must not start threads"):
        world.run(main, until=EPOCH + timedelta(seconds=1))
    assert errors and "must not start threads" in errors[0]


def test_the_hub_cannot_block_and_a_livelock_is_reported():
    world = World(0)
    with pytest.raises(RuntimeError, match="only a task can block"):
        world.block(None)
    spinning = World(0, max_steps=500)

    def main() -> None:
        node = spinning.node("n")
        spinning.spawn(node, "spin", lambda: [spinning.sleep(timedelta(0)) for _ in iter(int, 1)])

    with pytest.raises(SimStuck):
        spinning.run(main, until=EPOCH + timedelta(seconds=1))
    spinning.teardown()


def test_simulated_actor_futures_time_out_in_virtual_time():
    import pykka

    world = World(0)
    outcome: list[str] = []

    class Silent(pykka.ThreadingActor):
        def on_receive(self, message):
            world.sleep(timedelta(seconds=10))
            return "late"

    def main() -> None:
        node = world.node("n")
        scheduler = SimScheduler(node)

        def client() -> None:
            ref = scheduler.actor_class(Silent).start()
            try:
                ref.ask("hi", timeout=2)
            except pykka.Timeout:
                outcome.append(f"timeout at {(world.now - EPOCH).total_seconds()}")
            outcome.append(ref.ask("again"))
            ref.stop()

        world.spawn(node, "client", client)

    world.run(main, until=EPOCH + timedelta(minutes=1))
    world.teardown()
    assert outcome == ["timeout at 2.0", "late"]
    assert not pykka.ActorRegistry.get_all()  # simulated actors never enter the process-wide registry


def test_the_oracle_flags_a_claim_granted_while_the_previous_one_is_live():
    class Store:
        class node:  # noqa: N801 - a stand-in for a SimNode
            name = "n1"

        class store_clock:  # noqa: N801
            @staticmethod
            def now():
                return EPOCH

    from threadloom.domain.values import ClaimRequest, RunClaim

    oracle = Oracle(World(0), inner=None)
    request = ClaimRequest(holder="b", ttl=timedelta(seconds=5))
    first = RunClaim(thread_id="t", holder="a", token=1, expires_at=EPOCH + timedelta(seconds=5))
    second = RunClaim(thread_id="t", holder="b", token=2, expires_at=EPOCH + timedelta(seconds=5))
    oracle.note(Store, "claim", "t", ("t", request), result=first)
    assert oracle.violation is None
    oracle.note(Store, "claim", "t", ("t", request), result=second)
    assert oracle.violation is not None and oracle.violation.invariant == "at most one live claim"


def test_the_oracle_flags_a_child_deleted_while_another_run_holds_its_parent():
    class Store:
        class node:  # noqa: N801 - a stand-in for a SimNode
            name = "n1"

        class store_clock:  # noqa: N801
            @staticmethod
            def now():
                return EPOCH

    from threadloom.domain.values import (
        Checkpoint,
        CheckpointOrigin,
        CheckpointStatus,
        ClaimRequest,
        Commit,
        RunClaim,
    )

    def claim(thread_id: str, holder: str, token: int) -> None:
        granted = RunClaim(thread_id=thread_id, holder=holder, token=token, expires_at=EPOCH + timedelta(seconds=5))
        oracle.note(Store, "claim", thread_id, (thread_id, ClaimRequest(holder=holder, ttl=timedelta(seconds=5))),
                    result=granted)

    oracle = Oracle(World(0), inner=None)
    claim("c", "child-run", 1)
    child = Checkpoint(
        id="c1", parent=None, thread_id="c", run_id="child-run", status=CheckpointStatus.COMPLETED,
        created_at=EPOCH, origin=CheckpointOrigin(parent_thread="p"),
    )
    oracle.note(Store, "commit", "c", ("c", Commit(token=1, checkpoint=child)), result=[])
    oracle.note(Store, "release", "c", ("c", 1), result=None)
    claim("p", "old-parent-run", 2)
    claim("c", "old-parent-run", 3)  # the old parent run's retention holds the child ...
    claim("p", "successor", 4)  # ... while a successor took the parent over (the oracle sees no expiry here)
    assert oracle.violation is not None  # (two live claims on p: the first invariant says so too)
    oracle.violation = None
    oracle.note(Store, "delete_thread", "c", ("c", 3, None), result=None)
    assert oracle.violation is not None
    assert oracle.violation.invariant == "no child a live run may take up is deleted"
    assert "successor holds its parent p" in oracle.violation.detail


# -- user graphs ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def user_graph(tmp_path, monkeypatch):
    module = tmp_path / "sim_user_graph.py"
    module.write_text(
        textwrap.dedent(
            """
            from threadloom import Graph, Step

            def fetch(state, ctx):
                got = ctx.effect("fetch", lambda: {"rows": 3})
                ctx.emit("fetched", got)
                return Step(state={**(state or {}), "rows": got["rows"]}, next="answer")

            def answer(state, ctx):
                return Step(state={**state, "answer": state["rows"] * 2})

            GRAPH = Graph("user-graph", {"fetch": fetch, "answer": answer}, entry="fetch",
                          merge=lambda state, update: {**(state or {}), **(update or {})})
            NOT_A_GRAPH = 42

            def make_graph():
                raise RuntimeError("no graph today")

            def ask(state, ctx):
                return Step(state={**state, "answer": state["question"].upper()})

            NEEDS_QUESTION = Graph("needs-question", {"ask": ask}, entry="ask")

            def leave(state, ctx):
                import sys
                sys.exit(0)

            EXITS = Graph("exits", {"leave": leave}, entry="leave")

            def exiting_factory():
                import sys
                sys.exit(0)

            def picky(state, update):
                raise ValueError("no such customer")

            PICKY = Graph("picky", {"answer": answer}, entry="answer", merge=picky)

            def threaded(state, ctx):
                import threading
                worker = threading.Thread(target=lambda: ctx.effect("from-a-thread", lambda: 1))
                worker.start()
                worker.join()
                return Step(state=state)

            THREADED = Graph("threaded", {"threaded": threaded}, entry="threaded")
            """
        )
    )
    (tmp_path / "sim_broken_module.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "sim_user_graph:GRAPH"


def test_a_users_graph_runs_under_the_simulation(user_graph):
    config = SimConfig(graph=user_graph)
    results = [simulate_seed(seed, config) for seed in range(25)]
    assert [(r.seed, r.invariant, r.detail) for r in results if not r.ok] == []
    assert sum(r.probes.get("effect_recorded", 0) for r in results) > 0
    assert sum(r.probes.get("entry_completed", 0) for r in results) > 0


def test_a_bad_graph_spec_is_a_clear_error(user_graph):
    with pytest.raises(ValidationError, match="module:attr"):
        load_graph("no-colon")
    with pytest.raises(ValidationError, match="cannot import"):
        load_graph("no_such_module_anywhere:GRAPH")
    with pytest.raises(ValidationError, match="not a threadloom Graph"):
        load_graph("sim_user_graph:NOT_A_GRAPH")
    with pytest.raises(ValidationError, match="has no attribute 'missing'"):
        load_graph("sim_user_graph:missing")
    with pytest.raises(ValidationError, match=r"make_graph\(\) raised RuntimeError: no graph today"):
        load_graph("sim_user_graph:make_graph")
    with pytest.raises(ValidationError, match=r"exiting_factory\(\) raised SystemExit"):
        load_graph("sim_user_graph:exiting_factory")
    with pytest.raises(ValidationError, match="importing 'sim_broken_module' raised ZeroDivisionError"):
        load_graph("sim_broken_module:GRAPH")


def test_a_node_that_exits_the_process_fails_its_seed_instead(user_graph):
    result = CliRunner().invoke(cli, ["simulate", "--seeds", "2", "--graph", "sim_user_graph:EXITS"])
    assert result.exit_code == 1, result.output
    assert "tasks end cleanly" in result.output and "SystemExit" in result.output


def test_a_graph_that_fails_every_run_is_reported_and_its_error_is_in_the_trace(user_graph):
    result = CliRunner().invoke(cli, ["simulate", "--seeds", "3", "--graph", "sim_user_graph:NEEDS_QUESTION"])
    assert result.exit_code == 0, result.output  # a graph may fail its runs
    assert "queued runs of your graph ended FAILED" in result.output
    one = simulate_seed(0, SimConfig(graph="sim_user_graph:NEEDS_QUESTION"))
    assert any("FAILED" in line and "KeyError" in line for line in one.trace)


# -- the command -------------------------------------------------------------------------------------------------------


def test_simulate_prints_the_probe_histogram_and_passes():
    result = CliRunner().invoke(cli, ["simulate", "--seeds", "12"])
    assert result.exit_code == 0, result.output
    assert "12 passed, 0 failed" in result.output
    assert "takeover" in result.output or "claim_granted" in result.output


def test_simulate_reports_a_failure_with_its_shortest_trace_and_replay_command():
    result = CliRunner().invoke(cli, ["simulate", "--seeds", "15", "--plant", "seq_reuse_after_delete"])
    assert result.exit_code == 1
    assert "shortest failing trace" in result.output
    violation = next(line for line in result.output.splitlines() if "VIOLATION" in line).split("VIOLATION ")[1]
    assert violation.split(":")[0] in EXPECTED_INVARIANTS["seq_reuse_after_delete"]
    replay = [line for line in result.output.splitlines() if line.startswith("replay: ")][-1]
    seed = int(replay.split("--seed ")[1].split()[0])
    assert replay == f"replay: threadloom simulate --seed {seed} --plant seq_reuse_after_delete"
    again = CliRunner().invoke(cli, ["simulate", "--seed", str(seed), "--plant", "seq_reuse_after_delete"])
    assert again.exit_code == 1 and f"VIOLATION {violation}" in again.output


def test_simulate_json_document():
    result = CliRunner().invoke(cli, ["--json", "simulate", "--seeds", "5", "--seed", "100", "--faults", "crash,pause"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["seeds"] == 5 and doc["first_seed"] == 100 and doc["failed"] == 0 and doc["runs_failed"] == 0
    assert doc["faults"] == ["crash", "pause"]
    assert set(doc["trace_hashes"]) == {"100", "101", "102", "103", "104"}
    assert all(entry["count"] >= entry["seeds"] >= 1 for entry in doc["probes"].values())


def test_simulate_without_faults_never_injects_one():
    result = CliRunner().invoke(cli, ["--json", "simulate", "--seeds", "20", "--faults", "none"])
    doc = json.loads(result.output)
    for probe in doc["probes"]:
        assert not probe.startswith(("node_", "clock_", "outcome_unknown", "slow_call")), probe


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "crash,meteor"], "faults"),
        (["--faults", ""], "faults"),
        (["--store", "postgres"], "store"),
        (["--seeds", "0"], "seeds"),
        (["--graph", "nope"], "graph"),
        (["--seed", "-1"], "seed"),
        (["--regressions", "--seeds", "5"], "--regressions replays each kept seed with its own options"),
        (["--regressions", "--store", "sqlite"], "drop --store"),
        (["--regressions", "--store", "sqlite", "--faults", "none"], "drop --store, --faults"),
        (["--regressions", "--seed", "0"], "drop --seed"),
        (["--regressions", "--jobs", "2"], "drop --jobs"),
    ],
)
def test_simulate_refuses_bad_options_clearly(args, message):
    result = CliRunner().invoke(cli, ["simulate", *args])
    assert result.exit_code in (1, 2)
    assert message in result.output
    assert "Traceback" not in result.output


def test_simulate_replays_the_regression_seeds():
    result = CliRunner().invoke(cli, ["--json", "simulate", "--regressions"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == len(REGRESSION_SEEDS) and all(row["ok"] for row in rows)
    assert [row["found"] for row in rows] == [kept.found for kept in REGRESSION_SEEDS]
    assert rows[0]["command"] == f"threadloom simulate --seed {REGRESSION_SEEDS[0].seed}"


def test_fault_kinds_are_the_documented_ones():
    assert FAULT_KINDS == ("crash", "pause", "clock", "store", "slow")


def test_a_graph_whose_merge_refuses_every_input_fails_its_runs_not_the_seed(user_graph):
    results = [simulate_seed(seed, SimConfig(graph="sim_user_graph:PICKY")) for seed in range(6)]
    assert [(r.seed, r.invariant, r.detail) for r in results if not r.ok] == []
    assert sum(r.probes.get("entry_failed", 0) for r in results) > 0
    assert any("merge refused it: ValueError: no such customer" in line for r in results for line in r.trace)


def test_a_node_running_simulated_code_on_its_own_thread_fails_the_seed_quietly(user_graph, capfd):
    result = simulate_seed(0, SimConfig(graph="sim_user_graph:THREADED"))
    assert not result.ok and result.invariant == "tasks end cleanly"
    assert "another OS thread" in result.detail
    assert "Traceback" not in capfd.readouterr().err


def test_effects_of_spawned_child_graphs_are_checked_too(monkeypatch):
    """A child graph's ``ctx.effect`` is observed as the parent's is: a runtime that ran a child's effect again
    despite its committed record is caught (found by review: only the served graphs were observed)."""
    from threadloom.actors.graph import NodeContext

    real = NodeContext.effect

    def forgetful(self, key, fn, **options):
        if key == "child_charge":
            self._read_effect = lambda _key: None  # the bug: the child's committed record is not read
        return real(self, key, fn, **options)

    monkeypatch.setattr(NodeContext, "effect", forgetful)
    results = [simulate_seed(seed, SimConfig(faults=frozenset())) for seed in range(40)]
    caught = [r for r in results if not r.ok]
    assert caught and {r.invariant for r in caught} == {"effects never run again once recorded"}
    assert all("child_charge" in r.detail for r in caught)


@pytest.mark.parametrize("seed", [-1, True, "5", 2.0])
def test_simulate_seed_refuses_a_seed_the_command_could_not_replay(seed):
    with pytest.raises(ValidationError, match="seed"):
        simulate_seed(seed)


def test_one_seed_in_json_carries_its_trace_and_a_failing_seed_prints_its_trace_once():
    result = CliRunner().invoke(cli, ["--json", "simulate", "--seed", "3"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert any(" SEED " in line for line in doc["traces"]["3"]) and doc["shortest"] is None
    assert doc["trace_hashes"]["3"] == simulate_seed(3).trace_hash
    failing = CliRunner().invoke(cli, ["simulate", "--seed", "1", "--plant", "seq_reuse_after_delete"])
    assert failing.exit_code == 1
    assert failing.output.count("VIOLATION event numbers never reused") == 1
    assert "(printed above)" in failing.output


def test_simulate_keeps_pykka_debug_lines_out_of_the_output():
    result = CliRunner().invoke(cli, ["--log-level", "debug", "simulate", "--seeds", "2"])
    assert result.exit_code == 0, result.output
    assert "Unregistered" not in result.output and "pykka" not in result.output


def test_worker_processes_that_cannot_start_are_a_clear_error(tmp_path):
    (tmp_path / "random.py").write_text('raise ImportError("shadowed random")\n')
    script = os.path.join(os.path.dirname(sys.executable), "threadloom")  # not -m: it would import ./random.py
    done = subprocess.run(
        [script, "simulate", "--seeds", "60", "--jobs", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    assert "the worker processes failed" in done.stderr and "--jobs 1" in done.stderr
    assert "interrupted" not in done.stderr


def test_an_effect_called_without_its_intent_is_caught(monkeypatch):
    """The intent is what tells a re-executed step that a call may have happened: a runtime that calls an
    effect's function without committing it first is caught."""
    from threadloom.actors.graph import NodeContext

    monkeypatch.setattr(NodeContext, "_intend", lambda self, key, scope, keys: None)
    results = [simulate_seed(seed, SimConfig(faults=frozenset())) for seed in range(5)]
    assert all(not r.ok and r.invariant == "effects run only after their intent" for r in results)
