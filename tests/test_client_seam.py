"""The seam that opens the source's clients (``connector.clients``), on real backends.

- every client is wrapped once: the injected fault hook inside the retries (a hook that fails
  calls transiently is retried through, on the driver and in the executors' pool, the range
  read's clients included);
- the executors' pool keeps at most ``size`` clients of a kind, closes the least recently used
  one and every one at a normal interpreter exit (a real second process), and keys them without
  any credential;
- the planner's clock is the seam's injected ``Clock``;
- walking a streaming read from ``TablestoreStreamReader.read``, no call lands in a test-hook
  module (``testkit``): the crash points' seam (``connector.crash_hook``) with no hook
  installed is one check; a hook installed there sees the executor's points, with the
  partition as their context;
- the fault harness's hook reaches a process through its environment alone
  (``testkit.crash_points.environment``: a Python started with it, a PySpark worker behind the
  product's own ``sitecustomize`` included, has it installed at start).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from connector import crash_hook
from connector.clients import (
    FAULT_HOOK_ENV,
    ClientHooks,
    Clients,
    ExecutorClients,
    meta_key,
    tunnel_key,
)
from connector.errors import TransientMetaStoreError, TransientTunnelError
from connector.local import LocalTablestore
from connector.protocol import StreamProtocol
from connector.proxy import ClientProxy
from connector.spark import WORKER_SITE
from connector.tunnel.tablestore.endpoint import TablestoreEndpoint
from testkit import crash_points
from testkit.fixtures import local_store, options_for, put_rows


class Recorder:
    """A fault hook: each wrapped client records its calls and its closing here, and its first
    ``fail_first`` calls raise the client's transient error (after taking no effect)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.calls: list[str] = []
        self.closed: list[Any] = []

    def __call__(self, client: Any) -> Any:
        return _Recording(client, self)


class _Recording(ClientProxy):
    def __init__(self, target: Any, recorder: Recorder) -> None:
        super().__init__(target)
        self._recorder = recorder

    def _call(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        self._recorder.calls.append(name)
        if len(self._recorder.calls) <= self._recorder.fail_first:
            from connector.tunnel import TunnelService

            transient = (TransientTunnelError if isinstance(self._target, TunnelService)
                         else TransientMetaStoreError)
            raise transient(detail=f"injected into {name}")
        return method(*args, **kwargs)

    def close(self) -> None:
        self._recorder.closed.append(self._target)
        super().close()


def test_a_hook_is_wrapped_inside_the_retries(tmp_path: Path, store: LocalTablestore) -> None:
    hook = Recorder(fail_first=3)
    tunnel = Clients(ClientHooks(fault_hook=hook)).tunnel(f"local://{store.path}")
    assert [t.tunnel_name for t in tunnel.list_tunnels("t")] == []  # retried through
    assert hook.calls == ["list_tunnels"] * 4
    meta = ExecutorClients(clients=Clients(ClientHooks(fault_hook=Recorder(2)))).meta_store(
        f"sqlite:///{tmp_path}/meta.db")
    assert meta.get_namespace_info("ns") is None
    tunnel.close()
    meta.close()


def test_the_pool_is_bounded_and_closes_what_it_drops(tmp_path: Path) -> None:
    stores = [local_store(tmp_path / f"s{i}.db") for i in range(3)]
    hook = Recorder()
    pool = ExecutorClients(size=2, clients=Clients(ClientHooks(fault_hook=hook)))
    first = pool.reader(f"local://{stores[0].path}")
    assert pool.reader(f"local://{stores[0].path}") is first  # one client per endpoint
    pool.tunnel(f"local://{stores[1].path}")
    pool.reader(f"local://{stores[0].path}")  # used again: the second is the oldest now
    pool.tunnel(f"local://{stores[2].path}")
    assert [c.uri for c in hook.closed] == [f"local://{stores[1].path}"]
    pool.close()
    assert len(hook.closed) == 3
    for store in stores:
        store.close()


def test_pool_keys_hold_no_credential() -> None:
    def endpoint(secret: str, token: str | None = None) -> TablestoreEndpoint:
        return TablestoreEndpoint(
            origin="https://inst.cn-hangzhou.ots.aliyuncs.com", instance="inst",
            access_key_id=SecretStr("LTAI-key-id-4711"), access_key_secret=SecretStr(secret),
            security_token=SecretStr(token) if token else None)

    key = tunnel_key(endpoint("s3cret-Value-9"))
    text = repr(key) + repr(meta_key("tablestore://inst/meta", endpoint("s3cret-Value-9")
                                     .credentials()))
    for secret in ("s3cret-Value-9", "LTAI-key-id-4711"):
        assert secret not in text
    assert key == tunnel_key(endpoint("s3cret-Value-9"))
    assert key != tunnel_key(endpoint("other-secret"))  # other credentials: another client
    assert key != tunnel_key(endpoint("s3cret-Value-9", token="sts"))
    assert "s3cret" not in repr(endpoint("s3cret-Value-9"))


def test_the_pool_closes_its_clients_when_the_process_exits(tmp_path: Path) -> None:
    """A process of its own, the hook named in the environment as the harness names it."""
    store = local_store(tmp_path / "store.db")
    store.close()
    (tmp_path / "closing_hook.py").write_text(textwrap.dedent(f"""
        from connector.proxy import ClientProxy

        class Closing(ClientProxy):
            def close(self):
                with open({str(tmp_path / "closed.txt")!r}, "a") as f:
                    f.write(type(self._target).__name__ + "\\n")
                super().close()

        def hook(client):
            return Closing(client)
    """))
    program = (f"from connector.clients import executor_clients\n"
               f"executor_clients().reader('local://{store.path}').list_tunnels()\n"
               f"executor_clients().meta_store('sqlite:///{tmp_path}/meta.db')\n")
    env = {**os.environ, FAULT_HOOK_ENV: "closing_hook:hook",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=120)
    closed = sorted((tmp_path / "closed.txt").read_text().split())
    assert closed == ["LocalTunnelService", "SqliteMetaStore"]


def test_the_planner_reads_the_injected_clock(store: LocalTablestore) -> None:
    protocol = StreamProtocol(options_for(store), Clients(ClientHooks(clock=lambda: 1234.5)))
    start = protocol.initial_offset()
    initial = protocol.meta.find_batch(protocol.namespace, protocol.uuid_of(start))
    assert initial is not None and initial.manifest is not None
    assert initial.manifest.planned_at == 1234.5
    protocol.close()


def test_a_streaming_read_never_enters_a_test_hook_module(store: LocalTablestore,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Every Python function called while an executor reads a partition, from the stream
    reader's ``read`` on, belongs to a product or library module: none to ``testkit`` (no
    crash-point hook installed and no fault hook named, as in production)."""
    from connector.schema import output_schema
    from connector.source import TablestoreStreamReader

    for variable in ("TABLESTORE_CDC_FAULT_DIR", FAULT_HOOK_ENV):
        monkeypatch.delenv(variable, raising=False)
    put_rows(store, range(50))
    options = options_for(store)
    protocol = StreamProtocol(options)
    start = protocol.initial_offset()
    end = protocol.latest_offset(start, None)
    (partition, *_) = protocol.plan(start, end)
    reader = TablestoreStreamReader(options, output_schema(store.table_schema("t")))
    modules: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            modules.add(str(frame.f_globals.get("__name__", "")))

    sys.setprofile(profile)
    try:
        rows = sum(batch.num_rows for batch in reader.read(partition))
    finally:
        sys.setprofile(None)
    assert rows > 0 and {"connector.reader", "connector.clients"} <= modules
    assert crash_hook.installed() is None
    assert not {m for m in modules if m.startswith("testkit")}
    protocol.close()


def test_an_installed_crash_hook_sees_the_executor_read_points(store: LocalTablestore) -> None:
    from connector.schema import output_schema
    from connector.source import TablestoreStreamReader

    put_rows(store, range(10))
    options = options_for(store)
    protocol = StreamProtocol(options)
    start = protocol.initial_offset()
    (partition, *_) = protocol.plan(start, protocol.latest_offset(start, None))
    seen: list[tuple[str, Any]] = []
    previous = crash_hook.install(lambda name, context: seen.append((name, context)))
    try:
        reader = TablestoreStreamReader(options, output_schema(store.table_schema("t")))
        assert sum(batch.num_rows for batch in reader.read(partition)) > 0
    finally:
        crash_hook.install(previous)
    assert [name for name, _ in seen] == ["read_before_claim", "mid_read"]
    assert all(context["partition"] == partition for _, context in seen)
    protocol.close()


@pytest.mark.parametrize("worker", [False, True], ids=["driver", "pyspark-worker"])
def test_the_harness_environment_installs_the_crash_hook_at_start(tmp_path: Path,
                                                                  worker: bool) -> None:
    """A process started with the harness's environment has the hook at start; a PySpark
    worker's path puts the product's ``worker_site`` first (``spark.executorEnv.PYTHONPATH``)
    and Spark's environment after it: its ``sitecustomize`` runs the harness's, once."""
    env = {**os.environ, **crash_points.environment(tmp_path)}
    if worker:
        env["PYTHONPATH"] = os.pathsep.join([WORKER_SITE, env["PYTHONPATH"]])
    (tmp_path / "arm-mid_read").write_text("raise")
    program = ("from connector import crash_hook\n"
               "from testkit.crash_points import InjectedFault, fault_point\n"
               "assert crash_hook.installed() is fault_point\n"
               "try:\n"
               "    crash_hook.crash_point('mid_read')\n"
               "except InjectedFault:\n"
               "    print('fired')\n")
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "fired\n"), done.stderr
    del env["TABLESTORE_CDC_FAULT_DIR"]  # the same path without the directory: nothing installed
    done = subprocess.run([sys.executable, "-c", "from connector import crash_hook\n"
                           "assert crash_hook.installed() is None"], env=env, timeout=60)
    assert done.returncode == 0
