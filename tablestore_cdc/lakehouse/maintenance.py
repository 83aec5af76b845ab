"""Maintenance of a target table beside the running stream (``tablestore-cdc lake optimize``;
driver or a separate process): small files compacted, old Iceberg snapshots expired,
unreferenced files removed. A run is the replication job's own (``upkeep.delta_run``,
``upkeep.iceberg_run``, which use this module's Iceberg expiry and vacuum) with what was asked
instead of the job's thresholds; ``describe`` is its line.

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

Iceberg: pyiceberg 0.12 has no compaction, and no removal of orphan files. With
``--expire-hours`` the snapshots older than that are expired (``_expire_iceberg``, pyiceberg's
``expire_snapshots``: a commit of the table's metadata alone) except those the sink's exactly
once needs: the current one and every snapshot between it and the newest of the job the table's
marker names (the batch marker its restart looks for, walking back from the current snapshot;
iceberg.committed_batch). Every Iceberg commit rewrites the whole metadata, so a stream's
batches slow down with the snapshots kept (docs/lakehouse.md, "Limits"). With
``--vacuum-hours`` the files under the table's location (a local directory, or an object
store listed through the table's own FileIO, pyiceberg's pyarrow file system) that no snapshot
in its metadata references and that are older than the retention are removed
(``_vacuum_iceberg``:
as Iceberg's ``DeleteOrphanFiles`` does): data files (those of batches killed before their
commit, their executors' among them, and those only expired snapshots referenced), and in
``metadata/`` the manifests, manifest lists and metadata files nothing refers to any more.

A retention shorter than a batch (``--vacuum-hours 0``) may remove the files of a batch in
flight, which then commits files that are gone: use it only with the stream stopped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.layout import local_path
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


def _expire_iceberg(table: Any, job: str, expire_hours: float,
                    keep_newest: int | None = None) -> tuple[int, bool]:
    """Expire the snapshots of ``table`` older than ``expire_hours`` (and, with
    ``keep_newest``, those beyond the newest that many: the job's automatic maintenance,
    upkeep.py) but those the batch marker
    of ``job`` (the table's owner) needs: the current snapshot's ancestors down to the newest
    snapshot of ``job`` (all of them if it has none there: nothing the walk could reach is cut
    off from it), nor branch and tag heads (pyiceberg refuses those). Returns how many were
    expired, and False when a commit that changed the snapshots meanwhile refused it."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.snapshots import ancestors_of

    from tablestore_cdc.lakehouse.iceberg import QUERY_ID_PROPERTY

    needed = {ref.snapshot_id for ref in table.metadata.refs.values()}  # pyiceberg refuses them
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        needed.add(snapshot.snapshot_id)
        if snapshot.summary is not None and snapshot.summary.get(QUERY_ID_PROPERTY) == job:
            break
    cutoff_ms = (time.time() - expire_hours * 3600) * 1000
    newest: set[int] | None = None
    if keep_newest is not None:
        by_age = sorted(table.metadata.snapshots, key=lambda s: (s.timestamp_ms,
                                                                 s.sequence_number or 0))
        newest = {s.snapshot_id for s in by_age[max(0, len(by_age) - max(keep_newest, 1)):]}
    old = [s.snapshot_id for s in table.metadata.snapshots
           if s.snapshot_id not in needed
           and (s.timestamp_ms < cutoff_ms or (newest is not None and s.snapshot_id not in newest))]
    if not old:
        return 0, True
    try:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    except (CommitFailedException, ValueError):  # another commit changed the snapshots first
        return 0, False
    return len(old), True


def _vacuum_iceberg(uri: str, table: Any, vacuum_hours: float) -> int:
    """Remove the files of an Iceberg table that no snapshot references and that are older
    than ``vacuum_hours`` (module doc); returns how many."""
    referenced = _referenced_files(table)
    cutoff = time.time() - vacuum_hours * 3600
    removed = 0
    for path, modified in _table_files(uri, table):
        if path not in referenced and modified < cutoff:
            if local_path(path) is not None:
                Path(path).unlink()
            else:
                table.io.delete(path)
            removed += 1
    return removed


#: the files a vacuum looks at, under the table's location
_VACUUMED = ("data/**/*.parquet", "metadata/*.avro", "metadata/*.metadata.json")


def _table_files(uri: str, table: Any) -> list[tuple[str, float]]:
    """Every data, manifest, manifest-list and metadata file under the table's location, as
    ``_referenced_files`` names them (a local path, or the object store's URI), with its
    modification time (seconds). An object store is listed with the pyarrow file system of
    the table's FileIO (its properties: endpoint, region, credentials); another FileIO is
    refused (``TargetUriError``)."""
    location = table.location().rstrip("/")
    root = local_path(location)
    if root is not None:
        return [(str(path), path.stat().st_mtime) for pattern in _VACUUMED
                for path in sorted(Path(root).glob(pattern))]
    import pyarrow.fs as pafs

    filesystem = getattr(table.io, "fs_by_scheme", None)
    parse = getattr(table.io, "parse_location", None)
    if filesystem is None or parse is None:
        raise TargetUriError(uri=uri, problem="the table's FileIO cannot list its files "
                             "(unreferenced files are removed through pyiceberg's pyarrow "
                             "FileIO: py-io-impl=pyiceberg.io.pyarrow.PyArrowFileIO)",
                             allowed=FORMS)
    scheme, netloc, path = parse(location)
    infos = filesystem(scheme, netloc).get_file_info(
        pafs.FileSelector(path, recursive=True, allow_not_found=True))
    found = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(path):].lstrip("/")
        if _vacuumed(relative):
            modified = info.mtime.timestamp() if info.mtime is not None else time.time()
            found.append((f"{scheme}://{info.path}", modified))
    return found


def _vacuumed(relative: str) -> bool:
    """Whether a file at ``relative`` (to the table's location) is one ``_VACUUMED`` names."""
    folder, _, name = relative.rpartition("/")
    if folder == "data" or folder.startswith("data/"):
        return name.endswith(".parquet")
    return folder == "metadata" and (name.endswith(".avro")
                                     or name.endswith(".metadata.json"))


def _referenced_files(table: Any) -> set[str]:
    """The files the table's metadata refers to (local paths, or the object store's URIs as
    the metadata names them): the current metadata
    file and those of its log, every snapshot's manifest list, manifests, and data and delete
    files (time travel reads the old ones)."""
    io = table.io
    files = {table.metadata_location, *(log.metadata_file for log in table.metadata.metadata_log)}
    manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in manifests:
                continue
            manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                files.add(entry.data_file.file_path)
    return {f if local_path(f) is None else str(Path(str(local_path(f))))
            for f in files | manifests}


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
