"""The driver JVM's class archive: a short run's start without reading Spark's classes out of
its jars again (docs/performance.md, "The JVM's classes from an archive, and generic rows a
column at a time"; docs/operations.md, "Run modes").

A Spark driver JVM loads some 15,000 classes from ~250 jars at its start: found by name in
the jars one after another, read, parsed and verified, most of a short run's JVM CPU. The JDK's
application class data sharing (AppCDS, JDK 13+) keeps them, parsed and verified, in an
archive file the next JVM maps instead. ``local_session(short_run=True)`` (``replicate
--once``) asks ``ClassArchive.for_run`` for one:

- when the archive for this Java, this Spark and this class path exists, the JVM maps it
  (``-XX:SharedArchiveFile``);
- when it does not, this run's JVM writes it as it exits (``-XX:ArchiveClassesAtExit``) to a
  file of its own; ``keep_at_exit`` makes the driver's Python, at its own exit, end the JVM
  (closing its stdin, as PySpark's gateway expects), wait for the file and rename it into
  place, so a half-written archive is never used and two first runs at once do not collide.

The archive is only ever a speed-up: a JVM that finds it unusable (another JDK build, a jar
changed) starts without it, as the JDK documents, and says nothing (``-Xlog:cds*=off``); a
directory that cannot be written means no archive. ``TABLESTORE_CDC_CLASS_ARCHIVE=off`` turns
it off; a path puts the archives there instead of ``$XDG_CACHE_HOME/tablestore-cdc/jvm``
(``~/.cache/...``). An archive is ~160 MB for PySpark 4's jars; writing a new one keeps the
``KEEP`` used last and removes the others, and any a killed run left half-written.

Runs on the driver, before its JVM starts (``for_run``) and at the driver's exit.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tablestore_cdc.spark")

ARCHIVE_ENV = "TABLESTORE_CDC_CLASS_ARCHIVE"
#: the JVM says nothing of the archive: one it cannot use is started without, silently
QUIET = "-Xlog:cds*=off"
#: how long the driver waits at its exit for its JVM to write a new archive
WRITE_WAIT_S = 120.0
#: a half-written archive this old is a killed run's (a live one writes within seconds)
STALE_PART_S = 3600.0
#: archives kept, the most recently used first (two Sparks or Javas in use take turns)
KEEP = 3
#: what, besides the Java runtime and PySpark's jars, decides the JVM's class path
_CLASS_PATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR",
                   "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH")


def archive_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the archives are kept; None when ``TABLESTORE_CDC_CLASS_ARCHIVE`` says ``off``."""
    given = environ.get(ARCHIVE_ENV, "").strip()
    if given.lower() in ("off", "false", "0", "no"):
        return None
    if given:
        return Path(given).expanduser()
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tablestore-cdc" / "jvm"


def archive_key(java: str, java_version: str, jars_dir: Path, settings: Mapping[str, str],
                environ: Mapping[str, str] = os.environ) -> str:
    """A name for the archive of this Java runtime, these jars (names, sizes and times) and
    what else goes on the class path: another of any of them is another archive."""
    digest = hashlib.sha256()
    for part in (os.path.realpath(java), java_version, str(jars_dir.resolve()),
                 settings.get("spark.driver.extraClassPath", ""),
                 *(f"{name}={environ.get(name, '')}" for name in _CLASS_PATH_ENV)):
        digest.update(part.encode("utf-8", "replace") + b"\0")
    try:
        for entry in sorted(os.scandir(jars_dir), key=lambda e: e.name):
            stat = entry.stat()
            digest.update(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    except OSError:
        pass
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class ClassArchive:
    """The archive one run uses (``path`` exists) or writes (to ``part``, then renamed)."""

    path: Path
    part: Path | None = None

    @classmethod
    def for_run(cls, java: str, java_version: str, jars: Path, settings: Mapping[str, str],
                environ: Mapping[str, str] = os.environ) -> ClassArchive | None:
        """The archive for a short run's JVM (``jars``: Spark's, ``connector.spark.spark_home``),
        or None: turned off, on Windows (PySpark's JVM is not ended by its stdin there), or no
        directory to keep it in."""
        directory = archive_dir(environ)
        if directory is None or sys.platform == "win32":
            return None
        key = archive_key(java, java_version, jars, settings, environ)
        path = directory / f"spark-{key}.jsa"
        if _is_archive(path):
            try:
                os.utime(path)  # used: the last to be removed (``_remove_others``)
            except OSError:
                pass
            return cls(path)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.debug("no class archive: cannot create %s: %s", directory, exc)
            return None
        if not os.access(directory, os.W_OK):
            return None
        return cls(path, directory / f"{path.name}.{os.getpid()}.part")

    def java_options(self) -> str:
        """The JVM options that map the archive, or write it at the JVM's exit."""
        if self.part is None:
            return f"-XX:SharedArchiveFile={self.path} {QUIET}"
        return f"-XX:ArchiveClassesAtExit={self.part} {QUIET}"

    def keep_at_exit(self, jvm: subprocess.Popen[bytes]) -> None:
        """When this run writes the archive: at the driver's exit, end ``jvm`` and keep what
        it wrote (``keep``). Nothing to do for an archive that is used."""
        if self.part is not None:
            atexit.register(self.keep, jvm)

    def keep(self, jvm: subprocess.Popen[bytes]) -> bool:
        """End ``jvm`` (its stdin closed: PySpark's gateway exits on EOF), wait for it to write
        the archive, rename the archive into place and remove the others; True when kept.
        Any failure leaves no archive: the next short run writes one again."""
        assert self.part is not None
        # said on stderr (no logging is set up at a command's exit): the wait is visible
        print(f"writing the JVM's class archive for the next runs' start, once (~15 s): "
              f"{self.path}", file=sys.stderr, flush=True)
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            jvm.wait(WRITE_WAIT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("class archive not kept: the JVM did not end: %s", exc)
            return False
        try:
            if not _is_archive(self.part):
                raise OSError("not an archive the JVM wrote")
            os.replace(self.part, self.path)
        except OSError as exc:
            log.debug("class archive not kept: %s: %s", self.part, exc)
            self.part.unlink(missing_ok=True)
            return False
        self._remove_others()
        return True

    def _remove_others(self) -> None:
        """Archives of other keys (another Spark or Java) but the ``KEEP`` used last, and
        parts no live run writes."""
        now = time.time()
        archives: list[tuple[float, Path]] = []
        parts: list[tuple[float, Path]] = []
        for other in self.path.parent.glob("spark-*.jsa*"):
            try:
                (parts if other.suffix == ".part" else archives).append(
                    (other.stat().st_mtime, other))
            except OSError:
                continue
        archives.sort(reverse=True)
        old = [p for _, p in archives[KEEP:] if p != self.path]
        old += [p for mtime, p in parts if now - mtime >= STALE_PART_S]
        for path in old:
            path.unlink(missing_ok=True)


def _is_archive(path: Path) -> bool:
    """``path`` starts as the JDK's archives do (magic ``0xf00baba?``, little-endian): an
    empty or foreign file at the archive's name is written again, not mapped."""
    try:
        with open(path, "rb") as file:
            return file.read(4)[1:] == b"\xab\x0b\xf0"
    except OSError:
        return False
