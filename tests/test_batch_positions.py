"""Positions after a batch (``connector.planning.positions``): one rule for the planner and the
progress feed, on hand-built batch rows."""

from __future__ import annotations

from connector.planning.positions import Position, positions_after_batch
from connector.tunnel import FINISHED
from meta_store import BatchRecord, BatchState, ChannelStart, EndCheckpoint, Manifest
from tablestore_cdc.feed.shapes import positions_after as feed_positions_after


def start(channel_id: str, token: str, sequence_number: int, last: str | None = None,
          parents: tuple[str, ...] = ()) -> ChannelStart:
    return ChannelStart(channel_id=channel_id, token=token, sequence_number=sequence_number,
                        max_records=100, parent_ids=parents, last_sequence=last)


def end(channel_id: str, token: str, sequence_number: int, last: str | None) -> EndCheckpoint:
    return EndCheckpoint(channel_id=channel_id, start_token="s", token=token,
                         sequence_number=sequence_number, records=3, attempt="test",
                         written_at=0.0, last_sequence=last)


BATCH = BatchRecord(
    uuid="u1", prev_uuid="u0", state=BatchState.COMMITTED, created_at=0.0,
    manifest=Manifest(planned_at=0.0, channels=(
        start("read", "t-read", 4, "0004", parents=("p",)),
        start("unread", "t-unread", 2, "0002"),
        start("ended", "t-ended", 9, "0009"),
    )))
ENDS = {
    "read": end("read", "t-read-2", 7, "0007"),
    "ended": end("ended", FINISHED, 10, "0009"),
    "stray": end("stray", "t-stray", 1, "0001"),  # outside the manifest: never expected
}


def test_an_end_checkpoint_wins_over_the_manifest_start():
    positions = positions_after_batch(BATCH, ENDS)
    assert positions == {
        "read": Position("t-read-2", 7, "0007", ("p",)),  # lineage from the manifest
        "unread": Position("t-unread", 2, "0002"),
        "ended": Position(FINISHED, 10, "0009"),
    }
    assert list(positions) == ["read", "unread", "ended"]  # manifest order
    assert positions["ended"].finished and not positions["read"].finished


def test_a_batch_without_a_manifest_has_no_positions():
    minted = BatchRecord(uuid="u2", prev_uuid="u1", state=BatchState.MINTED, created_at=0.0)
    assert positions_after_batch(minted, {}) == {}


def test_the_feed_shows_the_same_positions_as_json_and_an_end_outside_the_manifest():
    feed = feed_positions_after(BATCH, ENDS)
    planner = positions_after_batch(BATCH, ENDS)
    assert list(feed) == [*planner, "stray"]
    for channel_id, p in planner.items():
        assert feed[channel_id] == {"token": p.token, "sequence_number": p.sequence_number,
                                    "last_sequence": p.last_sequence, "finished": p.finished}
    assert feed["stray"] == {"token": "t-stray", "sequence_number": 1, "last_sequence": "0001",
                             "finished": False}
