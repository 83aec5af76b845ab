"""The snippets of the docs run as written, and the query lines the demo prints run as printed.

Each document's ``python`` code blocks are executed in order, in one namespace, on a real local
Spark -- with only what a reader's machine would differ in substituted, and named here:

- README.md: ``/data`` is a temporary directory, and ``orders.csv`` a small file in the working
  directory (the snippet loads it); the ``Usage`` query then streams the store the first
  snippet loaded, and its Parquet output is compared with the store's change log;
- docs/dynamodb.md: ``http://127.0.0.1:5000`` is a moto server on a free port of 127.0.0.1;
  ``spark`` is the session of README's Usage (the snippet says so); the stream is read until
  the item the first snippet wrote arrives;
- docs/operations.md's complete query: ``/tmp/cdc`` is a temporary directory holding an
  embedded store with table ``orders``; its printed counts are compared with the change log.

The query snippets (docs/lakehouse.md's "Querying the tables" and the lines ``tablestore-cdc
demo`` prints) run as a reader runs them, in a shell, offline: in a network namespace of their
own with no network (``unshare --net``) and an empty ``HOME``, so a library that downloads
something at run time (DuckDB's ``delta`` extension) fails them. ``python`` is this interpreter;
a ``pip install`` line they name must be in the ``test`` extra, which gave this interpreter
those packages. docs/lakehouse.md's tables are written by the sinks its snippet names, with the
arguments it gives them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def python_blocks(document: str, section: str | None = None) -> list[str]:
    """The document's fenced ``python`` code blocks, in order (of one ``## section`` only)."""
    return fenced_blocks(document, "python", section)


def fenced_blocks(document: str, language: str, section: str | None = None) -> list[str]:
    text = (REPO / document).read_text()
    if section is not None:
        start = text.index(f"\n## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start:end if end >= 0 else None]
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def run(blocks: list[str], substitutions: dict[str, str], namespace: dict[str, Any]) -> None:
    for block in blocks:
        for written, here in substitutions.items():
            block = block.replace(written, here)
        exec(compile(block, "<snippet>", "exec"), namespace)  # noqa: S102 - the docs' own code


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_snippets_run_as_written(in_tmp: Path, spark: Any) -> None:
    from connector.local import LocalTablestore

    blocks = python_blocks("README.md")
    assert len(blocks) == 2, "README's snippets changed: update this test's description"
    (in_tmp / "orders.csv").write_text("order_id,customer,amount\n1,ann,12.5\n2,bob,3.0\n"
                                       "3,cy,7.25\n")
    data = in_tmp / "data"
    data.mkdir()
    namespace: dict[str, Any] = {}
    run(blocks, {"/data/": f"{data}/"}, namespace)
    query = namespace["query"]
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    with LocalTablestore(data / "shop.db") as store:
        changes = store.change_log("orders")
    rows = spark.read.parquet(str(data / "orders-changelog")).collect()
    assert len(changes) == 5  # three puts, an update, a delete
    assert sorted((r["_channel_id"], r["_sequence"]) for r in rows) == sorted(
        (c.channel_id, c.sequence) for c in changes)


@pytest.fixture
def moto_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def spark_with_aws(spark: Any) -> Iterator[Any]:
    """The shared session with (dummy) AWS credentials for its Python workers, given the way
    ``spark.executorEnv.*`` gives them (docs/dynamodb.md, Credentials): their environment was
    fixed when the session started, and a registered source carries the context's to them."""
    from connector import register

    env = spark.sparkContext.environment
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    register(spark)
    try:
        yield spark
    finally:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.pop(name, None)
        register(spark)


def test_the_dynamodb_snippets_run_as_written(in_tmp: Path, spark_with_aws: Any,
                                              moto_url: str) -> None:
    spark = spark_with_aws
    blocks = python_blocks("docs/dynamodb.md")
    assert len(blocks) == 2, "docs/dynamodb.md's snippets changed: update this test"
    namespace: dict[str, Any] = {"spark": spark}
    run(blocks, {"http://127.0.0.1:5000": moto_url}, namespace)
    changes = namespace["changes"]
    got: list[Any] = []
    query = (changes.writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
             .option("checkpointLocation", str(in_tmp / "ckpt")).start())
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    assert [(r["pk"], r["sk"], r["status"], r["total"], r["_op"]) for r in got] == [
        ("o-1", 1.0, "new", 9.5, "PUT")]


# --- docs/operations.md: the complete query -------------------------------------------------


def test_the_operations_complete_query_runs_as_written(tmp_path: Path, spark: Any) -> None:
    from connector.local import LocalTablestore

    [block] = [b for b in python_blocks("docs/operations.md") if "local_session(" in b]
    cdc = tmp_path / "cdc"
    cdc.mkdir()
    with LocalTablestore(cdc / "orders.db") as store:
        store.create_table("orders", primary_key=[("order_id", "INTEGER")],
                           columns=[("amount", "DOUBLE")], channels=2)
        for i in range(1, 8):
            store.put_row("orders", {"order_id": i}, {"amount": float(i)})
        store.update_row("orders", {"order_id": 1}, {"amount": 10.0})
        store.delete_row("orders", {"order_id": 2})
        changes = store.change_log("orders")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run([block], {"/tmp/cdc/": f"{cdc}/"}, {})
    counts = {"PUT": 7, "UPDATE": 1, "DELETE": 1}
    assert sum(counts.values()) == len(changes)
    rows = ", ".join(f"Row(_op='{op}', count={n})" for op, n in sorted(counts.items()))
    assert printed.getvalue().strip() == f"[{rows}]"


# --- the query snippets: docs/lakehouse.md and the demo's lines, offline ----------------------


def packages_of_the_test_extra() -> set[str]:
    """The distributions the ``test`` extra installs (what a snippet's ``pip install`` may
    name: this interpreter has them)."""
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["test"]
    return {re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower() for requirement in extra}


@pytest.fixture
def offline(tmp_path: Path) -> Any:
    """Runs one shell line as a reader would, without network: ``python`` is this interpreter,
    ``HOME`` an empty directory (no cached download). Returns its stdout; fails on an error."""
    namespace = ["unshare", "--map-root-user", "--net"]
    probe = subprocess.run([*namespace, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespace to run the snippets offline in: {probe.stderr!r}")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def run_line(line: str) -> str:
        done = subprocess.run([*namespace, "bash", "-c", line], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
        return done.stdout

    return run_line


def order_changes(*changes: tuple[str, int, int, str, float | None]) -> pa.Table:
    """Change rows of an ``orders`` table (key ``order_id``; ``customer``, ``amount``) as the
    source delivers them: (op, commit second, order_id, customer, amount)."""
    schema = pa.schema([("order_id", pa.int64()), ("customer", pa.string()),
                        ("amount", pa.float64()), ("_op", pa.string()),
                        ("_channel_id", pa.string()), ("_sequence", pa.string()),
                        ("_commit_ts", pa.timestamp("us", tz="UTC")),
                        ("_before", pa.string()), ("_extra", pa.string())])
    return pa.Table.from_pylist([
        {"order_id": key, "customer": customer, "amount": amount, "_op": op,
         "_channel_id": "ch-0001", "_sequence": f"{second:020d}",
         "_commit_ts": dt.datetime.fromtimestamp(second, dt.UTC), "_before": None,
         "_extra": None} for op, second, key, customer, amount in changes], schema)


#: two batches: ann's first amount (12.5) is superseded, bob is deleted, cy stays
ORDER_BATCHES = [
    order_changes(("PUT", 1, 1, "ann", 12.5), ("PUT", 2, 2, "bob", 3.0),
                  ("PUT", 3, 3, "cy", 7.25)),
    order_changes(("UPDATE", 4, 1, "ann", 13.0), ("DELETE", 5, 2, "bob", None)),
]


def shows_current_orders(output: str) -> bool:
    """Whether a query's printed output holds the current orders only (ann at 13.0, cy)."""
    return ("ann" in output and "cy" in output and "13" in output and "bob" not in output
            and "12.5" not in output)


def test_the_lakehouse_query_snippets_run_offline(tmp_path: Path, offline: Any) -> None:
    from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink
    from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

    data = tmp_path / "data"
    # the tables of docs/lakehouse.md's "Using it" snippet, with its arguments (the key given:
    # these batches are built here, not read from the source)
    delta = DeltaApplySink(f"{data}/lake/orders", scd=2, schema_drift="add",
                           key_columns=["order_id"])
    iceberg = IcebergApplySink(sqlite_catalog_properties(f"{data}/warehouse"), "cdc.orders",
                               key_columns=["order_id"])
    for batch_id, batch in enumerate(ORDER_BATCHES):
        for sink in (delta, iceberg):
            assert sink.apply(batch, "docs", batch_id).committed

    [shell] = fenced_blocks("docs/lakehouse.md", "bash", section="Querying the tables")
    lines = [line.replace("/data/", f"{data}/") for line in shell.splitlines() if line.strip()]
    queries = [line for line in lines if line.startswith("python -c ")]
    assert len(queries) == 3, "docs/lakehouse.md's queries changed: update this test"
    for line in lines:
        if line.startswith("pip install "):
            assert set(line.split()[2:]) <= packages_of_the_test_extra(), line
        else:
            assert line in queries, f"a line this test does not know how to run: {line}"
    for query in queries:
        assert shows_current_orders(offline(query)), query

    [iceberg_block] = python_blocks("docs/lakehouse.md", section="Querying the tables")
    script = tmp_path / "query_iceberg.py"
    script.write_text(iceberg_block.replace("/data/", f"{data}/"))
    # two prints of pyarrow tables: the current state, then the orders of 10 or more
    current, large = offline(f"python {shlex.quote(str(script))}").split("pyarrow.Table")[1:]
    assert shows_current_orders(current)
    assert "13" in large and "7.25" not in large and "customer" not in large


def test_the_query_lines_the_demo_prints_run_offline(demo_run: Any, offline: Any) -> None:
    """Every line the demo (testkit.fixtures.demo_run) prints under "query it with", as
    printed, on the Delta table it wrote."""
    from deltalake import DeltaTable

    assert demo_run.returncode == 0, demo_run.stderr[-3000:]
    printed = demo_run.stdout.splitlines()
    [header] = [i for i, line in enumerate(printed) if "query it with" in line]
    queries = [line.strip() for line in printed[header + 1:] if line.startswith("  ")]
    assert len(queries) == 3, demo_run.stdout
    install = re.search(r"-m pip install ([\w ]+)\)", printed[header])
    assert install and set(install[1].split()) <= packages_of_the_test_extra(), printed[header]

    table = re.search(r"the Delta table (\S+);", printed[header])
    assert table
    statuses = set(DeltaTable(table[1]).to_pyarrow_table().column("status").to_pylist())
    assert statuses >= {"new", "paid"}
    for query in queries:
        assert query.startswith(shlex.quote(sys.executable) + " -c "), query
        output = offline(query)
        assert all(status in output for status in statuses), (query, output)
