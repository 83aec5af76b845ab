"""A table whose target refuses a batch, seen the way an operator sees it: ``tablestore-cdc
replicate --tables --config --metrics-port`` in its own process (real Spark, real SQLite, real
Delta tables). The table set to ``schema_drift = "exception"`` in the config file meets a new
attribute: it is reported failed, with the reason, in the feed behind the dashboard
(``/api/sources``), in ``tablestore-cdc meta tables`` and in the Prometheus endpoint (scraped
over HTTP), while the other table keeps delivering; the config file fixed and the command
started again, the refused table resumes and ends equal to its source (docs/multi-table.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from connector.local import LocalTablestore
from meta_store import open_meta_store
from tablestore_cdc.commands.app import app as cli_app
from tablestore_cdc.feed.snapshot import sources_summary
from testkit.processes import REPO, kill_tree
from testkit.waiting import wait_until

pytestmark = pytest.mark.slow
deltalake = pytest.importorskip("deltalake")

COLUMNS = [("v", "STRING"), ("n", "DOUBLE")]


def _source(store_path: Path, table: str, columns: tuple[str, ...]) -> dict:
    with LocalTablestore(store_path) as store:
        return {pk["id"]: tuple(attrs.get(c) for c in columns) for pk, attrs in store.scan(table)}


def _target(lake: Path, table: str, columns: tuple[str, ...]) -> dict | None:
    if not (lake / table / "_delta_log").exists():
        return None
    rows = deltalake.DeltaTable(str(lake / table)).to_pyarrow_table().to_pylist()
    return {r["id"]: tuple(r.get(c) for c in columns) for r in rows}


def _equal(store_path: Path, lake: Path, table: str, columns: tuple[str, ...] = ("v", "n")
           ) -> bool:
    return _target(lake, table, columns) == _source(store_path, table, columns)


def _write(store_path: Path, table: str, first: int, count: int) -> None:
    with LocalTablestore(store_path) as store:
        for i in range(first, first + count):
            store.put_row(table, {"id": i}, {"v": f"{table}-{i}", "n": i * 0.5})
        store.delete_row(table, {"id": first + 1})


def _replicate(store_path: Path, out: Path, config: Path, log: Path) -> subprocess.Popen:
    args = ["replicate", "--store", str(store_path), "--tables", "t_*", "--output", str(out),
            "--config", str(config), "--metrics-port", "0", "--trigger-ms", "300",
            "--option", "tables.refreshIntervalMs=1000"]
    code = "from tablestore_cdc.commands.app import app; app()"
    with open(log, "wb") as sink:
        return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                                     "COLUMNS": "300"})


def _table_status(meta_uri: str) -> dict[str, dict[str, Any]]:
    """Each table's status as the dashboard's ``/api/sources`` carries it."""
    with open_meta_store(meta_uri) as meta:
        return {s["table_status"]["table"]: s["table_status"]
                for s in sources_summary(meta)["sources"] if s["table_status"]}


def _stop(app: subprocess.Popen) -> None:
    app.send_signal(signal.SIGTERM)  # the command stops cleanly, as on Ctrl-C
    try:
        app.wait(timeout=60)
    except subprocess.TimeoutExpired:
        kill_tree(app.pid)
        raise


def test_a_refused_table_is_reported_failed_everywhere_and_resumes_after_the_fixed_config(
        tmp_path: Path) -> None:
    store_path, out = tmp_path / "store.db", tmp_path / "out"
    lake, meta_uri = out / "lake", f"sqlite://{tmp_path / 'store.meta.db'}"
    config = tmp_path / "tables.toml"
    config.write_text('[defaults]\nschema_drift = "lenient"\n\n'
                      '[tables.t_drifts]\nschema_drift = "exception"\n')
    with LocalTablestore(store_path) as store:
        for name in ("t_good", "t_drifts"):
            store.create_table(name, [("id", "INTEGER")], COLUMNS, channels=2)
    for name in ("t_good", "t_drifts"):
        _write(store_path, name, 0, 20)
    log = tmp_path / "replicate.log"
    app = _replicate(store_path, out, config, log)
    try:
        for name in ("t_good", "t_drifts"):
            wait_until(f"{name} applied", lambda t=name: _equal(store_path, lake, t),
                       timeout=180, process=app)
        port = int(wait_until("the metrics port", lambda: re.search(
            r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text()),
            timeout=10, process=app).group(1))
        with LocalTablestore(store_path) as store:  # an attribute the target has no column for
            store.put_row("t_drifts", {"id": 500}, {"v": "new", "n": 1.0, "colour": "red"})
        _write(store_path, "t_drifts", 20, 10)
        failed = wait_until("t_drifts reported failed in the feed",
                            lambda: _table_status(meta_uri).get("t_drifts", {}),
                            lambda s: s.get("state") == "failed", timeout=120, process=app)
        assert "colour" in failed["reason"] and failed["reason"].startswith("batch ")
        assert failed["label"].startswith("failed: batch ")
        _write(store_path, "t_good", 20, 20)  # the other table keeps delivering
        wait_until("t_good applied after the refusal",
                   lambda: _equal(store_path, lake, "t_good"), timeout=120, process=app)
        good = wait_until("t_good's status caught up", lambda: _table_status(meta_uri)["t_good"],
                          lambda s: s["rows_applied"] >= 40, timeout=30, process=app)
        assert good["state"] == "streaming" and good["target_version"] is not None
        assert isinstance(good["records_behind"], int)
        assert not _equal(store_path, lake, "t_drifts")

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            scraped = answer.read().decode()
        assert 'tablestore_cdc_table_state{state="failed",table="t_drifts"} 1.0' in scraped
        assert 'tablestore_cdc_table_state{state="streaming",table="t_good"} 1.0' in scraped
        applied = re.search(r'tablestore_cdc_table_rows_applied_total\{table="t_good"\} (\S+)',
                            scraped)
        assert applied and float(applied.group(1)) >= 40

        shown = CliRunner().invoke(cli_app, ["meta", "tables", "--meta", meta_uri, "--json"])
        assert shown.exit_code == 0, shown.output
        rows = {r["table"]: r for r in json.loads(shown.output)["tables"]}
        assert rows["t_drifts"]["state"] == "failed" and "colour" in rows["t_drifts"]["reason"]
        assert rows["t_good"]["state"] == "streaming"
        text = CliRunner(env={"COLUMNS": "300"}).invoke(
            cli_app, ["meta", "tables", "--meta", meta_uri])
        assert text.exit_code == 0 and "failed: batch" in text.output, text.output
    finally:
        if app.poll() is None:
            _stop(app)
    assert app.returncode == 0, log.read_text()[-3000:]
    stopped = _table_status(meta_uri)
    assert stopped["t_good"]["state"] == "stopped"
    assert stopped["t_drifts"]["state"] == "failed"  # its own state survives a clean stop

    config.write_text('[defaults]\nschema_drift = "lenient"\n')  # the fixed setting
    app = _replicate(store_path, out, config, tmp_path / "replicate2.log")
    try:
        wait_until("t_drifts resumed", lambda: _equal(store_path, lake, "t_drifts"),
                   timeout=180, process=app)
        assert _target(lake, "t_drifts", ("colour",))[500] == ("red",)
        assert _equal(store_path, lake, "t_good")
        # the schema change the resumed batch made is in the operator's view
        wait_until("t_drifts' schema change in the feed",
                   lambda: _table_status(meta_uri)["t_drifts"].get("last_schema_change") or "",
                   lambda change: "colour" in change, timeout=60, process=app)
        wait_until("t_drifts streaming in the feed",
                   lambda: _table_status(meta_uri)["t_drifts"]["state"], lambda s: s ==
                   "streaming", timeout=60, process=app)
        assert not list((out / "_held" / "t_drifts").glob("*.parquet"))
    finally:
        _stop(app)
