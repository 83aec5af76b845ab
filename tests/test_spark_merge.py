"""The Spark engine (tablestore_cdc/lakehouse/spark_merge.py): the same change batches applied
by Spark's own MERGE (delta-spark, Iceberg's SparkCatalog) and by the embedded sinks give the
same tables row for row; a replayed batch is skipped; another job's table is refused.

The Spark side runs in its own process (testkit/spark_merge_run.py) on the PySpark of
``.venv-spark-merge`` (make's jar step: the newest PySpark minor that both jars are released
for), once for the module; its JVM's session carries Delta's and Iceberg's extensions, which
the suite's shared ``spark`` session must not get."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tablestore_cdc.lakehouse.errors import ApplyOptionError
from tablestore_cdc.lakehouse.spark_merge import (
    PACKAGES,
    SparkEngineError,
    SparkMergeSink,
    coordinate,
    session_conf,
)
from testkit.lakehouse import SCHEMA, Delta, Iceberg, batch, change
from testkit.spark_merge_run import ROOT, SPARK_MERGE_PYTHON


def _with_colour(*rows: dict[str, Any]) -> pa.Table:
    schema = pa.schema([*list(SCHEMA)[:3], pa.field("colour", pa.string()), *list(SCHEMA)[3:]])
    return pa.Table.from_pylist([{"colour": None, **r} for r in rows], schema=schema)


#: batch 0: new keys, one updated twice; batch 1: a key across a channel split (the child's
#: _sequence is lower than the parent's: the channels' commit times order them), a delete, a
#: key inserted and deleted in the batch, a delete of a key never seen; batch 2: a deleted key
#: back, a null value, a new declared column
BATCHES = [
    batch(change("PUT", "c", 1, 1, 1, "a", 1), change("PUT", "c", 2, 1, 2, "b", 2),
          change("PUT", "c", 3, 1, 3, "c", 3), change("UPDATE", "c", 4, 2, 1, "a", 5)),
    batch(change("UPDATE", "p", 10, 10, 2, "b", 20), change("UPDATE", "c1", 1, 11, 2, "b", 21),
          change("DELETE", "c", 5, 10, 3), change("PUT", "c", 6, 10, 4, "d", 4),
          change("DELETE", "c", 7, 11, 4), change("DELETE", "c", 8, 11, 5),
          change("UPDATE", "c", 9, 12, 1, "a", 6), change("DELETE", "c", 10, 13, 1)),
    _with_colour({**change("PUT", "c", 11, 20, 3, "c", 30), "colour": "red"},
                 change("UPDATE", "c1", 2, 21, 2, None, 22),
                 {**change("PUT", "c", 12, 22, 6, "f", 6), "colour": "blue"}),
]
#: a replay of batch 1 after batch 2: skipped
ORDER = [0, 1, 2, 1]
#: not _deleted: Iceberg's Spark runtime reserves that name
SOFT = "is_deleted"


#: each mode's sink options
MODES: dict[str, dict[str, Any]] = {"hard": {}, "soft": {"soft_delete_column": SOFT},
                                    "scd2": {"scd": 2}}


def _embedded(target: Any, mode: str) -> list[dict[str, Any]]:
    sink = target.sink(**MODES[mode])
    for batch_id in ORDER:
        sink.apply(BATCHES[batch_id], "q1", batch_id)
    return _sorted(target.rows())


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["id"], r.get("__START_AT") or 0))


def _spark_apply(tmp: Path, modes: tuple[str, ...]) -> dict[str, Any]:
    """The Spark-engine runs of ``modes``, in one process (module doc): ORDER's batches into a
    Delta and an Iceberg table each, then (hard deletes) another query's batch into each."""
    if not Path(SPARK_MERGE_PYTHON).exists():
        pytest.skip(f"no {SPARK_MERGE_PYTHON}: make .venv-spark-merge/.jars-stamp prepares it")
    paths = []
    for i, changes in enumerate(BATCHES):
        paths.append(str(tmp / f"batch{i}.parquet"))
        pq.write_table(changes, paths[-1])
    batches = [[i, paths[i]] for i in ORDER]
    runs: dict[str, dict[str, Any]] = {}
    for mode in modes:
        for fmt in ("delta", "iceberg"):
            name = f"{fmt}-{mode}"
            target = (str(tmp / name) if fmt == "delta"
                      else f"lake.cdc.{name.replace('-', '_')}")
            runs[name] = {"format": fmt, "target": target, "app_id": "q1",
                          "key_columns": ["id"], "source": "s", **MODES[mode],
                          "batches": batches, "out": str(tmp / f"{name}.parquet")}
    if "hard" in modes:  # another query of the same source on the tables written above
        for fmt in ("delta", "iceberg"):
            runs[f"{fmt}-other-job"] = {**runs[f"{fmt}-hard"], "app_id": "q2",
                                        "batches": [[0, paths[0]]], "out": None}
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"warehouse": str(tmp / "warehouse"),
                                "runs": list(runs.values())}))
    proc = subprocess.run([SPARK_MERGE_PYTHON, "-m", "testkit.spark_merge_run", str(spec)],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"runs": runs, "report": dict(zip(runs, report, strict=True))}


@pytest.fixture(scope="module")
def spark_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Hard deletes, and another query refused."""
    return _spark_apply(tmp_path_factory.mktemp("spark_merge"), ("hard",))


@pytest.fixture(scope="module")
def spark_runs_extended(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Soft deletes and SCD type 2 (make test-extended)."""
    return _spark_apply(tmp_path_factory.mktemp("spark_merge_more"), ("soft", "scd2"))


@pytest.mark.slow
@pytest.mark.xdist_group("spark_merge")
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
@pytest.mark.parametrize("mode", [
    "hard", pytest.param("soft", marks=pytest.mark.extended),
    pytest.param("scd2", marks=pytest.mark.extended)])
def test_spark_merge_gives_the_embedded_sinks_table_row_for_row(
        request: pytest.FixtureRequest, tmp_path: Path, fmt: str, mode: str) -> None:
    name = f"{fmt}-{mode}"
    spark_runs = request.getfixturevalue("spark_runs" if mode == "hard"
                                         else "spark_runs_extended")
    outcomes = spark_runs["report"][name]
    assert [o.get("error") for o in outcomes] == [None] * 4, outcomes
    assert [o["committed"] for o in outcomes] == [True, True, True, False]
    assert outcomes[3]["version"] == outcomes[2]["version"]  # the replay changed nothing
    merged = _sorted(pq.read_table(spark_runs["runs"][name]["out"]).to_pylist())
    embedded = _embedded(Delta(tmp_path) if fmt == "delta" else Iceberg(tmp_path), mode)
    assert merged == embedded
    if mode == "scd2":
        assert [(r["id"], r["qty"], r["__END_AT"] is None) for r in merged if r["id"] == 2] == [
            (2, 2, False), (2, 20, False), (2, 21, False), (2, 22, True)]
        return
    soft = mode == "soft"
    if soft:
        assert {r["id"]: r[SOFT] for r in merged} == {1: True, 2: False, 3: False, 4: True,
                                                  6: False}
        assert merged[0]["qty"] == 6  # key 1's last image in batch 1, flagged
    else:
        assert [r["id"] for r in merged] == [2, 3, 6]
    assert merged[1 if soft else 0]["qty"] == 22  # the child channel's change is the last


@pytest.mark.slow
@pytest.mark.xdist_group("spark_merge")
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_spark_merge_refuses_a_table_another_query_writes(spark_runs: dict[str, Any],
                                                          fmt: str) -> None:
    [outcome] = spark_runs["report"][f"{fmt}-other-job"]
    assert outcome["error"] == "ForeignTargetError"
    assert "another query of the same source" in outcome["message"]


@pytest.mark.slow
@pytest.mark.xdist_group("spark_merge")
def test_embedded_sink_sees_the_batches_spark_merge_recorded(spark_runs: dict[str, Any],
                                                            tmp_path: Path) -> None:
    """One exactly-once record for both engines: Delta's txn written by delta-spark's MERGE is
    the one the embedded sink reads, so switching engines does not apply a batch twice."""
    from tablestore_cdc.lakehouse import DeltaApplySink

    path = spark_runs["runs"]["delta-hard"]["target"]
    sink = DeltaApplySink(path, key_columns=["id"], source="s")
    assert sink.committed_batch("q1") == 2
    assert sink.apply(BATCHES[2], "q1", 2).committed is False


# --- without Spark --------------------------------------------------------------------------


def test_each_spark_minor_names_the_jars_released_for_it() -> None:
    assert coordinate("delta", "4.0.0") == "io.delta:delta-spark_2.13:4.0.1"
    assert coordinate("delta", "4.1.4") == "io.delta:delta-spark_2.13:4.3.1"
    assert coordinate("iceberg", "4.1.4") == \
        "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
    assert coordinate("delta", "4.2.1") == "io.delta:delta-spark_2.13:4.4.0"
    assert PACKAGES[(4, 3)].delta is None and PACKAGES[(4, 3)].iceberg is None


@pytest.mark.parametrize(("fmt", "version", "have"), [
    ("delta", "4.3.0", "4.0, 4.1, 4.2"), ("iceberg", "4.2.1", "4.0, 4.1")])
def test_a_spark_with_no_jar_released_is_refused_in_one_line(fmt: str, version: str,
                                                             have: str) -> None:
    with pytest.raises(SparkEngineError) as caught:
        session_conf([fmt], version)
    message = str(caught.value)
    assert "\n" not in message
    assert f"has no {fmt} jar released for Spark {version[:3]}" in message
    assert f"run it on a PySpark of {have}, or use --engine embedded" in message


def test_session_conf_names_packages_extensions_and_catalog() -> None:
    conf = session_conf(["delta", "iceberg"], "4.1.0", warehouse="/w")
    assert conf["spark.jars.packages"] == (
        "io.delta:delta-spark_2.13:4.3.1,"
        "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0")
    assert conf["spark.sql.extensions"].split(",") == [
        "io.delta.sql.DeltaSparkSessionExtension",
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"]
    assert conf["spark.sql.catalog.lake.warehouse"] == "/w"


@pytest.mark.parametrize(("options", "option"), [
    ({"scd": 3}, "scd"), ({"scd": 2, "soft_delete_column": "d"}, "soft_delete_column"),
    ({"format": "hudi"}, "format"),
    ({"soft_delete_column": "_op"}, "soft_delete_column"),
    ({"soft_delete_column": "_deleted", "format": "iceberg"}, "soft_delete_column")])
def test_spark_merge_sink_refuses_options_it_cannot_honour(options: dict[str, Any],
                                                           option: str) -> None:
    with pytest.raises(ApplyOptionError) as caught:
        SparkMergeSink("/t", key_columns=["id"], **options)
    assert caught.value.fields["option"] == option


def test_a_selections_delta_template_is_a_target_of_the_spark_engine() -> None:
    """``replicate --tables --engine spark``: the template is checked before Spark starts and
    each table's sink opened with its name in it; an Iceberg template of the embedded SQLite
    catalog is the same table in Spark's JDBC catalog; a catalog pyiceberg configures, an
    object store, or two Iceberg warehouses in one job are refused in one line."""
    from tablestore_cdc.lakehouse.errors import TargetUriError
    from tablestore_cdc.lakehouse.spark_merge import (
        ICEBERG_CATALOG,
        open_spark_merge_sink,
        replicate_conf,
    )

    sink = open_spark_merge_sink("delta:///lake/{table}", key_columns=["id"])
    assert sink.target == "/lake/{table}" and sink.format == "delta"
    assert open_spark_merge_sink("delta:///lake/t1").target == "/lake/t1"
    iceberg = open_spark_merge_sink("iceberg:///w?table=cdc.t1&catalog_db=/c.db")
    assert (iceberg.target, iceberg.format) == (f"{ICEBERG_CATALOG}.cdc.t1", "iceberg")
    assert iceberg.catalog_conf[f"spark.sql.catalog.{ICEBERG_CATALOG}.uri"] == \
        "jdbc:sqlite:/c.db"
    for uri in ("iceberg://glue/cdc.{table}", "iceberg:///w?table={table}",
                "delta+s3://bucket/{table}", "iceberg:///w?table=cdc.t&x=1",
                "iceberg:///w/{table}?table=cdc.{table}"):
        with pytest.raises(TargetUriError) as caught:
            replicate_conf(uri)
        assert "iceberg:///abs/warehouse?table=NAMESPACE.TABLE" in str(caught.value)
    with pytest.raises(SparkEngineError, match="one Iceberg warehouse per job"):
        replicate_conf(["iceberg:///a?table=cdc.{table}", "iceberg:///b?table=cdc.t"],
                       "4.1.4")
    conf = replicate_conf(["delta:///lake/{table}", "iceberg:///w?table=cdc.t"], "4.1.4")
    assert conf["spark.jars.packages"].split(",") == [
        "io.delta:delta-spark_2.13:4.3.1",
        "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0",
        "org.xerial:sqlite-jdbc:3.54.1.0"]
    assert conf[f"spark.sql.catalog.{ICEBERG_CATALOG}.warehouse"] == "file:///w"
    with pytest.raises(SparkEngineError, match="has no iceberg jar released for Spark 4.2"):
        replicate_conf("iceberg:///w?table=cdc.{table}", "4.2.1")
    try:
        conf = replicate_conf("delta:///lake/{table}")
    except SparkEngineError as exc:  # the installed PySpark has no jar: not the template
        assert "has no delta jar released" in str(exc)
    else:
        assert conf["spark.jars.packages"].startswith("io.delta:delta-spark_2.13:")


@pytest.mark.parametrize(("version", "expected"), [
    ("4.3.0", "the Spark engine has no delta jar released for Spark 4.3: run it on a PySpark "
              "of 4.0, 4.1, 4.2, or use --engine embedded")])
def test_replicate_conf_names_the_pyspark_replicate_runs_the_engine_on(version: str,
                                                                       expected: str) -> None:
    from tablestore_cdc.lakehouse.spark_merge import replicate_conf

    with pytest.raises(SparkEngineError) as caught:
        replicate_conf("delta:///lake/{table}", version)
    assert str(caught.value) == expected
    assert replicate_conf("delta:///lake/{table}", "4.2.1")["spark.jars.packages"] == \
        "io.delta:delta-spark_2.13:4.4.0"


def test_fetch_names_a_format_with_no_jar_for_the_installed_pyspark() -> None:
    """On a PySpark no jar is released for (the suite's 4.3) the fetch says so and starts no
    Spark."""
    import pyspark

    if not pyspark.__version__.startswith("4.3."):
        pytest.skip("jars are released for this PySpark")
    proc = subprocess.run([sys.executable, "-m", "tablestore_cdc.lakehouse.spark_merge", "fetch"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "skipped: the Spark engine has no delta jar released for Spark 4.3" in proc.stderr
    assert "skipped: the Spark engine has no iceberg jar released for Spark 4.3" in proc.stderr


# --- replicate --engine ---------------------------------------------------------------------


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    from connector.local import LocalTablestore

    path = tmp_path / "store.db"
    with LocalTablestore(path) as writer:
        writer.create_table("t1", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                            channels=1)
        writer.put_row("t1", {"id": 1}, {"v": 1})
    return path


def _replicate(store: Path, out: Path, *flags: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app

    result = CliRunner().invoke(app, ["replicate", "--store", str(store), "--output", str(out),
                                      "--table", "t1", *flags])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(("flags", "expected"), [
    (["--engine", "distributed"], "option '--engine': got 'distributed'; allowed: embedded or "
                                  "spark"),
    (["--engine", "spark", "--target", "iceberg:///w?table=ns.t&catalog_db=rel.db"],
     "the Spark engine of replicate writes a local Delta table or an Iceberg table of the "
     "embedded SQLite catalog"),
])
def test_replicate_refuses_an_engine_setting_in_one_line_before_spark(
        store_file: Path, tmp_path: Path, flags: list[str], expected: str) -> None:
    code, err = _replicate(store_file, tmp_path / "out", *flags)
    assert code == 2, err
    [line] = err.strip().splitlines()[-1:]
    assert line.startswith("error: ") and expected in line
    assert "Traceback" not in err


def test_replicate_engine_spark_checks_each_tables_own_target_before_spark(
        store_file: Path, tmp_path: Path) -> None:
    """A table's ``target`` in ``--config`` is checked as the template is: two Iceberg
    warehouses in one job are refused in one line, exit 2, before Spark starts."""
    config = tmp_path / "tables.toml"
    config.write_text('[tables.t1]\ntarget = "iceberg:///a?table=cdc.t1"\n'
                      '[tables.t2]\ntarget = "iceberg:///b?table=cdc.t2"\n')
    code, err = _replicate(store_file, tmp_path / "out", "--engine", "spark", "--config",
                           str(config))
    assert code == 2, err
    [line] = err.strip().splitlines()[-1:]
    assert line.startswith("error: the Spark engine writes one Iceberg warehouse per job, and "
                           "the targets name 2 (file:///a, file:///b)"), line


def test_replicate_engine_spark_on_a_pyspark_with_no_jar_names_the_ones_that_have(
        store_file: Path, tmp_path: Path) -> None:
    import pyspark

    if not pyspark.__version__.startswith("4.3."):
        pytest.skip("jars are released for this PySpark")
    code, err = _replicate(store_file, tmp_path / "out", "--engine", "spark")
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        "error: the Spark engine has no delta jar released for Spark 4.3: run it on a PySpark "
        "of 4.0, 4.1, 4.2, or use --engine embedded")
    assert not (tmp_path / "out" / "logs").exists()  # Spark never started
