"""PySpark's Python workers import PySpark's compiled package, not ``pyspark.zip``.

Python runs this file at the start of every Python worker Spark starts for a session built by
``connector.spark.local_session`` (executor side: the daemon and its workers, the data source
and streaming source runners); ``local_session`` puts this directory on the workers'
``PYTHONPATH`` (``spark.executorEnv.PYTHONPATH``), and Python's ``site`` imports the first
``sitecustomize`` it finds on the path.

Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j source zip first on every
worker's path, also for a pip-installed PySpark, whose ``SPARK_HOME`` is the installed package.
Python keeps no bytecode for a zip import, so every worker compiled PySpark's modules again
(about a second of CPU each). The zip of a pip install is a copy of the package beside it;
this file takes it off ``sys.path`` so that ``import pyspark`` finds the package and its
``__pycache__``. A zip that is not the installed package's own (a Spark distribution's
``SPARK_HOME``, another version) stays where Spark put it; so does the py4j zip unless the
installed py4j is of the same version. A ``sitecustomize`` this one shadows still runs.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

HERE = os.path.dirname(os.path.abspath(__file__))


def _installed_dir(name: str, path: list[str]) -> str | None:
    """The directory of the package ``name`` found on ``path`` (no zip), or None."""
    spec = PathFinder.find_spec(name, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def _py4j_version(package_dir: str) -> str | None:
    try:
        with open(os.path.join(package_dir, "version.py"), encoding="utf-8") as source:
            text = source.read()
    except OSError:
        return None
    return text.split("=", 1)[1].strip().strip("'\"") if "=" in text else None


def redundant_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips of a package installed on the rest of it."""
    plain = [p for p in path if not p.endswith(".zip")]
    pyspark_dir = _installed_dir("pyspark", plain)
    py4j_dir = _installed_dir("py4j", plain)
    found = []
    for entry in path:
        name = os.path.basename(entry)
        if name == "pyspark.zip" and pyspark_dir is not None and os.path.abspath(entry) == \
                os.path.join(pyspark_dir, "python", "lib", "pyspark.zip"):
            found.append(entry)
        elif (name.startswith("py4j-") and name.endswith("-src.zip") and py4j_dir is not None
              and name[len("py4j-"):-len("-src.zip")] == _py4j_version(py4j_dir)):
            found.append(entry)
    return found


def _run_shadowed() -> None:
    """Run the ``sitecustomize`` this one hides, if the path has another."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        spec.loader.exec_module(module_from_spec(spec))


for _entry in redundant_zips(sys.path):
    sys.path.remove(_entry)
_run_shadowed()
