"""The delay rule of every retry that waits between attempts at a whole piece of work.

Flink's exponential-delay restart strategy and Debezium Server's retries, in small: the
``n``-th attempt in a row waits ``first_s * 2**(n-1)`` seconds, capped at ``max_s``, each delay
moved by up to ``JITTER`` of itself either way (so what failed on the same outage does not all
come back in the same second). ``max_restarts=None`` (the default) tries forever; a number
gives up once that many attempts in a row have failed.

Two users, one rule (driver):

- ``tablestore_cdc.pipeline.restarts``: the replication job restarting its failed queries
  (``replicate --restart-backoff FIRST[:MAX] --max-restarts N``);
- ``connector.multiplex``: one table of a multi-table query retried after a retryable error
  (the source or the meta store unreachable) while the other tables go on
  (``tables.retryBackoff``, ``tables.maxRetries``).

(A single call to a service is retried much more briefly, inside the client:
``connector.retry``.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: the first attempt's delay and the cap of the delays (seconds)
FIRST_S = 1.0
MAX_S = 60.0
#: each delay is moved by up to this fraction of itself, either way
JITTER = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed piece of work is tried again (see the module docstring)."""

    first_s: float = FIRST_S
    max_s: float = MAX_S
    #: attempts in a row before giving up; None: forever
    max_restarts: int | None = None

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt number ``attempt`` (1 for the first in a row)."""
        base = min(self.max_s, self.first_s * 2.0 ** max(0, attempt - 1))
        return base * (rng or random).uniform(1.0 - JITTER, 1.0 + JITTER)

    def gives_up(self, attempt: int) -> bool:
        """Is attempt number ``attempt`` (in a row) one too many?"""
        return self.max_restarts is not None and attempt > self.max_restarts


def parse_backoff(text: str) -> tuple[float, float]:
    """``FIRST[:MAX]`` in seconds (MAX defaults to the larger of ``MAX_S`` and FIRST) as
    (first, cap); ``ValueError`` unless ``0 < FIRST <= MAX`` and both are finite (the caller
    raises its own typed error naming its flag or option)."""
    first_text, _, max_text = text.partition(":")
    try:
        first = float(first_text)
        cap = float(max_text) if max_text else max(MAX_S, first)
    except ValueError:
        first = cap = -1.0
    if not (0 < first <= cap < float("inf")):
        raise ValueError(f"expected FIRST[:MAX] in seconds, 0 < FIRST <= MAX: {text!r}")
    return first, cap
