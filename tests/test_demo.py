"""``threadloom demo`` (the multi-process crash demo) and its parts: the sample graph, the effect ledger and the
verification, which must fail when the data is wrong.

The end-to-end tests run real worker processes on a real SQLite file and SIGKILL one of them; they assert on the
times the store recorded (the kill against the recovering run's first event), never on the test's own duration.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from threadloom import (
    CancelledError,
    CheckpointStatus,
    ClaimPolicy,
    ClaimRequest,
    Commit,
    EffectRecord,
    EntryStatus,
    EventRecord,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    RunQueue,
    SequentialIds,
    ServePolicy,
    Step,
    ThreadQuery,
    ThreadStatus,
    effect_keys,
)
from threadloom.actors.graph import END_EVENTS, EVENT_RUN_RECOVERED, STEP_KEY, TURN_KEY
from threadloom.cli.demo.graph import (
    AGENT_GRAPH,
    Ledger,
    build_graphs,
    demo_input,
)
from threadloom.cli.demo.metrics import port_in_use
from threadloom.cli.demo.plan import DemoPlan
from threadloom.cli.demo.verify import (
    Crash,
    _check_gap_free,
    _check_stale,
    _check_tokens,
    find_takeovers,
    verify,
)
from threadloom.cli.main import cli
from threadloom.cli.output import EXIT_USAGE, STORE_ENV

CHECKS = [
    "every run completed",
    "each effect recorded once; re-executions reused its idempotency key",
    "every event log gap-free",
    "no write with a stale token accepted",
    "tokens strictly increasing",
]
WAIT = timedelta(seconds=20)


def _now() -> datetime:
    return datetime.now(UTC)


# -- end to end ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_demo_crashes_a_worker_and_every_check_passes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "threadloom", "--json", "demo", "--runs", "12", "--workers", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads(done.stdout)
    assert report["passed"] is True
    assert [check["name"] for check in report["checks"]] == CHECKS
    assert all(check["passed"] for check in report["checks"]), report["checks"]
    crash = report["crash"]
    assert crash is not None and crash["held"], "no worker was killed mid-run"
    assert crash["takeovers"], "nobody took over the killed worker's threads"
    for takeover in crash["takeovers"]:
        assert takeover["by_worker"] != crash["worker"]
        assert takeover["by_token"] > takeover["from_token"]
    assert set(crash["held"]) & {t["thread_id"] for t in crash["takeovers"]}
    # Recovered once the claims expired (ttl), and not much later: times the workers recorded, not the test's.
    assert crash["ttl_s"] - 1.0 <= crash["max_recovery_s"] <= crash["ttl_s"] + 2.0, crash
    assert report["folder"] is None and report["inspect"] == ""  # nothing kept without --keep
    assert [w["status"] for w in report["workers"]].count("SIGKILLed") == 1


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_demo_fits_an_80_column_terminal(tmp_path):
    """The demo in a real pseudo-terminal 80 columns wide: its live lines, the crash and takeover lines and the
    final table all fit, and it exits 0."""
    from threadloom.testing.terminal import run_in_terminal

    shown = run_in_terminal(["demo", "--runs", "4", "--workers", "2"], columns=80, cwd=tmp_path, timeout_s=180)
    assert shown.exit_code == 0, shown.text
    assert shown.wider_than(80) == [], shown.text
    flat = " ".join(shown.text.split())
    assert "SIGKILL worker-" in flat and "took over demo-" in flat, shown.text  # the live lines were there
    assert "verification" in flat and "every run completed" in flat and "all checks passed" in flat
    assert flat.count("PASS") == len(CHECKS)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_sigkilled_workers_threads_are_recovered_within_ttl_and_its_effects_ran_once(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    ttl = timedelta(seconds=2)
    db, ledger_path = tmp_path / "crash.db", tmp_path / "ledger.db"
    store = SqliteCheckpointer.open(str(db))
    ledger = Ledger(ledger_path)
    workers: dict[str, subprocess.Popen] = {}
    try:
        roots = [f"t-{index}" for index in range(1, 9)]
        for index, thread_id in enumerate(roots, start=1):
            store.queue.enqueue(thread_id, graph_id=AGENT_GRAPH, input=demo_input(index), tenant_id="acme")
        env = {**os.environ, STORE_ENV: f"sqlite:///{db}"}
        for name in ("victim", "rescuer"):
            command = [
                sys.executable, "-m", "threadloom", "--log-level", "info", "demo-worker", "--name", name,
                "--ledger", str(ledger_path), "--concurrency", "3", "--ttl", "2s", "--renew-every", "500ms",
            ]  # fmt: skip
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the process holds it
            workers[name] = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
            log.close()
        held: list[str] = []
        deadline = time.monotonic() + 60
        while not held:  # the victim holds a thread past its first node: a run in the middle of its work
            assert time.monotonic() < deadline, "the victim never held a run mid-way"
            assert workers["victim"].poll() is None, (tmp_path / "victim.log").read_text()
            page = store.threads(ThreadQuery(tenant_id="acme", statuses={ThreadStatus.RUNNING}, limit=100))
            for summary in page.items:
                latest = store.latest(summary.thread_id)
                if summary.latest_run_id.startswith("victim:") and int(latest.checkpoint.metadata[STEP_KEY]) >= 1:
                    held.append(summary.thread_id)
            time.sleep(0.05)
        os.kill(workers["victim"].pid, signal.SIGKILL)
        killed_at = _now()
        workers["victim"].wait(10)
        while any(entry.status is EntryStatus.OPEN for entry in store.queue.entries(limit=100)):
            assert time.monotonic() < deadline + 30, "the runs did not finish"
            assert workers["rescuer"].poll() is None, (tmp_path / "rescuer.log").read_text()
            time.sleep(0.1)
        workers["rescuer"].send_signal(signal.SIGTERM)
        assert workers["rescuer"].wait(20) == 0

        assert all(entry.status is EntryStatus.COMPLETED for entry in store.queue.entries(limit=100))
        threads = list(roots)
        for parent in roots:
            threads.extend(store.children(parent, limit=100))
        interrupted = 0
        for thread_id in threads:
            events = store.events_after(thread_id, 0, 1000)
            assert store.latest(thread_id).checkpoint.status is CheckpointStatus.COMPLETED
            victims = [e for e in events if e.run_id.startswith("victim:")]
            if not victims or any(e.type in END_EVENTS for e in victims):
                continue
            interrupted += 1  # the victim died in the middle of this thread's run
            recovered = [e for e in events if e.type == EVENT_RUN_RECOVERED and e.seq > victims[-1].seq]
            assert recovered and recovered[0].run_id.startswith("rescuer:"), f"{thread_id} was not taken over"
            first = recovered[0]
            assert first.payload["from_run"] == victims[-1].run_id
            # The claim had to expire first; then the rescuer took it within two seconds (its clock = the store's).
            after = (first.timestamp - killed_at).total_seconds()
            assert ttl.total_seconds() - 1.0 <= after <= ttl.total_seconds() + 2.0, (thread_id, after)
            assert first.token > max(e.token for e in victims)
        assert interrupted >= 1
        # Effects recorded once: one execution per idempotency key; a key called again (with the same idempotency
        # key) only if the victim's call never committed.
        executions = {e.idempotency_key: e for e in ledger.executions()}
        records: dict[str, str] = {}
        for thread_id in roots:
            latest = store.latest(thread_id).checkpoint
            for key in latest.state["effects"]:
                keys = effect_keys(thread_id, key, turn_id=latest.metadata[TURN_KEY])
                record = store.effect(thread_id, keys.record)
                assert record.result["execution_id"] == executions[keys.idempotency].execution_id
                records[keys.idempotency] = record.run_id
        assert len(executions) == len(records) + sum(len(store.children(t, limit=100)) for t in roots)
        for attempt in ledger.attempts():
            if attempt.outcome == "deduplicated":
                first_call = executions[attempt.idempotency_key]
                assert first_call.worker == "victim" and attempt.worker == "rescuer"
                if attempt.idempotency_key in records:
                    assert records[attempt.idempotency_key].startswith("rescuer:")
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        ledger.close()
        store.close()


def _free_ports(count: int) -> int:
    """A port ``p`` such that ``p`` … ``p + count - 1`` are free on the loopback now (``p`` chosen by the system)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count - 1 <= 65535 and all(port_in_use(base + k) is None for k in range(count)):
            return base
    pytest.skip(f"found no {count} consecutive free ports")


def _scrape(port: int) -> dict[tuple[str, frozenset], float] | None:
    """Every sample of ``http://127.0.0.1:<port>/metrics`` by (name, labels), or None if nothing answers."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (OSError, http.client.HTTPException):
        # HTTPException: before the endpoint listens, a connection from an ephemeral port equal to its port (the
        # ports were picked from that range) can connect to itself and read its own request as the answer
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _commits(samples: dict[tuple[str, frozenset], float] | None, **labels: str) -> float:
    key = ("threadloom_store_calls_total", frozenset({"op": "commit", **labels}.items()))
    return (samples or {}).get(key, 0.0)


@pytest.mark.slow
def test_the_demo_serves_every_processs_store_metrics_while_it_runs(tmp_path):
    pytest.importorskip("prometheus_client")
    port = _free_ports(3)  # the coordinator on port, worker-1 on port+1, worker-2 on port+2
    out, err = open(tmp_path / "out", "w+"), open(tmp_path / "err", "w+")  # noqa: SIM115 - the process writes
    process = subprocess.Popen(
        [sys.executable, "-m", "threadloom", "--json", "demo", "--runs", "8", "--workers", "2", "--no-crash",
         "--metrics-port", str(port)],
        cwd=tmp_path, stdout=out, stderr=err,
    )  # fmt: skip
    try:
        worker_seen: dict[str, float] = {}
        aggregate: dict[tuple[str, frozenset], float] | None = None
        deadline = time.monotonic() + 120
        while not (worker_seen and aggregate):
            assert process.poll() is None, "the demo ended before its metrics showed commits: " + (
                (tmp_path / "err").read_text() + (tmp_path / "out").read_text()
            )
            assert time.monotonic() < deadline, "no commit was ever counted on a worker's endpoint"
            for number in (1, 2):
                commits = _commits(_scrape(port + number))
                if commits > 0:
                    worker_seen[f"worker-{number}"] = commits
            if worker_seen and aggregate is None:
                samples = _scrape(port)
                if any(_commits(samples, process=name) > 0 for name in worker_seen):
                    aggregate = samples
            time.sleep(0.05)
        assert process.wait(120) == 0, (tmp_path / "err").read_text() + (tmp_path / "out").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        err.close()
    # The coordinator's endpoint had its own store's series and each worker's, told apart by a process label.
    assert aggregate is not None
    up = {dict(labels)["process"]: value for (name, labels), value in aggregate.items()
          if name == "threadloom_demo_process_up"}  # fmt: skip
    assert up["coordinator"] == 1.0 and set(up) == {"coordinator", "worker-1", "worker-2"}
    assert any(up[name] == 1.0 for name in worker_seen)
    assert ("threadloom_store_calls_total", frozenset({"op": "threads", "process": "coordinator"}.items())) in aggregate
    assert all("process" in dict(labels) for _name, labels in aggregate)
    report = json.loads((tmp_path / "out").read_text())
    assert report["passed"] is True
    progress = (tmp_path / "err").read_text()
    for number in (0, 1, 2):
        assert f"http://127.0.0.1:{port + number}/metrics" in progress
    # Served while it runs, not after: every endpoint is gone once the command returned.
    assert all(_scrape(port + number) is None for number in (0, 1, 2))


def test_a_metrics_port_in_use_is_refused_before_anything_starts(tmp_path):
    pytest.importorskip("prometheus_client")
    port = _free_ports(3)
    db = tmp_path / "never.db"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port + 2))  # worker-2's port
        taken.listen()
        result = CliRunner().invoke(
            cli, ["demo", "--store", f"sqlite:///{db}", "--workers", "2", "--metrics-port", str(port)]
        )
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.count("\n") == 1
    assert f"metrics port {port + 2} on 127.0.0.1 is not available" in result.stderr
    assert not db.exists()  # the store was never opened, so no run was enqueued and no worker started
    assert port_in_use(port) is None  # the coordinator's port was not left held
    limit = CliRunner().invoke(cli, ["demo", "--workers", "3", "--metrics-port", "65534"])
    assert limit.exit_code == EXIT_USAGE and "65537 > 65535" in limit.stderr


def test_the_demo_refuses_what_it_cannot_run():
    runner = CliRunner()
    memory = runner.invoke(cli, ["demo", "--store", "memory://"])
    assert memory.exit_code == EXIT_USAGE
    assert "memory:// cannot be shared" in memory.stderr
    alone = runner.invoke(cli, ["demo", "--workers", "1"])
    assert alone.exit_code == EXIT_USAGE
    assert "--no-crash" in alone.stderr


def test_the_worker_command_is_hidden_from_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert "demo " in result.stdout and "demo-worker" not in result.stdout


# -- in one process: the graph, the ledger, the verification ------------------------------------------------------------


@pytest.fixture
def memory():
    store = InMemoryCheckpointer()
    yield store
    store.close()


def _serve_all(store, ledger, plan: DemoPlan, ids=None) -> set[int]:
    runtime = GraphRuntime(
        store, node_id="w1", claim_policy=ClaimPolicy(ttl=timedelta(seconds=5), renew_every=timedelta(seconds=1)),
        ids=ids,
    )
    try:
        ids = {
            store.queue.enqueue(plan.thread_id(i), graph_id=AGENT_GRAPH, input=demo_input(i), tenant_id="acme").entry_id
            for i in range(1, plan.runs + 1)
        }
        server = runtime.serve(
            build_graphs(runtime, ledger, pace=0),
            concurrency=2,
            policy=ServePolicy(poll_interval=timedelta(milliseconds=10)),
            block=False,
        )
        deadline = time.monotonic() + 30
        while any(store.queue.entry(i).open for i in ids):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.stop()
    finally:
        runtime.close()
    return ids


def test_the_sample_runs_verify_clean_and_a_repeated_effect_fails_the_check(memory, tmp_path):
    ledger = Ledger(tmp_path / "ledger.db", worker="w1")
    plan = DemoPlan(runs=4, workers=1, concurrency=2, crash=False)
    try:
        ids = _serve_all(memory, ledger, plan)
        assert isinstance(memory.queue, RunQueue)
        checks = verify(memory, memory.queue, ledger, plan, ids, None)
        assert [c.name for c in checks] == CHECKS
        assert all(c.passed for c in checks), checks
        assert "4/4 runs" in checks[0].figure and "(3 child threads)" in checks[0].figure  # runs 2 and 4 delegate
        state = memory.latest("demo-004").checkpoint.state
        assert state["effects"] == ["tool:1", "tool:2", "tool:3", "answer"]
        assert state["children"] == ["demo-004.research-2", "demo-004.research-3"]
        assert "5/5 writes with a superseded token refused" in checks[3].figure
        # Someone calls an effect again that a committed step recorded: the provider dedupes it, the check fails.
        turn = memory.latest("demo-001").checkpoint.metadata[TURN_KEY]
        other = Ledger(tmp_path / "ledger.db", worker="w2")
        other.call("demo-001", "tool:1", effect_keys("demo-001", "tool:1", turn_id=turn).idempotency, "w2:run-x",
                   "search_web", "again")  # fmt: skip
        other.close()
        again = verify(memory, memory.queue, ledger, plan, ids, None)
        assert not again[1].passed and "called again by w2:run-x" in again[1].problems[0]
        # A re-execution that used another idempotency key executed twice at the provider: the check fails.
        other = Ledger(tmp_path / "ledger.db", worker="w2")
        other.call("demo-002", "tool:1", "another-key", "w2:run-y", "search_web", "again")
        other.close()
        stray = verify(memory, memory.queue, ledger, plan, ids, None)[1]
        assert any("another-key" in p and "no completed run recorded it" in p for p in stray.problems), stray
    finally:
        ledger.close()


def test_a_parent_that_dies_while_its_child_runs_recovers_the_child_and_its_effect_runs_once(memory, tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    gate, entered = threading.Event(), threading.Event()
    calls: list[str] = []

    def search(state, ctx):
        ctx.effect("search", lambda key: calls.append(ctx.run_id) or ledger.call(ctx.thread_id, "search", key, ctx.run_id, "s", 1))
        entered.set()
        gate.wait(10)  # the first run's child blocks here until its runtime closed
        return Step.to("summarize", {**state, "effects": ["search"]})

    def summarize(state, ctx):
        return Step.end({**state, "findings": "f"})

    child = Graph("child", {"search": search, "summarize": summarize}, entry="search")
    runtimes: list[GraphRuntime] = []

    def parent_graph(runtime):
        def delegate(state, ctx):
            found = ctx.spawn("p.child", child, {"q": 1}).wait(WAIT).state
            return Step.end({**state, "findings": found["findings"]})

        return Graph("parent", {"delegate": delegate}, entry="delegate")

    policy = ClaimPolicy(ttl=timedelta(seconds=2), renew_every=timedelta(milliseconds=500))
    first = GraphRuntime(memory, node_id="first", claim_policy=policy, close_timeout=timedelta(seconds=5))
    runtimes.append(first)
    try:
        handle = first.start("p", parent_graph(first), {}, tenant_id="acme")
        assert entered.wait(10)
        closing = threading.Thread(target=first.close)
        closing.start()  # cancels both runs; the child's node in flight commits, the parent's fails cancelled
        time.sleep(0.2)
        gate.set()
        closing.join(10)
        assert memory.latest("p").checkpoint.status is CheckpointStatus.RUNNING
        assert memory.latest("p.child").checkpoint.status is CheckpointStatus.RUNNING
        with pytest.raises(CancelledError):
            handle.wait(timedelta(seconds=1))

        second = GraphRuntime(memory, node_id="second", claim_policy=policy)
        runtimes.append(second)
        outcome = second.recover("p", parent_graph(second), tenant_id="acme").wait(WAIT)
        assert outcome.state["findings"] == "f"
        assert memory.latest("p.child").checkpoint.status is CheckpointStatus.COMPLETED
        assert memory.latest("p.child").checkpoint.run_id.startswith("second:")
        assert len(calls) == 1 and calls[0].startswith("first:")
        assert [a.outcome for a in ledger.attempts()] == ["executed"]
    finally:
        for runtime in runtimes:
            runtime.close()
        ledger.close()


def _event(thread_id: str, seq: int, run_id: str, token: int, type_: str = "x", at: datetime | None = None):
    return EventRecord(
        thread_id=thread_id, seq=seq, token=token, run_id=run_id, type=type_, payload=None,
        timestamp=at or _now(), checkpoint_id=None, task_id=None, node_id=None,
    )  # fmt: skip


def test_the_checks_fail_on_a_gap_a_stale_token_and_a_lower_takeover_token():
    good = {"t": [_event("t", 1, "a:run-1", 5), _event("t", 2, "a:run-1", 5), _event("t", 3, "b:run-2", 9)]}
    assert _check_gap_free(good).passed
    assert _check_stale(good, {"t": []}, 0, []).passed
    assert _check_tokens(good, {"t": []}, None).passed

    gap = {"t": [_event("t", 1, "a:run-1", 5), _event("t", 3, "a:run-1", 5)]}
    check = _check_gap_free(gap)
    assert not check.passed and "missing [2]" in check.problems[0]

    stale = {"t": [_event("t", 1, "a:run-1", 5), _event("t", 2, "b:run-2", 9), _event("t", 3, "a:run-1", 5)]}
    check = _check_stale(stale, {"t": []}, 0, [])
    assert not check.passed and "token 5 after token 9" in check.problems[0]

    lower = {"t": [_event("t", 1, "a:run-1", 9), _event("t", 2, "b:run-2", 5)]}
    assert not _check_tokens(lower, {"t": []}, None).passed


def test_takeovers_are_found_where_the_crashed_workers_run_stopped_and_another_went_on():
    killed = _now()
    later = killed + timedelta(seconds=3)
    logs = {
        "t1": [_event("t1", 1, "dead:run-1", 4), _event("t1", 2, "w2:run-2", 7, EVENT_RUN_RECOVERED, later)],
        "t2": [_event("t2", 1, "dead:run-3", 5, "threadloom.run_completed"), _event("t2", 2, "w2:run-4", 8)],
        "t3": [_event("t3", 1, "w2:run-5", 6)],
    }
    found = find_takeovers(logs, "dead", killed)
    assert [(t.thread_id, t.from_token, t.by_run, t.after_s) for t in found] == [("t1", 4, "w2:run-2", 3.0)]
    crash = Crash("dead", 1, killed, 1.0, ["t1"], found)
    assert _check_tokens(logs, {k: [] for k in logs}, crash).passed


def test_a_call_repeated_after_the_crashed_workers_uncommitted_call_passes_only_with_that_crash(memory, tmp_path):
    ledger = Ledger(tmp_path / "ledger.db", worker="w1")
    dead = Ledger(tmp_path / "ledger.db", worker="dead")
    plan = DemoPlan(runs=1, workers=1, concurrency=1, crash=False)
    try:
        # The dead worker called tool:1 of the turn the served run takes up and died before its step committed:
        # the next call, with the same idempotency key, gets its execution.
        keys = effect_keys("demo-001", "tool:1", turn_id="w1:run-1")  # the served run's turn: its own RunId
        claim = memory.claim("demo-001", ClaimRequest(holder="dead:run-0", ttl=timedelta(seconds=5)))
        intent = EffectRecord(key=keys.intent, run_id="dead:run-0", recorded_at=_now(), result={"key": "tool:1"})
        memory.commit("demo-001", Commit(token=claim.token, effects=[intent]))  # the intent, as ctx.effect writes
        dead.call("demo-001", "tool:1", keys.idempotency, "dead:run-0", "search_web", "first")
        memory.release("demo-001", claim.token)
        ids = _serve_all(memory, ledger, plan, SequentialIds())
        assert memory.latest("demo-001").checkpoint.metadata[TURN_KEY] == "w1:run-1"
        record = memory.effect("demo-001", keys.record)
        assert record.run_id.startswith("w1:")
        assert record.result["execution_id"] == ledger.executions()[0].execution_id
        crash = Crash("dead", 1, _now(), 0.0, [])
        effects = verify(memory, memory.queue, ledger, plan, ids, crash)[1]
        assert effects.passed, effects
        assert "1 re-execution(s) after the crash" in effects.figure
        assert not verify(memory, memory.queue, ledger, plan, ids, None)[1].passed
    finally:
        dead.close()
        ledger.close()


@pytest.mark.postgres
@pytest.mark.slow
def test_the_demo_passes_on_postgresql():
    """The demo on PostgreSQL, in a throwaway schema named in the store URL (``?schema=``), dropped afterwards."""
    import psycopg

    from threadloom.testing.postgres_harness import drop_schema, new_schema_name, postgres_dsn

    dsn = postgres_dsn()
    if not dsn.startswith(("postgresql://", "postgres://")):
        pytest.skip("the demo takes a postgresql:// URL; the test server is named by a key=value string")
    schema = new_schema_name()
    url = f"{dsn}{'&' if '?' in dsn.split('@')[-1] else '?'}schema={schema}"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "threadloom", "--json", "demo", "--store", url, "--runs", "12"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        report = json.loads(done.stdout)
        assert report["passed"] and report["crash"]["takeovers"], report
        assert report["inspect"].startswith("threadloom --store 'postgresql://")  # quoted: "?" is a glob
        assert shlex.split(report["inspect"])[2].endswith(f"schema={schema}")
        with psycopg.connect(dsn, autocommit=True) as conn:  # the demo's threads are in the throwaway schema
            found = conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {}.threads WHERE thread_id IN (%s, %s)").format(
                    psycopg.sql.Identifier(schema)
                ),
                (report["threads"]["first"], report["threads"]["last"]),
            ).fetchone()
        assert found == (2,)
    finally:
        drop_schema(dsn, schema)


def test_a_token_issued_to_two_runs_fails_the_token_check():
    logs = {"t1": [_event("t1", 1, "a:run-1", 5)], "t2": [_event("t2", 1, "b:run-2", 5)]}
    check = _check_tokens(logs, {"t1": [], "t2": []}, None)
    assert not check.passed and "issued to two runs" in check.problems[0]
