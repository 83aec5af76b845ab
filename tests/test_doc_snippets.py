"""The Python snippets of README.md and docs/dynamodb.md run as written.

Each document's ``python`` code blocks are executed in order, in one namespace, on a real local
Spark -- with only what a reader's machine would differ in substituted, and named here:

- README.md: ``/data`` is a temporary directory, and ``orders.csv`` a small file in the working
  directory (the snippet loads it); the ``Usage`` query then streams the store the first
  snippet loaded, and its Parquet output is compared with the store's change log;
- docs/dynamodb.md: ``http://127.0.0.1:5000`` is a moto server on a free port of 127.0.0.1;
  ``spark`` is the session of README's Usage (the snippet says so); the stream is read until
  the item the first snippet wrote arrives.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def python_blocks(document: str) -> list[str]:
    """The document's fenced ``python`` code blocks, in order."""
    text = (REPO / document).read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


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
