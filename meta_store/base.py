"""The meta-store interface: UUID offsets -> per-channel checkpoints.

The meta table is the source of truth for where each micro-batch starts and ends
(docs/protocol.md). Every row lives in a **namespace**, the source identity
(endpoint + table + tunnel), so many queries can share one meta table.

Data model:
- one ``BatchRecord`` per UUID: previous UUID, state (minted -> planned -> committed -> pushed),
  the read limit Spark gave when it was minted, and the ``Manifest`` (channels planned for the
  batch with their start checkpoints), written once and never changed;
- one ``EndCheckpoint`` per (UUID, channel), **put-if-absent**: the same position again is
  idempotent, a different one raises ``EndCheckpointConflictError`` carrying the stored value.

Who calls what:
- driver (planning process): ``create_batch``, ``put_manifest``, ``find_batch``,
  ``get_end_checkpoints``, ``mark_committed``, ``committed_not_pushed``, ``mark_pushed``, ``gc``;
- executors: ``get_end_checkpoint`` and ``put_end_checkpoint`` (the claim), on a store opened
  inside ``read()``;
- the inspection CLI and dashboard: the listing methods, read-only;
- the driver's lease on a source (``connector.planning.lease``): ``take_lease``,
  ``get_lease``, ``release_lease`` -- a compare-and-set row per source, so two live queries on
  one tunnel are told apart.

Backends implement the ``_``-prefixed primitives; the policies (chain order, commit catch-up,
retention, conflict detection) live here once. Every backend passes
``tests/contract/meta_contract.py``. Every write is safe to retry.
"""

from __future__ import annotations

import enum
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from cdc_common.tokens import FINISHED as FINISHED  # a channel read to its end
from meta_store.errors import (
    CorruptMetaRecordError,
    EndCheckpointConflictError,
    MetaStoreRequestError,
    TransientMetaStoreError,
    UnknownBatchError,
)


class BatchState(str, enum.Enum):  # noqa: UP042 - keep str() as is for callers
    MINTED = "minted"  # returned by latestOffset; may never be used
    PLANNED = "planned"  # manifest written by partitions()
    COMMITTED = "committed"  # Spark committed it (or a later batch)
    PUSHED = "pushed"  # its checkpoints reached the tunnel service

    @property
    def rank(self) -> int:
        return list(BatchState).index(self)


class _Frozen(BaseModel):
    """A stored record: frozen, no unknown field, and no time or count that is not a finite
    number (a stored ``"NaN"`` or ``1e999`` is a corrupt row, not a float that breaks every
    reader of it later)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _added_later(description: str) -> Any:
    """A field added after rows were first stored: ``None`` by default and left out of the
    stored JSON while ``None``, so a row that does not use it is stored byte for byte as before
    (tests/test_meta_kv_layout.py) and rows of earlier releases read as ``None``."""
    return Field(default=None, description=description, exclude_if=lambda v: v is None)


class ChannelStart(_Frozen):
    """A channel planned for a batch: where its read starts and how far it may go."""

    channel_id: str
    token: str
    #: records consumed from this channel before this batch (the tunnel push sequence)
    sequence_number: int
    max_records: int
    parent_ids: tuple[str, ...] = ()
    #: sequence of the last record consumed before this batch (None: none or unknown)
    last_sequence: str | None = None
    #: the read's byte budget (``maxBytesPerTrigger``'s share; None: no byte limit)
    max_bytes: int | None = _added_later("bytes of records the read may take")
    #: the AvailableNow bound (``Manifest.available_now_us``) a read of this channel already
    #: reached before this batch: carried from batch to batch until the run ends
    bound_reached_us: int | None = _added_later("AvailableNow bound reached")


class Manifest(_Frozen):
    channels: tuple[ChannelStart, ...]
    #: channels first read in this batch (children released since the previous batch)
    children_added: tuple[str, ...] = ()
    planned_at: float
    #: the Trigger.AvailableNow bound the batch was planned under (commit time in microseconds
    #: since the epoch; None: not such a run): its reads stop there, and a replay too
    available_now_us: int | None = _added_later("the AvailableNow bound of the batch")

    def channel(self, channel_id: str) -> ChannelStart | None:
        return next((c for c in self.channels if c.channel_id == channel_id), None)


class BatchRecord(_Frozen):
    uuid: str
    prev_uuid: str | None
    state: BatchState
    created_at: float
    #: ReadMaxRows given by Spark when minted; None = read all available (per-channel caps apply)
    max_rows: int | None = None
    manifest: Manifest | None = None
    committed_at: float | None = None
    pushed_at: float | None = None
    spark_batch_id: int | None = None


class Lease(_Frozen):
    """A query's claim on a source (``connector.planning.lease``): who holds it, until when,
    and where its batches are. Stored as JSON under the source's key; written only by
    compare-and-set (``MetaStore.take_lease``)."""

    #: the holder: one planning process (host/pid/random, ``connector.planning.lease``)
    owner: str
    expires_at: float
    renewed_at: float
    #: the meta namespace the holder's batches are in, and a batch on its line at
    #: ``renewed_at`` (the newest it committed or planned): how a restart of the same query
    #: is told from a second query
    namespace: str
    tip: str | None = None

    def live(self, now: float) -> bool:
        return self.expires_at > now


class EndCheckpoint(_Frozen):
    """Where one channel's read stopped in one batch: claimed before any row is handed out."""

    channel_id: str
    #: the position the read actually started from (differs from the manifest only after
    #: skipping trimmed data with failOnDataLoss=false)
    start_token: str
    token: str
    sequence_number: int
    records: int
    attempt: str  # identity of the writing attempt (host/pid/task), for operators
    written_at: float
    #: sequence of the last record consumed (this batch's or, if it read none, the start's)
    last_sequence: str | None = None
    #: the AvailableNow bound (µs) this read reached: every record of the channel committed by
    #: then is consumed (the read passed it, or found nothing more)
    bound_reached_us: int | None = _added_later("AvailableNow bound reached")

    def same_position(self, other: EndCheckpoint) -> bool:
        """Equal for put-if-absent purposes: who wrote it and when does not matter."""
        return (self.channel_id, self.start_token, self.token, self.sequence_number,
                self.records) == (other.channel_id, other.start_token, other.token,
                                  other.sequence_number, other.records)

    @property
    def finished(self) -> bool:
        return self.token == FINISHED

    def summary(self) -> str:
        return f"token={self.token!r} seq={self.sequence_number} records={self.records}"


#: the largest manifest JSON a meta store writes or reads back, compressed or not (16 MiB: tens
#: of thousands of channels): refused when written (``stored_manifest_json``), a corrupt row
#: when read (``parse_manifest``), so a reader's time and memory stay bounded.
MAX_MANIFEST_JSON_BYTES = 16 * 1024 * 1024


def validation_reason(exc: ValidationError) -> str:
    """The first problem pydantic found, prefixed with the field it is in
    (``channels.0.token: Input should be a valid string``)."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    msg = str(first.get("msg", exc))
    return f"{where}: {msg}" if where else msg


R = TypeVar("R", bound=_Frozen)


def parse_record(model: type[R], raw: str | bytes, *, store: str, key: str) -> R:
    """Decode a stored JSON row; a row that is not ours raises ``CorruptMetaRecordError``
    naming the row and the field (a non-finite time included; nesting is bounded by pydantic's
    parser at 200 levels)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise CorruptMetaRecordError(store=store, key=key, reason=validation_reason(exc)
                                     ) from None


def stored_manifest_json(store: str, uuid: str, manifest: Manifest) -> str:
    """``manifest`` as the JSON a backend stores (driver, ``put_manifest`` /
    ``create_batch``); ``MetaStoreRequestError`` past ``MAX_MANIFEST_JSON_BYTES``, which no
    reader would take back."""
    raw = manifest.model_dump_json()
    if len(raw) > MAX_MANIFEST_JSON_BYTES or len(raw.encode()) > MAX_MANIFEST_JSON_BYTES:
        raise MetaStoreRequestError(
            store=store, operation="put_manifest",
            reason=f"batch {uuid!r}: the manifest of {len(manifest.channels)} channels is "
            f"{len(raw.encode())} bytes of JSON, over the {MAX_MANIFEST_JSON_BYTES} a meta "
            "store reads back (read fewer channels per tunnel)")
    return raw


def parse_manifest(store: str, key: str, stored: str | bytes) -> Manifest:
    """A stored manifest cell of the batch row ``key`` (every backend's reader): its size is
    checked by length before parsing (a character is at least one byte), so a cell past
    ``MAX_MANIFEST_JSON_BYTES`` is a ``CorruptMetaRecordError`` that costs no parse."""
    size = len(stored)
    if size <= MAX_MANIFEST_JSON_BYTES and isinstance(stored, str) \
            and size * 4 > MAX_MANIFEST_JSON_BYTES:
        size = len(stored.encode("utf-8", "surrogatepass"))
    if size > MAX_MANIFEST_JSON_BYTES:
        raise CorruptMetaRecordError(
            store=store, key=key + "/manifest",
            reason=f"the manifest is {'at least ' if isinstance(stored, str) else ''}{size} "
            f"bytes of JSON, over the {MAX_MANIFEST_JSON_BYTES} any meta store writes")
    return parse_record(Manifest, stored, store=store, key=key + "/manifest")


def with_manifest(batch: BatchRecord, manifest: Manifest) -> BatchRecord:
    """``batch`` once its manifest is set (``_set_manifest_if_absent``): planned if minted."""
    state = BatchState.PLANNED if batch.state is BatchState.MINTED else batch.state
    return batch.model_copy(update={"manifest": manifest, "state": state})


def first_times(batch: BatchRecord, state: BatchState, at: Any,
                spark_batch_id: int | None) -> dict[str, Any]:
    """The fields moving ``batch`` to ``state`` sets, each only the first time
    (``_advance_state`` of every backend)."""
    changes: dict[str, Any] = {}
    if state.rank >= BatchState.COMMITTED.rank and batch.committed_at is None:
        changes["committed_at"] = at
    if state is BatchState.PUSHED and batch.pushed_at is None:
        changes["pushed_at"] = at
    if spark_batch_id is not None and batch.spark_batch_id is None:
        changes["spark_batch_id"] = spark_batch_id
    return changes


_NAMESPACE_INFO = TypeAdapter(dict[str, str])


def namespace_info_json(info: dict[str, str]) -> str:
    """A namespace's description as stored: a JSON object of strings with sorted keys."""
    return json.dumps(_NAMESPACE_INFO.validate_python(dict(info)), sort_keys=True)


#: compare-and-set rounds of ``take_lease`` before it gives up (each lost to another writer)
_LEASE_ROUNDS = 10

#: stands for a stored manifest that was not read (``MetaStore._list_batches_for_retention``)
UNREAD_MANIFEST = Manifest(channels=(), planned_at=0.0)


def chain_order(batches: Iterable[BatchRecord]) -> list[BatchRecord]:
    """Order batches along the prev chain; batches off the chain (never-used UUIDs) follow in
    creation order. Several roots (e.g. after a tunnel was recreated) each start a chain.

    A root is a batch whose ``prev_uuid`` is None or not in ``batches`` (its predecessor was
    garbage-collected). A root that was never used (minted, no manifest, no planned child) is
    an orphan like any other unplanned sibling, so it goes to the tail, not to the front.
    """
    by_prev: dict[str | None, list[BatchRecord]] = {}
    all_batches = sorted(batches, key=lambda b: b.created_at)
    uuids = {b.uuid for b in all_batches}
    for b in all_batches:
        by_prev.setdefault(b.prev_uuid if b.prev_uuid in uuids else None, []).append(b)

    def used(b: BatchRecord) -> bool:
        return b.state.rank >= BatchState.PLANNED.rank or b.manifest is not None

    ordered: list[BatchRecord] = []
    seen: set[str] = set()
    roots = [r for r in by_prev.get(None, [])
             if used(r) or any(used(c) for c in by_prev.get(r.uuid, []))]
    for root in roots:
        node: BatchRecord | None = root
        while node is not None and node.uuid not in seen:
            ordered.append(node)
            seen.add(node.uuid)
            # follow the planned child (the one Spark used); unplanned siblings are orphans
            node = next((c for c in by_prev.get(node.uuid, []) if c.uuid not in seen and used(c)),
                        None)
    ordered.extend(b for b in all_batches if b.uuid not in seen)
    return ordered


#: the lease-row key prefix of documents (a source identity never starts with it)
DOCUMENT_PREFIX = "document:"


class MetaStore(ABC):
    """A meta table. One instance per process; not shared across processes."""

    #: The URI this store was opened with, secrets removed (safe to log and show).
    uri: str

    # --- primitives each backend implements ----------------------------------------------

    @abstractmethod
    def _put_batch_if_absent(self, namespace: str, record: BatchRecord) -> BatchRecord:
        """Write ``record`` unless a row for its UUID exists; return the stored row."""

    @abstractmethod
    def find_batch(self, namespace: str, uuid: str) -> BatchRecord | None:
        """The batch ``uuid``, or None (driver; ``get_batch`` when it must exist)."""

    @abstractmethod
    def _set_manifest_if_absent(
        self, namespace: str, uuid: str, manifest: Manifest
    ) -> BatchRecord:
        """Atomically set the manifest (and state planned, when minted) unless one is set;
        return the stored row. The batch row exists."""

    @abstractmethod
    def _advance_state(
        self, namespace: str, uuid: str, state: BatchState, at: float,
        spark_batch_id: int | None = None,
    ) -> None:
        """Move the batch to ``state`` if that is forward; never backward. Sets
        ``committed_at``/``pushed_at`` the first time. Missing UUID: no-op."""

    @abstractmethod
    def _put_end_if_absent(self, namespace: str, uuid: str, end: EndCheckpoint) -> EndCheckpoint:
        """Write ``end`` unless (uuid, channel) has one; return the stored one."""

    @abstractmethod
    def get_end_checkpoint(self, namespace: str, uuid: str,
                           channel_id: str) -> EndCheckpoint | None:
        """The end claimed for (``uuid``, ``channel_id``), or None (an executor's claim)."""

    @abstractmethod
    def _list_ends(self, namespace: str, uuid: str) -> list[EndCheckpoint]: ...

    @abstractmethod
    def _list_batches(self, namespace: str) -> list[BatchRecord]: ...

    def _list_batches_in_state(self, namespace: str, state: BatchState) -> list[BatchRecord]:
        """Batches in ``state``, any order. A backend with an index on the state overrides it
        (the driver asks for committed-not-pushed batches on every commit)."""
        return [b for b in self._list_batches(namespace) if b.state is state]

    def _list_ends_of(self, namespace: str, uuids: Sequence[str]
                      ) -> dict[str, list[EndCheckpoint]]:
        """The end checkpoints of several batches; a backend overrides it with one query."""
        return {u: self._list_ends(namespace, u) for u in uuids}

    def _list_batches_for_retention(self, namespace: str) -> list[BatchRecord]:
        """``_list_batches`` for the retention rule, which needs only whether a batch has a
        manifest: SQLite returns ``UNREAD_MANIFEST`` for one, not decoding it."""
        return self._list_batches(namespace)

    @abstractmethod
    def _delete_batches(self, namespace: str, uuids: Sequence[str]) -> None:
        """Delete the batch rows and their end checkpoints (ends first, so no end outlives
        its batch). Missing UUIDs are ignored."""

    @abstractmethod
    def list_namespaces(self) -> list[str]:
        """Namespaces that have a description, sorted (CLI, read-only). Each name read is
        checked by ``_decode_namespace`` (the inspection tools skip a corrupt one)."""

    def _decode_namespace(self, value: Any) -> str:
        """One namespace cell a listing read: ``CorruptMetaRecordError`` unless it is text.
        One cell per call, like ``_decode_batch``: ``tablestore_cdc.feed.reading.InspectedStore``
        wraps it to skip and name such a row."""
        if isinstance(value, str):
            return value
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise self._corrupt(f"namespace {shown}",
                            f"the namespace cell holds {type(value).__name__}, not text")

    def _corrupt(self, key: str, reason: str) -> CorruptMetaRecordError:
        return CorruptMetaRecordError(store=self.uri, key=key, reason=reason)

    def _parse_namespace_info(self, key: str, raw: Any) -> dict[str, str]:
        """A stored description (``namespace_info_json``); ``CorruptMetaRecordError`` if not."""
        try:
            return _NAMESPACE_INFO.validate_json(raw)
        except ValidationError as exc:
            raise self._corrupt(key, str(exc).splitlines()[0]) from None

    def _sorted_namespaces(self, cells: Iterable[Any]) -> list[str]:
        """``list_namespaces``' answer: the distinct ``cells`` that ``_decode_namespace``
        takes for names, sorted."""
        names = {self._decode_namespace(cell) for cell in cells}
        return sorted(name for name in names if isinstance(name, str))

    @abstractmethod
    def set_namespace_info(self, namespace: str, info: dict[str, str]) -> None:
        """Describe a namespace (endpoint without secrets, table, tunnel, tunnel id)."""

    @abstractmethod
    def get_namespace_info(self, namespace: str) -> dict[str, str] | None: ...

    @abstractmethod
    def _get_lease_json(self, key: str) -> str | None:
        """The lease stored under ``key`` (a JSON text), or None."""

    @abstractmethod
    def _swap_lease_json(self, key: str, expected: str | None, new: str) -> bool:
        """Store ``new`` under ``key`` if the stored lease is exactly ``expected`` (None: no
        lease is stored), atomically; True when it was written."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Safe to call twice."""

    # --- batches ----------------------------------------------------------------------------

    def create_batch(
        self,
        namespace: str,
        uuid: str,
        prev_uuid: str | None,
        *,
        state: BatchState = BatchState.MINTED,
        max_rows: int | None = None,
        manifest: Manifest | None = None,
        now: float | None = None,
    ) -> BatchRecord:
        """Put-if-absent a batch row (driver: ``latestOffset`` mints; ``initialOffset`` writes
        the initial batch with its manifest). Returns the stored row, which wins over ours."""
        record = BatchRecord(
            uuid=uuid, prev_uuid=prev_uuid, state=state,
            created_at=time.time() if now is None else now, max_rows=max_rows, manifest=manifest,
        )
        return self._put_batch_if_absent(namespace, record)

    def get_batch(self, namespace: str, uuid: str) -> BatchRecord:
        batch = self.find_batch(namespace, uuid)
        if batch is None:
            raise UnknownBatchError(uuid=uuid, namespace=namespace)
        return batch

    def put_manifest(
        self, namespace: str, uuid: str, prev_uuid: str | None, manifest: Manifest
    ) -> Manifest:
        """Write the batch's manifest once (driver, ``partitions``); return the stored one.

        Creates the batch row if it is missing (a minted row lost to retention before a
        replay), so a replayed offset from Spark's log can always be planned.
        """
        self.create_batch(namespace, uuid, prev_uuid)
        stored = self._set_manifest_if_absent(namespace, uuid, manifest)
        assert stored.manifest is not None
        return stored.manifest

    # --- end checkpoints (executors) --------------------------------------------------------

    def put_end_checkpoint(self, namespace: str, uuid: str, end: EndCheckpoint) -> EndCheckpoint:
        """Claim a channel's end for a batch. Idempotent for the same position; a different
        stored position raises ``EndCheckpointConflictError`` with ``stored`` set."""
        stored = self._put_end_if_absent(namespace, uuid, end)
        if not stored.same_position(end):
            raise EndCheckpointConflictError(
                uuid=uuid, channel_id=end.channel_id, stored=stored, attempted=end,
                stored_summary=stored.summary(), attempted_summary=end.summary(),
            )
        return stored

    def get_end_checkpoints(self, namespace: str, uuid: str) -> dict[str, EndCheckpoint]:
        return {e.channel_id: e for e in self._list_ends(namespace, uuid)}

    def get_end_checkpoints_of(self, namespace: str, uuids: Sequence[str]
                               ) -> dict[str, dict[str, EndCheckpoint]]:
        """``get_end_checkpoints`` for several batches at once (driver: a push)."""
        found = self._list_ends_of(namespace, list(dict.fromkeys(uuids)))
        return {u: {e.channel_id: e for e in found.get(u, [])} for u in uuids}

    # --- commit and push (driver) -----------------------------------------------------------

    def mark_committed(
        self, namespace: str, uuid: str, spark_batch_id: int | None = None,
        now: float | None = None,
    ) -> list[str]:
        """Mark ``uuid`` committed, and every planned ancestor on its prev chain that is not yet
        (Spark commits in order and does not re-send a commit lost in a crash). Returns the
        UUIDs newly marked, oldest first."""
        at = time.time() if now is None else now
        newly: list[str] = []
        visited: set[str] = set()  # a corrupt prev cycle must not loop forever
        current = self.find_batch(namespace, uuid)
        while (current is not None and current.uuid not in visited
               and current.state.rank < BatchState.COMMITTED.rank):
            visited.add(current.uuid)
            if current.manifest is not None or current.uuid == uuid:
                newly.append(current.uuid)
            current = self.find_batch(namespace, current.prev_uuid) if current.prev_uuid else None
        # oldest first: a crash half-way leaves a committed prefix, and the next call (which
        # walks back to the first committed ancestor) still finds the rest
        for u in reversed(newly):
            self._advance_state(namespace, u, BatchState.COMMITTED, at,
                                spark_batch_id if u == uuid else None)
        return list(reversed(newly))

    def committed_not_pushed(self, namespace: str) -> list[BatchRecord]:
        """Committed batches whose checkpoints have not reached the tunnel, oldest first."""
        return chain_order(self._list_batches_in_state(namespace, BatchState.COMMITTED))

    def mark_pushed(self, namespace: str, uuids: Iterable[str], now: float | None = None) -> None:
        at = time.time() if now is None else now
        for u in uuids:
            self._advance_state(namespace, u, BatchState.PUSHED, at)

    # --- listing and retention ---------------------------------------------------------------

    def list_batches(self, namespace: str) -> list[BatchRecord]:
        """All batches of the namespace along the prev chain (orphans last)."""
        return chain_order(self._list_batches(namespace))

    def successors(self, namespace: str, uuid: str) -> list[BatchRecord]:
        """Batches minted after ``uuid`` (``prev_uuid == uuid``), oldest first (driver: a
        restart looks for a batch planned after its start; the initial offset looks for a
        committed batch after a generation's initial batch)."""
        return sorted((b for b in self._list_batches(namespace) if b.prev_uuid == uuid),
                      key=lambda b: (b.created_at, b.uuid))

    def reset_namespace(self, namespace: str) -> int:
        """Forget a namespace's batches (operator, ``tablestore-cdc meta reset``): every batch
        row and end checkpoint goes, and the description loses its tunnel binding, so the next
        query binds to the tunnel as it is now. Returns the number of batches deleted."""
        uuids = [b.uuid for b in self._list_batches(namespace)]
        if uuids:
            self._delete_batches(namespace, uuids)
        info = self.get_namespace_info(namespace)
        if info is not None:
            self.set_namespace_info(namespace, {k: v for k, v in info.items()
                                                if k not in ("tunnel_id", "committed_generation")})
        return len(uuids)

    def latest_committed(self, namespace: str) -> BatchRecord | None:
        committed = [b for b in self.list_batches(namespace)
                     if b.state.rank >= BatchState.COMMITTED.rank]
        return committed[-1] if committed else None

    def retention_victims(
        self, namespace: str, keep_committed: int, minted_older_than_s: float,
        now: float | None = None,
    ) -> list[BatchRecord]:
        """What ``gc`` would delete: committed/pushed batches older than the newest
        ``keep_committed`` (never one still to push), and minted-but-never-planned UUIDs older
        than ``minted_older_than_s``. Never the newest batch of the chain."""
        at = time.time() if now is None else now
        batches = chain_order(self._list_batches_for_retention(namespace))
        # the newest N committed-or-pushed batches stay (at least one: the next batch's start);
        # of the older ones only pushed batches go, a committed one still has to be pushed
        done = [b for b in batches if b.state.rank >= BatchState.COMMITTED.rank]
        older = done[: max(0, len(done) - max(keep_committed, 1))]
        victims = [b for b in older if b.state is BatchState.PUSHED]
        victims += [b for b in batches
                    if b.state is BatchState.MINTED and b.manifest is None
                    and at - b.created_at > minted_older_than_s]
        return victims

    def gc(
        self, namespace: str, keep_committed: int, minted_older_than_s: float = 3600.0,
        now: float | None = None,
    ) -> list[str]:
        """Delete by the retention rule (see ``retention_victims``); returns deleted UUIDs."""
        victims = [b.uuid for b in self.retention_victims(
            namespace, keep_committed, minted_older_than_s, now)]
        if victims:
            self._delete_batches(namespace, victims)
        return victims

    # --- leases (driver) ---------------------------------------------------------------------

    def get_lease(self, key: str) -> Lease | None:
        """The lease under ``key`` (the source's identity), or None."""
        return self._parse_lease(key, self._get_lease_json(key))

    def _parse_lease(self, key: str, raw: str | None) -> Lease | None:
        return None if raw is None else parse_record(Lease, raw, store=self.uri,
                                                     key=f"{key}/lease")

    def take_lease(self, key: str, owner: str, ttl_s: float, *, namespace: str,
                   tip: str | None = None, now: float | None = None,
                   may_take_over: Callable[[Lease], bool] | None = None) -> Lease | None:
        """Take or renew the lease under ``key`` for ``owner`` for ``ttl_s`` seconds: granted
        when there is none, it has expired, ``owner`` holds it, or ``may_take_over(lease)``
        says the live holder is to be replaced (a restart of the same query). Returns None
        when granted, else the live lease that stands in the way. Compare-and-set on the
        stored row: of two processes taking it at once, one wins."""
        for _ in range(_LEASE_ROUNDS):
            at = time.time() if now is None else now
            raw = self._get_lease_json(key)
            current = self._parse_lease(key, raw)
            if (current is not None and current.owner != owner and current.live(at)
                    and not (may_take_over is not None and may_take_over(current))):
                return current
            new = Lease(owner=owner, expires_at=at + ttl_s, renewed_at=at, namespace=namespace,
                        tip=tip if tip is not None or current is None or current.owner != owner
                        else current.tip)
            if self._swap_lease_json(key, raw, new.model_dump_json()):
                return None
        raise TransientMetaStoreError(
            detail=f"{self.uri}: the lease of {key!r} changed {_LEASE_ROUNDS} times in a row")

    def release_lease(self, key: str, owner: str, now: float | None = None) -> None:
        """End ``owner``'s lease under ``key`` at once (a query that stops), so the next
        query need not wait for it to expire; a lease another owner holds is left alone."""
        at = time.time() if now is None else now
        raw = self._get_lease_json(key)
        current = self._parse_lease(key, raw)
        if current is None or current.owner != owner or not current.live(at):
            return
        ended = current.model_copy(update={"expires_at": at, "renewed_at": at})
        self._swap_lease_json(key, raw, ended.model_dump_json())  # lost: someone took it

    # --- documents (driver and CLI; ``meta_store.signals``) ---------------------------------

    def get_document(self, key: str) -> str | None:
        """The small JSON document under ``key``, or None. Kept in the lease rows under a key
        no source identity has (``DOCUMENT_PREFIX``), so every backend has it already."""
        return self._get_lease_json(DOCUMENT_PREFIX + key)

    def swap_document(self, key: str, expected: str | None, new: str) -> bool:
        """Store ``new`` under ``key`` if the stored document is exactly ``expected`` (None:
        none stored), atomically; True when it was written."""
        return self._swap_lease_json(DOCUMENT_PREFIX + key, expected, new)

    def __enter__(self) -> MetaStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uri={self.uri!r})"

    __str__ = __repr__
