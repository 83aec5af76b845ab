"""``replicate --column``, end to end: a column whose first value is a string is still typed
as the flag says; the values of that type land in the column, the string in ``_extra``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connector.local import LocalTablestore

pytestmark = pytest.mark.slow


def test_a_column_typed_by_the_flag_keeps_its_type_whatever_came_first(tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[], channels=1)
    store.put_row("t", {"id": 0}, {"amount": "n/a"})  # the first value seen: a string
    for i in range(1, 10):
        store.put_row("t", {"id": i}, {"amount": i * 10})
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "tablestore_cdc", "replicate", "--store",
         str(tmp_path / "store.db"), "--table", "t", "--output", str(out), "--once",
         "--column", "amount=double"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    table = DeltaTable(str(out / "t")).to_pyarrow_table()
    assert table.schema.field("amount").type == pa.float64()
    rows = {r["id"]: r for r in table.to_pylist()}
    assert {i: rows[i]["amount"] for i in range(1, 10)} == {i: float(i * 10)
                                                           for i in range(1, 10)}
    assert rows[0]["amount"] is None and json.loads(rows[0]["_extra"])["amount"] == "n/a"
