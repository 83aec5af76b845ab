"""Every hop's client through the fault proxy: each kind of misbehaviour is ridden out within
the retry budget, a write whose answer was lost is recognised as done, a response that fails
validation is never used, and a stalled answer ends in bounded time.

The hops, each behind its own ``FaultProxy`` (testkit/fault_proxy.py):

- the Tablestore Tunnel API: ``TablestoreTunnelService`` -> proxy -> the emulator (in this
  process, serving a store file written directly, as the service's own writers would);
- the Tablestore meta table: ``TablestoreMetaStore`` (the official SDK) -> another proxy -> the
  same emulator;
- the DynamoDB meta table: ``DynamoDBMetaStore`` (boto3) -> proxy -> a moto server.

Clients are wrapped with ``connector.retry.with_retries`` as the source wraps them (driver and
executors), so "within the budget" means what a running query gets. No Spark; the DynamoDB
meta hop's tests are marked ``slow`` (they start a moto server process), the rest run in this
process.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterator
from urllib.parse import quote

import pytest

pytest.importorskip("tablestore")

from connector.errors import TransientMetaStoreError, TransientTunnelError  # noqa: E402
from connector.local import LocalTablestore  # noqa: E402
from connector.retry import with_retries  # noqa: E402
from connector.tunnel import Checkpoint, open_tunnel_service  # noqa: E402
from connector.tunnel.base import TunnelService  # noqa: E402
from connector.tunnel.tablestore import transport  # noqa: E402
from meta_store import (  # noqa: E402
    BatchState,
    ChannelStart,
    EndCheckpoint,
    Manifest,
    MetaStore,
    open_meta_store,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.fault_proxy import FaultProxy, Kind, Rule  # noqa: E402

NS = "ep=net;table=t;tunnel=n"
#: what each hop must survive within the budget (a stall waits for a read timeout: below)
KINDS = (Kind.BARE_500, Kind.BARE_503, Kind.RESET_BEFORE, Kind.RESET_AFTER,
         Kind.RESET_AFTER_BODY, Kind.TRUNCATE, Kind.CORRUPT_BODY, Kind.BAD_SIGNATURE)
#: kinds after which the client has its answer: nothing to retry
ANSWERED = (Kind.RESET_AFTER_BODY, Kind.DELAY)
#: the source's budget for one call: the client's own retries, then connector.retry's
BUDGET_S = 30.0

#: the shared ``store`` (table ``t``), which the shared ``emulator`` (testkit/fixtures.py) serves
pytestmark = pytest.mark.store_table(channels=2, columns=[("name", "STRING"), ("qty", "INTEGER")])


@pytest.fixture
def hop(emulator: EmulatorServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(int(emulator.url.rsplit(":", 1)[1]), name="hop").start()
    try:
        yield proxy
    finally:
        proxy.stop()


def tunnel_client(url: str, **extra: str) -> TunnelService:
    query = f"instance={INSTANCE}&access_key_id={KEY_ID}&access_key_secret={SECRET}"
    query += "".join(f"&{k}={v}" for k, v in extra.items())
    return with_retries(open_tunnel_service(f"{url}?{query}"))


def tablestore_meta(url: str, **extra: str) -> MetaStore:
    query = f"endpoint={quote(url, safe='')}&create_table=true"
    query += "".join(f"&{k}={v}" for k, v in extra.items())
    return with_retries(open_meta_store(f"tablestore://{INSTANCE}/cdc_meta?{query}",
                                        {"access_key_id": KEY_ID,
                                         "access_key_secret": SECRET}))


def dynamodb_meta(url: str, **extra: str) -> MetaStore:
    query = f"region=us-east-1&endpoint_url={url}&create_table=true"
    query += "".join(f"&{k}={v}" for k, v in extra.items())
    return with_retries(open_meta_store(f"dynamodb://cdc_meta_{new_uuid()[:8]}?{query}"))


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def make_manifest(channels: int, tag: str = "a") -> Manifest:
    return Manifest(channels=tuple(
        ChannelStart(channel_id=f"ch-{i:05d}", token=f"{tag}-{i:05d}", sequence_number=i * 10,
                     max_records=1000) for i in range(channels)), planned_at=1_700_000_000.25)


def make_end(channel_id: str) -> EndCheckpoint:
    return EndCheckpoint(channel_id=channel_id, start_token="tok-0", token="tok-9",
                         sequence_number=9, records=9, attempt="host/1/task-0",
                         written_at=1_700_000_001.5)


def write_some(store: LocalTablestore, n: int, start: int = 0) -> None:
    store.batch_write("t", [("put", {"id": i}, {"name": f"n{i}", "qty": i})
                            for i in range(start, start + n)])


def assert_struck(rules: list[Rule], kind: Kind) -> None:
    """Every rule struck; a failed request is sent again and struck again (two in a row),
    unless the retry found the work done and sent nothing more (gc after a lost answer)."""
    for rule in rules:
        assert rule.applied >= 1, f"no request matched {rule}"
    if kind not in ANSWERED:
        assert sum(rule.applied == 2 for rule in rules) >= len(rules) - 1, rules


def meta_round(meta: MetaStore) -> None:
    """Every kind of meta-store request, in the driver's and executors' order: mint, plan,
    claim an end (put-if-absent), read it back, commit, push, list, gc."""
    prev, uuid = new_uuid(), new_uuid()
    meta.create_batch(NS, prev, None, manifest=make_manifest(2, "p"), state=BatchState.PLANNED)
    minted = meta.create_batch(NS, uuid, prev)
    assert minted.uuid == uuid
    assert meta.put_manifest(NS, uuid, prev, make_manifest(2)) == make_manifest(2)
    end = make_end("ch-00000")
    assert meta.put_end_checkpoint(NS, uuid, end).same_position(end)
    assert meta.get_end_checkpoint(NS, uuid, "ch-00000") == end
    assert meta.mark_committed(NS, uuid, spark_batch_id=1) == [prev, uuid]
    for _ in range(2):  # DynamoDB: a listing seeds its index, then the index is read
        assert [b.uuid for b in meta.committed_not_pushed(NS)] == [prev, uuid]
    meta.mark_pushed(NS, [prev, uuid])
    assert meta.get_batch(NS, uuid).state is BatchState.PUSHED
    assert meta.get_end_checkpoints(NS, uuid) == {"ch-00000": end}
    # what gc returns is what its last attempt deleted: an earlier attempt whose answer was
    # lost may have done the work, so the rows are what is checked
    assert meta.gc(NS, keep_committed=1) in ([prev], [])
    assert meta.find_batch(NS, prev) is None and meta.get_batch(NS, uuid).manifest is not None


# --- the tunnel hop ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_tunnel_hop_rides_out(kind: Kind, emulator: EmulatorServer, store: LocalTablestore,
                              hop: FaultProxy) -> None:
    write_some(store, 30)
    clean = tunnel_client(emulator.url)
    faulty = tunnel_client(hop.url)
    began = time.monotonic()
    # a write whose answer may be lost after it took effect: creating the tunnel
    rules = [hop.add(Rule(kind, path=r"^/tunnel/(create|describe)", times=2))]
    info = faulty.ensure_tunnel("t", "n")
    channels = [c.channel_id for c in clean.describe_tunnel("t", "n").channels]
    assert len(clean.list_tunnels("t")) == 1
    token = clean.get_checkpoint(info.tunnel_id, channels[0]).token
    expected = clean.read_records(info.tunnel_id, channels[0], token, 100)
    rules.append(hop.add(Rule(kind, path=r"^/tunnel/readrecords", times=2)))
    got = faulty.read_records(info.tunnel_id, channels[0], token, 100)
    assert got.records == expected.records and got.next_token == expected.next_token
    # a checkpoint push whose answer is lost after the service stored it
    rules.append(hop.add(Rule(kind, path=r"^/tunnel/checkpoint", times=2)))
    faulty.checkpoint(info.tunnel_id, channels[0],
                      Checkpoint(expected.next_token, len(expected.records)))
    assert clean.get_checkpoint(info.tunnel_id, channels[0]).token == expected.next_token
    assert time.monotonic() - began < BUDGET_S
    assert_struck(rules, kind)


# --- the Tablestore meta hop -------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_tablestore_meta_hop_rides_out(kind: Kind, hop: FaultProxy) -> None:
    meta = tablestore_meta(hop.url)
    began = time.monotonic()
    # two faults in a row on every request kind the meta store sends
    rules = [hop.add(Rule(kind, path=rf"^/{path}$", times=2))
             for path in ("PutRow", "UpdateRow", "GetRow", "GetRange", "BatchWriteRow")]
    meta_round(meta)
    assert time.monotonic() - began < BUDGET_S
    assert_struck(rules, kind)


# --- the DynamoDB meta hop ---------------------------------------------------------------------


@pytest.fixture
def moto_hop(moto_endpoint: str) -> Iterator[FaultProxy]:  # noqa: F811
    proxy = FaultProxy(int(moto_endpoint.rsplit(":", 1)[1]), name="dynamodb").start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.mark.slow  # moto_endpoint: a moto server process
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_dynamodb_meta_hop_rides_out(kind: Kind, moto_hop: FaultProxy) -> None:
    meta = dynamodb_meta(moto_hop.url)
    began = time.monotonic()
    rules = [moto_hop.add(Rule(kind, target=rf"\.{operation}$", times=2))
             for operation in ("PutItem", "UpdateItem", "GetItem", "Query", "BatchGetItem",
                               "BatchWriteItem")]
    meta_round(meta)
    assert time.monotonic() - began < BUDGET_S
    assert_struck(rules, kind)


# --- no call can hang: a stalled answer ends at the client's read timeout ----------------------


def test_tunnel_client_stall_ends_in_bounded_time(monkeypatch: pytest.MonkeyPatch,
                                                  emulator: EmulatorServer,
                                                  hop: FaultProxy) -> None:
    monkeypatch.setattr(transport, "READ_TIMEOUT_S", 1.0)
    client = tunnel_client(hop.url, retry_deadline_s="0.5")
    hop.add(Rule(Kind.STALL, times=1))
    began = time.monotonic()
    assert client.list_tunnels("t") == []  # the stalled attempt timed out, the next answered
    assert 1.0 <= time.monotonic() - began < 10
    hop.window(Kind.STALL, 60)
    began = time.monotonic()
    with pytest.raises(TransientTunnelError, match="/tunnel/list.*[Tt]imed? ?out"):
        client.list_tunnels("t")
    assert time.monotonic() - began < 20


def test_tablestore_meta_stall_ends_in_bounded_time(hop: FaultProxy) -> None:
    meta = tablestore_meta(hop.url, socket_timeout="1", max_attempts="2")
    hop.add(Rule(Kind.STALL, path="^/GetRow$", times=1))
    began = time.monotonic()
    assert meta.find_batch(NS, "nothing") is None
    assert 1.0 <= time.monotonic() - began < 10
    hop.window(Kind.STALL, 60)
    began = time.monotonic()
    with pytest.raises(TransientMetaStoreError, match=r"Tablestore get_batch .*127\.0\.0\.1"):
        meta.find_batch(NS, "nothing")
    assert time.monotonic() - began < 30


@pytest.mark.slow  # moto_endpoint: a moto server process
def test_dynamodb_meta_stall_ends_in_bounded_time(moto_hop: FaultProxy) -> None:
    meta = dynamodb_meta(moto_hop.url, read_timeout="1", max_attempts="2")
    moto_hop.add(Rule(Kind.STALL, target=r"\.GetItem$", times=1))
    began = time.monotonic()
    assert meta.find_batch(NS, "nothing") is None
    assert 1.0 <= time.monotonic() - began < 10
    moto_hop.window(Kind.STALL, 60)
    began = time.monotonic()
    with pytest.raises(TransientMetaStoreError, match=r"DynamoDB get_batch .*127\.0\.0\.1"):
        meta.find_batch(NS, "nothing")
    assert time.monotonic() - began < 30


# --- a response that fails validation is never used --------------------------------------------


def test_a_corrupted_read_is_never_delivered(emulator: EmulatorServer, store: LocalTablestore,
                                             hop: FaultProxy) -> None:
    """Every answer to a read corrupted: the client refuses them all (it never returns a
    record the service did not send), and the error names the hop and the check."""
    write_some(store, 10)
    clean = tunnel_client(emulator.url)
    info = clean.ensure_tunnel("t", "n")
    channel = clean.describe_tunnel("t", "n").channels[0].channel_id
    token = clean.get_checkpoint(info.tunnel_id, channel).token
    hop.window(Kind.CORRUPT_BODY, 60, path="^/tunnel/readrecords")
    faulty = tunnel_client(hop.url)
    with pytest.raises(Exception, match="contentmd5") as failure:
        faulty.read_records(info.tunnel_id, channel, token, 100)
    assert hop.url.split("//")[1] in str(failure.value)


# --- the DynamoDB Streams hop (the tunnel and its checkpoint table on moto) ---------------------


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy]]:
    """A moto server in this process with the Streams shard map patched in, behind a proxy."""
    from moto.server import ThreadedMotoServer

    from testkit.dynamodb_streams_fake import StreamsFake

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    fake = StreamsFake().install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = "http://{}:{}".format(*server.get_host_and_port())
    import boto3
    import requests

    requests.post(f"{url}/moto-api/reset", timeout=10)  # moto's state lives in this process
    fake.reset()

    ddb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")
    ddb.create_table(TableName="t", BillingMode="PAY_PER_REQUEST",
                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                     StreamSpecification={"StreamEnabled": True,
                                          "StreamViewType": "NEW_AND_OLD_IMAGES"})
    fake.attach("t", 2)
    for i in range(30):
        ddb.put_item(TableName="t", Item={"id": {"S": f"k{i}"}, "v": {"N": str(i)}})
    proxy = FaultProxy(int(url.rsplit(":", 1)[1]), name="streams").start()
    try:
        yield url, proxy
    finally:
        proxy.stop()
        server.stop()
        fake.uninstall()


#: moto sends no x-amz-crc32 with DynamoDB Streams answers (nor, as far as botocore checks, does
#: the service: its answers' integrity is TLS's), so a byte flipped in a body of the right length
#: cannot be told from a real answer here; a truncated one can (Content-Length)
STREAMS_KINDS = tuple(k for k in KINDS if k not in (Kind.CORRUPT_BODY, Kind.BAD_SIGNATURE))


@pytest.mark.parametrize("kind", STREAMS_KINDS, ids=lambda k: k.value)
def test_dynamodb_streams_hop_rides_out(kind: Kind, streams: tuple[str, FaultProxy]) -> None:
    url, hop = streams
    table = f"cdc-{new_uuid()[:8]}"

    def service(endpoint: str) -> TunnelService:
        return with_retries(open_tunnel_service(
            f"dynamodb-streams://?checkpoint_table={table}&region=us-east-1"
            f"&endpoint_url={endpoint}&create_table=true&poll_interval_ms=0"))

    clean, faulty = service(url), service(hop.url)
    began = time.monotonic()
    rules = [hop.add(Rule(kind, target=rf"\.{operation}$", times=2))
             for operation in ("PutItem", "DescribeStream", "GetShardIterator", "GetRecords",
                               "UpdateItem")]
    info = faulty.ensure_tunnel("t", "n")
    assert [t.tunnel_id for t in clean.list_tunnels("t")] == [info.tunnel_id]
    channel = clean.describe_tunnel("t", "n").channels[0].channel_id
    token = clean.get_checkpoint(info.tunnel_id, channel).token
    expected = clean.read_records(info.tunnel_id, channel, token, 100)
    got = faulty.read_records(info.tunnel_id, channel, token, 100)
    assert got.records == expected.records and got.next_token == expected.next_token
    faulty.checkpoint(info.tunnel_id, channel,
                      Checkpoint(expected.next_token, len(expected.records)))
    assert clean.get_checkpoint(info.tunnel_id, channel).token == expected.next_token
    assert time.monotonic() - began < BUDGET_S
    assert_struck([r for r in rules if r.matched], kind)
    assert sum(r.applied for r in rules) >= 3
