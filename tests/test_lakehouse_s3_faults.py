"""The Delta sink on S3 through a fault proxy (``testkit.s3_faults``): moto's server on
127.0.0.1 behind a proxy that answers ``503 SlowDown``, resets connections before a request
reaches moto and resets them after a PUT was applied (every third commit PUT among them: the
ambiguous commit). No Spark: Arrow change batches from a real embedded store's change log,
applied with ``DeltaApplySink.apply`` as the job's driver applies them; the table is read back
from moto directly, not through the proxy."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("deltalake")

from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.lakehouse.delta import store_failure, store_refusal  # noqa: E402
from tablestore_cdc.lakehouse.errors import (  # noqa: E402
    ObjectStoreError,
    TargetStoreRefusedError,
    TargetUriError,
)
from tablestore_cdc.lakehouse.target import storage_options  # noqa: E402
from tablestore_cdc.pipeline.failures import query_failure  # noqa: E402
from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import S3Delta, source_batches, store_with_history  # noqa: E402
from testkit.s3_faults import (  # noqa: E402
    AMBIGUOUS_COMMIT,
    KINDS,
    STALL_AFTER_PUT,
    S3FaultProxy,
)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(moto_endpoint, rate=0.05, seed=7, commit_every=3) as started:
        yield started


@pytest.mark.parametrize("scd", [1, 2])
def test_a_change_log_applies_exactly_through_throttling_resets_and_ambiguous_commits(
        proxy: S3FaultProxy, moto_endpoint: str, tmp_path: Path, scd: int,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    bucket = new_s3_bucket(moto_endpoint, monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # the sink talks to S3 through the proxy
    store = store_with_history(tmp_path / "store.db", changes=300)
    target = S3Delta(bucket)
    sink = target.sink(scd=scd)
    batches = source_batches(store, 30)
    with caplog.at_level(logging.WARNING, "tablestore_cdc.lakehouse"):
        results = [sink.apply(page, "query-1", batch_id)
                   for batch_id, page in enumerate(batches)]
    counts = proxy.counts()
    print(f"scd {scd}: {proxy.requests} requests, {proxy.commits} commit PUTs, faults {counts}",
          file=sys.stderr)
    proxy.clear()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)  # read back from moto itself
    table = target.table()
    # each batch recorded once under its app transaction, its data committed once
    assert table.transaction_version("query-1") == len(batches) - 1
    data_commits = [c for c in table.history()
                    if c.get("tablestore-cdc.query-id") == "query-1"]
    assert sorted(int(c["tablestore-cdc.batch-id"]) for c in data_commits) == list(
        range(len(batches)))
    rows = target.rows()
    if scd == 1:
        ids = [r["id"] for r in rows]
        assert len(ids) == len(set(ids)), "a key twice"
    assert table_state(rows, ["id"]) == {k: dict(v) for k, v in
                                         rows_by_key(store.scan("t")).items()}
    assert all(counts[kind] for kind in (*KINDS, AMBIGUOUS_COMMIT)), counts
    # an ambiguous commit was found applied on the next attempt: not committed a second time
    assert any(not r.committed for r in results), results
    assert "the object store failed a request" in caplog.text


def test_a_commit_whose_answer_never_comes_is_found_applied_after_the_timeout(
        moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every second commit PUT is applied by moto and never answered: delta-rs gives up after
    the ``timeout`` storage option (1 s here, ``--target-option timeout=1s``), and the next
    attempt finds the batch recorded."""
    bucket = new_s3_bucket(moto_endpoint, monkeypatch)
    store = store_with_history(tmp_path / "store.db", changes=120)
    with S3FaultProxy(moto_endpoint, rate=0.0, commit_every=2,
                      commit_fault=STALL_AFTER_PUT) as stalling:
        monkeypatch.setenv("AWS_ENDPOINT_URL", stalling.url)
        target = S3Delta(bucket)
        sink = open_apply_sink(target.uri, key_columns=["id"],
                               target_options={"timeout": "1s", "max_retries": "2"})
        results = [sink.apply(page, "query-1", batch_id)
                   for batch_id, page in enumerate(source_batches(store, 40))]
        counts = stalling.counts()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    print(f"stalled commits: {counts}", file=sys.stderr)
    assert counts[STALL_AFTER_PUT] >= 1 and counts[AMBIGUOUS_COMMIT] == counts[STALL_AFTER_PUT]
    assert any(not r.committed for r in results)
    assert target.table().transaction_version("query-1") == len(results) - 1
    assert table_state(target.rows(), ["id"]) == {k: dict(v) for k, v in
                                                  rows_by_key(store.scan("t")).items()}


def test_what_an_object_store_failure_is_and_how_the_job_reads_it() -> None:
    from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

    chain = ("Generic S3 error\n  \x1b[31m\u21b3\x1b[0m Error performing PUT "
             "http://127.0.0.1:1/b/t/_delta_log/00000000000000000003.json - HTTP error\n"
             "   \x1b[31m\u21b3\x1b[0m error sending request")
    assert store_failure(OSError(chain)) == (
        "Generic S3 error -> Error performing PUT http://127.0.0.1:1/b/t/_delta_log/"
        "00000000000000000003.json - HTTP error -> error sending request")
    assert store_failure(DeltaError("Failed to parse parquet: External: Generic S3 error: "
                                    "Error performing PUT x - HTTP error: error sending "
                                    "request")) is not None
    assert store_failure(OSError("Generic S3 error -> Error performing GET http://h/b/t/"
                                 "_delta_log/_last_checkpoint - Server returned non-2xx status "
                                 "code -> 503 Service Unavailable: SlowDown")) is not None
    # the table's or the store's answers: a configuration matter, never retried
    refusals = (OSError("Generic S3 error -> Error performing PUT http://h/b/t/x - Server "
                           "returned non-2xx status code -> 403 Forbidden: AccessDenied"),
                   OSError("Generic S3 error -> Error performing GET http://h/nope - Server "
                           "returned non-2xx status code -> 404 Not Found: NoSuchBucket"),
                   OSError("Generic Config error -> failed to parse \"5 parsecs\" as "
                           "Duration (timeout)"),
                   DeltaError("Generic DeltaTable error: Failed to parse config: "
                              "[(\"max_retries\", \"failed to parse \\\"abc\\\" as usize\")]"))
    for answer in (CommitFailedError("Transaction failed: version already exists"),
                   TableNotFoundError("no log files"), FileNotFoundError("gone"),
                   DeltaError("Schema error: no field named x"), ValueError("bad"), *refusals):
        assert store_failure(answer) is None, answer
    assert all(store_refusal(answer) for answer in refusals)
    error = ObjectStoreError(table="s3://b/t", attempts=4, problem=store_failure(OSError(chain)))
    failure = query_failure(f"Traceback ...\n{type(error).__module__}.ObjectStoreError: {error}",
                            reached_before=True)
    assert failure.retryable and failure.error == "ObjectStoreError"


def test_a_missing_bucket_is_a_configuration_error_tried_once(
        moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """moto answers 404 NoSuchBucket: the job's check before it starts and a batch both end in
    ``TargetStoreRefusedError`` (the job ends with one line), not a retry or a traceback."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    sink = open_apply_sink("delta+s3://no-such-bucket-here/lake/t", key_columns=["id"])
    with pytest.raises(TargetStoreRefusedError, match="NoSuchBucket|404"):
        sink.check_target(None)
    page = source_batches(store_with_history(tmp_path / "store.db", changes=20), 20)[0]
    with caplog.at_level(logging.WARNING, "tablestore_cdc.lakehouse"), pytest.raises(
            TargetStoreRefusedError, match="NoSuchBucket|404"):
        sink.apply(page, "query-1", 0)
    assert "the object store failed a request" not in caplog.text  # not tried again
    failure = query_failure(f"{TargetStoreRefusedError.__module__}.TargetStoreRefusedError: "
                            "target s3://no-such-bucket-here/lake/t: the object store refused",
                            reached_before=True)
    assert not failure.retryable and failure.error == "TargetStoreRefusedError"


def test_the_retry_options_are_checked_before_anything_starts() -> None:
    given = {"max_retries": "20", "retry_timeout": "5min", "timeout": "1m 30s",
             "connect_timeout": "500ms", "backoff_config.base": "1.5",
             "Backoff_Config.Max_Backoff": "30 s"}
    assert storage_options("delta+s3://b/t", "s3", given, environ={}) == given
    for key, value in (("max_retries", "abc"), ("max_retries", "-1"), ("retry_timeout", "30"),
                       ("timeout", "soon"), ("backoff_config.base", "x"),
                       ("backoff_config.base", "0")):
        with pytest.raises(TargetUriError, match=f"target option {key}={value!r} is not"):
            storage_options("delta+s3://b/t", "s3", {key: value}, environ={})
