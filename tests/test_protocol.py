"""The UUID-offset protocol without Spark: the driver protocol and the executor reader called in
Spark's order over a real local store and a real SQLite meta store.

Spark's own behaviour (restarts, replays, foreachBatch) is covered by tests/test_source_spark.py
and integration/; these tests pin the protocol's rules and run in a few seconds.
"""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

from connector.errors import (
    CheckpointMismatchError,
    ReplayDivergedError,
    TrimmedDataError,
)
from connector.partition import ChannelPartition
from connector.protocol import StreamProtocol
from connector.tunnel import FINISHED, ChannelStatus, Record
from meta_store import BatchState
from testkit.fixtures import options_for as options
from testkit.fixtures import put_rows as write
from testkit.partition_reads import read_partition


def run_batch(proto: StreamProtocol, start: dict, commit: bool = True
              ) -> tuple[dict, list[ChannelPartition], list[Record]]:
    """One micro-batch in Spark's order: latestOffset -> partitions -> read -> commit."""
    end = proto.latest_offset(start, None)
    parts = proto.plan(start, end)
    records = [r for p in parts for r in read_partition(p)]
    if commit and end != start:
        proto.commit(end)
    return end, parts, records


def ids(records: list[Record]) -> list[tuple[str, str]]:
    return sorted((r.channel_id, r.sequence) for r in records)


def test_initial_offset_is_deterministic_until_batch_zero_commits(store):
    write(store, range(10))
    first = StreamProtocol(options(store))
    offset = first.initial_offset()
    # a restart before batch 0 commits gets the same offset (Spark never logs batch 0's start)
    assert StreamProtocol(options(store)).initial_offset() == offset
    run_batch(first, offset)
    # a new query (new checkpoint directory) after batch 0 committed starts a new generation
    assert StreamProtocol(options(store)).initial_offset() != offset


def test_every_change_once_across_batches(store):
    proto = StreamProtocol(options(store, maxOffsetsPerChannel="7"))
    write(store, range(40))
    start, seen = proto.initial_offset(), []
    for _ in range(10):
        end, parts, records = run_batch(proto, start)
        assert all(len(read_partition(p)) <= 7 for p in parts)
        seen += records
        start = end
    assert ids(seen) == ids(store.change_log("t"))


def test_replay_reads_exactly_the_claimed_end(store):
    write(store, range(20))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    parts = proto.plan(start, end)
    first = [r for p in parts for r in read_partition(p)]
    write(store, range(20, 40))  # new data after the batch was read
    # a replay after a driver crash: a new protocol object, the same start and end from the log
    replayed_parts = StreamProtocol(options(store)).plan(start, end)
    assert replayed_parts == parts  # the manifest is reused, not re-planned
    replayed = [r for p in replayed_parts for r in read_partition(p)]
    assert ids(replayed) == ids(first) and len(first) == 20


def test_partition_is_picklable_plain_data(store):
    write(store, range(3))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    part = proto.plan(start, proto.latest_offset(start, None))[0]
    assert pickle.loads(pickle.dumps(part)) == part


def _read_in_process(part: ChannelPartition, barrier, queue) -> None:
    barrier.wait()
    queue.put(ids(read_partition(part)))


def test_concurrent_attempts_of_one_partition_yield_identical_rows(store):
    write(store, range(300))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    part = proto.plan(start, proto.latest_offset(start, None))[0]
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(4), ctx.Queue()
    workers = [ctx.Process(target=_read_in_process, args=(part, barrier, queue))
               for _ in range(4)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    assert all(r == results[0] for r in results) and results[0]
    assert len(proto.meta.get_end_checkpoints(proto.namespace, part.end_uuid)) == 1


def test_lost_commit_is_caught_up_by_the_next_latest_offset(store):
    write(store, range(10))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end, _, records = run_batch(proto, start, commit=False)  # commit lost in a crash
    assert records
    # Spark asks for the next batch: the batch ending at `end` is in its commit log
    restarted = StreamProtocol(options(store))
    restarted.latest_offset(end, None)
    batch = restarted.meta.get_batch(restarted.namespace, restarted.uuid_of(end))
    assert batch.state is BatchState.PUSHED
    ends = restarted.meta.get_end_checkpoints(restarted.namespace, batch.uuid)
    for channel_id, e in ends.items():
        assert restarted.tunnel.get_checkpoint(restarted.tunnel_id, channel_id).token == e.token


def test_children_join_the_batch_right_after_the_parents_finish(store):
    write(store, range(30))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    parent = store.list_channels("t")[0].channel_id
    children = store.split_channel("t", parent)
    write(store, range(30, 60))  # lands in the children (and the other channel)
    end1, parts1, seen = run_batch(proto, start)
    assert parent in {p.channel_id for p in parts1}
    assert not set(children) & {p.channel_id for p in parts1}  # still waiting for the parent
    ends = proto.meta.get_end_checkpoints(proto.namespace, proto.uuid_of(end1))
    assert ends[parent].token == FINISHED
    end2, parts2, more = run_batch(proto, end1)
    assert set(children) <= {p.channel_id for p in parts2}
    assert set(proto.last_batch.children_added) == set(children)
    assert ids(seen + more) == ids(store.change_log("t"))


def test_a_finished_channel_is_never_planned_again_while_its_push_is_pending(store):
    write(store, range(20))
    proto = StreamProtocol(options(store, commitInterval="1000"))
    start = proto.initial_offset()
    parent = store.list_channels("t")[0].channel_id
    store.split_channel("t", parent)
    end1, _, _ = run_batch(proto, start, commit=False)
    # plan the next batch before any push (a lost commit, a restart): the parent must be
    # carried as FINISHED, not re-added from the tunnel's stale checkpoint
    end2 = {"uuid": "00000000-0000-4000-8000-000000000002", "source": proto.namespace}
    proto.meta.create_batch(proto.namespace, end2["uuid"], proto.uuid_of(end1))
    proto.tracker.request_refresh()
    parts = proto.plan(end1, end2)
    assert parent not in {p.channel_id for p in parts}
    manifest = proto.meta.get_batch(proto.namespace, end2["uuid"]).manifest
    assert manifest.channel(parent).token == FINISHED


def test_commit_interval_pushes_every_n_batches_and_at_once_on_finish(store):
    proto = StreamProtocol(options(store, commitInterval="3"))
    channel = store.list_channels("t")[0].channel_id
    start = proto.initial_offset()

    def pushed() -> str:
        return proto.tunnel.get_checkpoint(proto.tunnel_id, channel).token

    initial = pushed()
    tokens = []
    for i in range(3):
        write(store, range(i * 10, i * 10 + 10))
        start, _, _ = run_batch(proto, start)
        tokens.append(pushed())
    assert tokens[0] == tokens[1] == initial != tokens[2]
    store.split_channel("t", channel)
    start, _, _ = run_batch(proto, start)  # reads the parent to its end
    assert pushed() == FINISHED  # forced at once, not after three batches
    statuses = {c.channel_id: c.status for c in proto.tunnel.describe_tunnel("t", "q").channels}
    assert statuses[channel] is ChannelStatus.TERMINATED


def test_idle_tunnel_mints_nothing(store):
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    assert proto.latest_offset(start, None) == start
    write(store, range(1))
    assert proto.latest_offset(start, None) != start


def test_read_limit_total_is_split_across_channels(store):
    write(store, range(100))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end = proto.latest_offset(start, 5)
    parts = proto.plan(start, end)
    assert sum(p.max_records for p in parts) == 5
    assert sum(len(read_partition(p)) for p in parts) == 5


def test_offsets_of_another_source_are_refused(store):
    proto = StreamProtocol(options(store))
    foreign = {"uuid": "x", "source": "local:///elsewhere.db#t#q"}
    with pytest.raises(CheckpointMismatchError, match="checkpoint location was written by"):
        proto.latest_offset(foreign, None)


def test_meta_retention_keeps_the_last_batches(store):
    proto = StreamProtocol(options(store, metaRetentionBatches="3"))
    start = proto.initial_offset()
    for i in range(8):
        write(store, range(i, i + 1))
        start, _, _ = run_batch(proto, start)
    batches = proto.meta.list_batches(proto.namespace)
    assert len(batches) == 3
    assert batches[-1].uuid == proto.uuid_of(start)


def test_trimmed_history_fails_or_skips_by_option(store):
    write(store, range(50))
    for fail_on_data_loss, expect_error in (("true", True), ("false", False)):
        proto = StreamProtocol(options(store, failOnDataLoss=fail_on_data_loss,
                                       **{"tunnel.name": f"q-{fail_on_data_loss}"}))
        start = proto.initial_offset()
        store.trim_history("t", keep_last=5)
        end = proto.latest_offset(start, None)
        parts = proto.plan(start, end)
        if expect_error:
            with pytest.raises(TrimmedDataError, match="lost"):
                read_partition(parts[0])
        else:
            got = [r for p in parts for r in read_partition(p)]
            assert ids(got) == ids(store.change_log("t"))  # what is left, nothing twice


def test_replay_refuses_to_guess_when_history_changed(store):
    write(store, range(30))
    proto = StreamProtocol(options(store))
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    part = proto.plan(start, end)[0]
    read_partition(part)
    store.trim_history("t", keep_last=0)
    with pytest.raises((ReplayDivergedError, TrimmedDataError)):
        read_partition(part)


def test_one_info_line_per_batch_without_secrets(store, caplog):
    write(store, range(12))
    proto = StreamProtocol(options(store))
    with caplog.at_level("INFO", logger="connector.protocol"):
        end, _, _ = run_batch(proto, proto.initial_offset())
    lines = [r.getMessage() for r in caplog.records if "committed:" in r.getMessage()]
    assert lines == [f"batch {proto.uuid_of(end)} committed: 2 channel(s), 12 record(s), "
                     "children added []"]


def test_base_and_stream_snapshot_then_stream_equals_the_table(store):
    from tablestore_cdc.verify import Delivered, key_of, materialize, rows_by_key

    write(store, range(40))
    store.delete_row("t", {"id": 3})
    proto = StreamProtocol(options(store, **{"tunnel.type": "BaseAndStream"}))
    start = proto.initial_offset()
    # changes after the snapshot point, with a split: they must follow the snapshot exactly once
    write(store, range(30, 60), v=7)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    store.delete_row("t", {"id": 31})
    delivered = []
    for _ in range(8):
        start, _, records = run_batch(proto, start)
        delivered += records
    base = [r for r in delivered if r.channel_id.startswith("base-")]
    assert len(base) == 39  # one PUT per row alive when the tunnel was created
    state = materialize(
        Delivered(r.channel_id, r.sequence, key_of(r.primary_key), r.op.value, (i,),
                  r.after_image())
        for i, r in enumerate(delivered))
    assert state == {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    stream = [(r.channel_id, r.sequence) for r in delivered if r not in base]
    assert len(set(stream)) == len(stream) == 31  # the 31 changes after the snapshot, once


def test_a_new_querys_initial_offset_is_stable_even_after_retention(store):
    """Retention may delete an old generation's initial batch; a new query's initialOffset
    must still return the same UUID on every call (Spark calls it more than once)."""
    write(store, range(10))
    first = StreamProtocol(options(store, metaRetentionBatches="1"))
    start = first.initial_offset()
    for i in range(3):
        write(store, range(10 + i, 11 + i))
        start, _, _ = run_batch(first, start)
    second = StreamProtocol(options(store, metaRetentionBatches="1"))
    offsets = {second.initial_offset()["uuid"] for _ in range(3)}
    offsets.add(StreamProtocol(options(store)).initial_offset()["uuid"])
    assert len(offsets) == 1
    end, _, records = run_batch(second, second.initial_offset())
    assert records == []  # the new query starts from the pushed checkpoints: nothing re-read


def test_idle_polls_do_not_list_the_meta_table(store, monkeypatch):
    write(store, range(5))
    proto = StreamProtocol(options(store))
    end, _, _ = run_batch(proto, proto.initial_offset())
    calls = []
    original = proto.meta.committed_not_pushed
    monkeypatch.setattr(proto.meta, "committed_not_pushed",
                        lambda ns: calls.append(ns) or original(ns))
    for _ in range(20):
        assert proto.latest_offset(end, None) == end
    assert calls == []


def test_an_existing_tunnel_of_another_type_is_an_option_error(store):
    from connector.errors import OptionError

    StreamProtocol(options(store)).initial_offset()  # the query starts: it binds now
    with pytest.raises(OptionError, match="'tunnel.type'.*already exists with type Stream"):
        StreamProtocol(options(store, **{"tunnel.type": "BaseAndStream"})).initial_offset()


def test_a_new_query_starts_from_the_pushed_checkpoints_not_the_old_initial_offset(store):
    write(store, range(10))
    first = StreamProtocol(options(store))
    end, _, records = run_batch(first, first.initial_offset())
    assert len(records) == 10
    second = StreamProtocol(options(store))  # a new checkpoint directory, same tunnel
    assert second.initial_offset() != first.offset(first.uuid_of(end))
    _, _, again = run_batch(second, second.initial_offset())
    assert again == []
