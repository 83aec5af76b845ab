"""The client path never imports a backend SDK (docs/connect.md).

A Spark Connect client needs protobuf >= 6 while the ``tablestore`` SDK pins protobuf < 6, so a
thin client's environment cannot hold the SDK. Everything a client does with this package —
import ``connector``, reach ``register`` and ``TablestoreDataSource``, pickle the source class as
``spark.dataSource.register`` does over Connect, record progress with ``ProgressListener`` into
a SQLite meta store — must therefore work without importing ``tablestore``, ``boto3``,
``botocore`` or ``google.protobuf``. Backends import their SDK only when their endpoint scheme
is used (on the server). Checked in a fresh interpreter, as imports are process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SDK_MODULES = ("tablestore", "boto3", "botocore", "google.protobuf")

CLIENT_PATH = textwrap.dedent("""
    import json, pickle, sys

    import connector
    from connector import TablestoreDataSource, register  # the package's lazy attributes
    from tablestore_cdc.listener import ProgressListener
    from connector.source import is_connect_session
    from pyspark.serializers import CloudPickleSerializer

    # what spark.dataSource.register sends from a Connect client: the class, by reference
    blob = CloudPickleSerializer().dumps(TablestoreDataSource)
    assert pickle.loads(blob) is TablestoreDataSource and len(blob) < 200, len(blob)
    assert callable(register) and not is_connect_session(object())

    listener = ProgressListener(sys.argv[1])  # runs in the client over Connect
    recorded = listener.record(json.loads(sys.argv[2]))
    listener.close()

    prefixes = tuple(json.loads(sys.argv[3]))
    loaded = sorted(m for m in sys.modules if m in prefixes or m.startswith(
        tuple(p + "." for p in prefixes)))
    print(json.dumps({"recorded": recorded, "loaded": loaded}))
""")


def progress_report() -> dict:
    """A Spark progress report of one batch of the tablestore source (lastProgress shape)."""
    end = {"uuid": "b7d0c1f4-0000-4000-8000-000000000001", "source": "local:///s.db#t#q"}
    return {"id": "q-1", "runId": "r-1", "name": None, "batchId": 4,
            "timestamp": "2026-01-01T00:00:00.000Z", "numInputRows": 10,
            "durationMs": {"triggerExecution": 120},
            "sources": [{"description": "tablestore", "endOffset": json.dumps(end),
                         "numInputRows": 10, "inputRowsPerSecond": 5.0,
                         "processedRowsPerSecond": 80.0}]}


def test_client_path_imports_no_backend_sdk(tmp_path):
    meta = f"sqlite:///{tmp_path / 'client.meta.db'}"
    result = subprocess.run(
        [sys.executable, "-c", CLIENT_PATH, meta, json.dumps(progress_report()),
         json.dumps(SDK_MODULES)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["recorded"] == 1  # the listener really wrote to its meta store
    assert out["loaded"] == [], f"the client path imported {out['loaded']}"


def test_the_check_sees_an_sdk_import(tmp_path):
    """The probe is not blind: importing an SDK in the same script is reported."""
    probe = CLIENT_PATH.replace("import connector\n", "import connector\nimport boto3\n", 1)
    assert probe != CLIENT_PATH
    result = subprocess.run(
        [sys.executable, "-c", probe, f"sqlite:///{tmp_path / 'm.db'}",
         json.dumps(progress_report()), json.dumps(SDK_MODULES)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])["loaded"]
    assert "boto3" in loaded and "botocore" in loaded

