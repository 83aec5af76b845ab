"""The progress feed: what the meta table (and the tunnel, and Spark) say about a query's batches.

One versioned JSON shape (``FEED_SCHEMA_VERSION``; the JSON Schema is
``docs/progress-feed.schema.json``, the contract ``docs/progress-feed.md``) built here and
consumed by three front ends:

- ``tablestore-cdc progress`` prints one **batch record** per line (JSON lines; ``--follow`` polls
  and prints only new or changed batches) — ``follow_feed``;
- ``tablestore-cdc dashboard`` serves ``/api/progress``, a **snapshot** (recent batch records,
  per-channel positions and lag, the channel tree, throughput) — ``progress_snapshot``, served by
  ``tablestore_cdc.dashboard``;
- ``tablestore-cdc meta ...`` (``tablestore_cdc.meta_cli``) uses the same read-only helpers
  (``open_existing_meta_store``, ``resolve_namespace``, ``find_batch``, ``channel_view``).

Everything here is read-only on the meta store and the tunnel, with one exception: the
**query-progress record** that ``tablestore_cdc.listener.ProgressListener`` writes
(``record_query_progress``). It is how a Spark query's own numbers (batch id, rows/s, batch
duration) join the feed, and it is backend-neutral: it is stored through the meta store's
``set_namespace_info`` under a companion namespace ``"query-progress#" + namespace``, so every
backend (SQLite, DynamoDB, ...) holds it without a schema change. ``user_namespaces`` hides
companion namespaces from listings.

Runs wherever the CLI or the dashboard runs (an operator's shell, a sidecar next to the driver);
never on executors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_common.tokens import FINISHED
from connector.errors import (
    CdcError,
    CorruptMetaRecordError,
    MetaStoreError,
    MetaTableMissingError,
    UnknownBatchError,
)
from connector.planning.positions import positions_after_batch
from meta_store import BatchRecord, BatchState, EndCheckpoint, MetaStore, open_meta_store
from meta_store.base import chain_order
from meta_store.errors import MetaStoreAbsentError

#: Version of the feed's JSON shape; bumped only for a change that breaks a consumer (a field
#: removed, renamed or changing meaning). Adding a field keeps the version (docs/progress-feed.md).
FEED_SCHEMA_VERSION = 1
#: Companion namespaces holding a query's Spark progress start with this (see module docstring).
QUERY_PROGRESS_PREFIX = "query-progress#"
#: Query-progress entries kept per namespace (older ones are dropped by the listener).
QUERY_PROGRESS_KEEP = 200
#: the shortest UUID prefix ``find_batch`` accepts
MIN_PREFIX = 4


# --- errors ---------------------------------------------------------------------------------------


class InspectionError(MetaStoreError):
    """A request of the inspection CLI / feed / dashboard cannot be answered (bad namespace,
    ambiguous UUID prefix, ...). The CLI prints it on one line and exits with code 2."""

    template = "{detail}"


class MetaStoreNotFoundError(InspectionError):
    template = (
        "no meta store at {path}: the file does not exist (inspection never creates one); "
        "check --meta"
    )


# --- opening and resolving ------------------------------------------------------------------------


def open_existing_meta_store(uri: str) -> MetaStore:
    """Open the meta store at ``uri`` for inspection without creating anything
    (``open_meta_store(create=False)``): a SQLite path that does not exist is refused (opening
    it would create an empty store), and a DynamoDB or Tablestore URI's ``create_table=true``
    is dropped (a missing table is reported, not created). Other errors are the backend's
    ``CdcError``s."""
    try:
        return open_meta_store(uri, create=False)
    except MetaStoreAbsentError as exc:
        raise MetaStoreNotFoundError(path=exc.fields.get("table")) from None
    except MetaTableMissingError as exc:
        raise missing_table(exc) from None


def missing_table(exc: MetaTableMissingError) -> InspectionError:
    """The backend's "table missing" error without its hint to pass ``create_table=true``,
    which inspection ignores (a backend may find out at open or at the first read)."""
    return InspectionError(detail=f"meta table {exc.fields.get('table')!r} does not exist at "
                           f"{exc.fields.get('location')}; inspection never creates it "
                           "(create_table=true is ignored): check --meta")


class InspectedStore:
    """A meta store as the inspection tools read it: one corrupt row does not hide the rest.

    Wraps an open ``MetaStore`` (CLI, dashboard). ``list_namespaces``, ``list_batches``,
    ``get_end_checkpoints``, ``latest_committed`` and ``get_namespace_info`` skip a row that
    does not decode and note it in ``corrupt`` (key -> reason, as ``CorruptMetaRecordError``
    names them); every other attribute is the store's own. The skipping relies on the backends
    decoding row by row in ``_decode_namespace`` / ``_decode_batch`` / ``_decode_end``: for one
    call, the wrapped instance's decoder returns a marker instead of raising (a backend without
    them fails on the row as before). Never used by the protocol, which must stop on a corrupt
    row.
    """

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self.corrupt: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _note(self, exc: CorruptMetaRecordError) -> None:
        key = str(exc.fields.get("key", "?"))
        self.corrupt.setdefault(key, str(exc.fields.get("reason", exc)))

    def _skipping(self, decoder: str, call: Callable[[], list[Any]]) -> list[Any]:
        decode = getattr(type(self.store), decoder, None)
        if decode is None:
            return call()

        def tolerant(*args: Any) -> Any:
            try:
                return decode(self.store, *args)
            except CorruptMetaRecordError as exc:
                self._note(exc)
                return _SKIPPED

        self.store.__dict__[decoder] = tolerant
        try:
            return [x for x in call() if x is not _SKIPPED]
        finally:
            del self.store.__dict__[decoder]

    def list_batches(self, namespace: str) -> list[BatchRecord]:
        store: Any = self.store
        return chain_order(self._skipping("_decode_batch",
                                          lambda: store._list_batches(namespace)))

    def get_end_checkpoints(self, namespace: str, uuid: str) -> dict[str, EndCheckpoint]:
        store: Any = self.store
        ends = self._skipping("_decode_end", lambda: store._list_ends(namespace, uuid))
        return {e.channel_id: e for e in ends}

    def list_namespaces(self) -> list[str]:
        return self._skipping("_decode_namespace", self.store.list_namespaces)

    def latest_committed(self, namespace: str) -> BatchRecord | None:
        committed = [b for b in self.list_batches(namespace)
                     if b.state.rank >= BatchState.COMMITTED.rank]
        return committed[-1] if committed else None

    def get_namespace_info(self, namespace: str) -> dict[str, str] | None:
        try:
            return self.store.get_namespace_info(namespace)
        except CorruptMetaRecordError as exc:
            key = str(exc.fields.get("key", f"{namespace}/info"))
            self.corrupt.setdefault(key, corrupt_info_message(namespace))
            return None

    def corrupt_records(self) -> list[dict[str, str]]:
        """What was skipped so far, as ``{"key", "reason"}`` (the ``corrupt`` field of
        ``meta batches --json`` and ``meta export``)."""
        return [{"key": k, "reason": v} for k, v in sorted(self.corrupt.items())]


#: what a tolerant decoder returns for a corrupt row
_SKIPPED = object()


def corrupt_info_message(namespace: str) -> str:
    return (f"the info record of namespace {namespace!r} is corrupt (not a JSON object of "
            "strings): its endpoint, table and tunnel are unknown")


def user_namespaces(store: MetaStore) -> list[str]:
    """The store's source namespaces (companion query-progress namespaces hidden), sorted."""
    try:
        names = store.list_namespaces()  # the first read of every inspection command
    except MetaTableMissingError as exc:
        raise missing_table(exc) from None
    return [ns for ns in names if not ns.startswith(QUERY_PROGRESS_PREFIX)]


def resolve_namespace(store: MetaStore, namespace: str | None) -> str:
    """``namespace`` if the store has it; with ``None`` the store's only namespace. Raises
    ``InspectionError`` listing the namespaces there are."""
    known = user_namespaces(store)
    if namespace is not None:
        if namespace in known:
            return namespace
        listing = ", ".join(repr(n) for n in known) or "none"
        raise InspectionError(detail=f"no namespace {namespace!r} in meta store {store.uri} "
                              f"(namespaces: {listing})")
    if not known:
        raise InspectionError(detail=f"meta store {store.uri} has no namespace yet (no query "
                              "has run against it)")
    if len(known) > 1:
        raise InspectionError(detail=f"meta store {store.uri} has {len(known)} namespaces; "
                              "choose one with --namespace: " + ", ".join(repr(n) for n in known))
    return known[0]


def find_batch(store: MetaStore, namespace: str, uuid: str) -> BatchRecord:
    """The batch with UUID ``uuid`` or the only one whose UUID starts with it (at least 4
    characters). ``UnknownBatchError`` naming it when there is none."""
    batch = store.find_batch(namespace, uuid)
    if batch is not None:
        return batch
    matches = [b for b in store.list_batches(namespace) if b.uuid.startswith(uuid)]
    if len(uuid) >= MIN_PREFIX and len(matches) == 1:
        return matches[0]
    if len(uuid) >= 4 and len(matches) > 1:
        raise InspectionError(detail=f"UUID prefix {uuid!r} matches {len(matches)} batches: "
                              + ", ".join(b.uuid for b in matches))
    if len(uuid) < MIN_PREFIX:
        raise InspectionError(detail=f"UUID prefix {uuid!r} is too short: give the whole UUID "
                              f"or at least {MIN_PREFIX} characters of it")
    raise UnknownBatchError(uuid=uuid, namespace=namespace)


# --- query progress (written by tablestore_cdc.listener) ----------------------------------


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


# --- positions ------------------------------------------------------------------------------------


def position(token: str, sequence_number: int, last_sequence: str | None) -> dict[str, Any]:
    return {"token": token, "sequence_number": sequence_number, "last_sequence": last_sequence,
            "finished": token == FINISHED}


def positions_after(batch: BatchRecord, ends: Mapping[str, EndCheckpoint]) -> dict[str, dict]:
    """Every channel's position at the end of ``batch`` as the feed shows it: the planner's
    rule (``connector.planning.positions``: its end checkpoint, or its manifest start for a
    channel that recorded none yet), and also any end outside the manifest."""
    out = {channel_id: position(p.token, p.sequence_number, p.last_sequence)
           for channel_id, p in positions_after_batch(batch, ends).items()}
    for channel_id, end in ends.items():  # an end outside the manifest (never expected)
        out.setdefault(channel_id, position(end.token, end.sequence_number, end.last_sequence))
    return out


def consumed(pos: Mapping[str, Any] | None) -> int | None:
    """Records consumed from a channel at ``pos``: its sequence number, less the one the
    FINISHED checkpoint adds."""
    if pos is None:
        return None
    return int(pos["sequence_number"]) - (1 if pos["finished"] else 0)


# --- batch records (one feed line each) -----------------------------------------------------------


def push_state(batch: BatchRecord) -> str:
    """``not-committed`` | ``pending`` (committed, not yet pushed) | ``pushed``."""
    if batch.state is BatchState.PUSHED:
        return "pushed"
    if batch.state is BatchState.COMMITTED:
        return "pending"
    return "not-committed"


def query_entry(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The feed's ``query`` object from a stored listener entry (only the documented fields)."""
    if not entry:
        return None
    keys = ("batch_id", "query_id", "run_id", "name", "timestamp", "recorded_at",
            "num_input_rows", "input_rows_per_second", "processed_rows_per_second",
            "batch_duration_ms")
    return {k: entry.get(k) for k in keys}


def batch_record(
    namespace: str,
    batch: BatchRecord,
    ends: Mapping[str, EndCheckpoint],
    *,
    query: Mapping[str, Any] | None = None,
    lag: Mapping[str, Mapping[str, Any]] | None = None,
    waiting: Sequence[Mapping[str, Any]] | None = None,
    observed_at: float | None = None,
) -> dict[str, Any]:
    """One feed record: a batch with its per-channel starts, ends, records and lag.

    ``lag`` (channel -> {records_behind, seconds_behind}) and ``waiting`` (channels waiting for
    a parent) are what the tunnel says *now*; callers attach them to the newest batch only.
    """
    manifest = batch.manifest
    channels: list[dict[str, Any]] = []
    starts = {c.channel_id: c for c in manifest.channels} if manifest else {}
    for channel_id in sorted(set(starts) | set(ends)):
        start, end = starts.get(channel_id), ends.get(channel_id)
        channels.append({
            "channel_id": channel_id,
            "parent_ids": list(start.parent_ids) if start else [],
            "in_manifest": start is not None,
            "start": position(start.token, start.sequence_number, start.last_sequence)
            if start else None,
            "max_records": start.max_records if start else None,
            "end": position(end.token, end.sequence_number, end.last_sequence) if end else None,
            "read_from": end.start_token if end else None,
            "records": end.records if end else None,
            "attempt": end.attempt if end else None,
            "written_at": end.written_at if end else None,
            "lag": dict(lag[channel_id]) if lag and channel_id in lag else None,
        })
    written = [e.written_at for e in ends.values()]
    entry = query_entry(query)
    spark_batch_id = batch.spark_batch_id
    if spark_batch_id is None and entry is not None:
        spark_batch_id = entry.get("batch_id")
    return {
        "schema_version": FEED_SCHEMA_VERSION,
        "kind": "batch",
        "namespace": namespace,
        "uuid": batch.uuid,
        "prev_uuid": batch.prev_uuid,
        "spark_batch_id": spark_batch_id,
        "state": batch.state.value,
        "push_state": push_state(batch),
        "initial": batch.prev_uuid is None,
        "times": {
            "created": batch.created_at,
            "planned": manifest.planned_at if manifest else None,
            "first_end_written": min(written) if written else None,
            "last_end_written": max(written) if written else None,
            "committed": batch.committed_at,
            "pushed": batch.pushed_at,
        },
        "max_rows": batch.max_rows,
        "channel_count": len(manifest.channels) if manifest else 0,
        "channels_to_read": sum(1 for c in manifest.channels
                                if c.token != FINISHED and c.max_records > 0) if manifest else 0,
        "ends_recorded": len(ends),
        "records": sum(e.records for e in ends.values()),
        "children_added": list(manifest.children_added) if manifest else [],
        "waiting_for_parent": [dict(w) for w in waiting] if waiting is not None else None,
        "channels": channels,
        "query": entry,
        "observed_at": time.time() if observed_at is None else observed_at,
    }


# --- the tunnel's view ----------------------------------------------------------------------------


@dataclass
class TunnelView:
    """What the tunnel says now: channels (lineage, status, pushed checkpoint) and lag.

    ``error`` is set instead when the tunnel could not be asked (its endpoint is unreachable or
    was stored without the secrets it needs); ``lag`` is ``None`` when the backend cannot tell.
    """

    channels: list[dict[str, Any]] = field(default_factory=list)
    lag: dict[str, dict[str, Any]] | None = None
    error: str | None = None

    def waiting(self) -> list[dict[str, Any]]:
        return [{"channel_id": c["channel_id"], "waiting_for": c["waiting_for"]}
                for c in self.channels if c["status"] == "WAIT"]


def tunnel_endpoint(info: Mapping[str, str] | None, override: str | None) -> str:
    """The tunnel endpoint to open: ``override`` (``--endpoint``) or the namespace's own."""
    if override:
        return override
    if not info or not info.get("endpoint"):
        raise InspectionError(detail="the namespace does not record its tunnel endpoint; "
                              "pass --endpoint")
    return info["endpoint"]


def committed_positions(store: MetaStore, namespace: str) -> tuple[BatchRecord | None, dict]:
    """The latest committed batch and every channel's position after it."""
    batch = store.latest_committed(namespace)
    if batch is None:
        return None, {}
    return batch, positions_after(batch, store.get_end_checkpoints(namespace, batch.uuid))


def channel_view(store: MetaStore, namespace: str, endpoint: str | None = None) -> TunnelView:
    """Open the namespace's tunnel and describe every channel: status, parents, children,
    which unfinished parents a WAIT channel waits for, its pushed checkpoint, its position in
    the latest committed batch and its lag. Raises ``CdcError`` when the tunnel cannot be
    opened (callers that must not fail use ``safe_channel_view``)."""
    from connector.tunnel import ChannelStatus, open_tunnel_service

    info = store.get_namespace_info(namespace) or {}
    if not info.get("table") or not info.get("tunnel"):
        if isinstance(store, InspectedStore) and any(k.startswith(namespace + "/")
                                                    for k in store.corrupt):
            raise InspectionError(detail=corrupt_info_message(namespace)
                                  + "; the channels cannot be described")
        raise InspectionError(detail=f"namespace {namespace!r} does not record its table and "
                              "tunnel names; the query that wrote it is too old to inspect")
    _, committed = committed_positions(store, namespace)
    with open_tunnel_service(tunnel_endpoint(info, endpoint)) as tunnel:
        description = tunnel.describe_tunnel(info["table"], info["tunnel"])
        tunnel_id = info.get("tunnel_id") or description.tunnel.tunnel_id
        status = {c.channel_id: c.status for c in description.channels}
        tokens = {ch: p["token"] for ch, p in committed.items()}
        lag_raw = tunnel.lag(tunnel_id, tokens)
        channels: list[dict[str, Any]] = []
        for c in sorted(description.channels, key=lambda c: c.channel_id):
            try:
                cp = tunnel.get_checkpoint(tunnel_id, c.channel_id)
                pushed: dict[str, Any] | None = {"token": cp.token,
                                                  "sequence_number": cp.sequence_number,
                                                  "finished": cp.finished}
            except CdcError:
                pushed = None
            pos = committed.get(c.channel_id)
            channels.append({
                "channel_id": c.channel_id,
                "status": c.status.value,
                "channel_type": c.channel_type.value,
                "parent_ids": list(c.parent_ids),
                "children": sorted(o.channel_id for o in description.channels
                                   if c.channel_id in o.parent_ids),
                "waiting_for": [p for p in c.parent_ids
                                if status.get(p) is not ChannelStatus.TERMINATED]
                if c.status is ChannelStatus.WAIT else [],
                "pushed": pushed,
                "position": pos,
                "consumed": consumed(pos),
            })
    lag = None
    if lag_raw is not None:
        lag = {ch: {"records_behind": v.records_behind, "seconds_behind": v.seconds_behind}
               for ch, v in lag_raw.items()}
    for entry in channels:
        entry["lag"] = lag.get(entry["channel_id"]) if lag is not None else None
    return TunnelView(channels=channels, lag=lag)


def safe_channel_view(store: MetaStore, namespace: str, endpoint: str | None = None
                      ) -> TunnelView:
    """``channel_view`` that reports a failure in ``error`` instead of raising."""
    try:
        return channel_view(store, namespace, endpoint)
    except (CdcError, OSError, KeyError) as exc:
        return TunnelView(error=f"{type(exc).__name__}: {exc}")


def channel_tree(channels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Nest channels under their parents: roots are channels without a known parent. A merge
    child (two parents) is nested under its first parent and listed with ``also_under``."""
    by_id = {c["channel_id"]: c for c in channels}

    def node(c: Mapping[str, Any], seen: frozenset[str]) -> dict[str, Any]:
        kids = [by_id[k] for k in c.get("children", []) if k in by_id and k not in seen]
        return {
            "channel_id": c["channel_id"], "status": c.get("status"),
            "waiting_for": list(c.get("waiting_for") or []),
            "also_under": [p for p in c.get("parent_ids", []) if p in by_id][1:],
            "children": [node(k, seen | {k["channel_id"]}) for k in kids
                         if [p for p in k.get("parent_ids", []) if p in by_id][:1]
                         == [c["channel_id"]]],
        }

    roots = [c for c in channels if not any(p in by_id for p in c.get("parent_ids", []))]
    return [node(c, frozenset({c["channel_id"]})) for c in roots]


# --- the feed -------------------------------------------------------------------------------------


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
    progress = load_query_progress(store, namespace)
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
            query=progress.get(b.uuid),
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


# --- the dashboard snapshot ---------------------------------------------------------------------


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


def activity(records: Sequence[Mapping[str, Any]], status: Mapping[str, Any] | None,
             records_behind: int | None, now: float) -> dict[str, Any]:
    """Is the query alive? ``state`` is one of

    - ``waiting``: no batch committed yet;
    - ``stopped``: the ``ProgressListener`` saw the query terminate (``reason``: its error);
    - ``live``: a commit or a listener heartbeat within ``stale_after_s``;
    - ``idle``: nothing for longer, but nothing is behind either (caught up, no new data);
    - ``stale``: nothing for longer while records are behind (or lag is unknown): the query
      has probably stopped or hangs.

    ``last_commit_age_s`` is the age of the newest commit among ``records``."""
    commits = [r["times"]["committed"] for r in records if r["times"]["committed"] is not None
               and not r["initial"]]
    last_commit = max(commits, default=None)
    stale_after = STALE_AFTER_S
    if len(commits) >= 3:  # a slow trigger commits rarely: allow 5 of its intervals
        gaps = sorted(b - a for a, b in zip(commits, commits[1:], strict=False))
        stale_after = max(STALE_AFTER_S, 5 * gaps[len(gaps) // 2])
    heard = [t for t in (last_commit, status.get("at") if status else None) if t is not None]
    last_heard = max(heard, default=None)
    if status and status.get("status") == "stopped":
        state = "stopped"
    elif last_commit is None:
        state = "waiting"
    elif last_heard is not None and now - last_heard <= stale_after:
        state = "live"
    elif records_behind == 0:
        state = "idle"
    else:
        state = "stale"
    return {
        "state": state, "last_commit_at": last_commit,
        "last_commit_age_s": None if last_commit is None else max(0.0, now - last_commit),
        "stale_after_s": stale_after,
        "stopped_at": status.get("at") if status and state == "stopped" else None,
        "reason": status.get("reason") if status and state == "stopped" else None,
    }


def progress_snapshot(
    store: MetaStore,
    namespace: str | None,
    *,
    endpoint: str | None = None,
    recent: int = 50,
    with_tunnel: bool = True,
    ends_cache: dict[str, dict[str, EndCheckpoint]] | None = None,
) -> dict[str, Any]:
    """The ``/api/progress`` document: recent batch records, every channel's latest position,
    pushed checkpoint, lag and lineage, the channel tree, throughput and the last Spark
    progress. ``namespace=None`` with an empty store gives ``namespace: null`` (the dashboard
    waits for the query to start). ``ends_cache``: see ``feed_records``."""
    now = time.time()
    base: dict[str, Any] = {
        "schema_version": FEED_SCHEMA_VERSION, "kind": "snapshot", "generated_at": now,
        "meta_uri": store.uri, "namespace": None, "namespace_info": None, "batch_count": 0,
        "state_counts": {}, "batches": [], "channels": [], "tree": [], "throughput":
        throughput([]), "query": None, "tunnel_error": None,
        "activity": activity([], None, None, now),
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
    progress = load_query_progress(store, ns)
    last_query = max(progress.values(), key=lambda e: (e.get("batch_id") or -1),
                     default=None)
    behind = [c["lag"]["records_behind"] for c in channels if c.get("lag")]
    records_behind = sum(behind) if behind and None not in behind else None
    base.update({
        "activity": activity(records, load_query_status(store, ns), records_behind, now),
        "namespace": ns, "namespace_info": store.get_namespace_info(ns),
        "batch_count": len(all_batches), "state_counts": counts, "batches": records,
        "channels": channels, "tree": channel_tree(channels),
        "throughput": throughput(records), "query": query_entry(last_query),
        "tunnel_error": view.error,
        # rows skipped because they do not decode (only when read through InspectedStore)
        "corrupt": store.corrupt_records() if isinstance(store, InspectedStore) else [],
    })
    return base


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
