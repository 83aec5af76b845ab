"""The fixtures these tests share, from ``testkit.fixtures`` (defined there once).

Tests that use Spark are marked ``slow``; ``pytest -m "not slow"`` runs the rest in seconds.
"""

from __future__ import annotations

from testkit.fixtures import aws_env, demo_run, moto_endpoint, spark, store

__all__ = ["aws_env", "demo_run", "moto_endpoint", "spark", "store"]
