"""The supported PySpark range, and the stream reader where PySpark 4.0/4.1 call less of it.

``connector.spark_compat`` decides what the installed PySpark offers. The reader's PySpark 4.0
and 4.1 path (no start and no limit in ``latestOffset``) is driven here without Spark: its
methods are called in the order PySpark 4.0 and 4.1 call them (traced on both; the order is in
``SparkBefore42``), over a real local store and a real SQLite meta store, and every row comes
from the executor-side ``read``. The same paths on a real PySpark 4.0 are the ``oldest_spark``
tests (``make test-spark-oldest``).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from connector import spark_compat
from connector.errors import SparkCallOrderError, UnsupportedSparkError
from connector.local import LocalTablestore
from connector.source import TablestoreDataSource, TablestoreStreamReader
from connector.spark_compat import FEATURES, SUPPORTED_PYSPARK, SparkFeatures, check_supported
from meta_store import open_meta_store

pytestmark = pytest.mark.oldest_spark  # seconds; on the oldest PySpark too, for the probes

ROOT = Path(__file__).resolve().parent.parent
SPARK_40 = SparkFeatures(version="4.0.0", admission_control=False, latest_offset_report=False,
                         available_now=False)


# --- the supported range ----------------------------------------------------------------------


def test_the_range_is_the_one_pyproject_pins_and_make_tests_its_floor():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"pyspark{SUPPORTED_PYSPARK}" in project["dependencies"]
    oldest = re.search(r"^SPARK_OLDEST\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert oldest is not None and oldest[1] == "4.0.0"
    assert SUPPORTED_PYSPARK.startswith(">=4.0,")


@pytest.mark.parametrize("version", ["4.0.0", "4.1.4", "4.2.1", "4.3.0"])
def test_supported_versions_pass(version):
    check_supported(version, has_stream_reader=True)


@pytest.mark.parametrize(("version", "has_stream_reader"),
                         [("3.5.1", False), ("4.4.0", True), ("5.0.0", True), ("4.4.0.dev0", True)])
def test_versions_outside_the_range_are_refused(version, has_stream_reader):
    with pytest.raises(UnsupportedSparkError) as caught:
        check_supported(version, has_stream_reader)
    message = str(caught.value)
    assert "\n" not in message and SUPPORTED_PYSPARK in message and version in message


def _fake_pyspark(root: Path, version: str, stream_reader: bool) -> None:
    """A PySpark whose only traits are the two the check reads: its version, and whether
    ``pyspark.sql.datasource`` has ``DataSourceStreamReader`` (3.5 has no such module)."""
    package = root / "pyspark"
    (package / "sql").mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "sql" / "__init__.py").write_text("")
    if stream_reader:
        (package / "sql" / "datasource.py").write_text("class DataSourceStreamReader: pass\n")


@pytest.mark.parametrize(("version", "stream_reader"), [("3.5.1", False), ("4.4.0", True)])
def test_importing_the_source_beside_an_unsupported_pyspark_fails_with_one_line(
        tmp_path, version, stream_reader):
    _fake_pyspark(tmp_path, version, stream_reader)
    result = subprocess.run(
        [sys.executable, "-c", "import connector.source"], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin"})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"connector.errors.UnsupportedSparkError: tablestore-cdc supports PySpark "
                    f"{SUPPORTED_PYSPARK}, found {version}: install a PySpark in that range "
                    f"(pip install 'pyspark{SUPPORTED_PYSPARK}'), the one matching your "
                    "cluster's Spark")


def test_the_installed_pyspark_offers_what_its_release_added():
    """Measured: 4.0 and 4.1 have none of the three, 4.2 and 4.3 all of them."""
    import pyspark

    from_4_2 = tuple(int(n) for n in pyspark.__version__.split(".")[:2]) >= (4, 2)
    assert FEATURES == SparkFeatures(pyspark.__version__, from_4_2, from_4_2, from_4_2)


def test_each_missing_feature_is_one_sentence_naming_the_version_that_has_it():
    assert SparkFeatures("4.3.0", True, True, True).degradations() == []
    sentences = SPARK_40.degradations()
    assert len(sentences) == 3
    assert all(s.startswith("PySpark 4.0.0 ") and "4.2" in s for s in sentences)
    assert "maxOffsetsPerTrigger" in sentences[0]
    assert "tablestore-cdc meta lag" in sentences[1]
    assert "one batch" in sentences[2]


def test_degradations_are_logged_once_per_process(caplog, monkeypatch):
    monkeypatch.setattr(spark_compat, "_logged", False)
    log = logging.getLogger("connector.source")
    with caplog.at_level(logging.WARNING, logger="connector.source"):
        spark_compat.log_degradations_once(log, SPARK_40)
        spark_compat.log_degradations_once(log, SPARK_40)
    assert [r.getMessage() for r in caplog.records] == [
        f"{s} (docs/operations.md#spark-versions)" for s in SPARK_40.degradations()]


# --- the reader as PySpark 4.0/4.1 call it ------------------------------------------------------


def write(store: LocalTablestore, ids: range) -> None:
    for i in ids:
        store.put_row("t", {"id": i}, {"v": i})


class SparkBefore42:
    """One run of a query as PySpark 4.0/4.1 drive a Python stream reader, on a checkpoint
    modelled as its offset log (``offsets``: each batch's end) and commit log (``commits``:
    how many batches committed). The order of calls is the one traced on PySpark 4.0.5 and
    4.1.4 (every call a reader received, logged): see ``connector.spark_compat``.

    ``delivered`` collects the rows of committed batches, ``rows[i]`` those of batch ``i``.
    """

    def __init__(self, store: LocalTablestore, offsets: list[dict], commits: int,
                 delivered: list, **options: str) -> None:
        self.offsets, self.commits, self.delivered = offsets, commits, delivered
        self.rows: dict[int, list[tuple[str, str]]] = {}
        source = TablestoreDataSource({"endpoint": f"local://{store.path}", "table.name": "t",
                                       "tunnel.name": "q", **options})
        self.reader = TablestoreStreamReader(source.source_options, source.schema(),
                                             features=SPARK_40)

    def restart(self) -> None:
        """A run's start on a checkpoint with batches: the newest offset (Spark's
        ``setLatestSeenOffset``), then the last batch again when the commit log lacks it."""
        if self.offsets:
            self.reader.partitions(self.offsets[-1], self.offsets[-1])
        if self.commits < len(self.offsets):
            self._run(len(self.offsets) - 1)

    def batch(self, commit: bool = True) -> bool:
        """One trigger: False when there was nothing new (no batch)."""
        end = self.reader.latestOffset()
        if self.offsets and end == self.offsets[-1]:
            return False
        self.offsets.append(end)
        if len(self.offsets) > 1:  # the previous batch, now that the offset log moved on
            self.reader.commit(self.offsets[-2])
        self._run(len(self.offsets) - 1, commit)
        return True

    def _run(self, batch_id: int, commit: bool = True) -> None:
        start = self.offsets[batch_id - 1] if batch_id else self.reader.initialOffset()
        rows = []
        for partition in self.reader.partitions(start, self.offsets[batch_id]):
            for page in self.reader.read(partition):  # the executors' part, here in-process
                rows += zip(page.column("_channel_id").to_pylist(),
                            page.column("_sequence").to_pylist(), strict=True)
        self.rows[batch_id] = sorted(rows)
        if commit:
            self.commits = batch_id + 1
            self.delivered.extend(rows)

    def drain(self) -> None:
        while self.batch():
            pass

    def stop(self) -> None:
        self.reader.stop()


def change_log(store: LocalTablestore) -> list[tuple[str, str]]:
    return sorted((r.channel_id, r.sequence) for r in store.change_log("t"))


def chain_follows_the_offset_log(run: SparkBefore42) -> bool:
    """Every batch in the meta table names the batch before it in Spark's offset log."""
    offsets = run.offsets
    meta = open_meta_store(run.reader.options.meta_store)
    namespace = offsets[0]["source"]
    try:
        return all(meta.find_batch(namespace, end["uuid"]).prev_uuid == start["uuid"]
                   for start, end in zip(offsets, offsets[1:], strict=False))
    finally:
        meta.close()


def test_batches_are_bounded_by_the_source_and_deliver_every_change_once(store):
    write(store, range(100))
    delivered: list = []
    run = SparkBefore42(store, [], 0, delivered, maxOffsetsPerTrigger="30",
                        maxOffsetsPerChannel="20")
    run.drain()
    write(store, range(100, 130))
    run.drain()
    run.stop()
    assert sorted(delivered) == change_log(store) and len(delivered) == 130
    sizes = [len(rows) for rows in run.rows.values()]
    assert max(sizes) == 30 and len(sizes) == 5  # maxOffsetsPerTrigger, applied by the source
    assert all(max(sum(1 for ch, _ in rows if ch == c) for c, _ in rows) <= 20
               for rows in run.rows.values())
    assert chain_follows_the_offset_log(run)


def test_a_new_checkpoint_on_an_empty_tunnel_plans_an_empty_first_batch(store):
    delivered: list = []
    run = SparkBefore42(store, [], 0, delivered)
    assert run.batch()  # batch 0 from the initial offset to itself: Spark 4.0 runs it
    assert run.offsets[0] == run.reader.initialOffset() and run.rows[0] == []
    assert not run.batch()  # then idle polls
    write(store, range(10))
    run.drain()
    run.stop()
    assert sorted(delivered) == change_log(store)


@pytest.mark.parametrize("last_committed", [True, False], ids=["committed", "uncommitted"])
def test_a_restart_goes_on_from_where_spark_s_offset_log_ends(store, last_committed):
    """The newest batch of Spark's offset log in its commit log or not (the driver died after
    the batch was read): the next batch starts at its end, after replaying it if needed."""
    write(store, range(60))
    delivered: list = []
    first = SparkBefore42(store, [], 0, delivered, maxOffsetsPerTrigger="25")
    first.batch()
    first.batch(commit=last_committed)
    first.stop()
    write(store, range(60, 90))
    again = SparkBefore42(store, first.offsets, first.commits, delivered,
                          maxOffsetsPerTrigger="25")
    again.restart()
    if not last_committed:
        assert again.rows[1] == first.rows[1]  # the same batch again, the same rows
    again.drain()
    again.stop()
    assert sorted(delivered) == change_log(store) and len(delivered) == 90
    assert chain_follows_the_offset_log(again)


def test_a_checkpoint_set_back_behind_the_meta_table_replays_the_planned_batches(store):
    write(store, range(100))
    delivered: list = []
    first = SparkBefore42(store, [], 0, delivered, maxOffsetsPerTrigger="20")
    first.drain()
    first.stop()
    assert len(first.offsets) == 5
    # the newest two offsets/ and commits/ files deleted (or the directory restored)
    again = SparkBefore42(store, first.offsets[:3], 3, [], maxOffsetsPerTrigger="20")
    again.restart()
    again.drain()
    again.stop()
    assert again.offsets == first.offsets
    assert {b: again.rows[b] for b in (3, 4)} == {b: first.rows[b] for b in (3, 4)}


def test_the_available_now_wrapper_is_refused_at_a_restart(store):
    """Spark's internal AvailableNow wrapper calls ``latestOffset()`` before it tells where
    its offset log ends: the batch's start would be a guess."""
    write(store, range(30))
    first = SparkBefore42(store, [], 0, [])
    first.drain()
    first.stop()
    again = SparkBefore42(store, first.offsets, first.commits, [])
    again.reader.latestOffset()  # the wrapper's prepareForTriggerAvailableNow
    with pytest.raises(SparkCallOrderError, match="triggerAvailableNowWrapper.*PySpark 4.2"):
        again.restart()
    again.stop()


def test_the_available_now_wrapper_is_refused_on_a_new_checkpoint(store):
    write(store, range(30))
    reader = SparkBefore42(store, [], 0, []).reader
    reader.latestOffset()  # the wrapper's prepareForTriggerAvailableNow
    reader.initialOffset()
    with pytest.raises(SparkCallOrderError, match="again before any batch was planned"):
        reader.latestOffset()  # the wrapper's progress report: not Spark's batch loop
    reader.stop()


def test_the_refusal_is_one_readable_sentence():
    message = str(SparkCallOrderError(version="4.0.0", detail="d"))
    assert "\n" not in textwrap.dedent(message) and "unset it" in message
