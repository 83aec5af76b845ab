"""The protocol where exactly once is hardest to keep: situations in which a source can lose or
duplicate changes silently (a tunnel recreated, a checkpoint restored behind or beyond the meta
table, a read limit starving a channel, a push refused), each driven in Spark's call order
without Spark (a real embedded store, a real SQLite meta store), as in tests/test_protocol.py.

Each test reproduces one situation and asserts the fixed behaviour: exact delivery, or a typed
refusal that names what happened. The figures seen before the fix are in the test docstrings.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from connector.errors import (
    CheckpointBehindMetaError,
    MalformedOffsetError,
    OptionError,
    TransientMetaStoreError,
    TunnelGoneError,
    TunnelReplacedError,
)
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.tunnel import Record
from connector.tunnel.local import LocalTunnelService
from connector.tunnel.local.values import dumps_values, key_hash
from tablestore_cdc.commands.app import app
from testkit.fixtures import options_for as options
from testkit.fixtures import put_rows as write
from testkit.partition_reads import read_partition


def keys(records: list[Record]) -> list[tuple[str, str]]:
    return sorted((r.channel_id, r.sequence) for r in records)


def batch(proto: StreamProtocol, start: dict, limit: int | None = None,
          commit: bool = True) -> tuple[dict, list[Record]]:
    """One micro-batch in Spark's order: latestOffset -> partitions -> read -> commit."""
    end = proto.latest_offset(start, limit)
    records = [r for p in proto.plan(start, end) for r in read_partition(p)]
    if commit and end != start:
        proto.commit(end)
    return end, records


def committed_query(store) -> StreamProtocol:
    """A query (still open) that read and committed one batch of ten new rows."""
    write(store, range(10))
    proto = StreamProtocol(options(store))
    batch(proto, proto.initial_offset())
    return proto


def drain(proto: StreamProtocol, start: dict, limit: int | None = None,
          max_batches: int = 30) -> tuple[dict, list[Record]]:
    seen: list[Record] = []
    for _ in range(max_batches):
        end, records = batch(proto, start, limit)
        seen += records
        if end == start:
            break
        start = end
    return start, seen


# --- 1. a tunnel deleted and re-created under the same name while the query is stopped --------


def test_a_recreated_tunnel_is_refused_with_both_ids(store):
    """Before: with startingPosition=latest and a split while the query was down, the restart
    carried on from its old positions in the new tunnel and skipped 20 of 30 changes."""
    write(store, range(10))
    proto = StreamProtocol(options(store, startingPosition="latest"))
    start = proto.initial_offset()
    write(store, range(10, 20))
    end, records = batch(proto, start)
    assert len(records) == 10
    old_id = proto.tunnel_id
    proto.close()  # the query stops
    tunnel = LocalTunnelService(store)
    tunnel.delete_tunnel("t", "q")
    new_id = tunnel.create_tunnel("t", "q").tunnel_id
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write(store, range(20, 50))
    with pytest.raises(TunnelReplacedError) as caught:
        StreamProtocol(options(store, startingPosition="latest")).initial_offset()
    error = caught.value
    assert (error.table, error.tunnel, error.recorded_id, error.current_id) == (
        "t", "q", old_id, new_id)
    assert "meta reset" in str(error) and "new checkpoint location" in str(error)
    tunnel.close()


def test_a_deleted_tunnel_is_not_recreated_for_a_namespace_with_committed_batches(store):
    proto = committed_query(store)
    old_id = proto.tunnel_id
    proto.close()
    tunnel = LocalTunnelService(store)
    tunnel.delete_tunnel("t", "q")
    with pytest.raises(TunnelGoneError) as caught:
        StreamProtocol(options(store)).initial_offset()
    assert caught.value.recorded_id == old_id
    assert tunnel.list_tunnels("t") == []  # refused before creating anything
    tunnel.close()


def test_after_a_namespace_reset_a_new_query_binds_to_the_new_tunnel(store):
    proto = committed_query(store)
    namespace = proto.namespace
    meta = proto.meta
    tunnel = LocalTunnelService(store)
    tunnel.delete_tunnel("t", "q")
    with pytest.raises(TunnelGoneError):
        StreamProtocol(options(store)).initial_offset()
    uri = proto.options.meta_store
    dry = CliRunner().invoke(app, ["meta", "reset", "--meta", uri, "--json"])
    assert dry.exit_code == 0 and json.loads(dry.stdout)["deleted"] == 0
    done = CliRunner().invoke(app, ["meta", "reset", "--meta", uri, "--yes", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["deleted"] >= 2
    assert meta.list_batches(namespace) == []
    fresh = StreamProtocol(options(store))  # creates the tunnel: nothing committed any more
    assert fresh.tunnel_id != proto.tunnel_id
    assert fresh.meta.get_namespace_info(namespace)["tunnel_id"] == fresh.tunnel_id
    _, records = drain(fresh, fresh.initial_offset())
    assert keys(records) == keys(store.change_log("t"))  # earliest: the new tunnel reads all
    proto.close()
    tunnel.close()


def test_a_tunnel_is_recreated_when_nothing_was_committed(store):
    write(store, range(5))
    proto = StreamProtocol(options(store))
    proto.initial_offset()  # batch 0 never committed
    proto.close()
    tunnel = LocalTunnelService(store)
    tunnel.delete_tunnel("t", "q")
    again = StreamProtocol(options(store))
    _, records = drain(again, again.initial_offset())
    assert len(records) == 5
    tunnel.close()


# --- 2. Spark's checkpoint restored behind the meta table --------------------------------------


def _history_with_a_split(store: LocalTablestore, proto: StreamProtocol
                          ) -> tuple[list[dict], list[list[Record]]]:
    """Batches 0..3 of a query: a split after batch 0; returns offsets and records."""
    write(store, range(8))
    offsets = [proto.initial_offset()]
    delivered: list[list[Record]] = []
    end, records = batch(proto, offsets[-1])
    offsets.append(end)
    delivered.append(records)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write(store, range(8, 38))
    for _ in range(3):
        end, records = batch(proto, offsets[-1])
        offsets.append(end)
        delivered.append(records)
    return offsets, delivered


@pytest.mark.parametrize("restored_after", [0, 1])
def test_a_checkpoint_restored_behind_the_meta_table_replays_the_stored_chain(store,
                                                                              restored_after):
    """Before: restored to after batch 1, 30 of 38 changes were never delivered again;
    restored to after batch 0, the parent's tail came twice and the children's 30 never."""
    proto = StreamProtocol(options(store))
    offsets, delivered = _history_with_a_split(store, proto)
    assert keys([r for b in delivered for r in b]) == keys(store.change_log("t"))
    proto.close()
    # Spark resumes from the end of batch `restored_after` (its later offsets/commits are gone)
    restarted = StreamProtocol(options(store))
    start = offsets[restored_after + 1]
    again: list[list[Record]] = []
    for _ in range(len(offsets) - restored_after - 2):
        end, records = batch(restarted, start)
        again.append(records)
        start = end
    # exactly the batches that followed, in the same order, with the same records
    assert [keys(b) for b in again] == [keys(b) for b in delivered[restored_after + 1:]]
    assert start == offsets[-1]
    write(store, range(100, 104))  # and then new data, once
    _, new = drain(restarted, start)
    assert len(new) == 4


def test_a_checkpoint_restored_beyond_retention_is_refused(store):
    proto = StreamProtocol(options(store, metaRetentionBatches="2"))
    start = proto.initial_offset()
    offsets = [start]
    for i in range(6):
        write(store, range(i * 5, i * 5 + 5))
        start, _ = batch(proto, start)
        offsets.append(start)
    with pytest.raises(CheckpointBehindMetaError) as caught:
        StreamProtocol(options(store)).latest_offset(offsets[1], None)
    assert caught.value.uuid == offsets[1]["uuid"]
    assert "metaRetentionBatches" in str(caught.value)
    # retention took the resume point but not the batch after it: that one still replays
    restarted = StreamProtocol(options(store))
    assert restarted.meta.find_batch(restarted.namespace, offsets[4]["uuid"]) is None
    assert restarted.latest_offset(offsets[4], None) == offsets[5]


# --- 3. one failed write of the generation marker -----------------------------------------------


def test_a_lost_generation_marker_write_never_makes_the_initial_offset_stale(store, monkeypatch):
    """Before: a new query reused the old initial offset and its stale manifest: 20 records
    delivered again, and a finished parent read from sequence 0 beside its children."""
    write(store, range(20))
    first = StreamProtocol(options(store))
    start = first.initial_offset()
    end = first.latest_offset(start, None)
    records = [r for p in first.plan(start, end) for r in read_partition(p)]
    assert len(records) == 20
    original = first.meta.set_namespace_info

    def lost(namespace, info):  # throttled past the retry budget, once
        monkeypatch.setattr(first.meta, "set_namespace_info", original)
        raise TransientMetaStoreError(detail="throttled")

    monkeypatch.setattr(first.meta, "set_namespace_info", lost)
    with pytest.raises(TransientMetaStoreError):
        first.commit(end)
    # the query restarts on its checkpoint (batch 0 is in Spark's commit log) and goes on
    restarted = StreamProtocol(options(store))
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write(store, range(20, 30))
    _, more = drain(restarted, end)
    assert len(more) == 10
    # a new query in a new checkpoint directory re-reads nothing
    second = StreamProtocol(options(store))
    initial = second.initial_offset()
    assert initial != start
    _, again = drain(second, initial)
    assert again == []


def test_the_open_generation_survives_retention_of_its_committed_successor(store):
    write(store, range(5))
    first = StreamProtocol(options(store, metaRetentionBatches="1"))
    start = first.initial_offset()
    for i in range(4):
        write(store, range(10 + i, 11 + i))
        start, _ = batch(first, start)
    # the generation-0 rows are gone; any initial offset a new query gets starts at the tunnel
    second = StreamProtocol(options(store))
    offsets = {second.initial_offset()["uuid"] for _ in range(3)}
    assert len(offsets) == 1
    _, again = drain(second, second.initial_offset())
    assert again == []


# --- 4. replay after `meta gc` keeps the read limit ---------------------------------------------


def test_a_replay_after_the_minted_row_was_collected_keeps_the_read_limit(store):
    """Before: the replay planned the batch without its cap: 36 records where the limit was 6."""
    write(store, range(36))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end = proto.latest_offset(start, 6)  # Spark logs `end`; the driver dies before planning
    assert json.loads(json.dumps(end)) == end  # what Spark's offset log holds
    proto.meta.gc(proto.namespace, 100, minted_older_than_s=0.0, now=1e12)  # `meta gc` later
    assert proto.meta.find_batch(proto.namespace, end["uuid"]) is None
    replay = StreamProtocol(options(store))
    records = [r for p in replay.plan(start, end) for r in read_partition(p)]
    assert len(records) == 6


def test_an_offset_logged_before_the_limit_field_existed_is_still_read(store):
    write(store, range(6))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end = proto.latest_offset(start, 4)
    old_style = {"uuid": end["uuid"], "source": end["source"]}
    records = [r for p in proto.plan(start, old_style) for r in read_partition(p)]
    assert len(records) == 4  # the minted row still holds the cap


# --- 5. the read limit follows the backlog -------------------------------------------------------


@pytest.fixture
def wide(tmp_path):
    s = LocalTablestore(tmp_path / "wide.db")
    s.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                   channels=16)
    yield s
    s.close()


def _ids_in_one_channel(store: LocalTablestore, count: int) -> list[int]:
    channel = store.list_channels("t")[0]
    found = []
    i = 0
    while len(found) < count:
        if channel.owns(key_hash(dumps_values({"id": i}))):
            found.append(i)
        i += 1
    return found


def test_the_read_limit_goes_to_the_channel_with_the_backlog(wide):
    """Before: 16 channels, all data in one: a limit of 8 read 0.5 records per batch and a limit
    of 1,600 read 100 of 400 available."""
    write(wide, _ids_in_one_channel(wide, 400))
    assert len({r.channel_id for r in wide.change_log("t")}) == 1
    proto = StreamProtocol(options(wide))
    start = proto.initial_offset()
    counts = []
    for _ in range(5):
        start, records = batch(proto, start, limit=8)
        counts.append(len(records))
    assert min(counts) >= 7 and max(counts) == 8  # a share may probe an idle channel
    start, records = batch(proto, start, limit=1600)
    assert len(records) == 400 - sum(counts)


def test_caps_never_exceed_the_limit_and_replays_plan_the_same_caps(wide):
    write(wide, range(300))
    proto = StreamProtocol(options(wide, maxOffsetsPerChannel="9"))
    start = proto.initial_offset()
    for limit in (1, 5, 16, 17, 100, 1000):
        end = proto.latest_offset(start, limit)
        parts = proto.plan(start, end)
        assert sum(p.max_records for p in parts) <= limit
        assert all(p.max_records <= 9 for p in parts)
        assert StreamProtocol(options(wide)).plan(start, end) == parts  # a replay
        [read_partition(p) for p in parts]
        proto.commit(end)
        start = end


def test_a_finished_parent_is_not_starved_by_a_busy_channel(wide):
    busy = _ids_in_one_channel(wide, 200)
    parent = wide.list_channels("t")[5].channel_id
    proto = StreamProtocol(options(wide))
    start = proto.initial_offset()
    wide.split_channel("t", parent)
    write(wide, busy)
    children_seen = False
    for _ in range(10):
        start, _ = batch(proto, start, limit=4)
        if set(proto.last_batch.children_added):
            children_seen = True
            break
    assert children_seen


# --- 6. bad input is a typed error ---------------------------------------------------------------


def test_an_offset_without_uuid_is_a_typed_error_naming_the_checkpoint(store):
    proto = StreamProtocol(options(store))
    with pytest.raises(MalformedOffsetError, match="checkpoint"):
        proto.latest_offset({"source": proto.namespace}, None)
    with pytest.raises(MalformedOffsetError):
        proto.plan({"source": proto.namespace, "uuid": 7}, proto.initial_offset())


@pytest.mark.parametrize(("extra", "option"), [
    ({"maxOffsetsPerTrigger": "9999999999999999999999"}, "maxOffsetsPerTrigger"),
    ({"maxOffsetsPerChannel": "9999999999999999999999"}, "maxOffsetsPerChannel"),
    ({"table.name": "   "}, "table.name"),
    ({"tunnel.name": " \t"}, "tunnel.name"),
    ({"tunnel.name": " q"}, "tunnel.name"),
])
def test_out_of_range_and_blank_options_are_refused_at_load(extra, option):
    with pytest.raises(OptionError, match=f"'{option}'"):
        SourceOptions.from_spark({"endpoint": "local:///data/s.db", "table.name": "t",
                                  "tunnel.name": "q", **extra})


# --- a refused "finished" push is never lost silently ------------------------------------------


def test_a_refused_finished_push_fails_the_commit_instead_of_stranding_children(store):
    """Another writer pushed a higher sequence number for the parent (not "finished"): the
    source's "finished" push is refused as stale. Before, the refusal was logged at DEBUG and
    the batch marked pushed: the parent never terminated, its children stayed in WAIT and the
    query read nothing more from that key range, silently. Now the commit fails, naming it."""
    from connector.errors import StaleCheckpointError
    from connector.tunnel.base import ChannelStatus, Checkpoint

    write(store, range(20))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    parent = store.list_channels("t")[0].channel_id
    children = store.split_channel("t", parent)
    other = LocalTunnelService(LocalTablestore(store.path))
    other.checkpoint(proto.tunnel_id, parent,
                     Checkpoint(other.get_checkpoint(proto.tunnel_id, parent).token, 10_000))
    with pytest.raises(StaleCheckpointError, match=parent):
        drain(proto, start)
    statuses = {c.channel_id: c.status for c in other.describe_tunnel("t", "q").channels}
    assert {statuses[c] for c in children} == {ChannelStatus.WAIT}
    proto.close()
    other.close()


def test_a_finished_push_behind_a_finished_tunnel_checkpoint_is_fine(store):
    """The tunnel holds "finished" already (pushed by an earlier process, with a higher
    number): the refusal of the source's own "finished" push changes nothing, and the query
    goes on to the children."""
    from connector.tunnel.base import FINISHED, Checkpoint

    write(store, range(20))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    parent = store.list_channels("t")[0].channel_id
    store.split_channel("t", parent)
    write(store, range(20, 40))
    other = LocalTunnelService(LocalTablestore(store.path))
    token = other.get_checkpoint(proto.tunnel_id, parent).token
    while token != FINISHED:
        token = other.read_records(proto.tunnel_id, parent, token, 100).next_token
    other.checkpoint(proto.tunnel_id, parent, Checkpoint(FINISHED, 10_000))
    _, records = drain(proto, start)
    assert len({(r.primary_key["id"], r.sequence, r.channel_id) for r in records}) == 40
    proto.close()
    other.close()
