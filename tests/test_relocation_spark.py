"""A moved or copied ``--output`` resumes exactly (``tablestore_cdc.pipeline.relocation``), with
real ``tablestore-cdc replicate --once`` processes over one local store: a ``--table`` job and a
``--tables`` job run side by side, more changes are written, the first job's output is copied
(``cp -a``) and the second's moved (``mv``), both run again from their new places (both in the
two-cycle pipeline, whose change log names its files by path; a third job, in the one-cycle
pipeline, is copied too, and resumes with nothing to rewrite). Each says the
one line, each target (SCD 2: a change applied twice would be a version too many) equals the
source, and the second run applied only the new changes. A target named under the old
directory is refused in one line before anything starts, and so is a copy of a job that still
runs (its lease: two live jobs never)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

deltalake = pytest.importorskip("deltalake")

from connector.local import LocalTablestore  # noqa: E402
from connector.options import SourceOptions  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from tablestore_cdc.pipeline.relocation import moved_from  # noqa: E402
from testkit.waiting import wait_until  # noqa: E402

CLI = [sys.executable, "-m", "tablestore_cdc"]


def replicate(store: str | Path, *runs: tuple[str, ...]) -> list[str]:
    """``replicate --once --scd 2`` processes side by side, one per run's flags: what each
    one said (stdout and stderr), its lines joined (Rich wraps them); exit 0 asserted."""
    started = [subprocess.Popen([*CLI, "replicate", "--store", str(store), "--once",
                                 "--scd", "2", *flags],
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for flags in runs]
    said = []
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout[-2000:] + stderr[-3000:]
        said.append(" ".join((stdout + stderr).split()))
    return said


def versions(target: Path) -> list[dict[str, Any]]:
    return deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist()


def current(target: Path) -> dict[int, int]:
    return {r["id"]: r["v"] for r in versions(target) if r["__END_AT"] is None}


def source_rows(store: LocalTablestore, table: str) -> dict[int, int]:
    return {pk["id"]: cols["v"] for pk, cols in store.scan(table)}


def lease_holder(store: LocalTablestore, table: str) -> str | None:
    """The owner of ``table``'s live lease in the store's meta store (the job's ``--tunnel``
    ``replicate``), or None."""
    options = SourceOptions.from_spark({"endpoint": f"local://{store.path}",
                                        "table.name": table, "tunnel.name": "replicate"})
    with open_meta_store(options.meta_store, options.meta_store_credentials) as meta:
        lease = meta.get_lease(options.source_identity)
    return lease.owner if lease is not None and lease.live(time.time()) else None


def recorded_job(store: LocalTablestore, table: str) -> str | None:
    """The job (its output directory) ``table``'s status in the meta store names."""
    from tablestore_cdc.table_status import load_table_status

    options = SourceOptions.from_spark({"endpoint": f"local://{store.path}",
                                        "table.name": table, "tunnel.name": "replicate"})
    with open_meta_store(options.meta_store, options.meta_store_credentials) as meta:
        status = load_table_status(meta, options.source_identity)
    return status.job if status is not None else None


@dataclass(frozen=True)
class Moved:
    store: LocalTablestore
    root: Path
    said: list[str]  # the second runs' stdout: the copied --table job's, the moved --tables'


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> Moved:
    root = tmp_path_factory.mktemp("moved")
    store = LocalTablestore(root / "store.db")
    for table in ("items", "orders", "users", "carts"):
        store.create_table(table, primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
        for i in range(5):
            store.put_row(table, {"id": i}, {"v": i})
    # the two-cycle pipeline's change log is what names paths; the one-cycle's names none
    replicate(store.path, ("--table", "items", "--output", str(root / "single"),
                           "--cycle", "two"),
              ("--tables", "orders,users", "--output", str(root / "multi"), "--cycle", "two"),
              ("--table", "carts", "--output", str(root / "one-cycle")))
    for table in ("items", "orders", "users", "carts"):  # updates, inserts, a delete after
        for i in range(3, 8):
            store.put_row(table, {"id": i}, {"v": i * 100})
        store.delete_row(table, {"id": 0})
    subprocess.run(["cp", "-a", str(root / "single"), str(root / "single-copy")], check=True)
    subprocess.run(["cp", "-a", str(root / "one-cycle"), str(root / "one-cycle-copy")],
                   check=True)
    (root / "elsewhere").mkdir()
    subprocess.run(["mv", str(root / "multi"), str(root / "elsewhere" / "multi")], check=True)
    said = replicate(store.path, ("--table", "items", "--output", str(root / "single-copy")),
                     ("--tables", "orders,users", "--output",
                      str(root / "elsewhere" / "multi")),
                     ("--table", "carts", "--output", str(root / "one-cycle-copy")))
    return Moved(store, root, said)


@pytest.mark.slow
@pytest.mark.xdist_group("relocation_moved")  # one worker builds the module's `moved`
def test_a_copied_table_job_resumes_exactly(moved: Moved) -> None:
    copy, old = moved.root / "single-copy", moved.root / "single"
    assert (f"{copy} was moved from {old}; its change-log paths now point here"
            in moved.said[0]), moved.said[0]
    assert current(copy / "items") == source_rows(moved.store, "items")
    # SCD 2: 5 rows, then 2 updates (a closed version each), 3 inserts, 1 delete (closed)
    assert len(versions(copy / "items")) == 5 + 2 + 3
    assert "; 6 change(s) applied" in moved.said[0], moved.said[0]  # the new ones only
    assert current(old / "items") == {i: i for i in range(5)}  # the original left as it was
    assert recorded_job(moved.store, "items") == str(copy)  # meta tables, reconcile: the copy


@pytest.mark.slow
@pytest.mark.xdist_group("relocation_moved")  # one worker builds the module's `moved`
def test_a_copied_one_cycle_job_resumes_exactly_with_nothing_to_rewrite(moved: Moved) -> None:
    copy, old = moved.root / "one-cycle-copy", moved.root / "one-cycle"
    assert "was moved from" not in moved.said[2], moved.said[2]
    assert moved_from(copy) is None  # no log under it names a path
    assert current(copy / "carts") == source_rows(moved.store, "carts")
    assert len(versions(copy / "carts")) == 5 + 2 + 3  # no change applied twice
    assert "; 6 change(s) applied" in moved.said[2], moved.said[2]  # the new ones only
    assert current(old / "carts") == {i: i for i in range(5)}  # the original left as it was
    assert recorded_job(moved.store, "carts") == str(copy)


@pytest.mark.slow
@pytest.mark.xdist_group("relocation_moved")  # one worker builds the module's `moved`
def test_a_moved_multi_table_job_resumes_exactly(moved: Moved) -> None:
    new, old = moved.root / "elsewhere" / "multi", moved.root / "multi"
    assert (f"{new} was moved from {old}; its change-log paths now point here"
            in moved.said[1]), moved.said[1]
    for table in ("orders", "users"):
        assert current(new / "lake" / table) == source_rows(moved.store, table)
        assert len(versions(new / "lake" / table)) == 5 + 2 + 3, table
        assert recorded_job(moved.store, table) == str(new)


@pytest.mark.slow
@pytest.mark.xdist_group("relocation_moved")  # one worker builds the module's `moved`
def test_a_target_left_under_the_old_directory_is_refused_before_start(moved: Moved,
                                                                        tmp_path: Path) -> None:
    old, new = moved.root / "single-copy", tmp_path / "single-moved"
    shutil.copytree(old, new, symlinks=True)
    target = f"delta://{old}/items"
    result = subprocess.run([*CLI, "replicate", "--store", str(moved.store.path), "--once",
                             "--scd", "2", "--table", "items", "--output", str(new),
                             "--target", target], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said
    assert (f"{new} was moved from {old}, but target {target} still lies under {old}"
            in said), said
    assert "Traceback" not in said
    assert moved_from(new) == old  # nothing rewritten: the logs still name the old place


@pytest.mark.slow
@pytest.mark.xdist_group("relocation_moved")  # one worker builds the module's `moved`
def test_a_copy_of_a_running_job_is_refused_by_its_lease(moved: Moved, tmp_path: Path) -> None:
    live, copy = moved.root / "single-copy", tmp_path / "copy"
    log = tmp_path / "live.txt"
    with open(log, "w") as out:
        job = subprocess.Popen([*CLI, "replicate", "--store", str(moved.store.path), "--scd",
                                "2", "--table", "items", "--output", str(live)],
                               env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until("the running job's lease", lambda: lease_holder(moved.store, "items"),
                   timeout=240, process=job)
        subprocess.run(["cp", "-a", str(live), str(copy)], check=True)
        result = subprocess.run([*CLI, "replicate", "--store", str(moved.store.path),
                                 "--once", "--scd", "2", "--table", "items", "--output",
                                 str(copy)], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    finally:
        job.terminate()  # SIGTERM: the job stops at its next look
        job.wait(timeout=120)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 4, said
    assert "table 'items' is already replicated" in said and f"output {live})" in said, said
    assert moved_from(copy) == live  # refused before the rewrite: the copy left as it was
