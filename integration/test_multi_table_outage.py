"""``tablestore-cdc replicate --tables`` rides out an outage of its source: every table comes
back by itself.

Everything is real: the emulator (``tablestore-cdc emulator``) serves a store file on
127.0.0.1, the official ``tablestore`` SDK writes into two tables through it, and ``replicate
--tables`` runs as its own process (one multi-table query, ``connector.multiplex``), keeping its
meta table over the wire and applying each table into its own Delta table. The emulator is
SIGKILLed for ``OUTAGE_S`` while the writers go on afterwards: wherever the outage lands
(a table's planning, its commit, a read, the listing of the tables), a table is restarting,
never failed, or the query fails and the job restarts it; once the service answers, the same
process brings every table back to streaming and every target equals its source row by row.
The single-table job's outage: ``integration/test_replicate_outage.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("tablestore")

from tablestore import CapacityUnit, ReservedThroughput, Row, TableMeta, TableOptions  # noqa: E402

from tablestore_cdc.verify import read_delta, rows_by_key, table_state  # noqa: E402
from testkit.processes import kill_tree  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    IGNORE,
    INSTANCE,
    KEY_ID,
    META_ENV,
    SECRET,
    sdk_client,
    wire_scenario,
)

pytestmark = pytest.mark.slow

OUTAGE_S = 20
TABLES = ("t", "u")


def write(client: object, start: int, n: int, keys: int = 40) -> None:
    """Puts, updates and deletes on both tables through the official SDK."""
    for table in TABLES:
        for i in range(start, start + n):
            pk = [("id", i % keys)]
            if i % 7 == 3:
                client.delete_row(table, Row(pk), IGNORE)  # type: ignore[attr-defined]
            elif i % 3 == 1:
                client.update_row(table, Row(pk, {"PUT": [("qty", i)]}),  # type: ignore[attr-defined]
                                  IGNORE)
            else:
                client.put_row(table, Row(pk, [("name", f"{table}{i}"), ("qty", i)]),  # type: ignore[attr-defined]
                               IGNORE)


def test_replicate_tables_brings_every_table_back_after_an_outage(tmp_path: Path) -> None:
    with wire_scenario(tmp_path) as (emulator, store, client):  # creates table t
        client.create_table(TableMeta("u", [("id", "INTEGER")]), TableOptions(),
                            ReservedThroughput(CapacityUnit(0, 0)))
        write(client, 0, 60)
        out = tmp_path / "out"
        command = [sys.executable, "-m", "tablestore_cdc.cli", "replicate",
                   "--endpoint", emulator.url, "--tables", ",".join(TABLES),
                   "--output", str(out),
                   "--option", f"instance.name={INSTANCE}",
                   "--option", f"access.key.id={KEY_ID}",
                   "--option", f"access.key.secret={SECRET}",
                   "--restart-backoff", "1:4", "--trigger-ms", "300"]
        log = tmp_path / "replicate.log"
        env = {**os.environ, **META_ENV, "PYSPARK_PYTHON": sys.executable}
        with open(log, "w") as sink:
            job = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)

        def equal(table: str) -> bool:
            target = out / "lake" / table
            if not (target / "_delta_log").exists():
                return False
            expected = {k: {c: v for c, v in row.items() if v is not None}
                        for k, row in rows_by_key(store.scan(table)).items()}
            got = {k: {c: v for c, v in row.items() if v is not None and c != "_extra"}
                   for k, row in table_state(read_delta(str(target)), ["id"]).items()}
            return got == expected

        def last_state(table: str) -> str:
            lines = [line for line in log.read_text().splitlines()
                     if line.startswith(f"table {table}: ")]
            return lines[-1].split(": ", 1)[1] if lines else ""

        try:
            wait_until("both tables applied", lambda: all(equal(t) for t in TABLES),
                       timeout=300, process=job)
            write(client, 60, 30)
            emulator.kill()  # the service goes away for longer than every per-call retry
            time.sleep(OUTAGE_S)
            assert job.poll() is None, log.read_text()[-3000:]
            emulator.start()  # same port, same store file
            write(sdk_client(emulator.url), 90, 40)
            wait_until("every target equal to its source after the outage",
                       lambda: all(equal(t) for t in TABLES), timeout=300, process=job)
            wait_until("every table streaming again",
                       lambda: all(last_state(t).startswith("streaming") for t in TABLES),
                       timeout=60, process=job)
            assert job.poll() is None
            text = log.read_text()
            assert "Traceback" not in text
            assert not any(line.startswith(f"table {t}: failed") for t in TABLES
                           for line in text.splitlines()), text[-3000:]
        finally:
            kill_tree(job.pid)
