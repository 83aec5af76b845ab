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

The full matrix (marker ``faults_full``, not in the default suite: 26 minutes on 2 shared
cores; ``python -m pytest -m faults_full integration/test_multi_table_outage.py``) lands a
``MULTI_TABLE_OUTAGE_S`` (60) outage on each step of a batch, three times each, through the
fault hook ``testkit.outage``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

from tablestore import CapacityUnit, ReservedThroughput, Row, TableMeta, TableOptions  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from tablestore_cdc.pipeline.multi_table import status_location  # noqa: E402
from tablestore_cdc.table_status import TableStatus, load_table_status  # noqa: E402
from testkit.processes import kill_tree  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402
from testkit.wire_e2e import (  # noqa: E402
    IGNORE,
    SOURCE_OPTIONS,
    delta_equals_source,
    replicate_process,
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


class Job:
    """``replicate --tables t,u`` as a child process against the emulator, its output in
    ``tmp_path/out``, its console in ``tmp_path/replicate.log``."""

    def __init__(self, tmp_path: Path, url: str, store: LocalTablestore,
                 env: dict[str, str] | None = None) -> None:
        self.out, self.store, self.url = tmp_path / "out", store, url
        self.log = tmp_path / "replicate.log"
        self.process = replicate_process(url, ["--tables", ",".join(TABLES)], self.out,
                                         self.log, "--restart-backoff", "1:4",
                                         "--trigger-ms", "300", env=env)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def equal(self, table: str) -> bool:
        """Is ``table``'s Delta target equal to the source table, row by row?"""
        return delta_equals_source(self.store, table, self.out / "lake" / table)

    def shown(self, table: str, since: int) -> list[str]:
        """The states the command printed for ``table`` after line ``since``."""
        return [line.split(": ", 1)[1] for line in self.lines()[since:]
                if line.startswith(f"table {table}: ")]

    def wait_applied(self, what: str) -> None:
        wait_until(what, lambda: all(self.equal(t) for t in TABLES), timeout=300,
                   process=self.process)

    def status(self, table: str) -> TableStatus | None:
        """``table``'s record in the meta store, as ``meta tables`` and the dashboard read
        it."""
        uri, credentials, namespace = status_location(self.url, ",".join(TABLES), "replicate",
                                                      dict(SOURCE_OPTIONS), table)
        with open_meta_store(uri, credentials, create=False) as meta:
            return load_table_status(meta, namespace)

    def wait_streaming(self, after: float) -> None:
        """Every table's record written after ``after`` (seconds since the epoch) says
        ``streaming``, and so does the last line the command printed for it."""
        def streaming(table: str) -> bool:
            status = self.status(table)
            return status is not None and status.at > after and status.state == "streaming"

        wait_until("every table's record streaming again after the outage",
                   lambda: all(streaming(t) for t in TABLES), timeout=60, process=self.process)
        assert all(self.shown(t, 0)[-1].startswith("streaming") for t in TABLES)

    def check_log(self) -> str:
        """No traceback and no table ever failed; the log's text."""
        text = self.log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert not any(line.startswith(f"table {t}: failed") for t in TABLES
                       for line in text.splitlines()), text[-3000:]
        return text


def create_second_table(client: Any) -> None:
    client.create_table(TableMeta("u", [("id", "INTEGER")]), TableOptions(),
                        ReservedThroughput(CapacityUnit(0, 0)))


def test_replicate_tables_brings_every_table_back_after_an_outage(tmp_path: Path) -> None:
    with wire_scenario(tmp_path) as (emulator, store, client):  # creates table t
        create_second_table(client)
        write(client, 0, 60)
        job = Job(tmp_path, emulator.url, store)
        try:
            job.wait_applied("both tables applied")
            write(client, 60, 30)
            emulator.kill()  # the service goes away for longer than every per-call retry
            time.sleep(OUTAGE_S)
            assert job.process.poll() is None, job.log.read_text()[-3000:]
            emulator.start()  # same port, same store file
            back = time.time()
            write(sdk_client(emulator.url), 90, 40)
            job.wait_applied("every target equal to its source after the outage")
            job.wait_streaming(back)
            assert job.process.poll() is None
            job.check_log()
        finally:
            kill_tree(job.process.pid)


#: the long run's outage (seconds; ``MULTI_TABLE_OUTAGE_S``)
MATRIX_OUTAGE_S = float(os.environ.get("MULTI_TABLE_OUTAGE_S", "60"))


@pytest.mark.faults_full
@pytest.mark.parametrize("round_", [1, 2, 3])
@pytest.mark.parametrize("step", ["planning", "opening", "committing", "reading"])
def test_an_outage_at_each_step_of_a_batch_leaves_no_table_failed(
        tmp_path: Path, step: str, round_: int) -> None:
    """The full matrix (``-m faults_full``; about 2 minutes a case): a ``MATRIX_OUTAGE_S``
    outage of the calls of one step of a batch (``testkit.outage.STEPS``) in every process of
    the job, writers going on. Planning, opening and committing are ridden out inside the
    query: the tables show ``restarting`` and come back without the job restarting it; a read
    fails the query and the job restarts it. Either way every table streams again and every
    target equals its source."""
    from testkit import outage

    plan = tmp_path / "outage.json"
    with wire_scenario(tmp_path) as (emulator, store, client):
        create_second_table(client)
        write(client, 0, 60)
        job = Job(tmp_path, emulator.url, store, env=outage.environment(plan))
        try:
            job.wait_applied("both tables applied")
            since = len(job.lines())
            outage.start(plan, step, MATRIX_OUTAGE_S)
            began = time.monotonic()
            while time.monotonic() - began < MATRIX_OUTAGE_S:
                write(client, 60 + int(time.monotonic() - began), 2)
                time.sleep(2.0)
                assert job.process.poll() is None, job.log.read_text()[-3000:]
            outage.end(plan)
            back = time.time()
            write(client, 200, 40)
            job.wait_applied("every target equal to its source after the outage")
            job.wait_streaming(back)
            text = job.check_log()
            restarts = [line for line in text.splitlines()[since:]
                        if line.startswith("restarting (")]
            shown = [state for t in TABLES for state in job.shown(t, since)]
            print(f"{step} round {round_}: {len(restarts)} job restart(s), "
                  f"{sum(s.startswith('source unreachable') for s in shown)} unreachable line(s)",
                  file=sys.stderr)
            if step != "reading":
                assert not restarts, restarts
                assert any(s.startswith("source unreachable (since ") for s in shown), shown
            else:
                assert restarts, text[-3000:]
        finally:
            kill_tree(job.process.pid)
