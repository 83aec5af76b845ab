"""Installs the fault harness's crash-point hook at the start of every Python process whose
environment the harness made (``testkit.crash_points.environment``: this directory first on
``PYTHONPATH``, ``TABLESTORE_CDC_FAULT_DIR`` set).

Python's ``site`` imports the first ``sitecustomize`` on the path: this one in a process the
harness started (a query's driver, the ``replicate`` command), and in the Python processes
Spark starts for it -- which inherit the environment -- either this one or the product's
``connector/worker_site/sitecustomize.py``, which runs the one it shadows: this one. Without the
fault directory it installs nothing. A ``sitecustomize`` this one shadows still runs.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_shadowed() -> None:
    """Run the next ``sitecustomize`` on the path, when Python imported this one itself (run by
    another's chain, this one leaves the chaining to it: no loop)."""
    first = sys.modules.get("sitecustomize")
    if first is None or os.path.abspath(getattr(first, "__file__", "") or "") != \
            os.path.abspath(__file__):
        return
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(module_from_spec(spec))


if os.environ.get("TABLESTORE_CDC_FAULT_DIR"):
    from testkit.crash_points import install_from_environment

    install_from_environment()
_run_shadowed()
