"""A ranged re-snapshot reads only its key range, without Spark: the embedded store's scan
bounded in SQL, GetRange's bounds over the emulator (read with the official SDK), and a Delta or
Iceberg target whose data files outside the range are deleted from disk -- so a read that
opened them would fail. The repair's results are tests/test_resnapshot.py's."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("polars")

import deltalake  # noqa: E402

from connector.local import LocalTablestore  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from meta_store.signals import Signal  # noqa: E402
from tablestore_cdc.lakehouse import open_apply_sink  # noqa: E402
from tablestore_cdc.reconcile import SourceSpec, reconcile_table  # noqa: E402
from tablestore_cdc.reconcile.keyrange import KeyRange  # noqa: E402
from tablestore_cdc.reconcile.source import open_source_table  # noqa: E402
from tablestore_cdc.reconcile.target import open_target_table  # noqa: E402
from tablestore_cdc.resnapshot.command import open_board  # noqa: E402
from tablestore_cdc.resnapshot.hook import RepairTarget  # noqa: E402
from testkit.reconcile import DeltaTarget, apply_stream, table_runner  # noqa: E402

ROWS = 2000
JOB = "build-query"


def read_keys(spec: SourceSpec, span: KeyRange | None, page_rows: int = 100
              ) -> tuple[list[tuple[Any, ...]], int]:
    """The keys the source reader returns for ``span`` and how many pages it took."""
    keys, pages = [], 0
    with open_source_table(spec) as source:
        names = [c.name for c in source.schema.primary_key]
        for page in source.pages(page_rows, span):
            pages += 1
            keys += [tuple(pk[n] for n in names) for pk, _ in page]
    return keys, pages


def test_the_embedded_store_scans_only_the_range_in_its_query(tmp_path: Path) -> None:
    with LocalTablestore(tmp_path / "store.db") as store:
        store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("qty", "INTEGER")])
        store.create_table("s", primary_key=[("name", "STRING"), ("n", "INTEGER")])
        store.batch_write("t", [("put", {"id": i}, {"qty": i}) for i in range(ROWS)])
        store.batch_write("s", [("put", {"name": w, "n": n}, {})
                                for w in ("apple", "b", "banana", "c", "cherry", "d", "é")
                                for n in (1, 2)])
    spec = SourceSpec(f"local://{tmp_path}/store.db", "t")
    keys, pages = read_keys(spec, KeyRange("id", 500, 530))
    # one page of the range's 30 rows: the whole table would be 20 pages of 100 in key-JSON order
    assert (sorted(keys), pages) == ([(i,) for i in range(500, 530)], 1)
    assert sorted(read_keys(spec, KeyRange("id", None, 3))[0]) == [(0,), (1,), (2,)]
    assert len(read_keys(spec, KeyRange("id", 1990, None))[0]) == 10
    assert len(read_keys(spec, None)[0]) == ROWS
    text = SourceSpec(f"local://{tmp_path}/store.db", "s")
    found = sorted(read_keys(text, KeyRange("name", "b", "d"))[0])
    assert found == [(w, n) for w in ("b", "banana", "c", "cherry") for n in (1, 2)]
    assert {k[0] for k in read_keys(text, KeyRange("name", "d", None))[0]} == {"d", "é"}


INSTANCE, KEY_ID, SECRET = "rng", "rng-key", "rng-secret"


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("tablestore")
    from tablestore_emulator.server import EmulatorServer

    with LocalTablestore(tmp_path / "wire.db") as store:  # a two-column key
        store.create_table("t", primary_key=[("id", "INTEGER"), ("part", "STRING")],
                           columns=[("qty", "INTEGER")])
        store.batch_write("t", [("put", {"id": i // 2, "part": "ab"[i % 2]}, {"qty": i})
                                for i in range(ROWS)])
    with EmulatorServer(str(tmp_path / "wire.db"), INSTANCE, KEY_ID, SECRET) as server:
        yield server


def test_over_the_wire_getrange_is_bounded_by_the_range(emulator: Any, tmp_path: Path) -> None:
    spec = SourceSpec(f"{emulator.url}?instance={INSTANCE}", "t", options={
        "access.key.id": KEY_ID, "access.key.secret": SECRET,
        "meta.store": f"sqlite://{tmp_path}/meta.db"})
    keys, pages = read_keys(spec, KeyRange("id", 300, 320), page_rows=50)
    # [300, 320) on the first key column, both values of the second; 40 rows: one page of 50
    # (the whole table would be 40 pages)
    assert (keys, pages) == ([(i, p) for i in range(300, 320) for p in "ab"], 1)
    keys, pages = read_keys(spec, KeyRange("id", 990, None), page_rows=50)
    assert (keys[0], keys[-1], len(keys), pages) == ((990, "a"), (999, "b"), 20, 1)
    keys, pages = read_keys(spec, KeyRange("id", None, 2), page_rows=3)
    assert (keys, pages) == ([(0, "a"), (0, "b"), (1, "a"), (1, "b")], 2)


# --- targets: the data files outside the range deleted from disk ----------------------------------

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("qty", pa.int64())])
FILES, PER_FILE = 10, 100


def chunk(n: int) -> pa.Table:
    ids = list(range(n * PER_FILE, (n + 1) * PER_FILE))
    return pa.table({"id": ids, "qty": ids}, schema=SCHEMA)


def delta_files(root: Path) -> tuple[str, list[list[str]]]:
    """A Delta table of ``FILES`` appends, each one file of ``PER_FILE`` keys in order: its
    URI and each append's file paths."""
    path, files, seen = str(root / "delta"), [], set()
    for n in range(FILES):
        deltalake.write_deltalake(path, chunk(n), mode="append")
        now = {os.path.join(path, f) for f in deltalake.DeltaTable(path).file_uris()}
        files.append(sorted(now - seen))
        seen = now
    return f"delta://{path}", files


def iceberg_files(root: Path) -> tuple[str, list[list[str]]]:
    """The same as an Iceberg table in a SQLite catalog."""
    from pyiceberg.catalog import load_catalog

    from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties

    (root / "wh").mkdir()
    catalog = load_catalog("tablestore_cdc", **sqlite_catalog_properties(str(root / "wh")))
    catalog.create_namespace("cdc")
    table = catalog.create_table("cdc.t", schema=SCHEMA)
    files, seen = [], set()
    for n in range(FILES):
        table.append(chunk(n))
        now = {urlsplit(t.file.file_path).path for t in table.scan().plan_files()}
        files.append(sorted(now - seen))
        seen = now
    return f"iceberg://{root}/wh?table=cdc.t", files


@pytest.mark.parametrize("build", [delta_files, iceberg_files], ids=["delta", "iceberg"])
def test_the_target_read_opens_only_the_files_whose_statistics_overlap_the_range(
        tmp_path: Path, build: Callable[[Path], tuple[str, list[list[str]]]]) -> None:
    uri, files = build(tmp_path)
    assert all(len(f) == 1 for f in files)
    for n, paths in enumerate(files):
        if n not in (3, 4):  # keys [300, 500) stay
            for p in paths:
                os.remove(p)
    target = open_target_table(uri)
    span = KeyRange("id", 390, 410)  # across the two files kept
    ids = sorted(i for b in target.batches(["id", "qty"], 1000, span)
                 for i in b.column("id").to_pylist())
    assert ids == list(range(390, 410))
    with pytest.raises(Exception):  # noqa: B017 - the unranged read opens a deleted file
        for _ in open_target_table(uri).batches(["id", "qty"], 1000):
            pass


def test_a_ranged_repair_reads_only_the_range_of_the_source(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")])
    store.batch_write("t", [("put", {"id": i}, {"name": f"n{i}", "qty": i})
                            for i in range(ROWS)])
    store.delete_row("t", {"id": 115})  # the key the target gains by hand
    spec = SourceSpec(f"local://{store.path}", "t")
    open_meta_store(spec.source_options().meta_store).close()
    target = DeltaTarget(tmp_path)
    sink = open_apply_sink(target.uri)
    apply_stream(spec.endpoint, "t", sink, app_id=JOB, tunnel_name="replicate",
                 batch_records=ROWS)
    target.tamper([101, 102, 1500], [105, 1600], 115)
    returned: list[int] = []
    scan_pages = LocalTablestore.scan_pages

    def counted(self: LocalTablestore, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for page in scan_pages(self, *args, **kwargs):
            returned.append(len(page))
            yield page

    monkeypatch.setattr(LocalTablestore, "scan_pages", counted)
    with open_board(spec) as board:
        board.add(Signal(table="t", key_from=100, key_to=120))
        table_runner(RepairTarget(spec, sink, target.uri)).run_due(JOB)
        done = board.signals()[0]
    assert done.counts == {"upserts": 3, "deletes": 1, "in_flight": 0, "differences": 4}, done
    # the comparison's two passes and the repair's read: 20 rows each, not 2000
    assert sum(returned) <= 3 * 20 and len(returned) <= 3, returned
    monkeypatch.undo()
    left = {d.key[0] for d in reconcile_table(spec, target.uri).comparison.differences}
    assert left == {1500, 1600}
    ranged = reconcile_table(spec, target.uri, key_from=1500, key_to=1501)
    assert [d.kind for d in ranged.comparison.differences] == ["MISSING"]
    assert ranged.comparison.source_rows == 1 and ranged.comparison.target_rows == 0
