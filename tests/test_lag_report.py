"""Spark's progress-report lag (``connector.latest_offset_report``) on every backend, without
Spark: the reporter on a real ``StreamProtocol`` over the embedded store, the same store over
the emulator's wire, and DynamoDB Streams on moto. The figure is always a number, and each
batch start gets its own figure even when batches follow each other at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.latest_offset_report import LatestOffsetReporter
from connector.protocol import StreamProtocol
from testkit.backends import BACKEND_KINDS, Backend, WireBackend, open_backend
from testkit.partition_reads import read_partition

pytestmark = pytest.mark.usefixtures("aws_test_credentials")  # boto3 reads them


@pytest.fixture(params=BACKEND_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = open_backend(request.param, tmp_path, request)
    yield b
    b.close()


def one_batch(proto: StreamProtocol, start: dict) -> tuple[dict, int]:
    """One micro-batch in Spark's order; its end and the records it read."""
    end = proto.latest_offset(start, None)
    read = sum(1 for p in proto.plan(start, end) for _ in read_partition(p))
    proto.commit(end)
    return end, read


def test_back_to_back_batches_each_get_the_lag_of_their_own_start(backend):
    """AvailableNow plans batches back to back, well within the reuse interval (the clock
    here never moves): each report counts from its own batch's start, not an earlier one."""
    backend.write(range(40))
    proto = StreamProtocol(backend.options(maxOffsetsPerChannel="8"))
    reporter = LatestOffsetReporter(proto, clock=lambda: 100.0)
    try:
        start = proto.initial_offset()
        behind = [reporter.report(proto.uuid_of(start))["recordsBehindLatest"]]
        reads = []
        for _ in range(2):
            start, n = one_batch(proto, start)
            reads.append(n)
            report = reporter.report(proto.uuid_of(start))
            assert report["lagExact"], report
            behind.append(report["recordsBehindLatest"])
        assert all(0 < n < 40 for n in reads), reads
        assert behind == [40, 40 - reads[0], 40 - reads[0] - reads[1]]
        # the same start again within the interval: the figure is reused, not measured
        measured = reporter.measurements
        assert reporter.report(proto.uuid_of(start)) is report
        assert reporter.measurements == measured
    finally:
        proto.close()


def test_a_split_whose_children_wait_still_gives_a_number(backend):
    """Rows before a split sit in the parent, rows after it in the children, which wait until
    the parent is read to its end. The embedded store and DynamoDB Streams count the waiting
    children (Streams serves them); Tablestore's service does not, so a child counts 0, a
    lower bound, said by ``exact``/``lagExact`` false."""
    backend.write(range(10))
    backend.split()
    backend.write(range(10, 30))
    proto = StreamProtocol(backend.options())
    reporter = LatestOffsetReporter(proto)
    try:
        report = reporter.report(proto.uuid_of(proto.initial_offset()))
        figures = {ch: (e["recordsBehind"], e["exact"]) for ch, e in report["channels"].items()}
        assert isinstance(report["secondsBehindLatest"], float)
        assert len(figures) == 4  # the split one, its two children, the other channel
        if isinstance(backend, WireBackend):
            rows = backend.writer.list_channels("t")
            children = {c.channel_id for c in rows if c.parent_ids}
            assert len(children) == 2
            # the parents are counted exactly; a waiting child is 0, a lower bound
            assert figures == {c.channel_id: (0, False) if c.channel_id in children
                               else (c.head_seq, True) for c in rows}
            assert report["recordsBehindLatest"] == 30 - sum(
                c.head_seq for c in rows if c.channel_id in children)
            assert not report["lagExact"]
        else:
            assert report["recordsBehindLatest"] == 30 and report["lagExact"], report
            assert all(exact for _, exact in figures.values())
    finally:
        proto.close()
