"""How the whole suite (``tests/`` and ``integration/``) is shared out between pytest workers.

``make test`` runs pytest on two pytest-xdist workers (``-n 2 --dist loadgroup``): most of the
suite's time is spent waiting on Spark JVMs that start, run a few batches and are killed, not
using both cores. Each test goes to whichever worker is free, so the two stay busy to the end;
the tests that share one expensive fixture go to one worker as a group (``xdist_group``), so it
is built once: the session's demo run (``demo_run``, grouped here) and a module's own fixture
(marked in its module). The tests under ``integration/`` once ran one after another on one
worker; they now outweigh the rest of the suite, and that worker became the run's length. A
plain ``pytest`` (no ``-n``) runs everything in one process.

The fixtures both folders share (``spark``, ``store``, ``aws_env``, ``moto_endpoint``,
``demo_run``, ...) are defined once, in ``testkit/fixtures.py``, and registered here for the
whole suite. Tests that use Spark are marked ``slow``; ``pytest -m "not slow"`` runs the rest in
seconds.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["testkit.fixtures"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # the group marker is xdist's: unknown (and refused) without it
    for item in items:
        if "demo_run" in getattr(item, "fixturenames", ()):
            # the tests sharing one demo run (testkit.fixtures.demo_run) share a worker
            item.add_marker(pytest.mark.xdist_group("demo"))
