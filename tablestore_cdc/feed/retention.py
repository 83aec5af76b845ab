"""Retention headroom: how long a channel's oldest unread change has before the service trims
it (``meta lag``, the feed's and the dashboard's channel lag; CLI and dashboard processes).

A tunnel service keeps a channel's history for a limited time: Tablestore 7 days (the embedded
store follows it), DynamoDB Streams 24 hours. A query whose oldest unread change gets older than
that loses records (docs/operations.md, trimmed data; ``onDataLoss``, docs/resnapshot.md). The
headroom is the retention minus the age of the oldest unread change; it warns once that age
passes ``WARN_AT`` of the retention. The retention is what the service keeps, not read from it:
``meta lag --retention`` overrides the default of the endpoint's scheme.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

#: seconds a service keeps a channel's history, by endpoint scheme (others: ``DEFAULT_S``)
DEFAULT_S = 7 * 24 * 3600.0
BY_SCHEME = {"dynamodb-streams": 24 * 3600.0}
#: the share of the retention an unread change may reach before the headroom warns
WARN_AT = 0.8


def default_retention_s(endpoint: str | None) -> float:
    """The retention of the service behind ``endpoint`` (a tunnel endpoint URI)."""
    try:
        scheme = urlsplit(endpoint or "").scheme
    except ValueError:
        scheme = ""
    return BY_SCHEME.get(scheme, DEFAULT_S)


def headroom(seconds_behind: float | None, retention_s: float) -> dict[str, Any]:
    """``retention_s``, ``headroom_s`` (None when the age is unknown) and ``retention_warning``
    for a channel whose oldest unread change is ``seconds_behind`` old."""
    if seconds_behind is None:
        return {"retention_s": retention_s, "headroom_s": None, "retention_warning": False}
    return {"retention_s": retention_s, "headroom_s": retention_s - seconds_behind,
            "retention_warning": seconds_behind >= WARN_AT * retention_s}
