"""A randomized model of Spark's micro-batch loop over the real protocol objects (no Spark).

``SparkModel`` keeps what Spark keeps in a checkpoint directory (the offset log, the commit log)
and a sink that is idempotent per batch id, and drives ``StreamProtocol`` and ``read_partition``
in Spark's call order over a real embedded store and a real SQLite meta store. A crash drops
the protocol object (its clients closed) and the next step opens a new one, as a restarted
driver would. Per seed, at random:

- crashes before ``latestOffset``, after it (minted, never logged), before planning, between
  partition reads, after the sink wrote (a replay follows), between Spark's commit log and the
  source's ``commit`` (a lost commit), and restarts with nothing in flight;
- duplicate attempts of a partition, with new writes to the table in between;
- Spark's checkpoint restored behind the meta table (the last offsets/commits entries removed);
- an operator's ``meta gc`` that collects minted rows at once;
- writes, updates, deletes, channel splits and merges at any point;
- ``maxOffsetsPerChannel``, ``commitInterval``, ``metaRetentionBatches``, ``skipEmptyBatches``
  and the read limit (``maxOffsetsPerTrigger``).

After the chaos the loop runs without faults until the source is idle; then every change of
the table must be in the sink exactly once, each channel in order, children after their
parents, no batch above the read limit, and every rewrite of a batch id identical to the first.

Seeds: ``PROTOCOL_MODEL_SEEDS`` (default 100) from ``PROTOCOL_MODEL_FIRST_SEED`` (default 0).
A failure names its seed; rerun it alone with
``PROTOCOL_MODEL_FIRST_SEED=<seed> PROTOCOL_MODEL_SEEDS=1 pytest tests/test_protocol_model.py``.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from connector import protocol
from connector.errors import InvalidChannelOperationError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from testkit.partition_reads import read_partition

FIRST_SEED = int(os.environ.get("PROTOCOL_MODEL_FIRST_SEED", "0"))
SEEDS = int(os.environ.get("PROTOCOL_MODEL_SEEDS", "100"))

Key = tuple[str, str]  # (channel id, sequence)


class Crash(Exception):
    """A simulated driver crash at a named point."""


class SparkModel:
    """Spark's checkpoint directory and micro-batch loop, for one query."""

    def __init__(self, rng: random.Random, store: LocalTablestore, options: SourceOptions,
                 limit: int | None, crash_rate: float) -> None:
        self.rng = rng
        self.store = store
        self.options = options
        self.limit = limit
        self.crash_rate = crash_rate
        self.offsets: list[dict] = []  # offsets[n]: the end offset of batch n (offset log)
        self.committed = -1  # newest batch id in the commit log
        self.initial: dict | None = None
        self.sink: dict[int, list[Key]] = {}
        self.proto: StreamProtocol | None = None
        self.events: list[str] = []
        self.draining = False  # the final phase: no faults, no writes

    # --- faults -----------------------------------------------------------------------------

    def maybe_crash(self, point: str) -> None:
        if self.crash_rate and self.rng.random() < self.crash_rate:
            raise Crash(point)

    def restart(self, why: str) -> None:
        self.events.append(f"restart ({why})")
        if self.proto is not None:
            self.proto.close()
        self.proto = None

    def open(self) -> StreamProtocol:
        if self.proto is None:
            self.proto = StreamProtocol(self.options)
        return self.proto

    # --- Spark's loop ----------------------------------------------------------------------

    def start_of(self, n: int) -> dict:
        """Batch n's start: batch n-1's end, or ``initialOffset`` for batch 0 (never logged)."""
        if n > 0:
            return self.offsets[n - 1]
        offset = self.open().initial_offset()
        if self.initial is not None:  # stable until batch 0 commits
            assert offset == self.initial, "initialOffset changed before batch 0 committed"
        self.initial = offset
        return offset

    def step(self) -> bool:
        """One trigger: replay the logged, uncommitted batch, or ask for a new one. Returns
        False when the source had nothing new."""
        proto = self.open()
        n = len(self.offsets)
        if n - 1 > self.committed:
            self.run_batch(n - 1)
            return True
        start = self.start_of(n)
        self.maybe_crash("before latestOffset")
        end = proto.latest_offset(start, self.limit)
        if end == start:
            return False
        self.maybe_crash("after latestOffset, before the offset log")
        self.offsets.append(end)
        self.run_batch(n)
        return True

    def run_batch(self, n: int) -> None:
        proto = self.open()
        start, end = self.start_of(n), self.offsets[n]
        self.maybe_crash("before planning")
        parts = proto.plan(start, end)
        got: list[Key] = []
        for part in parts:
            self.maybe_crash("between partition reads")
            records = keys(read_partition(part))
            if self.rng.random() < 0.15:  # a duplicate attempt, new writes in between
                if self.crash_rate or not self.draining:
                    self.store_event()
                assert keys(read_partition(part)) == records, "a second attempt differed"
            got += records
        self.maybe_crash("before the sink")
        if n in self.sink:
            assert sorted(self.sink[n]) == sorted(got), f"batch {n} rewritten differently"
        self.sink[n] = got
        self.maybe_crash("after the sink, before the commit log")
        self.committed = n
        self.maybe_crash("after the commit log, before commit()")
        proto.commit(end)

    # --- the world around it ------------------------------------------------------------------

    def store_event(self) -> None:
        roll = self.rng.random()
        if roll < 0.80:
            for _ in range(self.rng.randint(1, 12)):
                key = {"id": self.rng.randrange(60)}
                op = self.rng.random()
                if op < 0.7:
                    self.store.put_row("t", key, {"v": self.rng.randrange(1000)})
                elif op < 0.85:
                    self.store.update_row("t", key, {"v": self.rng.randrange(1000)})
                else:
                    self.store.delete_row("t", key)
            return
        open_channels = sorted((c for c in self.store.list_channels("t") if not c.closed),
                               key=lambda c: c.range_lo)
        if roll < 0.90 and len(open_channels) < 8:
            victim = self.rng.choice(open_channels)
            self.store.split_channel("t", victim.channel_id)
            self.events.append(f"split {victim.channel_id}")
        elif len(open_channels) > 1:
            i = self.rng.randrange(len(open_channels) - 1)
            a, b = open_channels[i], open_channels[i + 1]
            try:
                self.store.merge_channels("t", a.channel_id, b.channel_id)
                self.events.append(f"merge {a.channel_id}+{b.channel_id}")
            except InvalidChannelOperationError:
                pass

    def restore_checkpoint(self) -> None:
        """Spark's checkpoint restored behind the meta table: drop its newest entries, as long
        as a committed batch stays and the meta table still holds the batch it resumes from."""
        if self.committed < 1:
            return
        keep = self.rng.randint(1, self.committed)  # batches 0..keep-1 stay logged
        proto = self.open()
        resume = self.offsets[keep - 1]
        if proto.meta.find_batch(proto.namespace, resume["uuid"]) is None:
            return  # beyond retention: refused, covered by tests/test_protocol_exact_or_refused.py
        self.offsets = self.offsets[:keep]
        self.committed = keep - 1 if self.rng.random() < 0.7 else keep - 2
        self.committed = max(self.committed, 0)
        self.events.append(f"checkpoint restored to batch {keep - 1}")
        self.restart("restore")

    def operator_gc(self) -> None:
        proto = self.open()
        proto.meta.gc(proto.namespace, self.options.meta_retention_batches,
                      minted_older_than_s=0.0, now=1e12)
        self.events.append("meta gc")


def keys(records: list) -> list[Key]:
    return [(r.channel_id, r.sequence) for r in records]


def run_model(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    # batch UUIDs from the seed too (they rotate cap remainders), so a seed replays exactly
    ids = random.Random(seed + 1_000_003)
    with mock.patch.object(protocol.uuid_lib, "uuid4",
                           lambda: uuid.UUID(int=ids.getrandbits(128), version=4)):
        _run_model(seed, rng, tmp_path)


def _run_model(seed: int, rng: random.Random, tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=rng.randint(1, 4))
    extra = {
        "maxOffsetsPerChannel": str(rng.choice([2, 3, 7, 50])),
        "commitInterval": str(rng.choice([1, 1, 2, 4])),
        "metaRetentionBatches": str(rng.choice([1, 2, 5, 100])),
        "skipEmptyBatches": rng.choice(["true", "false"]),
        "channelRefreshIntervalMs": "0",
    }
    limit = rng.choice([None, None, 1, 4, 10, 25])
    options = SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                        "tunnel.name": "q", **extra})
    spark = SparkModel(rng, store, options, limit, crash_rate=rng.choice([0.0, 0.03, 0.08]))
    context = f"seed={seed} options={extra} limit={limit}"
    try:
        for _ in range(rng.randint(20, 45)):
            roll = rng.random()
            if roll < 0.45:
                spark.store_event()
            elif roll < 0.50:
                spark.restart("stop and start")
            elif roll < 0.53:
                spark.restore_checkpoint()
            elif roll < 0.56:
                spark.operator_gc()
            try:
                spark.step()
            except Crash as crash:
                spark.restart(str(crash))
        spark.crash_rate, spark.draining = 0.0, True  # drain without faults or writes
        idle = 0
        for _ in range(5000):
            ran = spark.step()
            empty = not ran or not spark.sink.get(len(spark.offsets) - 1)
            idle = idle + 1 if empty else 0
            if idle >= 4:
                break
        else:
            raise AssertionError("the source never went idle")
        check(spark, store, limit)
    except BaseException as exc:
        events = "; ".join(spark.events[-15:])
        raise AssertionError(f"{context} failed: {exc!r}\nlast events: {events}\nrerun: "
                             f"PROTOCOL_MODEL_FIRST_SEED={seed} PROTOCOL_MODEL_SEEDS=1 pytest "
                             "tests/test_protocol_model.py") from exc
    finally:
        if spark.proto is not None:
            spark.proto.close()
        store.close()


def check(spark: SparkModel, store: LocalTablestore, limit: int | None) -> None:
    delivered = [(n, k) for n in sorted(spark.sink) for k in spark.sink[n]]
    counts = Counter(k for _, k in delivered)
    twice = [k for k, c in counts.items() if c > 1]
    assert not twice, f"delivered more than once: {twice[:5]}"
    expected = {(r.channel_id, r.sequence) for r in store.change_log("t")}
    missing = expected - set(counts)
    assert not missing, f"{len(missing)} change(s) never delivered: {sorted(missing)[:5]}"
    assert set(counts) <= expected
    batch_of = dict((k, n) for n, k in delivered)
    last_seq: dict[str, str] = {}
    for _, (channel, sequence) in delivered:  # batch order, then read order
        assert sequence > last_seq.get(channel, ""), f"channel {channel} out of order"
        last_seq[channel] = sequence
    for channel in store.list_channels("t"):
        mine = [n for (ch, _), n in batch_of.items() if ch == channel.channel_id]
        for parent in channel.parent_ids:
            theirs = [n for (ch, _), n in batch_of.items() if ch == parent]
            if mine and theirs:
                assert min(mine) > max(theirs), f"{channel.channel_id} read beside {parent}"
    if limit is not None:
        assert all(len(v) <= limit for v in spark.sink.values()), "a batch above the limit"


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when the machine has one: the meta store syncs every write to
    disk (synchronous=FULL), which would make this model I/O-bound for no insight."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="protocol-model-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_spark_loop_model(seed: int, fast_dir: Path) -> None:
    logging.getLogger("connector").setLevel(logging.WARNING)
    run_model(seed, fast_dir)
