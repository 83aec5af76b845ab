"""Fault injection: real SIGKILLs, failing tasks, duplicate reads and transient errors.

Three layers, cheapest first:

- fast tests (no Spark, no marker): the retry layer (``connector.retry``) retries transient
  errors and only those, within its bounds; the transient-error injection
  (``testkit/flaky.py``, the client seam's fault hook) fails calls before and after they take
  effect; the driver protocol and
  the executor reader, run in Spark's order in this process with 30% of their service calls
  failing, still deliver every change exactly once; crash points armed to ``raise`` and
  ``hold`` behave as the harness expects; the full matrix has what docs/reliability.md promises;
- ``faults`` (what CI runs, a few minutes): the quick scenarios of ``integration.faults`` —
  crash points merged into two scenarios (commitInterval 1 and 5), task retry under
  ``local[2,4]``, a duplicate concurrent read, 10% transient errors, two random kills;
- ``faults_full`` (run explicitly: ``python -m pytest -m faults_full``, or
  ``TABLESTORE_CDC_FAULTS_FULL=1``): the full matrix, at least 50 random kills and the
  ``local-cluster`` + DynamoDB scenario; 30-60 minutes. ``python -m integration.faults`` runs
  the same scenarios with one line per scenario.

Each scenario runs the query in its own process tree and verifies the sink against the store's
change log (lost, duplicated, per-key order, final state, identical replays).
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest

from connector import crash_hook, retry
from connector.clients import FAULT_HOOK_ENV, executor_clients
from connector.crash_hook import crash_point
from connector.errors import (
    EndCheckpointConflictError,
    StaleCheckpointError,
    TransientMetaStoreError,
    TransientTunnelError,
)
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.retry import ATTEMPTS, DEADLINE_S, with_retries
from connector.tunnel import Checkpoint, open_tunnel_service
from integration.faults import scenarios
from integration.faults.harness import CrashAt, RandomKill, run_scenario
from meta_store import BatchState, EndCheckpoint, open_meta_store
from tablestore_cdc.verify import Delivered, key_of, verify
from testkit import crash_points
from testkit.clock import FakeClock
from testkit.crash_points import FAULT_DIR_ENV, POINTS, InjectedFault
from testkit.flaky import (
    FLAKY_ENV,
    FLAKY_LOG,
    FLAKY_SEED_ENV,
    HOOK,
    MAX_INJECTED_IN_A_ROW,
    inject_transient_errors,
)
from testkit.partition_reads import read_partition

pytestmark = pytest.mark.store_table(channels=3)

SEED = int(os.environ.get("TABLESTORE_CDC_FAULTS_SEED", "1"))


# --- the retry layer ------------------------------------------------------------------------


class FailsFirst:
    """A service call that fails ``k`` times with ``error``, then answers."""

    def __init__(self, k: int, error: Exception) -> None:
        self.k = k
        self.error = error
        self.calls = 0

    def call(self, value: str) -> str:
        self.calls += 1
        if self.calls <= self.k:
            raise self.error
        return value

    def close(self) -> None:
        pass


@pytest.mark.parametrize("k", [0, 1, ATTEMPTS - 1])
def test_transient_errors_are_retried_until_success(k: int) -> None:
    flaky = FailsFirst(k, TransientTunnelError(detail="throttled"))
    assert with_retries(flaky).call("ok") == "ok"
    assert flaky.calls == k + 1


def test_retries_are_bounded_then_the_error_is_raised() -> None:
    flaky = FailsFirst(100, TransientMetaStoreError(detail="down"))
    clock = FakeClock()
    began = clock.monotonic()
    with pytest.raises(TransientMetaStoreError):
        with_retries(flaky, sleep=clock.sleep).call("never")
    assert flaky.calls == ATTEMPTS
    assert clock.monotonic() - began < DEADLINE_S + 1


@pytest.mark.parametrize("error", [
    StaleCheckpointError(channel_id="c", tunnel_id="t", pushed=1, stored=2),
    EndCheckpointConflictError(uuid="u", channel_id="c", stored=None, attempted=None,
                               stored_summary="a", attempted_summary="b"),
    ValueError("a bug"),
])
def test_permanent_errors_are_not_retried(error: Exception) -> None:
    flaky = FailsFirst(1, error)
    with pytest.raises(type(error)):
        with_retries(flaky).call("never")
    assert flaky.calls == 1


@pytest.fixture
def flaky_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Switch the transient-error injection on for this test (``rate`` set by the test)."""
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv(FAULT_DIR_ENV, str(faults))
    monkeypatch.setenv(FAULT_HOOK_ENV, HOOK)  # the seam's fault hook, as the harness sets it
    monkeypatch.setenv(FLAKY_SEED_ENV, "7")

    def rate(value: float) -> Path:
        monkeypatch.setenv(FLAKY_ENV, str(value))
        return faults / FLAKY_LOG

    yield rate
    executor_clients().close()  # executors pool clients per process: drop the flaky ones


def test_injection_is_inert_without_the_variable(store, monkeypatch) -> None:
    monkeypatch.delenv(FLAKY_ENV, raising=False)
    tunnel = open_tunnel_service(f"local://{store.path}")
    assert inject_transient_errors(tunnel) is tunnel
    tunnel.close()


def test_injected_errors_before_and_after_the_call_are_retried(tmp_path, flaky_env) -> None:
    flaky_log = flaky_env(1.0)  # every call fails MAX_INJECTED_IN_A_ROW times, then passes
    meta = with_retries(inject_transient_errors(open_meta_store(f"sqlite:///{tmp_path}/m.db")))
    meta.create_batch("ns", "u1", None)
    end = EndCheckpoint(channel_id="c", start_token="a", token="b", sequence_number=3,
                        records=3, attempt="test", written_at=0.0)
    # an injected error *after* the put: the retry finds its own claim, not a conflict
    assert meta.put_end_checkpoint("ns", "u1", end).same_position(end)
    meta.mark_committed("ns", "u1")
    assert meta.get_batch("ns", "u1").state is BatchState.COMMITTED
    lines = flaky_log.read_text().splitlines()
    assert {line.split()[2] for line in lines} == {"before", "after"}
    assert len(lines) >= 4 * MAX_INJECTED_IN_A_ROW  # every call failed before it passed
    meta.close()


def test_a_checkpoint_push_that_took_effect_is_retried_safely(store, flaky_env) -> None:
    protocol = StreamProtocol(SourceOptions.from_spark({
        "endpoint": f"local://{store.path}", "table.name": "t", "tunnel.name": "q"}))
    flaky_env(0.99)
    tunnel = with_retries(inject_transient_errors(open_tunnel_service(f"local://{store.path}")))
    channel = store.list_channels("t")[0].channel_id
    start = tunnel.get_checkpoint(protocol.tunnel_id, channel)
    for _ in range(3):  # the same sequence again is accepted: pushes are idempotent
        tunnel.checkpoint(protocol.tunnel_id, channel,
                          Checkpoint(start.token, start.sequence_number))
    protocol.close()
    tunnel.close()


def test_protocol_and_reader_deliver_exactly_once_with_30_percent_transient_errors(
        store, flaky_env, monkeypatch) -> None:
    """Spark's call order in this process: latestOffset, commit, partitions, read — while
    30% of tunnel and meta-store calls fail before or after taking effect, with a split and a
    merge; a replayed read of every batch must give the same rows."""
    flaky_log = flaky_env(0.3)
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)  # same policy, shorter sleeps
    monkeypatch.setattr(retry, "BACKOFF_JITTER_S", 0.001)
    protocol = StreamProtocol(SourceOptions.from_spark({
        "endpoint": f"local://{store.path}", "table.name": "t", "tunnel.name": "q",
        "maxOffsetsPerChannel": "7", "channelRefreshIntervalMs": "0"}))
    delivered = []
    start = protocol.initial_offset()
    for i in range(60):
        if i < 30:
            for k in range(5):
                store.put_row("t", {"id": (i * 5 + k) % 40}, {"v": i})
        if i == 10:
            store.split_channel("t", store.list_channels("t")[0].channel_id)
        if i == 20:
            open_channels = sorted((c for c in store.list_channels("t") if not c.closed),
                                   key=lambda c: c.range_lo)
            store.merge_channels("t", open_channels[0].channel_id, open_channels[1].channel_id)
        end = protocol.latest_offset(start, None)
        if end == start:
            continue
        parts = protocol.plan(start, end)
        batch = [(p.channel_id, r) for p in parts for r in read_partition(p)]
        if i % 5 == 0:  # a second read of the batch (a retried task) gives the same rows
            assert batch == [(p.channel_id, r) for p in parts for r in read_partition(p)]
        delivered += batch
        protocol.commit(end)
        start = end
    protocol.close()
    result = verify(store.change_log("t"), [
        Delivered(channel_id=ch, sequence=r.sequence, key=key_of(r.primary_key), op=r.op.value,
                  position=(n,))
        for n, (ch, r) in enumerate(delivered)])
    assert result.ok, f"{result.summary()} {result.examples}"
    assert result.expected == 150
    assert len(flaky_log.read_text().splitlines()) > 50  # errors really were injected


# --- crash points -----------------------------------------------------------------------------


@pytest.fixture
def crash_dir(tmp_path: Path):
    """The harness's hook installed in this process through the product's seam."""
    crash_points.install(tmp_path)
    yield tmp_path
    crash_points.uninstall()


def test_crash_point_armed_to_raise_fires_once(crash_dir: Path) -> None:
    crash_point("mid_read")  # not armed: nothing happens
    (crash_dir / "arm-mid_read").write_text("raise")
    with pytest.raises(InjectedFault):
        crash_point("mid_read")
    assert (crash_dir / "hit-mid_read").exists()
    crash_point("mid_read")  # fired once only


def test_crash_point_armed_to_hold_saves_its_context_and_waits(crash_dir: Path) -> None:
    (crash_dir / "arm-read_before_claim").write_text("hold")
    (crash_dir / "release-read_before_claim").touch()  # released at once
    crash_point("read_before_claim", {"partition": 3})
    with open(crash_dir / "hit-read_before_claim.pkl", "rb") as f:
        assert pickle.load(f) == {"partition": 3}


def test_an_armed_point_does_nothing_without_the_hook(tmp_path: Path) -> None:
    """Production: the directory armed, no hook installed -- the seam does not look at it."""
    assert crash_hook.installed() is None
    (tmp_path / "arm-mid_read").write_text("raise")
    crash_point("mid_read")
    assert (tmp_path / "arm-mid_read").exists()


def test_the_full_matrix_covers_every_point_both_intervals_and_50_random_kills() -> None:
    full = scenarios.full(SEED, 50)
    crashes = {(s.steps[0].point, s.commit_interval) for s in full
               if s.name.startswith("crash/")}
    assert crashes == {(p, i) for p in scenarios.MATRIX_POINTS for i in (1, 5)}
    assert set(scenarios.MATRIX_POINTS) <= set(POINTS)
    random_kills = sum(isinstance(step, RandomKill) for s in full for step in s.steps)
    assert random_kills >= 50
    assert any(s.master.startswith("local-cluster") and s.meta == "dynamodb"
               and any(isinstance(step, CrashAt) for step in s.steps) for s in full)
    names = [s.name for s in full]
    assert len(names) == len(set(names))


def test_every_crash_point_is_called_by_the_product_and_every_call_is_named() -> None:
    """``POINTS`` (the harness's list) and the product's ``crash_point("...")`` calls agree."""
    root = Path(__file__).resolve().parent.parent
    called = {m.group(1) for package in ("connector", "tablestore_cdc")
              for path in (root / package).rglob("*.py")
              for m in re.finditer(r'crash_point\(\s*"(\w+)"', path.read_text())}
    assert called == set(POINTS)


def test_every_crash_point_is_in_the_reliability_docs_table() -> None:
    table = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    assert [p for p in POINTS if f"| `{p}` |" not in table] == []


# --- real processes ---------------------------------------------------------------------------


def _ids(scenario) -> str:
    return scenario.name


# the kills run in make test-extended (and every kill in the full matrix); the default suite
# keeps the fault kinds no other test of it makes (task retries, duplicate reads) within its
# time. Its kills: test_replicate_kill (a replicate into Delta, twice, across splits and a
# merge), test_restart on the oldest PySpark, test_tablestore_e2e over the wire; its transient
# errors: test_lakehouse_s3_faults_spark, test_multi_table_outage and the transport's tests
_EXTENDED = ("quick/random", "quick/crash-ci1", "quick/crash-ci5",
             "quick/lakehouse-delta-scd2", "transient-errors")


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=pytest.mark.extended) if s.name in _EXTENDED else s
    for s in scenarios.quick(SEED)], ids=_ids)
def test_quick_fault_scenario(scenario, tmp_path: Path) -> None:
    result = run_scenario(scenario, tmp_path, seed=SEED)
    print(result.line())
    assert result.ok, result.line()
    assert result.kills == scenario.kills
    assert result.lost == result.duplicated == result.out_of_order == 0


def _full_selected(config: pytest.Config) -> bool:
    return ("faults_full" in (config.getoption("markexpr") or "")
            or os.environ.get("TABLESTORE_CDC_FAULTS_FULL") == "1")


@pytest.mark.slow
@pytest.mark.faults_full
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("scenario", scenarios.full(SEED), ids=_ids)
def test_full_fault_scenario(scenario, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if not _full_selected(request.config):
        pytest.skip("the full fault matrix runs only when asked: -m faults_full "
                    "or TABLESTORE_CDC_FAULTS_FULL=1")
    result = run_scenario(scenario, tmp_path, seed=SEED)
    print(result.line())
    assert result.ok, result.line()
    assert result.kills == scenario.kills
    assert result.lost == result.duplicated == result.out_of_order == 0
