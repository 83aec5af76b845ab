"""The progress dashboard in a real headless Chromium, over a meta store a running query fills.

A Spark driver process (``QUERY_SCRIPT``: the tablestore source, an exactly-once Parquet sink and
a ``ProgressListener``) reads a local store while this test writes to it; the dashboard server runs
in a thread of the test process; Playwright drives the system Chromium (``/usr/bin/chromium``;
``playwright install`` is never needed). The page must load, show the channels, update as batches
arrive (batch count, the split's children, consumed rows, Spark's own rows/s, a throughput
figure whose caption names the rows and seconds it divides), and once the query stops: a
"stopped" state with the age of the last commit (not "live"), children waiting for their parent
and the lag.

Set ``TABLESTORE_CDC_SCREENSHOT=/path.png`` to keep a screenshot of the final page (that is how
docs/dashboard.png is made).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from meta_store import open_meta_store
from tablestore_cdc.dashboard import DashboardApp, make_server
from tablestore_cdc.feed.reading import user_namespaces
from testkit.processes import REPO, kill_tree
from testkit.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TABLE, TUNNEL = "orders", "dashboard"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is missing (apt-get install -y chromium)"),
]

#: The Spark driver: argv = store, meta db, checkpoint dir, sink dir, stop file.
QUERY_SCRIPT = """
import sys, time
from pathlib import Path
from tablestore_cdc.listener import ProgressListener
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from connector.spark import local_session
from testkit.waiting import wait_until

store, meta, checkpoint, sink, stop = sys.argv[1:6]
spark = local_session("dashboard-browser-test", master="local[2]")
spark.streams.addListener(ProgressListener(f"sqlite://{meta}"))
query = (spark.readStream.format("tablestore").option("endpoint", f"local://{store}")
         .option("table.name", "orders").option("tunnel.name", "dashboard")
         .option("meta.store", f"sqlite://{meta}").load()
         .writeStream.foreachBatch(ExactlyOnceParquetSink(sink))
         .option("checkpointLocation", checkpoint)
         .trigger(processingTime="500 milliseconds").start())
print("query started", flush=True)
while query.isActive and not Path(stop).exists():
    time.sleep(0.2)
query.stop()
error = query.exception()
# onQueryTerminated reaches the listener asynchronously: let it record the stop first (if it
# never does, the test's own check of the page's "stopped" state says so)
from meta_store import open_meta_store
from tablestore_cdc.feed.reading import user_namespaces
from tablestore_cdc.query_record import load_query_status
with open_meta_store(f"sqlite://{meta}") as m:
    try:
        wait_until("the listener to record the stop",
                   lambda: [(load_query_status(m, ns) or {}).get("status")
                            for ns in user_namespaces(m)],
                   lambda statuses: "stopped" in statuses, timeout=20)
    except TimeoutError as exc:
        print(exc, flush=True)
spark.stop()
sys.exit(1 if error else 0)
"""


def _write(store: LocalTablestore, ids: range) -> None:
    store.batch_write(TABLE, [("put", {"id": i}, {"v": f"v{i}"}) for i in ids])


def _committed_batches(meta_uri: str) -> int:
    if not Path(meta_uri.removeprefix("sqlite://")).exists():
        return 0
    with open_meta_store(meta_uri) as meta:
        namespaces = user_namespaces(meta)
        if not namespaces:
            return 0
        return sum(1 for b in meta.list_batches(namespaces[0])
                   if b.prev_uuid is not None and b.committed_at is not None)


@contextlib.contextmanager
def dashboard_page(browser: Any, meta_uri: str) -> Iterator[tuple[Any, list[str]]]:
    """The dashboard over ``meta_uri``, served from a thread of this process, and a new page of
    the browser opened on it: ``(page, page_errors)``, the page's script errors collected."""
    app = DashboardApp.open(meta_uri, cache_s=0.2)
    server = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        yield page, page_errors
    finally:
        server.shutdown()
        server.server_close()
        app.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def test_dashboard_follows_a_running_query(browser: Any, tmp_path: Path) -> None:
    store_path, meta_path = tmp_path / "store.db", tmp_path / "meta.db"
    meta_uri = f"sqlite://{meta_path}"
    stop_file = tmp_path / "stop"
    store = LocalTablestore(store_path)
    store.create_table(TABLE, [("id", "INTEGER")], [("v", "STRING")], channels=3)
    first, second, third = (c.channel_id for c in store.list_channels(TABLE))
    _write(store, range(0, 30))

    log = open(tmp_path / "query.log", "wb")  # noqa: SIM115 - the child's output
    proc = subprocess.Popen(
        [sys.executable, "-c", QUERY_SCRIPT, str(store_path), str(meta_path),
         str(tmp_path / "checkpoint"), str(tmp_path / "sink"), str(stop_file)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)})
    try:
        wait_until("the query's first committed batch", lambda: _committed_batches(meta_uri),
                   lambda n: n >= 1, timeout=120, process=proc)
        with dashboard_page(browser, meta_uri) as (page, page_errors):
            page.wait_for_function("Number(document.body.dataset.polls) >= 1", timeout=15_000)
            rows = page.locator("#channels tbody tr[data-channel]")
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.channel)")) == [
                first, second, third]
            assert page.locator(f'#channels tr[data-channel="{first}"]').get_attribute(
                "data-status") == "OPEN"
            assert "live" in page.locator("#status-text").inner_text()
            batches_before = int(page.evaluate("document.body.dataset.batchCount"))
            polls_before = int(page.evaluate("document.body.dataset.polls"))

            # more data, in several writes, and a split: the page must follow without a reload
            children = store.split_channel(TABLE, first)
            for start in range(30, 90, 10):
                _write(store, range(start, start + 10))
                page.wait_for_timeout(600)
            page.wait_for_function(
                """([before, kids]) => Number(document.body.dataset.batchCount) > before + 1
                     && kids.every(k => document.querySelector(`#tree li[data-channel="${k}"]`))
                     && [...document.querySelectorAll('#channels tr[data-channel]')]
                          .reduce((n, r) => n + Number(r.dataset.consumed || 0), 0) === 90""",
                arg=[batches_before, list(children)], timeout=90_000)
            assert int(page.evaluate("document.body.dataset.polls")) > polls_before + 2
            parent_row = page.locator(f'#channels tr[data-channel="{first}"]')
            assert parent_row.get_attribute("data-status") == "TERMINATED"
            for child in children:  # nested under their parent in the tree
                assert page.locator(f'#tree li[data-channel="{first}"] li[data-channel="{child}"]'
                                    ).count() == 1
            page.wait_for_function(
                "document.getElementById('spark-rate').textContent.includes('processed/s')",
                timeout=90_000)  # the ProgressListener's numbers reached the page
            assert page.locator("#throughput-chart rect.bar").count() >= 2
            # the throughput figure is the caption's rows divided by the caption's seconds
            figure = page.locator("#rows-per-second").inner_text()
            caption = page.locator("#window").inner_text()
            rate = float(figure.split()[0].replace(",", ""))
            rows_text, _, rest = caption.partition(" rows / ")
            seconds = float(rest.split()[0].replace(",", ""))
            assert rate == pytest.approx(float(rows_text.replace(",", "")) / seconds, rel=0.02,
                                         abs=0.1), (figure, caption)
            assert page.locator("#batches tbody tr").count() >= 3

            # stop the query; new writes are lag, a split leaves children waiting for a parent
            stop_file.touch()
            proc.wait(timeout=90)
            assert proc.returncode == 0, (tmp_path / "query.log").read_text()[-3000:]
            _write(store, range(90, 97))
            waiting = store.split_channel(TABLE, second)
            page.wait_for_function(
                """([kids, parent]) => kids.every(k => {
                     const row = document.querySelector(`#channels tr[data-channel="${k}"]`);
                     return row && row.dataset.status === 'WAIT'
                       && row.textContent.includes(parent); })
                   && document.getElementById('total-lag').textContent === '7'""",
                arg=[list(waiting), second], timeout=30_000)
            # stopped, not live: the state, the age of the last commit, the frozen figures
            page.wait_for_function("document.body.dataset.queryState === 'stopped'",
                                   timeout=30_000)
            status = page.locator("#status-text").inner_text()
            assert "query stopped" in status and "last commit" in status, status
            assert "live" not in status
            assert "when last running" in page.locator("#window").inner_text()
            assert "nobody is reading" in page.locator("#lag-sub").inner_text()
            tree_text = page.locator(f'#tree li[data-channel="{waiting[0]}"]').inner_text()
            assert f"waiting for {second}" in tree_text
            assert page_errors == []

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            keep = os.environ.get("TABLESTORE_CDC_SCREENSHOT")
            if keep:
                shutil.copyfile(shot, keep)
    finally:
        if proc.poll() is None:
            stop_file.touch()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
        log.close()
        store.close()


def test_dashboard_with_two_sources_lists_them_then_shows_one(browser: Any, spark: Any,
                                                               tmp_path: Path) -> None:
    """Two queries (two tables) share one meta store: the page lists both sources with their
    state, never an error; a row opens that source's page, which links back. One source's job
    records that it is restarting (as ``replicate`` does): the list shows it."""
    from tablestore_cdc.query_record import record_query_status

    store_path, meta_uri = tmp_path / "store.db", f"sqlite://{tmp_path / 'meta.db'}"
    store = LocalTablestore(store_path)
    for table in ("orders", "customers"):
        store.create_table(table, [("id", "INTEGER")], [("v", "STRING")], channels=2)
        store.batch_write(table, [("put", {"id": i}, {"v": f"{table}{i}"}) for i in range(20)])
    queries = []
    for table in ("orders", "customers"):
        got: list[Any] = []
        query = (spark.readStream.format("tablestore").option("endpoint", f"local://{store_path}")
                 .option("table.name", table).option("tunnel.name", "two")
                 .option("meta.store", meta_uri).load()
                 .writeStream.foreachBatch(lambda df, _, got=got: got.extend(df.collect()))
                 .option("checkpointLocation", str(tmp_path / f"ckpt-{table}")).start())
        query.processAllAvailable()
        queries.append(query)
    for query in queries:
        query.stop()
    with open_meta_store(meta_uri) as meta:
        namespaces = user_namespaces(meta)
        assert len(namespaces) == 2
        orders_ns = next(ns for ns in namespaces if "#orders#" in ns)
        record_query_status(meta, orders_ns, "restarting",
                            reason="attempt 2, next in 4.0 s: TransientTunnelError: down")

    with dashboard_page(browser, meta_uri) as (page, page_errors):
        page.wait_for_function("document.body.dataset.view === 'sources'", timeout=15_000)
        rows = page.locator("#sources tbody tr[data-namespace]")
        assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.namespace)")) == namespaces
        assert page.locator(f'#sources tr[data-namespace="{orders_ns}"]').get_attribute(
            "data-state") == "restarting"
        assert "attempt 2" in page.locator(f'#sources tr[data-namespace="{orders_ns}"]'
                                           ).inner_text()
        assert page.locator("#error").is_hidden()
        assert page.locator("#channels").is_hidden()  # the detail waits for a choice
        page.locator("#sources a", has_text="customers").click()
        page.wait_for_function("document.body.dataset.view === 'detail' "
                               "&& Number(document.body.dataset.polls) >= 1", timeout=15_000)
        assert "customers" in page.locator("#source").inner_text()
        assert page.locator("#channels tbody tr[data-channel]").count() == 2
        assert page.locator("#sources").is_hidden()
        page.locator("#all-sources").click()
        page.wait_for_function("document.body.dataset.view === 'sources'", timeout=15_000)
        assert page_errors == []


def test_dashboard_lists_each_table_of_a_multi_table_pipeline(browser: Any, spark: Any,
                                                              tmp_path: Path) -> None:
    """A multi-table pipeline (real Spark) over three tables, one of whose targets refuses a
    batch: each table's status, as the pipeline's driver writes it (``TableStatusWriter``,
    what ``replicate --tables`` runs), is a row of the page's table list with its state (the
    refused one failed, with the reason), lag, rows/s, last commit and target version (marked
    when its schema changed); a row opens that table's page, whose target card shows the
    target's version and its last schema change."""
    from tablestore_cdc.pipeline import ApplySettings
    from tablestore_cdc.pipeline.multi_table import start_pipeline, status_location
    from tablestore_cdc.table_status import TableStatusWriter

    store_path, out = tmp_path / "store.db", tmp_path / "out"
    meta_uri = f"sqlite://{tmp_path / 'store.meta.db'}"  # the local endpoint's default
    store = LocalTablestore(store_path)
    for table in ("t_a", "t_b", "t_drifts"):
        store.create_table(table, [("id", "INTEGER")], [("v", "STRING")], channels=2)
        store.batch_write(table, [("put", {"id": i}, {"v": f"{table}{i}"}) for i in range(20)])
    target = f"delta://{out}/lake/{{table}}"

    def settings(table: str) -> tuple[ApplySettings, None]:
        return ApplySettings(target, schema_drift="exception" if table == "t_drifts"
                             else "lenient"), None

    pipeline = start_pipeline(
        spark, f"local://{store_path}", "t_*", "tables", out, ApplySettings(target),
        options={"tables.refreshIntervalMs": "500"}, trigger_ms=300, per_table=settings)
    writer = TableStatusWriter(lambda table: status_location(
        f"local://{store_path}", "t_*", "tables", None, table))
    try:
        wait_until("every table applied", lambda: pipeline.table_statuses(str(out), "t_*"),
                   lambda s: len(s) == 3 and all(t.target_version is not None
                                                 for t in s.values()),
                   timeout=120, query=pipeline.state_query)
        store.put_row("t_drifts", {"id": 99}, {"v": "x", "colour": "red"})
        store.put_row("t_b", {"id": 99}, {"v": "x", "size": 3})  # t_b's target adds a column
        # t_a caught up too: the lag the source reports is measured where a batch starts, so
        # the batch that read t_a's rows reports them behind until a later report
        statuses = wait_until("t_drifts failed, t_b's column added, t_a caught up",
                              lambda: pipeline.table_statuses(str(out), "t_*"),
                              lambda s: s["t_drifts"].state == "failed"
                              and s["t_b"].last_schema_change is not None
                              and s["t_a"].records_behind == 0, timeout=60,
                              query=pipeline.state_query)
        writer.publish(statuses)
    finally:
        pipeline.stop()
        writer.close()
        store.close()

    with dashboard_page(browser, meta_uri) as (page, page_errors):
        page.wait_for_function("document.body.dataset.view === 'sources'", timeout=15_000)
        rows = page.locator("#tables tbody tr[data-table]")
        assert rows.evaluate_all("rs => rs.map(r => [r.dataset.table, r.dataset.state])") == [
            ["t_a", "streaming"], ["t_b", "streaming"], ["t_drifts", "failed"]]
        failed = page.locator('#tables tr[data-table="t_drifts"]').inner_text()
        assert "failed: batch" in failed and "colour" in failed
        cells = page.locator('#tables tr[data-table="t_a"] td').all_inner_texts()
        assert cells[2] == "0"  # records behind: a number, caught up
        assert cells[5].endswith("ago") and cells[6] != "–"  # last commit, target version
        assert "t_* →" in cells[7]
        changed = page.locator('#tables tr[data-table="t_b"] td').nth(6)
        assert "(schema changed)" in changed.inner_text()
        assert "last schema change: batch " in (changed.get_attribute("title") or "")
        page.locator("#tables a", has_text="t_b").click()
        page.wait_for_function("document.body.dataset.view === 'detail' "
                               "&& Number(document.body.dataset.polls) >= 1", timeout=15_000)
        assert "t_b" in page.locator("#source").inner_text()
        # the table's page: its target's version and last schema change (what, when, version)
        change = statuses["t_b"]
        assert page.locator("#target-version").inner_text() == f"version {change.target_version}"
        card = page.locator("#schema-change").inner_text()
        assert card.startswith(f"last schema change: {change.last_schema_change} · ")
        assert "add column size" in card and card.endswith(
            f" ago · version {change.last_schema_change_version}")
        assert page_errors == []


@pytest.mark.parametrize("selection", [
    pytest.param(["--table", TABLE], id="table"),
    pytest.param(["--tables", TABLE], id="tables", marks=pytest.mark.extended),
])
def test_dashboard_shows_the_table_of_a_replicate_job_in_either_mode(
        browser: Any, tmp_path: Path, selection: list[str]) -> None:
    """``replicate --table orders`` and ``replicate --tables orders`` (the real CLI, ``--once``)
    over a store whose table has rows, an update and a delete: the same page for both (one
    path, one status record). The table is listed with its state, 0 records behind, the age of
    its last commit, the version of its target (as the target itself reports it) and its
    selection and job; its row opens the table's page, whose target card shows that version."""
    from deltalake import DeltaTable

    from tablestore_cdc.table_status import load_table_status

    store_path, out = tmp_path / "store.db", tmp_path / "out"
    meta_uri = f"sqlite://{tmp_path / 'store.meta.db'}"  # the local endpoint's default
    store = LocalTablestore(store_path)
    store.create_table(TABLE, [("id", "INTEGER")], [("v", "STRING")], channels=2)
    _write(store, range(0, 20))
    store.put_row(TABLE, {"id": 3}, {"v": "updated"})
    store.delete_row(TABLE, {"id": 4})
    store.close()
    run = subprocess.run(
        [sys.executable, "-m", "tablestore_cdc", "replicate", "--store", str(store_path),
         *selection, "--output", str(out), "--initial", "none", "--once"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-3000:]
    with open_meta_store(meta_uri) as meta:
        (namespace,) = user_namespaces(meta)
        status = load_table_status(meta, namespace)
    assert status is not None and status.target is not None
    version = DeltaTable(status.target.removeprefix("delta://")).version()

    with dashboard_page(browser, meta_uri) as (page, page_errors):
        page.wait_for_function("document.body.dataset.view === 'sources' "
                               "&& Number(document.body.dataset.polls) >= 1", timeout=15_000)
        rows = page.locator("#tables tbody tr[data-table]")
        assert rows.evaluate_all("rs => rs.map(r => [r.dataset.table, r.dataset.state])") == [
            [TABLE, "stopped"]]
        cells = page.locator(f'#tables tr[data-table="{TABLE}"] td').all_inner_texts()
        assert cells[2] == "0"  # records behind: a number, caught up
        assert cells[5].endswith(" ago"), cells  # last commit
        assert cells[6] == str(version)  # the target's own version
        assert cells[7] == f"{TABLE} → {out}"  # the selection and the job (its output)
        assert page.locator("#error").is_hidden()
        page.locator("#tables a", has_text=TABLE).click()
        page.wait_for_function("document.body.dataset.view === 'detail' "
                               "&& Number(document.body.dataset.polls) >= 1", timeout=15_000)
        assert TABLE in page.locator("#source").inner_text()
        assert page.locator("#target-version").inner_text() == f"version {version}"
        assert page.locator("#schema-change").inner_text() == "no schema change yet"
        assert page_errors == []
