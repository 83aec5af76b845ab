"""An expired Tablestore tunnel, without Spark: the emulator's ``expire_tunnel`` hook as this
project's client sees it over the wire, and the driver protocol (``connector.planning.expiry``)
called in Spark's order on a real local store, a real SQLite meta store and the emulator.

- The emulator shows ``TunnelInfo.expired`` and answers every call naming the expired tunnel's
  id with ``OTSTunnelExpired`` (``TunnelExpiredError``); a deleted one is forgotten.
- ``onDataLoss=fail``: the query stops on ``TunnelExpiredError``.
- ``onDataLoss=resnapshot``: one signal, the tunnel created again, a batch planned on the
  expired tunnel replayed empty, and the stream goes on with the changes after the new tunnel;
  a replacement interrupted after the deletion is finished by the next start.

The same over a real Spark: tests/test_resnapshot_emulator_spark.py (slow).
"""

from __future__ import annotations

from typing import Any

import pytest

from connector.errors import TunnelExpiredError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.tunnel import Checkpoint, Record, TunnelService
from meta_store.signals import SignalBoard

pytest.importorskip("tablestore")

from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import SOURCE_OPTIONS
from testkit.fixtures import put_rows
from testkit.protocol_runs import run_batch


def options(emulator: EmulatorServer, store: LocalTablestore, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": emulator.url, "table.name": "t",
                                     "tunnel.name": "q", **SOURCE_OPTIONS,
                                     "meta.store": f"sqlite://{store.path}.meta", **extra})


def ids(records: list[Record]) -> list[int]:
    return sorted(r.primary_key["id"] for r in records)


def test_the_emulator_expires_a_tunnel_as_the_service_reports_it(
        emulator: EmulatorServer, store: LocalTablestore) -> None:
    proto = StreamProtocol(options(emulator, store))
    tunnel = proto.tunnel
    info = tunnel.ensure_tunnel("t", "q")
    channel = tunnel.describe_tunnel("t", "q").channels[0].channel_id
    start = tunnel.get_checkpoint(info.tunnel_id, channel)
    assert not info.expired
    assert emulator.expire_tunnel("t", "q") == info.tunnel_id
    assert tunnel.describe_tunnel("t", "q").tunnel.expired
    assert [t.expired for t in tunnel.list_tunnels("t")] == [True]
    calls: list[Any] = [
        lambda: tunnel.get_checkpoint(info.tunnel_id, channel),
        lambda: tunnel.checkpoint(info.tunnel_id, "ch-0001",  # (a channel not pushed yet)
                                  Checkpoint(start.token, start.sequence_number + 1)),
        lambda: tunnel.read_records(info.tunnel_id, channel, start.token, 10),
    ]
    for call in calls:
        with pytest.raises(TunnelExpiredError, match="OTSTunnelExpired"):
            call()
    tunnel.delete_tunnel("t", "q")
    again = tunnel.ensure_tunnel("t", "q")
    assert not again.expired and again.tunnel_id != info.tunnel_id
    tunnel.get_checkpoint(again.tunnel_id, channel)  # answered
    proto.close()


def test_under_fail_a_restart_on_an_expired_tunnel_stops_on_the_typed_error(
        emulator: EmulatorServer, store: LocalTablestore) -> None:
    put_rows(store, range(10))
    first = StreamProtocol(options(emulator, store))
    end, _ = run_batch(first, first.initial_offset())
    first.close()
    emulator.expire_tunnel("t", "q")
    again = StreamProtocol(options(emulator, store))
    with pytest.raises(TunnelExpiredError, match="OTSTunnelExpired"):
        run_batch(again, end)
    again.close()


def test_under_resnapshot_an_expired_tunnel_is_replaced_and_the_stream_goes_on(
        emulator: EmulatorServer, store: LocalTablestore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    put_rows(store, range(10))
    opts = options(emulator, store, onDataLoss="resnapshot")
    first = StreamProtocol(opts)
    end, seen = run_batch(first, first.initial_offset())
    assert ids(seen) == list(range(10))
    put_rows(store, range(10, 15))
    planned = first.latest_offset(end, None)  # in Spark's offset log, never committed
    assert first.plan(end, planned)  # (planned, never read)
    first.close()
    expired_id = emulator.expire_tunnel("t", "q")
    put_rows(store, range(15, 20))  # lost with the tunnel: the resnapshot repairs them

    interrupted = StreamProtocol(opts)  # dies after deleting the expired tunnel
    monkeypatch.setattr(TunnelService, "ensure_tunnel",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError, match="killed"):
        interrupted.plan(end, planned)
    monkeypatch.undo()
    interrupted.close()

    again = StreamProtocol(opts)
    assert again.plan(end, planned) == []  # planned on the expired tunnel: replayed empty
    again.commit(planned)
    assert again.tunnel_id != expired_id
    put_rows(store, range(20, 25))  # on the new tunnel
    _, more = run_batch(again, planned)
    assert ids(more) == list(range(20, 25))
    signals = SignalBoard(again.meta, again.namespace).signals()
    assert [(s.table, s.origin) for s in signals] == [("t", "data-loss")]
    assert expired_id in signals[0].note
    again.close()
