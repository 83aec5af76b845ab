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


@pytest.mark.parametrize(("source", "named"), [
    ("local:///shop.db#orders", "batch 1 of table orders into {path}"),
    (None, "batch 1 into {path}"),  # no source table to name: the target alone
    ("src", "batch 1 into {path}"),
])
def test_the_line_names_the_table_and_the_target(tmp_path, caplog, source, named) -> None:
    target = Delta(tmp_path)
    sink = target.sink(source=source)
    sink.apply(FIRST, "q", 0)
    with caplog.at_level(logging.WARNING, logger="tablestore_cdc.lakehouse"):
        sink.apply(ANOTHER_TYPE, "q", 1)
    assert [r.getMessage() for r in caplog.records if "_extra" in r.getMessage()] == [
        f"{named.format(path=target.path)}: 1 value(s) fit no column of the target and were "
        "kept in _extra"]
