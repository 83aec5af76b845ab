"""Shared fixtures: one local SparkSession per test session (it takes 5-11 s to start).

Tests that use Spark are marked ``slow``; ``pytest -m "not slow"`` runs the rest in seconds.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """A real local Spark (2 cores) with ``format("tablestore")`` registered."""
    from connector.spark import local_session

    session = local_session("tablestore-cdc-tests", master="local[2]")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()
