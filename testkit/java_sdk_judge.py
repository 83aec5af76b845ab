"""The official Tablestore Java SDK's tunnel client as an outside judge of the emulator:
``integration/java_sdk_judge`` (a Maven project, one main class ``judge.Judge``) built once and
run against an endpoint.

- ``fetch()``: the project built by Maven (``mvn -q -o package`` when its jars are in the local
  repository already, else ``mvn -q package`` from Maven Central) into a cache directory named by
  the hash of its pom and source (``~/.cache/tablestore-cdc/``): the judge's jar and its runtime
  classpath (``lib/``). ``python -m testkit.java_sdk_judge fetch`` is the Makefile's
  ``test-extended`` prerequisite. A failure raises ``JavaSdkJudgeUnavailable``.
- ``run_judge(build, endpoint, ...)``: the judge as a child process (``judge.Judge``: its JSON
  lines on stdout, the SDK's log on stderr).
- ``parse_lines(text)``: its stdout as dicts, a line that is not JSON a ``JudgeOutputError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from testkit.processes import REPO

PROJECT = REPO / "integration" / "java_sdk_judge"
POM = PROJECT / "pom.xml"
MAIN_CLASS = "judge.Judge"


class JavaSdkJudgeUnavailable(RuntimeError):
    """The judge could not be built (no Maven, the SDK not resolved, a compile error)."""


class JudgeOutputError(ValueError):
    """The judge printed a line that is not a JSON object."""


def _sources() -> list[Path]:
    return [POM, *sorted((PROJECT / "src").rglob("*.java"))]


def build_dir() -> Path:
    """Where ``fetch`` puts the build: one directory per version of the pom and the source."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.relative_to(PROJECT).as_posix().encode() + b"\0" + path.read_bytes())
    return cache / "tablestore-cdc" / f"java-sdk-judge-{digest.hexdigest()[:12]}"


def fetch() -> Path:
    """Build the judge with Maven unless a build of this source is cached; return its directory
    (``java-sdk-judge-1.jar`` and ``lib/``). Offline first (the jars already in the local
    repository), then online. Raises ``JavaSdkJudgeUnavailable`` naming what failed."""
    target = build_dir()
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JavaSdkJudgeUnavailable(
            "the Java SDK judge needs Maven (mvn) to resolve the Tablestore Java SDK from Maven "
            "Central: install it (apt-get install -y maven)")
    # one partial build per process: pytest workers that fetch at once do not share one
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    failures = []
    for offline in (["-o"], []):
        shutil.rmtree(partial, ignore_errors=True)
        result = subprocess.run(
            [mvn, "-q", "-B", *offline, "-f", str(POM), "package",
             f"-Djudge.buildDirectory={partial}"],
            capture_output=True, text=True, timeout=1200)
        if result.returncode == 0:
            break
        failures.append(f"mvn {' '.join(offline)} package (exit {result.returncode}):\n"
                        + (result.stdout + result.stderr)[-3000:])
    else:
        raise JavaSdkJudgeUnavailable(f"mvn could not build {PROJECT}: " + "\n".join(failures))
    (partial / ".complete").touch()
    try:
        partial.rename(target)
    except OSError:  # another process's build got there first
        if not (target / ".complete").exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return target


def java() -> str | None:
    """The ``java`` to run the judge with (``JAVA_HOME``'s, else the one on PATH), or None."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


def judge_command(build: Path, endpoint: str, instance: str, key_id: str, secret: str,
                  table: str, *, tunnel: str = "java-judge", records: int = 1,
                  timeout_s: int = 120) -> list[str]:
    """The command line that runs the judge built in ``build``."""
    return [java() or "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-cp", f"{build / 'java-sdk-judge-1.jar'}{os.pathsep}{build / 'lib'}/*", MAIN_CLASS,
            "--endpoint", endpoint, "--instance", instance, "--key-id", key_id,
            "--key-secret", secret, "--table", table, "--tunnel", tunnel,
            "--records", str(records), "--timeout", str(timeout_s)]


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The judge's stdout as one dict per line."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise JudgeOutputError(f"line {number} is not JSON ({error}): {line[:200]!r}") from None
        if not isinstance(value, dict):
            raise JudgeOutputError(f"line {number} is not a JSON object: {line[:200]!r}")
        out.append(value)
    return out


def main(argv: list[str]) -> int:
    """``python -m testkit.java_sdk_judge fetch`` (the Makefile's stamp): build the judge."""
    if argv != ["fetch"]:
        print("usage: python -m testkit.java_sdk_judge fetch", file=sys.stderr)
        return 2
    try:
        print(f"Tablestore Java SDK judge: {fetch()}")
    except (JavaSdkJudgeUnavailable, subprocess.TimeoutExpired) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
