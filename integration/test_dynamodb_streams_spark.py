"""DynamoDB Streams on a real local Spark: shards roll over and split, the driver is SIGKILLed,
the query restarts, and every change arrives exactly once, in order per key.

The moto server runs in this test process on 127.0.0.1 with the shard map of
``testkit/dynamodb_streams_fake.py`` patched in (moto alone has one shard and no lineage); the
test writes through boto3 to a DynamoDB table on it. The query runs in its own process
(testkit/runner.py, a real local Spark) reading ``dynamodb-streams://`` into an
``ExactlyOnceParquetSink``, with a SQLite meta store. It is parked at crash points
(testkit/crash_points.py) and killed with SIGKILL (driver and Python workers); shards roll over and
split while it is down and while it runs. At the end the sink is compared with every record the
stream holds (``tablestore_cdc.verify``): nothing lost, nothing doubled, per-key order, and the
table materialized from the sink equals a Scan of the DynamoDB table.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from connector.tunnel.dynamodb_streams import codec
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import rows_by_key, verify
from testkit.aws import AWS_TEST_ENV, threaded_moto_server
from testkit.crash_points import environment as crash_environment
from testkit.dynamodb_streams_fake import StreamsFake
from testkit.processes import kill_at_crash_point, kill_tree, start_runner
from testkit.waiting import wait_until

pytestmark = pytest.mark.slow

REGION = AWS_TEST_ENV["AWS_DEFAULT_REGION"]
AWS_ENV = {name: AWS_TEST_ENV[name]
           for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
KEYS = 60


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, StreamsFake]]:
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    fake = StreamsFake().install()
    try:
        with threaded_moto_server() as url:
            yield url, fake
    finally:
        fake.uninstall()


def write_changes(ddb: Any, start: int, n: int) -> None:
    """PUT / UPDATE / DELETE over ``KEYS`` keys through boto3 (moto's DynamoDB)."""
    for i in range(start, start + n):
        key = {"id": {"S": f"k{i % KEYS:03d}"}}
        if i % 7 == 3:
            ddb.delete_item(TableName="t", Key=key)
        elif i % 3 == 1:
            ddb.update_item(TableName="t", Key=key,
                            UpdateExpression="SET qty = :q",
                            ExpressionAttributeValues={":q": {"N": str(i)}})
        else:
            ddb.put_item(TableName="t", Item={**key, "name": {"S": f"n{i}"},
                                              "qty": {"N": str(i)}})


def delivered(sink: ExactlyOnceParquetSink) -> int:
    return sum(1 for _ in sink.deliveries(["id"]))


def reshape(fake: StreamsFake, step: int) -> None:
    """Roll one open shard over and split another, as the service does over hours."""
    open_now = fake.open_shards("t")
    fake.rollover("t", open_now[step % len(open_now)])
    open_now = fake.open_shards("t")
    fake.split("t", open_now[(step + 1) % len(open_now)])


def create_table(url: str, fake: StreamsFake, shards: int) -> Any:
    ddb = boto3.client("dynamodb", endpoint_url=url, region_name=REGION)
    ddb.create_table(
        TableName="t", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    fake.attach("t", shards)
    return ddb


def runner_args(tmp_path: Path, url: str, sink: ExactlyOnceParquetSink) -> list[str]:
    endpoint = (f"dynamodb-streams://t?checkpoint_table=cdc-tunnels&region={REGION}"
                f"&endpoint_url={url}&create_table=true")
    return ["--endpoint", endpoint, "--table", "t", "--tunnel", "q",
            "--meta-store", f"sqlite://{tmp_path / 'meta.db'}",
            "--checkpoint", str(tmp_path / "ckpt"), "--sink", str(sink.path),
            "--stop-file", str(tmp_path / "stop"), "--option", "maxOffsetsPerChannel=40"]


def check_exactly_once(ddb: Any, fake: StreamsFake, sink: ExactlyOnceParquetSink) -> None:
    """The sink against every record the stream holds and against a Scan of the table."""
    change_log = [codec.decode_record(raw, sid, "") for sid, raw in fake.held("t")]
    items = ddb.scan(TableName="t", ConsistentRead=True)["Items"]
    rows = [({"id": i["id"]["S"]}, codec.decode_item(i, skip=frozenset({"id"})) or {})
            for i in items]
    result = verify(change_log, sink.deliveries(["id"]), rows_by_key(rows))
    print(result.summary(), file=sys.stderr)
    assert result.ok, f"{result.summary()} {result.examples}"


@pytest.mark.extended  # the default suite's kills: test_replicate_kill, test_tablestore_e2e
def test_sigkill_and_restart_with_rolling_and_splitting_shards(
    tmp_path: Path, moto: tuple[str, StreamsFake]
) -> None:
    url, fake = moto
    ddb = create_table(url, fake, 3)
    write_changes(ddb, 0, 300)
    faults = tmp_path / "faults"
    faults.mkdir()
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args = runner_args(tmp_path, url, sink)
    env = {**crash_environment(faults), **AWS_ENV}
    log = tmp_path / "runner.log"

    # 1. SIGKILL at two protocol steps; reshape the shard map and write while the query is down
    for step, point in enumerate(("mid_read", "after_sink_write")):
        killed = kill_at_crash_point(args, log, env, faults, point, timeout=240)
        assert killed >= 2, "the driver and its Python workers should have been killed"
        write_changes(ddb, 300 + 100 * step, 100)
        reshape(fake, step)

    # 2. restart; reshape and write while it runs; run until everything is delivered
    runner = start_runner(args, log, env)
    try:
        wait_until("the backlog of 500 changes delivered", lambda: delivered(sink),
                   lambda n: n >= 500, timeout=240, process=runner)
        write_changes(ddb, 500, 100)
        reshape(fake, 2)
        write_changes(ddb, 600, 60)
        expected = len(fake.held("t"))
        wait_until(f"{expected} changes delivered", lambda: delivered(sink),
                   lambda n: n >= expected, timeout=240, process=runner)
        (tmp_path / "stop").touch()
        assert runner.wait(120) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)

    check_exactly_once(ddb, fake, sink)
    shards = fake.tables["t"]
    assert sum(s.end_seq is not None for s in shards) >= 6  # rolled over and split
    assert len({d.channel_id for d in sink.deliveries(["id"])}) >= 8
    replays = sink.replays()
    assert replays and all(r["identical"] for r in replays), replays


def test_available_now_reads_to_the_heads_and_stops(
    tmp_path: Path, moto: tuple[str, StreamsFake]
) -> None:
    """Trigger.AvailableNow: the run reads every shard up to its newest record at the start,
    through closed parents into their children, and stops by itself."""
    url, fake = moto
    ddb = create_table(url, fake, 2)
    write_changes(ddb, 0, 150)
    reshape(fake, 0)
    write_changes(ddb, 150, 100)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    log = tmp_path / "runner.log"
    runner = start_runner([*runner_args(tmp_path, url, sink), "--available-now"], log, AWS_ENV)
    try:
        assert runner.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)
    check_exactly_once(ddb, fake, sink)
