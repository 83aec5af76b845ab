"""SIGTERM (how Spark stops a query's planning process) releases the query's lease at once, on
every meta-store backend, wherever the planning process is when the signal comes.

The planning process is ``testkit.planning_process`` (a stand-in holding a real lease in a real
meta store): a SQLite file, DynamoDB on a moto server, a Tablestore meta table over the
emulator. The end-to-end check with a real Spark query's ``stop()`` is in
``tests/test_source_lease_spark.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from meta_store import open_meta_store
from testkit.planning_process import IDENTITY
from testkit.processes import REPO
from testkit.tablestore_meta import ENV, table_uri

pytestmark = pytest.mark.slow  # starts processes (a planning process, a moto server, an emulator)


@pytest.fixture(params=["sqlite", "dynamodb", "tablestore"])
def meta_uri(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'meta.db'}"
    if request.param == "dynamodb":
        endpoint = request.getfixturevalue("moto_endpoint")
        return (f"dynamodb://cdc-lease-{uuid.uuid4().hex[:8]}?region=us-east-1"
                f"&endpoint_url={endpoint}&create_table=true")
    for key, value in ENV.items():  # inherited by the planning process
        monkeypatch.setenv(key, value)
    return table_uri(request.getfixturevalue("ots_emulator"), create_table="true")


@pytest.mark.parametrize("where", ["socket", "meta-call"])
def test_sigterm_releases_the_lease_at_once(meta_uri: str, where: str) -> None:
    process = subprocess.Popen([sys.executable, "-m", "testkit.planning_process", meta_uri,
                                where], cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.strip() == "ready", line + process.stdout.read()
        with open_meta_store(meta_uri) as meta:
            assert meta.get_lease(IDENTITY.namespace).live(time.time())
            time.sleep(0.5)  # let the main thread reach its wait
            sent = time.monotonic()
            os.kill(process.pid, signal.SIGTERM)
            output, _ = process.communicate(timeout=30)
            took = time.monotonic() - sent
            # ended as SIGTERM ends a process, within seconds, its lease gone (not expiring)
            assert process.returncode == 128 + signal.SIGTERM, output
            assert took < 5, f"{took:.1f} s"
            lease = meta.get_lease(IDENTITY.namespace)
            assert lease is None or not lease.live(time.time()), lease
    finally:
        process.kill()
