"""``onDataLoss`` over the Tablestore wire: a stream stopped while its tunnel expired
(``OTSTunnelExpired``; the emulator's ``expire_tunnel`` hook) and restarted, on a real local
Spark, the source's rows written with the official ``tablestore`` SDK.

With ``onDataLoss=resnapshot`` the source records a signal, creates the tunnel again and goes
on; the replicate pipeline repairs the target (the changes made while it was stopped, and one
made after the expiry that no tunnel carries) and reconcile then reports zero differences.
With ``fail`` (the default) the query stops on ``TunnelExpiredError``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("tablestore")

from meta_store.signals import SignalState  # noqa: E402
from tablestore_cdc.demo.writer import DEMO_TABLE, _SdkRows  # noqa: E402
from tablestore_cdc.pipeline import ApplySettings, start_pipeline  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.resnapshot.command import open_board  # noqa: E402
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.reconcile import BASE, OrdersTarget, make_orders, settle  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[EmulatorServer]:
    make_orders(tmp_path / "store.db")
    with EmulatorServer(str(tmp_path / "store.db"), INSTANCE, KEY_ID, SECRET) as server:
        yield server


@pytest.mark.parametrize("policy", ["resnapshot", "fail"])
def test_a_stream_restarted_after_its_tunnel_expired(spark: Any, tmp_path: Path,
                                                     emulator: EmulatorServer,
                                                     policy: str) -> None:
    target = OrdersTarget.delta(tmp_path)
    options = {"instance.name": INSTANCE, "access.key.id": KEY_ID, "access.key.secret": SECRET,
               "meta.store": f"sqlite://{tmp_path}/meta.db"}
    spec = SourceSpec(emulator.url, DEMO_TABLE, options=options)
    rows = _SdkRows(emulator)
    first = start_pipeline(spark, emulator.url, DEMO_TABLE, "replicate", tmp_path / "out",
                           ApplySettings(target.uri), options=options, trigger_ms=500)
    try:
        wait_until("the first rows applied", first.applied_batch,
                   lambda batch: batch is not None, timeout=180, query=first.state_query)
        first.drain()
    finally:
        first.stop()
    for key in (BASE + 1, BASE + 2, BASE + 3):  # while the stream is stopped
        rows.delete_row(DEMO_TABLE, {"order_id": key})
    for key in (BASE + 5, BASE + 6):
        rows.update_row(DEMO_TABLE, {"order_id": key}, {"status": "changed"})
    rows.put_row(DEMO_TABLE, {"order_id": BASE + 99}, {"status": "added"})
    expired_id = emulator.expire_tunnel(DEMO_TABLE, "replicate")
    rows.put_row(DEMO_TABLE, {"order_id": BASE + 200}, {"status": "after the expiry"})
    pipeline = start_pipeline(spark, emulator.url, DEMO_TABLE, "replicate", tmp_path / "out",
                              ApplySettings(target.uri),
                              options={**options, "onDataLoss": policy}, trigger_ms=500)
    try:
        if policy == "fail":  # the table fails, and with it the job of this one table
            failure = wait_until("the table to fail on the expired tunnel",
                                 pipeline.selection_failure, lambda f: f is not None,
                                 timeout=180, query=pipeline.changelog)
            assert failure.error == "TunnelExpiredError", failure
            assert "OTSTunnelExpired" in failure.message, failure
            return
        with open_board(spec) as board:
            signal = wait_until("the source to record a resnapshot for the expiry",
                                board.signals, bool, timeout=180,
                                query=pipeline.state_query)[0]
            assert signal.origin == "data-loss" and expired_id in signal.note, signal
            # a change on the new tunnel: the apply query's next batch runs the repair
            rows.put_row(DEMO_TABLE, {"order_id": BASE + 300}, {"status": "new tunnel"})
            done = wait_until("the job ran the resnapshot", board.signals,
                              lambda s: s[0].finished, timeout=180,
                              query=pipeline.state_query)[0]
        assert done.state is SignalState.DONE, done
        assert done.counts["differences"] >= 7, done  # the six, and the row after the expiry
        settle(pipeline, tmp_path / "store.db")
        report = reconcile_table(spec, target.uri)
        assert report.comparison.differences == [], report.comparison.differences
        assert report.comparison.source_rows == 20 - 3 + 1 + 2 + 2  # + the two settle writes
    finally:
        pipeline.stop()
