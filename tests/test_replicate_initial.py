"""``replicate --initial``: what a new job delivers of a table written before it started.

The embedded store keeps a channel's recent changes only once trimmed (``trim_history``, as a
service's retention does). By default (``--initial snapshot``) the job's tunnel is
BaseAndStream, so every row is in the target; ``--initial none`` reads the stream alone and
delivers only the changes still retained, and says so at start. A job whose tunnel was
created as a Stream tunnel goes on with it when started again without ``--initial``.

Each run is a real ``tablestore-cdc replicate --once`` process (its own Spark driver).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from connector.local import LocalTablestore
from tablestore_cdc.pipeline.preflight import NONE_WARNING, SNAPSHOT_LINE
from tablestore_cdc.verify import key_of, read_delta, rows_by_key, table_state

CLI = [sys.executable, "-m", "tablestore_cdc"]


def replicate(store: LocalTablestore, out: Path, *flags: str) -> str:
    """``replicate --once`` of table ``t`` into ``OUT/t``: its stderr (exit 0 asserted)."""
    done = subprocess.run([*CLI, "replicate", "--store", str(store.path), "--table", "t",
                           "--output", str(out), "--once", *flags],
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.mark.slow
def test_the_default_copy_holds_rows_whose_changes_were_trimmed(tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    for i in range(60):
        store.put_row("t", {"id": i}, {"v": i})
    store.trim_history("t", keep_last=4)  # only the newest 4 changes of each channel remain
    retained = {key_of(r.primary_key) for r in store.change_log("t")}
    assert 0 < len(retained) < 60

    said = replicate(store, tmp_path / "full")
    assert NONE_WARNING not in said and SNAPSHOT_LINE in said
    assert said.count("initial offset") == 1, said  # Spark asks twice; said once
    source = {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    assert len(source) == 60
    assert table_state(read_delta(str(tmp_path / "full" / "t")), ["id"]) == source

    said = replicate(store, tmp_path / "recent", "--initial", "none", "--tunnel", "recent")
    assert NONE_WARNING in said
    copied = table_state(read_delta(str(tmp_path / "recent" / "t")), ["id"])
    assert set(copied) == retained and all(copied[k] == source[k] for k in copied)

    # that job's Stream tunnel exists: started again with the default it goes on with it
    for i in range(100, 105):
        store.put_row("t", {"id": i}, {"v": i})
    said = replicate(store, tmp_path / "recent", "--tunnel", "recent")
    assert "tunnel 'recent' exists as Stream: kept" in said and NONE_WARNING in said
    copied = table_state(read_delta(str(tmp_path / "recent" / "t")), ["id"])
    assert set(copied) == retained | {key_of({"id": i}) for i in range(100, 105)}
