"""The install a user does: the wheel, built once, into clean venvs (``make test-install``, which
``make test`` runs after the suite; not part of the suite's own pytest run).

Three venvs under ``.venv-install/`` (``make clean`` removes it), each new for each run:

- ``newest``: ``pip install WHEEL`` (the newest PySpark the range allows), no extra;
- ``pyspark-4.0.5`` and ``pyspark-4.2.1``: that PySpark installed first, then the wheel: pip
  must keep it (README, "Spark versions": a cluster's PySpark).

In each, with no extra: every product module imports, or fails only for want of an extra's SDK;
every command's ``--help`` works; ``tablestore-cdc demo`` (small) ends with its verification
line, and the first query line it prints (``deltalake``, a base dependency) runs. In the first,
a URI, target or command whose extra is missing fails in one line naming its ``pip install``.
Then one extra is installed into each (``[lakehouse]``, ``[dynamodb]``, ``[tablestore]``: each
extra alone, and PySpark kept), its modules import, and something small runs that needs it (an
Iceberg commit read back; a DynamoDB meta table on a moto server; the emulator, the Tunnel wire
client and a Tablestore meta table).

Time is kept small: pip's caches are warm after the first run, the venvs skip bytecode
compilation (``--no-compile``: Python compiles what it imports), and the demo writes 100 changes
over 2 seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.aws import AWS_TEST_ENV, start_moto_server, stop_moto_server

REPO = Path(__file__).resolve().parent.parent
INSTALLS = REPO / ".venv-install"

pytestmark = [pytest.mark.slow, pytest.mark.user_install, pytest.mark.timeout(1800)]

#: extra -> the top-level modules it brings that product modules import (a product module may
#: fail to import only for want of one of these, and only where that extra is not installed)
EXTRA_MODULES = {
    "dynamodb": {"boto3", "botocore"},
    "tablestore": {"tablestore", "google", "httptools", "urllib3"},
    "lakehouse": {"pyiceberg"},
}
#: extra -> (a command that needs it, as argv after ``tablestore-cdc`` or ``python -c``) whose
#: one-line error must name the extra's install line when the extra is missing
MISSING_EXTRA_CHECKS = {
    "dynamodb": [["tablestore-cdc", "meta", "namespaces", "--meta",
                  "dynamodb://cdc-meta?region=us-east-1"],
                 ["python", "-c", "from connector.tunnel import open_tunnel_service; "
                  "open_tunnel_service('dynamodb-streams://orders?region=us-east-1')"]],
    "tablestore": [["tablestore-cdc", "meta", "namespaces", "--meta",
                    "tablestore://inst/cdc_meta?endpoint=http://127.0.0.1:9"],
                   ["tablestore-cdc", "emulator", "--store", "{dir}/emulated.db", "--instance",
                    "inst", "--access-key-id", "id", "--access-key-secret", "secret"],
                   ["python", "-c", "from connector.tunnel import open_tunnel_service; "
                    "open_tunnel_service('https://inst.cn-hangzhou.ots.aliyuncs.com')"]],
    "lakehouse": [["tablestore-cdc", "replicate", "--store", "{dir}/store.db", "--table",
                   "orders", "--output", "{dir}/out", "--target",
                   "iceberg://{dir}/warehouse?table=cdc.orders"]],
}


@dataclass(frozen=True)
class Install:
    """One venv of the test: its name, the PySpark pinned first (or None) and its one extra."""

    name: str
    pyspark: str | None
    extra: str


INSTALLS_TESTED = [
    Install("newest", None, "lakehouse"),
    Install("pyspark-4.0.5", "4.0.5", "dynamodb"),
    Install("pyspark-4.2.1", "4.2.1", "tablestore"),
]


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The wheel of this checkout, built once for every venv (with the compiled decoder)."""
    dist = INSTALLS / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    # setuptools packs whatever an earlier build left in build/lib, deleted modules too
    shutil.rmtree(REPO / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist),
                    str(REPO)], check=True, capture_output=True, text=True)
    [built] = dist.glob("tablestore_cdc-*.whl")
    return built


class Venv:
    """A new venv at ``path``; commands run with its ``bin`` first on PATH, from its directory
    (so ``python -c`` cannot import this checkout), with nothing of the test's environment that
    points into the checkout or its venv."""

    def __init__(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        self.path = path
        self.bin = path / "bin"
        dropped = {"PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
        self.env = {k: v for k, v in os.environ.items() if k not in dropped}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{os.environ['PATH']}"

    def run(self, *argv: str, check: bool = True, timeout: float = 900,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv = (shutil.which(argv[0], path=self.env["PATH"]) or argv[0], *argv[1:])
        done = subprocess.run(argv, cwd=self.path, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stderr[-4000:]}"
        return done

    def pip_install(self, *requirements: str) -> None:
        self.run("python", "-m", "pip", "install", "--quiet", "--no-compile", *requirements)

    def version(self, distribution: str) -> str:
        return self.run("python", "-c", "import importlib.metadata as m, sys; "
                        "print(m.version(sys.argv[1]))", distribution).stdout.strip()


#: run in a venv: import every product module; print {module: the top-level module whose
#: absence failed it}; any other failure is printed as such
IMPORT_EVERY_MODULE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    failed, installed_from = {}, None
    for package in ("cdc_common", "connector", "meta_store", "tablestore_emulator",
                    "tablestore_cdc"):
        module = importlib.import_module(package)
        installed_from = installed_from or module.__file__
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as exc:
                failed[info.name] = (exc.name or "?").partition(".")[0]
            except Exception as exc:
                failed[info.name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"failed": failed, "from": installed_from}))
""")

#: run in a venv: ``--help`` of every command and subcommand of the CLI, in this process
EVERY_HELP = textwrap.dedent("""
    import typer.main
    from typer.testing import CliRunner
    from tablestore_cdc.commands.app import app

    def paths(command, path):
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from paths(sub, [*path, name])

    count = 0
    for path in paths(typer.main.get_command(app), []):
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, (path, result.output)
        count += 1
    print(count)
""")

VERIFIED = re.compile(r"^demo: 100 changes written .*: 0 lost, 0 duplicated; current state "
                      r"matches the source table row by row", re.MULTILINE)


def check_modules(venv: Venv, extras: set[str]) -> None:
    """Every product module imports from the venv, or fails only for want of an SDK of an
    extra not installed."""
    found = json.loads(venv.run("python", "-c", IMPORT_EVERY_MODULE).stdout)
    assert Path(found["from"]).is_relative_to(venv.path), found["from"]  # not the checkout
    missing_ok = set().union(*(m for extra, m in EXTRA_MODULES.items() if extra not in extras))
    wrong = {module: why for module, why in found["failed"].items() if why not in missing_ok}
    assert not wrong, f"modules that fail to import with extras {sorted(extras)}: {wrong}"


def check_missing_extras(venv: Venv, extras: set[str]) -> None:
    """Each check of an extra not installed fails in one line naming its install."""
    for extra, checks in MISSING_EXTRA_CHECKS.items():
        if extra in extras:
            continue
        for argv in checks:
            argv = [arg.replace("{dir}", str(venv.path)) for arg in argv]
            done = venv.run(*argv, check=False, timeout=120)
            assert done.returncode != 0, argv
            assert f"pip install 'tablestore-cdc[{extra}]'" in done.stderr, (argv, done.stderr)
            if argv[0] == "tablestore-cdc":
                assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("install", INSTALLS_TESTED, ids=[i.name for i in INSTALLS_TESTED])
def test_the_wheel_installs_runs_the_demo_and_takes_one_extra(wheel: Path,
                                                               install: Install) -> None:
    venv = Venv(INSTALLS / install.name)
    if install.pyspark:
        venv.pip_install(f"pyspark=={install.pyspark}")
    venv.pip_install(str(wheel))
    spark = venv.version("pyspark")
    if install.pyspark:
        assert spark == install.pyspark, "pip replaced the PySpark installed first"
    check_modules(venv, set())
    assert int(venv.run("python", "-c", EVERY_HELP).stdout) >= 20
    if install.pyspark is None:  # (once: what a missing extra says does not depend on Spark)
        venv.run("tablestore-cdc", "local", "create-table", str(venv.path / "store.db"),
                 "orders", "--pk", "order_id:INTEGER", "--col", "amount:DOUBLE")
        check_missing_extras(venv, set())

    demo = venv.run("tablestore-cdc", "demo", "--workdir", str(venv.path / "demo"),
                    "--changes", "100", "--duration", "2", "--channels", "2")
    assert VERIFIED.search(demo.stdout), demo.stdout
    printed = demo.stdout.splitlines()
    header = next(i for i, line in enumerate(printed) if "query it with" in line)
    statuses = venv.run("bash", "-c", printed[header + 1].strip()).stdout  # deltalake's line
    assert "status" in statuses and "order_id_count" in statuses, (printed, statuses)

    venv.pip_install(f"{wheel}[{install.extra}]")
    assert venv.version("pyspark") == spark, "installing an extra replaced PySpark"
    check_modules(venv, {install.extra})
    EXTRA_RUNS[install.extra](venv)


# --- something small that needs each extra ------------------------------------------------------


def run_lakehouse(venv: Venv) -> None:
    """An Iceberg commit through the sink, read back with pyiceberg."""
    venv.run("python", "-c", textwrap.dedent("""
        import datetime as dt, sys
        import pyarrow as pa
        from pyiceberg.catalog import load_catalog
        from tablestore_cdc.lakehouse import open_apply_sink
        from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

        warehouse = sys.argv[1]
        sink = open_apply_sink(f"iceberg://{warehouse}?table=cdc.orders",
                               key_columns=["order_id"])
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        batch = pa.Table.from_pylist([
            {"order_id": 1, "amount": 2.5, "_op": "PUT", "_channel_id": "ch-1",
             "_sequence": "1", "_commit_ts": ts, "_before": None, "_extra": None},
            {"order_id": 1, "amount": 4.0, "_op": "UPDATE", "_channel_id": "ch-1",
             "_sequence": "2", "_commit_ts": ts, "_before": None, "_extra": None}],
            pa.schema([("order_id", pa.int64()), ("amount", pa.float64()),
                       ("_op", pa.string()), ("_channel_id", pa.string()),
                       ("_sequence", pa.string()), ("_commit_ts", pa.timestamp("us", "UTC")),
                       ("_before", pa.string()), ("_extra", pa.string())]))
        assert sink.apply(batch, "install-check", 0).committed
        table = load_catalog("tablestore_cdc", **sqlite_catalog_properties(warehouse))
        rows = table.load_table("cdc.orders").scan().to_arrow().to_pylist()
        assert rows == [{"order_id": 1, "amount": 4.0}], rows
    """), str(venv.path / "warehouse"))


def run_dynamodb(venv: Venv) -> None:
    """A DynamoDB meta table on a moto server (127.0.0.1): created, written, listed by the CLI."""
    server, url = start_moto_server()
    try:
        uri = f"dynamodb://cdc-meta?region=us-east-1&endpoint_url={url}"
        venv.run("python", "-c", textwrap.dedent("""
            import sys
            from meta_store import open_meta_store
            store = open_meta_store(sys.argv[1] + "&create_table=true")
            store.set_namespace_info("install-check", {"source": "test"})
        """), uri, env=AWS_TEST_ENV)
        listed = venv.run("tablestore-cdc", "meta", "namespaces", "--meta", uri,
                          env=AWS_TEST_ENV).stdout
        assert "install-check" in listed, listed
    finally:
        stop_moto_server(server)


def run_tablestore(venv: Venv) -> None:
    """The emulator (the SDK's protobuf modules) serving a store; the Tunnel wire client
    (protobuf, httptools) makes a tunnel on it and sees its channels; a Tablestore meta table
    (the SDK) is created there and written."""
    store = venv.path / "emulated.db"
    venv.run("tablestore-cdc", "local", "create-table", str(store), "orders", "--pk",
             "order_id:INTEGER", "--channels", "3")
    emulator = subprocess.Popen(
        [str(venv.bin / "tablestore-cdc"), "emulator", "--store", str(store), "--instance",
         "inst", "--access-key-id", "id", "--access-key-secret", "secret"],
        cwd=venv.path, env=venv.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert emulator.stdout is not None
        url = emulator.stdout.readline().strip().removeprefix("listening on ")
        assert url.startswith("http://127.0.0.1:"), url
        credentials = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "id",
                       "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "secret"}
        venv.run("python", "-c", textwrap.dedent("""
            import sys
            from connector.tunnel import open_tunnel_service
            from meta_store import open_meta_store
            url = sys.argv[1]
            tunnels = open_tunnel_service(url + "?instance=inst")
            tunnels.ensure_tunnel("orders", "install-check")
            channels = tunnels.describe_tunnel("orders", "install-check").channels
            assert len(channels) == 3, channels
            meta = open_meta_store(f"tablestore://inst/cdc_meta?endpoint={url}&create_table=true")
            meta.set_namespace_info("install-check", {"source": "test"})
            assert meta.list_namespaces() == ["install-check"], meta.list_namespaces()
        """), url, env=credentials)
    finally:
        emulator.terminate()  # the emulator stops on SIGTERM
        emulator.wait(timeout=30)


EXTRA_RUNS = {"lakehouse": run_lakehouse, "dynamodb": run_dynamodb, "tablestore": run_tablestore}
