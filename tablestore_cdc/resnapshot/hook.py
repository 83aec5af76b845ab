"""The apply query's ``foreachBatch`` with re-snapshots between its batches (driver).

``ResnapshotHook(sink, ...)`` is what ``tablestore_cdc.pipeline.queries.start_pipeline`` hands
to ``foreachBatch``: for each micro-batch it first looks for a due signal in the meta table (at
most every ``CHECK_EVERY_S`` seconds: one small read), runs its repair (``repair.run_repair``)
and marks it done, then calls the sink with the batch. The repair and the batches are thus one
writer's commits, one after the other: no commit race, and each key's stream changes after the
repair are applied after it.

A signal is marked running before its repair and done (with its counts) only after the
repair's commit: a job killed in between finds it running at its next start and runs it again,
which the repair's own commit marker makes idempotent (so does a meta table that cannot be
reached while the signal is marked: the batch goes on, the signal is taken again). A repair
that fails with an error marks the signal failed with the error's first line and the stream
goes on (the repair changed nothing: its one commit is all or nothing). A stream that runs
no batch (nothing new) runs no repair until its next batch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from connector.clients import Clients
from connector.errors import CdcError
from meta_store import MetaStore
from meta_store.signals import SignalBoard, SignalState
from tablestore_cdc.lakehouse.sink import query_id_of
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.resnapshot.repair import run_repair

log = logging.getLogger("tablestore_cdc.resnapshot")

#: least seconds between two looks for a due signal
CHECK_EVERY_S = 2.0


class ResnapshotHook:
    """``foreachBatch`` function: due repairs, then ``sink(df, batch_id)`` (module docstring).

    ``spec``: the source as the job reads it; ``target_uri``: the sink's ``--target``."""

    def __init__(self, sink: Any, spec: SourceSpec, target_uri: str, *,
                 soft_delete_column: str | None = None,
                 check_every_s: float = CHECK_EVERY_S) -> None:
        self.sink, self.spec, self.target_uri = sink, spec, target_uri
        self.soft_delete_column = soft_delete_column
        self.check_every_s = check_every_s
        self._store: MetaStore | None = None
        self._next_check = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    def __call__(self, df: Any, batch_id: int) -> None:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_every_s
            job = self.sink.app_id or query_id_of(df, batch_id)
            try:
                self.run_due(job)
            except CdcError as exc:  # the meta table unreachable: the batch goes on, a
                # signal left running is taken again at the next look (idempotent)
                log.warning("resnapshot: could not read or mark the signals: %s", exc)
        self.sink(df, batch_id)

    def board(self) -> SignalBoard:
        options = self.spec.source_options()
        if self._store is None:
            self._store = Clients().meta_store(options.meta_store,
                                               options.meta_store_credentials)
        return SignalBoard(self._store, options.source_identity)

    def run_due(self, job: str) -> int:
        """Run every due signal's repair for the job ``job`` (the apply query's id); returns
        how many ran."""
        board = self.board()
        ran = 0
        while (signal := board.next_due()) is not None:
            log.warning("resnapshot %s of table %s (%s): repairing the target from the source",
                        signal.id, signal.table, signal.origin)
            board.set(signal.id, state=SignalState.RUNNING, percent=0.0)
            try:
                outcome = run_repair(self.spec, self.target_uri, self.sink, job, signal, board,
                                     soft_delete_column=self.soft_delete_column)
            except Exception as exc:  # noqa: BLE001 - the stream goes on; the signal says why
                reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
                log.error("resnapshot %s failed: %s", signal.id, reason)
                board.set(signal.id, state=SignalState.FAILED, percent=None,
                          note=f"{type(exc).__name__}: {reason}")
            else:
                board.set(signal.id, state=SignalState.DONE, percent=100.0,
                          counts=outcome.counts(), note=outcome.note)
                log.warning("resnapshot %s done: %s; %s", signal.id, outcome.counts(),
                            outcome.note)
            ran += 1
        return ran
