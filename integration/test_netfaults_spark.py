"""The network misbehaving under a real local Spark, and a Spark standalone cluster across hosts.

- ``faults`` (the default suite's bounded form): the 8 % mix of every kind of misbehaviour on
  both Tablestore hops (the Tunnel API and the meta table) with a query kill; the meta hop down
  past the retry budget (the query fails naming the hop, the restarted query finishes
  exactly); a short cluster run (root only: a worker SIGKILLed mid-batch, a worker cut off
  from the service mid-read).
- ``faults_full`` (``make netfaults-full``, ``make cluster-long``): every scenario of
  ``integration.netfaults.scenarios.full()`` and the long cluster run.

Each scenario verifies the sink against the store's change log (nothing lost, nothing
doubled, order per key, state, identical replays) and the meta table's chain
(integration/netfaults/harness.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("tablestore")

from integration.netfaults import netns, scenarios  # noqa: E402
from integration.netfaults.cluster import ClusterScenario, run_cluster_scenario  # noqa: E402
from integration.netfaults.harness import NetScenario, run_net_scenario  # noqa: E402

SEED = int(os.environ.get("TABLESTORE_CDC_FAULTS_SEED", "1"))


def _check(scenario: NetScenario, tmp_path: Path) -> None:
    result = run_net_scenario(scenario, tmp_path, seed=SEED)
    print(result.line())
    assert result.ok, result.line()
    assert result.lost == 0 and result.duplicated == 0 and result.out_of_order == 0
    if scenario.rate:
        assert sum(sum(k.values()) for k in result.injected.values()) > 0
    for outage in scenario.outages:
        if outage.fails:
            assert result.failures, "the outage was meant to fail the query"


#: in make test-extended: the default suite's time (its cluster test cuts a worker off, and
#: test_tablestore_e2e survives the emulator's outage)
_EXTENDED = ("quick/mix8-meta-outage",)


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=pytest.mark.extended) if s.name in _EXTENDED else s
    for s in scenarios.quick()], ids=lambda s: s.name)
def test_network_faults_quick(scenario: NetScenario, tmp_path: Path) -> None:
    _check(scenario, tmp_path)


@pytest.mark.slow
@pytest.mark.faults_full
@pytest.mark.parametrize("scenario", scenarios.full(), ids=lambda s: s.name)
def test_network_faults_full(scenario: NetScenario, tmp_path: Path) -> None:
    _check(scenario, tmp_path)


def _check_cluster(scenario: ClusterScenario, tmp_path: Path) -> None:
    reason = netns.unavailable()  # probed here, not at collection: it makes a namespace
    if reason:
        pytest.skip(f"the cluster across network namespaces {reason}")
    result = run_cluster_scenario(scenario, tmp_path, seed=SEED)
    print(result.line())
    assert result.ok, result.line()
    assert result.workers_killed == scenario.kill_worker
    assert result.workers_cut == scenario.cut_worker


@pytest.mark.slow
@pytest.mark.faults
def test_cluster_worker_killed_and_cut_off(tmp_path: Path) -> None:
    _check_cluster(ClusterScenario("cluster-short"), tmp_path)


@pytest.mark.slow
@pytest.mark.faults_full
def test_cluster_long(tmp_path: Path) -> None:
    _check_cluster(ClusterScenario("cluster-long", kill_worker=2, cut_worker=2, tail_s=30.0),
                   tmp_path)
