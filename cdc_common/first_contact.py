"""A query's first contact with a service: where a network error is a configuration error.

When a query starts, the driver reaches its tunnel service and its meta store for the first
time. If one of them cannot be reached at all then -- the host name does not resolve, nothing
listens on the port, the server closes the connection without an HTTP answer (``http://`` sent
to an https port), the connection attempt times out -- the endpoint is almost always wrong (a
typo, the wrong port or scheme), and retrying it for seconds only hides that. The rule:

- **At the query's start** (inside ``query_start()``: the driver's ``load()`` and the binding
  of the stream reader to its tunnel and meta store), a client that has **had no answer yet**
  reports such an error at once, in one line naming the endpoint and what to fix
  (``unreachable_problem``). Nothing was created yet; once the endpoint is right, or the
  service is up, the query is started again. A connection closed without an HTTP answer is
  one sample of a wrong scheme or port, but also what a load balancer or a restarting peer
  does once: it counts only after ``DROPS`` such attempts in a row (the helper pauses
  ``DROP_PAUSE_S`` between them, so they span about a second), and the line gives that
  evidence ("3 attempts over 1.1 s, each closed without an answer"). A refused connection and
  a name that does not resolve stay immediate.
- **Afterwards**, and always on executors (their clients are new in every worker process, but
  serve a query that has started), the same errors are an outage: retried with backoff
  (``connector.retry``), and a query that outlives the retries fails saying it can be
  restarted on the same checkpoint with nothing lost.

A TLS failure is a configuration error at any time (``cdc_common.tls``). Both Tablestore
clients follow the rule: the Tunnel wire client (``connector.tunnel.tablestore.transport``) and
the Tablestore meta store (``meta_store.tablestore``). The flag is a context variable of the
calling thread, so a client's retry loop on an executor or in a renewal thread never sees it.
"""

from __future__ import annotations

import contextvars
import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

#: connections closed without an answer, in a row, before that is a configuration error
DROPS = 3
#: the pause after each dropped attempt but the last, before the caller's next attempt (s)
DROP_PAUSE_S = 0.5


@dataclass
class _Start:
    """One ``query_start()``: per (option, endpoint), the times of the attempts closed without
    an answer so far."""

    drops: dict[tuple[str, str], list[float]] = field(default_factory=dict)


_AT_QUERY_START: contextvars.ContextVar[_Start | None] = contextvars.ContextVar(
    "at_query_start", default=None)


@contextmanager
def query_start() -> Iterator[None]:
    """The calls inside are a query's first contact with its services (driver only)."""
    token = _AT_QUERY_START.set(_Start())
    try:
        yield
    finally:
        _AT_QUERY_START.reset(token)


def at_query_start() -> bool:
    """Is the calling thread inside ``query_start()``?"""
    return _AT_QUERY_START.get() is not None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: urllib3 keeps the cause in ``reason``, in ``args`` or as
    ``__cause__``/``__context__``."""
    seen: set[int] = set()
    pending = [exc]
    while pending and len(seen) < 16:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [getattr(current, "reason", None), current.__cause__, current.__context__,
                   *getattr(current, "args", ())]
        pending += [w for w in wrapped if isinstance(w, BaseException)]


def _dropped_enough(endpoint: str, option: str) -> str | None:
    """Count one attempt closed without an answer (the calling client's retry loop, driver,
    inside ``query_start()``): the evidence ("3 attempts over 1.1 s, ...") once ``DROPS`` of
    them came in a row; before that ``None``, after a pause of ``DROP_PAUSE_S`` (the caller
    then retries as after an outage)."""
    start = _AT_QUERY_START.get()
    if start is None:
        return None
    now = time.monotonic()
    drops = start.drops.setdefault((option, endpoint), [])
    drops.append(now)
    if len(drops) >= DROPS:
        return (f"{len(drops)} attempts over {now - drops[0]:.1f} s, each closed without an "
                "answer")
    time.sleep(DROP_PAUSE_S)
    return None


def unreachable_problem(exc: BaseException, endpoint: str, option: str) -> str | None:
    """One line saying why ``endpoint`` (the value of ``option``, secrets removed) gave no
    answer at all and what to fix, when ``exc`` is such a network error; ``None`` for any other
    error (it keeps its usual handling), and for a connection closed without an answer until
    ``DROPS`` attempts in a row were (module docstring; called by the Tunnel transport and the
    Tablestore meta store on the driver, inside ``query_start()``)."""
    parts = urlsplit(endpoint)
    where = parts.netloc.rpartition("@")[2] or endpoint
    host = parts.hostname or where
    for cause in _chain(exc):
        name = type(cause).__name__
        if isinstance(cause, socket.gaierror) or name == "NameResolutionError":
            what, fix = f"the host name {host!r} does not resolve", "check its host name"
        elif isinstance(cause, ConnectionRefusedError):
            what = f"nothing listens on {where} (connection refused)"
            fix = "check its host and port, and that the service is running"
        elif name == "ConnectTimeoutError":
            what = f"no connection to {where} within the connect timeout"
            fix = "check its host and port, and the network path (firewall, VPC endpoint)"
        elif isinstance(cause, ConnectionResetError | http.client.BadStatusLine):
            evidence = _dropped_enough(endpoint, option)
            if evidence is None:
                return None  # retried: one drop is no evidence yet
            what = f"{where} closed the connection without an HTTP answer ({evidence})"
            fix = ("if that port serves https, use https://" if parts.scheme == "http"
                   else "check that the endpoint is the service's address")
        else:
            continue
        return (f"{option} {endpoint}: {what} at the query's start; {fix}, then start the "
                "query again (nothing was created)")
    return None


__all__ = ["at_query_start", "query_start", "unreachable_problem"]
