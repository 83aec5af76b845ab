"""What an Iceberg stream costs in metadata. The sink reads each manifest's entries once per
process (manifests.py), where pyiceberg reads every manifest of the table three times a batch;
the entries it reuses are the ones a fresh read gives, a manifest another writer commits is
read, and the cache keeps to its bound. The tables it writes keep their newest metadata
files only (``iceberg.METADATA_CLEANUP``), where Iceberg kept one file per commit for good.
And ``lake optimize --expire-hours`` expires old snapshots but those the batch marker needs,
beside a running stream, and ``--vacuum-hours`` then removes what only they referred to."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.manifest import ManifestFile  # noqa: E402

from tablestore_cdc.lakehouse import iceberg, manifests  # noqa: E402
from tablestore_cdc.verify import table_state  # noqa: E402
from testkit.lakehouse import Iceberg, batch, change  # noqa: E402


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    manifests._cache.cache_clear()
    yield
    manifests._cache.cache_clear()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every read of a manifest file's entries, by the manifest's path."""
    counts: Counter[str] = Counter()
    original = ManifestFile.fetch_manifest_entry

    def counting(self: ManifestFile, io: Any, discard_deleted: bool = True) -> Any:
        counts[self.manifest_path] += 1
        return original(self, io, discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counting)
    return counts


def key(id_: int) -> str:
    return json.dumps({"id": id_})


def run(target: Iceberg, batches: int = 8, between: Any = None) -> dict[str, Any]:
    """A first load (keys 100c + i of channel c, a file per channel), then ``batches`` batches
    each updating a key in one channel's file, deleting one in another and adding one (keys
    that exist up to batch 24), with ``between(batch_number, expected)`` called before each.
    Returns the state the batches leave."""
    sink = target.sink()
    rows = [change("PUT", f"ch{c}", i + 1, 1, 100 * c + i, f"n{100 * c + i}", i)
            for c in range(4) for i in range(25)]
    assert sink.apply(batch(*rows), "q", 0).appended
    expected = {key(r["id"]): {"name": r["name"], "qty": r["qty"]} for r in rows}
    for b in range(1, batches + 1):
        if between is not None:
            between(b, expected)
        updated, deleted, added = 100 * (b % 4) + b, 100 * ((b + 1) % 4) + b, 500 + b
        result = sink.apply(batch(change("UPDATE", "x", 100 + 3 * b, 2 + b, updated, "u", b),
                                  change("DELETE", "x", 101 + 3 * b, 2 + b, deleted),
                                  change("PUT", "x", 102 + 3 * b, 2 + b, added, "a", b)),
                            "q", b)
        assert result.committed and not result.appended
        expected[key(updated)] = {"name": "u", "qty": b}
        expected.pop(key(deleted))
        expected[key(added)] = {"name": "a", "qty": b}
    return expected


def current_manifests(target: Iceberg) -> tuple[Any, list[Any]]:
    table = load_catalog("tablestore_cdc", **target.properties).load_table("cdc.orders")
    return table, [m for s in table.metadata.snapshots for m in s.manifests(table.io)]


@pytest.mark.parametrize("reuse", [True, False], ids=["reused", "pyiceberg-alone"])
def test_a_manifest_is_read_once_per_process(tmp_path: Path, reads: Counter[str],
                                             monkeypatch: pytest.MonkeyPatch,
                                             reuse: bool) -> None:
    """With the reuse, the manifests a batch plans from and commits against are read once in
    all (a manifest one commit writes and merges away is read by that commit, which holds it
    unnumbered); pyiceberg alone reads each of them again in every batch. The rows agree."""
    if not reuse:
        monkeypatch.setattr(iceberg, "reuse_entries", lambda table: None)
    target = Iceberg(tmp_path)
    expected = run(target)
    assert table_state(target.rows(), ["id"]) == expected
    if reuse:
        assert reads and max(reads.values()) == 1, reads
    else:
        assert max(reads.values()) >= 3, reads


def test_reused_entries_are_the_ones_a_fresh_read_gives(tmp_path: Path) -> None:
    """Every manifest of every snapshot: the entries the cache hands out (live ones, and all
    with the deleted) equal pyiceberg's own read of the file, sequence numbers included."""
    target = Iceberg(tmp_path)
    run(target)
    table, every = current_manifests(target)
    compared = 0
    for manifest in every:
        for discard_deleted in (True, False):
            fresh = ManifestFile.fetch_manifest_entry(manifest, table.io, discard_deleted)
            assert manifests._fetch(manifest, table.io, discard_deleted) == fresh
            compared += len(fresh)
    assert compared > 0
    reused = [m for m in every if "fetch_manifest_entry" in vars(m)]
    assert reused, "no manifest of the table was given the cached reader"


def test_a_manifest_another_writer_commits_is_read(tmp_path: Path) -> None:
    """Another writer appends between batches: the sink's next batch plans from the new
    snapshot's manifests, so an update of a key in the other writer's file replaces that row
    (not a second row beside it)."""
    target = Iceberg(tmp_path)

    def other_writer(b: int, expected: dict[str, Any]) -> None:
        if b == 4:
            target.other_writer(batch(change("PUT", "o", 1, 1, 4, "other", 40)), scd=1)
            expected[key(4)] = {"name": "other", "qty": 40}

    expected = run(target, between=other_writer)  # batch 4 updates key 100 * 0 + 4 = 4
    assert expected[key(4)] == {"name": "u", "qty": 4}
    state = table_state(target.rows(), ["id"])
    assert state == expected
    assert [r["id"] for r in target.rows()].count(4) == 1


def test_the_cache_keeps_to_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      reads: Counter[str]) -> None:
    """Bounded below what the table's manifests hold, the cache keeps at most its bound, the
    manifests it cannot keep are read again (pyiceberg's own reads), and the rows are right."""
    monkeypatch.setattr(manifests, "MAX_CACHED_ENTRIES", 3)
    manifests._cache.cache_clear()
    target = Iceberg(tmp_path)
    expected = run(target)
    assert table_state(target.rows(), ["id"]) == expected
    assert 0 < manifests._cache().currsize <= 3
    assert max(reads.values()) >= 3, reads


def metadata_files(tmp: Path) -> list[Path]:
    return sorted((tmp / "warehouse").rglob("*.metadata.json"))


def test_a_stream_keeps_its_newest_metadata_files_only(tmp_path: Path) -> None:
    """A table the sink creates carries Iceberg's cleanup settings, and after more commits than
    it keeps, only the newest files are left; the table reads right."""
    target = Iceberg(tmp_path)
    expected = run(target, batches=14)
    table, _ = current_manifests(target)
    assert {k: table.properties.get(k) for k in iceberg.METADATA_CLEANUP} == \
        iceberg.METADATA_CLEANUP
    kept = int(iceberg.METADATA_CLEANUP["write.metadata.previous-versions-max"])
    assert len(table.metadata.snapshots) == 15  # the load and 14 batches: more than kept
    assert len(metadata_files(tmp_path)) == kept + 1  # the kept ones and the current one
    assert table_state(target.rows(), ["id"]) == expected


def test_a_table_without_the_settings_gets_them_and_one_with_its_own_keeps_it(
        tmp_path: Path) -> None:
    """A table from before the setting (its properties removed here) gets both in the next
    batch's commit, and its old metadata files go from then on; a table whose owner set
    ``delete-after-commit`` to false keeps that and every file."""
    cleanup = "write.metadata.delete-after-commit.enabled"
    older, owned = Iceberg(tmp_path / "older"), Iceberg(tmp_path / "owned")
    for target, left in ((older, {}), (owned, {cleanup: "false"})):
        sink = target.sink()
        assert sink.apply(batch(change("PUT", "c", 1, 1, 1, "a", 1)), "q", 0).committed
        table, _ = current_manifests(target)
        with table.transaction() as transaction:
            transaction.remove_properties(*iceberg.METADATA_CLEANUP)
            if left:
                transaction.set_properties(left)
        for b in range(1, 16):
            assert sink.apply(batch(change("UPDATE", "c", 1 + b, 1 + b, 1, "a", b)), "q",
                              b).committed
        assert table_state(target.rows(), ["id"]) == {key(1): {"name": "a", "qty": 15}}
    table, _ = current_manifests(older)
    assert {k: table.properties.get(k) for k in iceberg.METADATA_CLEANUP} == \
        iceberg.METADATA_CLEANUP
    kept = int(iceberg.METADATA_CLEANUP["write.metadata.previous-versions-max"])
    assert len(metadata_files(tmp_path / "older")) == kept + 1
    table, _ = current_manifests(owned)
    assert table.properties.get(cleanup) == "false"
    assert len(metadata_files(tmp_path / "owned")) == 18  # create, load, its change, 15 batches


def uri_of(tmp: Path) -> str:
    return f"iceberg://{tmp}/warehouse?table=cdc.orders"


def replay(target: Iceberg, batch_id: int) -> bool:
    """Apply the batch ``run`` makes as ``batch_id`` (again, or the next one); True if it
    committed."""
    b = batch_id
    updated, deleted, added = 100 * (b % 4) + b, 100 * ((b + 1) % 4) + b, 500 + b
    return target.sink().apply(batch(change("UPDATE", "x", 100 + 3 * b, 2 + b, updated, "u", b),
                                     change("DELETE", "x", 101 + 3 * b, 2 + b, deleted),
                                     change("PUT", "x", 102 + 3 * b, 2 + b, added, "a", b)),
                               "q", b).committed


def test_expiry_keeps_the_snapshots_the_batch_marker_needs(tmp_path: Path) -> None:
    """``lake optimize --expire-hours 0``: every snapshot but the current one goes when it is
    the owner's; after another writer's commit, the owner's newest stays too, so a replay of
    the owner's last batch is still skipped and the next batch applies once."""
    from tablestore_cdc.lakehouse.maintenance import describe, optimize

    target = Iceberg(tmp_path)
    expected = run(target, batches=6)
    result = optimize(uri_of(tmp_path), expire_hours=0)
    assert (result.snapshots_expired, result.snapshots_after) == (6, 1)
    assert describe(result).startswith("Iceberg (no compaction in pyiceberg 0.12): 6 "
                                       "snapshot(s) expired, 1 kept; 0 unreferenced")
    assert not replay(target, 6) and target.commits() == 1
    target.other_writer(batch(change("PUT", "o", 1, 1, 900, "other", 9)), scd=1)
    expected[key(900)] = {"name": "other", "qty": 9}
    target.sink().apply(batch(change("PUT", "x", 500, 50, 901, "n", 1)), "q", 7)
    expected[key(901)] = {"name": "n", "qty": 1}
    target.other_writer(batch(change("PUT", "o", 2, 2, 902, "other", 9)), scd=1)
    expected[key(902)] = {"name": "other", "qty": 9}
    result = optimize(uri_of(tmp_path), expire_hours=0)
    # the owner's newest, the current
    assert (result.snapshots_expired, result.snapshots_after) == (2, 2)
    assert not target.sink().apply(batch(change("PUT", "x", 500, 50, 901, "n", 1)), "q",
                                   7).committed
    assert table_state(target.rows(), ["id"]) == expected
    # none is an hour old
    assert optimize(uri_of(tmp_path), expire_hours=1).snapshots_expired == 0


def test_expiry_keeps_a_tagged_snapshot(tmp_path: Path) -> None:
    """A snapshot someone tagged is not expired (Iceberg keeps ref heads), and the others
    are."""
    from tablestore_cdc.lakehouse.maintenance import optimize

    target = Iceberg(tmp_path)
    run(target, batches=3)
    table, _ = current_manifests(target)
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_tag(first, "loaded").commit()
    result = optimize(uri_of(tmp_path), expire_hours=0)
    assert (result.snapshots_expired, result.snapshots_after) == (2, 2)
    table, _ = current_manifests(target)
    assert first in {s.snapshot_id for s in table.metadata.snapshots}


def test_a_batch_committing_across_an_expiry_commits_once(tmp_path: Path) -> None:
    """The expiry commits between a batch's read of the table and its commit: the batch's
    parent (the current snapshot) is kept, so the batch commits on top, once."""
    from tablestore_cdc.lakehouse.maintenance import optimize

    target = Iceberg(tmp_path)
    expected = run(target, batches=3)
    sink = target.sink()
    expiries: list[int | None] = []

    def expire_first() -> None:
        if not expiries:
            expiries.append(optimize(uri_of(tmp_path), expire_hours=0).snapshots_expired)

    sink._before_commit = expire_first  # type: ignore[method-assign]
    assert sink.apply(batch(change("UPDATE", "x", 900, 90, 1, "one", 1)), "q", 4).committed
    assert expiries == [3]
    expected[key(1)] = {"name": "one", "qty": 1}
    assert table_state(target.rows(), ["id"]) == expected
    assert target.commits() == 2 and sink.committed_batch("q") == 4


def test_a_stream_beside_expiries_in_a_loop_applies_every_batch_once(tmp_path: Path) -> None:
    """Expiries back to back in another thread while 24 batches apply: whichever commits
    first, the table ends equal to the changes, every batch recorded once."""
    import threading

    from tablestore_cdc.lakehouse.maintenance import optimize

    target = Iceberg(tmp_path)
    stop = threading.Event()
    outcomes: list[Any] = []

    def expire_in_a_loop() -> None:
        while not stop.is_set():
            outcomes.append(optimize(uri_of(tmp_path), expire_hours=0))

    expirer = threading.Thread(target=expire_in_a_loop)

    def start_expiring(b: int, expected: dict[str, Any]) -> None:
        if b == 1:
            expirer.start()

    try:
        expected = run(target, batches=24, between=start_expiring)
    finally:
        stop.set()
        expirer.join()
    assert table_state(target.rows(), ["id"]) == expected
    assert target.sink().committed_batch("q") == 24
    assert sum(o.snapshots_expired or 0 for o in outcomes) > 0


def test_vacuum_after_expiry_removes_the_files_only_expired_snapshots_referred_to(
        tmp_path: Path) -> None:
    """Expired, then vacuumed with the stream stopped: the data files, manifests and manifest
    lists only the expired snapshots referred to are gone, every file left is one the table
    refers to, and the table reads right and takes the next batch."""
    from tablestore_cdc.lakehouse.maintenance import optimize
    from tablestore_cdc.lakehouse.upkeep import _referenced_files

    target = Iceberg(tmp_path)
    expected = run(target, batches=6)
    root = next((tmp_path / "warehouse").rglob("orders"))

    def files() -> set[str]:
        return {str(p) for pattern in ("data/**/*.parquet", "metadata/*.avro",
                                       "metadata/*.metadata.json") for p in root.glob(pattern)}

    before = files()
    result = optimize(uri_of(tmp_path), expire_hours=0, vacuum_hours=0)
    assert result.snapshots_expired == 6 and result.files_removed > 0
    after = files()
    assert len(before) + 1 - len(after) == result.files_removed  # + the expiry's metadata file
    table, _ = current_manifests(target)
    assert after == _referenced_files(table)
    assert any(p.endswith(".parquet") for p in before - after)  # replaced data files
    assert any(Path(p).name.startswith("snap-") for p in before - after)  # manifest lists
    assert table_state(target.rows(), ["id"]) == expected
    assert replay(target, 7)  # the next batch of run's pattern
    expected[key(307)] = {"name": "u", "qty": 7}
    expected.pop(key(7))
    expected[key(507)] = {"name": "a", "qty": 7}
    assert table_state(target.rows(), ["id"]) == expected


def test_expiry_of_a_delta_target_is_refused_in_words(tmp_path: Path) -> None:
    from tablestore_cdc.lakehouse.errors import TargetUriError
    from tablestore_cdc.lakehouse.maintenance import optimize
    from testkit.lakehouse import Delta

    target = Delta(tmp_path)
    target.sink().apply(batch(change("PUT", "c", 1, 1, 1, "a", 1)), "q", 0)
    with pytest.raises(TargetUriError, match="--expire-hours expires Iceberg snapshots"):
        optimize(f"delta://{target.path}", expire_hours=1)


def test_lake_optimize_command_expires_and_says_what_it_kept(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app

    target = Iceberg(tmp_path)
    run(target, batches=2)
    done = CliRunner().invoke(app, ["lake", "optimize", "--target", uri_of(tmp_path),
                                    "--expire-hours", "0"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == ("Iceberg (no compaction in pyiceberg 0.12): 2 snapshot(s) "
                                   "expired, 1 kept; 0 unreferenced file(s) removed")
    bad = CliRunner().invoke(app, ["lake", "optimize", "--target", uri_of(tmp_path),
                                   "--expire-hours", "-1"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
