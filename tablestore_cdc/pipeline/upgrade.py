"""An output directory written by the single-table pipeline of an earlier version (driver).

Earlier versions ran ``replicate --table T`` as a pipeline of its own: its change log held the
table's own typed columns and its change-log checkpoint one table's offsets
(``{"uuid": ...}``), neither of which the selection's source reads (generic rows, offsets per
table). ``--table T`` is now a selection of one, so such an output is upgraded in place:

- ``single_table_layout`` tells it apart, read only (``preflight``: refused for ``--tables``,
  in one line naming ``--table``);
- ``upgrade_output`` (by ``replicate``, under the output's lock, before the queries start)
  moves the change log and the checkpoints aside into ``OUT/_single_table/`` and, unless the
  earlier apply query had applied every file of the change log, records a re-snapshot signal
  of the table, which the job runs at its first look (``resnapshot.hook``).

docs/operations.md, "Upgrading a single-table output", says why nothing is lost or skipped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cdc_common.errors import CdcError
from tablestore_cdc.reconcile.source import SourceSpec

#: where ``upgrade_output`` keeps the earlier layout's change log and checkpoints
KEPT = "_single_table"


class SingleTableOutputError(CdcError):
    """``replicate --tables`` on an output of an earlier version's single-table job."""

    template = ("{output} holds the change log of an earlier version's single-table job: run "
                "replicate --table TABLE on it once (it is upgraded in place), or give --tables "
                "another --output")


def single_table_layout(output: Path) -> bool:
    """Does ``output``'s change-log checkpoint hold one table's offsets (an earlier version's
    single-table job)? Its newest offsets file's source offset names a ``uuid`` at the top."""
    offsets = output / "_checkpoints" / "changelog" / "offsets"
    batches = sorted((p for p in offsets.glob("[0-9]*") if p.name.isdigit()),
                     key=lambda p: int(p.name))
    if not batches:
        return False
    try:
        source = json.loads(batches[-1].read_text().splitlines()[2])
    except (OSError, ValueError, IndexError):
        return False  # not ours to judge: Spark says what is wrong with it
    return isinstance(source, dict) and "uuid" in source


def upgrade_output(output: Path, spec: SourceSpec) -> str | None:
    """Upgrade ``output`` when it has the single-table layout (module docstring) for the table
    of ``spec`` (its source as the job reads it: where its signals are kept); the line to say,
    or None when there was nothing to upgrade."""
    if not single_table_layout(output):
        return None
    caught_up = _applied_everything(output)
    kept = output / KEPT
    kept.mkdir(exist_ok=True)
    for name in ("changelog", "_checkpoints"):
        if (output / name).exists():
            shutil.move(output / name, kept / name)
    line = (f"{output}: the single-table layout of an earlier version, upgraded: its change "
            f"log and checkpoints are kept in {kept}")
    if caught_up:
        return line + "; the target held all of it"
    _signal_resnapshot(spec)
    return line + (f"; the target lacked some of it, so {spec.table} is re-snapshotted "
                   "(tablestore-cdc resnapshot --list shows it)")


def _applied_everything(output: Path) -> bool:
    """Had the earlier apply query read every file of the change log and committed its last
    batch? (The file sink's log of the change log against the apply query's file-source log.)"""
    written = _logged_paths(output / "changelog" / "_spark_metadata")
    apply = output / "_checkpoints" / "apply"
    read = _logged_paths(apply / "sources" / "0")
    planned = [int(p.name) for p in (apply / "offsets").glob("[0-9]*") if p.name.isdigit()]
    committed = {int(p.name) for p in (apply / "commits").glob("[0-9]*") if p.name.isdigit()}
    return written <= read and (not planned or max(planned) in committed)


def _logged_paths(log: Path) -> set[str]:
    """The file paths a Spark metadata log lists (``N`` and ``N.compact`` files: a version
    line, then one JSON entry per line)."""
    paths: set[str] = set()
    for entry in log.glob("[0-9]*"):
        for line in entry.read_text().splitlines()[1:]:
            try:
                path = json.loads(line).get("path")
            except (ValueError, AttributeError):
                continue
            if isinstance(path, str):
                paths.add(path)
    return paths


def _signal_resnapshot(spec: SourceSpec) -> None:
    """A pending re-snapshot signal of ``spec``'s table, where ``tablestore-cdc resnapshot``
    adds one (``resnapshot.repair.open_board``)."""
    from meta_store.signals import Signal
    from tablestore_cdc.resnapshot.repair import open_board

    with open_board(spec) as board:
        board.add(Signal(table=spec.table))
