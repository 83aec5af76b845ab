"""A multi-table query at rest costs little (connector.multiplex): after an empty planning round
the tables are not asked again for a while that doubles up to the cap, the first change found
resets it, or at once where the store's one question for every table says something changed,
and a table's lag is measured again only when its position moved. Over a real local store,
without Spark; the backoff on the seam's fake clock."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from connector import latest_offset_report
from connector.clients import ClientHooks, Clients
from connector.local import LocalTablestore
from connector.multiplex import (
    IDLE_ANSWER_MAX_S,
    IDLE_BACKOFF_FIRST_S,
    IDLE_MARKED_MAX_S,
    MARK_READ_EVERY_S,
    MultiTableStreamReader,
)
from connector.table_selection import MultiTableOptions
from connector.tunnel.local.service import LocalTunnelService
from testkit.clock import FakeClock


def _reader(path: Path, clock: FakeClock | None = None,
            backoff: float = 0.0) -> MultiTableStreamReader:
    clients = Clients(ClientHooks(clock=clock.monotonic)) if clock is not None else None
    return MultiTableStreamReader(MultiTableOptions.from_spark({
        "endpoint": f"local://{path}", "tables": "t*", "tunnel.name": "idle"}), clients,
        idle_backoff_max_s=backoff)


def _store(path: Path, tables: int) -> LocalTablestore:
    store = LocalTablestore(path)
    for i in range(tables):
        store.create_table(f"t{i}", [("id", "INTEGER")], [("v", "STRING")], channels=1)
    return store


def _batch(reader: MultiTableStreamReader, start: dict) -> dict:
    """One trigger as Spark runs it: the latest offset, and when it moved, the batch's plan
    and commit; the next batch's start."""
    end = reader.latestOffset(start, None)
    if end != start:
        executor = pickle.loads(pickle.dumps(reader))  # as Spark sends it
        for partition in reader.partitions(start, end):
            list(executor.read(partition))
        reader.commit(end)
    return end


def test_the_idle_backoff_doubles_up_to_its_cap_and_a_change_resets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(LocalTunnelService, "change_mark")  # a backend without one question
    clock = FakeClock(start=1000.0)
    with _store(tmp_path / "s.db", 3) as store:
        reader = _reader(tmp_path / "s.db", clock, backoff=0.4)
        start = _batch(reader, reader.initialOffset())  # empty tables: nothing new
        waits = [reader.idle_wait]
        for _ in range(5):  # empty rounds, each once its wait has passed
            clock.now += reader.idle_wait
            rounds = reader.rounds
            assert _batch(reader, start) == start
            assert reader.rounds == rounds + 1
            waits.append(reader.idle_wait)
            assert _batch(reader, start) == start  # within the wait: no table asked
            assert reader.rounds == rounds + 1
        assert waits == [IDLE_BACKOFF_FIRST_S, 0.1, 0.2, 0.4, 0.4, 0.4]

        store.put_row("t1", {"id": 1}, {"v": "x"})
        assert _batch(reader, start) == start  # still within the last wait
        clock.now += reader.idle_wait
        moved = _batch(reader, start)  # the next round finds it, and resets the backoff
        assert moved["tables"]["t1"] != start["tables"]["t1"]
        assert moved["tables"]["t0"] == start["tables"]["t0"]
        assert reader.idle_wait == 0.0
        assert _batch(reader, moved) == moved  # asked at once: the batch's own round
        assert reader.idle_wait == IDLE_BACKOFF_FIRST_S
        reader.stop()


def test_a_changed_store_mark_ends_the_wait_at_once(tmp_path: Path) -> None:
    clock = FakeClock(start=1000.0)
    with _store(tmp_path / "s.db", 3) as store:
        reader = _reader(tmp_path / "s.db", clock, backoff=0.4)
        start = _batch(reader, reader.initialOffset())
        waits = [reader.idle_wait]
        for _ in range(12):
            clock.now += reader.idle_wait
            assert _batch(reader, start) == start
            waits.append(reader.idle_wait)
        assert waits[:4] == [IDLE_BACKOFF_FIRST_S, 0.1, 0.2, 0.4]
        assert waits[-1] == IDLE_MARKED_MAX_S  # the mark wakes it: the cap may be long
        rounds = reader.rounds
        clock.now += 1.0  # well within the wait; the mark is read again
        assert _batch(reader, start) == start and reader.rounds == rounds  # unchanged
        store.put_row("t2", {"id": 1}, {"v": "x"})
        assert _batch(reader, start) == start and reader.rounds == rounds  # read once per
        clock.now += MARK_READ_EVERY_S  # ... MARK_READ_EVERY_S at most
        moved = _batch(reader, start)
        assert reader.rounds == rounds + 1
        assert moved["tables"]["t2"] != start["tables"]["t2"] and reader.idle_wait == 0.0
        reader.stop()


def test_without_a_cap_every_round_asks_every_table(tmp_path: Path) -> None:
    with _store(tmp_path / "s.db", 2) as store:
        reader = _reader(tmp_path / "s.db")
        start = _batch(reader, reader.initialOffset())
        for _ in range(3):
            assert _batch(reader, start) == start
        assert reader.rounds == 4 and reader.idle_wait == 0.0
        store.put_row("t0", {"id": 1}, {"v": "x"})
        assert _batch(reader, start) != start
        reader.stop()


def test_the_lag_is_measured_again_only_for_tables_whose_position_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every measurement due at once: only the source's own rule keeps a table from being asked
    monkeypatch.setattr(latest_offset_report, "MIN_REFRESH_S", 0.0)
    monkeypatch.setattr(latest_offset_report, "REFRESH_FACTOR", 0.0)
    asked: list[str] = []
    real_lag = LocalTunnelService.lag

    def counted(self: LocalTunnelService, tunnel_id: str, positions: Any) -> Any:
        asked.append(tunnel_id)
        return real_lag(self, tunnel_id, positions)

    monkeypatch.setattr(LocalTunnelService, "lag", counted)
    with _store(tmp_path / "s.db", 10) as store:
        reader = _reader(tmp_path / "s.db")
        start = _batch(reader, reader.initialOffset())
        reader.reportLatestOffset()
        assert len(asked) == 10  # each table's first figures
        asked.clear()
        for _ in range(3):  # idle rounds: nothing moved, nothing measured
            assert _batch(reader, start) == start
            report = reader.reportLatestOffset()
        assert asked == []
        assert {t: lag["recordsBehind"] for t, lag in report["lag"].items()} == {
            f"t{i}": 0 for i in range(10)}

        store.put_row("t3", {"id": 1}, {"v": "x"})
        end = reader.latestOffset(start, None)
        report = reader.reportLatestOffset()
        assert len(asked) == 1  # t3 only: its latest offset moved
        assert report["lag"]["t3"]["recordsBehind"] == 1
        executor = pickle.loads(pickle.dumps(reader))
        for partition in reader.partitions(start, end):
            list(executor.read(partition))
        reader.commit(end)
        asked.clear()
        assert _batch(reader, end) == end
        report = reader.reportLatestOffset()
        assert len(asked) == 1  # t3 again: its batch start moved
        assert report["lag"]["t3"]["recordsBehind"] == 0
        asked.clear()
        assert _batch(reader, end) == end
        reader.reportLatestOffset()
        assert asked == []
        reader.stop()


def test_a_waiting_round_holds_its_answer_reading_the_mark_until_a_write_ends_it(
        tmp_path: Path) -> None:
    clock = FakeClock(start=1000.0)
    with _store(tmp_path / "s.db", 2) as store:
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path / 's.db'}", "tables": "t*", "tunnel.name": "idle"}),
            Clients(ClientHooks(clock=clock.monotonic)), idle_backoff_max_s=1.0,
            idle_pause=clock.sleep)
        start = _batch(reader, reader.initialOffset())
        rounds = reader.rounds
        began = clock.now
        for _ in range(20):  # Spark's polls while every table is idle
            assert _batch(reader, start) == start
        # each answer held ~IDLE_ANSWER_MAX_S, the mark read every MARK_READ_EVERY_S meanwhile
        assert clock.sleeps and max(clock.sleeps) <= MARK_READ_EVERY_S + 1e-9  # (float sums)
        # (answering every mark read, 20 polls took under 20 * MARK_READ_EVERY_S; the first
        # rounds' backoff is shorter than a held answer and ends it)
        assert clock.now - began >= 10 * IDLE_ANSWER_MAX_S
        # waited, not asked: only the doubling backoff's rounds (0.05 s, 0.1 s, ... 3.2 s)
        assert reader.rounds - rounds <= 8
        store.put_row("t0", {"id": 1}, {"v": "x"})
        held_from = clock.now
        moved = reader.latestOffset(start, None)  # one poll: the held answer is the change
        assert moved["tables"]["t0"] != start["tables"]["t0"]
        assert clock.now - held_from <= MARK_READ_EVERY_S + 1e-9  # the next mark read saw it
        reader.stop()


def test_without_a_mark_a_held_answer_waits_for_the_backoff_not_in_a_busy_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(LocalTunnelService, "change_mark")  # a backend without one question
    clock = FakeClock(start=1000.0)
    with _store(tmp_path / "s.db", 2):
        reader = MultiTableStreamReader(MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path / 's.db'}", "tables": "t*", "tunnel.name": "idle"}),
            Clients(ClientHooks(clock=clock.monotonic)), idle_backoff_max_s=1.0,
            idle_pause=clock.sleep)
        start = _batch(reader, reader.initialOffset())
        for _ in range(10):
            assert _batch(reader, start) == start
        assert 0 < len(clock.sleeps) <= 30 and all(s > 0 for s in clock.sleeps[1:])
        reader.stop()
