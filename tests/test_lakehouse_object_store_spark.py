"""``replicate --tables`` into object storage on a moto S3 server on 127.0.0.1, its own state
(``--output s3://``) there too, in one real Spark scenario: tables ``ints`` (an INTEGER key)
and ``names`` (a STRING key) into ``delta+s3://``, table ``events`` into
``iceberg://lake/cdc.{table}`` (``--config``; a pyiceberg SQL catalog configured by
``PYICEBERG_CATALOG__LAKE__*``, its warehouse on S3). A channel of ``ints`` is split mid-run,
the job is SIGKILLed with its whole process tree, then run with ``--once`` from another
working directory: each table read back from S3 (deltalake, pyiceberg) equals its source row
by row, and nothing was written to a working directory. The extended run (``kills=2``) puts a
restarted streaming run between the two, SIGKILLed too once it has read past the first kill.

The secret key is the user's in four places (the AWS environment, the catalog's
``s3.secret-access-key`` by ``PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY``, the
``--config`` file's target options, ``spark.hadoop.fs.s3a.secret.key`` in the user's
``spark-defaults.conf``, which also turns Spark's event log on): it is in none of the job's
output, Spark's log, the meta store's bytes, the feed, ``meta tables --json`` or the event
log's environment (what the Spark UI's environment page shows), where the key is shown
redacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

from typer.testing import CliRunner  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.commands.app import app  # noqa: E402
from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.lakehouse import TWO_KEYS, two_keys_store, write_two_keys  # noqa: E402
from testkit.processes import REPO, kill_tree  # noqa: E402
from testkit.target_reads import read_iceberg  # noqa: E402

CLI = [sys.executable, "-m", "tablestore_cdc"]
#: every table of the selection and its key column: two into Delta, ``events`` into Iceberg
TABLES = {**{t: column for t, (column, _) in TWO_KEYS.items()}, "events": "id"}
REDACTED = "*********(redacted)"  # Spark's marker (Utils.REDACTION_REPLACEMENT_TEXT)


def _write(store: LocalTablestore, start: int, count: int) -> None:
    """``write_two_keys``' puts, updates and deletes in the two Delta tables and in
    ``events``."""
    write_two_keys(store, start, count)
    for i in range(start, start + count):
        store.put_row("events", {"id": i}, {"v": i, "note": f"e{i}"})
        if i % 4 == 0 and i > start:
            store.update_row("events", {"id": i - 2}, {"note": None})
        if i % 9 == 0 and i > start:
            store.delete_row("events", {"id": i - 5})


def _rows(bucket: str, table: str, catalog: dict[str, str]) -> list[dict[str, Any]] | None:
    """The table read back from S3 (None before its first commit)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    from pyiceberg.exceptions import NoSuchTableError

    try:
        if table == "events":
            return read_iceberg(catalog, "cdc.events", "lake")
        return DeltaTable(f"s3://{bucket}/lake/{table}", storage_options={
            "AWS_ALLOW_HTTP": "true"}).to_pyarrow_table().to_pylist()
    except (TableNotFoundError, NoSuchTableError):
        return None


def _wait(proc: subprocess.Popen[bytes], log: Path, done: Any, seconds: float = 360) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


@pytest.mark.slow
@pytest.mark.timeout(900)  # kills=2 starts Spark three times
@pytest.mark.parametrize("kills", [1, pytest.param(2, marks=pytest.mark.extended)])
def test_replicate_into_s3_survives_a_split_and_sigkills_and_shows_no_secret(
        tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
        kills: int) -> None:
    bucket = new_s3_bucket(moto_endpoint, monkeypatch)  # this process reads the tables too
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    store = two_keys_store(tmp_path / "store.db")
    store.create_table("events", primary_key=[("id", "INTEGER")],
                       columns=[("v", "INTEGER"), ("note", "STRING")], channels=2)
    _write(store, 0, 150)
    here, there = tmp_path / "here", tmp_path / "there"  # the runs' working directories
    here.mkdir()
    there.mkdir()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
               "warehouse": f"s3://{bucket}/warehouse", "s3.endpoint": moto_endpoint,
               "s3.region": "us-east-1"}
    config = tmp_path / "tables.toml"  # the user's file: the Delta targets' key in it
    config.write_text(  # a flag would win over the file: the targets are all here
        f'[defaults]\ntarget = "delta+s3://{bucket}/lake/{{table}}"\n'
        f'target_options = {{aws_region = "us-east-1", aws_secret_access_key = "{secret}"}}\n'
        '[tables.events]\ntarget = "iceberg://lake/cdc.{table}"\n'
        'target_options = {"s3.region" = "us-east-1"}\n')
    events = tmp_path / "events"
    events.mkdir()
    conf_dir = tmp_path / "spark-conf"  # the user's spark-defaults.conf, the key in it
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.hadoop.fs.s3a.secret.key {secret}\nspark.eventLog.enabled true\n"
        f"spark.eventLog.dir file://{events}\nspark.eventLog.compress false\n")
    command = [*CLI, "replicate", "--store", str(store.path), "--tables", "ints,names,events",
               "--output", f"s3://{bucket}/state", "--config", str(config)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "AWS_ENDPOINT_URL": moto_endpoint,
           "PYTHONPATH": str(REPO), "SPARK_CONF_DIR": str(conf_dir),
           **{f"PYICEBERG_CATALOG__LAKE__{k.upper().replace('.', '__')}": v
              for k, v in catalog.items()},
           "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
           "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": secret}
    assert env["AWS_SECRET_ACCESS_KEY"] == secret  # the job has the key, in four places
    logs = [tmp_path / f"run-{n}.log" for n in range(kills)]

    def start(log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as sink:
            return subprocess.Popen(command, cwd=cwd, env=env, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    first = start(logs[0], here)
    try:  # every table has a batch, then a split of ``ints``, more changes, the kill
        _wait(first, logs[0], lambda: all(_rows(bucket, t, catalog) for t in TABLES))
        store.split_channel("ints", store.list_channels("ints")[0].channel_id)
        _write(store, 150, 60)
        time.sleep(2)
    finally:
        kill_tree(first.pid)
    _write(store, 210, 40)
    if kills == 2:
        second = start(logs[1], there)  # restarted, streaming, from another directory
        try:  # it reads past the first's kill (the split's children included), then its kill
            _wait(second, logs[1], lambda: any(
                r["id"] == 249 for r in _rows(bucket, "ints", catalog) or []))
            _write(store, 250, 30)
            time.sleep(2)
        finally:
            kill_tree(second.pid)
        _write(store, 280, 20)
    again = subprocess.run([*command, "--once"], cwd=there if kills == 1 else here, env=env,
                           capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert list(here.iterdir()) == [] and list(there.iterdir()) == []
    assert len([c for c in store.list_channels("ints") if c.parent_ids]) == 2
    state = {o["Key"].split("/")[1] for o in boto3.client("s3").list_objects_v2(
        Bucket=bucket, Prefix="state/")["Contents"]}
    assert {"changelog", "_checkpoints"} <= state, state
    for table, column in TABLES.items():
        rows = _rows(bucket, table, catalog)
        assert rows is not None
        assert table_state(rows, [column]) == {
            k: dict(v) for k, v in rows_by_key(store.scan(table)).items()}, table

    # -- the secret key, where it could show
    spark_logs = Path(again.stderr.split("Spark's log: ", 1)[1].split()[0]).parent
    shown = {"job output": "".join(p.read_text() for p in logs) + again.stderr + again.stdout,
             "Spark's log": "".join(p.read_text(errors="replace")
                                    for p in spark_logs.rglob("*") if p.is_file())}
    meta_files = sorted(tmp_path.glob("store.meta.db*"))
    shown["meta store"] = b"".join(p.read_bytes() for p in meta_files).decode("latin-1")
    assert "iceberg://lake/cdc.events" in shown["meta store"], meta_files
    meta = f"sqlite://{tmp_path / 'store.meta.db'}"
    listed = CliRunner().invoke(app, ["meta", "tables", "--meta", meta, "--json"])
    assert listed.exit_code == 0, listed.output
    shown["meta tables --json"] = listed.output
    targets = {r["table"]: r["target"] for r in json.loads(listed.output)["tables"]}
    assert set(targets) == set(TABLES), targets
    shown["feed"] = _feed(meta)
    assert shown["feed"].count('"kind": "batch"') > 3
    logged = [p for p in events.rglob("*") if p.is_file()]  # Spark 4: a folder per run
    environment = [json.loads(line) for p in logged for line in p.read_text().splitlines()
                   if '"SparkListenerEnvironmentUpdate"' in line]
    assert len(environment) == kills + 1, logged  # one per run
    for update in environment:  # the UI's environment page, as the event log keeps it
        assert update["Spark Properties"]["spark.hadoop.fs.s3a.secret.key"] == REDACTED
    shown["Spark's environment"] = json.dumps(environment)
    for where, text in shown.items():
        assert text and secret not in text, where


def _feed(meta: str) -> str:
    """The feed of every source of the meta store: ``progress``'s batch records and the
    dashboard's ``/api/progress`` snapshot (``dashboard_snapshot``, the tunnel not asked)."""
    from meta_store import open_meta_store
    from tablestore_cdc.feed.reading import user_namespaces
    from tablestore_cdc.feed.snapshot import dashboard_snapshot

    store = open_meta_store(meta)
    parts = []
    for ns in user_namespaces(store):
        parts.append(json.dumps(dashboard_snapshot(store, ns, with_tunnel=False)))
        progress = CliRunner().invoke(app, ["progress", "--meta", meta, "-n", ns,
                                            "--no-tunnel"])
        assert progress.exit_code == 0, progress.output
        parts.append(progress.output)
    return "\n".join(parts)
