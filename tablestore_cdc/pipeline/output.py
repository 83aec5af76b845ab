"""Where a replication job keeps its own state (driver): ``replicate --output``, a local (or
mounted) directory or a prefix in S3 or an S3-compatible store (``s3://BUCKET/PREFIX``).

The state is the change log and Spark's two checkpoints (written by Spark, through its Hadoop
file systems: a local path, or ``s3a://`` with the hadoop-aws jars matching the running
PySpark's Hadoop, fetched from Maven Central by ``spark.jars.packages``), and the failed
tables' reasons and held batches (``_tables``, ``_held``: written by this process through
pyarrow's file systems). A job whose output is in object storage can be stopped on one machine
and started on another, or run on a cluster, and find where it was.

Both sides take the AWS SDKs' own settings, never a secret in Spark's configuration:
credentials from the environment, a profile (``AWS_PROFILE``) or the instance's role (Hadoop's
S3A is given the SDK's ``DefaultCredentialsProvider``, after keys in Hadoop's own settings);
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for another store (MinIO, Alibaba Cloud
OSS's S3 endpoint), path-style unless ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`` (OSS needs
virtual-hosted addressing);
``AWS_REGION`` (or ``AWS_DEFAULT_REGION``). A setting the user's ``spark-defaults.conf`` gives
is kept (``connector.spark.spark_defaults``).

What stays on the local machine for a remote output: Spark's log (``logs_dir``, under the
system's temporary directory, its path said at the start). The output lock (``job_lock``) is a
local ``flock``; on object storage a second job on the same source is refused by the source's
lease instead (``connector.planning.lease``). Relocation and the single-table upgrade concern
local outputs only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_common.errors import CdcError
from cdc_common.uris import redact_uri

#: the schemes ``--output`` takes for S3 (Spark is given ``s3a://``, its Hadoop file system)
S3_SCHEMES = ("s3", "s3a")
#: S3A's credentials: keys in Hadoop's own settings (``fs.s3a.access.key``... in a user's
#: ``spark-defaults.conf``) first, then the AWS SDK's chain: environment, profiles, web
#: identity, container, instance (a provider without credentials is passed over)
CREDENTIALS_PROVIDER = ",".join([
    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"])


class OutputStoreError(CdcError):
    """The object store holding the job's output failed a write after ``WRITE_ATTEMPTS``
    tries (throttled, a reset, a timeout): retryable. The job restarts the query; the
    replayed batch writes the same file again."""

    retryable = True
    template = ("the job's output {output}: writing {path} failed after {attempts} "
                "attempt(s), each retried by the S3 client: {problem}")


#: tries of one write into an object store before ``OutputStoreError``, and the first pause
WRITE_ATTEMPTS, WRITE_PAUSE_S = 3, 0.5


class OutputUriError(CdcError):
    """``--output`` names no place the job can keep its state (the URI as shown has no
    user-info: a key written into it is not repeated)."""

    exit_code = 2
    template = ("option '--output': got {output!r}: {problem}; give a local directory or "
                "s3://BUCKET/PREFIX (docs/lakehouse.md, \"The job's state in object storage\")")


@dataclass(frozen=True)
class JobOutput:
    """A job's output: ``local`` (an absolute path) or ``bucket`` and ``prefix`` in S3."""

    local: Path | None = None
    bucket: str = ""
    prefix: str = ""
    _fs: list[Any] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> JobOutput:
        """``--output`` as given: a path (made absolute) or ``s3://BUCKET[/PREFIX]``;
        ``OutputUriError`` for another scheme or a malformed URI (rather than a directory
        named ``s3:``)."""
        scheme, sep, rest = text.partition("://")
        if not sep:
            return cls(local=Path(text).resolve())
        shown = redact_uri(text)
        if scheme.lower() not in S3_SCHEMES:
            raise OutputUriError(output=shown, problem=f"the scheme {scheme!r} is not one the "
                                 "job keeps its state in (S3-compatible stores, Alibaba Cloud "
                                 "OSS and MinIO included, are reached by s3://)")
        bucket, _, prefix = rest.partition("/")
        if "@" in bucket:
            raise OutputUriError(output=shown, problem="credentials go in the environment or "
                                 "a profile, not in the URI")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
            raise OutputUriError(output=shown, problem=f"{bucket!r} is not a bucket's name")
        prefix = prefix.strip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise OutputUriError(output=shown, problem="its prefix has an empty, '.' or '..' "
                                 "part")
        return cls(bucket=bucket, prefix=prefix)

    @classmethod
    def of(cls, output: JobOutput | Path | str) -> JobOutput:
        return output if isinstance(output, JobOutput) else cls.parse(str(output))

    @property
    def remote(self) -> bool:
        return self.local is None

    def __str__(self) -> str:
        """As the job shows and records it (status records, the dashboard)."""
        if self.local is not None:
            return str(self.local)
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def spark_path(self, *parts: str) -> str:
        """``parts`` under the output, as Spark is given it (a path, or ``s3a://``)."""
        if self.local is not None:
            return str(self.local.joinpath(*parts))
        return "/".join(["s3a:/", self.bucket, *filter(None, [self.prefix]), *parts])

    def default_target(self, one_table: bool) -> str:
        """``replicate``'s target when ``--target`` is not given: Delta tables beside the
        state (``OUTPUT/{table}`` for ``--table``, ``OUTPUT/lake/{table}`` for a
        selection)."""
        where = "{table}" if one_table else "lake/{table}"
        if self.local is not None:
            return f"delta://{self.local}/{where}"
        return f"delta+{self}/{where}"

    def logs_dir(self) -> Path:
        """Where Spark's log goes: ``OUTPUT/logs``, or for a remote output a directory of
        this machine named after it."""
        if self.local is not None:
            return self.local / "logs"
        digest = hashlib.sha256(str(self).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / "tablestore-cdc" / f"{self.bucket}-{digest}" / "logs"

    # -- the files this process reads and writes (the failed tables, the held batches,
    # -- Spark's checkpoint metadata)

    def _filesystem(self) -> tuple[Any, str]:
        """pyarrow's file system and the output's path in it (made once per output)."""
        if self.local is not None:
            from pyarrow.fs import LocalFileSystem

            return LocalFileSystem(), str(self.local)
        if not self._fs:
            from tablestore_cdc.lakehouse.object_store import s3_filesystem, s3_setting

            region = s3_setting("region")
            if region is None and s3_setting("endpoint_override") is None:  # AWS itself: the
                # bucket's own region
                from pyarrow.fs import resolve_s3_region

                with contextlib.suppress(OSError):
                    region = resolve_s3_region(self.bucket)
            self._fs.append(s3_filesystem({"aws_region": region} if region else {}))
        return self._fs[0], "/".join(filter(None, [self.bucket, self.prefix]))

    def read_bytes(self, *parts: str) -> bytes | None:
        """The file at ``parts``, or None if there is none."""
        fs, base = self._filesystem()
        try:
            with fs.open_input_stream("/".join([base, *parts])) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write the file at ``parts`` whole or not at all: a local file through a temporary
        name and a rename, an object by one PUT."""
        if self.local is not None:
            target = self.local.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            # a leading dot: a reader of the folder (pyarrow, Spark) never takes a leftover
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
        fs, base = self._filesystem()
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                with fs.open_output_stream("/".join([base, *parts])) as stream:
                    stream.write(data)
                return
            except OSError as exc:  # pyarrow's S3 errors (its own retries gave up)
                if attempt == WRITE_ATTEMPTS:
                    raise OutputStoreError(output=str(self), path="/".join(parts),
                                           attempts=attempt,
                                           problem=" ".join(str(exc).split())[:300]) from exc
                time.sleep(WRITE_PAUSE_S * 2 ** (attempt - 1))

    def write_parquet(self, table: Any, *parts: str) -> None:
        """``table`` (Arrow) as one Parquet file at ``parts``, whole or not at all
        (``write_bytes``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = pa.BufferOutputStream()
        pq.write_table(table, data)
        self.write_bytes(data.getvalue().to_pybytes(), *parts)

    def names(self, *parts: str, suffix: str) -> list[str]:
        """The names ending in ``suffix`` in the folder at ``parts``, sorted (none if it does
        not exist)."""
        from pyarrow.fs import FileSelector, FileType

        fs, base = self._filesystem()
        infos = fs.get_file_info(FileSelector("/".join([base, *parts]), allow_not_found=True))
        return sorted(info.base_name for info in infos
                      if info.type == FileType.File and info.base_name.endswith(suffix))

    def delete(self, *parts: str) -> None:
        """Delete the file at ``parts`` if it is there."""
        fs, base = self._filesystem()
        try:
            fs.delete_file("/".join([base, *parts]))
        except FileNotFoundError:
            pass

    def spark_conf(self) -> dict[str, str]:
        """The session settings Spark needs to keep its state here: none for a local output;
        for S3, the hadoop-aws jars matching the running PySpark's Hadoop and S3A's endpoint,
        addressing, region and credentials provider (module docstring), each unless
        ``spark-defaults.conf`` gives it."""
        if self.local is not None:
            return {}
        from connector.spark import spark_defaults
        from tablestore_cdc.lakehouse.object_store import s3_setting, virtual_hosted

        conf = {"spark.jars.packages": f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
                "spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDER,
                "spark.hadoop.fs.s3a.path.style.access": str(not virtual_hosted()).lower()}
        endpoint = s3_setting("endpoint_override")
        if endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        region = s3_setting("region")
        if region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = region
        users = spark_defaults()
        return {key: value for key, value in conf.items()
                if key == "spark.jars.packages" or key not in users}


def hadoop_version() -> str:
    """The Hadoop version of the running PySpark's own jars (``hadoop-client-api-X.jar``), which
    hadoop-aws must match."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise OutputUriError(output="s3://", problem=f"no Hadoop client jar in {jars}: the "
                         "hadoop-aws version to fetch is unknown")


def merge_packages(*confs: dict[str, str]) -> dict[str, str]:
    """``confs`` merged left to right, their ``spark.jars.packages`` lists joined
    (``connector.spark.join_packages``)."""
    from connector.spark import join_packages

    merged: dict[str, str] = {}
    for conf in confs:
        merged.update(conf)
    packages = join_packages(*(conf.get("spark.jars.packages") for conf in confs))
    if packages:
        merged["spark.jars.packages"] = packages
    return merged



def fetch() -> None:
    """Resolve the hadoop-aws jars of the installed PySpark into Spark's Ivy cache (a local
    session started and stopped: downloaded from Maven Central on the first run only) and
    check S3A loads: ``make test``'s install step, and a user's before a first job without
    network."""
    from py4j.java_gateway import JavaClass
    from pyspark.sql import SparkSession

    package = f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"
    spark = (SparkSession.builder.master("local[1]")
             .config(map={"spark.ui.enabled": "false", "spark.jars.packages": package})
             .getOrCreate())
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None  # a classic session's
        s3a = jvm.org.apache.hadoop.fs.s3a.S3AFileSystem
        if not isinstance(s3a, JavaClass):  # py4j's answer for a class it cannot load
            raise SystemExit(f"error: {package} was resolved but S3A does not load")
        print(f"s3a: {package} on Spark {spark.version}")
    finally:
        spark.stop()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m tablestore_cdc.pipeline.output fetch")
    fetch()
