"""The job attaches a ``ProgressListener``: Spark's batch ids reach the meta store, and the stop
is recorded (``tablestore-cdc demo`` in a real subprocess, its own Spark driver). The same real
run (two splits and a merge) checks ``meta diff``'s totals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tablestore_cdc.commands.app import app as root_app

pytestmark = pytest.mark.slow


def test_demo_records_spark_batch_ids_and_its_stop(tmp_path):
    workdir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tablestore_cdc", "demo", "--workdir", str(workdir),
         "--changes", "300", "--duration", "3", "--channels", "2"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = f"sqlite://{workdir / 'store.meta.db'}"
    listing = CliRunner().invoke(root_app, ["meta", "batches", "--meta", meta, "--json"])
    assert listing.exit_code == 0, listing.output
    batches = [b for b in json.loads(listing.stdout)["batches"]
               if not b["initial"] and b["state"] != "minted"]
    assert batches and all(b["spark_batch_id"] is not None for b in batches), batches
    assert sorted(b["spark_batch_id"] for b in batches) == list(range(len(batches)))

    # meta diff over the whole run (2 splits, then a merge of two split children: channels
    # that appeared and finished between the two ends) counts every record in between
    chain = json.loads(listing.stdout)["batches"]
    first, last = batches[0], batches[-1]
    between = chain[chain.index(first) + 1: chain.index(last) + 1]
    diff = CliRunner().invoke(root_app, ["meta", "diff", first["uuid"], last["uuid"], "--meta",
                                         meta, "--json"])
    assert diff.exit_code == 0, diff.output
    data = json.loads(diff.stdout)
    assert data["records"] == sum(b["records"] for b in between) > 0
    assert any(c["only_in"] == "between" for c in data["channels"]), data["channels"]

    from meta_store import open_meta_store
    from tablestore_cdc.feed.reading import user_namespaces
    from tablestore_cdc.feed.snapshot import dashboard_snapshot
    from tablestore_cdc.query_record import load_query_status

    with open_meta_store(meta) as store:
        namespace = user_namespaces(store)[0]
        assert (load_query_status(store, namespace) or {}).get("status") == "stopped"
        snapshot = dashboard_snapshot(store, None)
    assert snapshot["activity"]["state"] == "stopped"
    assert snapshot["activity"]["last_commit_age_s"] >= 0
