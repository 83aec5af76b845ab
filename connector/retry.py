"""Bounded retries of transient tunnel-service and meta-store errors (driver and executors).

``with_retries(client)`` wraps a ``TunnelService`` or a ``MetaStore`` so that a call raising a
*retryable* error (a ``CdcError`` whose class says ``retryable = True``: ``TransientTunnelError``,
``TransientMetaStoreError`` — throttling, a lock held too long, a service restarting) is tried
again with exponential backoff and jitter, at most ``ATTEMPTS`` times and for at most
``DEADLINE_S`` seconds in all (no attempt starts later; an attempt that waits itself, as a
backend's own retries do, leaves less time), and then re-raised with what happened: how many
attempts over how long, and that the query can be restarted on the same checkpoint
(``gave_up``). Any other error (a conflict, a stale checkpoint, a missing batch, data loss) is
raised at once: retrying cannot fix it, and some of them (``EndCheckpointConflictError``,
``StaleCheckpointError``) are answers the caller acts on.

Why retrying a whole call is safe, even when the failed attempt took effect and only its answer
was lost:

- every meta-store write is put-if-absent or idempotent: ``create_batch`` and ``put_manifest``
  return the row already stored (ours), ``put_end_checkpoint`` accepts the same position again,
  ``mark_committed`` / ``mark_pushed`` only move a batch's state forward, ``gc`` deletes what
  its rule selects and deleting twice is a no-op;
- a tunnel checkpoint push with the same sequence number is accepted again (FINISHED included),
  ``ensure_tunnel`` finds the tunnel a lost answer created, and reads only read.

Where it is applied: once, where the source opens its clients (``connector.clients``: the
driver's planning process and Python workers on executors), around the fault hook a test may
inject.
The retry loop itself is tenacity's; the pauses go through ``sleep`` (``time.sleep``; tests pass
a fake clock's to check the backoff without waiting for it).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from connector.errors import CdcError
from connector.proxy import ClientProxy

log = logging.getLogger("connector.retry")

#: attempts per call, the first one included
ATTEMPTS = 6
#: no new attempt starts later than this after the first one (seconds)
DEADLINE_S = 5.0
#: first backoff, its cap, and the random jitter added to each (seconds)
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
BACKOFF_JITTER_S = 0.05

#: methods that are housekeeping, not service calls: never retried
_NOT_RETRIED = frozenset({"close"})

Client = TypeVar("Client")


def is_retryable(error: BaseException) -> bool:
    """True for the product's errors that say retrying may succeed."""
    return isinstance(error, CdcError) and error.retryable


def retrying(what: str = "call", attempts: int = ATTEMPTS, first_attempt: int = 1,
             sleep: Callable[[float], None] = time.sleep,
             deadline_s: float = DEADLINE_S) -> Retrying:
    """The retry policy: ``attempts`` attempts, none started later than ``deadline_s`` after
    the first, exponential backoff with jitter, retryable errors only, the last error
    re-raised unchanged. ``first_attempt``: the number the first of them has in the whole call
    (for the log line); ``sleep``: how to pause between attempts."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.info("%s failed (attempt %d of at most %d within %.0f s): %s; retrying in %.2f s",
                 what, state.attempt_number + first_attempt - 1, ATTEMPTS, DEADLINE_S, error,
                 state.next_action.sleep if state.next_action else 0.0)

    return Retrying(
        stop=stop_after_attempt(attempts) | stop_after_delay(max(deadline_s, 0.0)),
        # BACKOFF_INITIAL_S * 2**(n-1) capped at BACKOFF_MAX_S, plus up to BACKOFF_JITTER_S
        wait=(wait_exponential(multiplier=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S)
              + wait_random(0, BACKOFF_JITTER_S)),
        retry=retry_if_exception(is_retryable),
        reraise=True,
        before_sleep=before_sleep,
        sleep=sleep,
    )


def gave_up(error: CdcError, attempts: int, elapsed_s: float) -> CdcError:
    """``error``, the last of ``attempts`` retried ones, saying so and what the user can do:
    every write is idempotent and the meta chain is consistent after any failure, so a restart
    on the same checkpoint replays what was lost and skips nothing. The same type and fields
    (``detail`` extended), so callers catching it see no difference."""
    note = (f"gave up after {attempts} attempt(s) in {elapsed_s:.1f} s; the query can be "
            "restarted on the same checkpoint location: nothing is lost")
    if isinstance(error.fields.get("detail"), str):
        return type(error)(**{**error.fields, "detail": f"{error.fields['detail']} ({note})"})
    error.add_note(note)
    return error


class _RetryingClient(ClientProxy):
    """Proxy calling every public method of ``target`` under the retry policy."""

    passthrough = _NOT_RETRIED

    def __init__(self, target: Any, sleep: Callable[[float], None]) -> None:
        super().__init__(target)
        self._kind = type(target).__name__
        self._sleep = sleep

    def _call(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        # The first attempt is a plain call: building tenacity's policy costs ~40 us, paid per
        # call it would be ~40 ms per batch on a 1,000-channel tunnel. The policy only runs
        # once an attempt failed with a retryable error.
        began = time.monotonic()
        try:
            return method(*args, **kwargs)
        except CdcError as error:
            if not error.retryable:
                raise
            what = f"{self._kind}.{name}"
            pause = BACKOFF_INITIAL_S + random.uniform(0, BACKOFF_JITTER_S)
            log.info("%s failed (attempt 1 of at most %d within %.0f s): %s; retrying in "
                     "%.2f s", what, ATTEMPTS, DEADLINE_S, error, pause)
        self._sleep(pause)
        # the deadline counts from the first attempt: an attempt that itself waited (a
        # backend's own retries) leaves less time for the next ones
        policy = retrying(what, attempts=ATTEMPTS - 1, first_attempt=2, sleep=self._sleep,
                          deadline_s=DEADLINE_S - (time.monotonic() - began))
        try:
            return policy(method, *args, **kwargs)
        except CdcError as error:
            if not error.retryable:
                raise
            attempts = 1 + int(policy.statistics.get("attempt_number", 1))
            raise gave_up(error, attempts, time.monotonic() - began) from None

    def __repr__(self) -> str:
        return f"<retrying {self._target!r}>"


def with_retries(client: Client, sleep: Callable[[float], None] = time.sleep) -> Client:
    """``client`` (a ``TunnelService`` or ``MetaStore``) with its calls retried on transient
    errors; typed as the client itself, attribute access passes through. ``sleep`` pauses
    between attempts."""
    if isinstance(client, _RetryingClient):
        return client  # type: ignore[return-value]
    return _RetryingClient(client, sleep)  # type: ignore[return-value]
