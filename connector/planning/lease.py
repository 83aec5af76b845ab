"""One live query per source: the lease a query holds in the meta store (driver).

Two queries reading one tunnel (one DataFrame written to two sinks makes two queries; a second
checkpoint directory; two applications) break each other's delivery: each pushes its own
checkpoints, so one query's push releases child channels the other has not finished the
parents of, and retention counts the other's batches as its own. So a query holds a lease on
its source (``SourceIdentity``) in the meta store while it runs (``MetaStore.take_lease``, a
compare-and-set row per source), and a second query is refused with ``SourceInUseError``,
naming ``tunnel.name`` and the one-query-many-sinks pattern.

- **Taken** when the query binds, before it creates anything (``StreamProtocol``): at its
  first ``initialOffset``, ``latestOffset`` or ``partitions``.
- **Held** by this planning process (``owner_id``: host, pid and a random part), renewed every
  ``RENEW_EVERY_S`` by a small daemon thread, so a batch running for an hour keeps it, and
  carrying the newest batch the process planned or committed (``tip``).
- **Released** at once when the query stops (``close``). Spark stops a query's planning
  process with SIGTERM (``Process.destroy``), whose default action ends it before the reader's
  ``stop()`` runs, so the planning process turns SIGTERM into an exception in its main thread
  (``release_on_sigterm``): the call in progress unwinds (a meta-store transaction rolls back
  and frees its lock), PySpark's runner calls ``stop()`` in its ``finally`` and the lease is
  released there, as on Ctrl-C (SIGINT's ``KeyboardInterrupt`` takes the same path). A query
  that dies without either (SIGKILL of the whole tree, a lost host) lets it **expire**
  ``TTL_S`` after its last renewal, or an operator breaks it (``tablestore-cdc meta
  break-lease``).
- **Taken over at once by a restart of the same query**: a restarted query hands a batch from
  Spark's checkpoint, on the holder's line of batches (the lease's tip, an ancestor or a
  descendant of it), while a second query's offsets are on another line (another generation
  of initial offsets) or it asks for an initial offset. An initial offset is no evidence: every
  query of a generation shares it. So ``initialOffset`` with a live holder of the same
  generation (a crash during batch 0, or a second query started during the first one's batch
  0) decides at the next call: Spark replaying a batch of the holder's line is the same query;
  a ``latestOffset`` from the initial offset is refused while the lease is live (a query
  killed before it logged its batch 0 waits for the expiry). A holder this process took
  another lease over from is its earlier process too (``_predecessors``): a multi-table query
  has a lease per table, and a table that joined just before a kill has no batch to prove it.

Two queries with different meta stores do not see each other's lease: the meta store is where
the lease lives.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cdc_common.uris import redact_uri
from connector.errors import SourceInUseError, TransientMetaStoreError
from connector.identity import SourceIdentity
from connector.planning.logs import log
from meta_store import Lease, MetaStore

#: a lease not renewed for this long is expired: the longest a second query waits after a
#: query died without stopping (seconds)
TTL_S = 120.0
#: how often the holder renews it (a quarter of the TTL: three renewals may fail in a row)
RENEW_EVERY_S = TTL_S / 4
#: a new tip (a batch planned or committed) is written with the next planning call once the
#: stored one is this old, so a restart finds its line even under heavy retention
TIP_EVERY_S = 5.0
#: prev links walked from an offset to find the holder's tip on the same line
_LINE_WALK = 10_000

#: the longest a planning process ending on SIGTERM takes to release its leases before it
#: ends anyway (an outage of the meta store: the lease then expires)
RELEASE_ON_SIGTERM_S = 10.0
#: the module Spark runs a streaming query's planning process as (``python -m ...``)
PLANNING_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
#: the exit status of a process ended by SIGTERM (what the default action reports)
_SIGTERM_EXIT = 128 + signal.SIGTERM

_owner: tuple[int, str] | None = None
#: the leases this process holds now (taken, not yet released): what SIGTERM releases
_held: set[QueryLease] = set()
_sigterm_installed = False
#: SIGTERM arrived: the process ends once its last lease is released
_terminating = False
#: a release is running in the main thread: SIGTERM must not interrupt it
_releasing_in_main = False
#: lease owners this process proved to be its own earlier process (it took one of their
#: leases over on a batch of their line): their other leases are this query's too. A
#: multi-table query holds one lease per table, and a table that joined just before a crash
#: has no batch of its own to prove the restart by (``QueryLease.take``)
_predecessors: set[str] = set()


class PlanningProcessStopped(BaseException):
    """Raised in the planning process's main thread by SIGTERM (Spark stopping the query).

    A ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` of a retry loop
    swallows it, and the call it interrupts unwinds (``with`` blocks close, a meta-store
    transaction rolls back) up to PySpark's runner, whose ``finally`` calls the reader's
    ``stop()``, which releases the query's lease."""


def now() -> float:
    """The lease's clock (seconds since the epoch; the same on every host of a cluster, as far
    as their clocks agree: the TTL is generous)."""
    return time.time()


def owner_id() -> str:
    """This process's lease owner id, ``host/pid/random`` (new after a fork): every protocol
    object of one planning process shares it, as Spark runs one query's planning per process."""
    global _owner
    if _owner is None or _owner[0] != os.getpid():
        _owner = (os.getpid(), f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}")
    return _owner[1]


def in_planning_process() -> bool:
    """Is this Spark's planning process of a streaming query (the runner module is
    ``__main__``)? Nowhere else does the source install a signal handler."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == PLANNING_MODULE


def release_on_sigterm() -> None:
    """In Spark's planning process, release this process's leases on SIGTERM, then end it.

    Spark stops a query's planning process with ``Process.destroy`` (SIGTERM); the default
    action would end it with the lease held until it expires. Releasing from the signal
    handler itself, or from a thread it starts, deadlocks when the main thread was
    interrupted inside a meta-store call (it holds the store's lock and its transaction), which
    is where a planning process spends its time under load. So the handler raises
    ``PlanningProcessStopped`` in the main thread instead: the call unwinds, the runner's
    ``finally`` calls ``stop()``, the lease is released, and the process ends at once
    (``QueryLease.release`` sees the last one go). A watchdog ends the process after
    ``RELEASE_ON_SIGTERM_S`` whatever happens (a meta store that does not answer: the lease
    then expires). Installed once, from the main thread, by the first ``QueryLease.take``;
    anywhere but the planning process it does nothing."""
    global _sigterm_installed
    if (_sigterm_installed or not in_planning_process()
            or threading.current_thread() is not threading.main_thread()):
        return
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    _sigterm_installed = True


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """The SIGTERM handler (main thread of the planning process)."""
    global _terminating
    if not _held:
        os._exit(_SIGTERM_EXIT)  # nothing to release: end as the default action would
    if _terminating:
        return  # a second SIGTERM: the first one's release is under way
    _terminating = True
    watchdog = threading.Timer(RELEASE_ON_SIGTERM_S, _give_up_release)
    watchdog.daemon = True
    watchdog.start()
    if not _releasing_in_main:  # a release in progress goes on; it ends the process
        raise PlanningProcessStopped(f"signal {signum}: the query is stopping")


def _give_up_release() -> None:
    for lease in list(_held):
        log.warning("lease on %s not released within %.0f s of SIGTERM (it expires in at most "
                    "%.0f s)", lease.key, RELEASE_ON_SIGTERM_S, TTL_S)
    os._exit(_SIGTERM_EXIT)


def continues_the_holders_line(meta: MetaStore, namespace: str, uuid: str, lease: Lease
                               ) -> bool:
    """Is batch ``uuid`` evidence that the caller is the lease holder's own query restarted?
    It must be a batch Spark logged (minted by ``latestOffset``: an initial batch is shared by
    every query of its generation, so it proves nothing) on the holder's line of batches: the
    holder's tip, an ancestor of it, or a descendant. Walks the prev links of the namespace's
    batches (one listing: only when a live lease of another process stands in the way)."""
    if lease.namespace != namespace or lease.tip is None:
        return False
    prev = {b.uuid: b.prev_uuid for b in meta.list_batches(namespace)}
    if prev.get(uuid) is None:  # not there, or an initial batch
        return False
    return uuid == lease.tip or _reaches(prev, uuid, lease.tip) or _reaches(prev, lease.tip, uuid)


def on_the_holders_line(meta: MetaStore, namespace: str, uuid: str, lease: Lease) -> bool:
    """Is batch ``uuid`` (an initial batch) the holder's tip or one of its ancestors: the
    holder is a query of the same generation (its batch 0 not committed yet)?"""
    if lease.namespace != namespace or lease.tip is None:
        return False
    if uuid == lease.tip:
        return True
    prev = {b.uuid: b.prev_uuid for b in meta.list_batches(namespace)}
    return _reaches(prev, lease.tip, uuid)


def _reaches(prev: dict[str, str | None], start: str, target: str) -> bool:
    """Does following prev links from ``start`` reach ``target``?"""
    node: str | None = start
    for _ in range(_LINE_WALK):
        node = prev.get(node) if node is not None else None
        if node is None:
            return False
        if node == target:
            return True
    return False


class QueryLease:
    """The lease of one query on its source, held by the planning process (driver)."""

    def __init__(self, meta: MetaStore, identity: SourceIdentity, *, ttl_s: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._meta = meta
        self._identity = identity
        #: one lease per source, whichever namespace holds rows
        self.key = identity.namespace
        self._ttl_s = TTL_S if ttl_s is None else ttl_s
        self._clock = clock or now
        self._owner = owner_id()
        self._namespace = ""
        #: the newest batch this process planned or committed (the renewals carry it)
        self.tip: str | None = None
        #: a renewal found another owner holding the lease: raised by ``check``
        self._lost: Lease | None = None
        #: the lease is to be taken at the next call (``defer``)
        self.pending = False
        #: when the lease row was last written by this process (its clock)
        self._written_at = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, namespace: str, evidence: str | None) -> None:
        """Take the lease for this query reading ``namespace``. ``evidence``: a batch from
        Spark's checkpoint (a restart); a live holder whose line it continues is this query's
        earlier process and is taken over (``continues_the_holders_line``), and so is a holder
        this process already took another lease over from (``_predecessors``). Any other live
        holder refuses it (``SourceInUseError``)."""
        self._namespace, self.pending = namespace, False
        if evidence is not None:
            self.tip = evidence

        def same_query(lease: Lease) -> bool:
            if lease.owner in _predecessors:
                return True
            if evidence is not None and continues_the_holders_line(
                    self._meta, namespace, evidence, lease):
                _predecessors.add(lease.owner)
                return True
            return False

        holder = self._meta.take_lease(self.key, self._owner, self._ttl_s, namespace=namespace,
                                       tip=self.tip, now=self._clock(), may_take_over=same_query)
        if holder is not None:
            raise self._in_use(holder)
        self._written_at = self._clock()
        log.debug("lease on %s taken by %s", self.key, self._owner)
        _held.add(self)
        release_on_sigterm()
        self._start_renewals()

    def advance(self, tip: str, *, now: bool = False) -> None:
        """The query planned batch ``tip``: the renewals carry it from now on, and it is
        written at once when the stored tip is older than ``TIP_EVERY_S``, or ``now`` (the
        driver's planning thread; one small conditional write at most that often)."""
        self.tip = tip
        if not self.pending and (now or self._clock() - self._written_at >= TIP_EVERY_S):
            self.renew()

    def defer(self, namespace: str) -> None:
        """Take the lease at the next call (``take`` with its evidence): ``initialOffset``
        found a live holder of the same generation, which is this query's earlier process
        only if Spark replays a batch of its line next (a crash during batch 0)."""
        self._namespace, self.pending = namespace, True

    def held_by_another(self, holder: Lease | None) -> bool:
        """Is ``holder`` a live lease of another process?"""
        return (holder is not None and holder.owner != self._owner
                and holder.live(self._clock()))

    def refuse_if_held(self, holder: Lease | None) -> None:
        """Raise ``SourceInUseError`` if ``holder`` is a live lease of another process (a check
        before anything is created; ``take`` decides for good)."""
        if holder is not None and self.held_by_another(holder):
            raise self._in_use(holder)

    def renew(self) -> None:
        """Renew now, with the current ``tip``; a lease taken meanwhile by another process is
        noted (``check`` raises). Called by the renewal thread."""
        at = self._clock()
        holder = self._meta.take_lease(self.key, self._owner, self._ttl_s,
                                       namespace=self._namespace, tip=self.tip, now=at)
        if holder is not None:
            self._lost = holder
        else:
            self._written_at = at

    def check(self) -> None:
        """Raise ``SourceInUseError`` if another process took the lease over (this process
        is a leftover of a restarted query, or the lease expired while it was stalled)."""
        if self._lost is not None:
            raise self._in_use(self._lost)

    def release(self) -> None:
        """Stop renewing and end the lease at once (the query stopped, or the planning process
        got SIGTERM: then the process ends once its last lease is released). Safe to call
        twice."""
        global _releasing_in_main
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            _releasing_in_main = True
        try:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=5)
            if self._namespace and self._lost is None and not self.pending:
                self._meta.release_lease(self.key, self._owner, now=self._clock())
        finally:
            _held.discard(self)
            if in_main:
                _releasing_in_main = False
            if _terminating and not _held:
                os._exit(_SIGTERM_EXIT)  # the rest of the stop (closing clients) dies with it

    def _start_renewals(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._renew_until_stopped,
                                        name="tablestore-cdc-lease", daemon=True)
        self._thread.start()

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self._ttl_s / 4):  # RENEW_EVERY_S for the default TTL
            try:
                self.renew()
            except TransientMetaStoreError as exc:  # the next round tries again
                log.warning("lease on %s not renewed (%s); retrying in %.1f s", self.key,
                            exc, self._ttl_s / 4)
            except Exception as exc:  # noqa: BLE001 - a thread must not die silently
                log.warning("lease on %s not renewed: %s", self.key, exc)

    def _in_use(self, holder: Lease) -> SourceInUseError:
        now = self._clock()
        return SourceInUseError(
            tunnel=self._identity.tunnel, table=self._identity.table, holder=holder.owner,
            renewed_ago=max(0.0, now - holder.renewed_at),
            expires_in=max(0.0, holder.expires_at - now),
            expires_at=time.strftime("%H:%M:%S", time.localtime(holder.expires_at)),
            meta=shlex.quote(redact_uri(self._meta.uri)), key=shlex.quote(self.key))
