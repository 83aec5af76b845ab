"""The listener's record: a Spark query's own numbers and state, kept in its meta store.

``tablestore_cdc.listener.ProgressListener`` (Spark driver) writes it; the feed reads it. It is
how a Spark query's own numbers (batch id, rows/s, batch duration) and whether it runs join the
feed, and it is backend-neutral: it is stored through the meta store's ``set_namespace_info``
under a companion namespace ``"query-progress#" + namespace``, so every backend (SQLite,
DynamoDB, ...) holds it without a schema change. The feed's ``user_namespaces`` hides companion
namespaces from listings. A damaged record reads as none: it must not hide the meta table's own
facts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from connector.errors import CorruptMetaRecordError
from meta_store import MetaStore
from tablestore_cdc.feed.shapes import FEED_SCHEMA_VERSION

#: Companion namespaces holding a query's Spark progress start with this (see module docstring).
QUERY_PROGRESS_PREFIX = "query-progress#"
#: Query-progress entries kept per namespace (older ones are dropped by the listener).
QUERY_PROGRESS_KEEP = 200


def record_query_progress(store: MetaStore, namespace: str, entry: Mapping[str, Any],
                          keep: int = QUERY_PROGRESS_KEEP) -> None:
    """Store one Spark progress entry (``entry["uuid"]`` = the batch's end UUID) for
    ``namespace``, replacing an older entry for the same UUID and keeping the newest ``keep``.

    Called by ``ProgressListener.onQueryProgress`` in the Spark driver process (one writer per
    namespace: a read-modify-write of one small record).
    """
    key = QUERY_PROGRESS_PREFIX + namespace
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
    ``stopped`` (with the exception that ended it, if any), keeping the progress entries.

    Called by ``ProgressListener.onQueryIdle`` / ``onQueryTerminated`` (Spark driver)."""
    key = QUERY_PROGRESS_PREFIX + namespace
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
    info = _safe_info(store, QUERY_PROGRESS_PREFIX + namespace) or {}
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
        return None  # a damaged progress record must not hide the meta table's own facts


def load_query_progress(store: MetaStore, namespace: str) -> dict[str, dict[str, Any]]:
    """Spark progress entries of ``namespace`` by batch end UUID (empty when no listener ran)."""
    return {str(e["uuid"]): e for e in _load_entries(store, QUERY_PROGRESS_PREFIX + namespace)
            if isinstance(e, dict) and e.get("uuid")}


def _load_entries(store: MetaStore, key: str) -> list[dict[str, Any]]:
    info = _safe_info(store, key) or {}
    try:
        entries = json.loads(info.get("entries", "[]"))
    except (ValueError, RecursionError):
        return []  # a damaged progress record must not hide the meta table's own facts
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
