"""Per-table figures of a multi-table pipeline for Prometheus (``replicate --metrics-port``).

``TableMetrics`` holds its own ``prometheus_client`` registry (never the process-wide one, so
two pipelines in one process do not collide) and serves it over HTTP on 127.0.0.1 by default;
``update`` is called by the command's loop (driver) with each table's ``TableStatus``
(``Pipeline.table_statuses``: the same records the feed and ``meta tables`` read from the meta
store, ``tablestore_cdc.table_status``). Every series carries a ``table`` label but
``tablestore_cdc_source_up{source}``; the series are declared in ``TableMetrics.__init__`` and
listed in docs/operations.md ("Metrics and alerts").

``tablestore_cdc_source_up`` is 0 while any table is ``unreachable`` or while the endpoint's
probe fails (``EndpointProbe``, ``reachable``: tried at most every ``PROBE_EVERY_S`` at the
command's looks), so an outage shows within seconds, before the query's own per-call retries
give up, in the tables' statuses too (``TableMetrics.attach``). Once a table's lag passes
``WARN_AT`` of the service's retention (``tablestore_cdc.feed.retention``), one warning line is
logged (``tablestore_cdc.pipeline``), again only after the table came back under it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from cdc_common.uris import redact_uri
from connector.table_state import READING, State
from tablestore_cdc.feed.retention import DEFAULT_S, WARN_AT, headroom
from tablestore_cdc.table_status import OP_NAMES, TableStatus

log = logging.getLogger("tablestore_cdc.pipeline")

#: the endpoint is probed at most this often (seconds), each probe waiting at most
#: ``PROBE_TIMEOUT_S``
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 1.0


def reachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool | None:
    """Does the source's endpoint answer (driver, ``EndpointProbe``)? What is tried is what a
    short outage takes away first, and costs the service nothing:

    - ``http(s)://`` (Tablestore, the emulator): a TCP connection to its host and port;
    - ``dynamodb-streams://``: a TCP connection to its ``endpoint_url``, else to the region's
      ``streams.dynamodb.REGION.amazonaws.com:443`` (the URI's ``region``, else
      ``AWS_REGION`` / ``AWS_DEFAULT_REGION``);
    - ``local://PATH``: the store file opens for reading (a file moved away, a mount gone, its
      permissions taken).

    None when there is nothing to try: another scheme, a DynamoDB region only a profile names
    (the job's restart still shows that outage)."""
    try:
        parts = urlsplit(endpoint)
        if parts.scheme == "local":
            with open(unquote(parts.path), "rb"):
                return True
        address = _address(parts)
        if address is None:
            return None
        socket.create_connection(address, timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _address(parts: SplitResult) -> tuple[str, int] | None:
    """The host and port a TCP probe of the endpoint connects to, or None."""
    if parts.scheme == "dynamodb-streams":
        query = dict(parse_qsl(parts.query))
        if "endpoint_url" in query:
            parts = urlsplit(query["endpoint_url"])
        else:
            region = (query.get("region") or os.environ.get("AWS_REGION")
                      or os.environ.get("AWS_DEFAULT_REGION"))
            if not region:
                return None
            domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
            return f"streams.dynamodb.{region}.{domain}", 443
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class EndpointProbe:
    """The source's endpoint probed at most every ``PROBE_EVERY_S`` (driver, at the command's
    looks): ``answers`` for ``tablestore_cdc_source_up``, ``applied`` for the tables' statuses
    (``TableStatusWriter.publish``, so the meta store, the feed, the dashboard and ``meta
    tables`` show a short outage too: the query's own per-call retries hide it from the job
    until they give up and the job restarts)."""

    def __init__(self, endpoint: str, every_s: float = PROBE_EVERY_S) -> None:
        self.endpoint = endpoint
        self.every_s = every_s
        self._probed: tuple[float, bool | None] = (float("-inf"), None)

    def answers(self) -> bool | None:
        """The last probe's answer (a new probe when it is ``every_s`` old); None: not probed."""
        now = time.monotonic()
        if now - self._probed[0] >= self.every_s:
            self._probed = (now, reachable(self.endpoint))
        return self._probed[1]

    def applied(self, statuses: dict[str, TableStatus]) -> dict[str, TableStatus]:
        """``statuses`` with every reading table ``unreachable`` while the endpoint does not
        answer (``TableStatusWriter.with_health`` adds since when); the others as they are."""
        if not any(s.state in READING for s in statuses.values()) or self.answers() is not False:
            return statuses
        reason = f"{redact_uri(self.endpoint)} does not answer (probed every {self.every_s:g} s)"
        return {table: (status.model_copy(update={"state": State.UNREACHABLE, "reason": reason})
                        if status.state in READING else status)
                for table, status in statuses.items()}


#: ``TableStatus`` field -> the series (``table`` label) it sets, and its help
FIGURES = {
    "records_behind": ("tablestore_cdc_table_lag_records", "records behind the tunnel's head"),
    "seconds_behind": ("tablestore_cdc_table_lag_seconds", "seconds behind the tunnel's head"),
    "rows_per_second": ("tablestore_cdc_table_rows_per_second",
                        "changes applied per second over the last 30 s"),
    "snapshot_percent": ("tablestore_cdc_table_snapshot_percent",
                         "how much of the table's base data is read"),
    "last_commit": ("tablestore_cdc_table_last_commit_timestamp_seconds",
                    "when the table's target last committed"),
    "target_version": ("tablestore_cdc_table_target_version",
                       "the target's version (Delta) or snapshot id (Iceberg)"),
    "target_files": ("tablestore_cdc_table_target_files",
                     "the target's data files in its current version (last maintenance)"),
    "target_snapshots": ("tablestore_cdc_table_target_snapshots",
                         "the Iceberg target's snapshots kept (last maintenance)"),
    "last_maintenance_at": ("tablestore_cdc_table_last_maintenance_timestamp_seconds",
                            "when the job last maintained the table's target"),
}


class TableMetrics:
    """The per-table metrics of one pipeline (driver); ``retention_s``: what the source's
    service keeps of a channel's history (``feed.retention.default_retention_s``)."""

    def __init__(self, retention_s: float = DEFAULT_S, source: str = "",
                 probe: str | None = None) -> None:
        self.retention_s = retention_s
        #: the ``source`` label of ``tablestore_cdc_source_up`` (the endpoint, redacted)
        self.source = source
        #: the endpoint's probe (``EndpointProbe``; None: none), shared with the statuses'
        #: writer by ``attach``
        self.probe = None if probe is None else EndpointProbe(probe)
        self.registry = CollectorRegistry()
        self._warned: set[str] = set()

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("table",)) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        self.state = gauge("tablestore_cdc_table_state", "1 for the table's current state",
                           ("table", "state"))
        self.headroom = gauge("tablestore_cdc_table_retention_headroom_seconds",
                              "the service's retention minus the seconds behind its head")
        self.rows_applied = Counter("tablestore_cdc_table_rows_applied",
                                    "changes applied into the table's target", ["table"],
                                    registry=self.registry)
        #: the series set from a ``TableStatus`` field whenever it is known
        self.figures = {field: gauge(name, doc) for field, (name, doc) in FIGURES.items()}
        self.source_up = gauge("tablestore_cdc_source_up",
                               "1 while the source answers, 0 while a table cannot reach it",
                               ("source",))
        self.table_up = gauge("tablestore_cdc_table_up",
                              "1 while the table reads (new, snapshotting, streaming, waiting)")
        self.down_since = gauge("tablestore_cdc_table_unreachable_since_timestamp_seconds",
                                "when the table's source stopped answering (0: it answers)")
        self.changes = Counter("tablestore_cdc_table_changes_applied",
                               "changes applied into the table's target, by operation",
                               ["table", "op"], registry=self.registry)
        self._applied: dict[str, int] = {}
        #: table -> the status its series were last set from (an idle table's next look
        #: sets nothing: at 1,000 tables, setting every series cost 0.1 s a look)
        self._shown: dict[str, TableStatus] = {}
        self._ops: dict[tuple[str, str], int] = {}
        self.server: Any = None

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``address:port`` (0: a free port); returns the port."""
        self.server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return int(self.server.server_port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def update(self, statuses: dict[str, TableStatus]) -> None:
        """Set every table's series from its status (a figure not known is left unset)."""
        answers = None if self.probe is None else self.probe.answers()
        if statuses or answers is not None:
            down = (any(s.state == State.UNREACHABLE for s in statuses.values())
                    or answers is False)
            self.source_up.labels(self.source).set(0 if down else 1)
        for table, status in statuses.items():
            if self._shown.get(table) == status:  # unchanged: every series holds it already
                continue
            self._shown[table] = status
            self.table_up.labels(table).set(1 if status.state in READING else 0)
            self.down_since.labels(table).set((status.unreachable_since or 0)
                                              if status.state == State.UNREACHABLE else 0)
            for op in OP_NAMES.values():
                total = status.ops.get(op, 0)
                grown_op = total - self._ops.get((table, op), 0)
                self.changes.labels(table, op).inc(max(grown_op, 0))
                self._ops[(table, op)] = total
            for state in State:
                self.state.labels(table, state.value).set(1 if state == status.state else 0)
            for field, gauge in self.figures.items():
                value = getattr(status, field)
                if value is not None:
                    gauge.labels(table).set(value)
            if status.seconds_behind is not None:
                self._headroom(table, float(status.seconds_behind))
            grown = status.rows_applied - self._applied.get(table, 0)
            self.rows_applied.labels(table).inc(max(grown, 0))
            self._applied[table] = status.rows_applied

    def attach(self, writer: Any) -> None:
        """Follow every batch of statuses ``writer`` (``TableStatusWriter``) publishes, and
        give it the endpoint's probe, so its statuses show an outage the probe sees."""
        writer.observe(self.update)
        writer.probe = self.probe

    def _headroom(self, table: str, seconds_behind: float) -> None:
        """Set ``table``'s headroom gauge; log one warning line when it crosses the threshold."""
        figures = headroom(seconds_behind, self.retention_s)
        self.headroom.labels(table).set(figures["headroom_s"])
        if not figures["retention_warning"]:
            self._warned.discard(table)
        elif table not in self._warned:
            self._warned.add(table)
            log.warning("table %s is %.0f s behind, past %d %% of the retention (%.0f s): %.0f s "
                        "left before unread changes are trimmed", table, seconds_behind,
                        WARN_AT * 100, self.retention_s, figures["headroom_s"])
