"""How the whole suite (``tests/`` and ``integration/``) is shared out between pytest workers.

``make test`` runs pytest on two pytest-xdist workers (``-n 2 --dist loadgroup``): most of the
suite's time is spent waiting on Spark JVMs that start, run a few batches and are killed, not
using both cores. The tests under ``integration/`` each start whole process trees (Spark drivers
killed and restarted, a moto server, network namespaces, a local cluster) and wait on them with
deadlines, so they stay in one group, run one after another on one worker, while the other
worker runs ``tests/``. The tests that share the session's demo run (``demo_run``) are a group
of their own, so the demo runs once. A plain ``pytest`` (no ``-n``) runs everything in one
process as before.

The fixtures both folders share (``spark``, ``store``, ``aws_env``, ``moto_endpoint``,
``demo_run``, ...) are defined once, in ``testkit/fixtures.py``, and registered here for the
whole suite. Tests that use Spark are marked ``slow``; ``pytest -m "not slow"`` runs the rest in
seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["testkit.fixtures"]

#: every test under this directory runs on the same worker, one at a time
SERIAL_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # the group marker is xdist's: unknown (and refused) without it
    for item in items:
        if item.path.is_relative_to(SERIAL_DIR):
            item.add_marker(pytest.mark.xdist_group("integration"))
        elif "demo_run" in getattr(item, "fixturenames", ()):
            # the tests sharing one demo run (testkit.fixtures.demo_run) share a worker
            item.add_marker(pytest.mark.xdist_group("demo"))
