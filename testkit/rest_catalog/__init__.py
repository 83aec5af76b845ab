"""A real Iceberg REST catalog for tests: Apache Iceberg's own REST catalog test server
(``org.apache.iceberg.rest.RESTCatalogServer`` from ``iceberg-open-api``'s test-fixtures jar, the
server of the ``apache/iceberg-rest-fixture`` image: Jetty over a ``JdbcCatalog`` on SQLite), its
warehouse ``s3://`` on a moto server through Iceberg's ``S3FileIO``.

- ``fetch()``: the server's classpath (``pom.xml`` beside this module) resolved once by Maven from
  Maven Central into a cache directory named by the pom's hash (``~/.cache/tablestore-cdc/``);
  ``python -m testkit.rest_catalog fetch`` is the Makefile's ``test-extended`` prerequisite. A
  failure raises (a test that needs the server fails, never skips).
- ``start_rest_catalog(workdir, warehouse, s3_endpoint)``: the server in a child JVM on a port
  the system picks, its catalog database and log in ``workdir``; returns a ``RestCatalog``
  (its URL, the pyiceberg properties a user gives for it, ``stop()``). Started by the
  ``rest_catalog`` fixture of the tests that use it (one per pytest worker).

The server binds every interface (its ``Server(port)`` takes no host); the tests reach it on
127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit.aws import AWS_TEST_ENV

POM = Path(__file__).with_name("pom.xml")
#: the line Jetty logs once it listens: ``Started ServerConnector@...{0.0.0.0:PORT}``
_LISTENING = re.compile(r"Started ServerConnector@\S+\{HTTP/1\.1.*\}\{[^}]*:(\d+)\}")


class RestCatalogUnavailable(RuntimeError):
    """The server's classpath could not be resolved or the server did not start."""


def classpath_dir() -> Path:
    """Where ``fetch`` keeps the server's jars: one directory per version of ``pom.xml``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return cache / "tablestore-cdc" / f"iceberg-rest-{digest}"


def fetch() -> Path:
    """Resolve the server's jars with Maven (``mvn dependency:copy-dependencies``) unless they are
    already cached; return their directory. Raises ``RestCatalogUnavailable`` naming what failed."""
    target = classpath_dir()
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RestCatalogUnavailable(
            "the REST catalog tests need Maven (mvn) to resolve Apache Iceberg's REST catalog "
            "server from Maven Central: install it (apt-get install -y maven)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
         f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
        capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        raise RestCatalogUnavailable(
            f"mvn could not resolve {POM} (exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-4000:])
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return shutil.which("java") or "java"


@dataclass
class RestCatalog:
    """A running REST catalog server: its URL and the pyiceberg properties a user gives for it
    (``properties``; ``env(name)``: the same as ``PYICEBERG_CATALOG__<NAME>__*`` variables)."""

    proc: subprocess.Popen[bytes]
    url: str
    s3_endpoint: str
    log: Path
    properties: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.properties = {"type": "rest", "uri": self.url, "s3.endpoint": self.s3_endpoint,
                           "s3.region": "us-east-1"}

    def env(self, name: str) -> dict[str, str]:
        prefix = f"PYICEBERG_CATALOG__{name.upper()}__"
        return {prefix + key.replace(".", "__").upper(): value
                for key, value in self.properties.items()}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_rest_catalog(workdir: Path, warehouse: str, s3_endpoint: str,
                       timeout: float = 90.0) -> RestCatalog:
    """Start the REST catalog server (``fetch``'s classpath) in a child JVM: its catalog in
    SQLite under ``workdir``, its tables' files through ``S3FileIO`` at ``warehouse``
    (``s3://BUCKET/PREFIX``) on the S3 server ``s3_endpoint``, with the fake AWS credentials.
    Waits until Jetty logs its port; raises ``RestCatalogUnavailable`` with the log's tail if
    it exits or does not listen within ``timeout`` seconds."""
    jars = fetch()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "rest-catalog.log"
    # RCKUtils.environmentCatalogConfig: CATALOG_X__Y_Z is the catalog property x-y.z
    env = {**os.environ, **AWS_TEST_ENV, "AWS_REGION": "us-east-1",
           "CATALOG_URI": f"jdbc:sqlite:{workdir / 'rest-catalog.db'}",
           "CATALOG_WAREHOUSE": warehouse,
           "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
           "CATALOG_S3_ENDPOINT": s3_endpoint,
           "CATALOG_S3_PATH__STYLE__ACCESS": "true",
           "CATALOG_CLIENT_REGION": "us-east-1",
           "CATALOG_REST_PORT": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
             "-cp", f"{jars}/*", "org.apache.iceberg.rest.RESTCatalogServer"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=workdir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _LISTENING.search(log.read_text(errors="replace"))
        if found:
            return RestCatalog(proc, f"http://127.0.0.1:{found.group(1)}", s3_endpoint, log)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    raise RestCatalogUnavailable(
        f"the REST catalog server did not start (exit {proc.returncode}); its log ends:\n"
        + log.read_text(errors="replace")[-4000:])


def main(argv: list[str]) -> int:
    """``python -m testkit.rest_catalog fetch`` (the Makefile's stamp): resolve the classpath."""
    if argv != ["fetch"]:
        print("usage: python -m testkit.rest_catalog fetch", file=sys.stderr)
        return 2
    try:
        print(f"Iceberg REST catalog server: {fetch()}")
    except RestCatalogUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
