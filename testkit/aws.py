"""Fake AWS for tests: credentials, and moto servers (on 127.0.0.1 unless told) in two shapes.

- ``start_moto_server()``: a moto server in a child process that handles one request at a
  time. Used for the meta-store tests (through the ``moto_endpoint`` fixture of
  ``testkit.fixtures``) and by the fault harness. It runs outside the pytest process because an
  in-process ``mock_aws`` resets moto's backends, which would wipe a server living in the same
  process. Serialized because DynamoDB makes every conditional write atomic while moto checks
  the condition and writes the item without a lock: two concurrent writers could both "win" on
  a threaded moto. Serializing requests gives moto DynamoDB's atomicity, which the
  multi-process race tests rely on.
- ``threaded_moto_server()``: moto's ``ThreadedMotoServer`` in this process, the shape the
  DynamoDB Streams tests need: ``testkit.dynamodb_streams_fake`` patches moto in-process, and
  the patch holds for a server in the same process only.

``new_s3_bucket(endpoint, monkeypatch)``: a bucket of its own on a moto server, whose endpoint
the environment names (the object-store target tests).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import requests

#: Environment for boto3 in the tests and their child processes: fake keys, no real config.
AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-never-shown",
    "AWS_SESSION_TOKEN": "testing-session-token",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}

_SERVER_SCRIPT = r"""
import logging, sys, threading
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app)

logging.getLogger("werkzeug").setLevel(logging.ERROR)
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()

def serialized(environ, start_response):
    with lock:  # one request at a time: conditional writes become atomic, as in DynamoDB
        return list(app(environ, start_response))

server = make_server(sys.argv[1], 0, serialized, threaded=True,
                     request_handler=MotoRequestHandler)
print(server.port, flush=True)
server.serve_forever()
"""


def start_moto_server(host: str = "127.0.0.1", popen: Callable[..., Any] = subprocess.Popen
                      ) -> tuple[subprocess.Popen[str], str]:
    """Start a serialized moto server on ``host`` (an address of this machine, 127.0.0.1 by
    default) on a free port; return it and its URL. It listens as soon as its port is printed.
    ``popen``: what starts it (``subprocess.Popen``, or a network namespace's host's, as
    ``integration.netfaults.cluster.Cluster`` starts it on its service host)."""
    proc = popen(
        [sys.executable, "-c", _SERVER_SCRIPT, host], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"moto server did not start (printed {line!r})")
    return proc, f"http://{host}:{line}"


def stop_moto_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def threaded_moto_server() -> Iterator[str]:
    """moto's threaded server in this process on 127.0.0.1, its state reset; yields its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        requests.post(f"{url}/moto-api/reset", timeout=10)
        yield url
    finally:
        server.stop()


def new_s3_bucket(endpoint: str, monkeypatch: Any = None) -> str:
    """A new bucket (a name of its own) on the moto server at ``endpoint``, and, given
    ``monkeypatch`` (pytest's, undone after the test), the test's environment naming that
    endpoint and region, as a user's ``AWS_ENDPOINT_URL`` would; the fake credentials are
    ``aws_env``'s."""
    import boto3

    name = f"lake-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    if monkeypatch is None:
        return name
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return name
