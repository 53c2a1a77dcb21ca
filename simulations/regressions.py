"""Every seed that ever failed, kept and replayed in CI.

A seed that once found something — a bug of the runtime or a store, or of the simulation's own checkers — is
kept here with what it found, and replayed by the test suite and by ``threadloom simulate --regressions``:

* without ``plant``, the seed must now pass;
* with ``plant`` (test-only planted bugs), the seed must still catch the bug: it proves the checker that
  caught it keeps working.

Add a seed whenever a simulation fails: the replay command it prints names the seed and the options.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RegressionSeed:
    """A kept seed.

    Attributes:
        seed: the seed.
        store: the store it ran over (``memory`` or ``sqlite``).
        plant: the planted bugs it ran with (empty: the real code, which must pass).
        found: what the seed found when it first failed.
    """

    seed: int
    store: str = "memory"
    plant: tuple[str, ...] = ()
    found: str


REGRESSION_SEEDS: tuple[RegressionSeed, ...] = (
    # Found while the simulation was built (real code; each must pass now).
    RegressionSeed(
        seed=13,
        found="the trace differed between processes: the seed's fault kinds were drawn while iterating a "
        "frozenset, whose order depends on PYTHONHASHSEED (the kinds are now drawn in FAULT_KINDS order)",
    ),
    RegressionSeed(
        seed=12,
        found="checker: a subscription made after a delete sees the new incarnation from its first event; the "
        "deleted incarnation's numbers are gone, not skipped (seq 1 'skipped' was a false alarm)",
    ),
    RegressionSeed(seed=45, found="as seed 12: subscribe after a delete and a re-run of the thread"),
    RegressionSeed(seed=214, found="as seed 12, on another thread"),
    RegressionSeed(
        seed=1,
        found="runtime: a parent run was committed FAILED (and its queued run finished FAILED) when ctx.spawn met "
        "OutcomeUnknown from the store; a node failing on the store now ends its run without a FAILED "
        "checkpoint and the queue's next attempt recovers it",
    ),
    RegressionSeed(
        seed=4,
        found="runtime: as seed 1, for a child thread still held by a paused node's run (ThreadBusy)",
    ),
    RegressionSeed(seed=11, store="sqlite", found="as seed 1, over SQLite"),
    RegressionSeed(seed=16, store="sqlite", found="as seed 4, over SQLite"),
    RegressionSeed(
        seed=1637,
        found="runtime: a parent run was committed FAILED when the child run its node waited for lost the child "
        "thread to another run (StaleClaim); it now ends without a FAILED checkpoint, like ThreadBusy",
    ),
    RegressionSeed(seed=2460, found="as seed 1637: the parent's queued run finished FAILED on a child's StaleClaim"),
    RegressionSeed(
        seed=823,
        store="sqlite",
        found="checker: the clean-shutdown check flagged a claim whose release was lost to a store fault (and "
        "compared its expiry with the wrong node's clock); the runtime had asked to release it",
    ),
    RegressionSeed(seed=814, store="sqlite", found="as seed 823"),
    RegressionSeed(seed=1503, store="sqlite", found="as seed 823"),
    RegressionSeed(
        seed=109639,
        found="runtime: a paused run that had lost its thread (deleted and begun again) still spawned its child; "
        "the new run's spawn of the same child met that orphan RUNNING child and its run FAILED "
        "(InvalidRunState). A child's first commit is now fenced by the parent run's claim",
    ),
    RegressionSeed(seed=115796, found="as seed 109639, after a takeover of the parent"),
    # Planted bugs: each seed is the first that caught its bug (it must keep catching it). Chosen again when effect
    # intents added store calls to every trace, and (commit_unfenced, effect_unfenced, stamp_unlocked) when a node's
    # task began committing its own step, which changed the order of every trace; sweep_unguarded's (4 became 16)
    # and renew_unfenced's (15 became 29) when a cascade delete began reading the root's tenant (and, before its
    # first checkpoint, its claim) before it claims.
    RegressionSeed(seed=9, plant=("commit_unfenced",), found="a late commit applied with a released token"),
    RegressionSeed(seed=29, plant=("renew_unfenced",), found="a stale renew applied after a takeover"),
    RegressionSeed(
        seed=30, plant=("effect_unfenced",), found="a refused commit left its effect record (an intent) behind"
    ),
    RegressionSeed(seed=16, plant=("sweep_unguarded",), found="a sweep removed a protected run's newest checkpoint"),
    RegressionSeed(
        seed=1, plant=("seq_reuse_after_delete",), found="a re-run after a delete numbered its events from 1 again"
    ),
    RegressionSeed(
        seed=7,
        plant=("stamp_unfenced",),
        found="a walker paused mid-page past its lease's ttl stamped a thread after another node's walker took the "
        "walk over",
    ),
    RegressionSeed(
        seed=17,
        plant=("stamp_unlocked",),
        found="a commit landed between the stamp's derivation and its write; the thread's rows were left with the "
        "older attributes",
    ),
)
"""The kept seeds, oldest first."""
