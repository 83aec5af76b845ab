"""The fault harness with a Delta or Iceberg table behind the query (tablestore_cdc.lakehouse).

Each scenario SIGKILLs the query's process tree before the table's commit (Iceberg: its data
files written, the catalog not yet pointed at them), after it (Spark's commit log not written:
Spark replays the batch) and, for Delta, at a random time, while a writer makes inserts,
updates and deletes with channel splits and a merge; then the table, read back with deltalake /
pyiceberg, must equal the source table row by row, and with SCD type 2 every key's history the
change log's (``integration.faults.harness.ScenarioRun._verify_target``).

The embedded-store scenarios are part of the quick fault subset (``integration/test_faults.py``,
``quick``); this file runs the same over the wire: an emulator serves the store file, the query
reads its Tunnel API and keeps its meta table in the emulated instance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")
pytest.importorskip("tablestore")

from integration.faults import scenarios  # noqa: E402
from integration.faults.harness import run_scenario  # noqa: E402
from integration.test_faults import SEED  # noqa: E402


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("scenario", scenarios.lakehouse_scenarios(SEED, wire=True),
                         ids=lambda s: s.name)
def test_lakehouse_fault_scenario_over_the_emulator(scenario, tmp_path: Path) -> None:
    result = run_scenario(scenario, tmp_path, seed=SEED)
    print(result.line())
    assert result.ok, result.line()
    assert result.kills == scenario.kills
    assert result.lost == result.duplicated == result.target_mismatches == 0
    assert result.target_rows > 0
