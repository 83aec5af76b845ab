"""``replicate --cycle``: which pipeline an output runs (``pipeline.queries.choose_cycle``), the
refusals in one line before Spark starts, and the query id the targets record in each cycle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from connector.local import LocalTablestore
from tablestore_cdc.commands.app import app
from tablestore_cdc.pipeline.queries import (
    CycleMismatchError,
    checkpoint_query_id,
    choose_cycle,
    recorded_cycle,
)

runner = CliRunner()


def _checkpoint(out: Path, query: str, query_id: str) -> None:
    """Spark's checkpoint metadata of ``query`` under ``out`` (its first line: the id)."""
    (out / "_checkpoints" / query).mkdir(parents=True)
    (out / "_checkpoints" / query / "metadata").write_text(json.dumps({"id": query_id}) + "\n")


def test_a_new_output_runs_the_cycle_given_else_one(tmp_path: Path) -> None:
    assert recorded_cycle(tmp_path) is None
    assert choose_cycle(tmp_path, None) == "one"
    assert choose_cycle(tmp_path, "two") == "two"
    assert checkpoint_query_id(tmp_path) is None


def test_an_output_keeps_its_cycle_and_the_query_the_targets_record(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _checkpoint(one, "replicate", "q-one")
    _checkpoint(two, "changelog", "q-changelog")
    _checkpoint(two, "apply", "q-apply")
    assert (recorded_cycle(one), recorded_cycle(two)) == ("one", "two")
    assert (choose_cycle(one, None), choose_cycle(two, None)) == ("one", "two")
    assert (checkpoint_query_id(one), checkpoint_query_id(two)) == ("q-one", "q-apply")


@pytest.mark.parametrize(("recorded", "given"), [("two", "one"), ("one", "two")])
def test_the_other_cycle_on_an_existing_output_is_refused(tmp_path: Path, recorded: str,
                                                          given: str) -> None:
    _checkpoint(tmp_path, "replicate" if recorded == "one" else "changelog", "q")
    with pytest.raises(CycleMismatchError) as refused:
        choose_cycle(tmp_path, given)
    assert refused.value.exit_code == 2
    assert f"holds the checkpoints of the {recorded}-cycle pipeline" in str(refused.value)
    assert f"--cycle {given}" in str(refused.value)


def test_replicate_refuses_a_bad_or_mismatched_cycle_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    with LocalTablestore(store) as local:
        local.create_table("t", [("id", "INTEGER")], [("v", "STRING")], channels=1)
    out = tmp_path / "out"
    args = ["replicate", "--store", str(store), "--table", "t", "--output", str(out)]
    bad = runner.invoke(app, [*args, "--cycle", "three"])
    assert bad.exit_code == 2
    assert "option '--cycle': got 'three'; allowed: one or two" in bad.output
    _checkpoint(out, "changelog", "q")
    mismatched = runner.invoke(app, [*args, "--cycle", "one"])
    assert mismatched.exit_code == 2, mismatched.output
    assert "two-cycle pipeline, so it cannot go on with --cycle one" in mismatched.output
    assert "Traceback" not in mismatched.output
    assert not (out / "_checkpoints" / "replicate").exists()
