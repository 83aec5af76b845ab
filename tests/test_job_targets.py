"""``reconcile`` and ``resnapshot`` find the job's targets from the job's own record in the meta
table, and ``meta tables --json`` shows one record shape for a ``--table`` and a ``--tables``
job.

The slow tests share two real ``tablestore-cdc replicate --once`` processes, run side by side
over one local store (module fixture ``jobs``): a multi-table job (``--tables orders,users``,
``orders`` into the default ``OUT/lake/orders`` Delta table, ``users`` into an Iceberg table its
``--config`` names) and a single-table job (``--table items`` into ``OUT/items``). The fast
tests need no job: a table no job recorded, and ``--output`` of a job older than the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

from typer.testing import CliRunner  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from tablestore_cdc.commands.app import app  # noqa: E402
from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec  # noqa: E402
from testkit.reconcile import apply_stream  # noqa: E402

CLI = [sys.executable, "-m", "tablestore_cdc"]
runner = CliRunner()


def make_store(path: Path, *tables: str, rows: int = 6) -> LocalTablestore:
    store = LocalTablestore(path)
    for table in tables:
        store.create_table(table, primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
        for i in range(rows):
            store.put_row(table, {"id": i}, {"v": i * 10})
    return store


def replicate(store: LocalTablestore, *runs: tuple[str, ...]) -> None:
    """``replicate --once`` processes, one per run's flags, side by side (each its own Spark
    driver, tunnel and output; exit 0 asserted)."""
    started = [subprocess.Popen([*CLI, "replicate", "--store", str(store.path), "--once",
                                 *flags], env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for flags in runs]
    for process in started:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]


def reconcile(*args: str) -> Any:
    return runner.invoke(app, ["reconcile", *args])


@dataclass(frozen=True)
class Jobs:
    store: LocalTablestore
    multi: Path  # --tables orders,users
    single: Path  # --table items
    warehouse: Path  # users' Iceberg warehouse (--config)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    root = tmp_path_factory.mktemp("jobs")
    store = make_store(root / "store.db", "orders", "users", "items")
    warehouse = root / "wh"
    config = root / "tables.toml"
    config.write_text(f'[tables.users]\ntarget = "iceberg://{warehouse}?table=cdc.users"\n')
    replicate(store, ("--tables", "orders,users", "--config", str(config), "--output",
                      str(root / "multi")),
              ("--table", "items", "--output", str(root / "single")))
    return Jobs(store, root / "multi", root / "single", warehouse)


@pytest.mark.slow
@pytest.mark.xdist_group("job_targets_jobs")  # one worker builds the module's `jobs`
def test_reconcile_finds_each_jobs_delta_and_iceberg_targets_from_the_source_alone(
        jobs: Jobs) -> None:
    result = reconcile("--store", str(jobs.store.path), "--table", "orders", "--table", "users",
                       "--table", "items", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    targets = {t["table"]: t["target"] for t in document["tables"]}
    assert targets == {"orders": f"delta://{jobs.multi}/lake/orders",
                       "users": f"iceberg://{jobs.warehouse}?table=cdc.users",
                       "items": f"delta://{jobs.single}/items"}
    assert all(t["ok"] and t["rows"] == {"source": 6, "target": 6} for t in document["tables"])

    # the copy found is the one compared: a change the job has not applied is missing there
    jobs.store.put_row("users", {"id": 99}, {"v": 1})
    try:
        result = reconcile("--store", str(jobs.store.path), "--table", "users", "--json",
                           "--no-in-flight")
        assert result.exit_code == 1, result.output
        (users,) = json.loads(result.stdout)["tables"]
        assert users["differences"]["MISSING"] == 1 and users["target"].startswith("iceberg:")
    finally:
        jobs.store.delete_row("users", {"id": 99})


@pytest.mark.slow
@pytest.mark.xdist_group("job_targets_jobs")  # one worker builds the module's `jobs`
def test_target_overrides_the_record_and_output_must_name_the_job(jobs: Jobs) -> None:
    base = ["--store", str(jobs.store.path), "--table", "orders"]
    other = f"delta://{jobs.single}/items"  # same columns, another table's copy
    result = reconcile(*base, "--target", other, "--json", "--no-in-flight")
    (orders,) = json.loads(result.stdout)["tables"]
    assert orders["target"] == other
    result = reconcile(*base, "--output", str(jobs.multi))
    assert result.exit_code == 0 and f"target delta://{jobs.multi}/lake/orders" in result.output
    result = reconcile(*base, "--output", str(jobs.single))
    assert result.exit_code == 2
    assert result.output == (f"error: --output {jobs.single}: table orders is replicated by the "
                             f"job with --output {jobs.multi} (into delta://{jobs.multi}/lake/"
                             "orders); drop --output, or pass --target URI\n")


@pytest.mark.slow
@pytest.mark.xdist_group("job_targets_jobs")  # one worker builds the module's `jobs`
def test_resnapshot_names_the_job_that_repairs_the_table(jobs: Jobs) -> None:
    result = runner.invoke(app, ["resnapshot", "--store", str(jobs.store.path), "--table",
                                 "users"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("resnapshot ") and result.stdout.endswith(": pending\n")
    assert result.stderr == (f"repaired by the job with --output {jobs.multi}, into "
                             f"iceberg://{jobs.warehouse}?table=cdc.users\n")


@pytest.mark.slow
@pytest.mark.xdist_group("job_targets_jobs")  # one worker builds the module's `jobs`
def test_meta_tables_json_has_the_same_fields_for_a_table_and_a_tables_job(jobs: Jobs) -> None:
    meta = f"sqlite:///{Path(jobs.store.path).with_suffix('.meta.db')}"
    result = runner.invoke(app, ["meta", "tables", "--meta", meta, "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["table"]: r for r in json.loads(result.stdout)["tables"]}
    multi, single = rows["orders"], rows["items"]
    assert multi["selection"] == "orders,users" and single["selection"] == "items"
    assert multi["job"] == str(jobs.multi) and single["job"] == str(jobs.single)
    assert multi["state"] == single["state"] == "stopped"  # --once: caught up, then stopped
    assert set(multi) == set(single)
    # and the same fields hold a value: the figures of one mode are the figures of the other
    assert {k for k, v in multi.items() if v is not None} == \
        {k for k, v in single.items() if v is not None}
    assert multi["rows_applied"] == single["rows_applied"] == 6
    assert multi["ops"] == single["ops"] == {"inserts": 6}
    text = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["meta", "tables", "--meta", meta])
    assert f"delta://{jobs.single}/items" in text.output  # the target reconcile reads, shown
    assert f"iceberg://{jobs.warehouse}?table=cdc.users" in text.output


def test_a_table_no_job_recorded_is_one_line_saying_what_to_pass(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db", "t")
    for args in (["--store", str(store.path), "--table", "t"],
                 ["--store", str(store.path), "--table", "t", "--option",
                  f"meta.store=sqlite:///{tmp_path}/never.db"]):
        result = reconcile(*args)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: table t: no replicate job has recorded its "
                                        "target in the meta store sqlite:///")
        assert result.output.endswith("; pass --target URI\n")
        assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "never.db").exists()  # read-only: never created
    options = SourceSpec(f"local://{store.path}", "t").source_options()
    open_meta_store(options.meta_store).close()  # a meta table, without a job's record
    result = runner.invoke(app, ["resnapshot", "--store", str(store.path), "--table", "t"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("note: no replicate job has recorded table t in this meta table "
                             "(tunnel replicate): the signal waits until one runs\n")


def test_output_of_a_job_without_a_record_finds_either_layout(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db", "t")
    base = ["--store", str(store.path), "--table", "t"]
    out = tmp_path / "out"
    result = reconcile(*base, "--output", str(out))
    assert result.exit_code == 2
    assert result.output == (f"error: --output: neither holds a Delta table for t ({out}/t and "
                             f"{out}/lake/t); pass --target URI\n")
    for layout in (out / "lake" / "t", out / "t"):  # --tables' layout, then --table's too
        apply_stream(f"local://{store.path}", "t", open_apply_sink(f"delta://{layout}"))
        result = reconcile(*base, "--output", str(out))
        if layout == out / "t":
            assert result.exit_code == 2 and "--output: both hold a Delta table" in result.output
        else:
            assert result.exit_code == 0, result.output
            assert f"target delta://{layout} version" in result.output


@pytest.mark.parametrize(("recorded", "given", "same"), [
    ("s3://lake/state", "s3://lake/state/", True), ("s3://lake/state", "s3a://lake/state", True),
    ("s3://lake/state", "s3://lake/other", False), ("s3://lake/state", "/lake/state", False),
    ("/data/out", "/data/out/", True), ("/data/out", "/data/out2", False)])
def test_output_names_the_job_as_its_record_has_it_a_path_or_an_s3_prefix(
        recorded: str, given: str, same: bool) -> None:
    from tablestore_cdc.reconcile.command import _same_output

    assert _same_output(recorded, given) is same
