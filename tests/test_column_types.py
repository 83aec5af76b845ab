"""Column types fixed from the command line (``replicate --column``) and the settings file
(``columns = {...}`` per table): each table's source reads with the ``catalog`` they make, so
a column's type no longer depends on the first value seen; a bad spec is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from connector.options import SourceOptions
from connector.table_selection import MultiTableOptions
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.table_config import (
    ColumnTypeError,
    TableConfigError,
    catalog_option,
    column_types,
    load_table_config,
)


def test_column_flags_become_each_tables_catalog() -> None:
    assert column_types(["orders.amount=double", "orders.note=String", "users.age=long"]) == {
        "orders": {"amount": "double", "note": "string"}, "users": {"age": "long"}}
    assert column_types(["amount=double", "orders.flag=bool"], table="orders") == {
        "orders": {"amount": "double", "flag": "bool"}}
    options = SourceOptions.from_spark({"endpoint": "local:///s.db", "table.name": "orders",
                                        "tunnel.name": "t",
                                        "catalog": catalog_option({"amount": "double"})})
    assert options.catalog == (("amount", "DOUBLE"),)


@pytest.mark.parametrize(("specs", "table", "problem"), [
    (["orders.amount"], None, "not TABLE.COLUMN=TYPE"),
    (["amount=double"], None, "not TABLE.COLUMN=TYPE"),
    (["orders.amount=decimal"], None, "type 'decimal' is not one of"),
    (["orders._extra=string"], None, "the source's own"),
    (["users.age=long"], "orders", "names table 'users', not --table 'orders'"),
])
def test_a_bad_column_spec_names_the_flag(specs: list[str], table: str | None,
                                          problem: str) -> None:
    with pytest.raises(ColumnTypeError, match="option '--column'") as caught:
        column_types(specs, table)
    assert problem in str(caught.value)


def test_the_settings_files_columns_and_the_flags_make_each_tables_catalog(
        tmp_path: Path) -> None:
    path = tmp_path / "tables.toml"
    path.write_text('[defaults]\ncolumns = {region = "string"}\n\n'
                    '[tables.orders]\ncolumns = {amount = "double", qty = "long"}\n')
    config = load_table_config(path)
    base = ApplySettings("delta:///lake/{table}")
    # the flag wins over the file for the column it names
    shared = {"endpoint": "local:///s.db", "tables": "*", "tunnel.name": "t"}
    options = config.source_options(shared, base,
                                    columns={"orders": {"qty": "double"},
                                             "users": {"age": "long"}})
    multi = MultiTableOptions.from_spark(options)
    assert dict(multi.for_table("orders").catalog or ()) == {
        "region": "STRING", "amount": "DOUBLE", "qty": "DOUBLE"}
    assert dict(multi.for_table("users").catalog or ()) == {"region": "STRING",
                                                             "age": "INTEGER"}
    assert dict(multi.for_table("other").catalog or ()) == {"region": "STRING"}
    # the apply settings are not touched by the source's columns
    assert config.for_table("orders", base) == (base, None)


def test_a_bad_type_in_the_settings_file_names_the_table_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "tables.toml"
    path.write_text('[tables.orders]\ncolumns = {amount = "money"}\n')
    with pytest.raises(TableConfigError, match="table 'orders': key 'columns'.*'money'"):
        load_table_config(path)


@pytest.mark.parametrize("args", [
    ["--table", "orders", "--column", "amount=money"],
    ["--tables", "orders*", "--column", "amount=double"],
    ["--table", "orders", "--column", "users.age=long"],
])
def test_replicate_refuses_a_bad_column_in_one_line(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "s.db").touch()
    result = CliRunner().invoke(app, ["replicate", "--output", str(tmp_path / "out"),
                                      "--store", str(tmp_path / "s.db"), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--column" in lines[0], lines
    assert not (tmp_path / "out").exists()
