"""``ProgressListener``: a Spark query's own progress joins the progress feed.

Usage (driver, before or after ``start()``)::

    from tablestore_cdc.listener import ProgressListener
    spark.streams.addListener(ProgressListener("sqlite:///data/orders.meta.db"))

Spark calls ``onQueryProgress`` on the driver (the JVM listener bus event forwarded to this
Python process through py4j: in a classic session as the report's JSON in one call,
``_ProgressAsJson``) after each micro-batch. For every offset of ours in the report (a table's own,
or each one inside a multi-table source's composite offset: ``table_offsets``) that moved, the
listener stores Spark's metrics of the batch keyed by the batch's end UUID (``spark_metrics``,
``tablestore_cdc.query_record.record_spark_metrics``: a companion record in the meta store, so
it works on every backend); ``tablestore-cdc progress``, ``meta batches`` and the dashboard join
it to the batch with that UUID.

It also records whether the query is alive, for the dashboard's stale/stopped state: every
progress report marks the namespace ``running``, ``onQueryIdle`` (Spark's no-data heartbeat)
refreshes that, and ``onQueryTerminated`` marks it ``stopped`` with the query's exception
(``tablestore_cdc.query_record.record_query_status``). ``namespaces`` limits the listener to the
sources it was made for (``tablestore_cdc.pipeline`` passes its own), so a listener left on a
shared session never writes another query's progress into its store.

Over Spark Connect (PySpark 4) the listener runs in the *client* process, which then must reach
the meta store itself (docs/connect.md).

A listener failure never breaks the query: every callback catches everything, logs one warning
and counts it in ``errors``. Pass the same meta-store URI the query uses (``meta.store``, or for
a local endpoint its default ``sqlite:///<store>.meta.db``).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("tablestore_cdc.listener")


def _number(value: Any) -> float | None:
    """A finite float or None (Spark leaves NaN/infinite rates out or sends them as NaN)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _as_dict(progress: Any) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` (listener event) or a ``lastProgress`` dict, as a dict."""
    if isinstance(progress, Mapping):
        return dict(progress)
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return json.loads(text)
    raise TypeError(f"not a streaming query progress: {type(progress).__name__}")


def _offset(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _ours(offset: Any) -> bool:
    """Is ``offset`` one table's offset of this source (``{"uuid": ..., "source": ...}``)?"""
    return (isinstance(offset, dict) and isinstance(offset.get("uuid"), str)
            and isinstance(offset.get("source"), str))


def table_offsets(source: Mapping[str, Any]) -> Iterator[tuple[str | None, dict[str, Any], bool]]:
    """``(table, end offset, moved)`` for each of our offsets in one source of a progress
    report: a single-table source's own (table None, always moved: Spark reports a batch of
    it), or each table's inside a multi-table source's composite offset (``{"tables": {table:
    offset}}``, ``connector.multiplex``), moved when its UUID is not the start's."""
    end = _offset(source.get("endOffset"))
    if end is None:
        return
    if _ours(end):
        yield None, end, True
        return
    tables = end.get("tables")
    if not isinstance(tables, dict):
        return  # another kind of source
    starts = (_offset(source.get("startOffset")) or {}).get("tables")
    for table, offset in sorted(tables.items()):
        if _ours(offset):
            before = starts.get(table) if isinstance(starts, dict) else None
            yield str(table), offset, not (isinstance(before, dict)
                                           and before.get("uuid") == offset["uuid"])


def reported_namespaces(progress: Any) -> set[tuple[str, str | None]]:
    """``(namespace, table)`` of every offset of ours a progress report names, moved or not:
    the namespaces whose query status the listener keeps."""
    p = _as_dict(progress)
    return {(offset["source"], table) for source in p.get("sources") or []
            for table, offset, _ in table_offsets(source)}


def spark_metrics(progress: Any) -> list[tuple[str, dict[str, Any]]]:
    """Spark's metrics of the batch one progress report is about: ``(namespace, entry)`` for
    each tablestore source of the query, and for a multi-table source each table whose offset
    moved in the batch (what ``record`` stores with
    ``tablestore_cdc.query_record.record_spark_metrics``).

    ``entry`` holds: uuid (the batch's end offset UUID), batch_id, query_id, run_id, name,
    timestamp (Spark's ISO string), recorded_at (epoch s), num_input_rows (this source's),
    input_rows_per_second, processed_rows_per_second, batch_duration_ms (triggerExecution);
    a multi-table source's entries also ``table``, and their rows and rates are the whole
    source's (Spark measures no table apart).
    """
    p = _as_dict(progress)
    durations = p.get("durationMs") or {}
    out = []
    for source in p.get("sources") or []:
        for table, end, moved in table_offsets(source):
            if moved:
                out.append((end["source"], _entry(p, source, durations, end, table)))
    return out


def _entry(p: dict[str, Any], source: Mapping[str, Any], durations: Mapping[str, Any],
           end: dict[str, Any], table: str | None) -> dict[str, Any]:
    rows = source.get("numInputRows", p.get("numInputRows"))
    duration = _number(durations.get("triggerExecution"))
    entry = {
        "uuid": end["uuid"],
        "batch_id": int(p["batchId"]) if p.get("batchId") is not None else None,
        "query_id": str(p.get("id")) if p.get("id") is not None else None,
        "run_id": str(p.get("runId")) if p.get("runId") is not None else None,
        "name": p.get("name"),
        "timestamp": p.get("timestamp"),
        "recorded_at": time.time(),
        "num_input_rows": int(rows) if rows is not None else None,
        "input_rows_per_second": _number(source.get("inputRowsPerSecond",
                                                    p.get("inputRowsPerSecond"))),
        "processed_rows_per_second": _number(source.get("processedRowsPerSecond",
                                                        p.get("processedRowsPerSecond"))),
        "batch_duration_ms": int(duration) if duration is not None else None,
    }
    if table is not None:
        entry["table"] = table
    return entry


class ProgressListener(StreamingQueryListener):
    """Records each batch's Spark progress in the meta store at ``meta_uri`` (driver).

    One instance may serve several queries. The meta store is opened on the first event and kept;
    ``close()`` releases it.
    """

    def __init__(self, meta_uri: str,
                 namespaces: Iterable[str] | Callable[[str, str | None], bool] | None = None,
                 credentials: Mapping[str, str] | None = None) -> None:
        """``namespaces``: the namespaces to record (None: every one), or a function of
        (namespace, table: None for a single-table source) answering whether to record it
        (a multi-table pipeline's, whose tables may be created later). ``credentials``: for a
        ``tablestore://`` meta store whose credentials are not in the environment
        (``SourceOptions.meta_store_credentials``)."""
        self.meta_uri = meta_uri
        self._credentials = dict(credentials) if credentials else None
        self.namespaces: frozenset[str] | Callable[[str, str | None], bool] | None = (
            namespaces if namespaces is None or callable(namespaces) else frozenset(namespaces))
        self.errors = 0
        self.recorded = 0
        self._store: Any = None
        self._lock = threading.Lock()
        self._by_query: dict[str, set[str]] = {}  # query id -> namespaces seen in its progress
        self._terminated: set[str] = set()  # query ids whose termination was handled
        self._py4j_face: Any = None  # (``_jlistener``)

    @property
    def _jlistener(self) -> Any:
        """What ``spark.streams.addListener`` registers with the JVM in a classic session
        (PySpark's ``StreamingQueryListener._jlistener``): Spark's wrapper around
        ``_ProgressAsJson``, made once. PySpark's internals, the same from 4.0 to 4.3
        (``tests/test_listener_on_spark.py`` runs on the oldest too)."""
        if self._py4j_face is None:
            from pyspark import SparkContext

            assert SparkContext._jvm is not None, "no SparkContext: start Spark first"
            streaming = SparkContext._jvm.org.apache.spark.sql.streaming
            self._py4j_face = streaming.PythonStreamingQueryListenerWrapper(
                _ProgressAsJson(self))
        return self._py4j_face

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's API names
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        try:
            self.record(event.progress)
        except Exception as exc:  # a listener must never break the query
            self.errors += 1
            log.warning("progress listener could not record batch progress in %s: %s",
                        self.meta_uri, exc)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        self._status(event, "running", None)

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        self._status(event, "stopped", getattr(event, "exception", None))
        self._terminated.add(str(getattr(event, "id", "")))

    def wait_terminated(self, timeout: float = 10.0, query_ids: Iterable[str] = ()) -> bool:
        """Wait until every query this listener recorded, and each of ``query_ids``, has had
        its termination handled (Spark delivers events asynchronously, in order, after
        ``query.stop()`` or ``awaitTermination()`` returns: a query's last progress may not
        have been recorded yet; call this before ``spark.stop()``). Returns whether that
        happened in time."""
        deadline = time.monotonic() + timeout
        while not set(self._by_query) | set(query_ids) <= self._terminated:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _status(self, event: Any, status: str, reason: str | None) -> None:
        """Record ``status`` for the namespaces of the query the event is about."""
        from tablestore_cdc.query_record import record_query_status

        try:
            query_id = str(getattr(event, "id", ""))
            namespaces = self._by_query.get(query_id, set())
            if not namespaces:
                return  # not one of ours, or it never reported progress
            with self._lock:
                store = self._open()
                for namespace in sorted(namespaces):
                    record_query_status(store, namespace, status, query_id=query_id,
                                        reason=reason)
        except Exception as exc:  # a listener must never break the query
            self.errors += 1
            log.warning("progress listener could not record that the query is %s in %s: %s",
                        status, self.meta_uri, exc)

    def _open(self) -> Any:
        from meta_store import open_meta_store

        if self._store is None:
            self._store = open_meta_store(self.meta_uri, self._credentials)
        return self._store

    def record(self, progress: Any) -> int:
        """Store the entries of one progress report (a ``StreamingQueryProgress`` or a
        ``lastProgress`` dict); returns how many were stored. Raises on failure."""
        from tablestore_cdc.query_record import record_spark_metrics

        entries = [(ns, e) for ns, e in spark_metrics(progress)
                   if self._accepts(ns, e.get("table"))]
        # every namespace the query's offsets name (a multi-table query's quiet tables too)
        # is marked stopped with the query, not only those with an entry
        query_id = _as_dict(progress).get("id")
        if query_id is not None:
            reported = {ns for ns, table in reported_namespaces(progress)
                        if self._accepts(ns, table)}
            if reported:
                with self._lock:
                    self._by_query.setdefault(str(query_id), set()).update(reported)
        if not entries:
            return 0
        with self._lock:
            store = self._open()
            for namespace, entry in entries:
                record_spark_metrics(store, namespace, entry)
            self.recorded += len(entries)
        return len(entries)

    def _accepts(self, namespace: str, table: str | None) -> bool:
        if self.namespaces is None:
            return True
        if callable(self.namespaces):
            return bool(self.namespaces(namespace, table))
        return namespace in self.namespaces

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


@dataclass(frozen=True)
class _ProgressEvent:
    """A progress event as ``_ProgressAsJson`` hands it on: the report parsed from its JSON."""

    progress: dict[str, Any]


class _ProgressAsJson:
    """The Python face of a ``ProgressListener`` that Spark's listener bus calls through
    py4j's callback server (driver, Spark's listener thread). PySpark's own
    (``JStreamingQueryListener``) converts each progress report field by field: dozens of
    py4j round trips a batch, each taking the driver's GIL from the batch being applied
    (~65 ms of Python a batch of ``replicate --once``). This takes the report's JSON, what
    the listener reads, in one call; the rarer events go through PySpark's conversion."""

    def __init__(self, listener: ProgressListener) -> None:
        from pyspark.sql.streaming.listener import JStreamingQueryListener

        self._listener = listener
        self._pyspark = JStreamingQueryListener(listener)

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - the Java interface's names
        self._pyspark.onQueryStarted(jevent)

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        try:
            event = _ProgressEvent(json.loads(jevent.progress().json()))
        except Exception as exc:  # a listener must never break the query
            self._listener.errors += 1
            log.warning("progress listener could not read a progress report: %s", exc)
            return
        self._listener.onQueryProgress(event)

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        self._pyspark.onQueryIdle(jevent)

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        self._pyspark.onQueryTerminated(jevent)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
