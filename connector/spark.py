"""Spark environment helpers: Java check, Python worker interpreter, a local session that
never shows a secret.

PySpark needs a Java 17+ runtime and Python workers running *this* interpreter (with this
package importable). ``prepare_environment`` makes both true or fails with a clear message;
``local_session`` builds the local SparkSession used by the CLI jobs, tests and benchmarks.
Runs in the user's driver process, before a SparkContext exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_common.uris import SPARK_OPTIONS_REGEX, SPARK_SECRET_REGEX, SPARK_STRING_REGEX
from connector.errors import JavaMissingError, SparkStartError
from connector.jvm_archive import ClassArchive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17
LOG4J2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
#: the directory whose ``sitecustomize`` takes ``pyspark.zip`` off the Python workers' path
WORKER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")
#: the driver JVM's options for a short run (``short_run``): C1's quick code only, no C2
#: (whose compiles cost more CPU than they save in a run of a minute or two), the serial
#: collector (no GC threads for a 2-core box to share), class data sharing (the JDK's default,
#: said): docs/performance.md, "A start without avoidable warm-up"
SHORT_RUN_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"
#: Spark's redaction set by the one rule of secrets (``cdc_common.uris``): a source option, a
#: Spark property (a target's credentials given to Spark's engine among them) or a URL's user
#: info is never shown by the UI (its environment page, its SQL tab and REST API), the event
#: log or ``explain()``: docs/operations.md, "Secrets"
REDACTION = {
    "spark.redaction.regex": SPARK_SECRET_REGEX,
    "spark.sql.redaction.options.regex": SPARK_OPTIONS_REGEX,
    "spark.sql.redaction.string.regex": SPARK_STRING_REGEX,
}
JAVA_HINT = (
    "install a Java 17 (or newer) runtime, e.g. `apt-get install -y openjdk-17-jre-headless`, "
    "or set JAVA_HOME to one"
)


def java_major_version() -> int:
    """The major version of the Java runtime Spark would start. Raises ``JavaMissingError``."""
    return major_version(*java_runtime())


def java_runtime() -> tuple[str, str]:
    """The Java runtime Spark would start (``JAVA_HOME``'s, else the one on ``PATH``) and what
    its ``-version`` says. Raises ``JavaMissingError``."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(detail=f"no Java runtime found (PySpark needs one): {JAVA_HINT}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise JavaMissingError(detail=f"cannot run {java}: {exc}; {JAVA_HINT}") from exc
    return java, out.stderr + out.stdout


def major_version(java: str, version_text: str) -> int:
    """The major version in ``java -version``'s text. Raises ``JavaMissingError``."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if not match:
        raise JavaMissingError(detail=f"cannot read the version of {java}; {JAVA_HINT}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" -> 8


def prepare_environment() -> tuple[str, str]:
    """Check Java and point PySpark's Python workers at the running interpreter unless the user
    chose one (``PYSPARK_PYTHON``); returns the Java runtime (``java_runtime``)."""
    runtime = java_runtime()
    major = major_version(*runtime)
    if major < MIN_JAVA:
        raise JavaMissingError(detail=f"Java {major} found, PySpark 4 needs {MIN_JAVA}+: "
                               f"{JAVA_HINT}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # a local session talks to itself only: bind to loopback, not the host's public address
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return runtime


def local_session(app_name: str = "tablestore-cdc", master: str = "local[2]",
                  conf: dict[str, str] | None = None, *,
                  log_level: str = "ERROR", short_run: bool = False) -> SparkSession:
    """A local SparkSession with the tablestore source registered (driver). An unsupported
    PySpark is refused (``UnsupportedSparkError``) before a JVM is started for it.

    Python workers import PySpark's installed bytecode (``worker_site/sitecustomize.py`` put
    before any ``spark.executorEnv.PYTHONPATH`` given). ``short_run`` (``replicate --once``,
    tests, benchmarks' short processes): the driver JVM runs with ``SHORT_RUN_JVM_OPTIONS``
    added to its ``spark.driver.extraJavaOptions``; a long-running job keeps the JVM's
    defaults (C2 pays back its compiles over hours), and maps the class archive of its Java and
    Spark, or writes it at the driver's exit (``connector.jvm_archive``). Both only when this
    call starts the JVM.
    Spark's redaction (``REDACTION``) is always set: no secret shows in the UI, the event log or
    a plan; a redaction regex in ``conf`` is added to it."""
    java = prepare_environment()
    from pyspark.sql import SparkSession

    from connector.source import register

    settings = session_settings(app_name, master, conf, spark_defaults(), short_run=short_run)
    archive = ClassArchive.for_run(*java, spark_home() / "jars", settings) if short_run else None
    if archive is not None:
        settings["spark.driver.extraJavaOptions"] += f" {archive.java_options()}"
    try:
        jvm = _start_jvm_apart(settings)
        if jvm is not None and archive is not None:
            archive.keep_at_exit(jvm)
    except RuntimeError as exc:  # PySpark's JAVA_GATEWAY_EXITED: Ivy said why on stderr
        if "JAVA_GATEWAY_EXITED" not in str(exc) or not settings.get("spark.jars.packages"):
            raise
        raise SparkStartError(packages=settings["spark.jars.packages"]) from None
    spark = SparkSession.builder.config(map={**settings}).getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def session_settings(app_name: str, master: str, conf: dict[str, str] | None,
                     defaults: dict[str, str], *, short_run: bool = False) -> dict[str, str]:
    """The settings ``local_session`` starts Spark with (driver): ours, then ``conf``'s. The
    ones it extends rather than sets keep what the installation's ``spark-defaults.conf``
    (``defaults``) gives, since a setting given to the session builder replaces the file's
    value and a cluster's path or options in that file would otherwise be lost: the driver's
    Java options are ours, the file's, then ``conf``'s (a property given twice: the last
    wins); the workers' ``PYTHONPATH`` is ours, then ``conf``'s or else the file's; the
    file's ``spark.jars.packages`` come before those ``conf`` adds (hadoop-aws, the Spark
    engine's)."""
    java_options = f"-Dlog4j2.configurationFile=file:{LOG4J2}"
    settings: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stopTimeout": "30s",
        **(conf or {}),
    }
    # the caller's options last: a property set twice takes its last value (the job's own log
    # configuration, ``pipeline.job_log``), and the file's others are kept
    settings["spark.driver.extraJavaOptions"] = " ".join(filter(None, [
        java_options, defaults.get("spark.driver.extraJavaOptions"),
        (conf or {}).get("spark.driver.extraJavaOptions")]))
    for key, regex in REDACTION.items():  # a regex the caller gives widens ours, never narrows
        given = (conf or {}).get(key)
        settings[key] = f"{regex}|{given}" if given and given != regex else regex
    given_path = (settings.get("spark.executorEnv.PYTHONPATH")
                  or defaults.get("spark.executorEnv.PYTHONPATH"))
    settings["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(
        [WORKER_SITE, *([given_path] if given_path else [])])
    if defaults.get("spark.jars.packages") and (conf or {}).get("spark.jars.packages"):
        settings["spark.jars.packages"] = join_packages(defaults["spark.jars.packages"],
                                                        (conf or {})["spark.jars.packages"])
    if short_run:
        settings["spark.driver.extraJavaOptions"] = (
            f"{settings.get('spark.driver.extraJavaOptions', '')} {SHORT_RUN_JVM_OPTIONS}".strip())
    return settings


def join_packages(*lists: str | None) -> str:
    """Comma-separated ``spark.jars.packages`` lists joined in order, each package once."""
    return ",".join(dict.fromkeys(p for packages in lists if packages
                                  for p in packages.split(",") if p))


def spark_home(environ: Mapping[str, str] = os.environ) -> Path:
    """Spark's home as spark-submit takes it (driver): ``$SPARK_HOME``, else the installed
    PySpark's directory (its ``jars``, ``conf``)."""
    home = environ.get("SPARK_HOME")
    if not home:
        import pyspark

        home = os.path.dirname(os.path.abspath(pyspark.__file__))
    return Path(home)


def spark_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The installation's ``spark-defaults.conf`` (driver, before a session): in
    ``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else the installed PySpark's ``conf``; no
    file, no settings. Read as spark-submit reads it: a key, then white space, ``=`` or ``:``,
    then the value; lines starting with ``#`` or ``!`` are comments."""
    conf_dir = environ.get("SPARK_CONF_DIR") or str(spark_home(environ) / "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    settings = {}
    for line in lines:
        pair = re.match(r"\s*([^#!\s=:][^\s=:]*)\s*[\s=:]\s*(.*?)\s*$", line)
        if pair:
            settings[pair.group(1)] = pair.group(2)
    return settings


def _start_jvm_apart(settings: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start the driver's JVM in a session of its own (driver, before ``getOrCreate``), so a
    signal sent to the job's process group (``kill -TERM -PGID``, a terminal's Ctrl-C) reaches
    the Python driver only. The driver then stops its queries itself (Spark ends each planning
    process, which releases the query's lease) and stops Spark; a JVM that got SIGTERM too
    would run its shutdown hooks under the driver's feet. PySpark already keeps Ctrl-C from
    its JVM; the JVM still ends with the driver (it exits when its stdin, a pipe from the
    driver, closes). Nothing to do when a JVM runs already (a second session) or on Windows.
    Returns the JVM's process when this call started it."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or sys.platform == "win32":
        return None
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))  # spark-submit's
    gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
    SparkContext._ensure_initialized(gateway=gateway)
    return getattr(gateway, "proc", None)

