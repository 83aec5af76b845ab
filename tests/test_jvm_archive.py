"""The driver JVM's class archive (``connector.jvm_archive``): where it is kept, what decides
it, how a run writes it (a stand-in JVM process here; the real one in the slow test), and that
a real short run writes it, the next maps it, and one that cannot use it starts quietly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from connector.jvm_archive import (
    ARCHIVE_ENV,
    KEEP,
    STALE_PART_S,
    ClassArchive,
    archive_dir,
    archive_key,
)
from connector.spark import java_runtime, spark_home

ROOT = Path(__file__).resolve().parent.parent
MAGIC = b"\xa8\xab\x0b\xf0"  # a JDK dynamic archive's first bytes
JARS = ROOT / "tests" / "data"  # any folder stands for Spark's jars where the key is not looked at


def test_the_archives_live_in_the_users_cache_unless_the_setting_says_where_or_off() -> None:
    assert archive_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/tablestore-cdc/jvm")
    assert archive_dir({ARCHIVE_ENV: "/a", "XDG_CACHE_HOME": "/c"}) == Path("/a")
    for off in ("off", "OFF", "0", "false"):
        assert archive_dir({ARCHIVE_ENV: off}) is None
    assert archive_dir({"HOME": "/h"}).name == "jvm"


def test_another_java_jar_or_class_path_is_another_archive(tmp_path: Path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"x")
    java = sys.executable  # any existing file stands for the runtime

    def key(version: str = "17.0.1", extra: str = "", env: dict | None = None) -> str:
        return archive_key(java, version, jars, {"spark.driver.extraClassPath": extra},
                           env or {})

    first = key()
    assert key() == first
    assert key(version="17.0.2") != first
    assert key(extra="/opt/x.jar") != first
    assert key(env={"SPARK_CONF_DIR": "/etc/spark"}) != first
    (jars / "spark-core.jar").write_bytes(b"xy")  # a jar replaced
    assert key() != first


def test_a_run_writes_the_archive_when_there_is_none_and_maps_it_when_there_is(
        tmp_path: Path) -> None:
    env = {ARCHIVE_ENV: str(tmp_path / "jvm")}
    first = ClassArchive.for_run(sys.executable, "v", JARS, {}, env)
    assert first is not None and first.part is not None
    assert first.part.parent == first.path.parent and str(os.getpid()) in first.part.name
    assert "-XX:ArchiveClassesAtExit=" in first.java_options()
    first.path.write_bytes(b"junk")  # not the JDK's: written again, never mapped
    assert ClassArchive.for_run(sys.executable, "v", JARS, {}, env).part is not None
    first.path.write_bytes(MAGIC + b"rest")
    used = ClassArchive.for_run(sys.executable, "v", JARS, {}, env)
    assert used == ClassArchive(first.path)
    assert used.java_options() == f"-XX:SharedArchiveFile={first.path} -Xlog:cds*=off"
    assert ClassArchive.for_run(sys.executable, "v", JARS, {}, {ARCHIVE_ENV: "off"}) is None
    (tmp_path / "file").write_text("")
    assert ClassArchive.for_run(sys.executable, "v", JARS, {},
                                {ARCHIVE_ENV: str(tmp_path / "file" / "jvm")}) is None


def _stand_in_jvm(part: Path, content: bytes) -> subprocess.Popen[bytes]:
    """A process that, like PySpark's gateway JVM, runs until its stdin closes, then writes
    ``content`` where ``-XX:ArchiveClassesAtExit`` points."""
    code = ("import sys, pathlib; sys.stdin.buffer.read(); "
            f"pathlib.Path({str(part)!r}).write_bytes({content!r})")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def test_the_archive_is_renamed_into_place_once_written_and_old_ones_go(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "jvm"
    env = {ARCHIVE_ENV: str(directory)}
    directory.mkdir()
    old = []
    for i in range(KEEP + 1):  # other keys' archives, the oldest first
        path = directory / f"spark-other{i}.jsa"
        path.write_bytes(MAGIC)
        os.utime(path, (time.time() - 1000 + i, time.time() - 1000 + i))
        old.append(path)
    stale = directory / "spark-x.jsa.1.part"
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - STALE_PART_S - 1,) * 2)
    live = directory / "spark-y.jsa.2.part"  # another run writing now
    live.write_bytes(b"half")
    archive = ClassArchive.for_run(sys.executable, "v", JARS, {}, env)
    assert archive is not None and archive.part is not None
    assert archive.keep(_stand_in_jvm(archive.part, MAGIC + b"classes"))
    assert "writing the JVM's class archive" in capsys.readouterr().err
    assert archive.path.read_bytes() == MAGIC + b"classes" and not archive.part.exists()
    kept = sorted(p.name for p in directory.glob("*.jsa"))
    # this run's archive and the KEEP - 1 other ones used last
    assert kept == sorted([archive.path.name, *(p.name for p in old[-(KEEP - 1):])])
    assert not stale.exists() and live.exists()


def test_an_archive_the_jvm_did_not_write_whole_is_not_kept(tmp_path: Path) -> None:
    env = {ARCHIVE_ENV: str(tmp_path / "jvm")}
    archive = ClassArchive.for_run(sys.executable, "v", JARS, {}, env)
    assert archive is not None and archive.part is not None
    assert not archive.keep(_stand_in_jvm(archive.part, b""))
    assert not archive.path.exists() and not archive.part.exists()
    again = ClassArchive.for_run(sys.executable, "v", JARS, {}, env)
    assert again is not None and again.part is not None  # the next run: written again


SHORT_RUN = textwrap.dedent("""
    import os, sys
    from pyspark import SparkContext
    from connector.spark import local_session
    spark = local_session("archive-test", "local[1]", short_run=True)
    assert spark.range(5).count() == 5
    jvm = SparkContext._gateway.proc.pid
    maps = open(f"/proc/{jvm}/maps").read()
    print("MAPPED" if os.environ["ARCHIVE_NAME"] in maps else "NOT-MAPPED", flush=True)
    spark.stop()
""")


# three JVM starts and an archive written (45-65 s): in make test-extended. The default suite
# runs the stand-in tests above, and every replicate --once in it starts through the archive
# (the first writes it into the runner's cache, the later ones map it)
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(sys.platform != "linux", reason="reads the JVM's /proc/PID/maps")
def test_a_short_run_writes_the_archive_the_next_maps_and_a_mismatch_starts_quietly(
        tmp_path: Path) -> None:
    """Three real short runs (``local_session(short_run=True)``) in processes of their own:
    the first writes the archive at its exit, the second's JVM maps it, and a third whose
    class path differs (another ``SPARK_CONF_DIR``) given that archive under its own key
    starts without it and prints nothing of it."""
    directory = tmp_path / "jvm"
    env = {**os.environ, ARCHIVE_ENV: str(directory), "PYTHONPATH": str(ROOT),
           "ARCHIVE_NAME": "none.jsa"}

    def run(extra: dict[str, str] | None = None) -> str:
        done = subprocess.run([sys.executable, "-c", SHORT_RUN], env={**env, **(extra or {})},
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    first = run()
    archives = list(directory.glob("*.jsa"))
    assert "NOT-MAPPED" in first and len(archives) == 1
    assert not list(directory.glob("*.part"))
    assert archives[0].read_bytes()[:4] == MAGIC
    assert "MAPPED" in run({"ARCHIVE_NAME": archives[0].name}).split()

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    other_env = {**env, "SPARK_CONF_DIR": str(conf)}
    java, version = java_runtime()
    elsewhere = ClassArchive.for_run(java, version, spark_home(other_env) / "jars", {},
                                     other_env)
    assert elsewhere is not None and elsewhere.part is not None
    elsewhere.path.write_bytes(archives[0].read_bytes())  # a valid archive, another class path
    out = run({"SPARK_CONF_DIR": str(conf), "ARCHIVE_NAME": elsewhere.path.name})
    assert "NOT-MAPPED" in out
    assert "cds" not in out.lower() and "sharing" not in out.lower()
