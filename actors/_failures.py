"""How the runtime acts on a failure: the one place that decides whether an error may pass.

README "When the store fails" says it for users.

Every part of the runtime that meets an error of the store asks :func:`is_transient`:

* **transient** — a run repeats a step's commit the store could not take (:func:`can_repeat`: nothing of it
  applied) after a pause, for up to its claim's ttl; otherwise it ends and leaves the thread as its last commit
  left it (incomplete, for a recovery). The queue worker hands the entry back for a later attempt, a
  subscription pauses and reads again, the periodic sweep tries again at its next pass. Transient are the
  retryable kinds of :class:`~threadloom.domain.errors.ProcessingError` (``StoreUnavailable``,
  ``OutcomeUnknown``), a plain ``ProcessingError`` of unknown kind (a store that does not classify its failures
  yet), ``ThreadBusy`` and ``StaleClaim`` (another run holds or took the thread: a later attempt finds out what
  to do).
* **fatal** (:func:`is_fatal`) — a store failure no retry gets past: ``StoreCorrupt`` (a damaged file or row, a
  schema newer than the code) and ``StoreClosed`` (the store was closed under the runtime), and any failure of a
  store that reports itself closed. Nothing is retried: the run's handle raises the error at once, the queue
  worker does not lease the entry again, a subscription ends with it, the periodic sweep stops; each logs a
  line at error level naming ``error_kind``. The thread stays as it is, recoverable once the store is repaired.

Everything else (``RunFailed``, ``ValidationError``, ``TenantMismatch``, ...) is neither: the caller's own
outcome, handled where it arises.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, TypeVar

from threadloom.domain.errors import ProcessingError, StaleClaim, StoreClosed, StoreUnavailable, ThreadBusy

_E = TypeVar("_E", bound=BaseException)

RETRY_FIRST_PAUSE = timedelta(milliseconds=50)
"""The first pause before a transient failure is tried again (a commit, a subscription's read)."""
RETRY_MAX_PAUSE = timedelta(seconds=2)
"""Pauses double from :data:`RETRY_FIRST_PAUSE` up to this."""


def store_closed(store: Any) -> bool:
    """True when ``store`` (a Checkpointer or RunQueue, or None) says it is closed."""
    try:
        return store is not None and getattr(store, "closed", False) is True
    except Exception:  # a store whose ``closed`` itself fails says nothing
        return False


def is_transient(error: BaseException, store: Any = None) -> bool:
    """Whether a later attempt may get past ``error`` (the runtime retries or leaves the thread recoverable).

    Args:
        error: what a store call (or a node, through ``ctx``) raised.
        store: the store (or run queue) the call went to, if known: a ``ProcessingError`` of a store that says
            it is closed is never transient, whatever its kind.

    Returns:
        True for ``StoreUnavailable``, ``OutcomeUnknown``, a plain ``ProcessingError`` (unknown kind),
        ``ThreadBusy`` and ``StaleClaim``; False for everything else (``StoreCorrupt``, ``StoreClosed``, errors
        that are not the store's).
    """
    if isinstance(error, ProcessingError):
        if store_closed(store):
            return False
        return type(error) is ProcessingError or type(error).retryable
    return isinstance(error, (ThreadBusy, StaleClaim))


def is_fatal(error: BaseException, store: Any = None) -> bool:
    """Whether ``error`` is a store failure no retry gets past: a ``ProcessingError`` that is not transient.

    ``StoreCorrupt``, ``StoreClosed``, and any ``ProcessingError`` of a ``store`` that says it is closed.
    """
    return isinstance(error, ProcessingError) and not is_transient(error, store)


def can_repeat(error: BaseException, store: Any = None) -> bool:
    """Whether the very same call may be made again at once after a pause: nothing of it was applied.

    True only for ``StoreUnavailable`` of an open store. An ``OutcomeUnknown`` write may have applied, so the
    runtime reads the thread first instead of repeating it.
    """
    return isinstance(error, StoreUnavailable) and not store_closed(store)


def retry_pause(failures: int) -> timedelta:
    """The pause before try ``failures + 1``: :data:`RETRY_FIRST_PAUSE` doubling, at most :data:`RETRY_MAX_PAUSE`."""
    pause = RETRY_FIRST_PAUSE * (2 ** min(max(failures - 1, 0), 16))
    return min(pause, RETRY_MAX_PAUSE)


def error_kind(error: BaseException) -> str:
    """The kind of ``error`` for a log line: its class name in snake case (``"store_corrupt"``, ``"stale_claim"``)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


def closed_under(error: _E, store: Any, what: str, advice: str) -> _E | StoreClosed:
    """``error`` as the runtime reports it when the store was closed under ``what`` (a run, a worker, a watch).

    A ``ProcessingError`` of a closed store (a ``StoreClosed``, or any failure of a store that says it is closed)
    becomes a :class:`StoreClosed` of the same operation whose message says what stopped and ``advice``; its
    ``__cause__`` is the original. Any other error is returned as it is.
    """
    if not isinstance(error, ProcessingError) or not (isinstance(error, StoreClosed) or store_closed(store)):
        return error
    closed = StoreClosed(error.operation, f"the store was closed under {what}; {advice}")
    closed.__cause__ = error
    return closed
