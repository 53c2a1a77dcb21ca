"""The runtime's policies: claims, subscription watches, the queue worker, the sweep schedule and child retention.

Frozen attrs values that validate on construction (``ValidationError`` naming the field). Durations are
``timedelta``; every time they measure is read from the runtime's ``Clock`` (the store's clock decides expiry).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs

from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError
from threadloom.domain.values import SweepPolicy


def _positive(field: str):
    return lambda _inst, _attr, value: v.check_positive_duration(field, value)


RENEW_EVERY = timedelta(seconds=10)
"""The longest renewal period a policy derives when none is given: ``min(RENEW_EVERY, ttl / 3)``."""


def _derived_renewal(ttl_field: str):
    """The default of a policy's ``renew_every``: 10 s, or a third of its ttl when that is shorter, so a short
    ttl alone makes a valid policy (a bad ttl is left to the ttl's own check)."""

    def derive(policy: Any) -> Any:
        ttl = getattr(policy, ttl_field)
        return min(RENEW_EVERY, ttl / 3) if isinstance(ttl, timedelta) else RENEW_EVERY

    return attrs.Factory(derive, takes_self=True)


@attrs.frozen(kw_only=True)
class ClaimPolicy:
    """How a run holds its thread: claimed for ``ttl``, renewed every ``renew_every``.

    A run whose process dies stops renewing; its claim expires ``ttl`` after the last renewal, by the store's
    clock, and another runtime may then recover the thread.

    Attributes:
        ttl: how long a claim lives without renewal (> 0; default 30 s).
        renew_every: how often a live run renews it, by the runtime's clock (> 0 and < ``ttl``). Default: 10 s,
            or a third of ``ttl`` when that is shorter (``ClaimPolicy(ttl=timedelta(seconds=3))`` renews every 1 s).

    Raises:
        ValidationError: a duration is not positive, or a ``renew_every`` given is not shorter than ``ttl``.
    """

    ttl: timedelta = attrs.field(default=timedelta(seconds=30), validator=_positive("claim_policy.ttl"))
    renew_every: timedelta = attrs.field(
        default=_derived_renewal("ttl"), validator=_positive("claim_policy.renew_every")
    )

    def __attrs_post_init__(self) -> None:
        if self.renew_every >= self.ttl:
            raise ValidationError(
                "claim_policy.renew_every",
                (f"must be shorter than ttl ({self.ttl}), got {self.renew_every}",),
            )


@attrs.frozen(kw_only=True)
class WatchPolicy:
    """How a subscription watches for new events after its replay.

    Attributes:
        enabled: watch after the replay (default); False ends the subscription once the replay is delivered.
        poll_interval: the ``timeout`` of each ``await_events_after`` call (> 0; default 250 ms): a store that
            polls sees a commit at most this late; one that wakes on commits returns at once.
    """

    enabled: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    poll_interval: timedelta = attrs.field(
        default=timedelta(milliseconds=250), validator=_positive("watch_policy.poll_interval")
    )


def _opt_attempts(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None:
        v.check_int("serve_policy.max_attempts", value, low=1)


@attrs.frozen(kw_only=True)
class ServePolicy:
    """How ``GraphRuntime.serve`` works the run queue.

    Attributes:
        lease_ttl: how long a lease lives without renewal (> 0; default 30 s), by the store's clock.
        renew_every: how often a worker renews its lease while the run goes on (< ``lease_ttl``). Default: 10 s,
            or a third of ``lease_ttl`` when that is shorter.
        poll_interval: how long a worker waits before asking again when nothing is leasable (default 250 ms).
        busy_delay: how long an entry whose thread another run holds waits before it is leased again
            (default 1 s).
        max_attempts: an entry leased more often than this is finished ``FAILED`` (default 10; None: never). A
            lease a stopping worker handed back (a signal, ``Server.stop``, ``GraphRuntime.close``) is not counted.
    """

    lease_ttl: timedelta = attrs.field(default=timedelta(seconds=30), validator=_positive("serve_policy.lease_ttl"))
    renew_every: timedelta = attrs.field(
        default=_derived_renewal("lease_ttl"), validator=_positive("serve_policy.renew_every")
    )
    poll_interval: timedelta = attrs.field(
        default=timedelta(milliseconds=250), validator=_positive("serve_policy.poll_interval")
    )
    busy_delay: timedelta = attrs.field(default=timedelta(seconds=1), validator=_positive("serve_policy.busy_delay"))
    max_attempts: int | None = attrs.field(default=10, validator=_opt_attempts)

    def __attrs_post_init__(self) -> None:
        if self.renew_every >= self.lease_ttl:
            raise ValidationError(
                "serve_policy.renew_every",
                (f"must be shorter than lease_ttl ({self.lease_ttl}), got {self.renew_every}",),
            )


@attrs.frozen(kw_only=True)
class SweepSchedule:
    """The supervisor's periodic retention sweep: a full pass with ``policy`` every ``every``.

    Attributes:
        policy: the sweep policy (retention, page size, tombstone age).
        every: the time from the end of one pass to the start of the next, by the runtime's clock (> 0).
    """

    policy: SweepPolicy = attrs.field(validator=attrs.validators.instance_of(SweepPolicy))
    every: timedelta = attrs.field(default=timedelta(minutes=5), validator=_positive("sweep.every"))


@attrs.frozen(kw_only=True)
class ChildRetention:
    """Which children of a thread the runtime keeps when a run of the thread ends (a graph's ``child_retention``).

    When a run of a graph with a child retention ends ``COMPLETED`` or ``SUSPENDED``, the runtime, still holding
    the parent thread's claim, pages through the parent's children (oldest first: the order their first commits
    landed) and deletes every child older than the newest ``keep`` whose latest checkpoint is settled
    (``COMPLETED`` or ``FAILED``), together with that child's own descendants. Each delete is fenced by the
    parent's claim: a run that lost the parent (its claim expired and another run took it over) deletes nothing
    more, so the successor never finds a child it may take up gone. A child that is incomplete (``RUNNING``) or
    ``SUSPENDED``, or that a live run holds, is kept and looked at again when the next run of the parent ends.
    Deleted children leave tombstones, as every delete does (a sweep with a ``tombstone_age`` reclaims them).

    The count is the only measure: the store keeps no commit time of a child that the runtime can read, so age
    is not offered here (prune histories by age with a ``RetentionPolicy`` sweep).

    Attributes:
        keep: how many of the newest children are kept whatever their status (an int >= 0; 0 keeps none).

    Raises:
        ValidationError: ``keep`` is not an int >= 0 (field ``child_retention.keep``).
    """

    keep: int = attrs.field(validator=lambda _i, _a, value: v.check_int("child_retention.keep", value, low=0))
