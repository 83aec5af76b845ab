"""A batch whose keys are all new to the table is appended, not merged (tablestore_cdc
.lakehouse.pruning): the first load of a table read by two channels at once, a stream of new
keys, the switch to MERGE when a key is already there, exactly once across the switch and
across a SIGKILL during an appended batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyiceberg")

from deltalake import DeltaTable  # noqa: E402

from tablestore_cdc.lakehouse.pruning import candidates  # noqa: E402
from tablestore_cdc.verify import read_delta, table_state  # noqa: E402
from testkit.crash_points import environment as crash_environment  # noqa: E402
from testkit.lakehouse import Delta, Iceberg, batch, change, string_keyed  # noqa: E402
from testkit.processes import REPO  # noqa: E402


def test_statistics_tell_a_key_is_absent_only_when_no_range_holds_it() -> None:
    def may_hold(keys: pa.Array, lows: list, highs: list) -> bool:  # any file may hold a key
        return bool(candidates(keys, lows, highs).any())

    keys = pa.array([5, 50, 500], pa.int64())
    assert not may_hold(keys, [], [])  # an empty table
    assert not may_hold(keys, [0, 6, 501], [4, 49, 900])
    assert may_hold(keys, [0, 6, 501], [4, 50, 900])
    assert may_hold(keys, [None], [10])  # a file without statistics
    assert not may_hold(pa.array(["b", "d"]), ["a", "c", "e"], ["aa", "cz", "f"])
    assert may_hold(pa.array(["b", "d"]), ["a"], ["bb"])
    assert may_hold(pa.array([1.5]), [0.0], [1.0])  # doubles: never compared


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(-50, 50), max_size=30),
       files=st.lists(st.tuples(st.integers(-60, 60), st.integers(0, 20)), max_size=12),
       strings=st.booleans(), arrays=st.booleans())
def test_the_files_a_key_may_be_in_are_exactly_those_whose_range_holds_it(
        keys: list[int], files: list[tuple[int, int]], strings: bool, arrays: bool) -> None:
    """``pruning.candidates`` against the plain rule: a file may hold a key when
    low <= key <= high (string keys compared as the formats order them: by bytes); the
    bounds as Python values (Iceberg's) or as Arrow arrays (Delta's statistics)."""
    def value(v: int) -> Any:
        return f"k{v + 100:03d}" if strings else v

    lows = [value(low) for low, _ in files]
    highs = [value(low + width) for low, width in files]
    array = pa.array([value(k) for k in keys], pa.string() if strings else pa.int64())
    expected = [any(lo <= value(k) <= hi for k in keys) for lo, hi in zip(lows, highs,
                                                                          strict=True)]
    bounds = (pa.array(lows), pa.array(highs)) if arrays and files else (lows, highs)
    assert list(candidates(array, *bounds)) == expected


def snapshot_batches(rows_per_channel: int = 40, per_batch: int = 10) -> list[pa.Table]:
    """A first load read by two channels at once, each in key order: channel ``a`` keys 0..,
    channel ``b`` keys 1000..; every batch holds a slice of both (ranges interleave)."""
    out = []
    for start in range(0, rows_per_channel, per_batch):
        rows = []
        for channel, base in (("a", 0), ("b", 1000)):
            for i in range(start, start + per_batch):
                rows.append(change("PUT", channel, i + 1, 1 + i, base + i, f"n{base + i}", i))
        out.append(batch(*rows))
    return out


def data_operations(target: Delta | Iceberg) -> list[str]:
    """The kind of each data commit: Delta's commit operations, Iceberg's snapshot ones."""
    if target.name == "delta":
        return [h["operation"] for h in reversed(DeltaTable(target.path).history())
                if h["operation"] in ("WRITE", "MERGE")]
    from pyiceberg.catalog import load_catalog

    table = load_catalog("tablestore_cdc", **target.properties).load_table("cdc.orders")
    return [str(s.summary.operation.value) for s in table.metadata.snapshots]


@pytest.mark.parametrize("scd", [1, 2])
def test_a_first_load_appends_and_the_stream_after_it_merges(target, scd) -> None:
    sink = target.sink(scd=scd)
    loads = snapshot_batches()
    results = [sink.apply(b, "q", i) for i, b in enumerate(loads)]
    assert all(r.appended and r.committed for r in results)
    assert set(data_operations(target)) == ({"WRITE"} if target.name == "delta" else {"append"})
    expected = {json.dumps({"id": k}): {"name": f"n{k}", "qty": k % 1000}
                for k in [*range(40), *range(1000, 1040)]}
    assert table_state(target.rows(), ["id"]) == expected
    before = target.commits()
    assert not sink.apply(loads[-1], "q", len(loads) - 1).committed  # a replay: nothing
    assert target.commits() == before
    # the stream: an update of a loaded key merges; then keys beyond the table append again
    update = sink.apply(batch(change("UPDATE", "a", 100, 100, 7, "seven", 77),
                              change("DELETE", "b", 100, 100, 1003)), "q", len(loads))
    fresh = sink.apply(batch(change("PUT", "a", 101, 101, 5000, "new", 1)), "q", len(loads) + 1)
    assert (update.appended, fresh.appended) == (False, True)
    expected[json.dumps({"id": 7})] = {"name": "seven", "qty": 77}
    del expected[json.dumps({"id": 1003})]
    expected[json.dumps({"id": 5000})] = {"name": "new", "qty": 1}
    assert table_state(target.rows(), ["id"]) == expected
    if scd == 2:
        versions = [r for r in target.rows() if r["id"] == 7]
        assert sorted((r["name"], r["__END_AT"] is None) for r in versions) == [
            ("n7", False), ("seven", True)]


def test_a_string_key_in_a_rewritten_file_is_found_and_changed(tmp_path: Path) -> None:
    """A string key: a key held in a rewritten file must be changed there, a new key in its
    range appended. (delta-rs' MERGE stores a rewritten string key as ``string_view``, beside
    files that store it as ``string``, and the probe once found no kernel for the mixed types:
    tests/test_lakehouse_rewrite.py reads such files.)"""
    from tablestore_cdc.lakehouse import DeltaApplySink

    path = str(tmp_path / "orders")
    sink = DeltaApplySink(path, key_columns=["k"])

    def apply(batch_id: int, *rows: tuple[str, str, str]) -> Any:
        return sink.apply(string_keyed(batch_id, *rows), "q", batch_id)

    assert apply(0, ("PUT", "a", "a0"), ("PUT", "m", "m0")).appended
    assert not apply(1, ("UPDATE", "a", "a1")).appended  # merged: the file is rewritten
    assert not apply(2, ("UPDATE", "a", "a2"), ("PUT", "c", "c2")).appended
    assert apply(3, ("PUT", "b", "b3")).appended  # in the files' range, held by none
    assert table_state(read_delta(path), ["k"]) == {
        json.dumps({"k": k}): {"name": name}
        for k, name in (("a", "a2"), ("b", "b3"), ("c", "c2"), ("m", "m0"))}


KILL_SCRIPT = """
import sys, time
from pathlib import Path
from testkit.lakehouse import Delta, Iceberg
from tests.test_lakehouse_firstload import snapshot_batches
target = (Delta if sys.argv[1] == "delta" else Iceberg)(Path(sys.argv[2]))
faults = Path(sys.argv[3])
sink = target.sink()
for i, b in enumerate(snapshot_batches()):
    if i == 2:  # two batches loaded: wait for the crash point to be armed
        (faults / "loaded-two").touch()
        while not (faults / "arm-before_target_commit").exists():
            time.sleep(0.02)
    sink.apply(b, "q", i)
"""


def test_a_kill_during_a_first_load_resumes_exactly_once(target, tmp_path) -> None:
    """SIGKILL at ``before_target_commit`` of the third appended batch (its files may be
    written, the commit is not), then the load again from its first batch, as Spark replays."""
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {**os.environ, **crash_environment(faults, str(REPO))}
    process = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, target.name, str(tmp_path),
                                str(faults)], cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (faults / "loaded-two").exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        (faults / ".arm").write_text("park")
        (faults / ".arm").rename(faults / "arm-before_target_commit")
        while not (faults / "hit-before_target_commit").exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    killed_at = _committed(target)
    assert killed_at == 2
    sink = target.sink()
    results = [sink.apply(b, "q", i) for i, b in enumerate(snapshot_batches())]
    assert [r.committed for r in results] == [i >= killed_at for i in range(4)]
    assert all(r.appended for r in results if r.committed)
    assert len(target.rows()) == 80
    assert table_state(target.rows(), ["id"]) == {
        json.dumps({"id": k}): {"name": f"n{k}", "qty": k % 1000}
        for k in [*range(40), *range(1000, 1040)]}


def _committed(target: Delta | Iceberg) -> int:
    """Batches of query q in the table (0 when it does not exist yet)."""
    try:
        recorded = target.sink().committed_batch("q")
    except Exception:  # the table is being created
        return 0
    return 0 if recorded is None else recorded + 1


def test_lake_optimize_compacts_beside_the_stream_and_never_fails_a_batch(tmp_path) -> None:
    """``tablestore-cdc lake optimize``: fewer files, the same rows; a compaction that commits
    between a batch's read and its commit makes the batch retry, once, exactly."""
    from tablestore_cdc.lakehouse.errors import TargetUriError
    from tablestore_cdc.lakehouse.maintenance import optimize

    target = Delta(tmp_path)
    sink = target.sink()
    for i, b in enumerate(snapshot_batches()):
        sink.apply(b, "q", i)
    sink.apply(batch(change("UPDATE", "a", 100, 100, 7, "seven", 77)), "q", 4)
    rows = table_state(target.rows(), ["id"])
    before = len(DeltaTable(target.path).file_uris())
    result = optimize(f"delta://{target.path}", vacuum_hours=0)
    assert result.compacted and result.files_after < before == result.files_before
    assert result.files_removed >= before - 1  # the compacted files, no longer referenced
    assert table_state(target.rows(), ["id"]) == rows
    raced: list[object] = []
    sink._before_commit = lambda: raced or raced.append(  # type: ignore[method-assign]
        optimize(f"delta://{target.path}"))
    committed = sink.apply(batch(change("UPDATE", "b", 101, 101, 1005, "five", 5)), "q", 5)
    assert committed.committed and committed.attempts == 2
    rows['{"id": 1005}'] = {"name": "five", "qty": 5}
    assert table_state(target.rows(), ["id"]) == rows
    with pytest.raises(TargetUriError, match="no table there yet"):
        optimize(f"iceberg://{tmp_path}/wh?table=cdc.orders", vacuum_hours=1)


def test_lake_optimize_command_reports_in_one_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app

    target = Delta(tmp_path)
    target.sink().apply(snapshot_batches()[0], "q", 0)
    target.sink().apply(snapshot_batches()[1], "q", 1)
    done = CliRunner().invoke(app, ["lake", "optimize", "--target", f"delta://{target.path}"])
    assert done.exit_code == 0 and done.output.strip().endswith("compacted into 1"), done.output
    missing = CliRunner().invoke(app, ["lake", "optimize", "--target",
                                       f"delta://{tmp_path}/none"])
    assert missing.exit_code == 2 and missing.output.count("\n") == 1
    assert "error: target" in missing.output and "no table there yet" in missing.output


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 30), st.integers(1, 6)),
                     min_size=1, max_size=40),
       shuffle=st.randoms(use_true_random=False))
def test_appended_rows_are_cut_into_whole_channels_when_their_key_ranges_are_disjoint(
        runs: list[tuple[int, int, int]], shuffle: Any) -> None:
    """``layout.file_groups`` against the plain rule: the groups are the rows in key order;
    when no two channels' key ranges meet, each group holds whole channels (at most
    ``MAX_FILES`` groups, channels split as evenly as the cut allows), else there is one
    group. Runs: (channel, first key, keys)."""
    from tablestore_cdc.lakehouse.layout import MAX_FILES, file_groups

    rows = [(key, f"ch{channel}") for channel, low, count in runs
            for key in range(low, low + count)]
    shuffle.shuffle(rows)
    table = pa.table({"id": pa.array([k for k, _ in rows], pa.int64())})
    channels = pa.array([c for _, c in rows])
    groups = file_groups(table, channels, "id")
    keys = [k for g in groups for k in g.column("id").to_pylist()]
    assert keys == sorted(k for k, _ in rows) and all(g.num_rows for g in groups)
    ranges: dict[str, list[int]] = {}
    for key, channel in rows:
        low_high = ranges.setdefault(channel, [key, key])
        low_high[0], low_high[1] = min(low_high[0], key), max(low_high[1], key)
    spans = sorted(ranges.values())
    disjoint = all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    if not disjoint or len(spans) == 1:
        assert len(groups) == 1
        return
    per_file = -(-len(spans) // MAX_FILES)
    expected = [spans[i:i + per_file] for i in range(0, len(spans), per_file)]
    assert [(g.column("id")[0].as_py(), g.column("id")[-1].as_py()) for g in groups] == [
        (part[0][0], part[-1][1]) for part in expected]


def test_lake_optimize_vacuums_the_unreferenced_files_of_an_iceberg_table(tmp_path) -> None:
    """pyiceberg has no compaction nor orphan removal: ``lake optimize --vacuum-hours N`` on
    an Iceberg target removes the data files no snapshot references (a batch killed before its
    commit) older than N hours, keeps younger ones and every referenced file (an older
    snapshot's too), and leaves the rows as they were."""
    import shutil

    from tablestore_cdc.lakehouse.errors import TargetUriError
    from tablestore_cdc.lakehouse.maintenance import describe, optimize

    target = Iceberg(tmp_path)
    sink = target.sink()
    for i, b in enumerate(snapshot_batches()):
        sink.apply(b, "q", i)
    sink.apply(batch(change("UPDATE", "a", 100, 100, 7, "seven", 77)), "q", 4)  # rewrites
    rows = table_state(target.rows(), ["id"])
    uri = f"iceberg://{tmp_path}/warehouse?table=cdc.orders"
    data = next((tmp_path / "warehouse").rglob("data"))
    referenced = sorted(data.rglob("*.parquet"))
    old, young = data / "00000-0-killed-old.parquet", data / "00000-0-killed-young.parquet"
    for orphan in (old, young):
        shutil.copy(referenced[0], orphan)
    os.utime(old, (time.time() - 3 * 3600, time.time() - 3 * 3600))
    result = optimize(uri, vacuum_hours=2)
    assert result.files_removed == 1 and not old.exists() and young.exists()
    assert all(p.exists() for p in referenced)  # the replaced files: an old snapshot's
    assert table_state(target.rows(), ["id"]) == rows
    assert describe(result).endswith("1 unreferenced file(s) removed")
    with pytest.raises(TargetUriError, match="give --expire-hours N"):
        optimize(uri)
