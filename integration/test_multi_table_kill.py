"""``tablestore-cdc replicate --tables`` SIGKILLed mid-run while a writer changes each table, with
either apply (``--engine embedded``, the default, and ``--engine spark``: Spark's own MERGE by
delta-spark or Iceberg's runtime). The full size: 6 tables (4 at the start, 2 created while it
runs, 1 dropped), three SIGKILLs, two splits and a merge in each of two tables, SCD 1 and SCD 2
(per-table settings from ``--config``), Delta and Iceberg targets. The small size, the Spark
engine's (``make test-extended``: 4 to 7 minutes on 2 cores shared with other work, its first
MERGE in each JVM taking 15 to 60 s): 2 tables (an Iceberg one, SCD 1, that splits twice and
merges, a Delta one, SCD 2), two SIGKILLs aimed inside the apply (``kill_in_apply``): the first
while a batch's first MERGE runs, the second parked at the crash point after the batch's first
table (the Iceberg one) committed it and before the second (the replay must skip the first by
its snapshot summary's record and merge the second). After the last restart
(docs/multi-table.md, docs/lakehouse.md):

- every target equals its source table row by row, read back with ``deltalake`` /
  ``pyiceberg`` (never through the apply's code), and an SCD 2 target's versions equal the
  ones the source's change log implies (each change applied once, in order);
- the change log the application committed (the Parquet files its ``_spark_metadata`` log
  lists) holds every change of every table's change log exactly once, in order per key;
- the dropped table's target and change log hold what its source held at the drop;
- no target holds a batch twice (an Iceberg snapshot's summary names its batch; a Delta commit's
  info does with the embedded apply, its ``txn`` action with the Spark engine).

The application, the writers and the checks are ``integration/faults/multi_table.py``'s,
shared with the kills at crash points (``test_multi_table_crash_points.py``). The Spark engine
runs on the PySpark of ``.venv-spark-merge`` (``make test`` prepares it; without it its runs
are skipped).

The full size is not in the default suite (marker ``faults_full``, 2 to 3 minutes on 2 cores
with the embedded apply, 7 to 8 with the Spark engine): run it with ``python -m pytest -m
faults_full integration/test_multi_table_kill.py`` (``-k spark`` or ``-k embedded`` for one
engine). It once timed out waiting for every table's first apply after a kill (2 runs of 7): the
table created just before the kill had no batch of its own to prove the restart by, so its lease
refused the restarted process and the table stayed failed; a restart now takes such a lease over
with the others (``connector.planning.lease._predecessors``), and a table refused a lease waits
instead."""

from __future__ import annotations

import time
from dataclasses import dataclass
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
from testkit.processes import arm_crash_point

pytestmark = [pytest.mark.slow]
pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")


@dataclass(frozen=True)
class Size:
    """One run's tables and kills."""

    at_start: tuple[str, ...]
    #: two splits and a merge in each (a table created while the application runs may be one)
    reshaped: tuple[str, ...]
    scd2: tuple[str, ...]
    #: Iceberg targets (the others Delta)
    iceberg: tuple[str, ...] = ()
    kills: int = 3
    #: kill number -> the table created just before it (it may not even be listed yet)
    created_before_kill: tuple[tuple[int, str], ...] = ()
    #: kill number -> the table created after its restart (read from the restart on)
    created_after_kill: tuple[tuple[int, str], ...] = ()
    #: the table whose writer stops at the first kill, dropped once its target caught up
    dropped: str | None = None
    #: kills aimed inside an apply batch (``kill_in_apply``) instead of 2 s after one
    aimed: bool = False

    @property
    def tables(self) -> set[str]:
        return {*self.at_start, *(t for _, t in self.created_before_kill),
                *(t for _, t in self.created_after_kill)}


FULL = Size(at_start=("t1", "t2", "t3", "t4"), reshaped=("t1", "t5"), scd2=("t4", "t6"),
            iceberg=("t2", "t6"), created_before_kill=((0, "t5"),),
            created_after_kill=((1, "t6"),), dropped="t3")
SMALL = Size(at_start=("t1", "t2"), reshaped=("t1",), scd2=("t2",), iceberg=("t1",), kills=2,
             aimed=True)
BETWEEN = "between_table_applies"


@dataclass(frozen=True)
class Cut:
    """An aimed kill: the apply batch it cut (None: none was in flight), the tables that batch
    carries and those whose target held it at the kill."""

    between_tables: bool
    batch: int | None
    carried: tuple[str, ...]
    held: tuple[str, ...]


def kill_in_apply(app: Replication, tables: list[str], between_tables: bool) -> Cut:
    """SIGKILL the application inside an apply batch: as soon as one is in flight (in the
    apply query's offset log, not in its commit log: its first table's MERGE under way), or
    parked at the crash point after one table's commit and before the next's. What the batch
    carried and which targets held it are read after the kill."""
    hit = app.faults / f"hit-{BETWEEN}"
    if between_tables:
        arm_crash_point(app.faults, BETWEEN)
        app.wait("the apply parked between two tables' commits", hit.exists, timeout=240)
    else:
        app.wait("an apply batch in flight", app.unfinished_apply_batch,
                 lambda batch: batch is not None)
    app.kill()
    hit.unlink(missing_ok=True)
    batch = app.unfinished_apply_batch()
    if batch is None:
        return Cut(between_tables, None, (), ())
    return Cut(between_tables, batch, app.apply_batch_tables(batch), _holding(app, tables, batch))


def _holding(app: Replication, tables: list[str], batch: int) -> tuple[str, ...]:
    return tuple(t for t in sorted(tables) if any(b == batch for _, b in app.targets.batches(t)))


@pytest.mark.parametrize(("engine", "size"), [
    pytest.param("embedded", FULL, marks=pytest.mark.faults_full, id="embedded-full"),
    pytest.param("spark", FULL, marks=pytest.mark.faults_full, id="spark-full"),
    pytest.param("spark", SMALL, marks=pytest.mark.extended, id="spark-small"),
])
def test_replicate_tables_killed_mid_run_every_target_equals_its_source(
        tmp_path: Path, engine: str, size: Size) -> None:
    began = time.monotonic()
    app = Replication(tmp_path, iceberg=size.iceberg, scd2=size.scd2, engine=engine)
    with LocalTablestore(app.store_path) as store:
        for name in size.at_start:
            store.create_table(name, KEY, COLUMNS, channels=2)
    writers = {t: TableWriter(app.store_path, t, reshape=t in size.reshaped)
               for t in size.at_start}
    for writer in writers.values():
        writer.start()
    live = list(size.at_start)
    dropped_rows: dict[str, Any] = {}
    dropped_log: list[Record] = []
    before_kill, after_kill = dict(size.created_before_kill), dict(size.created_after_kill)
    dropped = size.dropped or ""
    cuts: list[Cut] = []

    def create(table: str) -> None:
        create_with_rows(app.store_path, table)
        writers[table] = TableWriter(app.store_path, table, reshape=table in size.reshaped)
        writers[table].start()
        live.append(table)

    app.start()
    applied = -1  # the apply query's newest batch at the last kill
    try:
        for kill in range(size.kills):
            # each start applies a batch, and every table holds one, before it is killed (a
            # table the Spark engine created holds none until its first MERGE)
            app.wait(f"a batch applied by start {app.starts} before kill {kill + 1}",
                     app.last_applied_batch, lambda newest, a=applied: newest > a)
            app.wait(f"every table holding a batch before kill {kill + 1}",
                     lambda: [t for t in live if not app.targets.batches(t)], lambda m: not m)
            if kill in before_kill:
                create(before_kill[kill])
            if size.aimed:  # the first inside a table's MERGE, the next between two tables'
                cuts.append(kill_in_apply(app, live, between_tables=kill % 2 == 1))
            else:
                time.sleep(2)  # mid-run: writers busy, batches in flight
                app.kill()
            applied = app.last_applied_batch()
            if kill == 0 and dropped:  # its last change, then what its source holds
                writers[dropped].stop()
                dropped_rows, dropped_log = source_of(app.store_path, dropped)
            app.start()
            if kill == 0 and dropped:  # dropped while it runs, once its target caught up
                app.wait(f"{dropped} caught up", lambda: app.targets.state(dropped),
                         lambda state, rows=dropped_rows: state == rows)
                with LocalTablestore(app.store_path) as store:
                    store.drop_table(dropped)
                live.remove(dropped)
            if kill in after_kill:
                create(after_kill[kill])
        assert sorted(w.table for w in writers.values() if w.reshape) == sorted(size.reshaped)
        sources = drain(app, writers, live)
    finally:
        for writer in writers.values():
            writer.stopping.set()
        app.kill()

    if dropped:
        sources[dropped] = (dropped_rows, dropped_log)
        assert app.targets.state(dropped) == dropped_rows  # its target kept what it had
    assert set(sources) == size.tables
    check_exactly_once(app, sources)
    for cut in cuts:  # each cut batch replayed: every table it carries holds it (once)
        print(f"killed inside apply batch {cut.batch} of {cut.carried}, held by {cut.held}")
        assert cut.batch is not None, f"no apply batch was in flight at the kill: {cut}"
        assert _holding(app, live, cut.batch) == cut.carried, cut
        if cut.between_tables:
            assert cut.held and len(cut.held) < len(cut.carried), (
                f"the kill did not fall between two tables' commits: {cut}")
    print(f"{engine}: {size.kills} kills, {app.starts} starts, "
          f"{time.monotonic() - began:.0f} s")
