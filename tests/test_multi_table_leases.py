"""A multi-table query's leases across a kill, without Spark (connector.multiplex,
connector.planning.lease): each table has a lease of its own, all carrying the planning
process's owner id. A table that joined just before the kill has no batch of its own to prove
the restart by; it waits (state ``waiting: ...``, not failed) until another table has proved the
killed process was this query's, then its lease is taken over too, and its rows are read."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import connector.multiplex as multiplex
from connector.local import LocalTablestore
from connector.multiplex import MultiTableStreamReader
from connector.planning import lease as lease_module
from connector.table_selection import MultiTableOptions
from connector.table_state import State, TableState


def _reader(path: Path) -> MultiTableStreamReader:
    return MultiTableStreamReader(MultiTableOptions.from_spark({
        "endpoint": f"local://{path}", "tables": "*", "tunnel.name": "t",
        "tables.refreshIntervalMs": "0"}))


def _read(reader: MultiTableStreamReader, start: dict, end: dict) -> list[tuple[str, str]]:
    executor = pickle.loads(pickle.dumps(reader))  # as Spark sends it
    return [(r["_table"], r["_key"]) for p in reader.partitions(start, end)
            for b in executor.read(p) for r in b.to_pylist()]


def test_a_table_that_joined_just_before_a_kill_is_taken_over_with_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = ["process-1"]
    monkeypatch.setattr(lease_module, "owner_id", lambda: owner[0])
    monkeypatch.setattr(lease_module, "_predecessors", set())  # owner names repeat per test
    path = tmp_path / "s.db"
    with LocalTablestore(path) as store:
        store.create_table("t1", [("id", "INTEGER")], [("v", "STRING")], channels=1)
        store.put_row("t1", {"id": 1}, {"v": "x"})
        first = _reader(path)
        start = first.initialOffset()
        end = first.latestOffset(start, None)
        assert _read(first, start, end) == [("t1", '{"id":1}')]
        first.commit(end)
        # a table created while it runs ("a2": planned before t1 after the restart) joins
        # with its initial offset; Spark logs that batch, then the process is SIGKILLed
        store.create_table("a2", [("id", "INTEGER")], [("v", "STRING")], channels=1)
        store.put_row("a2", {"id": 7}, {"v": "y"})
        joined = first.latestOffset(end, None)
        assert first.table_states["a2"] == TableState(State.NEW)

        owner[0] = "process-2"  # the restart: the killed process's leases are all still live
        monkeypatch.setattr(multiplex, "LEASE_RETRY_S", 0.0)
        restarted = _reader(path)
        assert _read(restarted, end, joined) == []  # Spark runs the logged batch again
        restarted.commit(joined)  # a2 first: refused, then t1 proves the restart
        after = restarted.latestOffset(joined, None)
        assert restarted.table_states == {"a2": TableState(State.STREAMING),
                                          "t1": TableState(State.STREAMING)}
        assert _read(restarted, joined, after) == [("a2", '{"id":7}')]
        restarted.commit(after)
        restarted.stop()


def test_a_table_held_by_another_query_waits_rather_than_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = ["other-query"]
    monkeypatch.setattr(lease_module, "owner_id", lambda: owner[0])
    monkeypatch.setattr(lease_module, "_predecessors", set())  # owner names repeat per test
    monkeypatch.setattr(multiplex, "LEASE_RETRY_S", 0.0)
    path = tmp_path / "s.db"
    with LocalTablestore(path) as store:
        store.create_table("t1", [("id", "INTEGER")], [("v", "STRING")], channels=1)
        store.put_row("t1", {"id": 1}, {"v": "x"})
    other = _reader(path)
    other.latestOffset(other.initialOffset(), None)  # holds t1's lease, alive
    owner[0] = "this-query"
    mine = _reader(path)
    start = mine.initialOffset()  # the same generation: decided at the next call
    frozen = mine.latestOffset(start, None)
    assert frozen == start  # not read, and not failed: it waits
    waiting = mine.table_states["t1"]
    assert waiting.state is State.WAITING and waiting.reason is not None
    assert waiting.reason.startswith("option 'tunnel.name'")
    assert "being read by another query" in waiting.reason
    other.stop()  # the other query stops: its lease is released
    moved = mine.latestOffset(start, None)
    assert mine.table_states["t1"] == TableState(State.STREAMING) and moved != start
    mine.stop()
