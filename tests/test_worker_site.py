"""PySpark's Python workers import the installed PySpark's bytecode, not Spark's ``pyspark.zip``
(``connector/worker_site/sitecustomize.py``, put on the workers' path by ``local_session``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from connector.spark import WORKER_SITE

LIB = Path(pyspark.__file__).parent / "python" / "lib"


def _worker_like(path: list[str], code: str) -> str:
    """Run ``code`` in a Python started as Spark starts a worker: ``path`` as its PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _zips() -> list[str]:
    return [str(LIB / "pyspark.zip"), *map(str, LIB.glob("py4j-*-src.zip"))]


def test_a_worker_imports_the_installed_package_instead_of_its_zip() -> None:
    where = _worker_like([*_zips(), WORKER_SITE],
                         "import sys, pyspark, py4j; print(pyspark.__file__, py4j.__file__, "
                         "any(p.endswith('.zip') and 'pyspark' in p for p in sys.path))")
    pyspark_file, py4j_file, zip_left = where.split()
    assert pyspark_file == pyspark.__file__
    assert ".zip" not in py4j_file
    assert zip_left == "False"


def test_without_the_worker_site_a_worker_compiles_pyspark_from_the_zip() -> None:
    where = _worker_like(_zips(), "import pyspark; print(pyspark.__file__)")
    assert ".zip" in where


def test_a_zip_of_another_spark_stays_first(tmp_path: Path) -> None:
    other = tmp_path / "spark" / "python" / "lib" / "pyspark.zip"
    other.parent.mkdir(parents=True)
    shutil.copy(LIB / "pyspark.zip", other)
    where = _worker_like([str(other), WORKER_SITE], "import pyspark; print(pyspark.__file__)")
    assert where.startswith(str(other))


def test_a_sitecustomize_further_on_the_path_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    ran = _worker_like([WORKER_SITE, str(tmp_path)],
                       "import builtins; print(getattr(builtins, 'SHADOWED_RAN', False))")
    assert ran == "True"


@pytest.mark.slow
def test_the_workers_of_a_local_session_import_pyspark_from_its_package(spark) -> None:
    def where(_: object) -> list[str]:
        import pyspark as worker_pyspark

        return [worker_pyspark.__file__]

    files = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert files == [pyspark.__file__]
