"""A table's state (connector.table_state): the progress report's text and a status record's
state and reason, read back as they were written, today's stored forms included."""

from __future__ import annotations

import json

import pytest

from connector.table_state import FINAL, PAUSED, READING, State, TableState, TableStateError
from tablestore_cdc.table_status import TableStatus

#: the texts a multi-table query's progress report holds (``reportLatestOffset``'s ``tables``)
REPORTED = [
    "new",
    "streaming",
    "dropped",
    "failed: option 'tables': table 'plain' has no stream; allowed: a table with a stream",
    "failed: batch 3: column v: a value of type STRING where the target holds long",
    "waiting: option 'tunnel.name': tunnel 't' of table 't1' is being read by another query",
    "restarting: TransientTunnelError: no answer (attempt 2, next in 4.0 s)",
    "restarting: EndpointUnreachableError: connection refused (attempt 11, next in 60.0 s)",
]


@pytest.mark.parametrize("text", REPORTED)
def test_the_reported_text_reads_back_and_writes_the_same(text: str) -> None:
    state = TableState.from_text(text)
    assert state.to_text() == text
    assert TableState.from_text(state.to_text()) == state


def test_a_restart_keeps_its_reason_attempt_and_delay_apart() -> None:
    state = TableState.from_text(
        "restarting: TransientTunnelError: no answer (attempt 2, next in 4.0 s)")
    assert state == TableState(State.RESTARTING, "TransientTunnelError: no answer", 2, 4.0)
    assert TableState.restarting("x", 3, 1.25).to_text() == "restarting: x (attempt 3, next in " \
        "1.2 s)"
    failed = TableState.from_text("failed: batch 3: refused: (attempt 1)")
    assert failed == TableState(State.FAILED, "batch 3: refused: (attempt 1)")


def test_the_jobs_own_restart_reason_is_read_with_its_figures() -> None:
    """``pipeline.job``'s ``record_status("restarting", "attempt n, next in N s: ...")``."""
    state = TableState.of("restarting", "attempt 1, next in 1.0 s: TransientTunnelError")
    assert state == TableState(State.RESTARTING, "TransientTunnelError", 1, 1.0)
    assert TableState.of("restarting", "attempt 4, next in 8 s") == TableState(
        State.RESTARTING, None, 4, 8.0)


@pytest.mark.parametrize("text", ["", "running", "Streaming", "failing: x", "streaming:x"])
def test_a_state_nothing_writes_is_a_typed_error(text: str) -> None:
    with pytest.raises(TableStateError, match="names no state") as raised:
        TableState.from_text(text)
    assert "streaming" in str(raised.value)  # the allowed states are named


def test_the_groups_of_states() -> None:
    assert READING == {State.NEW, State.SNAPSHOTTING, State.STREAMING, State.WAITING}
    assert all(s.reads == (s in READING) for s in State)
    assert FINAL == {State.DROPPED, State.FAILED}
    assert PAUSED == {State.WAITING, State.RESTARTING}
    # the feed's JSON Schema lists these, in this order (docs/progress-feed.schema.json)
    assert [s.value for s in State] == ["new", "snapshotting", "streaming", "waiting",
                                        "restarting", "unreachable", "dropped", "failed",
                                        "stopped"]


def test_a_stored_status_record_reads_back_and_is_written_as_before() -> None:
    """A record as the meta store holds it today: the state is its plain string."""
    stored = {"table": "orders", "job": "/data/out", "selection": "orders_*",
              "state": "unreachable", "reason": "TransientTunnelError: no answer",
              "unreachable_since": 1765000000.0, "attempt": 3, "next_attempt_at": 1765000060.0}
    status = TableStatus.model_validate_json(json.dumps(stored))
    assert status.state is State.UNREACHABLE
    written = json.loads(status.model_dump_json())
    assert {k: written[k] for k in stored} == stored
    assert status.model_dump(mode="json")["state"] == "unreachable"
    assert status.label().startswith("source unreachable (since 2025-12-06 ")
    failed = TableStatus(table="t", job="j", selection="t", state="failed", reason="batch 3: x")
    assert failed.label() == "failed: batch 3: x"
    assert json.loads(failed.model_dump_json())["state"] == "failed"


def test_a_status_of_a_state_takes_the_restart_figures_out_of_the_reason() -> None:
    restarting = TableState.from_text("restarting: no answer (attempt 2, next in 4.0 s)")
    status = TableStatus.of(restarting, table="t", job="j", selection="t", now=100.0)
    assert (status.state, status.reason, status.attempt, status.next_attempt_at) == (
        State.RESTARTING, "no answer", 2, 104.0)
    snapshotting = TableStatus.of(TableState(State.STREAMING), table="t", job="j",
                                  selection="t", now=0.0, snapshot_percent=40.0)
    assert snapshotting.state is State.SNAPSHOTTING
    assert snapshotting.label() == "snapshotting 40 %"
