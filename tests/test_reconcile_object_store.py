"""``reconcile`` and ``lake optimize`` on targets in object storage: a Delta table in a moto S3
bucket (``delta+s3://``) and an Iceberg table of a catalog pyiceberg's environment configuration
names, its warehouse in the bucket (``iceberg://CATALOG/ns.t``: a SQL catalog; in ``make
test-extended`` also Apache Iceberg's REST catalog server). Both are built by the real
apply sink from a real embedded store's change stream (``testkit.reconcile.apply_stream``), then
a row is changed behind the product's back with deltalake / pyiceberg; the commands run through
the real CLI."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

from typer.testing import CliRunner  # noqa: E402

from tablestore_cdc.commands.app import app  # noqa: E402
from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import (  # noqa: E402
    CatalogIceberg,
    S3Delta,
    batch,
    change,
    sql_catalog,
    store_with_history,
)
from testkit.reconcile import apply_stream  # noqa: E402

runner = CliRunner()
NO_HTTP = {"AWS_ALLOW_HTTP": "true"}


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the moto server, which ``AWS_ENDPOINT_URL`` names."""
    return new_s3_bucket(moto_endpoint, monkeypatch)


def reconcile_json(store: Path, target: str, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["reconcile", "--store", str(store), "--table", "t",
                                 "--target", target, "--json", *extra])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_reconcile_finds_a_row_changed_in_an_s3_delta_table(
        tmp_path: Path, bucket: str, moto_endpoint: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import DeltaTable

    store = store_with_history(tmp_path / "store.db", changes=200)
    target = f"delta+s3://{bucket}/lake/t"
    apply_stream(f"local://{store.path}", "t", open_apply_sink(target))
    code, document = reconcile_json(store.path, target)
    assert (code, document["ok"]) == (0, True)
    assert document["tables"][0]["rows"]["target"] == store.count_rows("t")

    table = DeltaTable(f"s3://{bucket}/lake/t", storage_options=NO_HTTP)
    key = sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())[0]
    table.update(predicate=f"id = {key}", updates={"qty": "-1"})
    # the endpoint given as a --target-option instead of the environment
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    code, document = reconcile_json(store.path, target, "--target-option",
                                    f"aws_endpoint_url={moto_endpoint}")
    (report,) = document["tables"]
    assert code == 1 and report["differences"]["DIFFERENT"] == 1
    assert report["listed"][0]["key"] == {"id": key}


@pytest.mark.parametrize("kind", ["sql", pytest.param("rest", marks=[pytest.mark.slow,
                                                                      pytest.mark.extended])])
def test_reconcile_finds_a_row_changed_in_an_iceberg_table_of_a_catalog(
        tmp_path: Path, bucket: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest, kind: str) -> None:
    """A SQL catalog on SQLite, or (``make test-extended``) Apache Iceberg's REST catalog server
    (``rest_catalog``), configured by ``PYICEBERG_CATALOG__*`` variables only."""
    from pyiceberg.expressions import EqualTo

    if kind == "rest":  # the session's server keeps its tables: a namespace of the test's own
        catalog = CatalogIceberg("rest", request.getfixturevalue("rest_catalog").properties,
                                 namespace=f"cdc_{uuid.uuid4().hex[:8]}")
    else:
        catalog = CatalogIceberg("lake", sql_catalog(tmp_path / "catalog.db",
                                                     f"s3://{bucket}/wh", moto_endpoint))
    for key, value in catalog.catalog_env.items():
        monkeypatch.setenv(key, value)
    identifier = f"{catalog.namespace}.t"
    store = store_with_history(tmp_path / "store.db", changes=200)
    target = f"iceberg://{catalog.catalog}/{identifier}"
    apply_stream(f"local://{store.path}", "t", open_apply_sink(target))
    code, document = reconcile_json(store.path, target)
    assert (code, document["ok"]) == (0, True)

    from pyiceberg.catalog import load_catalog

    table = load_catalog(catalog.catalog, **catalog.properties).load_table(identifier)
    rows = table.scan().to_arrow().to_pylist()
    row = min(rows, key=lambda r: r["id"])
    row["qty"] = -1
    table.overwrite(type(table.scan().to_arrow()).from_pylist(
        [row], schema=table.schema().as_arrow()), overwrite_filter=EqualTo("id", row["id"]))
    code, document = reconcile_json(store.path, target)
    (report,) = document["tables"]
    assert code == 1 and report["differences"]["DIFFERENT"] == 1
    assert report["listed"][0]["key"] == {"id": row["id"]}


def test_lake_optimize_compacts_an_s3_delta_table_and_vacuums_it(bucket: str) -> None:
    from deltalake import DeltaTable

    target = S3Delta(bucket)
    sink = target.sink()
    for batch_id in range(4):  # new keys only: each batch appends a file of its own
        sink.apply(batch(*(change("PUT", "c", batch_id * 10 + i, batch_id, batch_id * 10 + i,
                                  f"n{i}", i) for i in range(3))), "q", batch_id)
    rows = sorted(r["id"] for r in target.rows())
    assert len(target.table().file_uris()) == 4
    result = runner.invoke(app, ["lake", "optimize", "--target", target.uri,
                                 "--vacuum-hours", "0"])
    assert result.exit_code == 0, result.output
    assert "4 file(s) compacted into 1; 4 unreferenced file(s) removed" in result.output
    after = DeltaTable(target.table_uri, storage_options=NO_HTTP)
    assert (sorted(r["id"] for r in target.rows()), len(after.file_uris())) == (rows, 1)
    refused = runner.invoke(app, ["lake", "optimize", "--target", target.uri,
                                  "--target-option", "aws_s3_allow_unsafe_rename=true"])
    assert refused.exit_code == 2 and "is refused" in refused.output


def test_lake_optimize_expires_and_vacuums_an_iceberg_table_in_s3(
        tmp_path: Path, bucket: str, moto_endpoint: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshots the job does not need are expired through the catalog; then the files
    under the table's location no snapshot refers to (those of expired snapshots, a stray
    file of a batch killed before its commit) are removed, listed through the table's
    FileIO; the table still reads whole and its job's batch marker is kept."""
    import boto3

    catalog = CatalogIceberg("lake", sql_catalog(tmp_path / "catalog.db", f"s3://{bucket}/wh",
                                                 moto_endpoint))
    for key, value in catalog.catalog_env.items():
        monkeypatch.setenv(key, value)
    sink = catalog.sink()
    for batch_id in range(4):  # the same keys again and again: overwrites
        sink.apply(batch(*(change("PUT", "c", batch_id * 10 + i, batch_id, i, f"v{batch_id}",
                                  i) for i in range(3))), "q", batch_id)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    location = catalog.table().location().removeprefix(f"s3://{bucket}/")
    s3.put_object(Bucket=bucket, Key=f"{location}/data/stray-killed-batch.parquet", Body=b"x")

    def listed() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=location)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}

    before = listed()
    result = runner.invoke(app, ["lake", "optimize", "--target", catalog.uri,
                                 "--expire-hours", "0", "--vacuum-hours", "0"])
    assert result.exit_code == 0, result.output
    after = listed()
    assert f"{location}/data/stray-killed-batch.parquet" in before - after
    assert len(before - after) >= 4  # the stray file, and old data files, manifests, lists
    assert "snapshot(s) expired" in result.output
    assert sorted((r["id"], r["name"]) for r in catalog.rows()) == [
        (0, "v3"), (1, "v3"), (2, "v3")]
    assert catalog.sink().committed_batch("q") == 3
