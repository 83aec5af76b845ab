"""The meta-store contract: the behaviour every ``MetaStore`` backend must have.

Written once; each backend's test class (``tests/test_meta_store.py``) subclasses
``MetaStoreContract`` and supplies two fixtures:

- ``meta_store_uri`` -> ``str``: the URI of an empty meta store, fresh for each test. Stores are
  opened from it with ``meta_store.open_meta_store``, several times when a test needs another
  process's view (the driver and an executor each open their own store).
- ``meta_raw_writer`` -> ``RawWriter``: ``(namespace, uuid, channel_id, payload)`` writes
  ``payload`` as the stored JSON document of an *existing* row, bypassing the store: the batch
  row when ``channel_id`` is None, else that channel's end checkpoint. This is how the suite
  plants corrupt or foreign rows.

A class whose store cannot be reached from other processes (moto's in-process ``mock_aws``)
sets ``multi_process_skip`` to the reason; the multi-process race is then skipped for it.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from connector.errors import (
    CorruptMetaRecordError,
    EndCheckpointConflictError,
    UnknownBatchError,
)
from meta_store import open_meta_store
from meta_store.base import (
    BatchRecord,
    BatchState,
    ChannelStart,
    EndCheckpoint,
    Manifest,
    MetaStore,
)

RawWriter = Callable[[str, str, str | None, str], None]

NS = "ep=local;table=orders;tunnel=t1"
OTHER_NS = "ep=local;table=orders;tunnel=t2"

#: processes in the race tests
RACE_PROCESSES = 8


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def make_manifest(channels: int = 3, tag: str = "a", token_len: int = 16) -> Manifest:
    """A manifest of ``channels`` channels; ``tag`` makes two manifests differ."""
    return Manifest(
        channels=tuple(
            ChannelStart(
                channel_id=f"ch-{i:05d}", token=f"{tag}-{i:05d}-".ljust(token_len, "x"),
                sequence_number=i * 10, max_records=1000,
                parent_ids=(f"parent-{i - 1:05d}",) if i % 7 == 1 else (),
            )
            for i in range(channels)
        ),
        children_added=("ch-00001",) if channels > 1 else (),
        planned_at=1_700_000_000.25,
    )


def make_end(channel_id: str = "ch-00000", token: str = "tok-9", seq: int = 9, records: int = 9,
             attempt: str = "host/1/task-0", written_at: float = 1_700_000_001.5) -> EndCheckpoint:
    return EndCheckpoint(channel_id=channel_id, start_token="tok-0", token=token,
                         sequence_number=seq, records=records, attempt=attempt,
                         written_at=written_at)


def _race_child(uri: str, namespace: str, end_uuid: str, manifest_uuid: str, index: int,
                barrier: Any, results: Any) -> None:
    """One racing process: claim the same (uuid, channel) and plan the same batch as the
    others, at the same moment (both phases start at a barrier). Reports what it saw."""
    store = open_meta_store(uri)
    try:
        end = make_end(channel_id="ch-race", token=f"tok-{index}", seq=100 + index,
                       records=index + 1, attempt=f"proc-{index}")
        barrier.wait(timeout=60)
        claim: tuple[str, Any]
        try:
            claim = ("won", store.put_end_checkpoint(namespace, end_uuid, end))
        except EndCheckpointConflictError as err:
            claim = ("conflict", err)  # crosses back to the parent by pickling, like Spark
        except Exception as err:  # noqa: BLE001 - reported to the parent as a failure
            claim = ("error", repr(err))
        barrier.wait(timeout=60)
        try:
            plan: tuple[str, Any] = (
                "ok", store.put_manifest(namespace, manifest_uuid, None,
                                         make_manifest(4, tag=f"proc-{index}")))
        except Exception as err:  # noqa: BLE001
            plan = ("error", repr(err))
        results.put((index, claim, plan))
    finally:
        store.close()


class MetaStoreContract:
    """Contract tests for a meta-store backend; see the module docstring for the fixtures."""

    #: set to a reason when stores of this class cannot be shared across processes
    multi_process_skip: ClassVar[str | None] = None

    @pytest.fixture
    def store(self, meta_store_uri: str) -> Iterator[MetaStore]:
        store = open_meta_store(meta_store_uri)
        yield store
        store.close()

    @pytest.fixture
    def other(self, meta_store_uri: str) -> Iterator[MetaStore]:
        """A second store on the same URI: another process's view (e.g. an executor)."""
        store = open_meta_store(meta_store_uri)
        yield store
        store.close()

    # --- batches --------------------------------------------------------------------------

    def test_create_batch_is_put_if_absent(self, store: MetaStore, other: MetaStore) -> None:
        u = new_uuid()
        first = store.create_batch(NS, u, None, max_rows=10, now=100.0)
        assert first == BatchRecord(uuid=u, prev_uuid=None, state=BatchState.MINTED,
                                    created_at=100.0, max_rows=10)
        second = other.create_batch(NS, u, "someone-else", max_rows=99, now=200.0,
                                    state=BatchState.PLANNED, manifest=make_manifest())
        assert second == first  # the second writer gets the first writer's row
        assert store.get_batch(NS, u) == first
        assert other.get_batch(NS, u) == first

    def test_get_batch_unknown_names_the_uuid(self, store: MetaStore) -> None:
        u = new_uuid()
        with pytest.raises(UnknownBatchError) as info:
            store.get_batch(NS, u)
        assert info.value.uuid == u
        assert u in str(info.value) and NS in str(info.value)
        assert store.find_batch(NS, u) is None

    def test_create_batch_with_manifest_keeps_it(self, store: MetaStore) -> None:
        u, m = new_uuid(), make_manifest(5, tag="initial")
        created = store.create_batch(NS, u, None, manifest=m, now=5.0)
        assert created.manifest == m
        assert store.get_batch(NS, u).manifest == m
        assert store.put_manifest(NS, u, None, make_manifest(5, tag="later")) == m

    def test_put_manifest_is_written_once(self, store: MetaStore, other: MetaStore) -> None:
        prev, u = new_uuid(), new_uuid()
        store.create_batch(NS, u, prev, max_rows=7, now=10.0)
        m1, m2 = make_manifest(3, tag="first"), make_manifest(4, tag="second")
        assert store.put_manifest(NS, u, prev, m1) == m1
        assert other.put_manifest(NS, u, prev, m2) == m1  # a replay gets the first plan
        batch = other.get_batch(NS, u)
        assert batch.manifest == m1
        assert batch.state is BatchState.PLANNED
        assert (batch.prev_uuid, batch.max_rows, batch.created_at) == (prev, 7, 10.0)

    def test_put_manifest_creates_a_missing_batch_row(self, store: MetaStore) -> None:
        prev, u, m = new_uuid(), new_uuid(), make_manifest(2)
        assert store.put_manifest(NS, u, prev, m) == m
        batch = store.get_batch(NS, u)
        assert (batch.uuid, batch.prev_uuid, batch.state, batch.manifest) == (
            u, prev, BatchState.PLANNED, m)

    def test_put_manifest_does_not_move_a_later_state_back(self, store: MetaStore) -> None:
        u, m = new_uuid(), make_manifest(2)
        store.create_batch(NS, u, None, state=BatchState.COMMITTED)
        assert store.put_manifest(NS, u, None, m) == m
        batch = store.get_batch(NS, u)
        assert batch.state is BatchState.COMMITTED and batch.manifest == m

    # --- end checkpoints ------------------------------------------------------------------

    def test_end_checkpoint_is_put_if_absent(self, store: MetaStore, other: MetaStore) -> None:
        u = new_uuid()
        first = make_end(attempt="exec-1/task-3", written_at=1.0)
        assert store.put_end_checkpoint(NS, u, first) == first
        # the same position again (a retry, a second read of the batch) is idempotent, even
        # from another attempt; the stored row keeps the first attempt's identity
        again = make_end(attempt="exec-2/task-3.1", written_at=2.0)
        assert other.put_end_checkpoint(NS, u, again) == first
        assert other.get_end_checkpoint(NS, u, first.channel_id) == first

    def test_end_checkpoint_conflict_carries_the_stored_value(
        self, store: MetaStore, other: MetaStore
    ) -> None:
        u = new_uuid()
        first = make_end(token="tok-9", seq=9, records=9, attempt="exec-1")
        store.put_end_checkpoint(NS, u, first)
        later = make_end(token="tok-12", seq=12, records=12, attempt="exec-2")
        with pytest.raises(EndCheckpointConflictError) as info:
            other.put_end_checkpoint(NS, u, later)
        err = info.value
        assert err.stored == first and err.attempted == later
        assert (err.uuid, err.channel_id) == (u, first.channel_id)
        assert "tok-9" in str(err) and "tok-12" in str(err)
        # executors raise it; it reaches the driver by pickling, with its type and fields
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is EndCheckpointConflictError
        assert back.stored == first and back.attempted == later
        assert (back.uuid, back.channel_id, str(back)) == (u, first.channel_id, str(err))
        assert store.get_end_checkpoint(NS, u, first.channel_id) == first  # not overwritten

    def test_get_end_checkpoints(self, store: MetaStore) -> None:
        u, v = new_uuid(), new_uuid()
        ends = {f"ch-{i}": make_end(channel_id=f"ch-{i}", seq=i, records=i) for i in range(5)}
        for end in ends.values():
            store.put_end_checkpoint(NS, u, end)
        store.put_end_checkpoint(NS, v, make_end(channel_id="ch-0", token="other"))
        assert store.get_end_checkpoints(NS, u) == ends
        assert store.get_end_checkpoints(NS, new_uuid()) == {}
        assert store.get_end_checkpoint(NS, u, "ch-unknown") is None
        assert store.get_end_checkpoint(NS, v, "ch-0") == make_end(channel_id="ch-0",
                                                                  token="other")

    def test_end_checkpoints_accept_odd_channel_ids(self, store: MetaStore) -> None:
        u = new_uuid()
        odd = ["a#b", "E#x#y", "ch/1", "ch 2", "ünïcode", "B#" + u]
        for i, channel in enumerate(odd):
            store.put_end_checkpoint(NS, u, make_end(channel_id=channel, seq=i))
        assert set(store.get_end_checkpoints(NS, u)) == set(odd)
        assert store.list_batches(NS) == []  # none of them is taken for a batch row

    # --- namespaces -----------------------------------------------------------------------

    def test_namespaces_isolate_each_other(self, store: MetaStore) -> None:
        u = new_uuid()
        a = store.create_batch(NS, u, None, max_rows=1, now=1.0)
        b = store.create_batch(OTHER_NS, u, None, max_rows=2, now=2.0)
        assert (a.max_rows, b.max_rows) == (1, 2)
        store.put_end_checkpoint(NS, u, make_end(token="in-a"))
        store.put_end_checkpoint(OTHER_NS, u, make_end(token="in-b"))  # no conflict
        assert store.get_end_checkpoint(OTHER_NS, u, "ch-00000").token == "in-b"
        store.put_manifest(NS, u, None, make_manifest(2, tag="a"))
        assert store.get_batch(OTHER_NS, u).manifest is None
        store.mark_committed(NS, u)
        store.mark_pushed(NS, [u])
        assert store.get_batch(OTHER_NS, u).state is BatchState.MINTED
        assert [x.uuid for x in store.list_batches(OTHER_NS)] == [u]
        assert store.list_batches("never-used") == []
        store.create_batch(NS, new_uuid(), u, state=BatchState.PLANNED)
        store.mark_committed(NS, store.list_batches(NS)[-1].uuid)
        store.mark_pushed(NS, [store.list_batches(NS)[-1].uuid])
        assert store.gc(NS, keep_committed=1) == [u]
        assert store.get_batch(OTHER_NS, u) == b  # gc of one namespace leaves the other
        assert store.get_end_checkpoint(OTHER_NS, u, "ch-00000") is not None

    def test_namespace_info_round_trip_and_listing(self, store: MetaStore,
                                                  other: MetaStore) -> None:
        assert store.get_namespace_info(NS) is None
        info = {"endpoint": "local:///data/ts", "table": "orders", "tunnel": "t1",
                "tunnel_id": "tid-1"}
        store.set_namespace_info(NS, info)
        store.set_namespace_info(OTHER_NS, {"table": "orders", "tunnel": "t2"})
        assert other.get_namespace_info(NS) == info
        store.set_namespace_info(NS, {**info, "tunnel_id": "tid-2"})  # replaced as a whole
        assert other.get_namespace_info(NS) == {**info, "tunnel_id": "tid-2"}
        assert other.list_namespaces() == sorted([NS, OTHER_NS])

    # --- leases ----------------------------------------------------------------------------

    def test_a_live_lease_refuses_another_owner_until_it_expires(
            self, store: MetaStore, other: MetaStore) -> None:
        assert store.take_lease(NS, "a", 60, namespace=NS, tip="u1", now=1000) is None
        held = other.take_lease(NS, "b", 60, namespace=NS, now=1030)
        assert held is not None and held.owner == "a" and held.expires_at == 1060
        assert held.tip == "u1" and held.namespace == NS
        assert store.take_lease(NS, "a", 60, namespace=NS, now=1050) is None  # renewed
        assert store.get_lease(NS).tip == "u1"  # a renewal without a tip keeps it
        assert other.take_lease(NS, "b", 60, namespace=NS, now=1100) is not None
        assert other.take_lease(NS, "b", 60, namespace=OTHER_NS, now=1111) is None  # expired
        lease = store.get_lease(NS)
        assert lease.owner == "b" and lease.namespace == OTHER_NS and lease.tip is None
        assert store.take_lease(NS, "a", 60, namespace=NS, now=1112) is not None  # lost it
        assert store.get_lease(OTHER_NS) is None  # a lease is per key

    def test_a_lease_is_taken_over_only_when_the_caller_says_so(self, store: MetaStore) -> None:
        store.take_lease(NS, "a", 60, namespace=NS, tip="u7", now=1000)
        seen = []

        def same_query(lease: Any) -> bool:
            seen.append(lease.tip)
            return lease.tip == "u7"

        assert store.take_lease(NS, "b", 60, namespace=NS, now=1001,
                                may_take_over=lambda lease: False) is not None
        assert store.take_lease(NS, "b", 60, namespace=NS, tip="u8", now=1002,
                                may_take_over=same_query) is None
        assert seen == ["u7"] and store.get_lease(NS).owner == "b"

    def test_release_ends_only_the_owners_lease(self, store: MetaStore) -> None:
        store.take_lease(NS, "a", 60, namespace=NS, now=1000)
        store.release_lease(NS, "b", now=1001)  # not b's: left alone
        assert store.get_lease(NS).live(1002)
        store.release_lease(NS, "a", now=1003)
        assert not store.get_lease(NS).live(1003)
        assert store.take_lease(NS, "b", 60, namespace=NS, now=1004) is None

    def test_of_two_owners_taking_a_free_lease_one_wins(self, store: MetaStore,
                                                        other: MetaStore) -> None:
        """The compare-and-set itself: two writes from the same stored state, one succeeds."""
        assert store._swap_lease_json(NS, None, '{"x": 1}') is True
        assert other._swap_lease_json(NS, None, '{"x": 2}') is False
        assert other._swap_lease_json(NS, '{"x": 1}', '{"x": 3}') is True
        assert store._swap_lease_json(NS, '{"x": 1}', '{"x": 4}') is False
        assert store._get_lease_json(NS) == '{"x": 3}'

    # --- documents and re-snapshot signals -----------------------------------------------

    def test_a_document_is_compare_and_set_and_apart_from_the_lease(
            self, store: MetaStore, other: MetaStore) -> None:
        assert store.get_document(NS) is None
        assert store.swap_document(NS, None, '{"a": 1}') is True
        assert other.swap_document(NS, None, '{"a": 2}') is False
        assert other.swap_document(NS, '{"a": 1}', '{"a": 3}') is True
        assert store.get_document(NS) == '{"a": 3}'
        assert store.get_lease(NS) is None  # the lease of the same key is another row
        assert store.take_lease(NS, "a", 60, namespace=NS, now=1000) is None
        assert store.get_document(NS) == '{"a": 3}'

    def test_signals_added_taken_and_finished_across_stores(
            self, store: MetaStore, other: MetaStore) -> None:
        from meta_store.signals import Signal, SignalBoard, SignalState

        cli, job = SignalBoard(store, NS), SignalBoard(other, NS)
        first = cli.add(Signal(table="orders", key_from=10, key_to=20))
        assert cli.add(Signal(table="orders", key_from=10, key_to=20)).id == first.id
        second = cli.add(Signal(table="orders"))
        assert [s.id for s in job.signals()] == [first.id, second.id]
        assert job.next_due().id == first.id
        job.set(first.id, state=SignalState.RUNNING, percent=40.0)
        assert "running 40 %" in cli.signals()[0].describe()
        assert job.next_due().id == first.id  # a running one first: its job died in it
        job.set(first.id, state=SignalState.DONE, counts={"upserts": 3, "deletes": 1})
        assert job.next_due().id == second.id
        assert SignalBoard(store, OTHER_NS).signals() == []
        assert cli.signals()[0].counts == {"upserts": 3, "deletes": 1}

    # --- commit, push, listing ------------------------------------------------------------

    def _chain(self, store: MetaStore, length: int, start: float = 1000.0) -> list[str]:
        """Planned batches u0 <- u1 <- ... (each one's prev is the one before)."""
        uuids: list[str] = []
        prev: str | None = None
        for i in range(length):
            u = new_uuid()
            store.create_batch(NS, u, prev, now=start + i)
            store.put_manifest(NS, u, prev, make_manifest(2, tag=f"b{i}"))
            uuids.append(u)
            prev = u
        return uuids

    def test_mark_committed_catches_up_ancestors_not_orphans(self, store: MetaStore) -> None:
        u0, u1, u2 = self._chain(store, 3)
        orphan = store.create_batch(NS, new_uuid(), u0, now=1000.5).uuid  # minted, unused
        # the commits of u0 and u1 were lost in a driver crash: committing u2 catches up
        assert store.mark_committed(NS, u2, spark_batch_id=2, now=5000.0) == [u0, u1, u2]
        for u in (u0, u1, u2):
            batch = store.get_batch(NS, u)
            assert batch.state is BatchState.COMMITTED and batch.committed_at == 5000.0
        assert store.get_batch(NS, u2).spark_batch_id == 2
        assert store.get_batch(NS, u1).spark_batch_id is None
        assert store.get_batch(NS, orphan).state is BatchState.MINTED
        assert store.mark_committed(NS, u2, now=6000.0) == []  # idempotent
        assert store.get_batch(NS, u2).committed_at == 5000.0
        (u3,) = self._chain_from(store, u2, 1)
        assert store.mark_committed(NS, u3) == [u3]  # stops at the committed ancestor
        assert store.mark_committed(NS, new_uuid()) == []

    def _chain_from(self, store: MetaStore, prev: str, length: int) -> list[str]:
        uuids = []
        for i in range(length):
            u = new_uuid()
            store.put_manifest(NS, u, prev, make_manifest(1, tag=f"c{i}"))
            uuids.append(u)
            prev = u
        return uuids

    def test_committed_not_pushed_mark_pushed_latest_committed(self, store: MetaStore) -> None:
        assert store.latest_committed(NS) is None
        u0, u1, u2, u3 = self._chain(store, 4)
        store.mark_committed(NS, u2, now=10.0)
        assert [b.uuid for b in store.committed_not_pushed(NS)] == [u0, u1, u2]
        assert store.latest_committed(NS).uuid == u2
        store.mark_pushed(NS, [u0, u1], now=20.0)
        assert [b.uuid for b in store.committed_not_pushed(NS)] == [u2]
        pushed = store.get_batch(NS, u0)
        assert (pushed.state, pushed.pushed_at, pushed.committed_at) == (
            BatchState.PUSHED, 20.0, 10.0)
        store.mark_pushed(NS, [u0], now=30.0)  # already pushed: nothing changes
        assert store.get_batch(NS, u0).pushed_at == 20.0
        store.mark_committed(NS, u0)  # never backward
        assert store.get_batch(NS, u0).state is BatchState.PUSHED
        store.mark_pushed(NS, [u2, u3], now=40.0)  # u3 planned -> pushed: forward is fine
        assert store.committed_not_pushed(NS) == []
        assert store.latest_committed(NS).uuid == u3
        store.mark_pushed(NS, [new_uuid()])  # unknown: no-op, no row appears
        assert len(store.list_batches(NS)) == 4

    def test_committed_not_pushed_after_gc_reset_and_in_another_store(
        self, store: MetaStore, other: MetaStore
    ) -> None:
        """What is pending follows the batches' states whichever store marked them, and
        batches that retention or a reset deleted never come back as pending."""
        chain = self._chain(store, 6)
        other.mark_committed(NS, chain[2])
        assert [b.uuid for b in store.committed_not_pushed(NS)] == chain[:3]
        store.mark_pushed(NS, chain[:2])
        other.mark_committed(NS, chain[4])
        assert [b.uuid for b in other.committed_not_pushed(NS)] == chain[2:5]
        other.mark_pushed(NS, chain[2:5])
        assert store.committed_not_pushed(NS) == []
        store.mark_committed(NS, chain[5])
        store.gc(NS, keep_committed=1)
        assert [b.uuid for b in store.committed_not_pushed(NS)] == [chain[5]]
        store.reset_namespace(NS)
        assert store.committed_not_pushed(NS) == []
        (fresh,) = self._chain_from(store, new_uuid(), 1)
        store.mark_committed(NS, fresh)
        assert [b.uuid for b in other.committed_not_pushed(NS)] == [fresh]

    def test_list_batches_in_chain_order_orphans_last(self, store: MetaStore) -> None:
        # creation times are scrambled on purpose: the chain, not the clock, decides
        r = store.create_batch(NS, new_uuid(), None, state=BatchState.PLANNED, now=50.0).uuid
        gone_prev = store.create_batch(NS, new_uuid(), new_uuid(), now=10.0).uuid  # prev gc'd
        old_orphan = store.create_batch(NS, new_uuid(), r, now=55.0).uuid
        a = new_uuid()
        store.create_batch(NS, a, r, now=60.0)
        store.put_manifest(NS, a, r, make_manifest(1))
        b = store.create_batch(NS, new_uuid(), a, state=BatchState.COMMITTED, now=58.0).uuid
        head = store.create_batch(NS, new_uuid(), b, now=70.0).uuid  # minted, not planned yet
        assert [x.uuid for x in store.list_batches(NS)] == [r, a, b, gone_prev, old_orphan, head]

    def test_many_batches_are_all_listed(self, store: MetaStore) -> None:
        chain = self._chain(store, 40)
        for u in chain[:5]:
            for c in range(3):
                store.put_end_checkpoint(NS, u, make_end(channel_id=f"c{c}"))
        assert [b.uuid for b in store.list_batches(NS)] == chain
        assert len(store.get_end_checkpoints(NS, chain[0])) == 3

    # --- retention --------------------------------------------------------------------------

    def test_gc_keeps_the_newest_committed_and_drops_old_minted(self, store: MetaStore) -> None:
        chain = self._chain(store, 6, start=1000.0)
        for u in chain:
            store.put_end_checkpoint(NS, u, make_end(channel_id="c0"))
            store.put_end_checkpoint(NS, u, make_end(channel_id="c1"))
        store.mark_committed(NS, chain[4])
        store.mark_pushed(NS, chain[:4])  # 0-3 pushed, 4 committed not pushed, 5 planned
        old_minted = store.create_batch(NS, new_uuid(), chain[2], now=1000.0).uuid
        new_minted = store.create_batch(NS, new_uuid(), chain[5], now=9000.0).uuid
        expect = [chain[0], chain[1], chain[2], old_minted]
        victims = store.retention_victims(NS, keep_committed=2, minted_older_than_s=3600,
                                          now=9500.0)
        assert sorted(b.uuid for b in victims) == sorted(expect)
        assert sorted(store.gc(NS, keep_committed=2, minted_older_than_s=3600,
                               now=9500.0)) == sorted(expect)
        assert [b.uuid for b in store.list_batches(NS)] == chain[3:] + [new_minted]
        for u in expect:
            assert store.find_batch(NS, u) is None
            assert store.get_end_checkpoints(NS, u) == {}  # ends go with their batch
        for u in chain[3:]:
            assert len(store.get_end_checkpoints(NS, u)) == 2
        assert store.gc(NS, keep_committed=2, minted_older_than_s=3600, now=9500.0) == []

    def test_gc_never_deletes_committed_not_pushed(self, store: MetaStore) -> None:
        chain = self._chain(store, 5)
        store.mark_committed(NS, chain[4])
        store.mark_pushed(NS, chain[1:4])  # chain[0] committed but its push is pending
        deleted = store.gc(NS, keep_committed=1, minted_older_than_s=0.0)
        assert sorted(deleted) == sorted(chain[1:4])
        assert [b.uuid for b in store.list_batches(NS)] == [chain[0], chain[4]]
        assert [b.uuid for b in store.committed_not_pushed(NS)] == [chain[0], chain[4]]

    def test_gc_keeps_at_least_the_newest_committed(self, store: MetaStore) -> None:
        chain = self._chain(store, 3)
        store.mark_committed(NS, chain[2])
        store.mark_pushed(NS, chain)
        assert sorted(store.gc(NS, keep_committed=0)) == sorted(chain[:2])
        assert store.latest_committed(NS).uuid == chain[2]

    # --- corrupt and foreign rows -------------------------------------------------------------

    @pytest.mark.parametrize("payload", ["{not json", '{"hello": "world"}', "[1, 2]", ""])
    def test_corrupt_batch_row_is_reported(self, store: MetaStore,
                                           meta_raw_writer: RawWriter, payload: str) -> None:
        u = new_uuid()
        store.create_batch(NS, u, None)
        meta_raw_writer(NS, u, None, payload)
        with pytest.raises(CorruptMetaRecordError) as info:
            store.get_batch(NS, u)
        assert u in str(info.value)
        with pytest.raises(CorruptMetaRecordError):
            store.list_batches(NS)
        with pytest.raises(CorruptMetaRecordError):  # never planned over a row it cannot read
            store.put_manifest(NS, u, None, make_manifest(1))
        v = new_uuid()  # the failed write left no transaction or lock behind
        assert store.put_manifest(NS, v, None, make_manifest(1)) == make_manifest(1)

    @pytest.mark.parametrize("payload", ["{not json", '{"channel_id": 5}'])
    def test_corrupt_end_checkpoint_is_reported(self, store: MetaStore,
                                                meta_raw_writer: RawWriter,
                                                payload: str) -> None:
        u, end = new_uuid(), make_end(channel_id="ch-7")
        store.put_end_checkpoint(NS, u, end)
        meta_raw_writer(NS, u, "ch-7", payload)
        with pytest.raises(CorruptMetaRecordError) as info:
            store.get_end_checkpoint(NS, u, "ch-7")
        assert "ch-7" in str(info.value)
        with pytest.raises(CorruptMetaRecordError):
            store.get_end_checkpoints(NS, u)
        with pytest.raises(CorruptMetaRecordError):  # a claim never passes over it silently
            store.put_end_checkpoint(NS, u, end)

    def test_a_row_under_the_wrong_key_is_foreign(self, store: MetaStore,
                                                  meta_raw_writer: RawWriter) -> None:
        u, v = new_uuid(), new_uuid()
        store.create_batch(NS, u, None)
        meta_raw_writer(NS, u, None, BatchRecord(uuid=v, prev_uuid=None, state=BatchState.MINTED,
                                                 created_at=1.0).model_dump_json())
        with pytest.raises(CorruptMetaRecordError):
            store.get_batch(NS, u)

    # --- size, reopening --------------------------------------------------------------------

    def test_large_manifest_round_trips(self, store: MetaStore, meta_store_uri: str) -> None:
        u, m = new_uuid(), make_manifest(1000, tag="large", token_len=64)
        assert store.put_manifest(NS, u, None, m) == m
        with open_meta_store(meta_store_uri) as fresh:
            assert fresh.get_batch(NS, u).manifest == m
            assert fresh.list_batches(NS)[0].manifest == m
            assert fresh.put_manifest(NS, u, None, make_manifest(3)) == m

    def test_uri_reopens_the_same_store(self, store: MetaStore) -> None:
        u = new_uuid()
        store.create_batch(NS, u, None, now=3.0)
        with open_meta_store(store.uri) as again:
            assert again.get_batch(NS, u).created_at == 3.0
        assert store.uri in repr(store)
        store.close()
        store.close()  # twice is fine

    # --- concurrency ------------------------------------------------------------------------

    @pytest.mark.slow  # spawns 8 real processes: about 1.5-3 s
    def test_multi_process_race(self, meta_store_uri: str, store: MetaStore) -> None:
        """N processes claim the same (uuid, channel) with different ends at the same moment:
        exactly one wins, every other one gets the winner's value in its conflict error. Then
        the same N plan the same (not yet existing) batch: all get one and the same manifest."""
        if self.multi_process_skip:
            pytest.skip(self.multi_process_skip)
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(RACE_PROCESSES)
        results = ctx.Queue()
        end_uuid, manifest_uuid = new_uuid(), new_uuid()
        procs = [ctx.Process(target=_race_child,
                             args=(meta_store_uri, NS, end_uuid, manifest_uuid, i, barrier,
                                   results))
                 for i in range(RACE_PROCESSES)]
        for p in procs:
            p.start()
        outcomes = []
        try:
            for _ in procs:
                outcomes.append(results.get(timeout=90))
        except queue.Empty:
            pytest.fail(f"only {len(outcomes)} of {RACE_PROCESSES} racers reported")
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        claims = {i: claim for i, claim, _ in outcomes}
        errors = [c for c in claims.values() if c[0] == "error"]
        assert not errors, errors
        winners = [i for i, c in claims.items() if c[0] == "won"]
        assert len(winners) == 1, claims
        stored = store.get_end_checkpoint(NS, end_uuid, "ch-race")
        assert stored is not None and stored.attempt == f"proc-{winners[0]}"
        assert claims[winners[0]][1] == stored
        for i, (_kind, err) in claims.items():
            if i != winners[0]:
                assert isinstance(err, EndCheckpointConflictError)
                assert err.stored == stored and err.attempted.attempt == f"proc-{i}"
        plans = [plan for _, _, plan in outcomes]
        assert all(kind == "ok" for kind, _ in plans), plans
        manifests = {m for _, m in plans}
        assert len(manifests) == 1
        assert store.get_batch(NS, manifest_uuid).manifest == manifests.pop()
        assert store.get_batch(NS, manifest_uuid).state is BatchState.PLANNED
