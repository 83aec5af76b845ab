"""Re-snapshots between a replication job's batches, and on an idle stream (driver).

``RepairRunner`` runs the due signals of the tables one apply query writes (each table of the
pipeline's selection, ``tablestore_cdc.pipeline.multi_table.MultiTableApply``; one table is a
selection of one): ``tables()`` says which tables to look at, ``source_of(table)`` a
table's source as the job reads it (whose namespace holds its signals), ``target_of(table)``,
asked only when a signal of the table is due, where its repair reads and writes
(``repair.RepairTarget``: the source, the job's own apply sink of the table, its target URI and
settings), or None to leave the table's signals pending for now.

It is called from two places, both on the replication job's driver, under one lock
(``RepairRunner.lock``):

- ``before_batch(job)``: by the apply query's ``foreachBatch``, which holds the lock for the
  whole batch: due repairs, then the batch;
- ``when_idle(job)``: by the replication job's watch loop (``pipeline.job.ReplicationJob``,
  every ``WATCH_EVERY_S``, through the pipeline's ``run_due_repairs``): when no batch holds the
  lock it runs the due repairs itself, so a signal on a quiet table (Spark calls
  ``foreachBatch`` only for a batch with data) is repaired without a write; when a batch holds
  it, that batch looks itself.

The repairs and the batches are thus one writer's commits, one after the other: no commit
race, and each key's stream changes after the repair are applied after it.

Both look at most once every ``check_every_s`` seconds. A look reads each looked-at table's
signals (one small document per table's namespace, ``meta_store.signals``); with many tables
the interval grows to ``len(tables) / LOOKS_PER_S`` so the meta table sees at most
``LOOKS_PER_S`` reads a second from it (100 tables: one look every 2 s; 1000: every 20 s).

A signal is marked running before its repair and done (with its counts) only after the
repair's commit: a job killed in between finds it running at its next start and runs it again,
which the repair's own commit marker makes idempotent (so does a meta table that cannot be
reached while the signal is marked: the batch goes on, the signal is taken again). A repair
that fails with an error marks the signal failed with the error's first line and the stream
goes on (the repair changed nothing: its one commit is all or nothing). In the one-cycle
pipeline (``in_stream``) the lock holds up the query that reads the source: a repair whose
in-flight keys wait on a channel in WAIT (its parent ends in the batch held up) is put off,
its signal left running, and taken again at the next look, after that batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from connector.clients import Clients
from connector.errors import CdcError
from meta_store import MetaStore
from meta_store.signals import SignalBoard, SignalState
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.resnapshot.repair import RepairDeferred, RepairTarget, run_repair

log = logging.getLogger("tablestore_cdc.resnapshot")

#: least seconds between two looks for due signals
CHECK_EVERY_S = 2.0
#: most signal documents a look reads per second of interval (many tables: a longer interval)
LOOKS_PER_S = 50.0

__all__ = ["CHECK_EVERY_S", "LOOKS_PER_S", "RepairRunner", "RepairTarget"]


class RepairRunner:
    """The due repairs of an apply query's tables (module docstring); driver only."""

    def __init__(self, tables: Callable[[], Iterable[str]],
                 source_of: Callable[[str], SourceSpec],
                 target_of: Callable[[str], RepairTarget | None], *,
                 check_every_s: float = CHECK_EVERY_S, in_stream: bool = False) -> None:
        self.tables, self.source_of, self.target_of = tables, source_of, target_of
        self.check_every_s = check_every_s
        #: the repairs hold up the query that reads the source (the one-cycle pipeline): a
        #: repair that would wait for it is put off (``repair.RepairDeferred``)
        self.in_stream = in_stream
        #: held by the apply's ``foreachBatch`` for a whole batch and by an idle look
        self.lock = threading.RLock()
        self._stores: dict[tuple[str, tuple[tuple[str, str], ...]], MetaStore] = {}
        self._boards: dict[str, SignalBoard] = {}
        self._next_check = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "lock": None, "_stores": {}, "_boards": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, lock=threading.RLock())

    def when_idle(self, job: str) -> int:
        """By the job's watch loop: the due repairs when a look is due and no batch is being
        applied (else that batch looks); how many ran."""
        if time.monotonic() < self._next_check or not self.lock.acquire(blocking=False):
            return 0
        try:
            return self.before_batch(job)
        finally:
            self.lock.release()

    def before_batch(self, job: str) -> int:
        """By the apply's ``foreachBatch``, holding ``lock``, before it applies a batch (and by
        ``when_idle``): the due repairs when a look is due; how many ran."""
        now = time.monotonic()
        if now < self._next_check:
            return 0
        tables = sorted(set(self.tables()))
        self._next_check = now + max(self.check_every_s, len(tables) / LOOKS_PER_S)
        try:
            return self.run_due(job, tables)
        except CdcError as exc:  # the meta table unreachable: the batch goes on, a signal
            # left running is taken again at the next look (idempotent)
            log.warning("resnapshot: could not read or mark the signals: %s", exc)
            return 0

    def board(self, table: str) -> SignalBoard:
        """The signals of ``table`` (its source's namespace), each meta store opened once."""
        if table not in self._boards:
            options = self.source_of(table).source_options()
            credentials = options.meta_store_credentials
            key = (options.meta_store, tuple(sorted((credentials or {}).items())))
            if key not in self._stores:
                self._stores[key] = Clients().meta_store(options.meta_store, credentials)
            self._boards[table] = SignalBoard(self._stores[key], options.source_identity)
        return self._boards[table]

    def run_due(self, job: str, tables: Iterable[str] | None = None) -> int:
        """Run every due signal's repair of ``tables`` (default: ``tables()``) for the apply
        query ``job`` (its id: the target's marker names it), now; returns how many ran."""
        ran = 0
        for table in sorted(set(self.tables() if tables is None else tables)):
            board = self.board(table)
            if (due := board.next_due()) is None:  # the one read of a look, most of the time
                continue
            try:
                target = self.target_of(table)
            except Exception as exc:  # noqa: BLE001 - its sink does not open: the signal says
                _failed(board, due.id, exc)  # why, and the batches go on
                ran += 1
                continue
            if target is not None:
                ran += self._run_table(job, board, target)
        return ran

    def _run_table(self, job: str, board: SignalBoard, target: RepairTarget) -> int:
        ran = 0
        while (signal := board.next_due()) is not None:
            log.warning("resnapshot %s of table %s (%s): repairing the target from the source",
                        signal.id, signal.table, signal.origin)
            board.set(signal.id, state=SignalState.RUNNING, percent=0.0)
            try:
                outcome = run_repair(target, job, signal, board, self.in_stream)
            except RepairDeferred as deferred:  # running still: the next look takes it again
                board.set(signal.id, note=str(deferred))
                log.info("%s", deferred)
                return ran
            except Exception as exc:  # noqa: BLE001 - the stream goes on; the signal says why
                _failed(board, signal.id, exc)
            else:
                board.set(signal.id, state=SignalState.DONE, percent=100.0,
                          counts=outcome.counts(), note=outcome.note)
                log.warning("resnapshot %s done: %s; %s", signal.id, outcome.counts(),
                            outcome.note)
            ran += 1
        return ran


def _failed(board: SignalBoard, signal_id: str, exc: Exception) -> None:
    """Mark the signal failed with the error's first line (and log it)."""
    reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
    log.error("resnapshot %s failed: %s", signal_id, reason)
    board.set(signal_id, state=SignalState.FAILED, percent=None,
              note=f"{type(exc).__name__}: {reason}")
