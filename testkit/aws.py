"""Fixtures for the meta-store tests: fake AWS credentials and a moto server on 127.0.0.1.

Import them into a test module (``from tests.meta_fixtures import aws_env, moto_endpoint``);
they are session-scoped, so one moto server serves the whole test session and is stopped at
its end.

The moto server runs in a child process (not in the pytest process: an in-process
``mock_aws`` resets moto's backends, which would wipe a server living in the same process) and
handles one request at a time. DynamoDB makes every conditional write atomic; moto checks the
condition and writes the item without a lock, so two concurrent writers could both "win" on a
threaded moto. Serializing requests gives moto DynamoDB's atomicity, which the multi-process
race tests rely on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

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

server = make_server("127.0.0.1", 0, serialized, threaded=True,
                     request_handler=MotoRequestHandler)
print(server.port, flush=True)
server.serve_forever()
"""


def start_moto_server() -> tuple[subprocess.Popen[str], str]:
    """Start a serialized moto server on 127.0.0.1 on a free port; return it and its URL.
    It listens as soon as its port is printed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"moto server did not start (printed {line!r})")
    return proc, f"http://127.0.0.1:{line}"


def stop_moto_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def aws_env() -> Iterator[dict[str, str]]:
    """Fake credentials and region for boto3 (inherited by spawned child processes); the
    user's real AWS config files are hidden."""
    with tempfile.TemporaryDirectory() as empty, pytest.MonkeyPatch.context() as mp:
        for key, value in AWS_TEST_ENV.items():
            mp.setenv(key, value)
        mp.setenv("AWS_CONFIG_FILE", os.path.join(empty, "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.path.join(empty, "credentials"))
        mp.delenv("AWS_PROFILE", raising=False)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
        yield dict(AWS_TEST_ENV)


@pytest.fixture(scope="session")
def moto_endpoint(aws_env: dict[str, str]) -> Iterator[str]:
    """URL of a moto server on 127.0.0.1 for the whole session."""
    proc, endpoint = start_moto_server()
    try:
        yield endpoint
    finally:
        stop_moto_server(proc)
