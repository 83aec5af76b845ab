"""SIGKILL during a Trigger.AvailableNow run over the wire, restart, prove exactly-once.

Every process is real, as in integration/test_tablestore_e2e.py: the emulator serves the store
file over HTTP, the official SDK writes, the query runs in its own process
(``testkit/runner.py --available-now``) into an ``ExactlyOnceParquetSink``. The Tablestore
backend reports no channel heads, so the run is bounded by the instant it was prepared.

1. the run is parked at a crash point after a channel's end is claimed and killed (SIGKILL of
   its whole process tree); changes are written meanwhile and a channel splits;
2. the restart goes on to the *same* bound (the killed run had not finished): it delivers the
   rest of what was written before the first start, and nothing written later, then stops;
3. the next run delivers the rest; the sink equals the change log: nothing lost, nothing
   doubled, per-key order and final state exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tablestore")

from tablestore_cdc.sinks import ExactlyOnceParquetSink  # noqa: E402
from tablestore_emulator.tunnel_api import wire_change_log  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.processes import kill_tree, start_runner  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    NO_ENV_CREDENTIALS,
    assert_exactly_once,
    runner_args,
    write_changes,
)

pytestmark = pytest.mark.slow


@pytest.mark.extended  # the default suite's kills: test_replicate_kill, test_tablestore_e2e
def test_sigkill_during_available_now_and_restart_is_exactly_once(wire_setup, tmp_path: Path
                                                                  ) -> None:
    emulator, store, client = wire_setup
    write_changes(client, 0, 300)
    before_first_run = {(r.channel_id, r.sequence) for r in wire_change_log(store.change_log("t"))}
    faults = tmp_path / "faults"
    faults.mkdir()
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    args = [*runner_args(tmp_path, emulator.url, sink), "--available-now"]
    env = {**crash_environment(faults), **NO_ENV_CREDENTIALS}
    log = tmp_path / "runner.log"

    # 1. parked after a claim, killed; more changes and a split while it is down
    (faults / "arm-mid_read").touch()
    runner = start_runner(args, log, env)
    try:
        wait_until("crash point mid_read", (faults / "hit-mid_read").exists, timeout=240,
                   process=runner)
    finally:
        assert kill_tree(runner.pid) >= 2
    write_changes(client, 300, 120)
    store.split_channel("t", sorted(c.channel_id for c in store.list_channels("t")
                                    if not c.closed)[0])
    write_changes(client, 420, 80)

    # 2. the restart reads to the killed run's bound, and stops by itself
    runner = start_runner(args, log, env)
    try:
        assert runner.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)
    first_two = {(d.channel_id, d.sequence) for d in sink.deliveries(["id"])}
    assert first_two == before_first_run
    assert "resuming the run prepared at" in log.read_text()

    # 3. the next run reads the rest: everything exactly once
    runner = start_runner(args, log, env)
    try:
        assert runner.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(runner.pid)
    assert_exactly_once(store, sink)
    assert all(r["identical"] for r in sink.replays()), sink.replays()
