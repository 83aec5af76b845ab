"""No secret in what Spark shows: plans (``explain()``, the SQL tab), the UI's environment page
and REST API, the event log, the session's conf.

``connector.spark.local_session`` sets Spark's redaction from the product's one rule of secrets
(``cdc_common.uris``: ``SPARK_SECRET_REGEX``, ``SPARK_OPTIONS_REGEX``, ``SPARK_STRING_REGEX``).
Two tests, both against a real local Spark:

- in the shared session: a source's plan with its secret options (``access.key.secret``,
  ``security.token``, a meta-store URL with user info, which Spark's own default regex would
  show) and the session's conf, which never holds a source option;
- in a process of its own (the UI and the event log are set when a JVM starts): the pipeline
  started as ``replicate`` starts it (``start_pipeline``: the query that reads and applies)
  over the emulator, into a Delta table in a moto S3 bucket whose credentials are target options
  (``--target-option aws_secret_access_key=...``), with a Spark property holding an ADLS
  account key (``fs.azure.account.key.*``, a key Spark's default regex shows) as the Spark
  engine of an ``abfss`` target would need. The child prints what the UI's REST API
  (environment, SQL executions with their plans, jobs, stages), the event log, the queries'
  ``explain`` and the conf hold; no secret is in any of it, nor in the child's own output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tablestore")

#: the secrets the tests give, each distinct so that a finding names where it came from
SOURCE_SECRET = "src-s3cr3t-5c1f0e"
STS_TOKEN = "sts-t0ken-77ab2d"
META_PASSWORD = "meta-passw0rd-4e9a"
TARGET_SECRET = "target-s3cr3t-a81c3d"
ACCOUNT_KEY = "adls-acc0unt-key-29fd"
SECRETS = (SOURCE_SECRET, STS_TOKEN, META_PASSWORD, TARGET_SECRET, ACCOUNT_KEY)
REDACTED = "*********(redacted)"


def found_secrets(texts: dict[str, str]) -> list[tuple[str, str]]:
    """(where, which secret) for every secret in any of ``texts``."""
    return [(where, secret) for where, text in texts.items() for secret in SECRETS
            if secret in text]


@pytest.mark.slow
def test_a_source_plan_and_the_conf_show_no_secret(spark, store, capsys):
    from connector.spark import REDACTION
    from tablestore_emulator.server import EmulatorServer

    with EmulatorServer(str(store.path), "inst", "kid", SOURCE_SECRET) as emulator:
        changes = (spark.readStream.format("tablestore").option("endpoint", emulator.url)
                   .option("table.name", "t").option("tunnel.name", "q")
                   .option("instance.name", "inst").option("access.key.id", "kid")
                   .option("access.key.secret", SOURCE_SECRET)
                   .option("security.token", STS_TOKEN)
                   # refused when the store is opened, but in the plan before that
                   .option("meta.store", f"dynamodb://AKIA:{META_PASSWORD}@cdc-meta?region=r1")
                   .load())
        capsys.readouterr()
        changes.explain(extended=True)  # analysed again: the emulator must still answer
        plan = capsys.readouterr().out
    assert "StreamingRelationV2" in plan and f"meta.store={REDACTED}" in plan
    conf = dict(spark.sparkContext.getConf().getAll())
    assert {key: conf.get(key) for key in REDACTION} == REDACTION
    assert found_secrets({"explain": plan, "conf": json.dumps(conf)}) == []


@pytest.mark.slow
def test_the_ui_the_event_log_and_the_pipeline_plans_show_no_secret(
        tmp_path, moto_endpoint, monkeypatch):
    from testkit.aws import new_s3_bucket
    from testkit.processes import REPO

    bucket = new_s3_bucket(moto_endpoint, monkeypatch)
    result = tmp_path / "shown.json"
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    child = subprocess.run(
        [sys.executable, __file__, str(tmp_path), f"delta+s3://{bucket}/t", str(result)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": path})
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    shown: dict[str, str] = json.loads(result.read_text())
    shown["child output"] = child.stdout + child.stderr
    # each place was read and holds what it should (a batch was applied into S3)
    assert int(shown["applied batch"]) >= 0
    assert "spark.redaction.regex" in shown["environment"]
    assert "fs.azure.account.key.acct.dfs.core.windows.net" in shown["environment"]
    assert "SparkListenerEnvironmentUpdate" in shown["event log"]
    assert any("MicroBatchScan" in text for name, text in shown.items()
               if name.startswith("explain "))  # the query reading the source
    # the session's conf is Spark's API, not a display: it holds the Spark property given to it
    # (an engine's credentials), never a source option or a target option
    conf = shown.pop("conf")
    assert ACCOUNT_KEY in conf and found_secrets({"conf": conf.replace(ACCOUNT_KEY, "")}) == []
    assert found_secrets(shown) == []


# --- the child: a pipeline with the UI and the event log on --------------------------------


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return str(answer.read().decode())


def _shown_by_a_running_pipeline(tmp: Path, target: str) -> dict[str, str]:
    """Start the pipeline over an emulator with the UI and an event log (this process's own
    JVM), wait for an applied batch, and collect what Spark shows."""
    from connector.spark import local_session
    from tablestore_cdc.pipeline import ApplySettings, start_pipeline
    from tablestore_emulator.server import EmulatorServer
    from testkit.fixtures import local_store, put_rows
    from testkit.waiting import wait_until

    events = tmp / "events"
    events.mkdir()
    put_rows(local_store(tmp / "store.db"), range(5))
    spark = local_session("redaction", conf={
        "spark.ui.enabled": "true", "spark.ui.port": "0",
        "spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
        "spark.eventLog.dir": events.as_uri(),
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": ACCOUNT_KEY},
        short_run=True)
    shown: dict[str, str] = {}
    with EmulatorServer(str(tmp / "store.db"), "inst", "kid", SOURCE_SECRET) as emulator:
        apply = ApplySettings(target, target_options=(
            ("aws_access_key_id", "testing"), ("aws_secret_access_key", TARGET_SECRET)))
        pipeline = start_pipeline(spark, emulator.url, "t", "q", tmp / "out", apply,
                                  {"instance.name": "inst", "access.key.id": "kid",
                                   "access.key.secret": SOURCE_SECRET,
                                   "security.token": STS_TOKEN}, 200)
        try:
            wait_until("a batch applied into the target", pipeline.applied_batch,
                       lambda batch: batch is not None, timeout=120)
            shown["applied batch"] = str(pipeline.applied_batch())
            for query in pipeline.queries:
                shown[f"explain {query.name}"] = query._jsq.explainInternal(True)
                shown[f"progress {query.name}"] = json.dumps(query.recentProgress, default=str)
            shown["conf"] = json.dumps(spark.sparkContext.getConf().getAll())
            api = (f"{spark.sparkContext.uiWebUrl}/api/v1/applications/"
                   f"{spark.sparkContext.applicationId}")
            for page in ("environment", "sql?details=true&planDescription=true", "jobs",
                         "stages?details=true"):
                shown[page.partition("?")[0]] = _get(f"{api}/{page}")
            shown["sql tab"] = _get(f"{spark.sparkContext.uiWebUrl}/SQL/")
        finally:
            pipeline.stop()
    spark.stop()
    time.sleep(0.5)  # the event log is closed at stop
    shown["event log"] = "".join(f.read_text() for f in sorted(events.rglob("*"))
                                 if f.is_file())
    return shown


def main(argv: list[str]) -> None:
    tmp, target, result = Path(argv[0]), argv[1], Path(argv[2])
    shown: dict[str, Any] = _shown_by_a_running_pipeline(tmp, target)
    result.write_text(json.dumps(shown))


if __name__ == "__main__":
    main(sys.argv[1:])
