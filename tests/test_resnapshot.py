"""``tablestore-cdc resnapshot`` without Spark: the command's signals in a real SQLite meta
table, its key range and its one-line errors; a repair run by the job's runner
(``tablestore_cdc.resnapshot.hook``) into real Delta and Iceberg targets built by the real apply
sink from the source's change stream (``testkit.reconcile.apply_stream``), then damaged behind
the product's back. The running pipeline and a SIGKILL during a repair are
tests/test_resnapshot_spark.py and tests/test_resnapshot_kill.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

from typer.testing import CliRunner  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from connector.tunnel import ColumnSpec, TableSchema  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from meta_store.signals import Signal, SignalState  # noqa: E402
from tablestore_cdc.commands.app import app  # noqa: E402
from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.reconcile.keyrange import KeyRange, KeyRangeError  # noqa: E402
from tablestore_cdc.resnapshot.command import open_board  # noqa: E402
from tablestore_cdc.resnapshot.hook import RepairTarget  # noqa: E402
from tablestore_cdc.resnapshot.repair import run_repair  # noqa: E402
from testkit.aws import new_s3_bucket  # noqa: E402
from testkit.reconcile import DeltaTarget, Target, apply_stream, table_runner  # noqa: E402

runner = CliRunner()
JOB = "build-query"  # the app id apply_stream commits under: the job that owns the target


def make_store(path: Path) -> LocalTablestore:
    """Table ``t`` with 40 rows written, some changed and deleted, and its meta table."""
    store = LocalTablestore(path)
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=2)
    for i in range(40):
        store.put_row("t", {"id": i}, {"name": f"n{i}", "qty": i})
    for i in range(0, 40, 7):
        store.update_row("t", {"id": i}, {"qty": 100 + i})
    store.delete_row("t", {"id": 39})
    open_meta_store(SourceSpec(f"local://{path}", "t").source_options().meta_store).close()
    return store


def applied_copy(tmp_path: Path, target: Target) -> tuple[SourceSpec, Any]:
    """``make_store``'s table in a new store, its change stream applied into ``target`` by the
    real apply sink under the job ``JOB``: (the source as reconcile reads it, the sink)."""
    store = make_store(tmp_path / "store.db")
    spec = SourceSpec(f"local://{store.path}", "t")
    sink = open_apply_sink(target.uri)
    apply_stream(spec.endpoint, "t", sink, app_id=JOB, tunnel_name="replicate")
    return spec, sink


#: the shared ``target`` fixture gives testkit.reconcile's targets (testkit/fixtures.py)
pytestmark = pytest.mark.reconcile_target


def test_the_hook_repairs_six_differences_once(tmp_path: Path, target: Target) -> None:
    spec, sink = applied_copy(tmp_path, target)
    target.tamper([1, 2, 3], [5, 6], 99)
    assert len(reconcile_table(spec, target.uri).comparison.differences) == 6
    with open_board(spec) as board:
        signal = board.add(Signal(table="t"))
        repair = RepairTarget(spec, sink, target.uri)
        hook = table_runner(repair)
        assert hook.run_due(JOB) == 1
        done = board.signals()[0]
        assert done.state is SignalState.DONE, done
        assert done.counts == {"upserts": 5, "deletes": 1, "in_flight": 0, "differences": 6}
        # no stream batch in the target's meta table: every difference repaired, and said so
        assert "every difference repaired" in done.note
        assert reconcile_table(spec, target.uri).comparison.differences == []
        assert hook.run_due(JOB) == 0  # nothing due any more
        # run again (a job killed before marking it done): the commit is found, nothing written
        again = run_repair(repair, JOB, signal, board)
        assert again.already and again.counts()["upserts"] == 0


def test_an_idle_look_runs_only_between_batches(tmp_path: Path) -> None:
    """The job's watch loop (``when_idle``) leaves the signals to a batch that holds the lock
    (it looks itself), runs them once the lock is free, and looks again only after the
    interval."""
    target = DeltaTarget(tmp_path)
    spec, sink = applied_copy(tmp_path, target)
    target.tamper([1, 2, 3], [5, 6], 99)
    runner = table_runner(RepairTarget(spec, sink, target.uri), check_every_s=60)
    applying, applied = threading.Event(), threading.Event()

    def batch() -> None:  # the apply's foreachBatch, holding the lock for its batch
        with runner.lock:
            applying.set()
            applied.wait(30)

    with open_board(spec) as board:
        board.add(Signal(table="t"))
        thread = threading.Thread(target=batch)
        thread.start()
        assert applying.wait(30)
        assert runner.when_idle(JOB) == 0  # a batch is being applied: no repair beside it
        assert board.signals()[0].state is SignalState.PENDING
        applied.set()
        thread.join(30)
        assert runner.when_idle(JOB) == 1
        assert board.signals()[0].state is SignalState.DONE
        board.add(Signal(table="t"))
        assert runner.when_idle(JOB) == 0  # within the interval: no look
        assert runner.run_due(JOB) == 1  # (a look now finds it)
    assert reconcile_table(spec, target.uri).comparison.differences == []


def test_the_repair_opens_the_target_with_the_job_s_target_options(
        tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target in S3 whose endpoint only the job's ``--target-option`` names: the repair's
    comparison opens it with them, as the sink does."""
    from deltalake import DeltaTable

    bucket = new_s3_bucket(moto_endpoint, monkeypatch)
    store = make_store(tmp_path / "store.db")
    spec = SourceSpec(f"local://{store.path}", "t")
    uri, options = f"delta+s3://{bucket}/lake/t", {"aws_endpoint_url": moto_endpoint}
    sink = open_apply_sink(uri, target_options=options)
    apply_stream(spec.endpoint, "t", sink, app_id=JOB, tunnel_name="replicate")
    DeltaTable(f"s3://{bucket}/lake/t", storage_options={"AWS_ALLOW_HTTP": "true"}).delete(
        "id = 1")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with open_board(spec) as board:
        board.add(Signal(table="t"))
        runner = table_runner(RepairTarget(spec, sink, uri, target_options=options))
        assert runner.run_due(JOB) == 1
        done = board.signals()[0]
    assert done.state is SignalState.DONE and done.counts["upserts"] == 1, done
    assert reconcile_table(spec, uri, target_options=options).comparison.differences == []


def test_a_multi_table_apply_repairs_each_table_with_its_own_settings(tmp_path: Path) -> None:
    """A ``--tables`` job's runner: which tables it looks at, and each table's repair with that
    table's source options, sink, target, soft delete column and keys; none for a failed
    table (its held batches come first)."""
    from tablestore_cdc.pipeline import ApplySettings
    from tablestore_cdc.pipeline.multi_table import (
        MultiTableApply,
        named_tables,
        selection_options,
        table_sources,
    )

    store = make_store(tmp_path / "store.db")
    endpoint = f"local://{store.path}"
    selection = selection_options(endpoint, "t,u_*,v", "v", "replicate",
                                  {"onDataLoss": "resnapshot"})

    def own(table: str) -> tuple[ApplySettings, tuple[str, ...] | None]:
        return ApplySettings(f"delta://{tmp_path}/own-{table}", soft_delete_column="gone"), (
            "id",)

    apply = MultiTableApply(ApplySettings(f"delta://{tmp_path}/lake/{{table}}"), endpoint,
                            tmp_path / "out", per_table=own, spec_of=table_sources(selection),
                            known=named_tables(selection))
    assert apply.repairs is not None and apply.repair_tables() == ["t"]  # no glob, no v
    repair = apply.repair_target("t")
    assert repair is not None and repair.sink is apply.sink("t")
    assert (repair.target_uri, repair.soft_delete_column, repair.key_columns) == (
        f"delta://{tmp_path}/own-t", "gone", ("id",))
    assert repair.spec.source_options().source_identity == (
        SourceSpec(endpoint, "t").source_options().source_identity)  # resnapshot --table t's
    assert repair.spec.options["onDataLoss"] == "resnapshot"
    apply._fail("t", 3, ValueError("refused by its target"))
    assert apply.repair_target("t") is None

    def unreachable(*_: object, **__: object) -> None:
        raise ValueError("no such bucket")

    broken = MultiTableApply(ApplySettings(f"delta://{tmp_path}/lake/{{table}}"), endpoint,
                             tmp_path / "out2", open_sink=unreachable,
                             spec_of=table_sources(selection), known={"t"})
    assert broken.repairs is not None
    with open_board(SourceSpec(endpoint, "t")) as board:
        board.add(Signal(table="t"))
        assert broken.repairs.run_due(JOB) == 1  # a sink that does not open fails the signal,
        failed = board.signals()[0]  # not the batch
    assert failed.state is SignalState.FAILED and failed.note == "ValueError: no such bucket"


def test_a_key_range_limits_the_repair(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path)
    spec, sink = applied_copy(tmp_path, target)
    target.tamper([1, 2, 30], [5, 31], 99)
    with open_board(spec) as board:
        board.add(Signal(table="t", key_from=0, key_to=10))
        table_runner(RepairTarget(spec, sink, target.uri)).run_due(JOB)
        assert board.signals()[0].counts["upserts"] == 3  # 1, 2 and 5; not 30, 31 or 99
    left = {d.key[0] for d in reconcile_table(spec, target.uri).comparison.differences}
    assert left == {30, 31, 99}


def test_a_repair_that_cannot_run_marks_the_signal_failed(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db")
    spec = SourceSpec(f"local://{store.path}", "t")
    uri = f"delta://{tmp_path}/never-written"
    with open_board(spec) as board:
        board.add(Signal(table="t"))
        table_runner(RepairTarget(spec, open_apply_sink(uri), uri)).run_due(JOB)
        failed = board.signals()[0]
    assert failed.state is SignalState.FAILED
    assert failed.note.startswith("TargetMissingError: target ") and "no table" in failed.note


def test_the_command_adds_lists_and_refuses_bad_flags_in_one_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store.db")
    base = ["resnapshot", "--store", str(store.path), "--table", "t"]
    first = runner.invoke(app, [*base, "--from", "10", "--to", "20"])
    assert first.exit_code == 0, first.output
    signal_id = first.output.split()[1]
    again = runner.invoke(app, [*base, "--from", "10", "--to", "20"])
    assert again.output.split()[1] == signal_id  # asked twice while pending: one signal
    listed = runner.invoke(app, [*base, "--list"])
    assert listed.exit_code == 0 and f"{signal_id}  t [10, 20)  command  pending" in listed.output
    waited = runner.invoke(app, [*base, "--wait", "--timeout", "0"])
    assert waited.exit_code == 1 and "pending" in waited.output  # no job runs it
    other = LocalTablestore(tmp_path / "other.db")
    other.create_table("t", primary_key=[("id", "INTEGER")])
    for args, message in [
        ([*base, "--from", "ten"], "--from 'ten': expected an integer, the type of the first "
         "key column 'id'"),
        ([*base, "--from", "20", "--to", "10"], "--to '10': must be above --from '20'"),
        ([*base, "--list", "--wait"], "--list takes no --from, --to or --wait"),
        (["resnapshot", "--table", "t"], "give exactly one of --store or --endpoint"),
        ([*base, "--option", "onDataLoss=maybe"], "'onDataLoss'"),
        (["resnapshot", "--store", str(other.path), "--table", "t"], "meta"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_key_ranges_by_key_type() -> None:
    def schema(kind: str) -> TableSchema:
        return TableSchema("t", (ColumnSpec("k", kind),))

    span = KeyRange.parse(schema("INTEGER"), "10", None)
    assert span.holds((10,)) and not span.holds((9,)) and span.holds((10 ** 9,))
    text = KeyRange.parse(schema("STRING"), "b", "d")
    assert text.holds(("c",)) and not text.holds(("d",)) and not text.holds(("a",))
    assert KeyRange.parse(schema("STRING"), None, None) == KeyRange("k")
    with pytest.raises(KeyRangeError, match="BINARY; a range is taken on INTEGER, DOUBLE"):
        KeyRange.parse(schema("BINARY"), "x", None)
    with pytest.raises(KeyRangeError, match="expected a number"):
        KeyRange.parse(schema("DOUBLE"), None, "high")


def test_the_dashboard_snapshot_shows_the_resnapshots(tmp_path: Path) -> None:
    """``/api/progress`` carries the open signals and the newest finished ones, in the shape
    docs/progress-feed.schema.json publishes."""
    import json

    import jsonschema
    from referencing import Registry, Resource

    from tablestore_cdc.feed.snapshot import RECENT_RESNAPSHOTS, dashboard_snapshot

    store = make_store(tmp_path / "store.db")
    spec = SourceSpec(f"local://{store.path}", "t")
    namespace = spec.source_options().source_identity
    with open_board(spec) as board:
        board.store.set_namespace_info(namespace, {"table": "t"})
        finished = [board.add(Signal(table="t", key_from=i, key_to=i + 1)) for i in range(5)]
        for s in finished:
            board.set(s.id, state=SignalState.DONE, counts={"upserts": 1})
        running = board.add(Signal(table="t"))
        board.set(running.id, state=SignalState.RUNNING, percent=12.5)
        shown = dashboard_snapshot(board.store, namespace, with_tunnel=False)["resnapshots"]
        assert [s["id"] for s in shown] == [s.id for s in finished[-RECENT_RESNAPSHOTS:]] + [
            running.id]
        assert shown[-1]["state"] == "running" and shown[-1]["percent"] == 12.5
        schema = json.loads((Path(__file__).parent.parent / "docs" /
                             "progress-feed.schema.json").read_text())
        registry = Registry().with_resource(schema["$id"], Resource.from_contents(schema))
        jsonschema.Draft202012Validator({"$ref": schema["$id"] + "#/$defs/snapshot"},
                                        registry=registry).validate(
            dashboard_snapshot(board.store, namespace, with_tunnel=False))
