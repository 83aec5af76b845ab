"""The job's restart strategy: how long to wait before restarting a failed query, and when to
give up (driver).

Flink's exponential-delay restart strategy and Debezium Server's retries, in small: the
``n``-th restart in a row waits ``first_s * 2**(n-1)`` seconds, capped at ``max_s``, each
delay moved by up to ``JITTER`` of itself either way (so jobs that failed on the same outage
do not all come back in the same second). The count is of restarts *in a row*: a run that
committed a batch resets it, so a job that survives an outage a month starts its next one
with a short delay again. ``max_restarts=None`` (the default) restarts forever; a number
ends the job once that many restarts in a row have failed (``replicate`` exits 3).

Used by ``tablestore_cdc.pipeline.job``; the flags are ``replicate --max-restarts`` and
``--restart-backoff FIRST[:MAX]``. (A single call to a service is retried much more briefly,
inside the query: ``connector.retry``.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tablestore_cdc.lakehouse.errors import ApplyOptionError

#: the first restart's delay and the cap of the delays (seconds)
FIRST_S = 1.0
MAX_S = 60.0
#: each delay is moved by up to this fraction of itself, either way
JITTER = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed query is restarted (see the module docstring)."""

    first_s: float = FIRST_S
    max_s: float = MAX_S
    #: restarts in a row before the job gives up; None: forever
    max_restarts: int | None = None

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before restart number ``attempt`` (1 for the first in a row)."""
        base = min(self.max_s, self.first_s * 2.0 ** max(0, attempt - 1))
        return base * (rng or random).uniform(1.0 - JITTER, 1.0 + JITTER)

    def gives_up(self, attempt: int) -> bool:
        """Is restart number ``attempt`` (in a row) one too many?"""
        return self.max_restarts is not None and attempt > self.max_restarts


def restart_policy(backoff: str, max_restarts: int | None) -> RestartPolicy:
    """The policy of ``--restart-backoff FIRST[:MAX]`` (seconds; MAX defaults to the larger
    of 60 and FIRST) and ``--max-restarts``. A bad value raises ``ApplyOptionError`` naming
    the flag."""
    first_text, _, max_text = backoff.partition(":")
    try:
        first = float(first_text)
        cap = float(max_text) if max_text else max(MAX_S, first)
    except ValueError:
        first = cap = -1.0
    if not (0 < first <= cap < float("inf")):
        raise ApplyOptionError(option="--restart-backoff", problem="expected FIRST[:MAX] in "
                               "seconds, 0 < FIRST <= MAX", value=backoff,
                               allowed="e.g. 1:60 (the default), 5, 0.5:30")
    if max_restarts is not None and max_restarts < 0:
        raise ApplyOptionError(option="--max-restarts", problem="must not be negative",
                               value=max_restarts, allowed="0 (never restart) or more; "
                               "leave it out to restart forever")
    return RestartPolicy(first, cap, max_restarts)
