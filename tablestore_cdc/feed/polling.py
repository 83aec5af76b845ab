"""The feed itself: batch records of a namespace, once (``feed_records``) or polled
(``follow_feed``, what ``tablestore-cdc progress [--follow]`` prints as JSON lines).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from meta_store import BatchState, EndCheckpoint, MetaStore
from tablestore_cdc.feed.reading import InspectionError, resolve_namespace, user_namespaces
from tablestore_cdc.feed.shapes import batch_record
from tablestore_cdc.feed.tunnel_view import TunnelView, safe_channel_view
from tablestore_cdc.query_record import load_spark_metrics


def feed_records(
    store: MetaStore,
    namespace: str,
    *,
    view: TunnelView | None = None,
    limit: int | None = None,
    now: float | None = None,
    ends_cache: dict[str, dict[str, EndCheckpoint]] | None = None,
) -> list[dict[str, Any]]:
    """Batch records of ``namespace`` in chain order (oldest first; the newest ``limit`` when
    given). The tunnel's lag and waiting channels (``view``) go on the newest planned batch.

    ``ends_cache`` (kept by pollers across calls) saves re-reading the end checkpoints of
    committed batches: once Spark has committed a batch its ends can no longer change (each is
    put-if-absent and every channel's read claimed one before the commit)."""
    batches = store.list_batches(namespace)
    if limit is not None:
        batches = batches[-limit:] if limit > 0 else []
    metrics = load_spark_metrics(store, namespace)
    planned = [b for b in batches if b.manifest is not None]
    newest = planned[-1].uuid if planned else None
    at = time.time() if now is None else now
    out = []
    for b in batches:
        current = view is not None and view.error is None and b.uuid == newest
        if ends_cache is not None and b.uuid in ends_cache:
            ends = ends_cache[b.uuid]
        else:
            ends = store.get_end_checkpoints(namespace, b.uuid)
            if ends_cache is not None and b.state.rank >= BatchState.COMMITTED.rank:
                ends_cache[b.uuid] = ends
        out.append(batch_record(
            namespace, b, ends,
            query=metrics.get(b.uuid),
            lag=view.lag if current and view is not None else None,
            waiting=view.waiting() if current and view is not None else None,
            observed_at=at,
        ))
    return out


#: fields that change on every poll without the batch changing (ignored by ``follow_feed``)
VOLATILE_FIELDS = ("observed_at",)


def fingerprint(record: Mapping[str, Any]) -> str:
    """What must change for ``--follow`` to print a batch again: everything but the time it
    was observed and the tunnel's live lag."""
    stable = {k: v for k, v in record.items() if k not in VOLATILE_FIELDS}
    stable["channels"] = [{k: v for k, v in c.items() if k != "lag"}
                          for c in record.get("channels", [])]
    return json.dumps(stable, sort_keys=True)


def follow_feed(
    store: MetaStore,
    namespace: str | None,
    *,
    interval: float = 1.0,
    follow: bool = True,
    endpoint: str | None = None,
    with_tunnel: bool = True,
    polls: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[dict[str, Any]]:
    """Yield batch records: all of them first, then (``follow``) every ``interval`` seconds the
    batches that are new or changed. ``namespace=None`` waits for the store's only namespace.
    ``polls`` bounds the number of polls (tests); ``tablestore-cdc progress`` runs until
    interrupted."""
    seen: dict[str, str] = {}
    ends_cache: dict[str, dict[str, EndCheckpoint]] = {}
    done = 0
    while True:
        ns = None
        try:
            ns = resolve_namespace(store, namespace)
        except InspectionError:
            if not follow or namespace is not None or user_namespaces(store):
                raise  # several namespaces / an unknown one: waiting will not help
        if ns is not None:
            view = safe_channel_view(store, ns, endpoint) if with_tunnel else None
            for record in feed_records(store, ns, view=view, ends_cache=ends_cache):
                key = fingerprint(record)
                if seen.get(record["uuid"]) != key:
                    seen[record["uuid"]] = key
                    yield record
        done += 1
        if not follow or (polls is not None and done >= polls):
            return
        sleep(interval)
