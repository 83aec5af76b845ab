"""``tablestore-cdc replicate`` rides out an outage longer than every retry deadline.

Everything is real: the emulator (``tablestore-cdc emulator``) serves a store file on
127.0.0.1, the official ``tablestore`` SDK writes into it (a primary-key-only table: its
attributes are undeclared), and ``replicate`` runs as its own process, reading the Tunnel and
keeping its meta table over the wire, applying into Delta with its default options. The
emulator is SIGKILLed for 60 s, longer than the query's per-call retries (about 15 s for the
tunnel, 5 s for the meta table): the table is retried with backoff inside the query (``table
t: source unreachable (since ...)``), or, where the outage fails the query itself, the job
restarts it (``restarting (attempt n, ...)``), until the service is back. The same
``replicate`` process then delivers every change: its Delta table equals the source table row
by row.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("tablestore")

from testkit.processes import kill_tree  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    delta_equals_source,
    replicate_process,
    sdk_client,
    wire_scenario,
    write_changes,
)

# one table's run of the outage test_multi_table_outage gives the default suite through the
# same pipeline (one table is a selection of one): make test-extended runs it
pytestmark = [pytest.mark.slow, pytest.mark.extended]

OUTAGE_S = 60


def test_replicate_rides_out_a_60_s_outage_in_the_same_process(tmp_path: Path) -> None:
    with wire_scenario(tmp_path) as (emulator, store, client):
        write_changes(client, 0, 100)
        out = tmp_path / "out"
        log = tmp_path / "replicate.log"
        job = replicate_process(emulator.url, ["--table", "t"], out, log,
                                "--restart-backoff", "1:8", "--trigger-ms", "300")
        target = out / "t"

        def equal() -> bool:
            return delta_equals_source(store, "t", target)

        try:
            wait_until("the first changes applied", equal, timeout=300, process=job)
            write_changes(client, 100, 60)
            emulator.kill()  # the service goes away for longer than every retry deadline
            time.sleep(OUTAGE_S)
            assert job.poll() is None, log.read_text()[-3000:]
            emulator.start()  # same port, same store file
            write_changes(sdk_client(emulator.url), 160, 80)
            wait_until("the Delta table equal to the source after the outage", equal,
                       timeout=300, process=job)
            assert job.poll() is None
            text = log.read_text()
            attempts = [line for line in text.splitlines() if line.startswith("restarting (")
                        or line.startswith("table t: source unreachable (since ")]
            assert attempts, text[-3000:]
            assert "Traceback" not in text
        finally:
            kill_tree(job.pid)
