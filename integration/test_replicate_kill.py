"""``tablestore-cdc replicate`` of one table SIGKILLed twice mid-run and restarted, as
``--table t1`` and as ``--tables t1`` (one path: the same pipeline over a selection of one;
docs/multi-table.md, "One path"). The table has 2 channels and 25 rows; once the first batch
is applied a writer thread changes it every second (puts and a delete) and splits a channel,
splits a child again and merges the two grandchildren, across the first kill. Each kill comes
a second after the start it ends committed a change-log batch and applied one. After the last
restart (``integration/faults/multi_table.py``'s checks):

- the Delta target (``OUTPUT/t1`` with ``--table``, ``OUTPUT/lake/t1`` with ``--tables``) read
  back with ``deltalake`` equals the source table row by row;
- the change log the application committed (``OUTPUT/changelog`` in both modes: the files its
  ``_spark_metadata`` log lists) holds every change of the table's change log exactly once, in
  order per key, and the target holds no batch twice.

With ``--cycle one`` (``table-one-cycle``) one query reads, logs and applies each batch: its
change log is ``OUTPUT/changelog/batch-<id>.parquet`` up to the query's newest committed batch.

The default suite runs ``--table`` in the one-cycle pipeline (a new output's); the two-cycle
``--table`` and ``--tables`` run under ``extended``
(``test_multi_table_kill.py`` kills it over many tables). Each is three starts of Spark: 124 to
244 s on 2 cores shared with other Spark runs (load 7 to 14), most of it each start's JVM,
queries and first batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from integration.faults.multi_table import (
    Replication,
    TableWriter,
    check_exactly_once,
    create_with_rows,
    drain,
)

pytestmark = pytest.mark.slow
pytest.importorskip("deltalake")

TABLE = "t1"
KILLS = 2


@pytest.mark.parametrize(("selection", "cycle"), [
    pytest.param(("--table", TABLE), "two", id="table", marks=pytest.mark.extended),
    pytest.param(("--table", TABLE), "one", id="table-one-cycle"),
    pytest.param(("--tables", TABLE), "two", id="tables", marks=pytest.mark.extended),
])
def test_replicate_of_one_table_killed_twice_equals_its_source_exactly_once(
        tmp_path: Path, selection: tuple[str, str], cycle: str) -> None:
    app = Replication(tmp_path, selection=selection, cycle=cycle)
    create_with_rows(app.store_path, TABLE)
    writer = TableWriter(app.store_path, TABLE, reshape=True)
    app.start()
    try:
        read, applied = -1, -1  # the queries' newest batches at the last kill
        for kill in range(KILLS):
            app.wait(f"a change-log batch of start {app.starts} before kill {kill + 1}",
                     app.last_read_batch, lambda newest, r=read: newest > r)
            app.wait(f"an applied batch of start {app.starts} before kill {kill + 1}",
                     app.last_applied_batch, lambda newest, a=applied: newest > a)
            if kill == 0:  # its splits and merge (2, 4, 6 s on) fall across the first kill
                writer.start()
            time.sleep(1)  # mid-run: the writer busy, a batch in flight
            app.kill()
            read, applied = app.last_read_batch(), app.last_applied_batch()
            app.start()
        sources = drain(app, {TABLE: writer}, [TABLE])
    finally:
        writer.stopping.set()
        app.kill()
    assert app.starts == KILLS + 1
    assert (app.lake / TABLE / "_delta_log").is_dir()  # the mode's default target
    check_exactly_once(app, sources)
