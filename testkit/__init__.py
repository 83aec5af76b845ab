"""Test support shared by ``tests/`` and ``integration/`` (and the benchmarks); not installed
with the product (pyproject's package list leaves it out), found through pytest's
``pythonpath = ["."]`` or by running from the repository root.

- ``waiting``: ``wait_until``, the one way to wait for a condition, with a deadline and a
  message naming what was awaited and the last value seen (standard library only).
- ``clock``: ``FakeClock``, for code that takes its clock and sleep as arguments.
- ``fixtures``: the pytest fixtures defined once (``spark``, ``store``, ``aws_env``,
  ``moto_endpoint``), which the root ``conftest.py`` registers for the whole suite.
- ``processes``: start a query in its own process (``runner``) and SIGKILL its whole tree.
- ``runner``: ``python -m testkit.runner``, one streaming query in its own process.
- ``aws``: fake AWS credentials and moto servers on 127.0.0.1.
- ``dynamodb_streams_fake``: the shard map moto's DynamoDB Streams lacks.
- ``fault_proxy``: ``FaultProxy``, an HTTP proxy for one hop (loopback only) that delays,
  resets, truncates, stalls, corrupts or answers 5xx by script (integration/netfaults/).

Imports go one way: ``testkit`` may import the product packages; ``tests/`` and
``integration/`` import ``testkit`` and never each other (tests/test_layering.py).
"""
