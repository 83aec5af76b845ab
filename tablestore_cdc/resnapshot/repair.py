"""One signal's repair (the replication job's driver, between two of its batches or on an idle
stream; ``hook.py``), of one table, whichever mode the job runs in (``RepairTarget``: the
table's source, the job's sink of it, its target and the sink's settings).

1. Reconcile the table against the target (``tablestore_cdc.reconcile.run.reconcile_table``,
   the target opened with the job's ``--target-option``s), only the signal's key range on both
   sides when it has one (the readers push it into their reads: ``reconcile.source``,
   ``reconcile.target``).
2. Keep every difference (all in the signal's range), in flight or not. Reconcile's in-flight
   position trails the target by up to one apply batch, so a key it labels in flight may have
   had its last change applied already (and been damaged after): left to the stream, it would
   stay wrong. Inside the job no such doubt exists: every change before this point is applied,
   and every later one is applied after the repair, in order, so each key ends at the source's
   value (a change older than the repair's read may show for one batch before the newer ones
   follow). The in-flight count is kept for the signal's report.
3. Read the source rows of those keys again (the same reader and range): a key the source
   holds is written as a PUT of its current row, a key it lacks as a DELETE -- the stream's
   own change images (``connector.tunnel.page.records_to_page``), so the sink applies them as
   it applies the stream (upsert; delete, soft delete or SCD 2 close).
4. Commit them through the job's own apply sink in **one** commit under the app id
   ``resnapshot-<signal id>`` and batch 0 (``REPAIR_APP_PREFIX``): the sink skips a batch its
   app id already recorded, so a repair run again after a crash between its commit and the
   signal's "done" changes nothing. The table's marker still names the job (``marker_job``).

The job applies its next batch only after the repair returns: one writer, no commit race.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connector.clients import Clients
from connector.crash_hook import crash_point
from connector.errors import CdcError
from connector.tunnel import Op, Record
from connector.tunnel.page import PageLayout, records_to_page
from meta_store.signals import Signal, SignalBoard
from tablestore_cdc.reconcile.compare import PAGE_ROWS, Progress
from tablestore_cdc.reconcile.inflight import WAIT_DEADLINE_S
from tablestore_cdc.reconcile.keyrange import KeyRange
from tablestore_cdc.reconcile.layout import Key
from tablestore_cdc.reconcile.run import reconcile_table
from tablestore_cdc.reconcile.source import SourceSpec, open_source_table
from tablestore_cdc.reconcile.target import REPAIR_APP_PREFIX

log = logging.getLogger("tablestore_cdc.resnapshot")

#: the channel id the repair's change images carry (no channel of the source has it)
REPAIR_CHANNEL = "resnapshot"
#: least seconds between two progress writes into the signal
PROGRESS_EVERY_S = 2.0


@contextmanager
def open_board(spec: SourceSpec) -> Iterator[SignalBoard]:
    """The signals of ``spec``'s source identity in its meta table (``OptionError`` for bad
    options, ``MetaTableMissingError`` when the stream never ran): where
    ``tablestore-cdc resnapshot`` and an upgraded output (``pipeline.upgrade``) add one."""
    options = spec.source_options()
    store = Clients().meta_store(options.meta_store, options.meta_store_credentials,
                                 create=False)
    try:
        yield SignalBoard(store, options.source_identity)
    finally:
        store.close()


class RepairDeferred(CdcError):
    """A repair inside the stream's own query (the one-cycle pipeline) found a channel in
    WAIT: its parent ends in the batch this repair holds up, so the keys in flight cannot be
    known yet. The signal is taken again at the next look, after that batch."""

    template = ("resnapshot of table {table} put off to the next look: {note}")


@dataclass(frozen=True)
class RepairOutcome:
    """What a repair did (the signal's counts and note)."""

    upserts: int = 0
    deletes: int = 0
    in_flight: int = 0
    differences: int = 0
    #: the commit was already in the target (a repair run again after a crash)
    already: bool = False
    note: str = ""

    def counts(self) -> dict[str, int]:
        return {"upserts": self.upserts, "deletes": self.deletes, "in_flight": self.in_flight,
                "differences": self.differences}


@dataclass(frozen=True)
class RepairTarget:
    """Where one table's repair reads and writes (``hook.RepairRunner``'s ``target_of``):
    ``spec``, the table's source as the job reads it; ``sink``, the job's own apply sink of the
    table; ``target_uri`` and the settings the sink was opened with (``--soft-delete-column``,
    ``--target-option``s, the target's key columns when they are not the source's)."""

    spec: SourceSpec
    sink: Any
    target_uri: str
    soft_delete_column: str | None = None
    target_options: Mapping[str, str] | None = None
    key_columns: tuple[str, ...] | None = None


class SignalProgress(Progress):
    """``reconcile.compare.Progress`` written into the signal (``running n %``), at most every
    ``PROGRESS_EVERY_S``; the comparison reads each side up to twice, so each step is a
    share of the whole."""

    STEPS = 4

    def __init__(self, board: SignalBoard, signal: Signal) -> None:
        self.board, self.signal = board, signal
        self.step, self.done, self.written = 0, 0, 0.0
        self.total: int | None = None

    def begin(self, what: str, total: int | None) -> None:
        self.total, self.done = total, 0

    def advance(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.written >= PROGRESS_EVERY_S:
            self.written = now
            share = min(1.0, self.done / self.total) if self.total else 0.5
            percent = min(99.0, 100.0 * (min(self.step, self.STEPS - 1) + share) / self.STEPS)
            self.board.set(self.signal.id, percent=round(percent, 1))

    def end(self) -> None:
        self.step += 1


def run_repair(target: RepairTarget, job: str, signal: Signal,
               board: SignalBoard, in_stream: bool = False) -> RepairOutcome:
    """Repair ``target`` (through its sink, the running apply query ``job``'s) for ``signal``
    (module docstring). ``in_stream``: the repair holds up the query that reads the source (the
    one-cycle pipeline): a channel in WAIT is not waited for, the repair is put off
    (``RepairDeferred``)."""
    spec, sink = target.spec, target.sink
    app_id = f"{REPAIR_APP_PREFIX}{signal.id}"
    if sink.committed_batch(app_id) is not None:
        return RepairOutcome(already=True, note="the repair was committed before a restart")
    report = reconcile_table(spec, target.target_uri,
                             soft_delete_column=target.soft_delete_column,
                             progress=SignalProgress(board, signal), key_from=signal.key_from,
                             key_to=signal.key_to, target_options=target.target_options,
                             wait_s=0.0 if in_stream else WAIT_DEADLINE_S)
    if in_stream and report.in_flight is not None and report.in_flight.waiting:
        raise RepairDeferred(table=spec.table, note=report.in_flight.note)
    wanted = report.comparison.differences
    repaired = {d.key for d in wanted}
    in_flight = sum(1 for d in wanted if d.in_flight)
    found = report.in_flight
    if found is None or found.determined:
        note = (f"every difference repaired, {in_flight} of them in flight (the stream's "
                "later changes are applied after the repair)")
    else:
        note = f"in-flight position unknown ({found.note}): every difference repaired"
        log.warning("resnapshot %s of %s: %s", signal.id, spec.table, note)
    batch = _change_batch(spec, repaired, report.span) if repaired else None
    if batch is None:
        return RepairOutcome(note="no difference")
    writer = copy.copy(sink)
    writer.marker_job = job
    crash_point("resnapshot_before_commit")
    writer.apply(batch, app_id, 0, target.key_columns or report.key_columns)
    crash_point("resnapshot_after_commit")
    deletes = sum(1 for op in batch.column("_op").to_pylist() if op == Op.DELETE.value)
    return RepairOutcome(upserts=batch.num_rows - deletes, deletes=deletes,
                         in_flight=in_flight, differences=len(wanted),
                         note=note)


def _change_batch(spec: SourceSpec, keys: set[Key], span: KeyRange | None) -> pa.Table:
    """The source's current rows of ``keys`` (all in ``span``) as PUTs, the keys it no longer
    holds as DELETEs, in the source's output layout (module docstring, step 3)."""
    now_us = int(time.time() * 1_000_000)
    records: list[Record] = []
    with open_source_table(spec) as source:
        names = tuple(c.name for c in source.schema.primary_key)
        layout = PageLayout.of_table(source.schema)
        left = set(keys)
        for page in source.pages(PAGE_ROWS, span):
            for pk, attrs in page:
                key = tuple(pk.get(n) for n in names)
                if key in left:
                    left.discard(key)
                    records.append(_record(Op.PUT, pk, attrs, len(records), now_us))
            if not left:
                break
    for key in sorted(left, key=repr):
        records.append(_record(Op.DELETE, dict(zip(names, key, strict=True)), {}, len(records),
                               now_us))
    page = pa.Table.from_batches([records_to_page(records, layout)])
    return page.append_column(pa.field("_channel_id", pa.string(), False),
                              pa.array([REPAIR_CHANNEL] * page.num_rows, pa.string()))


def _record(op: Op, pk: dict[str, Any], attrs: dict[str, Any], n: int, at_us: int) -> Record:
    return Record(op=op, primary_key=pk,
                  columns={k: v for k, v in attrs.items() if v is not None},
                  before=None, sequence=f"{n:020d}", commit_ts_us=at_us,
                  channel_id=REPAIR_CHANNEL)
