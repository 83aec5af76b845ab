"""The dashboard's snapshot (``/api/progress``): recent batches, channels, throughput, whether the
query is alive. Built by ``dashboard_snapshot`` for ``tablestore_cdc.dashboard`` (and tests).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from connector.table_state import READING, State
from meta_store import EndCheckpoint, MetaStore
from meta_store.errors import CorruptMetaRecordError
from meta_store.signals import SignalBoard
from tablestore_cdc.feed.polling import feed_records
from tablestore_cdc.feed.reading import InspectedStore, resolve_namespace, user_namespaces
from tablestore_cdc.feed.shapes import FEED_SCHEMA_VERSION, channel_tree, consumed, query_entry
from tablestore_cdc.feed.tunnel_view import TunnelView, committed_positions, safe_channel_view
from tablestore_cdc.query_record import load_query_status, load_spark_metrics
from tablestore_cdc.table_status import TableStatus, load_table_status


def throughput(records: Sequence[Mapping[str, Any]], window: int = 30) -> dict[str, Any]:
    """Rows/s over the last ``window`` committed (non-initial) batches, and a per-batch series.

    Window rate = ``rate_records`` / ``seconds``: the rows of the batches committed after the
    window's first commit, over the seconds from that first commit to the last one (a single
    batch: its rows over its plan-to-commit time). The dashboard's caption prints exactly these
    two numbers; ``records`` is every row of the window. Per batch, ``rows_per_second`` is
    Spark's processed rows/s when a listener reported it, else rows / plan-to-commit seconds.
    """
    done = [r for r in records if not r["initial"] and r["times"]["committed"] is not None]
    done = done[-window:]
    series = []
    for r in done:
        t = r["times"]
        q = r.get("query") or {}
        rate = q.get("processed_rows_per_second")
        if rate is None and t["planned"] is not None:
            span = t["committed"] - t["planned"]
            rate = r["records"] / span if span > 0 else None
        series.append({"uuid": r["uuid"], "spark_batch_id": r["spark_batch_id"],
                       "at": t["committed"], "records": r["records"],
                       "rows_per_second": rate,
                       "input_rows_per_second": q.get("input_rows_per_second")})
    rows_per_second = seconds = rate_records = None
    if len(done) >= 2:
        seconds = done[-1]["times"]["committed"] - done[0]["times"]["committed"]
        rate_records = sum(r["records"] for r in done[1:])
    elif done and done[0]["times"]["planned"] is not None:
        seconds = done[0]["times"]["committed"] - done[0]["times"]["planned"]
        rate_records = done[0]["records"]
    if seconds is not None and rate_records is not None and seconds > 0:
        rows_per_second = rate_records / seconds
    return {"window_batches": len(done), "seconds": seconds, "rows_per_second": rows_per_second,
            "rate_records": rate_records,
            "records": sum(r["records"] for r in done), "series": series}


#: a running query's last commit (or listener heartbeat) may be this old before it is "stale"
STALE_AFTER_S = 30.0


#: states in which the query is not running (``stopped_at`` and ``reason`` are given)
_ENDED = ("stopped", "restarting", "failed")


def activity(records: Sequence[Mapping[str, Any]], status: Mapping[str, Any] | None,
             records_behind: int | None, now: float,
             table_status: TableStatus | None = None) -> dict[str, Any]:
    """Is the query alive (the snapshot's ``activity``; its states: docs/progress-feed.md)? In
    order: ``unreachable`` (the replication job's fresh ``table_status`` says so), the
    listener's or the job's ``stopped``, ``restarting``, ``failed``; ``waiting`` (no commit
    yet); ``live`` (a commit or a heartbeat within ``stale_after_s``); else ``idle`` when
    nothing is behind (for a job, its fresh record reads with no lag) and ``stale`` otherwise
    (for a job, its record not refreshed: ``TableStatus.is_stale``)."""
    commits = [r["times"]["committed"] for r in records if r["times"]["committed"] is not None
               and not r["initial"]]
    last_commit = max(commits, default=None)
    stale_after = STALE_AFTER_S
    if len(commits) >= 3:  # a slow trigger commits rarely: allow 5 of its intervals
        gaps = sorted(b - a for a, b in zip(commits, commits[1:], strict=False))
        stale_after = max(STALE_AFTER_S, 5 * gaps[len(gaps) // 2])
    heard = [t for t in (last_commit, status.get("at") if status else None) if t is not None]
    last_heard = max(heard, default=None)
    job_status = status.get("status") if status else None
    fresh = table_status is not None and not table_status.is_stale(now)
    if table_status is not None and fresh and records_behind is None:
        records_behind = table_status.records_behind
    if table_status is not None and fresh and table_status.state == State.UNREACHABLE:
        state = "unreachable"
    elif job_status in ("stopped", "restarting", "failed"):
        state = job_status  # the listener saw the query end; the job restarts it or gave up
    elif last_commit is None:
        state = "waiting"
    elif last_heard is not None and now - last_heard <= stale_after:
        state = "live"
    elif table_status is not None and fresh and table_status.state in READING:
        # the job is alive: caught up (no lag measured, or none) is idle
        state = "stale" if (records_behind or 0) > 0 else "idle"
    elif table_status is not None:
        state = "stale"  # the job's record is old: the job is probably gone
    elif records_behind == 0:
        state = "idle"
    else:
        state = "stale"
    reason = status.get("reason") if status and state in _ENDED else None
    if state == "unreachable" and table_status is not None:
        reason = table_status.label()
    return {
        "state": state, "last_commit_at": last_commit,
        "last_commit_age_s": None if last_commit is None else max(0.0, now - last_commit),
        "stale_after_s": stale_after,
        "stopped_at": status.get("at") if status and state in _ENDED else None,
        "reason": reason,
        "unreachable_since": (table_status.unreachable_since if state == "unreachable"
                              and table_status is not None else None),
    }


def dashboard_snapshot(
    store: MetaStore,
    namespace: str | None,
    *,
    endpoint: str | None = None,
    recent: int = 50,
    with_tunnel: bool = True,
    ends_cache: dict[str, dict[str, EndCheckpoint]] | None = None,
) -> dict[str, Any]:
    """The ``/api/progress`` document: recent batch records, every channel's latest position,
    pushed checkpoint, lag and lineage, the channel tree, throughput, the last Spark progress
    and the table's ``table_status`` (``replicate``'s record: target version, last schema
    change). ``namespace=None`` with an empty store gives ``namespace: null`` (the dashboard
    waits for the query to start). ``ends_cache``: see ``feed_records``."""
    now = time.time()
    base: dict[str, Any] = {
        "schema_version": FEED_SCHEMA_VERSION, "kind": "snapshot", "generated_at": now,
        "meta_uri": store.uri, "namespace": None, "namespace_info": None, "batch_count": 0,
        "state_counts": {}, "batches": [], "channels": [], "tree": [], "throughput":
        throughput([]), "query": None, "tunnel_error": None,
        "activity": activity([], None, None, now), "resnapshots": [], "table_status": None,
    }
    if namespace is None and not user_namespaces(store):
        return base
    ns = resolve_namespace(store, namespace)
    view = safe_channel_view(store, ns, endpoint) if with_tunnel else TunnelView(
        error="tunnel not consulted")
    all_batches = store.list_batches(ns)
    records = feed_records(store, ns, view=view, limit=recent, now=now, ends_cache=ends_cache)
    counts: dict[str, int] = {}
    for b in all_batches:
        counts[b.state.value] = counts.get(b.state.value, 0) + 1
    channels = view.channels if view.error is None else _channels_from_meta(store, ns)
    latest = _latest_positions(records)
    for c in channels:
        c["latest"] = latest.get(c["channel_id"])
        if c["consumed"] is None and c["latest"] is not None:  # finished and left the manifests
            c["consumed"] = c["latest"]["consumed"]
    metrics = load_spark_metrics(store, ns)
    last_query = max(metrics.values(), key=lambda e: (e.get("batch_id") or -1),
                     default=None)
    lags = [c["lag"] for c in channels if c.get("lag")]
    # a count that is only a lower bound (a child waiting for its parents) does not prove
    # the query caught up
    records_behind = (sum(lag["records_behind"] for lag in lags)
                      if lags and all(lag.get("exact", True) for lag in lags) else None)
    base.update({
        "activity": activity(records, load_query_status(store, ns), records_behind, now,
                             load_table_status(store, ns)),
        "namespace": ns, "namespace_info": store.get_namespace_info(ns),
        "batch_count": len(all_batches), "state_counts": counts, "batches": records,
        "channels": channels, "tree": channel_tree(channels),
        "throughput": throughput(records), "query": query_entry(last_query),
        "tunnel_error": view.error, "resnapshots": resnapshots(store, ns),
        # the table's status as ``replicate`` recorded it (its last schema change, ...)
        "table_status": table_status_entry(store, ns, now),
        # rows skipped because they do not decode (only when read through InspectedStore)
        "corrupt": store.corrupt_records() if isinstance(store, InspectedStore) else [],
    })
    return base


def sources_summary(store: MetaStore) -> dict[str, Any]:
    """The ``/api/sources`` document: every source (namespace) of the store with its table,
    tunnel, batch count, newest batch, the query's activity (as in ``dashboard_snapshot``,
    without reading the tunnel: one meta-store pass per source), and for a table replicated by
    ``replicate`` (one table or many) its ``table_status`` (``table_status_entry``). ``meta
    tables`` prints the same document."""
    now = time.time()
    sources = []
    for ns in user_namespaces(store):
        info = store.get_namespace_info(ns) or {}
        records = feed_records(store, ns, view=TunnelView(error="tunnel not consulted"),
                               limit=5, now=now)
        status = load_query_status(store, ns)
        sources.append({
            "namespace": ns, "table": info.get("table"), "tunnel": info.get("tunnel"),
            "batch_count": len(store.list_batches(ns)),
            "activity": activity(records, status, None, now, load_table_status(store, ns)),
            "status": status["status"] if status else None,
            "status_reason": status["reason"] if status else None,
            "table_status": table_status_entry(store, ns, now),
        })
    return {"schema_version": FEED_SCHEMA_VERSION, "kind": "sources", "generated_at": now,
            "meta_uri": store.uri, "sources": sources}


def table_status_entry(store: MetaStore, namespace: str, now: float) -> dict[str, Any] | None:
    """The table's status as its replication job recorded it (``tablestore_cdc.table_status``),
    with ``label`` (the state as shown), ``age_s`` (since it was written) and ``stale`` (not
    refreshed for longer than expected, ``TableStatus.is_stale``: the job is probably gone);
    ``None`` for a namespace no ``replicate`` job reads (a query of your own)."""
    status = load_table_status(store, namespace)
    if status is None:
        return None
    age = max(0.0, now - status.at)
    return {**status.model_dump(mode="json"), "label": status.label(), "age_s": age,
            "stale": status.is_stale(now)}


#: finished resnapshots the snapshot shows (every open one is shown)
RECENT_RESNAPSHOTS = 3


def resnapshots(store: MetaStore, namespace: str) -> list[dict[str, Any]]:
    """The namespace's open resnapshot signals and the newest finished ones
    (``meta_store.signals``), oldest first; none when the document does not decode."""
    try:
        signals = SignalBoard(store, namespace).signals()
    except CorruptMetaRecordError:
        return []
    finished = [s.id for s in signals if s.finished][-RECENT_RESNAPSHOTS:]
    return [s.model_dump(mode="json") for s in signals if not s.finished or s.id in finished]


def _latest_positions(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per channel, the newest recorded end among ``records`` (batch UUID, position, records
    read in that batch)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        for c in r["channels"]:
            if c["end"] is not None:
                out[c["channel_id"]] = {"uuid": r["uuid"], "spark_batch_id": r["spark_batch_id"],
                                        "end": c["end"], "records": c["records"],
                                        "consumed": consumed(c["end"])}
    return out


def _channels_from_meta(store: MetaStore, namespace: str) -> list[dict[str, Any]]:
    """Channels as the meta table knows them (when the tunnel cannot be asked): those of the
    latest committed batch's manifest, without status or lag."""
    batch, committed = committed_positions(store, namespace)
    starts = {c.channel_id: c for c in batch.manifest.channels} if batch and batch.manifest else {}
    ids = sorted(committed)
    return [{
        "channel_id": ch, "status": None, "channel_type": None,
        "parent_ids": list(starts[ch].parent_ids) if ch in starts else [],
        "children": sorted(o for o in ids if ch in (starts[o].parent_ids if o in starts else ())),
        "waiting_for": [], "pushed": None, "position": committed[ch],
        "consumed": consumed(committed[ch]), "lag": None,
    } for ch in ids]
