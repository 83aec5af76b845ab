"""A target that does not belong to the job is never written (tablestore_cdc.lakehouse
.ownership): foreign Delta and Iceberg tables are refused with their files byte-for-byte
unchanged, another query of the same source is refused, ``adopt_target`` takes a table over
after checking its keys."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")

from deltalake import DeltaTable, write_deltalake  # noqa: E402
from deltalake.transaction import CommitProperties, Transaction  # noqa: E402

from tablestore_cdc.lakehouse.errors import ForeignTargetError, TargetKeysError  # noqa: E402
from tablestore_cdc.lakehouse.iceberg import (  # noqa: E402
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
)
from tablestore_cdc.lakehouse.ownership import JOB_PROPERTY, SOURCE_PROPERTY  # noqa: E402
from tablestore_cdc.verify import table_state  # noqa: E402
from testkit.lakehouse import FIRST, WITH_COLOUR, Delta, Iceberg  # noqa: E402


def files_of(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def foreign_table(target: Delta | Iceberg, rows: pa.Table, **commit: str) -> Path:
    """A table someone else made at the target's place (no marker); returns its directory."""
    if target.name == "delta":
        write_deltalake(target.path, rows, commit_properties=CommitProperties(
            app_transactions=[Transaction(commit["app"], 0)]) if commit else None)
        return Path(target.path)
    from pyiceberg.catalog import load_catalog

    warehouse = Path(target.properties["warehouse"].removeprefix("file://"))
    warehouse.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog("tablestore_cdc", **target.properties)
    catalog.create_namespace_if_not_exists("cdc")
    table = catalog.create_table("cdc.orders", schema=rows.schema)
    table.append(rows, snapshot_properties={QUERY_ID_PROPERTY: commit["app"],
                                            BATCH_ID_PROPERTY: "0"} if commit else {})
    return warehouse


def catalog_row(target: Iceberg) -> list[tuple]:
    import sqlite3

    db = target.properties["uri"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT * FROM iceberg_tables").fetchall()


ORDERS = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["x", "y"],
                   "qty": pa.array([5, 6], pa.int64())})


def test_a_foreign_table_is_refused_and_left_byte_for_byte_unchanged(target) -> None:
    """Even with the same key column and compatible types: nothing merged, no column added."""
    directory = foreign_table(target, ORDERS)
    before = files_of(directory)
    rows = target.rows()
    catalog = catalog_row(target) if target.name == "iceberg" else None
    with pytest.raises(ForeignTargetError, match=r"target .*orders: it carries no marker of "
                       r"tablestore-cdc \(this job did not create it\); nothing was written"):
        target.sink().apply(WITH_COLOUR, "q", 0)
    assert files_of(directory) == before and target.rows() == rows
    if catalog is not None:
        assert catalog_row(target) == catalog
    assert "\n" not in str(ForeignTargetError(table="t", problem="p", job="j"))


def test_another_query_or_another_source_is_refused(target) -> None:
    target.sink(source="local:///shop.db#orders").apply(FIRST, "query-1", 0)
    commits = target.commits()
    with pytest.raises(ForeignTargetError, match="written by another query of the same source "
                       r"\(job 'query-1' of source 'local:///shop.db#orders'\)"):
        target.sink(source="local:///shop.db#orders").apply(WITH_COLOUR, "query-2", 0)
    with pytest.raises(ForeignTargetError, match="belongs to source 'local:///shop.db#orders', "
                       "not 'local:///other.db#orders'"):
        target.sink(source="local:///other.db#orders").apply(WITH_COLOUR, "query-1", 1)
    assert target.commits() == commits
    # the job itself goes on; a restart of the same query (same id) is the same job
    assert target.sink(source="local:///shop.db#orders").apply(WITH_COLOUR, "query-1", 1).committed


def test_adopting_a_table_checks_its_keys_then_makes_it_this_jobs(target, tmp_path) -> None:
    foreign_table(target, ORDERS)
    sink = target.sink(adopt_target=True, source="src")
    result = sink.apply(WITH_COLOUR, "q", 0)
    assert result.committed
    assert table_state(target.rows(), ["id"]) == {
        '{"id": 1}': {"name": "a", "qty": 5, "colour": "blue"},
        '{"id": 2}': {"name": "b", "qty": 2, "colour": "red", "size": 7}}
    assert target_properties(target)[JOB_PROPERTY] == "q"
    assert target_properties(target)[SOURCE_PROPERTY] == "src"
    with pytest.raises(ForeignTargetError, match="written by job 'q' of source 'src'"):
        target.sink().apply(FIRST, "another", 0)  # from now on, the table is q's


def test_a_table_whose_keys_differ_is_never_written(target, tmp_path) -> None:
    keyed_otherwise = pa.table({"order_id": pa.array([1], pa.int64()), "name": ["x"]})
    directory = foreign_table(target, keyed_otherwise)
    before = files_of(directory)
    with pytest.raises(TargetKeysError, match="it has no key column 'id'"):
        target.sink(adopt_target=True).apply(FIRST, "q", 0)
    assert files_of(directory) == before


def test_a_key_of_another_type_is_never_written(tmp_path) -> None:
    target = Delta(tmp_path)
    foreign_table(target, pa.table({"id": ["1"], "name": ["x"]}))
    with pytest.raises(TargetKeysError, match="its key column 'id' is string, the changes' "
                       "int64"):
        target.sink(adopt_target=True).apply(FIRST, "q", 0)


def test_a_table_of_this_job_from_before_markers_is_marked_on_its_next_batch(target) -> None:
    foreign_table(target, ORDERS, app="q")  # its commits carry the job's id
    sink = target.sink()
    assert sink.apply(WITH_COLOUR, "q", 1).committed
    assert target_properties(target)[JOB_PROPERTY] == "q"
    assert not sink.apply(WITH_COLOUR, "q", 1).committed


def test_a_new_table_carries_the_marker_from_its_first_commit(target) -> None:
    target.sink(source="src").apply(FIRST, "q", 0)
    assert {k: v for k, v in target_properties(target).items()
            if k.startswith("tablestore-cdc.") and k != "tablestore-cdc.key-columns"} == {
        JOB_PROPERTY: "q", SOURCE_PROPERTY: "src"}
    assert target_properties(target)["tablestore-cdc.key-columns"] == "id"
    assert table_state(target.rows(), ["id"]) == {'{"id": 1}': {"name": "a", "qty": 1}}


def target_properties(target: Delta | Iceberg) -> dict[str, str]:
    if target.name == "delta":
        return dict(DeltaTable(target.path).metadata().configuration)
    from pyiceberg.catalog import load_catalog

    return dict(load_catalog("tablestore_cdc", **target.properties)
                .load_table("cdc.orders").properties)


def test_replicate_refuses_a_foreign_target_in_one_line_before_starting_spark(tmp_path) -> None:
    import subprocess
    import sys

    from connector.local import LocalTablestore

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
    target = Delta(tmp_path)
    directory = foreign_table(target, ORDERS)
    before = files_of(directory)
    done = subprocess.run([sys.executable, "-m", "tablestore_cdc", "replicate", "--store",
                           str(store.path), "--table", "t", "--output", str(tmp_path / "out"),
                           "--target", f"delta://{target.path}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("error: target ") and "--adopt-target" in done.stderr
    assert files_of(directory) == before and not (tmp_path / "out" / "_checkpoints").exists()
    # a query id already in the checkpoint is the job: its own table passes the check
    sink = target.sink(adopt_target=True)
    sink.apply(FIRST, "the-query", 0)
    sink.check_target("the-query")
    with pytest.raises(ForeignTargetError, match=r"another query|written by job 'the-query'"):
        target.sink().check_target(None)
