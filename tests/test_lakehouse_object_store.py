"""Targets in object storage: the apply sink into ``delta+s3://`` and into an Iceberg table of a
catalog pyiceberg's environment configuration names (``iceberg://CATALOG/ns.table``: a SQL
catalog on SQLite whose warehouse is ``s3://``; in ``make test-extended`` also Apache Iceberg's
REST catalog server, ``rest_catalog``), all on a moto S3 server on 127.0.0.1
(``moto_endpoint``). No Spark: batches are Arrow change batches (testkit.lakehouse) and a real
embedded store's change log. Tables are read back with deltalake / pyiceberg directly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")

from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.lakehouse.errors import ForeignTargetError, TargetUriError  # noqa: E402
from tablestore_cdc.lakehouse.target import (  # noqa: E402
    parse_target_options,
    shown_options,
    storage_options,
)
from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import (  # noqa: E402
    FIRST,
    WITH_COLOUR,
    CatalogIceberg,
    S3Delta,
    batch,
    change,
    source_batches,
    sql_catalog,
    store_with_history,
)
from testkit.target_reads import history_mismatches, source_history, table_history  # noqa: E402


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the moto server, whose endpoint the environment names (as a user's
    ``AWS_ENDPOINT_URL`` would); the fake credentials come from ``aws_env``."""
    return new_s3_bucket(moto_endpoint, monkeypatch)


@pytest.fixture(params=["delta+s3", "iceberg-catalog",
                        # a real REST catalog server (a JVM, ~2 s once per worker)
                        pytest.param("iceberg-rest", marks=[pytest.mark.slow,
                                                            pytest.mark.extended])])
def target(request: pytest.FixtureRequest, bucket: str, moto_endpoint: str, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if request.param == "delta+s3":
        yield S3Delta(bucket)
        return
    if request.param == "iceberg-rest":
        # the session's server keeps its tables: a namespace of the test's own
        target = CatalogIceberg("rest", request.getfixturevalue("rest_catalog").properties,
                                namespace=f"cdc_{uuid.uuid4().hex[:8]}")
    else:
        target = CatalogIceberg("lake", sql_catalog(tmp_path / "catalog.db",
                                                    f"s3://{bucket}/warehouse", moto_endpoint))
    for key, value in target.catalog_env.items():
        monkeypatch.setenv(key, value)
    yield target


@pytest.mark.parametrize("scd", [1, 2])
def test_a_change_log_applies_exactly_into_object_storage(target, tmp_path, scd) -> None:
    """Puts, updates and deletes over 40 keys, cut into batches: the table read back from
    S3 equals the source (SCD 2: one version per change)."""
    store = store_with_history(tmp_path / "store.db", changes=240)
    sink = target.sink(scd=scd)
    for batch_id, page in enumerate(source_batches(store, 60)):
        assert sink.apply(page, "query-1", batch_id).committed
    rows = target.rows()
    assert table_state(rows, ["id"]) == {k: dict(v) for k, v in
                                         rows_by_key(store.scan("t")).items()}
    if scd == 2:
        assert not history_mismatches(source_history(store.change_log("t")),
                                      table_history(rows, ["id"]))


def test_a_replay_changes_nothing_and_another_job_is_refused_in_object_storage(
        target) -> None:
    sink = target.sink()
    sink.apply(FIRST, "q", 0)
    sink.apply(WITH_COLOUR, "q", 1)
    before, rows = target.commits(), target.rows()
    assert not sink.apply(WITH_COLOUR, "q", 1).committed
    assert (target.commits(), target.rows()) == (before, rows)
    # a new process finds the batch recorded in the table's own commits
    assert not target.sink().apply(WITH_COLOUR, "q", 1).committed
    assert target.sink().committed_batch("q") == 1
    # the table's marker lives in the object store too: another job is refused, unless it
    # takes the table over on purpose
    with pytest.raises(ForeignTargetError, match="written by job 'q'"):
        target.sink().apply(FIRST, "other-query", 0)
    assert target.commits() == before
    assert target.sink(adopt_target=True).apply(FIRST, "other-query", 0).committed
    with pytest.raises(ForeignTargetError, match="written by job 'other-query'"):
        target.sink().apply(FIRST, "q", 2)


def test_a_second_writers_commit_is_not_lost(target) -> None:
    """Another writer commits between the sink's read and its commit: the store refuses the
    sink's commit (S3's conditional put for Delta, the catalog's check for Iceberg), the sink
    re-plans, and both writers' rows are in the table."""
    sink = target.sink(scd=2)
    sink.apply(FIRST, "q", 0)
    raced: list[str] = []

    def race_once() -> None:
        if not raced:
            raced.append("x")
            target.other_writer(batch(change("PUT", "c", 2, 2, 9, "other", 9)), 2)

    sink._before_commit = race_once  # type: ignore[method-assign]
    result = sink.apply(batch(change("PUT", "c", 5, 5, 1, "a2", 2),
                              change("PUT", "c", 6, 6, 3, "c", 3)), "q", 1)
    assert result.committed and raced
    current = {r["id"]: r["name"] for r in target.rows() if r["__END_AT"] is None}
    assert current == {1: "a2", 3: "c", 9: "other"}
    assert len([r for r in target.rows() if r["id"] == 1]) == 2  # a1 closed, a2 open


def test_a_delta_commit_on_s3_is_conditional(bucket) -> None:
    """Two writers that read the same version: the second commit of that version is refused
    by S3 (If-None-Match), never written over the first."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties

    target = S3Delta(bucket)
    target.sink().apply(FIRST, "q", 0)
    first, second = target.table(), target.table()
    once = CommitProperties(max_commit_retries=0)
    write_deltalake(first, pa.table({"id": [7], "name": ["x"], "qty": [1]}), mode="append",
                    commit_properties=once, schema_mode="merge")
    with pytest.raises(CommitFailedError):
        write_deltalake(second, pa.table({"id": [8], "name": ["y"], "qty": [1]}),
                        mode="append", commit_properties=once, schema_mode="merge")
    assert sorted(r["id"] for r in DeltaTable(target.table_uri, storage_options={
        "AWS_ALLOW_HTTP": "true"}).to_pyarrow_table().to_pylist()) == [1, 7]


def test_delta_storage_options_come_from_the_user_and_an_http_endpoint() -> None:
    assert storage_options("t", "s3", {}, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}) == {
        "AWS_ALLOW_HTTP": "true"}
    assert storage_options("t", "s3", {}, {"AWS_ENDPOINT_URL": "https://oss.example"}) is None
    assert storage_options("t", "s3", {"aws_endpoint_url": "http://minio:9000"}, {}) == {
        "aws_endpoint_url": "http://minio:9000", "AWS_ALLOW_HTTP": "true"}
    assert storage_options("t", "gs", {"google_service_account": "/k.json"}, {}) == {
        "google_service_account": "/k.json"}
    with pytest.raises(TargetUriError, match="unsafe rename"):
        storage_options("t", "s3", {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, {})


def test_virtual_hosted_addressing_gives_delta_rs_the_buckets_own_endpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs takes a virtual-hosted endpoint as the bucket's own; the AWS SDKs add the
    bucket to the service's endpoint themselves: one AWS_ENDPOINT_URL serves both
    (integration/test_virtual_hosted_s3.py runs it against a server)."""
    from tablestore_cdc.lakehouse.object_store import s3_filesystem

    oss = {"AWS_ENDPOINT_URL": "https://oss-cn-hangzhou.aliyuncs.com",
           "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}
    assert storage_options("t", "s3", {}, oss, bucket="lake") == {
        "AWS_ENDPOINT_URL": "https://lake.oss-cn-hangzhou.aliyuncs.com"}
    given = {"Aws_Endpoint_Url": "https://lake.oss-cn-hangzhou.aliyuncs.com",
             "aws_virtual_hosted_style_request": "true"}  # already the bucket's: kept
    assert storage_options("t", "s3", given, {}, bucket="lake") == given
    assert storage_options("t", "s3", {}, {**oss, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"},
                           bucket="lake") is None  # path style: the endpoint as it is
    monkeypatch.setenv("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true")
    fs = s3_filesystem({"AWS_ENDPOINT_URL": "http://lake.s3.test:9000"}, bucket="lake")
    settings = fs.__reduce__()[1][0]  # what a Spark task unpickles
    assert settings["endpoint_override"] == "http://s3.test:9000"
    assert settings["force_virtual_addressing"] is True and settings["scheme"] == "http"


def test_target_uris_and_options_are_checked_and_secrets_never_shown(tmp_path) -> None:
    with pytest.raises(TargetUriError, match="no bucket"):
        open_apply_sink("delta+s3:///prefix")
    with pytest.raises(TargetUriError, match="unknown object store 'ftp'"):
        open_apply_sink("delta+ftp://b/p")
    with pytest.raises(TargetUriError, match="--target-option") as raised:
        open_apply_sink("delta+s3://b/p?aws_secret_access_key=hunter2")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(TargetUriError, match="credentials do not go in the URI") as raised:
        open_apply_sink("delta+s3://AKIA:hunter2@b/p")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(TargetUriError, match="credentials do not go in the URI"):
        open_apply_sink("delta+abfss://container:hunter2@account.dfs.core.windows.net/p")
    abfss = open_apply_sink("delta+abfss://container@account.dfs.core.windows.net/lake/t")
    assert str(abfss) == "abfss://container@account.dfs.core.windows.net/lake/t"
    with pytest.raises(TargetUriError, match="no catalog 'nowhere'"):
        open_apply_sink("iceberg://nowhere/ns.t")
    with pytest.raises(TargetUriError, match="NAMESPACE.TABLE"):
        open_apply_sink("iceberg://lake/t")
    with pytest.raises(TargetUriError, match="takes no target options") as raised:
        open_apply_sink(f"delta://{tmp_path}/t", target_options={
            "aws_secret_access_key": "hunter2"})
    assert "hunter2" not in str(raised.value)
    with pytest.raises(TargetUriError, match="not KEY=VALUE") as raised:
        parse_target_options(["aws_secret_access_key:hunter2"])
    assert "hunter2" not in str(raised.value)
    assert parse_target_options(["a=b=c", "region=x"]) == {"a": "b=c", "region": "x"}
    shown = shown_options({"aws_region": "eu-central-1", "aws_secret_access_key": "s",
                           "aws_session_token": "t", "catalog_password": "p"})
    assert shown == ("aws_region=eu-central-1, aws_secret_access_key=***, "
                     "aws_session_token=***, catalog_password=***")


def test_an_iceberg_catalog_option_overrides_its_configuration(bucket, moto_endpoint,
                                                               tmp_path, caplog) -> None:
    """A catalog given only by ``--target-option``s (no configuration) works as well; the
    options are logged with the secret ones hidden."""
    import logging

    db = tmp_path / "other.db"
    with caplog.at_level(logging.INFO, logger="tablestore_cdc.lakehouse"):
        sink = open_apply_sink("iceberg://adhoc/cdc.orders", key_columns=["id"],
                               target_options={
                                   "type": "sql", "uri": f"sqlite:///{db}",
                                   "warehouse": f"s3://{bucket}/wh",
                                   "s3.endpoint": moto_endpoint, "s3.region": "us-east-1",
                                   "s3.access-key-id": "testing",
                                   "s3.secret-access-key": "testing-secret-never-shown"})
        assert sink.apply(FIRST, "q", 0).committed
        delta = open_apply_sink("delta+s3://b/p", target_options={
            "aws_secret_access_key": "testing-secret-never-shown", "aws_region": "us-east-1"})
    assert [r["id"] for r in sink.table().scan().to_arrow().to_pylist()] == [1]
    assert delta.storage_options is not None and "AWS_ALLOW_HTTP" in delta.storage_options
    assert "s3.secret-access-key=***" in caplog.text
    assert "aws_secret_access_key=***, aws_region=us-east-1" in caplog.text
    assert "testing-secret-never-shown" not in caplog.text


def test_target_options_come_from_the_flag_or_a_tables_config(tmp_path) -> None:
    """``--target-option`` is refused, unshown, when it is not KEY=VALUE; a table's
    ``target_options`` in the ``--config`` TOML reach its apply settings."""
    import subprocess
    import sys

    from connector.local import LocalTablestore
    from tablestore_cdc.pipeline import ApplySettings
    from tablestore_cdc.pipeline.table_config import load_table_config

    LocalTablestore(tmp_path / "s.db")  # the flag is checked before the store is read
    result = subprocess.run(
        [sys.executable, "-m", "tablestore_cdc", "replicate", "--output", str(tmp_path),
         "--store", str(tmp_path / "s.db"), "--table", "t", "--target",
         "delta+s3://b/p", "--target-option", "aws_secret_access_key:hunter2"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "not KEY=VALUE" in result.stderr and "hunter2" not in result.stderr
    config = tmp_path / "tables.toml"
    config.write_text('[defaults]\ntarget = "delta+s3://lake/{table}"\n'
                      '[tables.orders]\ntarget_options = {aws_region = "eu-central-1"}\n')
    base = ApplySettings("delta:///unused/{table}")
    settings, _ = load_table_config(config).for_table("orders", base)
    assert (settings.target, dict(settings.target_options)) == (
        "delta+s3://lake/{table}", {"aws_region": "eu-central-1"})
    assert dict(load_table_config(config).for_table("users", base)[0].target_options) == {}
    # the multi-table apply opens each table's sink with its options
    from tablestore_cdc.pipeline.multi_table import MultiTableApply

    opened: list[dict[str, Any]] = []
    settings = ApplySettings("delta+s3://lake/{table}",
                             target_options=(("aws_region", "eu-central-1"),))

    def open_sink(uri: str, **kw: Any) -> SimpleNamespace:
        opened.append({"uri": uri, **kw})
        return SimpleNamespace()  # a sink's stand-in (the apply gives it its upkeep)

    MultiTableApply(settings, "local://store", tmp_path / "out", open_sink=open_sink).sink("orders")
    assert [(o["uri"], o["target_options"]) for o in opened] == [
        ("delta+s3://lake/orders", {"aws_region": "eu-central-1"})]


def test_a_string_keyed_table_in_s3_takes_updates_and_deletes(bucket) -> None:
    """Keys that may be in the table are looked up through the files' statistics (the files
    delta-rs' MERGE rewrote store strings as views): updated, deleted, new keys appended."""
    from testkit.lakehouse import string_keyed

    target = S3Delta(bucket, "lake/by_name")
    sink = open_apply_sink(target.uri, key_columns=["k"])
    sink.apply(string_keyed(1, ("PUT", "a", "1"), ("PUT", "b", "1"), ("PUT", "c", "1")), "q", 1)
    sink.apply(string_keyed(2, ("UPDATE", "b", "2"), ("DELETE", "c", None)), "q", 2)
    assert sink.apply(string_keyed(3, ("PUT", "d", "3")), "q", 3).appended
    sink.apply(string_keyed(4, ("UPDATE", "b", "4"), ("PUT", "c", "4")), "q", 4)
    assert sorted((r["k"], r["name"]) for r in target.rows()) == [
        ("a", "1"), ("b", "4"), ("c", "4"), ("d", "3")]


def test_an_iceberg_table_in_a_glue_catalog_on_moto(bucket, moto_endpoint, tmp_path,
                                                     monkeypatch) -> None:
    """pyiceberg's Glue catalog (moto serves Glue too), configured by environment variables
    only: the change log applies, a replay is skipped, another job is refused."""
    prefix = "PYICEBERG_CATALOG__GLUE__"
    for key, value in {"TYPE": "glue", "GLUE__ENDPOINT": moto_endpoint,
                       "GLUE__REGION": "us-east-1", "WAREHOUSE": f"s3://{bucket}/glue",
                       "S3__ENDPOINT": moto_endpoint, "S3__REGION": "us-east-1"}.items():
        monkeypatch.setenv(prefix + key, value)
    namespace = f"cdc_{uuid.uuid4().hex[:8]}"  # moto's Glue lives as long as the server
    store = store_with_history(tmp_path / "store.db", changes=120)
    sink = open_apply_sink(f"iceberg://glue/{namespace}.orders", key_columns=["id"])
    pages = source_batches(store, 40)
    for batch_id, page in enumerate(pages):
        assert sink.apply(page, "q", batch_id).committed
    assert not sink.apply(pages[-1], "q", len(pages) - 1).committed
    assert table_state(sink.table().scan().to_arrow().to_pylist(), ["id"]) == {
        k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    with pytest.raises(ForeignTargetError):
        open_apply_sink(f"iceberg://glue/{namespace}.orders", key_columns=["id"]).apply(
            pages[0], "other", 0)


class _RecordingSparkContext:
    """Where a Spark context would go: records any attempt to ship work to executors."""

    defaultParallelism = 2

    def __init__(self) -> None:
        self.shipped: list[Any] = []

    def parallelize(self, tasks: list[Any], slices: int) -> Any:
        self.shipped.append(tasks)
        raise AssertionError("a small batch's files are written by delta-rs")


def test_a_batch_below_executor_write_rows_into_s3_is_written_by_delta_rs(bucket) -> None:
    """A remote Delta table's batch smaller than ``executor_write_rows`` goes through
    delta-rs' own writer on the driver, straight to the store (a larger append's files are
    written by the executors: tests/test_lakehouse_spark.py)."""
    target = S3Delta(bucket)
    sink = target.sink(executor_write_rows=51)
    context = _RecordingSparkContext()
    sink._spark_context = context
    rows = batch(*(change("PUT", "c", i, 1, i, f"n{i}", i) for i in range(50)))
    result = sink.apply(rows, "q", 0)
    assert (result.committed, result.written_by, context.shipped) == (True, (), [])
    assert sorted(r["id"] for r in target.rows()) == list(range(50))
