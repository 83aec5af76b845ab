"""The network-fault harness's own checks can fail: the meta-table chain check
(``integration.netfaults.harness.meta_consistency``) on a real SQLite meta store, one healthy
chain and the ways a broken one shows. Fast: no Spark."""

from __future__ import annotations

from pathlib import Path

from integration.netfaults.harness import meta_consistency
from meta_store import BatchState, ChannelStart, EndCheckpoint, Manifest, open_meta_store

NS = "ns"


def _manifest(**starts: str) -> Manifest:
    return Manifest(channels=tuple(ChannelStart(channel_id=c, token=t, sequence_number=0,
                                                max_records=100) for c, t in starts.items()),
                    planned_at=1.0)


def _end(channel: str, start: str, token: str) -> EndCheckpoint:
    return EndCheckpoint(channel_id=channel, start_token=start, token=token, sequence_number=1,
                         records=1, attempt="h/1/t", written_at=1.0)


def _chain(tmp_path: Path, second_start: str = "a1", second_end_start: str = "a1",
           with_end: bool = True) -> list[str]:
    meta = open_meta_store(f"sqlite:///{tmp_path / 'meta.db'}")
    meta.create_batch(NS, "u0", None, state=BatchState.PLANNED, manifest=_manifest(a="a0"),
                      now=1.0)
    meta.create_batch(NS, "u1", "u0", now=2.0)
    meta.put_manifest(NS, "u1", "u0", _manifest(a="a0"))
    meta.put_end_checkpoint(NS, "u1", _end("a", "a0", "a1"))
    meta.create_batch(NS, "u2", "u1", now=3.0)
    meta.put_manifest(NS, "u2", "u1", _manifest(a=second_start))
    if with_end:
        meta.put_end_checkpoint(NS, "u2", _end("a", second_end_start, "a2"))
    meta.mark_committed(NS, "u2")
    try:
        return meta_consistency(meta, NS)
    finally:
        meta.close()


def test_a_healthy_chain_passes(tmp_path: Path) -> None:
    assert _chain(tmp_path) == []


def test_a_batch_that_does_not_start_where_the_last_ended_is_reported(tmp_path: Path) -> None:
    problems = _chain(tmp_path, second_start="a0", second_end_start="a0")
    assert len(problems) == 1 and "starts at 'a0', the previous batch ended at 'a1'" in problems[0]


def test_an_end_from_another_start_and_a_missing_end_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert "ended from 'zz', planned from 'a1'" in _chain(tmp_path / "a",
                                                          second_end_start="zz")[0]
    assert "has no end" in _chain(tmp_path / "b", with_end=False)[0]
