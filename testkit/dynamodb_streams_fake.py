"""A shard map for moto's DynamoDB Streams: splits, rollovers, lineage, trimming, expiry.

It patches moto's internals (``DynamoDBStreamsHandler``, ``StreamShard``), which change between
minor versions: pyproject's test extra pins moto to the minor this was written against (5.2).

moto 5.2.5 gives every table one shard with no ``ParentShardId`` and no
``EndingSequenceNumber``, a ``NextShardIterator`` that is never null, iterators that never
expire and no trimming. ``StreamsFake`` patches moto *in-process* (``ThreadedMotoServer`` runs
in this process, so the patch holds for the HTTP server too) so that, for the tables attached
to it, the stream looks like the real service's:

- writes made through DynamoDB (``PutItem``/``UpdateItem``/``DeleteItem`` on moto, via boto3)
  are routed by a hash of the partition key to the open shard owning that hash range;
  sequence numbers increase across the whole stream;
- ``split`` closes a shard (``EndingSequenceNumber``) and opens two children with
  ``ParentShardId``, each owning half its range; ``rollover`` opens one child with the whole
  range (what the service does about every 4 hours);
- ``DescribeStream`` is paginated (``Limit``, ``ExclusiveStartShardId`` /
  ``LastEvaluatedShardId``, page size ``describe_page_size``);
- ``GetRecords`` on a closed shard returns a null ``NextShardIterator`` at its end (already
  with the last page when ``null_with_last_page``, else on the next, empty call); more than
  1,000 records per call is a ``ValidationException``;
- ``trim`` drops every record held now (``TrimmedDataAccessException`` for positions before
  them), ``expire_shard`` removes a closed shard from the stream (retention passed);
- ``fail_next(n, code)`` makes the next n Streams requests fail (throttling), and
  ``expire_next(n)`` the next n ``GetRecords`` with ``ExpiredIteratorException``.

Only the Streams side is faked: the table, its items and the stream records' content are
moto's. Tests use it through ``tests/test_tunnel_dynamodb_streams.py`` and
``integration/test_dynamodb_streams_spark.py``, with ``testkit.aws.threaded_moto_server``.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.core.responses import ActionResult
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.table import StreamRecord, StreamShard
from moto.dynamodbstreams.responses import DynamoDBStreamsHandler

HASH_SPACE = 2**32
FIRST_SEQUENCE = 10**20  # 21 digits, like the service's


@dataclass
class FakeShard:
    shard_id: str
    parent_id: str | None
    lo: int
    hi: int  # owns hashes in [lo, hi)
    start_seq: int
    end_seq: int | None = None
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    trimmed_last: int | None = None  # the newest sequence number trimmed away
    gone: bool = False  # aged out of the stream: no longer described

    def to_json(self) -> dict[str, Any]:
        rng: dict[str, str] = {"StartingSequenceNumber": str(self.start_seq)}
        if self.end_seq is not None:
            rng["EndingSequenceNumber"] = str(self.end_seq)
        out: dict[str, Any] = {"ShardId": self.shard_id, "SequenceNumberRange": rng}
        if self.parent_id:
            out["ParentShardId"] = self.parent_id
        return out


def _key_hash(value: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:4], "big")


class StreamsFake:
    """The patch and the shard maps of the attached tables (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tables: dict[str, list[FakeShard]] = {}
        self.seq = FIRST_SEQUENCE
        self.iterators: dict[str, tuple[str, str, int]] = {}  # id -> (table, shard, after)
        self.describe_page_size = 100
        self.null_with_last_page = True
        self._fail: list[str] = []
        self._expire = 0
        self.calls: dict[str, int] = {}
        self._originals: dict[str, Any] = {}

    # --- installing -----------------------------------------------------------------------

    def install(self) -> StreamsFake:
        fake = self
        originals: dict[str, Any] = {
            "add": StreamShard.add,
            "describe_stream": DynamoDBStreamsHandler.describe_stream,
            "get_shard_iterator": DynamoDBStreamsHandler.get_shard_iterator,
            "get_records": DynamoDBStreamsHandler.get_records,
        }
        self._originals = originals

        def add(shard: StreamShard, old: Any, new: Any) -> None:
            if shard.table.name not in fake.tables:
                return originals["add"](shard, old, new)  # type: ignore[no-any-return]
            fake._add(shard, old, new)
            return None

        def handler(name: str) -> Any:
            def method(self: DynamoDBStreamsHandler) -> Any:
                arn = self._get_param("StreamArn")
                if arn is None:  # GetRecords names an iterator, not a stream
                    it = self._get_param("ShardIterator")
                    if it not in fake.iterators and not str(it).startswith("fake|"):
                        return originals[name](self)
                    return getattr(fake, f"_{name}")(self)
                table = arn.split(":", 6)[5].split("/")[1]
                if table not in fake.tables:
                    return originals[name](self)
                return getattr(fake, f"_{name}")(self)
            return method

        StreamShard.add = add  # type: ignore[method-assign,assignment]
        for name in ("describe_stream", "get_shard_iterator", "get_records"):
            setattr(DynamoDBStreamsHandler, name, handler(name))
        return self

    def uninstall(self) -> None:
        StreamShard.add = self._originals["add"]  # type: ignore[method-assign]
        for name in ("describe_stream", "get_shard_iterator", "get_records"):
            setattr(DynamoDBStreamsHandler, name, self._originals[name])

    def reset(self) -> None:
        with self.lock:
            self.tables.clear()
            self.iterators.clear()
            self.describe_page_size = 100
            self.null_with_last_page = True
            self._fail.clear()
            self._expire = 0
            self.calls.clear()

    # --- the shard map (test side) ----------------------------------------------------------

    def _next_seq(self) -> int:
        self.seq += 1 + (self.seq % 7)  # increasing, not contiguous (as the service's)
        return self.seq

    def _new_shard(self, parent: str | None, lo: int, hi: int) -> FakeShard:
        sid = f"shardId-{self.seq:020d}-{uuid.uuid4().hex[:8]}"
        return FakeShard(sid, parent, lo, hi, start_seq=self.seq + 1)

    def attach(self, table: str, shards: int = 1) -> list[str]:
        """Give ``table`` (its stream enabled) ``shards`` open root shards; returns their ids."""
        with self.lock:
            step = HASH_SPACE // shards
            roots = []
            for i in range(shards):
                hi = HASH_SPACE if i == shards - 1 else (i + 1) * step
                roots.append(self._new_shard(None, i * step, hi))
                self._next_seq()
            self.tables[table] = roots
            return [s.shard_id for s in roots]

    def shard(self, table: str, shard_id: str) -> FakeShard:
        for s in self.tables[table]:
            if s.shard_id == shard_id:
                return s
        raise KeyError(shard_id)

    def open_shards(self, table: str) -> list[str]:
        return [s.shard_id for s in self.tables[table] if s.end_seq is None]

    def _close(self, shard: FakeShard) -> None:
        if shard.end_seq is not None:
            raise ValueError(f"shard {shard.shard_id} is already closed")
        shard.end_seq = self._next_seq()

    def split(self, table: str, shard_id: str) -> tuple[str, str]:
        with self.lock:
            parent = self.shard(table, shard_id)
            self._close(parent)
            mid = (parent.lo + parent.hi) // 2
            a = self._new_shard(parent.shard_id, parent.lo, mid)
            self._next_seq()
            b = self._new_shard(parent.shard_id, mid, parent.hi)
            self._next_seq()
            self.tables[table] += [a, b]
            return a.shard_id, b.shard_id

    def rollover(self, table: str, shard_id: str) -> str:
        with self.lock:
            parent = self.shard(table, shard_id)
            self._close(parent)
            child = self._new_shard(parent.shard_id, parent.lo, parent.hi)
            self._next_seq()
            self.tables[table].append(child)
            return child.shard_id

    def trim(self, table: str) -> None:
        """Drop every record held now (as 24 h of retention would)."""
        with self.lock:
            for s in self.tables[table]:
                if s.records:
                    s.trimmed_last = s.records[-1][0]
                    s.records.clear()

    def expire_shard(self, table: str, shard_id: str) -> None:
        """A closed shard whose records all aged out leaves the stream."""
        with self.lock:
            s = self.shard(table, shard_id)
            assert s.end_seq is not None, "only closed shards age out"
            s.gone, s.records = True, []

    def fail_next(self, n: int, code: str = "LimitExceededException") -> None:
        with self.lock:
            self._fail += [code] * n

    def expire_next(self, n: int) -> None:
        with self.lock:
            self._expire += n

    def held(self, table: str) -> list[tuple[str, dict[str, Any]]]:
        """Every record held now as ``(shard id, record JSON)``, in sequence order."""
        with self.lock:
            out = [(seq, s.shard_id, rec) for s in self.tables[table] for seq, rec in s.records]
        return [(sid, rec) for _, sid, rec in sorted(out, key=lambda t: t[0])]

    # --- moto side ------------------------------------------------------------------------

    def _add(self, moto_shard: StreamShard, old: Any, new: Any) -> None:
        table = moto_shard.table
        event = "INSERT" if old is None else "REMOVE" if new is None else "MODIFY"
        item = new if new is not None else old
        h = _key_hash(item.hash_key.to_json())
        view = table.stream_specification["StreamViewType"]  # type: ignore[index]
        with self.lock:
            seq = self._next_seq()
            record = StreamRecord(table, view, event, old, new, seq).to_json()
            for s in self.tables[table.name]:
                if s.end_seq is None and s.lo <= h < s.hi:
                    s.records.append((seq, record))
                    return
        raise AssertionError("no open shard owns the key hash")  # a broken shard map

    def _gate(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self._fail:
            code = self._fail.pop(0)
            raise JsonRESTError(code, f"injected {code}")

    def _live(self, table: str, shard_id: str) -> FakeShard:
        for s in self.tables[table]:
            if s.shard_id == shard_id and not s.gone:
                return s
        raise JsonRESTError("ResourceNotFoundException", f"shard {shard_id} not found")

    def _describe_stream(self, h: DynamoDBStreamsHandler) -> ActionResult:
        arn = h._get_param("StreamArn")
        table_name = arn.split(":", 6)[5].split("/")[1]
        with self.lock:
            self._gate("DescribeStream")
            table = dynamodb_backends[h.current_account][h.region].get_table(table_name)
            limit = min(int(h._get_param("Limit") or 100), self.describe_page_size)
            start = h._get_param("ExclusiveStartShardId")
            shards = [s for s in self.tables[table_name] if not s.gone]
            if start:
                ids = [s.shard_id for s in shards]
                shards = shards[ids.index(start) + 1:] if start in ids else []
            page = shards[:limit]
            desc: dict[str, Any] = {
                "StreamArn": arn, "StreamLabel": table.latest_stream_label,
                "StreamStatus": "ENABLED",
                "StreamViewType": table.stream_specification["StreamViewType"],  # type: ignore[index]
                "CreationRequestDateTime": table.created_at,
                "TableName": table_name, "KeySchema": table.schema,
                "Shards": [s.to_json() for s in page],
            }
            if len(shards) > limit:
                desc["LastEvaluatedShardId"] = page[-1].shard_id
        return ActionResult({"StreamDescription": desc})

    def _get_shard_iterator(self, h: DynamoDBStreamsHandler) -> ActionResult:
        arn = h._get_param("StreamArn")
        table = arn.split(":", 6)[5].split("/")[1]
        kind = h._get_param("ShardIteratorType")
        raw_seq = h._get_param("SequenceNumber")
        with self.lock:
            self._gate("GetShardIterator")
            s = self._live(table, h._get_param("ShardId"))
            newest = s.records[-1][0] if s.records else max(s.trimmed_last or 0, s.start_seq - 1)
            if kind == "TRIM_HORIZON":
                after = s.records[0][0] - 1 if s.records else newest
            elif kind == "LATEST":
                after = s.end_seq if s.end_seq is not None else newest
            elif kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
                seq = int(raw_seq)
                if seq < s.start_seq or (s.end_seq is not None and seq > s.end_seq):
                    raise JsonRESTError("ValidationException",
                                        f"sequence number {seq} is not in shard {s.shard_id}")
                after = seq - 1 if kind == "AT_SEQUENCE_NUMBER" else seq
                if s.trimmed_last is not None and after < s.trimmed_last:
                    raise JsonRESTError("TrimmedDataAccessException",
                                        f"records of {s.shard_id} before it were trimmed")
            else:
                raise JsonRESTError("ValidationException", f"bad iterator type {kind}")
            it = f"fake|{uuid.uuid4().hex}"
            self.iterators[it] = (table, s.shard_id, after)
        return ActionResult({"ShardIterator": it})

    def _get_records(self, h: DynamoDBStreamsHandler) -> ActionResult:
        it = h._get_param("ShardIterator")
        limit = int(h._get_param("Limit") or 1000)
        with self.lock:
            self._gate("GetRecords")
            if limit < 1 or limit > 1000:
                raise JsonRESTError("ValidationException", "Limit must be 1..1000")
            if it not in self.iterators:
                raise JsonRESTError("ValidationException", "invalid shard iterator")
            if self._expire:
                self._expire -= 1
                raise JsonRESTError("ExpiredIteratorException", "iterator expired")
            table, shard_id, after = self.iterators[it]
            s = self._live(table, shard_id)
            if s.trimmed_last is not None and after < s.trimmed_last:
                raise JsonRESTError("TrimmedDataAccessException", "trimmed")
            page = [rec for seq, rec in s.records if seq > after][:limit]
            last = int(page[-1]["dynamodb"]["SequenceNumber"]) if page else after
            rest = any(seq > last for seq, _ in s.records)
            out: dict[str, Any] = {"Records": page}
            at_end = s.end_seq is not None and not rest
            if not (at_end and (self.null_with_last_page or not page)):
                nxt = f"fake|{uuid.uuid4().hex}"
                self.iterators[nxt] = (table, shard_id, last)
                out["NextShardIterator"] = nxt
        return ActionResult(out)
