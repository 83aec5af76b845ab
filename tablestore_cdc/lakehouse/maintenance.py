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

Iceberg: pyiceberg 0.12 has no compaction, and no removal of orphan files; with
``--vacuum-hours`` the data files under the table's ``data/`` directory (a local table) that
no snapshot in its metadata references and that are older than the retention are removed
(``_vacuum_iceberg``: as Iceberg's ``DeleteOrphanFiles`` does): the files of batches killed
before their commit, their executors' among them. It writes nothing to the table.

A retention shorter than a batch (``--vacuum-hours 0``) may remove the files of a batch in
flight, which then commits files that are gone: use it only with the stream stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.layout import local_path
from tablestore_cdc.lakehouse.ownership import KEYS_PROPERTY
from tablestore_cdc.lakehouse.target import FORMS, open_apply_sink


@dataclass(frozen=True)
class Optimized:
    """What ``optimize`` did."""

    files_before: int
    files_after: int
    #: False when a batch committed meanwhile and the compaction was dropped (run it again),
    #: or the format has none (Iceberg)
    compacted: bool
    vacuumed: int = 0
    #: "delta" or "iceberg"
    table_format: str = "delta"


def optimize(uri: str, vacuum_hours: int | None = None) -> Optimized:
    """Compact the Delta table at ``uri`` (a ``--target`` URI) and vacuum it if asked; vacuum
    an Iceberg table (module doc)."""
    from tablestore_cdc.lakehouse.delta import DeltaApplySink
    from tablestore_cdc.lakehouse.iceberg import IcebergApplySink

    sink = open_apply_sink(uri)
    if isinstance(sink, IcebergApplySink):
        return _vacuum_iceberg(uri, sink, vacuum_hours)
    assert isinstance(sink, DeltaApplySink)
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


def _vacuum_iceberg(uri: str, sink: Any, vacuum_hours: int | None) -> Optimized:
    """Remove the data files of a local Iceberg table that no snapshot references and that
    are older than ``vacuum_hours`` (module doc)."""
    if vacuum_hours is None:
        raise TargetUriError(uri=uri, problem="an Iceberg table is not compacted (pyiceberg "
                             "0.12 has no compaction): give --vacuum-hours N to remove its "
                             "unreferenced files", allowed=FORMS)
    table = sink.table()
    if table is None:
        raise TargetUriError(uri=uri, problem="there is no table there yet", allowed=FORMS)
    if not table.properties.get(KEYS_PROPERTY):
        raise TargetUriError(uri=uri, problem="the table carries no marker of tablestore-cdc",
                             allowed=FORMS)
    data = local_path(table.location().rstrip("/") + "/data")
    if data is None:
        raise TargetUriError(uri=uri, problem="unreferenced files are removed from tables on "
                             "the local file system only", allowed=FORMS)
    referenced = _referenced_files(table)
    live = len(list(table.scan().plan_files()))  # the current snapshot's data files
    cutoff = time.time() - vacuum_hours * 3600
    removed = 0
    for path in sorted(Path(data).rglob("*.parquet")):
        if str(path) not in referenced and path.stat().st_mtime < cutoff:
            path.unlink()
            removed += 1
    return Optimized(live, live, compacted=False, vacuumed=removed, table_format="iceberg")


def _referenced_files(table: Any) -> set[str]:
    """The local paths of every data and delete file any snapshot of ``table`` references
    (time travel reads the old ones)."""
    io = table.io
    manifests: set[str] = set()
    files: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in manifests:
                continue
            manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                files.add(str(Path(local_path(entry.data_file.file_path)
                                   or entry.data_file.file_path)))
    return files


def describe(result: Optimized) -> str:
    if result.table_format == "iceberg":
        return (f"Iceberg (no compaction in pyiceberg 0.12): {result.vacuumed} unreferenced "
                "file(s) removed")
    outcome: Any = (f"{result.files_before} file(s) compacted into {result.files_after}"
                    if result.compacted else "a batch committed meanwhile: nothing compacted, "
                    "run it again")
    return outcome + (f"; {result.vacuumed} unreferenced file(s) removed"
                      if result.vacuumed else "")
