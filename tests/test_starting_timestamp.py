"""``startingTimestamp`` on every backend, without Spark: the driver protocol and the executor
reader in Spark's order, compared as sets with the source's change log.

- the embedded store, the emulator's wire (the tunnel created with ``startOffset``) and DynamoDB
  Streams on moto (no timestamp start: the reader passes over the older records) deliver
  exactly the changes committed at or after the instant -- children of a split before it
  included, their older records passed over;
- conflicts are clear errors: committed batches of an earlier query, a tunnel a consumer
  already pushed checkpoints to, a LATEST tunnel created after the instant (data loss, unless
  ``failOnDataLoss=false``); an instant older than the retained changes follows
  ``failOnDataLoss``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connector.errors import OptionError, StartBeforeTunnelError, TrimmedDataError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.reader import read_partition
from connector.tunnel import Checkpoint, Record, StartPosition, open_tunnel_service
from tablestore_emulator.server import EmulatorServer
from tests.test_available_now import run as drain  # batches until nothing is new
from tests.test_tunnel_dynamodb_streams import (  # noqa: F401 - fixtures used by name
    StreamsHarness,
    _aws_env,
    moto_url,
    streams_fake,
)
from tests.test_tunnel_tablestore import INSTANCE, KEY_ID, SECRET


class Backend:
    """A table with one INTEGER/STRING key ``id`` on one backend: writes, a split, the
    options of a query reading it, the keys of its change log with their commit times."""

    #: how long to wait around the instant so the backend's commit times fall on either side
    settle_s = 0.01

    def write(self, ids: range) -> None: ...
    def split(self) -> None: ...
    def options(self, **extra: str) -> SourceOptions: ...
    def close(self) -> None: ...


class LocalBackend(Backend):
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.writer = LocalTablestore(tmp_path / "store.db")
        self.writer.create_table("t", primary_key=[("id", "INTEGER")],
                                 columns=[("v", "INTEGER")], channels=2)

    def write(self, ids: range) -> None:
        for i in ids:
            self.writer.put_row("t", {"id": i}, {"v": i})

    def split(self) -> None:
        open_channels = [c.channel_id for c in self.writer.list_channels("t") if not c.closed]
        self.writer.split_channel("t", sorted(open_channels)[0])

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({"endpoint": f"local://{self.writer.path}",
                                         "table.name": "t", "tunnel.name": "q", **extra})

    def close(self) -> None:
        self.writer.close()


class WireBackend(LocalBackend):
    """The same store served by the emulator: the query reads over HTTP."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.emulator = EmulatorServer(str(self.writer.path), INSTANCE, KEY_ID, SECRET).start()

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({
            "endpoint": self.emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{self.tmp_path}/meta.db", **extra})

    def close(self) -> None:
        self.emulator.stop()
        super().close()


class DynamoBackend(Backend):
    """A DynamoDB table on moto with the shard map of ``StreamsFake``."""

    settle_s = 1.1  # ApproximateCreationDateTime is rounded down to the second

    def __init__(self, tmp_path: Path, url: str, fake: Any) -> None:
        self.tmp_path = tmp_path
        self.harness = StreamsHarness(url, fake)
        self.harness.create_table("t", 2)

    def write(self, ids: range) -> None:
        for i in ids:
            self.harness.put("t", str(i), i)

    def split(self) -> None:
        self.harness.split("t", sorted(self.harness.fake.open_shards("t"))[0])

    def options(self, **extra: str) -> SourceOptions:
        return SourceOptions.from_spark({
            "endpoint": self.harness.uri, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{self.tmp_path}/meta.db", **extra})

    def close(self) -> None:
        self.harness.close()


@pytest.fixture(params=["local", "wire", "dynamodb"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        b: Backend = LocalBackend(tmp_path)
    elif request.param == "wire":
        b = WireBackend(tmp_path)
    else:
        b = DynamoBackend(tmp_path, request.getfixturevalue("moto_url"),
                          request.getfixturevalue("streams_fake"))
    yield b
    b.close()


def key_ids(records: list[Record]) -> list[int]:
    return sorted(int(r.primary_key["id"]) for r in records)


def instant_between(backend: Backend, before: range, after: range) -> int:
    """Write ``before``, take the instant (ms since the epoch), write ``after``."""
    backend.write(before)
    time.sleep(backend.settle_s)
    instant = int(time.time() * 1000)
    time.sleep(backend.settle_s)
    backend.write(after)
    return instant


def test_a_new_query_starts_at_the_first_change_at_or_after_the_instant(backend):
    backend.write(range(0, 10))
    backend.split()  # its children hold changes from both sides of the instant
    instant = instant_between(backend, range(10, 25), range(25, 50))
    proto = StreamProtocol(backend.options(startingTimestamp=str(instant),
                                           maxOffsetsPerChannel="8"))
    end, records = drain(proto, proto.initial_offset())
    assert key_ids(records) == list(range(25, 50))
    assert len({r.channel_id for r in records}) >= 3  # the split's children included
    backend.write(range(50, 55))  # later changes follow as usual
    _, more = drain(proto, end)
    assert key_ids(more) == list(range(50, 55))
    proto.close()


def test_a_tunnel_or_namespace_already_consumed_conflicts(tmp_path):
    backend = LocalBackend(tmp_path)
    backend.write(range(5))
    first = StreamProtocol(backend.options())
    drain(first, first.initial_offset())
    first.close()
    # a new query (a new checkpoint directory) on the same tunnel and namespace
    with pytest.raises(OptionError, match="committed batches"):
        StreamProtocol(backend.options(startingTimestamp="0")).initial_offset()
    # another namespace (its own meta store), but the tunnel holds a consumer's checkpoints
    pushed = backend.options(startingTimestamp="0",
                             **{"meta.store": f"sqlite://{tmp_path}/other.db"})
    with pytest.raises(OptionError, match="pushed by a consumer") as info:
        StreamProtocol(pushed).initial_offset()
    assert "new tunnel.name" in str(info.value)
    backend.close()


def test_a_latest_tunnel_created_after_the_instant_is_data_loss(tmp_path):
    backend = LocalBackend(tmp_path)
    instant = instant_between(backend, range(5), range(5, 8))
    with open_tunnel_service(f"local://{backend.writer.path}") as tunnel:
        tunnel.create_tunnel("t", "q", start_position=StartPosition.LATEST)
    with pytest.raises(StartBeforeTunnelError, match="failOnDataLoss=false"):
        StreamProtocol(backend.options(startingTimestamp=str(instant))).initial_offset()
    proto = StreamProtocol(backend.options(startingTimestamp=str(instant),
                                           failOnDataLoss="false"))
    backend.write(range(8, 12))
    _, records = drain(proto, proto.initial_offset())
    assert key_ids(records) == list(range(8, 12))  # from the tunnel's start
    proto.close()
    backend.close()


def test_an_instant_older_than_the_retained_changes_follows_fail_on_data_loss(tmp_path):
    backend = LocalBackend(tmp_path)
    instant = instant_between(backend, range(0), range(0, 10))
    backend.writer.trim_history("t", keep_last=2)  # changes after the instant are gone
    proto = StreamProtocol(backend.options(startingTimestamp=str(instant)))
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    with pytest.raises(TrimmedDataError):
        [r for p in proto.plan(start, end) for r in read_partition(p)]
    proto.close()
    lenient = StreamProtocol(backend.options(
        startingTimestamp=str(instant), failOnDataLoss="false",
        **{"tunnel.name": "q2"}))
    _, records = drain(lenient, lenient.initial_offset())
    assert key_ids(records) == sorted(int(r.primary_key["id"])
                                      for r in backend.writer.change_log("t"))
    lenient.close()

    # trimmed changes all older than the instant: nothing the query wants is lost
    later = instant_between(backend, range(10, 20), range(20, 30))
    backend.writer.trim_history("t", keep_last=12)
    strict = StreamProtocol(backend.options(startingTimestamp=str(later),
                                            **{"tunnel.name": "q3"}))
    _, records = drain(strict, strict.initial_offset())
    assert key_ids(records) == list(range(20, 30))
    strict.close()
    backend.close()


def test_a_consumer_push_is_what_counts_as_consumed(tmp_path):
    """Start positions the tunnel was created with (sequence number 0) are not a consumer's."""
    backend = LocalBackend(tmp_path)
    backend.write(range(4))
    with open_tunnel_service(f"local://{backend.writer.path}") as tunnel:
        info = tunnel.create_tunnel("t", "q", start_at_us=0)
        channel = tunnel.describe_tunnel("t", "q").channels[0].channel_id
        proto = StreamProtocol(backend.options(startingTimestamp="0"))
        proto.initial_offset()  # fine: nothing pushed
        proto.close()
        start = tunnel.get_checkpoint(info.tunnel_id, channel)
        tunnel.checkpoint(info.tunnel_id, channel, Checkpoint(start.token, 1))
    with pytest.raises(OptionError, match="pushed by a consumer"):
        StreamProtocol(backend.options(startingTimestamp="0",
                                       **{"meta.store": f"sqlite://{tmp_path}/m2.db"})
                       ).initial_offset()
    backend.close()


def test_an_existing_tunnel_nobody_consumed_is_read_from_the_instant(backend):
    """The tunnel exists already (created EARLIEST, never pushed to): the reader passes over
    the older records of every channel, children of a split included."""
    with open_tunnel_service(backend.options().endpoint) as tunnel:
        tunnel.create_tunnel("t", "q")
    backend.write(range(0, 12))
    backend.split()
    instant = instant_between(backend, range(12, 20), range(20, 40))
    proto = StreamProtocol(backend.options(startingTimestamp=str(instant),
                                           maxOffsetsPerChannel="5"))
    _, records = drain(proto, proto.initial_offset())
    assert key_ids(records) == list(range(20, 40))
    proto.close()
