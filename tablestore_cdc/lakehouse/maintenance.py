"""Maintenance of a target table beside the running stream (``tablestore-cdc lake optimize``;
driver or a separate process): small files compacted, old Iceberg snapshots expired,
unreferenced files removed. A run is the replication job's own (``upkeep.delta_run``,
``upkeep.iceberg_run``; what each does: upkeep.py) with what was asked instead of the job's
thresholds; ``describe`` is its line.

Delta: ``optimize.z_order`` on the first key column (the key clustering that keeps batches
cheap, docs/lakehouse.md "Table layout", is kept), then, if asked, ``vacuum``. The key column
comes from the table's marker (ownership.py): a table this sink did not create is left alone.

It never makes the stream fail: both are optimistic writers of the table. If a batch commits
while the compaction runs, the compaction's commit is refused (the files it rewrote changed)
and nothing of it is kept; if the compaction commits first, the batch's commit is refused and
the sink re-plans and retries it (``sink.COMMIT_ATTEMPTS``), exactly once as for any lost race.

Iceberg: pyiceberg 0.12 has no compaction, and no removal of orphan files. ``--expire-hours``
expires the snapshots older than that but those the sink's exactly once needs
(``upkeep._expire_iceberg``): every Iceberg commit rewrites the whole metadata, so a stream's
batches slow down with the snapshots kept (docs/lakehouse.md, "Limits"). ``--vacuum-hours``
removes the files under the table's location that no snapshot references and that are older
than the retention (``upkeep._vacuum_iceberg``, as Iceberg's ``DeleteOrphanFiles`` does).

A retention shorter than a batch (``--vacuum-hours 0``) may remove the files of a batch in
flight, which then commits files that are gone: use it only with the stream stopped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.target import FORMS, open_apply_sink
from tablestore_cdc.lakehouse.upkeep import MaintenanceRun, delta_run, iceberg_run, owner_marker


def optimize(uri: str, vacuum_hours: int | None = None,
             expire_hours: float | None = None,
             target_options: Mapping[str, str] | None = None) -> MaintenanceRun:
    """Compact the Delta table at ``uri`` (a ``--target`` URI, local or in an object store,
    with replicate's ``--target-option``s as ``target_options``) and vacuum it if asked;
    expire an Iceberg table's old snapshots and vacuum it, as asked (module doc). The run is
    the job's own (``upkeep.delta_run``, ``upkeep.iceberg_run``) with what was asked."""
    from tablestore_cdc.lakehouse.iceberg import IcebergApplySink

    sink: Any = open_apply_sink(uri, target_options=target_options)  # Delta or Iceberg
    iceberg = isinstance(sink, IcebergApplySink)
    if iceberg and vacuum_hours is None and expire_hours is None:
        raise TargetUriError(uri=uri, problem="an Iceberg table is not compacted (pyiceberg "
                             "0.12 has no compaction): give --expire-hours N to expire its old "
                             "snapshots, --vacuum-hours N to remove its unreferenced files",
                             allowed=FORMS)
    if not iceberg and expire_hours is not None:
        raise TargetUriError(uri=uri, problem="--expire-hours expires Iceberg snapshots; a "
                             "Delta table's log is checkpointed (its batches do not slow down "
                             "with its versions), and --vacuum-hours removes its old files",
                             allowed=FORMS)
    table = sink.table()
    if table is None:
        raise TargetUriError(uri=uri, problem="there is no table there yet", allowed=FORMS)
    marker = owner_marker(sink, table)
    if marker is None:
        raise TargetUriError(uri=uri, problem="the table carries no marker of tablestore-cdc "
                             "(its key columns are unknown)", allowed=FORMS)
    if iceberg:
        return iceberg_run(sink, table, marker, time.time(), compaction=None,
                           expire_hours=expire_hours, keep_newest=None,
                           vacuum_hours=vacuum_hours)
    return delta_run(sink, table, marker.key_columns[0], time.time(),
                     compact=lambda _sizes: True, vacuum_hours=vacuum_hours)


def describe(result: MaintenanceRun) -> str:
    """What ``lake optimize`` did, in one line."""
    if result.table_format == "iceberg":
        expiry = ("" if result.snapshots_expired is None
                  else f"{result.snapshots_expired} snapshot(s) expired, "
                  f"{result.snapshots_after} kept; "
                  if result.expiry_done else "a commit changed the snapshots meanwhile: none "
                  "expired, run it again; ")
        return (f"Iceberg (no compaction in pyiceberg 0.12): {expiry}"
                f"{result.files_removed} unreferenced file(s) removed")
    outcome = (f"{result.files_before} file(s) compacted into {result.files_after}"
               if result.compacted else "a batch committed meanwhile: nothing compacted, "
               "run it again")
    return outcome + (f"; {result.files_removed} unreferenced file(s) removed"
                      if result.files_removed else "")
