"""The job's restart strategy: how long to wait before restarting a failed query, and when to
give up (driver).

The rule is ``cdc_common.backoff.RestartPolicy`` (capped exponential delay with jitter), the
same one a multi-table query uses to retry one table after an outage (``connector.multiplex``).
The count is of restarts *in a row*: a run that committed a batch resets it, so a job that
survives an outage a month starts its next one with a short delay again.

Used by ``tablestore_cdc.pipeline.job``; the flags are ``replicate --max-restarts`` and
``--restart-backoff FIRST[:MAX]``, parsed here. (A single call to a service is retried much
more briefly, inside the query: ``connector.retry``.)
"""

from __future__ import annotations

from cdc_common.backoff import FIRST_S, JITTER, MAX_S, RestartPolicy, parse_backoff
from tablestore_cdc.lakehouse.errors import ApplyOptionError

__all__ = ["FIRST_S", "JITTER", "MAX_S", "RestartPolicy", "restart_policy"]


def restart_policy(backoff: str, max_restarts: int | None) -> RestartPolicy:
    """The policy of ``--restart-backoff FIRST[:MAX]`` (seconds; MAX defaults to the larger
    of 60 and FIRST) and ``--max-restarts``. A bad value raises ``ApplyOptionError`` naming
    the flag."""
    try:
        first, cap = parse_backoff(backoff)
    except ValueError:
        raise ApplyOptionError(option="--restart-backoff", problem="expected FIRST[:MAX] in "
                               "seconds, 0 < FIRST <= MAX", value=backoff,
                               allowed="e.g. 1:60 (the default), 5, 0.5:30") from None
    if max_restarts is not None and max_restarts < 0:
        raise ApplyOptionError(option="--max-restarts", problem="must not be negative",
                               value=max_restarts, allowed="0 (never restart) or more; "
                               "leave it out to restart forever")
    return RestartPolicy(first, cap, max_restarts)
