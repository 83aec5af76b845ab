"""The DynamoDB Streams tunnel backend against a moto server on 127.0.0.1.

- ``TestDynamoDbStreamsContract``: the shared tunnel contract (tests/contract/tunnel_contract.py)
  on moto with the shard map of ``testkit/dynamodb_streams_fake.py`` (moto alone has one shard
  and no lineage). Writes go through boto3 to moto's DynamoDB; merges do not exist in DynamoDB
  Streams (a shard has one parent), so the tests needing them are skipped.
- Lineage beyond the contract: rollover chains, splits of splits, a parent that aged out,
  paginated DescribeStream, null ``NextShardIterator`` one call late.
- The service's limits: expired iterators, throttling, trimming, 1,000 records per call.
- The codec: types, stream view types, tokens, URIs; plain moto (no shard map).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connector.errors import (
    OptionError,
    StreamNotEnabledError,
    TransientTunnelError,
    TrimmedDataError,
    TunnelRequestError,
)
from connector.tunnel import open_tunnel_service
from connector.tunnel.base import (
    FINISHED,
    ChannelLag,
    ChannelStatus,
    Checkpoint,
    Op,
    StartPosition,
    TunnelType,
)
from connector.tunnel.dynamodb_streams import codec
from connector.tunnel.dynamodb_streams.service import DynamoDbStreamsTunnelService
from connector.tunnel.page import PageLayout
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import rows_by_key, verify
from testkit.aws import AWS_TEST_ENV
from testkit.dynamodb_streams_fake import StreamsFake
from testkit.tunnel_harnesses import REGION, StreamsHarness
from testkit.waiting import wait_until
from tests.contract.tunnel_contract import TunnelContract, consume, per_key, read_all

pytestmark = pytest.mark.usefixtures("aws_test_credentials")  # boto3 reads them


@pytest.fixture
def tunnel_harness(moto_url: str, streams_fake: StreamsFake) -> Iterator[StreamsHarness]:
    h = StreamsHarness(moto_url, streams_fake)
    yield h
    h.close()


class TestDynamoDbStreamsContract(TunnelContract):
    def test_base_and_stream_snapshot_boundary(self, tunnel_harness: Any) -> None:
        """DynamoDB Streams has no base data: a BaseAndStream tunnel is refused by name."""
        tunnel_harness.create_table("t", 1)
        with pytest.raises(OptionError) as exc:
            tunnel_harness.service.create_tunnel("t", "tun", TunnelType.BASE_AND_STREAM)
        assert exc.value.fields["option"] == "tunnel.type"
        assert tunnel_harness.service.list_tunnels("t") == []


# --- lineage on the shard map ------------------------------------------------------------------


def _statuses(h: StreamsHarness, name: str = "tun") -> dict[str, ChannelStatus]:
    return {c.channel_id: c.status for c in h.service.describe_tunnel("t", name).channels}


def test_rollover_chain_and_split_of_split_keep_per_key_order(
    tunnel_harness: StreamsHarness,
) -> None:
    """Writes interleaved with rollovers and splits of children; the reference consumer
    (children only after their parent's FINISHED push) sees every change once, in key order."""
    h = tunnel_harness
    h.create_table("t", 2)
    h.service.create_tunnel("t", "tun")
    keys = [f"k{i}" for i in range(20)]
    expected: dict[str, list[tuple[str, Any]]] = {k: [] for k in keys}
    for k in keys:
        h.put("t", k, 0)
        expected[k].append(("PUT", 0))
    for n in range(1, 6):
        # reshape: roll one open shard over, split another
        open_now = h.fake.open_shards("t")
        h.fake.rollover("t", open_now[0])
        if len(open_now) > 1:
            h.split("t", open_now[-1])
        for i, k in enumerate(keys):
            if (i + n) % 4 == 0:
                h.delete("t", k)
                h.put("t", k, n)
                expected[k] += [("DELETE", None), ("PUT", n)]
            else:
                h.update("t", k, n)
                expected[k].append(("UPDATE", n))
    state = consume(h.service, "t", "tun", limit=3)
    assert per_key(state.records) == expected
    shards = h.service.describe_tunnel("t", "tun").channels
    assert len(shards) > 10 and any(len(c.parent_ids) == 1 for c in shards)
    closed = {s.shard_id for s in h.fake.tables["t"] if s.end_seq is not None}
    assert all(c.status is ChannelStatus.TERMINATED for c in shards if c.channel_id in closed)
    assert all(c.status is ChannelStatus.OPEN for c in shards if c.channel_id not in closed)


def test_parent_aged_out_of_the_stream_counts_as_finished(
    tunnel_harness: StreamsHarness,
) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    h.service.create_tunnel("t", "tun")
    (root,) = h.fake.open_shards("t")
    child = h.fake.rollover("t", root)
    assert _statuses(h) == {root: ChannelStatus.OPEN, child: ChannelStatus.WAIT}
    h.fake.expire_shard("t", root)
    assert _statuses(h) == {child: ChannelStatus.OPEN}
    tid = h.service.describe_tunnel("t", "tun").tunnel.tunnel_id
    h.put("t", "a", 1)
    fresh = open_tunnel_service(h.uri)  # as an executor would
    got, _ = read_all(fresh, tid, child, h.service.get_checkpoint(tid, child).token)
    assert per_key(got) == {"a": [("PUT", 1)]}


def test_describe_stream_pagination(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 5)
    h.fake.describe_page_size = 2
    h.service.create_tunnel("t", "tun")
    before = h.fake.calls.get("DescribeStream", 0)
    assert len(_statuses(h)) == 5
    assert h.fake.calls["DescribeStream"] - before == 3  # pages of 2, 2, 1


def test_null_next_iterator_one_call_after_the_last_record(
    tunnel_harness: StreamsHarness,
) -> None:
    h = tunnel_harness
    h.fake.null_with_last_page = False
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.put("t", "a", 1)
    h.fake.rollover("t", root)
    records, token = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)
    assert [r.primary_key["id"] for r in records] == ["a"] and token == FINISHED
    h.service.checkpoint(tid, root, Checkpoint(FINISHED, 2))
    assert ChannelStatus.OPEN in _statuses(h).values()


def test_finished_push_survives_a_new_client(tunnel_harness: StreamsHarness) -> None:
    """Tunnels and checkpoints live in the checkpoint table, not in the client."""
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.put("t", "a", 1)
    a, b = h.split("t", root)
    records, token = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)
    assert token == FINISHED
    other = open_tunnel_service(h.uri)
    other.checkpoint(tid, root, Checkpoint(FINISHED, 2))
    assert _statuses(h) == {root: ChannelStatus.TERMINATED, a: ChannelStatus.OPEN,
                            b: ChannelStatus.OPEN}
    # an executor's first read of a released child checks the parent with one GetItem, no
    # DescribeStream
    token = h.service.get_checkpoint(tid, a).token
    executor = open_tunnel_service(h.uri)
    h.fake.calls.clear()
    assert executor.read_records(tid, a, token, 10).records == []
    assert "DescribeStream" not in h.fake.calls


def test_latest_tunnel_on_a_trimmed_open_shard(tunnel_harness: StreamsHarness) -> None:
    """Creating a LATEST tunnel reads each open shard to its tip, past trimmed records."""
    h = tunnel_harness
    h.create_table("t", 1)
    (root,) = h.fake.open_shards("t")
    h.put("t", "a", 1)
    h.put("t", "b", 2)
    h.trim("t")
    h.put("t", "c", 3)
    tid = h.service.create_tunnel("t", "late", start_position=StartPosition.LATEST).tunnel_id
    h.put("t", "d", 4)
    got, _ = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)
    assert per_key(got) == {"d": [("PUT", 4)]}


# --- limits ----------------------------------------------------------------------------------


def test_expired_iterator_is_fetched_again(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    for i in range(5):
        h.put("t", f"k{i}", i)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    token = h.service.get_checkpoint(tid, root).token
    first = h.service.read_records(tid, root, token, 2)
    h.fake.expire_next(2)
    res = h.service.read_records(tid, root, first.next_token, 10)
    assert [r.primary_key["id"] for r in res.records] == ["k2", "k3", "k4"]


def test_throttling_is_retried_then_transient(moto_url: str, streams_fake: StreamsFake) -> None:
    h = StreamsHarness(moto_url, streams_fake, extra="&max_attempts=3")
    h.create_table("t", 1)
    h.put("t", "a", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    token = h.service.get_checkpoint(tid, root).token
    h.fake.fail_next(2)  # botocore's own retries absorb these (3 attempts)
    assert len(h.service.read_records(tid, root, token, 10).records) == 1
    h.fake.fail_next(3)
    with pytest.raises(TransientTunnelError) as exc:
        h.service.read_records(tid, root, token, 10)
    assert exc.value.retryable and "LimitExceededException" in str(exc.value)


def test_get_records_never_asks_for_more_than_1000(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    for i in range(1203):
        h.put("t", f"k{i}", i)
    token = h.service.get_checkpoint(tid, root).token
    calls = h.fake.calls.get("GetRecords", 0)
    res = h.service.read_records(tid, root, token, 1500)  # the fake refuses Limit > 1000
    assert len(res.records) == 1203 and res.may_more is False
    assert h.fake.calls["GetRecords"] - calls == 3  # 1000 + 203 + one empty page


def test_trimmed_shard_start_and_whole_shard_gone(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.put("t", "a", 1)
    records, token = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)
    h.put("t", "b", 2)
    h.fake.rollover("t", root)
    h.fake.expire_shard("t", root)
    with pytest.raises(TrimmedDataError) as exc:  # "b" was never read: lost
        h.service.read_records(tid, root, token, 10)
    assert exc.value.resume_token == FINISHED
    # a commit after the shard aged out still records the position it had reached
    h.service.checkpoint(tid, root, Checkpoint(token, 1))
    assert h.service.get_checkpoint(tid, root) == Checkpoint(token, 1)


def test_idle_probes_are_spaced_by_poll_interval(
    moto_url: str, streams_fake: StreamsFake
) -> None:
    h = StreamsHarness(moto_url, streams_fake, poll_interval_ms=60_000)
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    pos = {root: h.service.get_checkpoint(tid, root).token}
    assert h.service.has_new_data(tid, pos) is False
    calls = dict(h.fake.calls)
    h.put("t", "a", 1)
    assert h.service.has_new_data(tid, pos) is False  # the idle answer stands: no request
    assert h.fake.calls == calls
    h.service.checkpoint(tid, root, Checkpoint(pos[root], 0))  # a push ends the quiet spell
    assert h.service.has_new_data(tid, pos) is True
    h.fake.calls.clear()
    assert h.service.has_new_data(tid, {}) is True  # other positions: asked again
    assert h.fake.calls.get("DescribeStream") == 1


def test_lag_is_the_age_of_the_oldest_unread_record(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    start = h.service.get_checkpoint(tid, root).token
    assert h.service.lag(tid, {}) == {root: ChannelLag(root, 0, 0.0)}
    h.put("t", "a", 1)
    time.sleep(0.3)  # let time pass: the lag asserted is the record's age on the wall clock
    behind = h.service.lag(tid, {root: start})[root]
    assert behind.records_behind == 1 and behind.exact  # counted: the tip came first
    assert 0.2 <= behind.seconds_behind < 60
    _, token = read_all(h.service, tid, root, start)
    assert h.service.lag(tid, {root: token})[root].seconds_behind == 0.0


def test_head_sequences_read_each_shard_to_its_tip(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    assert h.service.head_sequences(tid) == {root: ""}
    for i in range(3):
        h.put("t", f"k{i}", i)
    a, b = h.split("t", root)
    h.put("t", "k9", 9)
    heads = h.service.head_sequences(tid)
    newest = {sid: codec.padded(raw["dynamodb"]["SequenceNumber"])
              for sid, raw in h.fake.held("t")}  # the last one per shard wins
    assert heads == {root: newest[root], a: newest.get(a, ""), b: newest.get(b, "")}
    assert sorted(v for v in heads.values() if v) == sorted(newest.values())


# --- records and types -------------------------------------------------------------------------


def test_types_and_images(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.ddb.put_item(TableName="t", Item={
        "id": {"S": "a"}, "n": {"N": "1.5"}, "s": {"S": "x"}, "b": {"B": b"\x00\xff"},
        "ok": {"BOOL": True}, "nil": {"NULL": True},
        "m": {"M": {"z": {"N": "2"}, "a": {"L": [{"S": "q"}, {"N": "3.25"}]}}},
        "ss": {"SS": ["b", "a"]}, "ns": {"NS": ["10", "9"]}, "bs": {"BS": [b"\x02", b"\x01"]},
    })
    h.ddb.update_item(TableName="t", Key={"id": {"S": "a"}},
                      UpdateExpression="SET n = :n REMOVE s",
                      ExpressionAttributeValues={":n": {"N": "2"}})
    h.delete("t", "a")
    records, _ = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)
    put, update, delete = records
    assert [r.op for r in records] == [Op.PUT, Op.UPDATE, Op.DELETE]
    assert put.primary_key == {"id": "a"} and put.before is None
    assert put.columns["n"] == 1.5 and put.columns["s"] == "x"
    assert put.columns["b"] == b"\x00\xff" and put.columns["ok"] is True
    assert put.columns["nil"] is None
    assert json.loads(put.columns["m"]) == {"a": ["q", 3.25], "z": 2}
    assert json.loads(put.columns["ss"]) == ["a", "b"]
    assert json.loads(put.columns["ns"]) == [9, 10]
    assert json.loads(put.columns["bs"]) == [{"$binary": "AQ=="}, {"$binary": "Ag=="}]
    assert update.before is not None and update.before["s"] == "x"
    assert update.columns["s"] is None and update.columns["n"] == 2.0
    assert update.after_image() is not None and "s" not in update.after_image()  # type: ignore[operator]
    assert delete.columns == {} and delete.before is not None and delete.before["n"] == 2.0
    seqs = [r.sequence for r in records]
    assert seqs == sorted(seqs) and all(len(s) == codec.SEQUENCE_DIGITS for s in seqs)
    assert all(r.channel_id == root and r.commit_ts_us > 0 for r in records)


@pytest.mark.parametrize("view", ["KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE"])
def test_stream_view_types(moto_url: str, streams_fake: StreamsFake, view: str) -> None:
    h = StreamsHarness(moto_url, streams_fake, view=view)
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.put("t", "a", 1)
    h.update("t", "a", 2)
    h.delete("t", "a")
    put, update, delete = read_all(h.service, tid, root,
                                   h.service.get_checkpoint(tid, root).token)[0]
    assert all(r.primary_key == {"id": "a"} for r in (put, update, delete))
    new = view == "NEW_IMAGE"
    assert put.columns == ({"value": 1.0} if new else {})
    assert update.columns == ({"value": 2.0} if new else {}) and update.before is None
    assert delete.before == ({"value": 2.0} if view == "OLD_IMAGE" else None)


def test_numbers_as_decimal(moto_url: str, streams_fake: StreamsFake) -> None:
    h = StreamsHarness(moto_url, streams_fake, extra="&numbers=decimal")
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.ddb.put_item(TableName="t", Item={"id": {"S": "a"},
                                        "big": {"N": "12345678901234567890.123456789"}})
    (put,) = read_all(h.service, tid, root, h.service.get_checkpoint(tid, root).token)[0]
    assert put.columns["big"] == Decimal("12345678901234567890.123456789")


@pytest.mark.parametrize("numbers", ["double", "decimal"])
def test_pages_fit_numbers_to_the_declared_columns(
    moto_url: str, streams_fake: StreamsFake, numbers: str
) -> None:
    """The executor's page path: a number lands as the declared column's type (double or
    decimal), and numbers in ``_before`` / ``_extra`` are JSON numbers in either mode."""
    h = StreamsHarness(moto_url, streams_fake, extra=f"&numbers={numbers}")
    h.create_table("t", 1)
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (root,) = h.fake.open_shards("t")
    h.ddb.put_item(TableName="t", Item={"id": {"S": "a"}, "price": {"N": "0.1"},
                                        "qty": {"N": "3"}, "w": {"N": "2.5"}})
    h.ddb.put_item(TableName="t", Item={"id": {"S": "a"}, "price": {"N": "0.2"},
                                        "qty": {"N": "4"}, "w": {"N": "7"}})
    layout = PageLayout((("id", pa.string()), ("price", pa.decimal128(38, 9)),
                         ("qty", pa.int64()), ("w", pa.float64())))
    page = h.service.read_page(tid, root, h.service.get_checkpoint(tid, root).token, 10, layout)
    rows = page.batch.to_pylist()
    assert [r["price"] for r in rows] == [Decimal("0.1"), Decimal("0.2")]
    assert [r["qty"] for r in rows] == [3, 4] and [r["w"] for r in rows] == [2.5, 7.0]
    assert json.loads(rows[1]["_before"]) == {"price": 0.1, "qty": 3, "w": 2.5}
    bare = PageLayout((("id", pa.string()),))
    page = h.service.read_page(tid, root, h.service.get_checkpoint(tid, root).token, 1, bare)
    assert json.loads(page.batch.to_pylist()[0]["_extra"]) == {"price": 0.1, "qty": 3, "w": 2.5}


def test_key_schema_from_describe_table(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.ddb.create_table(
        TableName="orders", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "day", "KeyType": "RANGE"},
                   {"AttributeName": "shop", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "shop", "AttributeType": "B"},
                              {"AttributeName": "day", "AttributeType": "N"}],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    )
    schema = h.service.table_schema("orders")
    assert [(c.name, c.type) for c in schema.primary_key] == [("shop", "BINARY"),
                                                              ("day", "DOUBLE")]


def test_table_without_stream_is_refused(tunnel_harness: StreamsHarness) -> None:
    h = tunnel_harness
    h.ddb.create_table(
        TableName="plain", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
    )
    with pytest.raises(StreamNotEnabledError):
        h.service.create_tunnel("plain", "tun")


def test_plain_moto_single_shard(moto_url: str, streams_fake: StreamsFake) -> None:
    """Without the shard map: moto's own single shard, whose iterator is never null."""
    h = StreamsHarness(moto_url, streams_fake)
    h.ddb.create_table(
        TableName="t", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    early = h.service.create_tunnel("t", "early").tunnel_id
    h.put("t", "a", 1)
    h.update("t", "a", 2)
    late = h.service.create_tunnel("t", "late", start_position=StartPosition.LATEST).tunnel_id
    h.delete("t", "a")
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "early").channels]
    got, token = read_all(h.service, early, cid, h.service.get_checkpoint(early, cid).token)
    assert per_key(got) == {"a": [("PUT", 1), ("UPDATE", 2), ("DELETE", None)]}
    assert token != FINISHED
    assert h.service.has_new_data(early, {cid: token}) is False
    got_late, _ = read_all(h.service, late, cid, h.service.get_checkpoint(late, cid).token)
    assert per_key(got_late) == {"a": [("DELETE", None)]}


# --- URIs and tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("uri, words", [
    ("dynamodb-streams://?region=us-east-1", "checkpoint_table"),
    ("dynamodb-streams://?checkpoint_table=c&aws_secret_access_key=WJALR", "credential"),
    ("dynamodb-streams://AKIA:WJALR@t?checkpoint_table=c", "credentials"),
    ("dynamodb-streams://?checkpoint_table=c&numbers=int", "numbers"),
    ("dynamodb-streams://?checkpoint_table=c&endpoint_url=ftp://x", "endpoint_url"),
    ("dynamodb-streams://?checkpoint_table=c&colour=red", "unknown parameter"),
])
def test_bad_uris_are_refused(uri: str, words: str) -> None:
    with pytest.raises(OptionError) as exc:
        open_tunnel_service(uri)
    assert words in str(exc.value) and "WJALR" not in str(exc.value)


def test_uri_table_restricts_the_endpoint(moto_url: str) -> None:
    service = DynamoDbStreamsTunnelService(
        f"dynamodb-streams://orders?checkpoint_table=c&region={REGION}&endpoint_url={moto_url}")
    with pytest.raises(OptionError) as exc:
        service.table_schema("other")
    assert exc.value.fields["option"] == "table.name"


def test_tokens_roundtrip_and_refuse_junk() -> None:
    start = codec.start_token("shardId-1", "100")
    after = codec.after_token("shardId-1", "123")
    assert codec.parse_token(start, "c").iterator_args() == {
        "ShardIteratorType": "AT_SEQUENCE_NUMBER", "SequenceNumber": "100"}
    assert codec.parse_token(after, "c").iterator_args()["ShardIteratorType"] == \
        "AFTER_SEQUENCE_NUMBER"
    assert codec.parse_token(codec.horizon_token("shardId-1"), "c").kind == "T"
    child = codec.parse_token(codec.start_token("shardId-2", "200", "shardId-1"), "c")
    assert (child.kind, child.parent_id) == ("S", "shardId-1")
    assert codec.padded("123") == "0" * 37 + "123"
    for bad in ("", "ddbs1:s:A:", "ddbs1:s:X:1", "ddbs1:s:T:5", "local:1", None,
                "ddbs1:s:A:5:p", "ddbs1:s:S:5:", "ddbs1:s:S:5:p:q"):
        with pytest.raises(Exception) as exc:
            codec.parse_token(bad, "c")
        assert type(exc.value).__name__ == "MalformedTokenError"


def test_missing_checkpoint_table_is_a_request_error(moto_url: str) -> None:
    service = DynamoDbStreamsTunnelService(
        f"dynamodb-streams://?checkpoint_table=nope-{uuid.uuid4().hex[:6]}&region={REGION}"
        f"&endpoint_url={moto_url}")
    with pytest.raises(TunnelRequestError) as exc:
        service.list_tunnels("t")
    assert "create_table=true" in str(exc.value)


# --- on the shared local Spark ---------------------------------------------------------------


@pytest.fixture
def spark_with_aws(spark: Any) -> Iterator[Any]:
    """The shared session, its Python workers given (dummy) AWS credentials the way
    ``spark.executorEnv.*`` gives them: the workers' environment was fixed when the session
    started, and a registered data source carries the context's environment to them."""
    from connector import register

    env = spark.sparkContext.environment
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    env.update({name: AWS_TEST_ENV[name] for name in names})
    register(spark)
    try:
        yield spark
    finally:
        for query in spark.streams.active:
            query.stop()
        for name in names:
            env.pop(name, None)
        register(spark)


@pytest.mark.slow
def test_spark_stream_with_declared_schema_across_a_split(
    spark_with_aws: Any, tmp_path: Path, tunnel_harness: StreamsHarness
) -> None:
    """format("tablestore") on this endpoint: attributes declared with ``.schema(...)`` become
    typed columns, the rest go to ``_extra``; writes and a split while the query runs; every
    change exactly once, in order per key, state equal to a Scan."""
    h = tunnel_harness
    h.create_table("t", 2)
    for i in range(40):
        h.ddb.put_item(TableName="t", Item={"id": {"S": f"k{i % 10}"}, "qty": {"N": str(i)},
                                            "tag": {"SS": ["x", f"t{i}"]}})
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    query = (spark_with_aws.readStream.format("tablestore").option("endpoint", h.uri)
             .option("table.name", "t").option("tunnel.name", "q")
             .option("meta.store", f"sqlite://{tmp_path / 'meta.db'}")
             .option("maxOffsetsPerChannel", "15")
             .schema("id string, qty double, _op string, _channel_id string, _sequence string, "
                     "_commit_ts timestamp, _before string, _extra string")
             .load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        h.split("t", h.fake.open_shards("t")[0])
        for i in range(40, 70):
            if i % 4 == 0:
                h.delete("t", f"k{i % 10}")
            else:
                h.update("t", f"k{i % 10}", i)
        expected = len(h.fake.held("t"))
        wait_until(f"{expected} changes in the sink",
                   lambda: sum(1 for _ in sink.deliveries(["id"])),
                   lambda delivered: delivered >= expected, timeout=120, interval=0.25,
                   query=query)
    finally:
        query.stop()
    rows = [r for b in sink.committed_batches()
            for r in pq.read_table(sink.batch_dir(b)).to_pylist()]
    first = next(r for r in rows if r["id"] == "k0" and r["_op"] == "PUT")
    assert isinstance(first["qty"], float)
    # a set is JSON text (a string attribute), so inside _extra it is a JSON string
    assert json.loads(json.loads(first["_extra"])["tag"]) == ["t0", "x"]
    change_log = h.change_log("t")
    items = h.ddb.scan(TableName="t", ConsistentRead=True)["Items"]
    state = rows_by_key(({"id": i["id"]["S"]}, codec.decode_item(i, skip=frozenset({"id"})))
                        for i in items)
    result = verify(change_log, sink.deliveries(["id"]), state)
    assert result.ok, f"{result.summary()} {result.examples}"
