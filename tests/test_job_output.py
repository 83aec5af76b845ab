"""``replicate --output``: a local directory or ``s3://BUCKET/PREFIX`` (``tablestore_cdc.pipeline.
output.JobOutput``): what Spark is given, the settings S3A gets from the AWS environment (never a
secret), the files this process keeps there (on moto's S3 server), and the refusals of a URI it
does not take, in one line before anything starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline.output import (
    CREDENTIALS_PROVIDER,
    JobOutput,
    OutputUriError,
    hadoop_version,
    merge_packages,
)

AWS_NAMES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
             "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "SPARK_CONF_DIR")


@pytest.fixture
def no_aws_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in AWS_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))  # no spark-defaults.conf
    return monkeypatch


def test_a_path_is_a_local_output_made_absolute(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    output = JobOutput.parse("state")
    assert output.local == tmp_path / "state" and not output.remote
    assert output.spark_path("_checkpoints", "apply") == str(tmp_path / "state" / "_checkpoints"
                                                             / "apply")
    assert output.default_target(one_table=False) == f"delta://{tmp_path}/state/lake/{{table}}"
    assert output.logs_dir() == tmp_path / "state" / "logs"
    assert output.spark_conf() == {}


@pytest.mark.parametrize(("given", "shown"), [
    ("s3://lake/cdc/state", "s3://lake/cdc/state"), ("s3a://lake/cdc/state/", "s3://lake/cdc/state"),
    ("s3://lake", "s3://lake"), ("S3://lake/x", "s3://lake/x")])
def test_an_s3_uri_is_given_to_spark_as_s3a(given: str, shown: str) -> None:
    output = JobOutput.parse(given)
    assert output.remote and str(output) == shown
    assert output.spark_path("changelog") == shown.replace("s3://", "s3a://") + "/changelog"
    assert output.default_target(one_table=True) == f"delta+{shown}/{{table}}"
    assert output.default_target(one_table=False) == f"delta+{shown}/lake/{{table}}"
    logs = output.logs_dir()  # Spark's log stays on this machine
    assert logs.is_absolute() and "s3:" not in str(logs) and logs.name == "logs"
    assert logs == JobOutput.parse(given).logs_dir()


@pytest.mark.parametrize(("given", "says"), [
    ("oss://bucket/state", "the scheme 'oss' is not one"),
    ("hdfs://nn/state", "the scheme 'hdfs' is not one"),
    ("s3://Bad_Bucket/state", "'Bad_Bucket' is not a bucket's name"),
    ("s3:///state", "'' is not a bucket's name"),
    ("s3://lake/a//b", "an empty, '.' or '..' part"),
    ("s3://lake/a/../b", "an empty, '.' or '..' part")])
def test_a_uri_it_does_not_take_is_refused_naming_it(given: str, says: str) -> None:
    with pytest.raises(OutputUriError) as raised:
        JobOutput.parse(given)
    assert says in str(raised.value) and repr(given) in str(raised.value)


@pytest.mark.parametrize("given", ["s3://AKIDEXAMPLE:wJalrXUtnFEMI@lake/state",
                                   "oss://AKIDEXAMPLE:wJalrXUtnFEMI@lake/state"])
def test_a_key_written_into_the_uri_is_refused_and_not_repeated(given: str) -> None:
    with pytest.raises(OutputUriError) as raised:
        JobOutput.parse(given)
    assert "wJalrXUtnFEMI" not in str(raised.value) and "AKIDEXAMPLE" not in str(raised.value)
    assert "/lake/state'" in str(raised.value)


def test_the_cli_refuses_it_in_one_line_before_anything_starts(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from connector.local import LocalTablestore

    store = LocalTablestore(tmp_path / "s.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    result = CliRunner().invoke(app, ["replicate", "--store", str(store.path), "--table", "t",
                                      "--output", "oss://bucket/state"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: option '--output': got 'oss://bucket/state'")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert sorted(tmp_path.iterdir()) == before  # no directory named oss:


def test_s3a_gets_the_endpoint_region_and_the_sdks_credential_chain_never_a_secret(
        no_aws_settings: pytest.MonkeyPatch) -> None:
    no_aws_settings.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    no_aws_settings.setenv("AWS_REGION", "eu-central-1")
    no_aws_settings.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    no_aws_settings.setenv("AWS_SECRET_ACCESS_KEY", "never-in-spark-conf")
    conf = JobOutput.parse("s3://lake/state").spark_conf()
    assert conf == {
        "spark.jars.packages": f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
        "spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDER,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-central-1"}
    assert not any(os.environ["AWS_SECRET_ACCESS_KEY"] in v or "AKIDEXAMPLE" in v
                   for v in conf.values())
    no_aws_settings.setenv("AWS_ENDPOINT_URL_S3", "https://oss-cn-hangzhou.aliyuncs.com")
    no_aws_settings.setenv("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true")  # OSS's addressing
    conf = JobOutput.parse("s3://lake/state").spark_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://oss-cn-hangzhou.aliyuncs.com"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_a_setting_of_the_users_spark_defaults_is_kept(no_aws_settings: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.hadoop.fs.s3a.aws.credentials.provider  org.example.Vault\n"
        "spark.hadoop.fs.s3a.endpoint=https://minio.internal:9000\n")
    no_aws_settings.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    conf = JobOutput.parse("s3://lake/state").spark_conf()
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in conf
    assert "spark.hadoop.fs.s3a.endpoint" not in conf  # the user's file says it
    assert conf["spark.jars.packages"].startswith("org.apache.hadoop:hadoop-aws:")


def test_hadoop_aws_matches_the_hadoop_of_the_installed_pyspark() -> None:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    assert (jars / f"hadoop-client-api-{hadoop_version()}.jar").exists()


def test_package_lists_are_joined_and_other_settings_taken_from_the_last() -> None:
    merged = merge_packages({"spark.jars.packages": "a:b:1", "x": "1"},
                            {"spark.jars.packages": "c:d:2,a:b:1", "x": "2"}, {})
    assert merged == {"spark.jars.packages": "a:b:1,c:d:2", "x": "2"}


def test_the_files_kept_in_s3_are_written_listed_read_and_deleted(
        moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from testkit.aws import new_s3_bucket

    bucket = new_s3_bucket(moto_endpoint, monkeypatch)
    output = JobOutput.parse(f"s3://{bucket}/deep/state")
    assert output.read_bytes("_tables", "a.failed") is None
    assert output.names("_tables", suffix=".failed") == []
    output.write_bytes(b"batch 3: refused", "_tables", "a.failed")
    output.write_bytes(b"x", "_tables", "b.failed")
    output.write_bytes(b"y", "_tables", "notes.txt")
    assert output.names("_tables", suffix=".failed") == ["a.failed", "b.failed"]
    assert output.read_bytes("_tables", "a.failed") == b"batch 3: refused"
    output.delete("_tables", "a.failed")
    output.delete("_tables", "a.failed")  # gone already: nothing to do
    assert output.names("_tables", suffix=".failed") == ["b.failed"]
    import boto3

    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]
            if not o["Key"].endswith("/")}  # pyarrow's markers of folders
    assert keys == {"deep/state/_tables/b.failed", "deep/state/_tables/notes.txt"}


@pytest.mark.slow
def test_a_package_ivy_cannot_resolve_is_one_typed_error_not_a_gateway_trace(
        tmp_path: Path) -> None:
    """A jar Spark must fetch (hadoop-aws for an S3 output, the Spark engine's) that Ivy cannot
    resolve ends the JVM before it starts: ``SparkStartError`` naming the package."""
    import subprocess
    import sys

    code = ("from connector.errors import SparkStartError\n"
            "from connector.spark import local_session\n"
            "try:\n"
            "    local_session('t', master='local[1]', conf={'spark.jars.packages': "
            "'org.apache.hadoop:hadoop-aws:0.0.1-none'})\n"
            "except SparkStartError as exc:\n"
            "    print('typed:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("typed: Spark did not start: its JVM exited while resolving "
                                  "org.apache.hadoop:hadoop-aws:0.0.1-none"), done.stdout
    assert "UNRESOLVED DEPENDENCIES" in done.stderr  # Ivy's own lines say which


@pytest.mark.slow  # pyarrow's own retries of each attempt: about 6 s
def test_a_write_the_object_store_keeps_failing_is_one_retryable_typed_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-cycle pipeline writes each batch's change log through this: an object store
    that does not answer (a closed loopback port here) ends in ``OutputStoreError``, which the
    job restarts the query on (``failures.query_failure``: retryable), never a raw OSError."""
    import socket

    from tablestore_cdc.pipeline import output as output_module
    from tablestore_cdc.pipeline.failures import FailureKind, query_failure
    from tablestore_cdc.pipeline.output import OutputStoreError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-shown-anywhere")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setattr(output_module, "WRITE_PAUSE_S", 0.0)
    output = JobOutput.parse("s3://lake/state")
    with pytest.raises(OutputStoreError) as failed:
        output.write_bytes(b"rows", "changelog", "batch-000000000007.parquet")
    message = str(failed.value)
    assert message.startswith("the job's output s3://lake/state: writing "
                              "changelog/batch-000000000007.parquet failed after 3 attempt(s)")
    assert "not-shown-anywhere" not in message
    failure = query_failure(f"Traceback ...\n{type(failed.value).__module__}."
                            f"OutputStoreError: {message}", reached_before=True)
    assert failure.kind is FailureKind.RETRYABLE, failure
