"""A multi-table query reads each table by its own ``schema.change.behavior`` and ``snapshot.op``
(``tables.options``, and the settings file of ``replicate --tables``), without Spark: the
reader's driver and executor halves over a real store file, partitions pickled as Spark sends
them (docs/multi-table.md, "How each table is read")."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from connector.errors import OptionError, SchemaChangeError
from connector.local import LocalTablestore
from connector.multiplex import MultiTableStreamReader
from connector.table_selection import MultiTableOptions
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.table_config import TableConfigError, load_table_config

#: the vendor's catalog types ``qty`` for every table (the tables declare only their key:
#: attributes are schemaless, as in Tablestore)
CATALOG = '{"columns": {"id": {"type": "long"}, "qty": {"type": "long"}}}'


def _reader(path: Path, **options: str) -> MultiTableStreamReader:
    return MultiTableStreamReader(MultiTableOptions.from_spark({
        "endpoint": f"local://{path}", "tables": "*", "tunnel.name": "t",
        "tables.refreshIntervalMs": "0", "catalog": CATALOG, **options}))


def _read(reader: MultiTableStreamReader, start: dict, end: dict) -> dict[str, list[dict]]:
    """Every table's generic rows of the batch (start, end], read as an executor reads."""
    executor = pickle.loads(pickle.dumps(reader))
    rows: dict[str, list[dict]] = {}
    for partition in reader.partitions(start, end):
        for batch in executor.read(pickle.loads(pickle.dumps(partition))):
            for row in batch.to_pylist():
                rows.setdefault(row["_table"], []).append(row)
    return rows


def _drifting_tables(path: Path) -> None:
    """Three tables whose ``qty`` (INTEGER in the catalog) holds an INTEGER, a STRING and a
    DOUBLE."""
    with LocalTablestore(path) as store:
        for table in ("keeps", "drops", "refuses"):
            store.create_table(table, [("id", "INTEGER")], [], channels=1)
            store.put_row(table, {"id": 1}, {"qty": 1})
            store.put_row(table, {"id": 2}, {"qty": "3"})
            store.put_row(table, {"id": 3}, {"qty": 2.5})


def _by_id(rows: list[dict]) -> dict[int, tuple[Any, Any]]:
    """id -> (qty as the row carries it, _extra as JSON)."""
    return {json.loads(r["_key"])["id"]: (json.loads(r["_row"])["qty"],
                                          None if r["_extra"] is None else json.loads(r["_extra"]))
            for r in rows}


def test_each_table_places_values_of_another_type_by_its_own_policy(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _drifting_tables(path)
    own = json.dumps({"drops": {"schema.change.behavior": "keep"},  # the alias of ignore
                      "refuses": {"Schema.Change.Behavior": "exception"}})
    reader = _reader(path, **{"tables.options": own})
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    with pytest.raises(SchemaChangeError) as refused:  # the read of the refusing table
        _read(reader, start, end)
    assert refused.value.fields["table"] == "refuses"
    assert refused.value.fields["column"] == "qty" and refused.value.policy == "exception"
    assert str(refused.value).startswith("table 'refuses': column 'qty' is bigint")
    reader.stop()

    # a restart with the fixed setting replays exactly the refused batch: the end of every
    # table was claimed before the refusal
    reader = _reader(path, **{"tables.options": json.dumps(
        {"drops": {"schema.change.behavior": "ignore"}})})
    again = reader.latestOffset(start, None)
    assert again == end
    rows = _read(reader, start, again)
    reader.stop()
    kept = _by_id(rows["keeps"])
    assert kept[1] == (1, None)
    assert kept[2][0] is None and kept[3][0] is None  # in _extra, with their own type
    assert '"qty":"3"' in rows["keeps"][1]["_extra"] and '"qty":2.5' in rows["keeps"][2]["_extra"]
    assert _by_id(rows["drops"]) == {1: (1, None), 2: (None, None), 3: (None, None)}
    assert _by_id(rows["refuses"]) == kept  # lenient now, as the query's default


def test_each_table_marks_its_snapshot_rows_by_its_own_snapshot_op(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with LocalTablestore(path) as store:
        for table in ("marked", "plain"):
            store.create_table(table, [("id", "INTEGER")], [("v", "STRING")], channels=1)
            store.put_row(table, {"id": 1}, {"v": "before the tunnel"})
        reader = _reader(path, **{"tunnel.type": "BaseAndStream", "tables.options":
                                  '{"marked": {"snapshot.op": "read"}}'})
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        first = _read(reader, start, end)
        reader.commit(end)
        for table in ("marked", "plain"):
            store.put_row(table, {"id": 2}, {"v": "after"})
        rows: dict[str, list[dict]] = {t: list(r) for t, r in first.items()}
        for _ in range(5):  # the base data ends, then the stream is read
            start, end = end, reader.latestOffset(end, None)
            for table, more in _read(reader, start, end).items():
                rows.setdefault(table, []).extend(more)
            reader.commit(end)
        reader.stop()
    ops = {t: sorted((json.loads(r["_key"])["id"], r["_op"]) for r in rs) for t, rs in rows.items()}
    assert ops == {"marked": [(1, "READ"), (2, "PUT")], "plain": [(1, "PUT"), (2, "PUT")]}


def test_each_table_reads_up_to_its_own_limit_and_spark_is_told_one(tmp_path: Path) -> None:
    """``maxOffsetsPerTrigger`` shared by every table and one table's own under it; Spark is
    given a limit (not ``ReadAllAvailable``, which would lift them all) whenever any table
    has one, and Trigger.Once's ``ReadAllAvailable`` still lifts them."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    path = tmp_path / "s.db"
    with LocalTablestore(path) as store:
        for table in ("capped", "shared", "free"):
            store.create_table(table, [("id", "INTEGER")], [], channels=1)
            for i in range(50):
                store.put_row(table, {"id": i}, {"qty": i})

    def rows_read(reader: MultiTableStreamReader, limit: Any) -> dict[str, int]:
        start = reader.initialOffset()
        end = reader.latestOffset(start, limit)
        counts = {t: len(r) for t, r in _read(reader, start, end).items()}
        reader.stop()
        return counts

    own = json.dumps({"capped": {"maxOffsetsPerTrigger": "10"}})
    reader = _reader(path, **{"tables.options": own, "tunnel.name": "one"})
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows)  # only a table has a limit: Spark must pass one
    assert rows_read(reader, limit) == {"capped": 10, "shared": 50, "free": 50}

    reader = _reader(path, **{"tables.options": own, "tunnel.name": "two",
                              "maxOffsetsPerTrigger": "20"})
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 20
    assert rows_read(reader, limit) == {"capped": 10, "shared": 20, "free": 20}

    reader = _reader(path, **{"tables.options": own, "tunnel.name": "three"})
    assert rows_read(reader, ReadAllAvailable()) == {"capped": 50, "shared": 50, "free": 50}
    assert isinstance(_reader(path).getDefaultReadLimit(), ReadAllAvailable)  # no limit set


@pytest.mark.parametrize(("value", "option", "problem"), [
    ("{not json", "tables.options", "is not JSON"),
    ('["a"]', "tables.options", "is not a JSON object"),
    ('{"a": "exception"}', "tables.options", "gives table 'a' no object of strings"),
    ('{"a": {"tunnel.type": "Stream"}}', "tables.options", "set for every table alike"),
    ('{"a": {"maxOffsetsPerTrigger": "none"}}', "maxOffsetsPerTrigger", ""),
    ('{"a": {"schema.change.behavior": "sometimes"}}', "schema.change.behavior",
     "unknown policy"),
    ('{"a": {"snapshot.op": "r"}}', "snapshot.op", ""),
])
def test_a_bad_per_table_option_is_refused_at_load_naming_it(
        tmp_path: Path, value: str, option: str, problem: str) -> None:
    with pytest.raises(OptionError) as raised:
        _reader(tmp_path / "s.db", **{"tables.options": value})
    assert raised.value.fields["option"] == option
    assert problem in str(raised.value)
    assert pickle.loads(pickle.dumps(raised.value)).fields == raised.value.fields


def test_the_settings_file_sets_each_tables_source_policy_and_snapshot_op(
        tmp_path: Path) -> None:
    path = tmp_path / "tables.toml"
    path.write_text('[defaults]\nschema_drift = "exception"\n\n'
                    '[tables.orders]\nschema_drift = "lenient"\nsnapshot_op = "READ"\n\n'
                    '[tables.users]\nscd = 2\n')
    config = load_table_config(path)
    base = ApplySettings("delta:///lake/{table}")
    options = config.source_options({"maxOffsetsPerChannel": "5"}, base)
    assert options == {
        "maxOffsetsPerChannel": "5", "schema.change.behavior": "exception",
        "tables.options": '{"orders":{"schema.change.behavior":"lenient","snapshot.op":"READ"}}'}
    built = MultiTableOptions.from_spark({"endpoint": f"local://{tmp_path}/s.db",
                                          "tables": "*", "tunnel.name": "t", **options})
    assert built.for_table("orders").schema_change_behavior == "lenient"
    assert built.for_table("orders").snapshot_op == "READ"
    assert built.for_table("users").schema_change_behavior == "exception"
    assert config.for_table("orders", base)[0].schema_drift == "lenient"  # the target's too
    # --schema-drift on the command line is every table's, source and target
    given = ApplySettings("delta:///lake/{table}", schema_drift="ignore")
    assert config.source_options({}, given, frozenset({"schema_drift"})) == {
        "schema.change.behavior": "ignore", "tables.options": '{"orders":{"snapshot.op":"READ"}}'}
    # read limits: the defaults' for every table, a table's own in tables.options
    path.write_text('[defaults]\nmax_offsets_per_trigger = 1000\n\n'
                    '[tables.orders]\nmax_offsets_per_trigger = 50\nmax_offsets_per_channel = 5\n')
    limited = load_table_config(path).source_options({}, base)
    assert limited["maxOffsetsPerTrigger"] == "1000"
    assert json.loads(limited["tables.options"]) == {
        "orders": {"maxOffsetsPerTrigger": "50", "maxOffsetsPerChannel": "5"}}
    built = MultiTableOptions.from_spark({"endpoint": f"local://{tmp_path}/s.db",
                                          "tables": "*", "tunnel.name": "t", **limited})
    assert built.for_table("orders").max_offsets_per_trigger == 50
    assert built.for_table("orders").max_offsets_per_channel == 5
    assert built.for_table("users").max_offsets_per_trigger == 1000
    assert load_table_config(path).for_table("orders", base)[0] == base  # not the target's
    path.write_text('[tables.orders]\nmax_offsets_per_trigger = 0\n')
    with pytest.raises(TableConfigError) as refused:
        load_table_config(path)
    assert "orders" in str(refused.value) and "max_offsets_per_trigger" in str(refused.value)
    # --option schema.change.behavior names the source's own: the file does not change it
    assert config.source_options({"schema.change.behavior": "lenient"}, base) == {
        "schema.change.behavior": "lenient", "tables.options": '{"orders":{"snapshot.op":"READ"}}'}


def test_replicate_refuses_a_bad_per_table_option_in_one_line_before_spark(
        tmp_path: Path) -> None:
    LocalTablestore(tmp_path / "s.db").close()
    result = CliRunner().invoke(app, [
        "replicate", "--output", str(tmp_path / "out"), "--store", str(tmp_path / "s.db"),
        "--tables", "a*", "--option", 'tables.options={"a": {"snapshot.op": "sometimes"}}'])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    assert "snapshot.op" in result.stderr
    assert not (tmp_path / "out" / "logs").exists()  # refused before Spark started
