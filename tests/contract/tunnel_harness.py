"""What every tunnel contract suite stands on: the backend harness, a reference consumer and the
suites' helpers (``tunnel_contract.py`` says how a backend plugs in).

The harness is a *fresh, empty* backend per test (function-scoped fixture). It gives the suites
``service`` (the ``TunnelService`` under test) and backend-side operations that produce data the
way a writer, or the service itself, would: ``create_table(name, channels)``, ``put(table, key,
value)``, ``update(table, key, value)``, ``delete(table, key)``, ``split(table, channel_id)``,
``merge(table, a, b)``, ``trim(table)`` (trim *all* history held now) and ``change_log(table)``.
Tables follow one convention: key column ``id`` (STRING), one attribute column ``value``
(INTEGER); ``put(t, "k1", 5)`` writes row ``{"id": "k1"}`` with ``{"value": 5}``.

A backend that cannot perform an operation (a real service cannot be told to split a channel)
calls ``pytest.skip("...")`` from that harness method; the tests that need it are skipped, the
rest still run. A backend whose ``has_new_data`` returns ``None`` ("can't tell") skips that test.

``consume`` below is a reference consumer loop (describe, read OPEN channels from their
checkpoints, push checkpoints, push FINISHED, pick up released children); the suites use it
for ordering checks and backends' own tests may use it for end-to-end runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
    Op,
    Record,
    StartPosition,
    TunnelService,
    TunnelType,
)


class TunnelHarness(Protocol):
    """What a backend's ``tunnel_harness`` fixture provides (see the module docstring)."""

    service: TunnelService

    def create_table(self, name: str, channels: int) -> None: ...
    def put(self, table: str, key: str, value: int) -> None: ...
    def update(self, table: str, key: str, value: int) -> None: ...
    def delete(self, table: str, key: str) -> None: ...
    def split(self, table: str, channel_id: str) -> tuple[str, str]: ...
    def merge(self, table: str, a: str, b: str) -> str: ...
    def trim(self, table: str) -> None: ...
    def change_log(self, table: str) -> list[Record]: ...


# --- a reference consumer -----------------------------------------------------------------------


@dataclass
class ConsumerState:
    """What a consumer remembers between passes: its position and pushed sequence per channel,
    and every record received, in the order received."""

    tunnel_id: str
    positions: dict[str, str] = field(default_factory=dict)
    seqnos: dict[str, int] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)


def consume_pass(
    service: TunnelService,
    table: str,
    tunnel_name: str,
    state: ConsumerState,
    limit: int = 500,
    on_records: Callable[[list[Record]], None] | None = None,
    pages: int = 4,
) -> tuple[int, int]:
    """One pass over the tunnel: read every OPEN channel (at most ``pages`` reads each, so a
    busy channel cannot starve the others), pushing a checkpoint after each read and FINISHED
    at a closed channel's end.

    Channels released by a FINISHED pushed in this pass are read in the next pass (after the
    next describe), so a child is never read before its parents. Returns ``(records read,
    channels finished)``.
    """
    read = finished = 0
    for info in service.describe_tunnel(table, tunnel_name).channels:
        if info.status is not ChannelStatus.OPEN:
            continue
        cid = info.channel_id
        if cid not in state.positions:
            cp = service.get_checkpoint(state.tunnel_id, cid)
            state.positions[cid], state.seqnos[cid] = cp.token, cp.sequence_number
        for _ in range(pages):
            if state.positions[cid] == FINISHED:
                break
            res = service.read_records(state.tunnel_id, cid, state.positions[cid], limit)
            state.records.extend(res.records)
            if on_records is not None and res.records:
                on_records(list(res.records))
            read += len(res.records)
            state.seqnos[cid] += len(res.records) + (res.next_token == FINISHED)
            if res.records or res.next_token == FINISHED:
                service.checkpoint(
                    state.tunnel_id, cid, Checkpoint(res.next_token, state.seqnos[cid])
                )
            state.positions[cid] = res.next_token
            finished += res.next_token == FINISHED
            if not res.may_more:
                break
    return read, finished


def consume(
    service: TunnelService,
    table: str,
    tunnel_name: str,
    state: ConsumerState | None = None,
    limit: int = 500,
) -> ConsumerState:
    """Read the tunnel until a pass finds nothing new (no records, no channel finished)."""
    if state is None:
        tunnel_id = service.describe_tunnel(table, tunnel_name).tunnel.tunnel_id
        state = ConsumerState(tunnel_id)
    while True:
        read, finished = consume_pass(service, table, tunnel_name, state, limit)
        if not read and not finished:
            return state


def per_key(records: Iterable[Record]) -> dict[str, list[tuple[str, Any]]]:
    """``{key: [(op, value), ...]}`` in the given order (value ``None`` for a DELETE)."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for r in records:
        value = None if r.op is Op.DELETE else r.columns.get("value")
        out.setdefault(r.primary_key["id"], []).append((r.op.value, value))
    return out


def read_all(
    service: TunnelService, tunnel_id: str, channel_id: str, token: str, limit: int = 1000
) -> tuple[list[Record], str]:
    """Read a channel from ``token`` until no more is available now: (records, next token)."""
    records: list[Record] = []
    while True:
        res = service.read_records(tunnel_id, channel_id, token, limit)
        records.extend(res.records)
        token = res.next_token
        if not res.may_more:
            return records, token


class ContractHelpers:
    """Helpers the role suites share (static: a suite's tests call them on ``self``)."""

    @staticmethod
    def _tunnel(
        h: TunnelHarness,
        table: str,
        name: str = "tun",
        tunnel_type: TunnelType = TunnelType.STREAM,
        start: StartPosition = StartPosition.EARLIEST,
    ) -> str:
        return h.service.create_tunnel(table, name, tunnel_type, start).tunnel_id

    @staticmethod
    def _statuses(h: TunnelHarness, table: str, name: str = "tun") -> dict[str, ChannelStatus]:
        return {c.channel_id: c.status for c in h.service.describe_tunnel(table, name).channels}

    @staticmethod
    def _only_channel(h: TunnelHarness, table: str, name: str = "tun") -> str:
        (cid,) = [c.channel_id for c in h.service.describe_tunnel(table, name).channels]
        return cid

    @staticmethod
    def _finish(h: TunnelHarness, tid: str, cid: str) -> list[Record]:
        """Read a closed channel from its checkpoint to FINISHED and push FINISHED."""
        cp = h.service.get_checkpoint(tid, cid)
        records, token = read_all(h.service, tid, cid, cp.token)
        assert token == FINISHED
        h.service.checkpoint(tid, cid, Checkpoint(FINISHED, cp.sequence_number + len(records) + 1))
        return records
