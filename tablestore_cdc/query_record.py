"""The query record: what the listener keeps in the meta store about the Spark query of a source.

Two things, per namespace: **Spark's metrics of each batch** (batch id, input and processed
rows/s, batch duration, query id: one entry per batch end UUID, the newest
``SPARK_METRICS_KEEP``) and **the query's status** (``running`` or ``stopped``, when, and the
exception that stopped it). ``tablestore_cdc.listener.ProgressListener`` (Spark driver) writes
them; the feed reads them (``load_spark_metrics``, ``load_query_status``) and joins the metrics
to the batch with the same UUID.

Backend-neutral: the record is stored through the meta store's ``set_namespace_info`` under a
companion namespace ``"query-progress#" + namespace`` (the name stores written so far carry), so
every backend (SQLite, DynamoDB, ...) holds it without a schema change. The feed's
``user_namespaces`` hides companion namespaces from listings. A damaged record reads as none: it
must not hide the meta table's own facts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from connector.errors import CorruptMetaRecordError
from meta_store import MetaStore
from tablestore_cdc.feed.shapes import FEED_SCHEMA_VERSION

#: Companion namespaces holding a query record start with this (see the module docstring).
QUERY_RECORD_PREFIX = "query-progress#"
#: Spark metrics entries kept per namespace (older ones are dropped by the listener).
SPARK_METRICS_KEEP = 200


def record_spark_metrics(store: MetaStore, namespace: str, entry: Mapping[str, Any],
                         keep: int = SPARK_METRICS_KEEP) -> None:
    """Store Spark's metrics of one batch (``entry["uuid"]`` = the batch's end UUID) for
    ``namespace``, replacing an older entry for the same UUID and keeping the newest ``keep``.

    Called by ``ProgressListener.onQueryProgress`` in the Spark driver process (one writer per
    namespace: a read-modify-write of one small record).
    """
    key = QUERY_RECORD_PREFIX + namespace
    entries = [e for e in _load_entries(store, key) if e.get("uuid") != entry.get("uuid")]
    entries.append(dict(entry))
    entries = entries[-keep:]
    store.set_namespace_info(key, {
        "kind": "query-progress", "schema_version": str(FEED_SCHEMA_VERSION),
        "namespace": namespace, "entries": json.dumps(entries, separators=(",", ":")),
        "status": "running", "status_at": repr(time.time()),
        "query_id": str(entry.get("query_id") or ""),
    })


def record_query_status(store: MetaStore, namespace: str, status: str, *,
                        query_id: str | None = None, reason: str | None = None) -> None:
    """Record that the query reading ``namespace`` is ``running`` (an idle heartbeat) or
    ``stopped`` (with the exception that ended it, if any), keeping the metrics entries.

    Called by ``ProgressListener.onQueryIdle`` / ``onQueryTerminated`` (Spark driver)."""
    key = QUERY_RECORD_PREFIX + namespace
    info = dict(_safe_info(store, key) or {})
    info.update({"kind": "query-progress", "schema_version": str(FEED_SCHEMA_VERSION),
                 "namespace": namespace, "status": status, "status_at": repr(time.time()),
                 "query_id": query_id or info.get("query_id", ""),
                 "reason": (reason or "")[:500]})
    info.setdefault("entries", "[]")
    store.set_namespace_info(key, info)


def load_query_status(store: MetaStore, namespace: str) -> dict[str, Any] | None:
    """``{"status", "at", "query_id", "reason"}`` as the listener last recorded it, or
    ``None`` (no listener ran, or an older one that did not record a status)."""
    info = _safe_info(store, QUERY_RECORD_PREFIX + namespace) or {}
    if not info.get("status"):
        return None
    try:
        at: float | None = float(info.get("status_at", ""))
    except ValueError:
        at = None
    return {"status": info["status"], "at": at, "query_id": info.get("query_id") or None,
            "reason": info.get("reason") or None}


def _safe_info(store: MetaStore, key: str) -> dict[str, str] | None:
    try:
        return store.get_namespace_info(key)
    except CorruptMetaRecordError:
        return None  # a damaged query record must not hide the meta table's own facts


def load_spark_metrics(store: MetaStore, namespace: str) -> dict[str, dict[str, Any]]:
    """Spark's metrics entries of ``namespace`` by batch end UUID (empty when no listener
    ran)."""
    return {str(e["uuid"]): e for e in _load_entries(store, QUERY_RECORD_PREFIX + namespace)
            if isinstance(e, dict) and e.get("uuid")}


def _load_entries(store: MetaStore, key: str) -> list[dict[str, Any]]:
    info = _safe_info(store, key) or {}
    try:
        entries = json.loads(info.get("entries", "[]"))
    except (ValueError, RecursionError):
        return []  # a damaged query record must not hide the meta table's own facts
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
