"""The maintenance a replication job runs itself on each of its targets (driver, between
batches): small files compacted, old Iceberg snapshots expired, unreferenced files removed,
so a job left running for a month keeps its tables healthy without ``lake optimize``.

Who calls what, where: ``replicate`` gives each apply sink an ``Upkeep`` of its
``MaintenancePolicy`` (``ApplySettings.maintenance``; ``multi_table.MultiTableApply.sink``
for each table of the selection). The sink's
``apply`` (``sink.ApplySink.apply``, in the apply query's ``foreachBatch`` on the driver)
calls ``Upkeep.after_batch`` after each batch it committed, so maintenance never runs while
the job's own batch of that table is in flight: it cannot race the job's commits, only
another writer's (a manual ``lake optimize``), and the formats' optimistic commits settle that
(maintenance.py). What a run did travels in the batch's ``ApplyResult.maintenance`` to the
table's ``AppliedTable`` and from there into its ``TableStatus`` (feed, ``meta tables``,
dashboard) and the Prometheus gauges.

A run is due after ``every_minutes`` since the table's last run, or after ``every_batches``
committed batches, whichever comes first. It then does only what is past its threshold
(``delta_run``, ``iceberg_run``: the runs ``lake optimize`` makes too, with what it is asked):

- **Delta**: compaction (``optimize.z_order`` on the first key column, as ``lake optimize``:
  the rows sorted by key into files of delta-rs's target size, 100 MiB, so the key clustering
  that keeps batches cheap stays) when more than ``compact_files`` of the current version's
  files are smaller than ``small_file_bytes``; then, at most every ``vacuum_every_minutes``,
  a full ``vacuum``: the files no version of the last ``vacuum_hours`` references, and those
  no commit ever named (a batch killed before its commit) once older than that.
- **Iceberg**: compaction by the job itself (pyiceberg 0.12 has none: ``_compact_iceberg``,
  the small files' rows sorted by key and cut as a batch's rewrite cuts them, in one snapshot
  of the sink's writer) on the same threshold; snapshots expired beyond the newest
  ``keep_snapshots`` or older than ``expire_hours``, except those the sink's exactly once
  needs (``_expire_iceberg``: the current snapshot and its ancestors down to the
  job's newest batch marker, branch and tag heads); then, at most every
  ``vacuum_every_minutes``, the files no snapshot references and older than ``vacuum_hours``
  removed (``_vacuum_iceberg``).

Never removed: a file of the current version or snapshot, or of any Delta version younger than
``vacuum_hours``, or any file younger than that (``vacuum_hours`` is at least
``MIN_VACUUM_HOURS``: a reader that pinned a recent version, or a restart, finds its files).

A run that fails (an error of the store, a commit refused) is logged in one line and recorded
with its error; the batch is not failed, and the next due run tries again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connector.errors import CdcError
from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.layout import local_path

if TYPE_CHECKING:
    from tablestore_cdc.lakehouse.ownership import Marker

log = logging.getLogger("tablestore_cdc.lakehouse")

#: a table is looked at after this many minutes since its last run ...
EVERY_MINUTES = 10.0
#: ... or after this many committed batches, whichever comes first
EVERY_BATCHES = 100
#: a Delta data file smaller than this is small: a third of delta-rs's target file size for
#: ``optimize`` (100 MiB), so the files a compaction writes are not small themselves
SMALL_FILE_BYTES = 32 << 20
#: compact a table when more than this many of its current files are small (0: never)
COMPACT_FILES = 64
#: Iceberg: keep at most the newest this many snapshots ...
KEEP_SNAPSHOTS = 100
#: ... and none older than this (hours); the needed ones are always kept
EXPIRE_HOURS = 1.0
#: files no version/snapshot of the last this many hours references are removed (7 days)
VACUUM_HOURS = 168.0
#: the shortest retention the job accepts (a reader of a recent version, a restart)
MIN_VACUUM_HOURS = 1.0
#: a vacuum lists the whole table's files: at most this often (minutes)
VACUUM_EVERY_MINUTES = 60.0


class MaintenanceSettingError(CdcError, ValueError):
    """A maintenance setting (``replicate --maintenance-*``, a table's ``maintenance_*`` TOML
    key) out of its range."""

    template = "maintenance setting {setting!r}: {problem} (got {value!r})"


@dataclass(frozen=True)
class MaintenancePolicy:
    """When and how a replication job maintains its targets (module doc); validated when made
    (driver, before Spark starts)."""

    enabled: bool = True
    every_minutes: float = EVERY_MINUTES
    every_batches: int = EVERY_BATCHES
    compact_files: int = COMPACT_FILES
    small_file_bytes: int = SMALL_FILE_BYTES
    keep_snapshots: int = KEEP_SNAPSHOTS
    expire_hours: float = EXPIRE_HOURS
    vacuum_hours: float = VACUUM_HOURS
    vacuum_every_minutes: float = VACUUM_EVERY_MINUTES

    def __post_init__(self) -> None:
        lows = {"every_batches": 1, "small_file_bytes": 1, "keep_snapshots": 1,
                "vacuum_hours": MIN_VACUUM_HOURS}
        for setting in [f.name for f in dataclasses.fields(self) if f.name != "enabled"]:
            value, low = getattr(self, setting), lows.get(setting, 0)
            if (not isinstance(value, int | float) or isinstance(value, bool)
                    or not math.isfinite(value) or value < low):
                raise MaintenanceSettingError(setting=setting, value=value,
                                              problem=f"must be a number of at least {low}")

    def compacts(self, sizes: list[int]) -> bool:
        """Whether a table whose current data files have these sizes is due for compaction:
        more than ``compact_files`` of them smaller than ``small_file_bytes``."""
        return bool(self.compact_files) and sum(
            1 for size in sizes if size < self.small_file_bytes) > self.compact_files

    @classmethod
    def off(cls) -> MaintenancePolicy:
        """``replicate --maintenance off``."""
        return cls(enabled=False)


#: ``--maintenance-setting`` keys: the policy's fields a person sets
SETTINGS = ("every_minutes", "every_batches", "compact_files", "small_file_mb",
            "keep_snapshots", "expire_hours", "vacuum_hours", "vacuum_every_minutes")


def policy_of(mode: str, settings: list[str] | None = None) -> MaintenancePolicy:
    """The policy of ``replicate --maintenance on|off`` and its ``--maintenance-setting
    KEY=VALUE`` flags (CLI process, before Spark starts); a bad one raises
    ``MaintenanceSettingError`` naming it."""
    if mode not in ("on", "off"):
        raise MaintenanceSettingError(setting="--maintenance", value=mode,
                                      problem="must be on or off")
    values: dict[str, float | int] = {}
    for item in settings or []:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SETTINGS:
            raise MaintenanceSettingError(setting=key or item, value=item,
                                          problem="expected KEY=VALUE with KEY one of "
                                          + ", ".join(SETTINGS))
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise MaintenanceSettingError(setting=key, value=text, problem="must be a number")
        if key == "small_file_mb":
            values["small_file_bytes"] = int(number * (1 << 20))
        elif key in ("every_batches", "compact_files", "keep_snapshots"):
            if number != int(number):
                raise MaintenanceSettingError(setting=key, value=text,
                                              problem="must be a whole number")
            values[key] = int(number)
        else:
            values[key] = number
    return MaintenancePolicy(enabled=mode == "on", **values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MaintenanceRun:
    """What one maintenance run did to a table (``TableStatus``'s ``last_maintenance*``)."""

    #: when it ran (seconds since the epoch) and how long it took
    at: float
    seconds: float
    table_format: str
    #: the current version's (snapshot's) data files before and after
    files_before: int
    files_after: int
    compacted: bool = False
    #: Iceberg: snapshots kept before and after, and how many were expired (None: no expiry
    #: asked, ``lake optimize`` without ``--expire-hours``); False when another commit that
    #: changed the snapshots meanwhile refused the expiry
    snapshots_before: int | None = None
    snapshots_after: int | None = None
    snapshots_expired: int | None = 0
    expiry_done: bool = True
    #: unreferenced files removed (vacuum; 0 when none was due)
    files_removed: int = 0
    #: why the run failed (one line), None when it did not
    error: str | None = None

    def describe(self) -> str:
        """One line for the log, the dashboard and ``meta tables``."""
        if self.error is not None:
            return f"failed: {self.error}"
        files = (f"{self.files_before} -> {self.files_after} file(s)" if self.compacted
                 else f"{self.files_after} file(s)")
        snapshots = ("" if self.snapshots_after is None
                     else f", {self.snapshots_expired} snapshot(s) expired, "
                     f"{self.snapshots_after} kept")
        return f"{files}{snapshots}, {self.files_removed} unreferenced file(s) removed"


class Upkeep:
    """One table's maintenance schedule (driver; held by its apply sink as ``sink.upkeep``).
    ``clock``: seconds since the epoch (a test may pass its own)."""

    def __init__(self, policy: MaintenancePolicy,
                 clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.clock = clock
        self._since = clock()
        self._batches = 0
        self._vacuumed_at: float | None = None
        self.last_run: MaintenanceRun | None = None

    def due(self) -> bool:
        """Whether the table is due for a run (module doc)."""
        return self.policy.enabled and (
            self._batches >= self.policy.every_batches
            or self.clock() - self._since >= self.policy.every_minutes * 60)

    def after_batch(self, sink: Any) -> MaintenanceRun | None:
        """After a batch ``sink`` committed (``ApplySink.apply``, driver): a run when one is
        due (None otherwise). Never raises: a failed run is logged, recorded, retried at the
        next due time."""
        self._batches += 1
        if not self.due():
            return None
        now = self.clock()
        self._since, self._batches = now, 0
        vacuum = (self._vacuumed_at is None
                  or now - self._vacuumed_at >= self.policy.vacuum_every_minutes * 60)
        try:
            run = maintain(sink, self.policy, vacuum=vacuum, now=now)
        except Exception as exc:  # noqa: BLE001 - maintenance never fails the stream
            error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            log.warning("table %s: maintenance failed, retried at its next run: %s", sink, error)
            run = MaintenanceRun(at=now, seconds=self.clock() - now, table_format=_format(sink),
                                 files_before=0, files_after=0, error=error)
        else:
            if run is None:
                return None
            if vacuum:
                self._vacuumed_at = now
            log.info("table %s: maintenance: %s", sink, run.describe())
        self.last_run = run
        return run


def _format(sink: Any) -> str:
    from tablestore_cdc.lakehouse.iceberg import IcebergApplySink

    return "iceberg" if isinstance(sink, IcebergApplySink) else "delta"


def maintain(sink: Any, policy: MaintenancePolicy, *, vacuum: bool = True,
             now: float | None = None) -> MaintenanceRun | None:
    """One maintenance run of ``sink``'s table as ``policy`` says (module doc); None when there
    is no table yet or it carries no marker (a table the sink did not create is left alone).
    Raises what the format raised."""
    started = time.time() if now is None else now
    clock = time.monotonic()
    table = sink.table()
    marker = None if table is None else owner_marker(sink, table)
    if marker is None:
        return None
    vacuum_hours = policy.vacuum_hours if vacuum else None
    if _format(sink) == "iceberg":
        run = iceberg_run(sink, table, marker, started, compaction=policy,
                          expire_hours=policy.expire_hours, keep_newest=policy.keep_snapshots,
                          vacuum_hours=vacuum_hours)
    else:
        run = delta_run(sink, table, marker.key_columns[0], started, compact=policy.compacts,
                        vacuum_hours=vacuum_hours)
    return MaintenanceRun(**{**run.__dict__, "seconds": round(time.monotonic() - clock, 3)})


def owner_marker(sink: Any, table: Any) -> Marker | None:
    """The marker of ``sink``'s ``table`` (``ownership.Marker``: its job and key columns), or
    None for a table the sink did not create, which maintenance leaves alone."""
    from tablestore_cdc.lakehouse.ownership import Marker

    properties = (table.properties if _format(sink) == "iceberg"
                  else dict(table.metadata().configuration))
    marker = Marker.of(properties)
    return marker if marker is not None and marker.key_columns else None


def delta_run(sink: Any, table: Any, key: str, now: float, *,
              compact: Callable[[list[int]], bool],
              vacuum_hours: float | None) -> MaintenanceRun:
    """One run over ``sink``'s Delta ``table`` (the job's, ``maintain``, and ``lake optimize``'s;
    module doc): compacted by ``key`` when ``compact`` says so of its current files' sizes
    (a compaction another commit got in first is dropped), then, with ``vacuum_hours``, a full
    vacuum."""
    from deltalake.exceptions import CommitFailedError

    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    compacted = False
    if compact(sizes):
        try:
            _compact_delta(table, key)
            compacted = True
        except CommitFailedError:  # another writer committed meanwhile: it wins
            log.info("table %s: compaction refused (another commit meanwhile), retried at its "
                     "next run", sink)
        table = sink.table()
    removed = 0
    if vacuum_hours is not None:
        removed = len(table.vacuum(retention_hours=math.ceil(vacuum_hours), dry_run=False,
                                   enforce_retention_duration=False, full=True))
    return MaintenanceRun(at=now, seconds=0.0, table_format="delta", files_before=len(sizes),
                          files_after=len(table.file_uris()), compacted=compacted,
                          files_removed=removed)


def _compact_delta(table: Any, key: str) -> None:
    """Sort the Delta table's rows by ``key`` into files of delta-rs's target size."""
    table.optimize.z_order([key])


def iceberg_run(sink: Any, table: Any, marker: Marker, now: float, *,
                compaction: MaintenancePolicy | None, expire_hours: float | None,
                keep_newest: int | None, vacuum_hours: float | None) -> MaintenanceRun:
    """One run over ``sink``'s Iceberg ``table`` of the owner ``marker`` (the job's,
    ``maintain``, and ``lake optimize``'s; module doc): small files compacted as ``compaction``
    says (None: none), snapshots expired with ``expire_hours`` (``_expire_iceberg``), files
    removed with ``vacuum_hours`` (``_vacuum_iceberg``). A compaction or expiry another commit
    got in first is dropped."""
    from pyiceberg.exceptions import CommitFailedException

    tasks = list(table.scan().plan_files())
    compacted = False
    if compaction is not None and compaction.compacts([t.file.file_size_in_bytes
                                                       for t in tasks]):
        try:
            compacted = _compact_iceberg(table, tasks, marker.key_columns[0], compaction)
        except CommitFailedException:  # another writer committed meanwhile: it wins
            log.info("table %s: compaction refused (another commit meanwhile), retried at its "
                     "next run", sink)
        table = sink.table()
    files_after = len(list(table.scan().plan_files())) if compacted else len(tasks)
    before = len(table.metadata.snapshots)
    expired: int | None = None
    done = True
    if expire_hours is not None:
        expired, done = _expire_iceberg(table, marker.job, expire_hours, keep_newest=keep_newest)
        if not done:
            log.info("table %s: snapshot expiry refused (another commit meanwhile), retried "
                     "at its next run", sink)
        table = sink.table()
    removed = 0 if vacuum_hours is None else _vacuum_iceberg(str(sink), table, vacuum_hours)
    return MaintenanceRun(at=now, seconds=0.0, table_format="iceberg", files_before=len(tasks),
                          files_after=files_after, compacted=compacted, snapshots_before=before,
                          snapshots_after=len(table.metadata.snapshots),
                          snapshots_expired=expired, expiry_done=done, files_removed=removed)


#: the summary property of a compaction's snapshot (its files replaced, no rows changed)
COMPACTION_PROPERTY = "tablestore-cdc.compaction"


def _compact_iceberg(table: Any, tasks: list[Any], key: str, policy: MaintenancePolicy) -> bool:
    """Replace the small data files of the Iceberg table's current snapshot (``tasks``, its
    scan plan) by their rows sorted by ``key`` and cut as a batch's rewrite cuts them
    (``rewrite.rewrite_groups``), in one snapshot of the sink's own writer
    (``iceberg._write_files``: pyiceberg has no compaction). At most
    ``rewrite.REWRITE_MAX_ROWS`` rows a run (they are in the driver's memory), the smallest
    files first; the next run takes the rest. The snapshot carries no batch marker: a restart
    walks back past it to the job's newest batch. Returns whether it committed; a commit
    another writer got in first raises pyiceberg's ``CommitFailedException``."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    from tablestore_cdc.lakehouse.iceberg import _transaction, _write_files
    from tablestore_cdc.lakehouse.rewrite import REWRITE_MAX_ROWS, rewrite_groups

    chosen, rows = [], 0
    for task in sorted((t for t in tasks if t.file.file_size_in_bytes < policy.small_file_bytes),
                       key=lambda t: t.file.file_size_in_bytes):
        if rows + task.file.record_count > REWRITE_MAX_ROWS:
            break
        chosen.append(task)
        rows += task.file.record_count
    if len(chosen) < 2:
        return False
    current = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(chosen)
    transaction = _transaction(table)
    schema = transaction.table_metadata.schema().as_arrow()
    groups = rewrite_groups(current.sort_by(key), key)
    _write_files(transaction, chosen, groups, schema, table.io,
                 {COMPACTION_PROPERTY: f"{len(chosen)} file(s)"})
    transaction.commit_transaction()
    return True


def _expire_iceberg(table: Any, job: str, expire_hours: float,
                    keep_newest: int | None = None) -> tuple[int, bool]:
    """Expire the snapshots of ``table`` older than ``expire_hours`` (and, with
    ``keep_newest``, those beyond the newest that many) but those the batch marker of ``job``
    (the table's owner) needs: the current snapshot's ancestors down to the newest snapshot of
    ``job`` (all of them if it has none there), nor branch and tag heads (pyiceberg refuses
    those). Returns how many were expired, and False when a commit that changed the snapshots
    meanwhile refused it."""
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


def _table_files(uri: str, table: Any) -> list[tuple[str, float]]:
    """Every data, manifest, manifest-list and metadata file under the table's location, as
    ``_referenced_files`` names them (a local path, or the object store's URI), with its
    modification time (seconds). An object store is listed with the pyarrow file system of
    the table's FileIO (its properties: endpoint, region, credentials); another FileIO is
    refused (``TargetUriError``)."""
    location = table.location().rstrip("/")
    root = local_path(location)
    if root is not None:
        return [(str(path), path.stat().st_mtime) for path in sorted(Path(root).rglob("*"))
                if path.is_file() and _vacuumed(path.relative_to(root).as_posix())]
    import pyarrow.fs as pafs

    from tablestore_cdc.lakehouse.target import FORMS

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
    """Whether a file at ``relative`` (to the table's location) is one a vacuum looks at:
    ``data/**/*.parquet``, ``metadata/*.avro``, ``metadata/*.metadata.json``."""
    folder, _, name = relative.rpartition("/")
    if folder == "data" or folder.startswith("data/"):
        return name.endswith(".parquet")
    return folder == "metadata" and (name.endswith(".avro")
                                     or name.endswith(".metadata.json"))


def _referenced_files(table: Any) -> set[str]:
    """The files the table's metadata refers to (local paths, or the object store's URIs as
    the metadata names them): the current metadata file and those of its log, every
    snapshot's manifest list, manifests, and data and delete files (time travel reads the old
    ones)."""
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
