"""Each replicated table's status: the one record the feed, the CLI and the metrics all read.

A replication job knows each table's state from two places: the source's report in Spark's
progress (its ``connector.table_state`` and its lag) and the apply (``AppliedTable``: a target
that refused a batch, changes applied, the target's version, its last schema change).
``Pipeline.table_statuses`` joins them into one ``TableStatus`` per table, in the driver, every
couple of seconds; from there:

- ``TableStatusWriter`` stores each table's record in the meta store, beside the table's own
  namespace (the companion namespace ``"table-status#" + namespace``, as ``query_record`` keeps
  Spark's figures), written only when it changed or every ``HEARTBEAT_S``;
- the feed (``tablestore_cdc.feed.snapshot.sources_summary``: the dashboard's ``/api/sources``)
  and ``tablestore-cdc meta tables`` read it back with ``load_table_status``;
- the Prometheus endpoint (``tablestore_cdc.pipeline.metrics``) is set from the same records.

A record without a schema change of this process keeps the one the previous record of the same
target showed (``TableStatusWriter``): a restart does not hide the last schema change.

The replication job's own states (``restarting`` after a retryable failure, ``failed`` when it
gave up, ``stopped`` after a clean stop) are written over every table's record by
``TableStatusWriter.mark_all``. A damaged record reads as none.

A table's state is stored as the string its ``State`` names.

Health (``TableStatusWriter.with_health``): a table the job restarts after a retryable failure
is ``unreachable``, since the outage began. ``idle`` and ``stale`` are the readers'
(``feed.snapshot.activity``, ``TableStatus.is_stale``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from connector.errors import CorruptMetaRecordError
from connector.table_state import FINAL, State, TableState
from meta_store import MetaStore

log = logging.getLogger("tablestore_cdc.table_status")

#: the replication job's state while it runs (``pipeline.job``'s ``record_status``): no table's
JOB_RUNNING = "running"
#: companion namespaces holding a table's status start with this
TABLE_STATUS_PREFIX = "table-status#"
#: a record unchanged for this long is written again (the feed sees the pipeline is alive)
HEARTBEAT_S = 10.0
#: a record older than this is shown as not updated (the pipeline is probably gone)
STALE_AFTER_S = 60.0
#: the apply's per-operation counters, by the change batch's ``_op`` (``connector.schema``):
#: PUT an insert (a whole row written), UPDATE, DELETE, READ a snapshot read (``snapshot.op``)
OP_NAMES = {"PUT": "inserts", "UPDATE": "updates", "DELETE": "deletes",
            "READ": "snapshot_reads"}


class TableStatus(BaseModel):
    """One replicated table, as its job's driver last saw it (JSON in the meta store; the
    feed's ``table_status``, docs/progress-feed.md)."""

    table: str
    #: the job: its output directory, and the tables it selects (``--tables``; a single
    #: table's job: its ``--table``)
    job: str
    selection: str
    #: its state (``connector.table_state.State``: the JSON string it names)
    state: State
    #: why it failed (the source's error, or ``batch N: <the target's refusal>``), or why the
    #: job restarts it
    reason: str | None = None
    #: how much of its base data is read (a BaseAndStream tunnel while snapshotting)
    snapshot_percent: float | None = None
    records_behind: int | None = None
    seconds_behind: float | None = None
    rows_applied: int = 0
    #: changes applied per second over the last ``RATE_WINDOW_S`` (multi_table)
    rows_per_second: float | None = None
    #: when its target last committed (seconds since the epoch)
    last_commit: float | None = None
    target: str | None = None
    target_version: int | None = None
    #: the newest schema change made to the target (``batch N: add column x``; the target's
    #: history has every one), when it was committed (seconds since the epoch) and the target
    #: version that commit made
    last_schema_change: str | None = None
    last_schema_change_at: float | None = None
    last_schema_change_version: int | None = None
    #: the table's last automatic maintenance (``lakehouse.upkeep``): when, its one-line
    #: summary (or ``failed: ...``), the current files before and after, snapshots expired,
    #: unreferenced files removed
    last_maintenance_at: float | None = None
    last_maintenance: str | None = None
    maintenance_files_before: int | None = None
    maintenance_files_after: int | None = None
    maintenance_snapshots_expired: int | None = None
    maintenance_files_removed: int | None = None
    #: the target's data files in its current version (snapshot), and its snapshots kept
    #: (Iceberg), as the last maintenance run counted them
    target_files: int | None = None
    target_snapshots: int | None = None
    #: ``unreachable``: when the source stopped answering (seconds since the epoch), the
    #: restart attempt in a row, and when the next one is due
    unreachable_since: float | None = None
    attempt: int | None = None
    next_attempt_at: float | None = None
    #: changes applied by this process by operation (``OP_NAMES``' values: inserts, updates,
    #: deletes, snapshot_reads)
    ops: dict[str, int] = {}
    #: when this record was written (seconds since the epoch)
    at: float = 0.0

    @classmethod
    def of(cls, state: TableState, *, now: float, snapshot_percent: float | None = None,
           **fields: Any) -> TableStatus:
        """The status of a table in ``state`` (driver, ``table_statuses``): streaming while
        its base data is read is ``snapshotting``; a restart's attempt and when the next one
        is due are fields of their own, the reason is the error alone."""
        name = state.state
        if name is State.STREAMING and snapshot_percent is not None:
            name = State.SNAPSHOTTING
        if state.attempt is not None:
            fields.update(attempt=state.attempt,
                          next_attempt_at=now + (state.next_in_s or 0.0))
        return cls(state=name, reason=state.reason, snapshot_percent=snapshot_percent,
                   **fields)

    def label(self) -> str:
        """The state as a person reads it: ``snapshotting 40 %``, ``failed: batch 3: ...``,
        ``source unreachable (since 2026-12-06 06:40:12 UTC, attempt 3): ...``."""
        if self.state == State.SNAPSHOTTING and self.snapshot_percent is not None:
            return f"snapshotting {self.snapshot_percent:.0f} %"
        if self.state == State.UNREACHABLE:
            since = ("" if self.unreachable_since is None else
                     time.strftime("since %Y-%m-%d %H:%M:%S UTC, ",
                                   time.gmtime(self.unreachable_since)))
            head = f"source unreachable ({since}attempt {self.attempt or 1})"
            return f"{head}: {self.reason}" if self.reason else head
        return TableState(State(self.state), self.reason).label()

    def is_stale(self, now: float) -> bool:
        """Has the job not refreshed this record for longer than expected (the job is
        probably gone)? Longer than ``STALE_AFTER_S``, or for a table waiting for its next
        restart attempt, than that attempt's time plus ``STALE_AFTER_S``."""
        allowed = STALE_AFTER_S
        if self.next_attempt_at is not None:
            allowed += max(0.0, self.next_attempt_at - self.at)
        return now - self.at > allowed

    def figures(self) -> tuple[Any, ...]:
        """Everything but the time of writing: a change of these is written at once."""
        return tuple(v for k, v in self.model_dump().items() if k != "at")


#: the fields of a table's last schema change (carried over by ``TableStatusWriter``)
SCHEMA_CHANGE_FIELDS = ("last_schema_change", "last_schema_change_at",
                        "last_schema_change_version")
#: the apply's rows/s of a table is measured over this many seconds
RATE_WINDOW_S = 30.0


@dataclass
class AppliedTable:
    """What the apply knows of one table (driver): ``MultiTableApply`` keeps one per table;
    joined with the source's report into the table's ``TableStatus``."""

    state: State = State.STREAMING  # streaming, failed
    reason: str | None = None
    rows_applied: int = 0
    last_batch: int | None = None
    version: int | None = None
    #: when the target last committed (seconds since the epoch)
    last_commit: float | None = None
    #: the newest batch that changed the target's schema and the changes it made, when, and
    #: the target version of that commit
    last_schema_change: str | None = None
    last_schema_change_at: float | None = None
    last_schema_change_version: int | None = None
    #: (when, changes) of its recent commits, for the rate
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=1000))
    #: its last maintenance run (``lakehouse.upkeep.MaintenanceRun``), None: none yet
    maintenance: Any = None
    #: changes applied by operation (``OP_NAMES``' values)
    ops: dict[str, int] = field(default_factory=dict)

    def record(self, result: Any) -> None:
        """What the apply sink did with one batch (``lakehouse.sink.ApplyResult``)."""
        self.last_batch = result.batch_id
        if getattr(result, "maintenance", None) is not None:
            self.maintenance = result.maintenance
        if not result.committed:
            return
        now = time.time()
        self.rows_applied += result.changes
        for op, n in getattr(result, "ops", ()):
            name = OP_NAMES.get(op, op.lower())
            self.ops[name] = self.ops.get(name, 0) + n
        self.version = result.version
        self.last_commit = now
        self.recent.append((now, result.changes))
        if result.schema_changes:
            self.last_schema_change = (f"batch {result.batch_id}: "
                                       f"{'; '.join(result.schema_changes)}")
            self.last_schema_change_at, self.last_schema_change_version = now, result.version

    def rows_per_second(self, now: float) -> float:
        """Changes applied per second over the last ``RATE_WINDOW_S`` (0 when idle)."""
        return sum(n for at, n in self.recent if now - at <= RATE_WINDOW_S) / RATE_WINDOW_S

    def status_fields(self, now: float) -> dict[str, Any]:
        """The apply's fields of the table's ``TableStatus``."""
        return {"rows_applied": self.rows_applied, "ops": dict(self.ops),
                "rows_per_second": round(self.rows_per_second(now), 3),
                "last_commit": self.last_commit, "target_version": self.version,
                **{name: getattr(self, name) for name in SCHEMA_CHANGE_FIELDS},
                **self.maintenance_fields()}

    def maintenance_fields(self) -> dict[str, Any]:
        """The ``TableStatus`` fields of its last maintenance run (none: empty)."""
        run = self.maintenance
        if run is None:
            return {}
        failed = run.error is not None
        return {"last_maintenance_at": run.at, "last_maintenance": run.describe(),
                "maintenance_files_before": None if failed else run.files_before,
                "maintenance_files_after": None if failed else run.files_after,
                "maintenance_snapshots_expired": None if failed else run.snapshots_expired,
                "maintenance_files_removed": None if failed else run.files_removed,
                "target_files": None if failed else run.files_after,
                "target_snapshots": None if failed else run.snapshots_after}


def load_table_status(store: MetaStore, namespace: str) -> TableStatus | None:
    """The status a replication job last recorded for the table of ``namespace``, or ``None``
    (a query not run by ``replicate``, or a damaged record). Feed and CLI, read-only."""
    try:
        info = store.get_namespace_info(TABLE_STATUS_PREFIX + namespace) or {}
    except CorruptMetaRecordError:
        return None
    try:
        return TableStatus.model_validate_json(info["status"]) if "status" in info else None
    except ValidationError:
        return None


class TableStatusWriter:
    """Writes each table's ``TableStatus`` into the meta store of its namespace (driver, the
    replicate command's loop). ``namespace_of(table)`` gives the table's meta store URI, its
    credentials and its namespace (``SourceOptions`` of that table). A meta store that does
    not answer is logged once and skipped: monitoring never stops the pipeline.

    A status without a schema change (a pipeline restarted, by the job or by hand) keeps the
    last one the table's previous record showed for the same target (read once per table)."""

    def __init__(self, namespace_of: Any) -> None:
        self._namespace_of = namespace_of
        #: table -> ``namespace_of(table)``, asked once: the options do not change while the
        #: job runs, and building them is most of a heartbeat's cost at 1,000 tables
        self._locations: dict[str, tuple[str, Any, str]] = {}
        self._stores: dict[str, MetaStore] = {}
        self._written: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._last: dict[str, TableStatus] = {}
        #: tables whose previous record was read (``_with_last_schema_change``)
        self._read: set[str] = set()
        self._warned = False
        #: table -> when its source stopped answering (``with_health``)
        self._down_since: dict[str, float] = {}
        self._attempts: dict[str, tuple[int, float | None]] = {}
        #: called with every published batch of statuses (health applied): the metrics
        self._observers: list[Any] = []
        #: the endpoint's probe (``pipeline.metrics.EndpointProbe``, ``TableMetrics.attach``):
        #: a reading table is ``unreachable`` while its endpoint does not answer
        self.probe: Any = None

    def observe(self, observer: Any) -> None:
        """Call ``observer(statuses)`` with each batch of statuses published (driver, the
        command's loop and the job's ``record_status``): ``TableMetrics.update``, so the
        metrics show what the feed shows, restarts included."""
        self._observers.append(observer)

    def with_health(self, table: str, status: TableStatus, now: float) -> TableStatus:
        """``status`` with its health: a ``restarting`` table becomes ``unreachable``, since
        the first restart of this outage, with its attempt and when the next one is due; any
        other state ends the outage."""
        if status.state not in (State.RESTARTING, State.UNREACHABLE):
            self._down_since.pop(table, None)
            self._attempts.pop(table, None)
            return status
        # the job's restart names its figures in the reason (``attempt n, next in N s: ...``)
        state = TableState.of(status.state, status.reason)
        since = self._down_since.setdefault(table, status.unreachable_since or now)
        attempt: int | None
        next_at: float | None
        if state.attempt is not None:
            attempt, next_at = state.attempt, now + (state.next_in_s or 0.0)
        else:  # a multi-table table's (``TableStatus.of``), or unreachable already
            attempt, next_at = status.attempt, status.next_attempt_at
        if attempt is not None and (state.attempt is not None
                                    or status.state == State.RESTARTING):
            # the same attempt published again keeps the time its next one is due
            known = self._attempts.get(table)
            if known is not None and known[0] == attempt:
                next_at = known[1]
            self._attempts[table] = (attempt, next_at)
        return status.model_copy(update={
            "state": State.UNREACHABLE, "unreachable_since": since, "attempt": attempt,
            "next_attempt_at": next_at, "reason": state.reason})

    def publish(self, statuses: dict[str, TableStatus], force: bool = False
                ) -> dict[str, TableStatus]:
        """Write the records that changed (or are due for a heartbeat); returns the statuses
        as published (health applied, ``with_health``)."""
        now = time.time()
        published = {}
        if self.probe is not None:  # an outage seen before the query's retries give up
            statuses = self.probe.applied(statuses)
        for table, status in statuses.items():
            status = self.with_health(table, self._with_last_schema_change(table, status), now)
            self._last[table] = published[table] = status
        # the observers (the metrics) first: during an outage of a meta store kept on the
        # source's service, each write below waits out its client's retries
        for observer in self._observers:
            try:
                observer(published)
            except Exception as exc:  # noqa: BLE001 - monitoring must never stop the pipeline
                log.debug("a status observer failed: %s", exc)
        for table, status in published.items():
            figures = status.figures()
            written = self._written.get(table)
            if not force and written and written[0] == figures and now - written[1] < HEARTBEAT_S:
                continue
            if self._write(table, status.model_copy(update={"at": now})):
                self._written[table] = (figures, now)
        return published

    def mark_all(self, state: str, reason: str | None) -> None:
        """The job's state over every table it has published (``restarting``, ``failed``,
        ``stopped``; the job's ``record_status``), but a dropped table or one failed on its
        own keeps its state; ``running`` changes nothing (the next ``publish`` says each
        table's)."""
        if state == JOB_RUNNING:
            return
        name = State(state)
        marked = {table: s.model_copy(update={"state": name, "reason": reason})
                  for table, s in self._last.items() if s.state not in FINAL}
        self.publish(marked, force=True)

    def _with_last_schema_change(self, table: str, status: TableStatus) -> TableStatus:
        if status.last_schema_change is not None:
            return status
        previous = self._last.get(table)
        if previous is None and table not in self._read:
            self._read.add(table)
            try:
                uri, credentials, namespace = self._location(table)
                previous = load_table_status(self._store(uri, credentials), namespace)
            except Exception as exc:  # noqa: BLE001 - monitoring must never stop the pipeline
                log.debug("cannot read table %s's previous status: %s", table, exc)
        if previous is None or previous.target != status.target:
            return status
        return status.model_copy(update={name: getattr(previous, name)
                                         for name in SCHEMA_CHANGE_FIELDS})

    def _location(self, table: str) -> tuple[str, Any, str]:
        """``table``'s meta store (URI, credentials) and namespace (``namespace_of``)."""
        if table not in self._locations:
            self._locations[table] = self._namespace_of(table)
        return self._locations[table]

    def _store(self, uri: str, credentials: Any) -> MetaStore:
        if uri not in self._stores:
            from meta_store import open_meta_store

            self._stores[uri] = open_meta_store(uri, credentials)
        return self._stores[uri]

    def _write(self, table: str, status: TableStatus) -> bool:
        try:
            uri, credentials, namespace = self._location(table)
            self._store(uri, credentials).set_namespace_info(TABLE_STATUS_PREFIX + namespace,
                                                 {"kind": "table-status",
                                                  "status": status.model_dump_json()})
            return True
        except Exception as exc:  # noqa: BLE001 - monitoring must never stop the pipeline
            if not self._warned:
                log.warning("cannot record the tables' status in the meta store: %s", exc)
                self._warned = True
            return False

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()


#: the console's summary of every table is printed this often (seconds)
SUMMARY_EVERY_S = 30.0


class StatusSummary:
    """What the ``replicate`` command prints of its tables' statuses (driver, the command's
    loop, each look): a line at once when a table's state changes (``table orders:
    streaming``) or its target's schema changes (``table orders: schema change of the target:
    batch 3: add column colour string (target version 5)``), and one summary line every
    ``every_s`` (``tables: 3 streaming, 1 snapshotting; 1200 change(s) applied``) -- never a
    line per table per batch."""

    def __init__(self, every_s: float = SUMMARY_EVERY_S) -> None:
        self.every_s = every_s
        self._states: dict[str, str] = {}
        self._schema_changes: dict[str, str | None] = {}
        self._summarised_at: float | None = None
        self._started = time.time()

    def lines(self, statuses: dict[str, TableStatus], now: float | None = None, *,
              final: bool = False) -> list[str]:
        """The lines to print for this look at ``statuses``; ``final``: the last look of a run
        (``--once`` caught up, or the job stopping), whose summary line is printed whatever
        the interval."""
        now = time.time() if now is None else now
        out = []
        for table, status in sorted(statuses.items()):
            state = (status.label() if status.state != State.SNAPSHOTTING
                     else str(status.state))
            if status.state == State.UNREACHABLE:  # the attempt changes; the outage does not
                state = f"unreachable since {status.unreachable_since}"
            if self._states.get(table) != state:
                out.append(f"table {table}: {status.label()}")
                self._states[table] = state
            change = status.last_schema_change
            if table not in self._schema_changes and (status.last_schema_change_at or 0) \
                    < self._started:
                self._schema_changes[table] = change  # a change of an earlier run: not news
            elif change is not None and change != self._schema_changes.get(table):
                out.append(f"table {table}: schema change of the target: {change} (target "
                           f"version {status.last_schema_change_version})")
                self._schema_changes[table] = change
        if statuses and (final or self._summarised_at is None
                         or now - self._summarised_at >= self.every_s):
            out.append(summary_line(statuses))
            self._summarised_at = now
        return out


def summary_line(statuses: dict[str, TableStatus]) -> str:
    """``tables: 3 streaming, 1 unreachable; 1200 change(s) applied, 0.0 rows/s``."""
    counts = Counter(str(status.state) for status in statuses.values())
    by_state = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    applied = sum(s.rows_applied for s in statuses.values())
    rate = sum(s.rows_per_second or 0.0 for s in statuses.values())
    return f"tables: {by_state}; {applied} change(s) applied, {rate:.1f} rows/s"
