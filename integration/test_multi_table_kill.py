"""``tablestore-cdc replicate --tables`` SIGKILLed three times mid-run while a writer changes
each table: 6 tables (4 at the start, 2 created while it runs, 1 dropped), two splits and a
merge in each of two tables, Delta and Iceberg targets, SCD 1 and SCD 2 (per-table settings
from ``--config``). After the last restart (docs/multi-table.md):

- every target equals its source table row by row, read back with ``deltalake`` /
  ``pyiceberg`` (never through the apply's code), and an SCD 2 target's versions equal the
  ones the source's change log implies (each change applied once, in order);
- the change log the application committed (the Parquet files its ``_spark_metadata`` log
  lists) holds every change of every table's change log exactly once, in order per key;
- the dropped table's target and change log hold what its source held at the drop;
- no target holds a batch twice.

The application, the writers and the checks are ``integration/faults/multi_table.py``'s,
shared with the kills at crash points (``test_multi_table_crash_points.py``).

Not in the default suite (marker ``faults_full``, 2 to 3 minutes on 2 cores): run it with
``python -m pytest -m faults_full integration/test_multi_table_kill.py``. It once timed out
waiting for every table's first apply after a kill (2 runs of 7): the table created just
before the kill had no batch of its own to prove the restart by, so its lease refused the
restarted process and the table stayed failed; a restart now takes such a lease over with the
others (``connector.planning.lease._predecessors``), and a table refused a lease waits
instead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from connector.tunnel.base import Record
from integration.faults.multi_table import (
    COLUMNS,
    KEY,
    Replication,
    TableWriter,
    check_exactly_once,
    create_with_rows,
    drain,
    source_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults_full]
pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

AT_START = ("t1", "t2", "t3", "t4")
CREATED = ("t5", "t6")  # t5 before the first kill, t6 between the second and the third
DROPPED = "t3"
#: two splits and a merge in each (one of them a table created while the application runs)
RESHAPED = ("t1", "t5")
ICEBERG = ("t2", "t6")
SCD2 = ("t4", "t6")
KILLS = 3


def test_replicate_tables_killed_three_times_every_target_equals_its_source(
        tmp_path: Path) -> None:
    app = Replication(tmp_path, iceberg=ICEBERG, scd2=SCD2)
    with LocalTablestore(app.store_path) as store:
        for name in AT_START:
            store.create_table(name, KEY, COLUMNS, channels=2)
    writers = {t: TableWriter(app.store_path, t, reshape=t in RESHAPED) for t in AT_START}
    for writer in writers.values():
        writer.start()
    live = list(AT_START)
    dropped_rows: dict[str, Any] = {}
    dropped_log: list[Record] = []
    app.start()
    try:
        for kill in range(KILLS):
            app.wait(f"every table applied once before kill {kill + 1}",
                     lambda: [t for t in live if app.targets.state(t) is None], lambda m: not m)
            if kill == 0:  # created just before a kill: it may not even be listed yet
                create_with_rows(app.store_path, "t5")
                writers["t5"] = TableWriter(app.store_path, "t5", reshape=True)
                writers["t5"].start()
                live.append("t5")
            time.sleep(2)  # mid-run: writers busy, batches in flight
            app.kill()
            if kill == 0:  # the dropped table's last change, then what its source holds
                writers[DROPPED].stop()
                dropped_rows, dropped_log = source_of(app.store_path, DROPPED)
            app.start()
            if kill == 0:  # dropped while the application runs, once its target caught up
                app.wait(f"{DROPPED} caught up", lambda: app.targets.state(DROPPED),
                         lambda state, rows=dropped_rows: state == rows)
                with LocalTablestore(app.store_path) as store:
                    store.drop_table(DROPPED)
                live.remove(DROPPED)
            if kill == 1:  # created while it runs, read from the restart on
                create_with_rows(app.store_path, "t6")
                writers["t6"] = TableWriter(app.store_path, "t6")
                writers["t6"].start()
                live.append("t6")
        assert sorted(w.table for w in writers.values() if w.reshape) == sorted(RESHAPED)
        sources = drain(app, writers, live)
    finally:
        for writer in writers.values():
            writer.stopping.set()
        app.kill()

    sources[DROPPED] = (dropped_rows, dropped_log)
    assert app.targets.state(DROPPED) == dropped_rows  # its target kept what it had
    assert set(sources) == {*AT_START, *CREATED}
    check_exactly_once(app, sources)
