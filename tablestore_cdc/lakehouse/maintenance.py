"""Maintenance of a target table beside the running stream (``tablestore-cdc lake optimize``;
driver or a separate process): small files compacted, unreferenced files removed.

Delta: ``optimize.z_order`` on the first key column (a sort of the table's rows by key, in files
of delta-rs's target size: the key clustering that keeps batches cheap, docs/lakehouse.md
"Table layout", is kept), then, if asked, ``vacuum`` of the files no version newer than the
retention references (among them the files of a batch killed before its commit). The key
column comes from the table's marker (ownership.py): a table this sink did not create is left
alone.

It never makes the stream fail: both are optimistic writers of the table. If a batch commits
while the compaction runs, the compaction's commit is refused (the files it rewrote changed)
and nothing of it is kept; if the compaction commits first, the batch's commit is refused and
the sink re-plans and retries it (``sink.COMMIT_ATTEMPTS``), exactly once as for any lost race.
Iceberg: pyiceberg 0.12 has no compaction; not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.ownership import KEYS_PROPERTY
from tablestore_cdc.lakehouse.target import FORMS, open_apply_sink


@dataclass(frozen=True)
class Optimized:
    """What ``optimize`` did."""

    files_before: int
    files_after: int
    #: False when a batch committed meanwhile and the compaction was dropped (run it again)
    compacted: bool
    vacuumed: int = 0


def optimize(uri: str, vacuum_hours: int | None = None) -> Optimized:
    """Compact the Delta table at ``uri`` (a ``--target`` URI) and vacuum it if asked."""
    from tablestore_cdc.lakehouse.delta import DeltaApplySink

    sink = open_apply_sink(uri)
    if not isinstance(sink, DeltaApplySink):
        raise TargetUriError(uri=uri, problem="lake optimize compacts Delta tables only "
                             "(pyiceberg 0.12 has no compaction)", allowed=FORMS)
    from deltalake.exceptions import CommitFailedError

    table = sink.table()
    if table is None:
        raise TargetUriError(uri=uri, problem="there is no table there yet", allowed=FORMS)
    keys = dict(table.metadata().configuration).get(KEYS_PROPERTY, "")
    if not keys:
        raise TargetUriError(uri=uri, problem="the table carries no marker of tablestore-cdc "
                             "(its key columns are unknown)", allowed=FORMS)
    before = len(table.file_uris())
    compacted = True
    try:
        table.optimize.z_order([keys.split(",")[0]])
    except CommitFailedError:
        compacted = False  # a batch committed meanwhile: the stream wins
    table = sink.table()
    assert table is not None
    vacuumed = 0
    if vacuum_hours is not None:
        vacuumed = len(table.vacuum(retention_hours=vacuum_hours, dry_run=False,
                                    enforce_retention_duration=False))
    return Optimized(before, len(table.file_uris()), compacted, vacuumed)


def describe(result: Optimized) -> str:
    outcome: Any = (f"{result.files_before} file(s) compacted into {result.files_after}"
                    if result.compacted else "a batch committed meanwhile: nothing compacted, "
                    "run it again")
    return outcome + (f"; {result.vacuumed} unreferenced file(s) removed"
                      if result.vacuumed else "")
