"""The apply-changes sink (tablestore_cdc.lakehouse) without Spark: real Delta and Iceberg
tables in temporary directories, batches built by hand or from a real embedded store's change
log with the source's own page builder. Tables are read back with deltalake / pyiceberg
directly (tablestore_cdc.verify), never through the sink."""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
from types import SimpleNamespace

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")


from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.lakehouse import (  # noqa: E402
    IcebergApplySink,
    open_apply_sink,
)
from tablestore_cdc.lakehouse.changes import ordered  # noqa: E402
from tablestore_cdc.lakehouse.errors import (  # noqa: E402
    ApplyOptionError,
    ColumnTypeConflictError,
    ForeignTargetError,
    SchemaDriftError,
    TargetDependencyError,
    TargetUriError,
)
from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties  # noqa: E402
from tablestore_cdc.lakehouse.plan import ApplyOptions, plan_batch  # noqa: E402
from tablestore_cdc.verify import rows_by_key, table_state  # noqa: E402
from testkit.lakehouse import (  # noqa: E402
    FIRST,
    WITH_COLOUR,
    Iceberg,
    batch,
    change,
    closes,
    deletes,
    source_batches,
    store_with_history,
    upserts,
)
from testkit.target_reads import history_mismatches, source_history, table_history  # noqa: E402

UTC = dt.UTC
def ts(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, UTC)


# --- ordering and reduction ------------------------------------------------------------------


def ordered_changes(rows: pa.Table, keys: list[str]) -> dict[tuple, list[SimpleNamespace]]:
    """Each key's changes as ``changes.ordered`` puts them (channel, sequence, image)."""
    by_key: dict[tuple, list[SimpleNamespace]] = {}
    for row in ordered(rows, keys).to_pylist():
        by_key.setdefault(tuple(row[k] for k in keys), []).append(SimpleNamespace(
            channel_id=row["_channel_id"], sequence=row["_sequence"],
            image={"name": row["name"]}))
    return by_key


def test_a_keys_changes_follow_sequence_in_a_channel_and_parents_before_children() -> None:
    rows = [
        # key 1: parent "z-parent" (sequence 7, 8), then child "a-child" (sequence 1, 2): the
        # child sorts first by name and by sequence; only commit times tell the order
        change("PUT", "z-parent", 7, 10, 1, "p1"),
        change("UPDATE", "z-parent", 8, 11, 1, "p2"),
        change("UPDATE", "a-child", 1, 12, 1, "c1"),
        change("DELETE", "a-child", 2, 13, 1),
        # key 2, one channel whose commit times go backwards (a skewed clock): sequence wins
        change("PUT", "m", 5, 20, 2, "first"),
        change("UPDATE", "m", 6, 19, 2, "second"),
        # key 3: the parent's only change and the child's first share a commit time
        change("PUT", "z-parent", 9, 30, 3, "parent"),
        change("UPDATE", "a-child", 3, 30, 3, "child-1"),
        change("UPDATE", "a-child", 4, 31, 3, "child-2"),
    ]
    shuffled = rows[:]
    random.Random(4).shuffle(shuffled)
    by_key = ordered_changes(batch(*shuffled), ["id"])
    assert [(c.channel_id, c.sequence[-1]) for c in by_key[(1,)]] == [
        ("z-parent", "7"), ("z-parent", "8"), ("a-child", "1"), ("a-child", "2")]
    assert [c.image["name"] for c in by_key[(2,)]] == ["first", "second"]
    assert [c.image["name"] for c in by_key[(3,)]] == ["parent", "child-1", "child-2"]


def test_scd1_keeps_each_keys_final_image_or_its_delete() -> None:
    plan = plan_batch(batch(
        change("PUT", "c", 1, 1, 1, "a", 1),
        change("UPDATE", "c", 2, 2, 1, "a", 2),
        change("PUT", "c", 3, 3, 2, "b", 1),
        change("DELETE", "c", 4, 4, 2),
        change("DELETE", "c", 5, 5, 3),
        change("PUT", "c", 6, 6, 3, "c", 3),
    ), None, ApplyOptions(("id",)), "t")
    assert sorted(upserts(plan), key=lambda r: r["id"]) == [
        {"id": 1, "name": "a", "qty": 2}, {"id": 3, "name": "c", "qty": 3}]
    assert deletes(plan) == [(2,)]


def test_soft_delete_keeps_the_last_image_flagged() -> None:
    plan = plan_batch(batch(
        change("PUT", "c", 1, 1, 1, "a", 1),
        change("DELETE", "c", 2, 2, 1),
        change("DELETE", "c", 3, 3, 2),  # its image is in the table, not in this batch
    ), None, ApplyOptions(("id",), soft_delete_column="_deleted"), "t")
    assert upserts(plan) == [{"id": 1, "name": "a", "qty": 1, "_deleted": True}]
    assert deletes(plan) == [(2,)]


def test_scd2_makes_one_version_per_change_and_a_delete_ends_the_current_one() -> None:
    plan = plan_batch(batch(
        change("PUT", "c", 1, 10, 1, "a"),
        change("UPDATE", "c", 2, 11, 1, "b"),
        change("DELETE", "c", 3, 12, 1),
        change("PUT", "c", 4, 13, 1, "c"),
    ), None, ApplyOptions(("id",), scd=2), "t")
    assert [(r["name"], r["__START_AT"], r["__END_AT"]) for r in upserts(plan)] == [
        ("a", ts(10), ts(11)), ("b", ts(11), ts(12)), ("c", ts(13), None)]
    assert closes(plan) == {(1,): ts(10)}  # the table's open version of key 1 ends here


def test_options_are_checked() -> None:
    with pytest.raises(ApplyOptionError, match="'scd'"):
        ApplyOptions(("id",), scd=3)
    with pytest.raises(ApplyOptionError, match="exception, evolve, try_evolve, lenient, "
                       "ignore .aliases: fail=exception, add=evolve, keep=ignore."):
        ApplyOptions(("id",), schema_drift="drop")
    assert ApplyOptions(("id",)).schema_drift == "lenient"  # the default
    assert [ApplyOptions(("id",), schema_drift=a).schema_drift for a in ("fail", "add", "keep")
            ] == ["exception", "evolve", "ignore"]
    with pytest.raises(ApplyOptionError, match="SCD type 2 already keeps"):
        ApplyOptions(("id",), scd=2, soft_delete_column="_deleted")
    with pytest.raises(TargetUriError, match="absolute"):
        open_apply_sink("delta://relative/path")
    with pytest.raises(TargetUriError, match="table=NAMESPACE.TABLE"):
        open_apply_sink("iceberg:///tmp/wh")
    with pytest.raises(TargetUriError, match="unknown scheme 'hudi'"):
        open_apply_sink("hudi:///tmp/t")


def test_the_iceberg_target_without_pyiceberg_fails_when_made_naming_the_extra(
        monkeypatch) -> None:
    """Without the lakehouse extra the sink is refused where it is made (``replicate`` before
    Spark starts), not in its first batch. (The wheel's real install without the extra:
    integration/test_user_install.py.)"""
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)  # an import of it fails
    for make in (lambda: open_apply_sink("iceberg:///tmp/wh?table=cdc.orders"),
                 lambda: IcebergApplySink(sqlite_catalog_properties("/tmp/wh"), "cdc.orders")):
        with pytest.raises(TargetDependencyError,
                           match=r"the Iceberg target needs pyiceberg, which is not installed: "
                           r"pip install 'tablestore-cdc\[lakehouse\]'"):
            make()


# --- the two targets, real tables ------------------------------------------------------------


@pytest.mark.parametrize("scd", [1, 2])
def test_a_change_log_with_splits_and_a_merge_applies_exactly(target, tmp_path, scd) -> None:
    store = store_with_history(tmp_path / "store.db")
    sink = target.sink(scd=scd)
    for batch_id, page in enumerate(source_batches(store, 70)):
        assert sink.apply(page, "query-1", batch_id).committed
    rows = target.rows()
    source = {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    assert table_state(rows, ["id"]) == source
    if scd == 2:
        log = store.change_log("t")
        assert not history_mismatches(source_history(log), table_history(rows, ["id"]))
        assert len(rows) == sum(r.op.value != "DELETE" for r in log)
    assert any(c.parent_ids for c in store.list_channels("t"))


def test_a_replayed_batch_adds_no_commit(target, tmp_path) -> None:
    store = store_with_history(tmp_path / "store.db", changes=200)
    pages = source_batches(store, 50)
    sink = target.sink(scd=2)
    for batch_id, page in enumerate(pages[:3]):
        sink.apply(page, "query-1", batch_id)
    before, rows = target.commits(), target.rows()
    for batch_id in (2, 1):  # Spark replays the last batch; an older one is skipped too
        result = sink.apply(pages[batch_id], "query-1", batch_id)
        assert not result.committed
    assert (target.commits(), target.rows()) == (before, rows)
    assert sink.committed_batch("query-1") == 2
    # another query (a new checkpoint) is not mistaken for this one: refused, unless it takes
    # the table over on purpose; then its batch 0 applies
    with pytest.raises(ForeignTargetError, match="written by job 'query-1'"):
        sink.apply(pages[3], "query-2", 0)
    assert target.commits() == before
    assert target.sink(scd=2, adopt_target=True).apply(pages[3], "query-2", 0).committed
    assert target.commits() > before


@pytest.mark.parametrize("scd", [1, 2])
def test_deletes_remove_rows_or_end_versions(target, scd) -> None:
    sink = target.sink(scd=scd)
    sink.apply(batch(change("PUT", "c", 1, 1, 1, "a", 1), change("PUT", "c", 2, 2, 2, "b", 2)),
               "q", 0)
    sink.apply(batch(change("DELETE", "c", 3, 3, 1)), "q", 1)
    rows = target.rows()
    assert table_state(rows, ["id"]) == {'{"id": 2}': {"name": "b", "qty": 2}}
    if scd == 2:
        ended = [r for r in rows if r["id"] == 1]
        assert [(r["__START_AT"], r["__END_AT"]) for r in ended] == [(ts(1), ts(3))]


def test_soft_delete_flags_rows(target) -> None:
    sink = target.sink(soft_delete_column="_deleted")
    sink.apply(batch(change("PUT", "c", 1, 1, 1, "a", 1), change("PUT", "c", 2, 2, 2, "b", 2)),
               "q", 0)
    sink.apply(batch(change("DELETE", "c", 3, 3, 1),  # image in the table
                     change("PUT", "c", 4, 4, 3, "c", 3),
                     change("DELETE", "c", 5, 5, 3)),  # image in this batch
               "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    assert {k: (r["name"], r["_deleted"]) for k, r in rows.items()} == {
        1: ("a", True), 2: ("b", False), 3: ("c", True)}
    sink.apply(batch(change("PUT", "c", 6, 6, 1, "again", 9)), "q", 2)  # back to life
    assert table_state(target.rows(), ["id"], soft_delete_column="_deleted") == {
        '{"id": 1}': {"name": "again", "qty": 9}, '{"id": 2}': {"name": "b", "qty": 2}}


# --- schema drift: a column appears mid-stream ------------------------------------------------


def test_drift_fail_stops_naming_the_column_and_changes_nothing(target) -> None:
    sink = target.sink(schema_drift="fail")
    sink.apply(FIRST, "q", 0)
    commits, rows = target.commits(), target.rows()
    with pytest.raises(SchemaDriftError, match=r"new column\(s\) \['colour', 'size'\]"):
        sink.apply(WITH_COLOUR, "q", 1)
    assert (target.commits(), target.rows()) == (commits, rows)


def test_drift_add_evolves_the_table_with_nullable_columns(target) -> None:
    sink = target.sink(schema_drift="add")
    sink.apply(FIRST, "q", 0)
    sink.apply(WITH_COLOUR, "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    assert {k: (r["colour"], r["size"]) for k, r in rows.items()} == {
        1: ("blue", None), 2: ("red", 7)}
    sink.apply(batch(change("PUT", "c", 4, 4, 3, "c", 3)), "q", 2)  # no colour: null
    assert {r["id"]: r["colour"] for r in target.rows()}[3] is None
    with pytest.raises(ColumnTypeConflictError, match="column 'size' is int64 but the change "
                       "in channel 'c' at 00000000000000000005 carries string .'large'."):
        sink.apply(batch(change("PUT", "c", 5, 5, 4, "d", 4, size="large")), "q", 3)


def test_drift_keep_holds_new_attributes_as_json(target) -> None:
    sink = target.sink(schema_drift="keep")
    sink.apply(FIRST, "q", 0)
    sink.apply(WITH_COLOUR, "q", 1)
    rows = {r["id"]: r for r in target.rows()}
    assert "colour" not in rows[1]
    assert json.loads(rows[1]["_extra"]) == {"colour": "blue"}
    assert json.loads(rows[2]["_extra"]) == {"colour": "red", "size": 7}
    assert table_state(target.rows(), ["id"])['{"id": 2}'] == {
        "name": "b", "qty": 2, "colour": "red", "size": 7}


def test_a_value_of_another_type_fails_only_under_the_strict_policies(target) -> None:
    """A string in the declared long column ``qty``: exception and evolve fail the batch
    naming it; try_evolve, lenient and ignore keep it, typed, in ``_extra``."""
    bad = batch(change("PUT", "c", 2, 2, 2, "b", 2)).set_column(
        2, pa.field("qty", pa.string()), pa.array(["two"]))
    for policy in ("exception", "evolve"):
        sink = target.sink(schema_drift=policy)
        sink.apply(FIRST, "q", 0)
        with pytest.raises(ColumnTypeConflictError, match=(
                f"column 'qty' is int64 but the change in channel 'c' at 00000000000000000002 "
                f"carries string .'two'.* schema_drift={policy}")):
            sink.apply(bad, "q", 1)
    for batch_id, policy in enumerate(("try_evolve", "lenient", "ignore"), start=1):
        sink = target.sink(schema_drift=policy)
        result = sink.apply(bad, "q", batch_id)
        assert result.values_in_extra == 1
        rows = {r["id"]: r for r in target.rows()}
        assert (rows[2]["qty"], json.loads(rows[2]["_extra"])) == (None, {"qty": "two"})
        assert table_state(target.rows(), ["id"])['{"id": 2}'] == {"name": "b", "qty": "two"}


# --- a lost commit race ---------------------------------------------------------------------


def test_a_commit_lost_to_another_writer_is_retried_and_a_zombie_batch_is_not_doubled(
        target, tmp_path) -> None:
    """Another writer commits between the sink's read and its commit (a real commit of the
    same format): the sink's commit is refused, it reloads and re-plans. When that writer was
    a zombie attempt of the same batch, the retry finds the batch recorded and skips it."""
    sink = target.sink(scd=2)
    sink.apply(FIRST, "q", 0)
    zombie = target.sink(scd=2)
    other = batch(change("PUT", "c", 2, 2, 9, "other", 9))
    raced: list[str] = []

    def race_once() -> None:
        if not raced:
            raced.append("x")
            zombie.apply(WITH_COLOUR.drop_columns(["_extra"]).append_column(
                "_extra", pa.nulls(2, pa.string())), "q", 1)

    sink._before_commit = race_once  # type: ignore[method-assign]
    result = sink.apply(WITH_COLOUR.drop_columns(["_extra"]).append_column(
        "_extra", pa.nulls(2, pa.string())), "q", 1)
    assert (result.committed, result.attempts) == (False, 2)
    assert len([r for r in target.rows() if r["id"] == 2]) == 1
    raced.clear()
    sink._before_commit = lambda: raced or (raced.append("x"), target.other_writer(other, 2))
    result = sink.apply(batch(change("PUT", "c", 5, 5, 3, "c", 3)), "q", 2)
    assert result.committed  # delta-rs may rebase a disjoint commit itself: 1 or 2 attempts
    assert {r["id"] for r in target.rows() if r["__END_AT"] is None} == {1, 2, 3, 9}
    # a zombie of a batch of new keys only: an append that would rebase cleanly
    new_keys = batch(change("PUT", "c", 7, 7, 20, "n", 1), change("PUT", "c", 8, 8, 21, "m", 2))
    raced.clear()
    sink._before_commit = lambda: raced or (raced.append("x"), zombie.apply(new_keys, "q", 3))
    result = sink.apply(new_keys, "q", 3)
    assert (result.committed, result.attempts) == (False, 2)
    assert sorted(r["id"] for r in target.rows() if r["id"] >= 20) == [20, 21]



def test_replicate_refuses_a_bad_target_or_policy_before_starting_spark(tmp_path) -> None:
    import subprocess
    import sys

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
    base = [sys.executable, "-m", "tablestore_cdc", "replicate", "--store", str(store.path),
            "--table", "t", "--output", str(tmp_path / "out")]
    for extra, message in (
            (["--schema-drift", "drop"], "option '--schema-drift': unknown policy"),
            (["--target", "iceberg:///tmp/wh"], "table=NAMESPACE.TABLE is required"),
            (["--scd", "2", "--soft-delete-column", "_deleted"], "SCD type 2 already keeps")):
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr


def test_an_iceberg_stream_of_overwrites_keeps_its_manifests_few(tmp_path) -> None:
    """Every batch that touches held keys is an overwrite; pyiceberg's overwrite carried every
    manifest over (those recording only files an earlier snapshot deleted included) and never
    merged, so each batch added two manifests that every later batch read. The sink drops
    the dead ones and merges at the table's ``commit.manifest.min-count-to-merge``."""
    from pyiceberg.catalog import load_catalog

    from tablestore_cdc.lakehouse.iceberg import MANIFEST_MERGING

    store = store_with_history(tmp_path / "store.db", changes=900)
    target = Iceberg(tmp_path)
    sink = target.sink(scd=1)
    most = int(MANIFEST_MERGING["commit.manifest.min-count-to-merge"]) + 1
    counts = []
    for batch_id, page in enumerate(source_batches(store, 25)):
        assert sink.apply(page, "query-1", batch_id).committed
        table = load_catalog("tablestore_cdc", **target.properties).load_table("cdc.orders")
        snapshot = table.current_snapshot()
        manifests = snapshot.manifests(table.io)
        counts.append(len(manifests))
        assert all(m.has_added_files() or m.has_existing_files()
                   or m.added_snapshot_id == snapshot.snapshot_id for m in manifests)
    assert max(counts) <= most < len(counts) // 2, counts
    assert table.properties["commit.manifest-merge.enabled"] == "true"
    assert table_state(target.rows(), ["id"]) == {
        k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
