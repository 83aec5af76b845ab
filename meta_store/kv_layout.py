"""The key-value layout the DynamoDB and Tablestore meta stores share, and what they do alike.

Both keep a meta table as rows of one service table, addressed by a string primary key ``ns``
(the namespace, ``meta_store.base``) and a string sort key ``sk``:

- ``B#<uuid>``, a batch row:

  - ``doc``: the ``BatchRecord`` JSON without the fields that change after it is written;
  - ``state`` (string) and ``state_rank`` (integer, 0 minted to 3 pushed, what conditions and
    filters compare);
  - ``committed_at`` and ``pushed_at`` (seconds since the epoch) and ``spark_batch_id``
    (integer), each absent until set, then set once;
  - the manifest, written once: ``manifest``, its JSON as a string or, when that JSON is
    larger than the backend's threshold, zlib-compressed binary: DynamoDB keeps the attribute
    ``manifest`` (binary over 300 KB; an item holds at most 400 KB), Tablestore writes the
    column ``manifest_z`` instead (over 2 MB, a column's limit). A reader takes bytes as
    compressed JSON and a string as JSON (``ManifestStorage``);
  - Tablestore only: ``version`` (integer, 0 when written, bumped by every change: the
    condition of its optimistic updates).

- ``E#<uuid>#<channel id>``, an end checkpoint: ``doc``, the ``EndCheckpoint`` JSON. A batch
  UUID never holds ``#``, so a batch's ends are the sort keys that start with ``E#<uuid>#``.
- ``N#info``, the namespace's description (``set_namespace_info``): ``info``, a JSON object of
  strings with sorted keys.
- ``N#lease``, a source's lease (``MetaStore.take_lease``) in the partition of the source's
  identity: ``lease``, the ``Lease`` JSON, replaced only by a write conditioned on the stored
  text (or on there being none).
- ``N#pending``, DynamoDB only: the committed-not-pushed index, ``uuids`` (a string set, a
  superset of the batches in state committed: a UUID is added before its batch is marked
  committed and removed after it is marked pushed) and ``seeded`` (boolean, set once the set
  was filled from a listing, for tables written before the index existed).

Numbers are stored as the service's numbers: on DynamoDB as given (a time passed as a whole
number is stored as one, e.g. ``1002``), on Tablestore times as DOUBLE and counts as INTEGER.
``tests/test_meta_kv_layout.py`` pins the stored rows of both backends byte for byte.

``KeyValueMetaStore`` implements what both do alike over rows as plain dicts (``PlainRow``):
the codecs above, put-if-absent with its retry, gets, listings, deletes and the namespace
description. Each backend keeps only what is its own: marshalling rows to its service's types,
the row primitives (one request each, its conditional writes, its error mapping), and the
writes that change a batch row, which each service makes atomic in its own way. Instances live
in the driver's planning process, executors' ``read()`` and the CLI, like every meta store.
"""

from __future__ import annotations

import random
import time
import zlib
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import TypeAdapter, ValidationError

from meta_store.base import MAX_MANIFEST_JSON_BYTES as MAX_MANIFEST_JSON_BYTES
from meta_store.base import (
    BatchRecord,
    EndCheckpoint,
    Manifest,
    MetaStore,
    namespace_info_json,
    parse_manifest,
    parse_record,
    stored_manifest_json,
    validation_reason,
)
from meta_store.errors import CorruptMetaRecordError, MetaStoreRequestError, TransientMetaStoreError

#: sort keys: batch rows, end checkpoints, the namespace's description, DynamoDB's index
BATCH_PREFIX = "B#"
END_PREFIX = "E#"
INFO_SK = "N#info"
LEASE_SK = "N#lease"
PENDING_SK = "N#pending"

#: the fields of a batch kept in their own columns, not in its ``doc``
BATCH_STATE_FIELDS = ("manifest", "state", "committed_at", "pushed_at", "spark_batch_id")
#: a batch row's ``doc``: a JSON object (pydantic's parser: nesting bounded at 200 levels)
_DOC = TypeAdapter(dict[str, Any])
#: put-if-absent: attempts when the stored row vanishes (gc) between the put and the read
_PUT_ROUNDS = 3

#: a row as the codecs see it: name -> str, int, float, bool, bytes, a list of strings or None
#: (a backend's marshalling converts); a row read from the table also holds its ``sk``
PlainRow = dict[str, Any]


def batch_sk(uuid: str) -> str:
    return f"{BATCH_PREFIX}{uuid}"


def backoff(attempt: int) -> None:
    """The pause before a request is sent again (what the service left undone, or an answer
    that never came): jittered, exponential from 50 ms, at most 2 s."""
    time.sleep(random.uniform(0, min(2.0, 0.05 * 2 ** attempt)))


@dataclass(frozen=True)
class ManifestStorage:
    """How a backend stores a manifest: its JSON up to ``compress_over`` bytes, above that
    zlib-compressed under ``compressed_column``; over ``max_bytes`` even compressed, it is
    refused (``limit`` says why, for the error)."""

    compress_over: int
    max_bytes: int
    compressed_column: str
    limit: str


class ConditionFailed(Exception):
    """A conditional write found its condition false (raised by a backend's request wrapper);
    ``row`` is the stored row when the service returned it with the failure."""

    def __init__(self, row: PlainRow | None = None) -> None:
        super().__init__("condition failed")
        self.row = row


class KeyValueMetaStore(MetaStore):
    """A meta store over the layout above (module docstring). Subclasses set the class
    attributes and implement the row primitives; ``uri`` is set by their constructor."""

    #: how the backend stores manifests
    manifest_storage: ClassVar[ManifestStorage]
    #: what the service calls a row's named values, for messages ("attribute", "column")
    cell: ClassVar[str]
    #: columns a new batch row starts with besides the layout's (Tablestore: ``version``)
    new_batch_columns: ClassVar[dict[str, Any]] = {}
    #: most rows one batched delete request may carry
    max_deletes_per_request: ClassVar[int]
    #: batched delete requests sent for the same rows before giving up
    delete_rounds: int
    _closed = False
    #: the service SDK's client (boto3's, ``OTSClient``), set by the constructor
    _client: Any

    @property
    def client(self) -> Any:
        """The service SDK's client (for operators' and tests' hooks, such as botocore's)."""
        return self._client

    # --- row primitives each backend implements ----------------------------------------------

    @abstractmethod
    def _get_row(self, operation: str, namespace: str, sk: str) -> PlainRow | None:
        """The row at ``sk`` (strongly consistent), or None."""

    @abstractmethod
    def _rows(self, operation: str, namespace: str, prefix: str, *,
              keys_only: bool = False) -> Iterator[PlainRow]:
        """The rows whose sort key starts with ``prefix``, in sort-key order, page by page;
        ``keys_only``: the caller needs only ``sk``."""

    @abstractmethod
    def _insert_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        """Write ``row`` at ``sk`` unless a row is there: else raise ``ConditionFailed``."""

    @abstractmethod
    def _put_row(self, operation: str, namespace: str, sk: str, row: PlainRow) -> None:
        """Write ``row`` at ``sk``, replacing any row there."""

    @abstractmethod
    def _replace_row_if(self, operation: str, namespace: str, sk: str, column: str,
                        expected: str, row: PlainRow) -> None:
        """Write ``row`` at ``sk`` if the row there holds exactly ``expected`` in ``column``:
        else raise ``ConditionFailed``."""

    @abstractmethod
    def _delete_some(self, namespace: str, sort_keys: Sequence[str]) -> list[str]:
        """One batched delete of at most ``max_deletes_per_request`` rows (missing ones are
        ignored): the sort keys the service left undeleted (throttled), to send again."""

    def _close_client(self) -> None:
        """Close the service client's connections (``close``, once)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_client()

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise MetaStoreRequestError(store=self.uri, operation=operation,
                                        reason="the store is closed")

    # --- sort keys ---------------------------------------------------------------------------

    def _ends_prefix(self, uuid: str) -> str:
        if "#" in uuid:
            raise MetaStoreRequestError(store=self.uri, operation="end checkpoint key",
                                        reason=f"batch UUID {uuid!r} must not contain '#'")
        return f"{END_PREFIX}{uuid}#"

    def _end_sk(self, uuid: str, channel_id: str) -> str:
        return self._ends_prefix(uuid) + channel_id

    # --- codecs ------------------------------------------------------------------------------

    def _manifest_cells(self, uuid: str, manifest: Manifest) -> PlainRow:
        """The manifest's one column: its JSON, or compressed when over the threshold."""
        storage = self.manifest_storage
        raw = stored_manifest_json(self.uri, uuid, manifest).encode()
        if len(raw) <= storage.compress_over:
            return {"manifest": raw.decode()}
        packed = zlib.compress(raw, 6)
        if len(packed) > storage.max_bytes:
            raise MetaStoreRequestError(
                store=self.uri, operation="put_manifest",
                reason=f"batch {uuid!r}: the manifest of {len(manifest.channels)} channels is "
                f"{len(packed)} bytes even compressed; {storage.limit} (use the sqlite "
                "backend or read fewer channels per tunnel)",
            )
        return {storage.compressed_column: packed}

    def _batch_row(self, record: BatchRecord) -> PlainRow:
        """A new batch's row (``create_batch``: no commit, push or Spark batch id yet)."""
        row: PlainRow = {
            "doc": record.model_dump_json(exclude=set(BATCH_STATE_FIELDS)),
            "state": record.state.value,
            "state_rank": record.state.rank,
            **self.new_batch_columns,
        }
        if record.manifest is not None:
            row.update(self._manifest_cells(record.uuid, record.manifest))
        return row

    def _decode_batch(self, namespace: str, row: PlainRow) -> BatchRecord:
        """A batch row's record; ``CorruptMetaRecordError`` for a row that is not one, or
        holds another batch. One row per call: the inspection tools (``tablestore_cdc.feed``)
        wrap this method to skip corrupt rows."""
        sk = str(row.get("sk", "?"))
        key = f"{namespace}/{sk}"
        try:
            fields = dict(_DOC.validate_json(row["doc"]))
            fields["state"] = row["state"]
            fields |= {n: row[n] for n in BATCH_STATE_FIELDS[2:] if n in row}  # times, Spark id
            stored = row.get(self.manifest_storage.compressed_column, row.get("manifest"))
            if stored is not None:
                raw = self._inflate(key, stored) if isinstance(stored, bytes) else stored
                fields["manifest"] = parse_manifest(self.uri, key, raw)
            batch = BatchRecord.model_validate(fields)
        except CorruptMetaRecordError:
            raise
        except KeyError as exc:
            raise self._corrupt(key, f"{self.cell} {exc} is missing") from None
        except ValidationError as exc:
            raise self._corrupt(key, validation_reason(exc)) from None
        except (ValueError, TypeError, zlib.error) as exc:
            raise self._corrupt(key, str(exc)) from None
        if sk != batch_sk(batch.uuid):
            raise self._corrupt(key, f"the row holds batch {batch.uuid!r}")
        return batch

    def _inflate(self, key: str, stored: bytes) -> bytes:
        """A compressed manifest cell's JSON, inflated at most ``MAX_MANIFEST_JSON_BYTES``
        (one more byte tells it is over; a few hundred KB can inflate to hundreds of MB):
        ``CorruptMetaRecordError`` past that, for a stream cut short, or for bytes after its
        end."""
        inflater = zlib.decompressobj()
        raw = inflater.decompress(stored, MAX_MANIFEST_JSON_BYTES + 1)
        if len(raw) > MAX_MANIFEST_JSON_BYTES or inflater.unconsumed_tail:
            raise self._corrupt(key, f"the compressed manifest ({len(stored)} bytes) inflates "
                                f"past {MAX_MANIFEST_JSON_BYTES} bytes, more than any manifest "
                                "written")
        if not inflater.eof:
            raise self._corrupt(key, "the compressed manifest is cut short")
        if inflater.unused_data:
            raise self._corrupt(key, f"{len(inflater.unused_data)} byte(s) after the compressed "
                                "manifest")
        return raw

    def _decode_end(self, namespace: str, uuid: str, row: PlainRow) -> EndCheckpoint:
        """An end checkpoint row's record (one row per call, like ``_decode_batch``)."""
        sk = str(row.get("sk", "?"))
        key = f"{namespace}/{sk}"
        doc = row.get("doc")
        if not isinstance(doc, str):
            raise self._corrupt(key, f"{self.cell} 'doc' (a JSON string) is missing")
        end = parse_record(EndCheckpoint, doc, store=self.uri, key=key)
        if sk != self._end_sk(uuid, end.channel_id):
            raise self._corrupt(key, f"the row holds channel {end.channel_id!r}")
        return end

    # --- the meta-store primitives, over rows ------------------------------------------------

    def _put_if_absent(self, operation: str, namespace: str, sk: str,
                       row: PlainRow) -> PlainRow | None:
        """Insert ``row``; None when ours was written, else the stored row."""
        for _ in range(_PUT_ROUNDS):
            try:
                self._insert_row(operation, namespace, sk, row)
                return None
            except ConditionFailed as failed:
                stored = failed.row or self._get_row(operation, namespace, sk)
                if stored is not None:
                    return stored
        raise TransientMetaStoreError(
            detail=f"{self.uri}: row {sk!r} kept appearing and disappearing")

    def _put_batch_if_absent(self, namespace: str, record: BatchRecord) -> BatchRecord:
        stored = self._put_if_absent("create_batch", namespace, batch_sk(record.uuid),
                                     self._batch_row(record))
        return record if stored is None else self._decode_batch(namespace, stored)

    def find_batch(self, namespace: str, uuid: str) -> BatchRecord | None:
        row = self._get_row("get_batch", namespace, batch_sk(uuid))
        return None if row is None else self._decode_batch(namespace, row)

    def _list_batches(self, namespace: str) -> list[BatchRecord]:
        return [self._decode_batch(namespace, row)
                for row in self._rows("list_batches", namespace, BATCH_PREFIX)]

    def _put_end_if_absent(self, namespace: str, uuid: str, end: EndCheckpoint) -> EndCheckpoint:
        stored = self._put_if_absent("put_end_checkpoint", namespace,
                                     self._end_sk(uuid, end.channel_id),
                                     {"doc": end.model_dump_json()})
        return end if stored is None else self._decode_end(namespace, uuid, stored)

    def get_end_checkpoint(self, namespace: str, uuid: str,
                           channel_id: str) -> EndCheckpoint | None:
        row = self._get_row("get_end_checkpoint", namespace, self._end_sk(uuid, channel_id))
        return None if row is None else self._decode_end(namespace, uuid, row)

    def _list_ends(self, namespace: str, uuid: str) -> list[EndCheckpoint]:
        return [self._decode_end(namespace, uuid, row)
                for row in self._rows("get_end_checkpoints", namespace,
                                      self._ends_prefix(uuid))]

    def _delete_rows(self, namespace: str, sort_keys: Sequence[str]) -> None:
        """Delete the rows in as few requests as allowed; what the service leaves undeleted
        is sent again after a jittered backoff (neither SDK resends it by itself)."""
        for i in range(0, len(sort_keys), self.max_deletes_per_request):
            pending = list(sort_keys[i:i + self.max_deletes_per_request])
            for round_ in range(self.delete_rounds):
                pending = self._delete_some(namespace, pending)
                if not pending:
                    break
                backoff(round_)
            else:
                raise TransientMetaStoreError(
                    detail=f"{self.uri}: gc: {len(pending)} deletes still not done after "
                    f"{self.delete_rounds} rounds",
                )

    def _delete_batches(self, namespace: str, uuids: Sequence[str]) -> None:
        unique = list(dict.fromkeys(uuids))
        end_keys = [row["sk"] for u in unique
                    for row in self._rows("gc", namespace, self._ends_prefix(u), keys_only=True)]
        self._delete_rows(namespace, end_keys)  # ends first: no end outlives its batch
        self._delete_rows(namespace, [batch_sk(u) for u in unique])

    def set_namespace_info(self, namespace: str, info: dict[str, str]) -> None:
        self._put_row("set_namespace_info", namespace, INFO_SK,
                      {"info": namespace_info_json(info)})

    def get_namespace_info(self, namespace: str) -> dict[str, str] | None:
        row = self._get_row("get_namespace_info", namespace, INFO_SK)
        return None if row is None else self._parse_namespace_info(f"{namespace}/{INFO_SK}",
                                                                   row.get("info"))

    def _get_lease_json(self, key: str) -> str | None:
        row = self._get_row("get_lease", key, LEASE_SK)
        lease = None if row is None else row.get("lease")
        if row is not None and not isinstance(lease, str):
            raise self._corrupt(f"{key}/{LEASE_SK}", f"{self.cell} 'lease' is not a string")
        return lease

    def _swap_lease_json(self, key: str, expected: str | None, new: str) -> bool:
        try:
            if expected is None:
                self._insert_row("take_lease", key, LEASE_SK, {"lease": new})
            else:
                self._replace_row_if("take_lease", key, LEASE_SK, "lease", expected,
                                     {"lease": new})
        except ConditionFailed:
            return False
        return True
