"""The path rewrite of a moved ``--output`` (``tablestore_cdc.pipeline.relocation``) on log files
written as Spark writes them (a version line, one JSON object per line, a ``.N.crc`` beside):
both logs name each file by the same new URI, checksums go, other fields stay, a rerun is a
no-op, a rewrite killed half-way is finished by the next start, damaged logs and a target left
under the old directory are refused in one line. The real job moved and resumed is
``test_relocation_spark.py``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tablestore_cdc.pipeline import relocation
from tablestore_cdc.pipeline.relocation import (
    MovedTargetError,
    PathLogError,
    check_targets,
    hadoop_uri,
    moved_from,
    relocate,
)

SINK_LOG = Path("changelog") / "_spark_metadata"
SOURCE_LOG = Path("_checkpoints") / "apply" / "sources" / "0"


def write_job(out: Path, batches: int = 3) -> None:
    """An output directory's two path logs after ``batches`` change-log batches, one file
    each, written by hand in Spark's form (``N``, ``.N.crc``, no final newline); the
    source log holds the first ``batches - 1`` batches' files (the last one not yet taken)."""
    for folder in (SINK_LOG, SOURCE_LOG):
        (out / folder).mkdir(parents=True)
    for n in range(batches):
        uri = f"file://{out}/changelog/part-0000{n}-c000.snappy.parquet"
        sink = {"path": uri, "size": 900 + n, "isDir": False, "modificationTime": 17965 + n,
                "blockReplication": 1, "blockSize": 33554432, "action": "add"}
        _write(out / SINK_LOG / str(n), "v1\n" + json.dumps(sink, separators=(",", ":")))
        if n < batches - 1:
            source = {"path": uri, "timestamp": 17965 + n, "batchId": n}
            _write(out / SOURCE_LOG / str(n), "v1\n" + json.dumps(source,
                                                                  separators=(",", ":")))


def _write(file: Path, text: str) -> None:
    file.write_text(text)
    (file.parent / f".{file.name}.crc").write_bytes(b"crc of the old bytes")


def entries(out: Path) -> list[dict[str, object]]:
    found = []
    for folder in (SINK_LOG, SOURCE_LOG):
        for file in sorted((out / folder).iterdir()):
            if not file.name.startswith("."):
                lines = file.read_text().split("\n")
                assert lines[0] == "v1"
                found += [json.loads(line) for line in lines[1:]]
    return found


def test_a_moved_output_points_both_logs_here_and_a_rerun_changes_nothing(
        tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "out", tmp_path / "new" / "job(2)"
    write_job(old)
    before = entries(old)
    assert moved_from(old) is None and relocate(old) is None  # in place: nothing to do
    new.parent.mkdir()
    shutil.move(old, new)

    assert moved_from(new) == old
    assert relocate(new) == old
    after = entries(new)
    assert [e["path"] for e in after] == [
        str(e["path"]).replace(f"file://{old}/", f"file://{new}/") for e in before]
    assert [{k: v for k, v in e.items() if k != "path"} for e in after] == [
        {k: v for k, v in e.items() if k != "path"} for e in before]
    assert not list(new.rglob("*.crc"))  # Spark reads a log file without its checksum
    assert not list(new.rglob("*.relocating"))
    assert (new / SINK_LOG / "0").read_text().count("\n") == 1  # no newline added
    snapshot = {f: f.read_bytes() for f in new.rglob("*") if f.is_file()}
    assert moved_from(new) is None and relocate(new) is None
    assert snapshot == {f: f.read_bytes() for f in new.rglob("*") if f.is_file()}


def test_a_rewrite_killed_half_way_is_finished_by_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    write_job(old, batches=4)
    shutil.copytree(old, new)  # cp -a: the old directory stays
    real_replace, calls = os.replace, []

    def killed_on_the_third(src: str | Path, dst: str | Path) -> None:
        calls.append(dst)
        if len(calls) == 3:  # the third file's new text written, not yet in place
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(relocation.os, "replace", killed_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        relocate(new)
    monkeypatch.setattr(relocation.os, "replace", real_replace)
    half = [str(e["path"]) for e in entries(new)]
    assert sum(p.startswith(f"file://{new}/") for p in half) == 2, half  # two files rewritten

    assert moved_from(new) == old  # the files still old name the old directory
    assert relocate(new) == old
    assert all(str(e["path"]).startswith(f"file://{new}/changelog/part-")
               for e in entries(new))
    assert not list(new.rglob("*.relocating"))  # the leftover was replaced by the rerun
    assert len(list(new.rglob("*.crc"))) == 0
    assert {str(e["path"]) for e in entries(new)[4:]} <= {  # the source log names the sink's
        str(e["path"]) for e in entries(new)[:4]}
    assert all(str(e["path"]).startswith(f"file://{old}/") for e in entries(old))


def test_hadoop_uri_encodes_as_java_uri_does() -> None:
    assert hadoop_uri(Path("/a b/c%d/e#f/g(2)~h,i;j:k$l&m+n=o@p!q'r*s/ü")) == (
        "file:///a%20b/c%25d/e%23f/g(2)~h,i;j:k$l&m+n=o@p!q'r*s/ü")


def test_damaged_logs_are_one_line_errors(tmp_path: Path) -> None:
    write_job(tmp_path)
    (tmp_path / SOURCE_LOG / "1").write_text("v1\n{not json")
    with pytest.raises(PathLogError, match=r"sources/0/1 line 2 is not a log entry Spark"):
        relocate(tmp_path)
    (tmp_path / SOURCE_LOG / "1").write_text("")
    with pytest.raises(PathLogError, match="line 1 .*no version line"):
        moved_from(tmp_path)


def test_a_target_left_under_the_old_directory_is_refused(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    check_targets(new, old, [f"delta://{new}/t", f"delta://{tmp_path}/elsewhere/t",
                             "delta://bucket/t", f"iceberg://{tmp_path}/wh?table=db.t"])
    with pytest.raises(MovedTargetError) as refused:
        check_targets(new, old, [f"delta://{new}/t", f"delta://{old}/lake/{{table}}"])
    assert str(refused.value) == (
        f"{new} was moved from {old}, but target delta://{old}/lake/{{table}} still lies under "
        f"{old}: give --target (or the --config target) at its new place, e.g. under {new}, "
        "and start again")
    assert refused.value.exit_code == 2
