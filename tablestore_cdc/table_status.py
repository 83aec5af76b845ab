"""Each table's status in a multi-table pipeline: the one record the feed, the CLI and the
metrics all read.

A multi-table pipeline (``tablestore_cdc.pipeline.multi_table``) knows each table's state from
two places: the source's report in Spark's progress (new, snapshotting, streaming, dropped,
failed on the source side, and its lag) and the apply (a target that refused a batch, changes
applied, the target's version). ``MultiTablePipeline.table_statuses`` joins them into one
``TableStatus`` per table, in the driver, every couple of seconds; from there:

- ``TableStatusWriter`` stores each table's record in the meta store, beside the table's own
  namespace (the companion namespace ``"table-status#" + namespace``, as ``query_record`` keeps
  Spark's figures), written only when it changed or every ``HEARTBEAT_S``;
- the feed (``tablestore_cdc.feed.snapshot.sources_summary``: the dashboard's ``/api/sources``)
  and ``tablestore-cdc meta tables`` read it back with ``load_table_status``;
- the Prometheus endpoint (``tablestore_cdc.pipeline.metrics``) is set from the same records.

The replication job's own states (``restarting`` after a retryable failure, ``failed`` when it
gave up, ``stopped`` after a clean stop) are written over every table's record by
``TableStatusWriter.mark_all``. A damaged record reads as none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, ValidationError

from connector.errors import CorruptMetaRecordError
from meta_store import MetaStore

log = logging.getLogger("tablestore_cdc.table_status")

#: companion namespaces holding a table's status start with this
TABLE_STATUS_PREFIX = "table-status#"
#: a record unchanged for this long is written again (the feed sees the pipeline is alive)
HEARTBEAT_S = 10.0
#: a record older than this is shown as not updated (the pipeline is probably gone)
STALE_AFTER_S = 60.0
#: every state a table can be in (the metrics have one gauge series per state)
STATES = ("new", "snapshotting", "streaming", "waiting", "dropped", "failed", "restarting",
          "stopped")


class TableStatus(BaseModel):
    """One table of a multi-table pipeline, as its driver last saw it (JSON in the meta store;
    the feed's ``table_status``, docs/progress-feed.md)."""

    table: str
    #: the pipeline: its output directory, and the tables it selects (``--tables``)
    job: str
    selection: str
    state: str
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
    #: the newest schema change this process made to the target (``batch N: add column x``;
    #: the target's history has every one)
    last_schema_change: str | None = None
    #: when this record was written (seconds since the epoch)
    at: float = 0.0

    def label(self) -> str:
        """The state as a person reads it: ``snapshotting 40 %``, ``failed: batch 3: ...``."""
        if self.state == "snapshotting" and self.snapshot_percent is not None:
            return f"snapshotting {self.snapshot_percent:.0f} %"
        return f"{self.state}: {self.reason}" if self.reason else self.state

    def figures(self) -> tuple[Any, ...]:
        """Everything but the time of writing: a change of these is written at once."""
        return tuple(v for k, v in self.model_dump().items() if k != "at")


def load_table_status(store: MetaStore, namespace: str) -> TableStatus | None:
    """The status a multi-table pipeline last recorded for the table of ``namespace``, or
    ``None`` (a single-table query, or a damaged record). Feed and CLI, read-only."""
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
    not answer is logged once and skipped: monitoring never stops the pipeline."""

    def __init__(self, namespace_of: Any) -> None:
        self._namespace_of = namespace_of
        self._stores: dict[str, MetaStore] = {}
        self._written: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._last: dict[str, TableStatus] = {}
        self._warned = False

    def publish(self, statuses: dict[str, TableStatus], force: bool = False) -> None:
        """Write the records that changed (or are due for a heartbeat)."""
        now = time.time()
        for table, status in statuses.items():
            self._last[table] = status
            figures = status.figures()
            written = self._written.get(table)
            if not force and written and written[0] == figures and now - written[1] < HEARTBEAT_S:
                continue
            if self._write(table, status.model_copy(update={"at": now})):
                self._written[table] = (figures, now)

    def mark_all(self, state: str, reason: str | None) -> None:
        """The job's state over every table it has published (``restarting``, ``failed``,
        ``stopped``; the job's ``record_status``), but a dropped table or one failed on its
        own keeps its state; ``running`` changes nothing (the next ``publish`` says each
        table's)."""
        if state == "running":
            return
        marked = {table: s.model_copy(update={"state": state, "reason": reason})
                  for table, s in self._last.items() if s.state not in ("dropped", "failed")}
        self.publish(marked, force=True)

    def _write(self, table: str, status: TableStatus) -> bool:
        try:
            uri, credentials, namespace = self._namespace_of(table)
            if uri not in self._stores:
                from meta_store import open_meta_store

                self._stores[uri] = open_meta_store(uri, credentials)
            self._stores[uri].set_namespace_info(TABLE_STATUS_PREFIX + namespace,
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
