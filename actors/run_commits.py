"""How a :class:`~threadloom.actors.thread_actor.ThreadRun` commits: each commit fenced by the run's claim and
logged, a step's commit repeated after a pause while the store is unavailable, a lost claim noted once.

:class:`RunCommits` is mixed into ``ThreadRun``; its methods run under the run's lock, like all of the run's logic.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from threadloom.actors._failures import can_repeat, error_kind, retry_pause
from threadloom.actors.logs import describe as _describe
from threadloom.actors.logs import elapsed_ms
from threadloom.actors.runs import RunEnv, RunSpec
from threadloom.actors.scheduler import Cancellable
from threadloom.domain.errors import OutcomeUnknown, StaleClaim, ThreadloomError, ValidationError
from threadloom.domain.values import Commit, StoredCheckpoint

if TYPE_CHECKING:
    from threadloom.persistence.logs import SafeLogger


@attrs.frozen(eq=False)
class _RetryDue:
    """The pause before repeating a step's commit (the store said ``StoreUnavailable``) ended."""

    generation: int


@attrs.define(eq=False)
class _PendingCommit:
    """A step's commit the run is applying: tried again after a pause while the store is unavailable."""

    commit: Commit
    graph_node: str | None
    applied: Callable[..., None]
    since: datetime
    refused: Callable[..., None] | None = None
    """What to do when the store refuses the commit as invalid (the same commit would be refused again)."""
    args: tuple[Any, ...] = ()
    """Passed to ``applied`` (and to ``refused``, after the refusal)."""
    failures: int = 0


class RunCommits:
    """The commits of a run (mixed into ``ThreadRun``, which provides the attributes below and ``_finish_error``)."""

    spec: RunSpec
    env: RunEnv
    token: int | None
    lost: StaleClaim | None
    finished: bool
    _log: SafeLogger
    _info: bool
    """Whether the run's logger writes info lines (else the ``commit.applied`` line is not even built)."""
    _send: Callable[[object], None]
    _pending: _PendingCommit | None
    _retry_timer: Cancellable | None
    _retry_generation: int

    def _finish_error(self, error: BaseException, *, release: bool) -> None:
        raise NotImplementedError

    def _ms(self, since: datetime) -> float:
        return elapsed_ms(self.env.clock, since)

    def _stop_retry(self) -> None:
        self._retry_generation += 1
        self._pending = None
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None

    def _commit(self, commit: Commit, graph_node: str | None, started: datetime | None = None) -> None:
        """Commits ``commit`` (fenced by the run's token); raises what the store raised, after logging it.

        ``started``: when the commit began, for the logged duration (None: now, by the runtime's clock).
        """
        if started is None:
            started = self.env.clock.now()

        def log_refused(error: ThreadloomError) -> None:
            self._log.warning(
                "commit.refused",
                op="commit",
                token=commit.token,
                graph_node=graph_node,
                error=_describe(error),
                duration_ms=self._ms(started),
            )

        try:
            self.env.store.commit(self.spec.thread_id, commit)
        except OutcomeUnknown as error:
            cp = commit.checkpoint
            latest = self._latest_quietly()
            if cp is None or latest is None or latest.checkpoint.id != cp.id:
                log_refused(error)
                raise
        except ThreadloomError as error:
            log_refused(error)
            if self._own_claim_lost(error):
                assert isinstance(error, StaleClaim)
                self._note_lost(error, "commit")
            raise
        if not self._info:
            return
        self._log.info(
            "commit.applied",
            op="commit",
            token=commit.token,
            graph_node=graph_node,
            checkpoint_id=commit.checkpoint.id if commit.checkpoint is not None else None,
            status=commit.checkpoint.status.value if commit.checkpoint is not None else None,
            events=len(commit.events),
            effects=len(commit.effects),
            duration_ms=self._ms(started),
        )

    def _commit_then(
        self,
        commit: Commit,
        graph_node: str | None,
        applied: Callable[..., None],
        refused: Callable[..., None] | None = None,
        args: tuple[Any, ...] = (),
        now: datetime | None = None,
    ) -> None:
        """Commits a step's ``commit`` and then calls ``applied(*args)``; ends the run if the store refuses or fails.

        A ``ValidationError`` (e.g. a record over the store's ``max_json_size``: nothing applied, and the same
        commit is refused again, so it is never retried) is handed to ``refused(error, *args)`` when given, else
        ends the run.

        A ``StoreUnavailable`` (nothing applied) is tried again after a pause (``retry_pause``: 50 ms doubling
        to 2 s, through a ``_RetryDue`` message, so renewals go on meanwhile) for as long as the claim's ``ttl``
        since the first failure; then the run ends with it. A cancel or a lost claim during a pause ends the run
        at once, without the step (a recovery runs its node again).

        ``now``: the runtime clock's reading the caller just took (None: read it here).
        """
        since = self.env.clock.now() if now is None else now
        self._pending = _PendingCommit(commit, graph_node, applied, since, refused, args)
        self._try_pending()

    def _try_pending(self) -> None:
        pending = self._pending
        assert pending is not None
        try:
            # The first try began when the pending commit was made; a repeat begins now.
            self._commit(pending.commit, pending.graph_node, pending.since if pending.failures == 0 else None)
        except StaleClaim as error:
            self._pending = None
            self._finish_error(error, release=False)
            return
        except ValidationError as error:
            self._pending = None
            if pending.refused is not None:
                pending.refused(error, *pending.args)
            else:
                self._finish_error(error, release=True)
            return
        except Exception as error:
            now = self.env.clock.now()
            if can_repeat(error, self.env.store) and now - pending.since < self.env.claim_policy.ttl:
                pending.failures += 1
                pause = retry_pause(pending.failures)
                self._log.warning(
                    "commit.retrying",
                    op="commit",
                    token=pending.commit.token,
                    graph_node=pending.graph_node,
                    attempt=pending.failures + 1,
                    pause_ms=pause.total_seconds() * 1000,
                    error=_describe(error),
                    error_kind=error_kind(error),
                )
                self._retry_generation += 1
                generation = self._retry_generation
                self._retry_timer = self.env.scheduler.call_at(now + pause, lambda: self._send(_RetryDue(generation)))
                return
            self._pending = None
            self._finish_error(error, release=True)
            return
        self._pending = None
        pending.applied(*pending.args)

    def retry_due(self, generation: int) -> None:
        """Tries the pending commit again (its pause ended)."""
        if self.finished or generation != self._retry_generation or self._pending is None:
            return
        self._retry_timer = None
        self._try_pending()

    def _latest_quietly(self) -> StoredCheckpoint | None:
        try:
            return self.env.store.latest(self.spec.thread_id)
        except ThreadloomError:
            return None

    def _own_claim_lost(self, error: BaseException) -> bool:
        """True for a StaleClaim on this run's thread (not on the thread of a fence)."""
        return isinstance(error, StaleClaim) and error.thread_id == self.spec.thread_id

    def _note_lost(self, error: StaleClaim, op: str) -> None:
        if self.lost is None:
            self.lost = error
            self.env.metrics.run("claim_lost", self.spec.graph.graph_id)
            self._log.warning("claim.lost", op=op, token=self.token, current=error.current, error=str(error))
