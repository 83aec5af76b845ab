"""An output of an earlier version's single-table ``replicate --table`` (``pipeline/upgrade.py``).

``tests/data/single_table_output.tar.gz`` is such an output, as that version wrote it: the store
(table ``t``: 60 changes, then 30 more written after the job stopped), its meta store and
``out/`` after ``replicate --table t --once`` (a typed change log, one table's offsets, the
Delta target ``out/t``). It was written under ``/tmp/oldlayout``: here it lies elsewhere, so
the target's ownership marker names another store path and the runs pass ``--adopt-target``
(and the output's moved change-log paths are rewritten, ``relocation``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import deltalake
import pytest

from connector.local import LocalTablestore
from tablestore_cdc.pipeline.upgrade import _applied_everything, single_table_layout
from tablestore_cdc.verify import read_delta, rows_by_key, table_state

FIXTURE = Path(__file__).parent / "data" / "single_table_output.tar.gz"
CLI = [sys.executable, "-m", "tablestore_cdc"]


@pytest.fixture
def earlier(tmp_path: Path) -> Path:
    """The earlier version's store and output, extracted into ``tmp_path``."""
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path


def _replicate(where: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [*CLI, "replicate", "--store", str(where / "store.db"), "--output",
               str(where / "out"), "--once", *flags]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _target_equals_source(where: Path) -> bool:
    with LocalTablestore(where / "store.db") as store:
        source = {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    return table_state(read_delta(str(where / "out" / "t")), ["id"]) == source


def test_the_layout_and_whether_its_apply_had_caught_up_are_told_apart(earlier, tmp_path):
    out = earlier / "out"
    assert single_table_layout(out) and _applied_everything(out)
    (out / "_checkpoints" / "apply" / "commits" / "0").unlink()  # its last batch not committed
    assert not _applied_everything(out)
    assert not single_table_layout(tmp_path / "nothing-here")
    newer = tmp_path / "newer" / "_checkpoints" / "changelog" / "offsets"
    newer.mkdir(parents=True)  # a selection's offsets: one entry per table
    (newer / "0").write_text('v1\n{}\n{"tables": {"t": {"uuid": "u"}}}\n')
    assert not single_table_layout(tmp_path / "newer")


@pytest.mark.slow
def test_table_upgrades_an_earlier_output_in_place_and_goes_on_exactly(earlier):
    """The earlier apply had applied all of its change log: the layout is kept aside, no
    re-snapshot, and the 30 changes written after the earlier job stopped are delivered from
    where it left the tunnel."""
    assert not _target_equals_source(earlier)  # the 30 later changes
    run = _replicate(earlier, "--table", "t", "--adopt-target")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "single-table layout of an earlier version, upgraded" in run.stderr
    assert "the target held all of it" in run.stderr and "Traceback" not in run.stderr
    assert _target_equals_source(earlier)
    kept = earlier / "out" / "_single_table"
    assert (kept / "changelog").is_dir() and (kept / "_checkpoints" / "apply").is_dir()
    again = _replicate(earlier, "--table", "t")  # now of this version: no upgrade, no adopt
    assert again.returncode == 0, again.stderr[-3000:]
    assert "upgraded" not in again.stderr and _target_equals_source(earlier)


@pytest.mark.slow
def test_an_unapplied_tail_of_the_earlier_change_log_is_repaired_by_a_resnapshot(earlier):
    """The earlier apply had not committed its last batch, and the target lacks a row it held:
    the upgrade records a re-snapshot, which the run applies; the target equals the source."""
    out = earlier / "out"
    (out / "_checkpoints" / "apply" / "commits" / "0").unlink()
    deltalake.DeltaTable(str(out / "t")).delete("id = 10")
    run = _replicate(earlier, "--table", "t", "--adopt-target")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "is re-snapshotted" in run.stderr, run.stderr[-3000:]
    assert _target_equals_source(earlier)


@pytest.mark.slow
def test_tables_refuses_an_earlier_single_table_output_in_one_line(earlier):
    before = sorted(p.relative_to(earlier) for p in earlier.rglob("*"))
    run = _replicate(earlier, "--tables", "t*")
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.count("\n") == 1, run.stderr
    assert "run replicate --table TABLE on it once" in run.stderr
    assert sorted(p.relative_to(earlier) for p in earlier.rglob("*")) == before
