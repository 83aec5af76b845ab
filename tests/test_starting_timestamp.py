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

from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.errors import OptionError, StartBeforeTunnelError, TrimmedDataError
from connector.protocol import StreamProtocol
from connector.tunnel import Checkpoint, Record, StartPosition, open_tunnel_service
from testkit.backends import (
    BACKEND_KINDS,
    Backend,
    LocalBackend,
    instant_between,
    open_backend,
)
from testkit.partition_reads import read_partition
from testkit.protocol_runs import run_until_caught_up as drain

pytestmark = pytest.mark.usefixtures("aws_test_credentials")  # boto3 reads them


@pytest.fixture(params=BACKEND_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = open_backend(request.param, tmp_path, request)
    yield b
    b.close()


def key_ids(records: list[Record]) -> list[int]:
    return sorted(int(r.primary_key["id"]) for r in records)


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
