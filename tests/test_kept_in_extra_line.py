"""The warning of a batch whose values fit no column of the target (kept in ``_extra``) names
the source table and the target (``lakehouse.sink.ApplySink.apply``, driver): with ``--tables``
many tables' batches reach the console, and a target path need not name its table."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from testkit.lakehouse import FIRST, Delta, batch, change

#: the string "two" in the declared int64 column ``qty``: kept, typed, in ``_extra``
ANOTHER_TYPE = batch(change("PUT", "c", 2, 2, 2, "b", 2)).set_column(
    2, pa.field("qty", pa.string()), pa.array(["two"]))


def test_the_line_names_the_table_and_the_target(tmp_path, caplog) -> None:
    target = Delta(tmp_path)
    sink = target.sink(source="local:///shop.db#orders")
    sink.apply(FIRST, "q", 0)
    with caplog.at_level(logging.WARNING, logger="tablestore_cdc.lakehouse"):
        sink.apply(ANOTHER_TYPE, "q", 1)
    assert [r.getMessage() for r in caplog.records if "_extra" in r.getMessage()] == [
        f"batch 1 of table orders into {target.path}: 1 value(s) fit no column of the target "
        "and were kept in _extra"]


@pytest.mark.parametrize("source", [None, "src"])
def test_without_a_source_table_the_line_names_the_target(tmp_path, caplog, source) -> None:
    target = Delta(tmp_path)
    sink = target.sink(source=source)
    sink.apply(FIRST, "q", 0)
    with caplog.at_level(logging.WARNING, logger="tablestore_cdc.lakehouse"):
        sink.apply(ANOTHER_TYPE, "q", 1)
    assert [r.getMessage() for r in caplog.records if "_extra" in r.getMessage()] == [
        f"batch 1 into {target.path}: 1 value(s) fit no column of the target and were kept "
        "in _extra"]
