"""The pytest fixtures tests share, defined once.

The root ``conftest.py`` registers them for every test (``pytest_plugins``), under ``tests/`` and
``integration/`` alike. A test that needs another shape of the same thing asks for it (the
``store_table`` marker) rather than defining a fixture of the same name. With
``make test``'s two workers, session fixtures exist once per worker (two Spark sessions, two
moto servers).

- ``spark`` (session): one real local Spark (``local[2]``) with ``format("tablestore")``
  registered; it takes 5-11 s to start, so the whole session shares it. ``stop_queries``: a
  module's tests leave no query running into the next test, failed or not
  (``pytestmark = pytest.mark.usefixtures("stop_queries")``).
- ``store``: an embedded store with table ``t`` (key ``id`` INTEGER, attribute ``v`` INTEGER,
  2 channels); a module or a test that needs another table says so with the ``store_table``
  marker (``pytestmark = pytest.mark.store_table(channels=3, columns=[("name", "STRING")])``:
  ``local_store``'s arguments). ``local_store`` builds one outside a fixture, ``put_rows``
  and ``write_changes`` write to it and ``options_for`` gives the reader options of tunnel
  ``q`` on it.
- ``emulator``: the Tablestore emulator in this process serving ``store``, with
  ``testkit.emulator``'s instance and key pair; ``ots_emulator`` (module): one serving a store
  with no tables, for a module's tests (the Tablestore meta store's service, requests written
  byte by byte). Both skip the test when the ``tablestore`` SDK is not installed.
- ``wire_setup``: the wire end to end's scenario (``testkit.wire_e2e.wire_scenario``): the
  emulator as a child process over a store with table ``t``, the store, the SDK's client.
- ``target``: an apply sink's target table, once Delta and once Iceberg (``testkit.lakehouse``'s
  ``Delta`` and ``Iceberg`` in the test's temporary directory); under the ``reconcile_target``
  marker, ``testkit.reconcile``'s ``DeltaTarget`` and ``IcebergTarget`` (a copy the reconcile
  and resnapshot tests damage).
- ``aws_env`` (session): fake AWS credentials and region for boto3, inherited by child
  processes; the user's real AWS config files are hidden.
- ``moto_endpoint`` (session): the URL of a serialized moto server on 127.0.0.1
  (``testkit.aws.start_moto_server``), stopped at the end of the session.
- ``rest_catalog`` (session): Apache Iceberg's REST catalog test server in a child JVM, its
  warehouse in a bucket of ``moto_endpoint`` (``testkit.rest_catalog``; its jars resolved once
  by Maven: a failure fails the test, never skips it), stopped at the end of the session.
- ``demo_run`` (session): one ``tablestore-cdc demo`` (its own Spark driver, 800 changes with
  two splits and a merge), shared by the tests that check its verification line
  (tests/test_job.py) and run the query lines it prints (tests/test_doc_snippets.py); the root
  conftest.py keeps them on one worker, so it runs once.
- ``moto_url`` (module) and ``streams_fake`` (module): a moto server in this process (threaded),
  with the shard map moto's DynamoDB Streams lacks installed (``StreamsFake`` patches moto in
  this process, so its server must run here); ``aws_test_credentials``: fake AWS credentials in
  the environment for one test (``pytestmark = pytest.mark.usefixtures(...)`` for a module).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from connector.local import LocalTablestore
from connector.options import SourceOptions
from testkit.aws import AWS_TEST_ENV, start_moto_server, stop_moto_server, threaded_moto_server
from testkit.dynamodb_streams_fake import StreamsFake
from testkit.emulator import INSTANCE, KEY_ID, SECRET

if TYPE_CHECKING:
    from tablestore_emulator.server import EmulatorServer
    from testkit.lakehouse import Delta, Iceberg
    from testkit.reconcile import Target
    from testkit.rest_catalog import RestCatalog
    from testkit.wire_e2e import WireSetup

#: table ``t``'s key and attribute columns unless a test asks for others
PRIMARY_KEY = (("id", "INTEGER"),)
COLUMNS = (("v", "INTEGER"),)


def local_store(path: Path, channels: int = 2,
                columns: Sequence[tuple[str, str]] = COLUMNS,
                primary_key: Sequence[tuple[str, str]] = PRIMARY_KEY) -> LocalTablestore:
    """An embedded store at ``path`` with table ``t``: by default key ``id`` INTEGER, attribute
    ``v`` INTEGER, ``channels`` change channels."""
    store = LocalTablestore(path)
    store.create_table("t", primary_key=list(primary_key), columns=list(columns),
                       channels=channels)
    return store


def put_rows(store: LocalTablestore, ids: range | list[int], v: int = 0) -> None:
    """PUT rows ``ids`` of table ``t``, one transaction each; ``v`` is the id unless given."""
    for i in ids:
        store.put_row("t", {"id": i}, {"v": v or i})


def write_changes(store: LocalTablestore, n: int, *, start: int = 0, keys: int = 40) -> None:
    """``n`` deterministic changes to table ``t`` (columns ``name`` and ``qty``), numbered from
    ``start`` over ``keys`` keys: change ``i`` DELETEs when ``i % 7 == 3``, else UPDATEs ``qty``
    when ``i % 3 == 1``, else PUTs the row."""
    for i in range(start, start + n):
        key = {"id": i % keys}
        if i % 7 == 3:
            store.delete_row("t", key)
        elif i % 3 == 1:
            store.update_row("t", key, {"qty": i})
        else:
            store.put_row("t", key, {"name": f"n{i}", "qty": i})


def options_for(store: LocalTablestore, **extra: str) -> SourceOptions:
    """The validated reader options of table ``t`` through tunnel ``q`` on ``store``."""
    return SourceOptions.from_spark({
        "endpoint": f"local://{store.path}", "table.name": "t", "tunnel.name": "q", **extra,
    })


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A real local Spark (2 cores) with ``format("tablestore")`` registered."""
    from connector.spark import local_session

    session = local_session("tablestore-cdc-tests", master="local[2]")
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def stop_queries(spark: Any) -> Iterator[None]:
    """After the test, every streaming query still active on ``spark`` stopped: a failed test
    must not leave its query running into the next one."""
    yield
    for query in spark.streams.active:
        query.stop()


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalTablestore]:
    """``local_store`` in the test's temporary directory, closed after the test; the nearest
    ``store_table`` marker (the test's, its class's or its module's) gives its arguments."""
    marker = request.node.get_closest_marker("store_table")
    s = local_store(tmp_path / "store.db", **(marker.kwargs if marker else {}))
    yield s
    s.close()


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


@pytest.fixture(scope="session")
def rest_catalog(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[RestCatalog]:
    """A real Iceberg REST catalog server for the whole session (``testkit.rest_catalog``)."""
    from testkit.aws import new_s3_bucket
    from testkit.rest_catalog import start_rest_catalog

    bucket = new_s3_bucket(moto_endpoint)
    catalog = start_rest_catalog(tmp_path_factory.mktemp("rest-catalog"),
                                 f"s3://{bucket}/rest", moto_endpoint)
    try:
        yield catalog
    finally:
        catalog.stop()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """``tablestore-cdc demo`` run once (800 changes over 6 s, 3 channels) in a subprocess;
    ``--workdir`` is ``<its directory>/demo``."""
    workdir = tmp_path_factory.mktemp("demo-run") / "demo"
    return subprocess.run(
        [sys.executable, "-m", "tablestore_cdc", "demo", "--workdir", str(workdir),
         "--changes", "800", "--duration", "6", "--channels", "3"],
        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """URL of a moto server running in this process (threaded), for the module."""
    with threaded_moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def streams_fake() -> Iterator[StreamsFake]:
    """The DynamoDB Streams shard map, installed into this process's moto for the module."""
    fake = StreamsFake().install()
    yield fake
    fake.uninstall()


@pytest.fixture
def aws_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake AWS credentials and region in the environment for one test."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(name, AWS_TEST_ENV[name])


@pytest.fixture
def emulator(store: LocalTablestore) -> Iterator[EmulatorServer]:
    """The emulator in this process serving ``store`` (``testkit.emulator``'s instance and key
    pair), stopped after the test."""
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer

    with EmulatorServer(str(store.path), INSTANCE, KEY_ID, SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def ots_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorServer]:
    """The emulator in this process serving a store with no tables, shared by a module's tests
    (``testkit.emulator``'s instance and key pair)."""
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer

    path = tmp_path_factory.mktemp("ots-emulator") / "store.db"
    with EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET) as server:
        yield server


@pytest.fixture(params=["delta", "iceberg"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Delta | Iceberg | Target:
    """An apply sink's target in the test's temporary directory, once a Delta table and once
    an Iceberg table (``testkit.lakehouse``; with the ``reconcile_target`` marker,
    ``testkit.reconcile``'s; imported here, when a test asks for it, so the suite does not load
    deltalake and pyiceberg for every test)."""
    if request.node.get_closest_marker("reconcile_target"):
        from testkit.reconcile import DeltaTarget, IcebergTarget

        return (DeltaTarget if request.param == "delta" else IcebergTarget)(tmp_path)
    from testkit.lakehouse import Delta, Iceberg

    return Delta(tmp_path) if request.param == "delta" else Iceberg(tmp_path)


@pytest.fixture
def wire_setup(tmp_path: Path) -> Iterator[WireSetup]:
    """``testkit.wire_e2e.wire_scenario`` in the test's temporary directory: the emulator
    process, the store it serves and the SDK's client, the emulator killed after the test."""
    pytest.importorskip("tablestore")
    from testkit.wire_e2e import wire_scenario

    with wire_scenario(tmp_path) as parts:
        yield parts
