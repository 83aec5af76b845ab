"""Copy-on-write into Delta (``delta._held_files``, ``rewrite.py``): a stream batch rewrites only
the files that hold its keys, in files of bounded size, and leaves the same rows as delta-rs'
MERGE; a commit made on a version another writer has moved past is refused, and so is a
compaction's after a batch's; every file the sink writes carries a null count per column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tablestore_cdc.lakehouse import END_AT, DeltaApplySink
from tablestore_cdc.lakehouse.rewrite import rewrite_groups
from tablestore_cdc.verify import read_delta, table_state
from testkit.lakehouse import Delta, batch, change, string_keyed


def file_paths(path: str) -> set[str]:
    return set(pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path")
               .to_pylist())


def operations(path: str) -> list[str]:
    """The operation of every commit after the table's creation, oldest first."""
    return [h["operation"] for h in reversed(DeltaTable(path).history())][1:]


def load(sink: DeltaApplySink, channels: int = 4, per_channel: int = 25) -> dict[str, Any]:
    """One first-load batch: channel c holds keys [100c, 100c + per_channel), each channel's
    rows a file of their own (layout.py). Returns the table state it leaves."""
    rows = [change("PUT", f"ch{c}", i + 1, 1, 100 * c + i, f"n{100 * c + i}", i)
            for c in range(channels) for i in range(per_channel)]
    assert sink.apply(batch(*rows), "q", 0).appended
    return {json.dumps({"id": r["id"]}): {"name": r["name"], "qty": r["qty"]} for r in rows}


def test_a_batch_rewrites_only_the_files_that_hold_its_keys(tmp_path: Path) -> None:
    target = Delta(tmp_path)
    sink = target.sink()
    expected = load(sink)
    before = file_paths(target.path)
    assert len(before) == 4
    result = sink.apply(batch(change("UPDATE", "ch1", 50, 2, 107, "seven", 7),
                              change("DELETE", "ch1", 51, 2, 110),
                              change("PUT", "ch1", 52, 2, 150, "new", 1)), "q", 1)
    assert result.committed and not result.appended
    after = file_paths(target.path)
    assert len(before - after) == 1 and len(after - before) == 1  # channel 1's file, rewritten
    expected[json.dumps({"id": 107})] = {"name": "seven", "qty": 7}
    del expected[json.dumps({"id": 110})]
    expected[json.dumps({"id": 150})] = {"name": "new", "qty": 1}
    assert table_state(target.rows(), ["id"]) == expected
    assert operations(target.path) == ["WRITE", "WRITE"]  # an append, then the rewrite
    assert not sink.apply(batch(change("DELETE", "ch1", 51, 2, 110)), "q", 1).committed


def test_a_commit_on_a_version_another_writer_moved_past_is_refused_and_retried(
        tmp_path: Path) -> None:
    """delta-rs would rebase a commit onto a newer version without checking that the files it
    removes are still there; the sink's commit is refused instead, and the batch re-planned."""
    target = Delta(tmp_path)
    sink = target.sink()
    expected = load(sink)
    raced: list[bool] = []

    def other_writer_first() -> None:
        if not raced:  # a foreign row appended between the sink's read and its commit
            raced.append(True)
            target.other_writer(batch(change("PUT", "x", 1, 1, 999, "other", 9)), scd=1)

    sink._before_commit = other_writer_first  # type: ignore[method-assign]
    result = sink.apply(batch(change("UPDATE", "ch0", 50, 2, 3, "three", 3)), "q", 1)
    assert result.committed and result.attempts == 2
    expected[json.dumps({"id": 3})] = {"name": "three", "qty": 3}
    expected[json.dumps({"id": 999})] = {"name": "other", "qty": 9}
    assert table_state(target.rows(), ["id"]) == expected


def test_a_compaction_that_read_the_files_a_batch_replaced_is_refused(tmp_path: Path) -> None:
    target = Delta(tmp_path)
    sink = target.sink()
    expected = load(sink)
    compaction = DeltaTable(target.path)  # reads the table as it was before the batch
    sink.apply(batch(change("UPDATE", "ch2", 50, 2, 205, "five", 5)), "q", 1)
    with pytest.raises(CommitFailedError):
        compaction.optimize.compact()
    expected[json.dumps({"id": 205})] = {"name": "five", "qty": 5}
    assert table_state(target.rows(), ["id"]) == expected


def test_every_written_file_counts_the_nulls_of_every_column(tmp_path: Path) -> None:
    """delta-rs' readers take a column missing from a file's null counts as holding no null:
    with only the key's counts, an ``IS NULL`` filter on ``__END_AT`` found no open version
    of a table loaded by appends (``reconcile`` then reported every key missing)."""
    target = Delta(tmp_path)
    sink = target.sink(scd=2)
    load(sink)
    sink.apply(batch(change("UPDATE", "ch0", 50, 2, 3, "three", 3)), "q", 1)
    dataset = DeltaTable(target.path).to_pyarrow_dataset()
    assert dataset.to_table(filter=pc.field(END_AT).is_null()).num_rows == 100
    assert dataset.to_table(filter=pc.field(END_AT).is_valid()).num_rows == 1
    assert dataset.to_table(filter=pc.field("name").is_null()).num_rows == 0


def test_a_table_with_rules_a_writer_must_enforce_is_merged_by_delta_rs(tmp_path: Path) -> None:
    target = Delta(tmp_path)
    sink = target.sink()
    expected = load(sink)
    DeltaTable(target.path).alter.add_constraint({"id_not_negative": "id >= 0"})
    sink.apply(batch(change("UPDATE", "ch0", 50, 2, 3, "three", 3)), "q", 1)
    assert operations(target.path)[-1] == "MERGE"
    expected[json.dumps({"id": 3})] = {"name": "three", "qty": 3}
    assert table_state(target.rows(), ["id"]) == expected


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(0, 60), max_size=200), max_rows=st.integers(1, 50),
       max_bytes=st.integers(1, 4000))
def test_rewritten_rows_are_cut_into_even_files_each_a_range_of_keys(keys: list[int], max_rows: int,
                                                             max_bytes: int) -> None:
    rows = pa.table({"id": pa.array(keys, pa.int64()),
                     "pad": pa.array([k * 3 for k in keys], pa.int64())})
    groups = rewrite_groups(rows, "id", max_rows=max_rows, max_bytes=max_bytes)
    cut = [k for g in groups for k in g.column("id").to_pylist()]
    assert cut == (keys if len(groups) == 1 else sorted(keys))  # several: ranges of keys
    sizes = [g.num_rows for g in groups]
    assert all(0 < s <= max_rows for s in sizes)
    assert all(g.nbytes <= max(max_bytes, 16) for g in groups)  # 16: one row's bytes
    assert max(sizes, default=0) - min(sizes, default=0) <= 1


OPS = st.sampled_from(["PUT", "UPDATE", "DELETE"])
CHANGES = st.lists(st.tuples(OPS, st.integers(0, 30), st.integers(0, 9)), min_size=1,
                   max_size=25)


@pytest.mark.parametrize("options", [{"scd": 1}, {"scd": 2},
                                     {"scd": 1, "soft_delete_column": "_deleted"}],
                         ids=["scd1", "scd2", "soft-delete"])
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(CHANGES, min_size=1, max_size=4))
def test_copy_on_write_leaves_the_rows_delta_rs_merge_leaves(
        tmp_path_factory: pytest.TempPathFactory, options: dict[str, Any],
        batches: list[list[tuple[str, int, int]]]) -> None:
    """The same changes into two tables, one rewritten by the sink, one (a CHECK constraint on
    it) merged by delta-rs: their rows are equal after every batch, versions and flags too."""
    root = tmp_path_factory.mktemp("cow")
    first = [change("PUT", "c", i + 1, 1, i, f"n{i}", i) for i in range(0, 30, 3)]
    sinks, paths = [], []
    for name in ("rewrite", "merge"):
        path = str(root / name)
        sink = DeltaApplySink(path, key_columns=["id"], **options)
        sink.apply(batch(*first), "q", 0)
        sinks.append(sink)
        paths.append(path)
    DeltaTable(paths[1]).alter.add_constraint({"id_not_negative": "id >= 0"})
    sequence = 100
    for batch_id, changes in enumerate(batches, start=1):
        rows = []
        for op, key, qty in changes:
            sequence += 1
            rows.append(change(op, "c", sequence, sequence, key,
                               None if op == "DELETE" else f"v{sequence}",
                               None if op == "DELETE" else qty))
        for sink in sinks:
            sink.apply(batch(*rows), "q", batch_id)
        rewritten, merged = (sorted(read_delta(p), key=lambda r: json.dumps(r, default=str))
                             for p in paths)
        assert rewritten == merged
    assert "MERGE" not in operations(paths[0])


def test_files_delta_rs_merged_before_are_read_and_rewritten(tmp_path: Path) -> None:
    """A table whose files delta-rs' MERGE wrote (as a table with a CHECK constraint, or one
    from before the sink rewrote files itself; delta-rs stores a rewritten string key as
    ``string_view``) is rewritten by the sink once the constraint is gone."""
    path = str(tmp_path / "orders")
    sink = DeltaApplySink(path, key_columns=["k"])

    def apply(batch_id: int, *rows: tuple[str, str, str]) -> Any:
        return sink.apply(string_keyed(batch_id, *rows), "q", batch_id)

    apply(0, ("PUT", "a", "a0"), ("PUT", "m", "m0"), ("PUT", "z", "z0"))
    DeltaTable(path).alter.add_constraint({"k_set": "k IS NOT NULL"})
    apply(1, ("UPDATE", "a", "a1"), ("PUT", "c", "c1"))
    # a key in the MERGE-written file's range, held by no file: probed, then appended
    assert apply(2, ("PUT", "d", "d2")).appended
    DeltaTable(path).alter.drop_constraint("k_set")
    apply(3, ("UPDATE", "c", "c3"), ("DELETE", "m", "-"), ("PUT", "b", "b3"))
    assert operations(path)[-5:] == ["ADD CONSTRAINT", "MERGE", "WRITE", "DROP CONSTRAINT",
                                     "WRITE"]
    assert table_state(read_delta(path), ["k"]) == {
        json.dumps({"k": k}): {"name": name}
        for k, name in (("a", "a1"), ("b", "b3"), ("c", "c3"), ("d", "d2"), ("z", "z0"))}


def test_a_batch_whose_files_hold_too_many_rows_to_rewrite_here_is_merged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy-on-write holds the files it rewrites in the driver's memory: past
    ``REWRITE_MAX_ROWS`` rows the batch goes through delta-rs' MERGE; below, and for keys
    no file holds, the sink writes the files itself."""
    from tablestore_cdc.lakehouse import rewrite

    target = Delta(tmp_path)
    sink = target.sink()
    expected = load(sink)  # four files of 25 rows
    monkeypatch.setattr(rewrite, "REWRITE_MAX_ROWS", 40)
    sink.apply(batch(change("UPDATE", "ch0", 50, 2, 3, "three", 3)), "q", 1)  # one file: 25
    assert operations(target.path)[-1] == "WRITE"
    sink.apply(batch(change("UPDATE", "ch1", 50, 3, 101, "one", 1),
                     change("DELETE", "ch2", 50, 3, 202)), "q", 2)  # two files: 50
    assert operations(target.path)[-1] == "MERGE"
    assert sink.apply(batch(change("PUT", "ch3", 50, 4, 999, "new", 9)), "q", 3).appended
    assert operations(target.path)[-1] == "WRITE"
    expected[json.dumps({"id": 3})] = {"name": "three", "qty": 3}
    expected[json.dumps({"id": 101})] = {"name": "one", "qty": 1}
    del expected[json.dumps({"id": 202})]
    expected[json.dumps({"id": 999})] = {"name": "new", "qty": 9}
    assert table_state(target.rows(), ["id"]) == expected


def test_a_table_in_a_directory_whose_name_needs_escaping(tmp_path: Path) -> None:
    """delta-rs gives the table's location percent-encoded (``my%20lake``): the sink writes
    and rewrites its files in the directory itself (it once wrote into ``my%20lake``, which
    does not exist, and every batch failed)."""
    target = Delta(tmp_path / "my lake")
    sink = target.sink()
    expected = load(sink)
    sink.apply(batch(change("UPDATE", "ch0", 50, 2, 3, "three", 3)), "q", 1)
    assert operations(target.path)[-1] == "WRITE"
    expected[json.dumps({"id": 3})] = {"name": "three", "qty": 3}
    assert table_state(target.rows(), ["id"]) == expected
    assert not (tmp_path / "my%20lake").exists()
