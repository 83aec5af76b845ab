"""Smoke test of ``python -m benchmarks``: the smallest configuration of every benchmark, once.

Checks only that each benchmark runs and reports its documented keys with positive numbers.
It never checks a figure against a target: the machine is shared and figures are noisy, so
targets are judged by running the suite (docs/performance.md), not by tests.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks.__main__ import main
from benchmarks.protocol import ProtocolConfig
from benchmarks.suite import PRESETS, TARGETS, combine, format_table, run_suite, summary

pytestmark = pytest.mark.slow

POSITIVE_KEYS = (
    "throughput_ratio",
    "throughput_tablestore_rows_s",
    "throughput_trivial_rows_s",
    "protocol_ms_per_batch_1ch",
    "protocol_ms_per_batch_16ch",
    "protocol_ms_per_batch_64ch",
    "protocol_ms_per_batch_256ch",
    "plan_ms_1000ch",
    "freshness_p50_ms",
    "freshness_p99_ms",
    "recovery_s",
    "memory_peak_rss_mb",
    "memory_arrow_mb",
    "memory_peak_over_arrow",
    "wire_decode_records_per_cpu_s",
    "wire_decode_records_per_cpu_s_python",
    "lakehouse_apply_ratio",
    "lakehouse_first_load_ratio",
    "lakehouse_growth",
    "lakehouse_iceberg_over_delta",
    "lakehouse_iceberg_over_delta_cpu",
    "lakehouse_first_load_ratio_written",
    "lakehouse_first_load_ratio_cpu",
    "lakehouse_delta_scd2_4000_per_batch_s",
    "lakehouse_iceberg_scd1_4000_first_load_rows_s",
    "reconcile_rows_s",
    "reconcile_seconds",
    "replicate_start_s",
    "replicate_rss_mb",
    "replicate_peak_rss_mb",
    "replicate_freshness_p50_ms",
    "replicate_new_table_s",
    "replicate_emulator_start_s",
    "replicate_emulator_rss_mb",
    "replicate_emulator_peak_rss_mb",
    "replicate_emulator_freshness_p50_ms",
    "replicate_emulator_new_table_s",
    "replicate_e2e_changes_s",
    "replicate_e2e_source_changes_s",
    "replicate_e2e_ratio",
    "replicate_e2e_ratio_session",
    "replicate_e2e_changes_s_wall",
    "replicate_e2e_changes_s_from_first_batch",
    "replicate_e2e_first_batch_s",
    "apply_engines_delta_4000_embedded_hot_changes_s",
    "apply_engines_delta_4000_spark_spread_changes_s",
    "apply_engines_delta_4000_spark_jvm_rss_mb",
    "apply_engines_delta_4000_spark_over_embedded_cpu_s",
)


def _positive(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


@pytest.mark.extended  # 3 to 4 minutes: make test-extended, or before a benchmark run
def test_every_benchmark_reports_its_keys(spark, tmp_path):
    results = summary(run_suite(PRESETS["smoke"], spark=spark, workdir=tmp_path / "work",
                                log=lambda message: None))
    results = json.loads(json.dumps(results))  # what --json writes
    for key in POSITIVE_KEYS:
        assert _positive(results.get(key)), (key, results.get(key))
    assert set(results["commit_interval"]) == {"1", "10", "50"}
    assert all(_positive(v) for v in results["commit_interval"].values())
    rereads = results["recovery_rereads"]
    assert isinstance(rereads, int) and rereads >= 0  # zero when the kill fell between batches
    machine = results["machine"]
    assert machine["cores"] >= 1 and machine["pyspark"] and machine["python"]
    assert len(results["load_avg_start"]) == 3 and len(results["load_avg_end"]) == 3
    assert set(results["targets"]) >= {"throughput_ratio", "protocol_ms_per_batch_64ch",
                                       "plan_ms_1000ch", "freshness_p50_ms",
                                       "memory_peak_over_arrow"}
    assert set(results["targets"]) <= set(TARGETS)
    assert results["details"]["memory"]["rows"] == PRESETS["smoke"].memory.records
    assert "throughput_ratio" in format_table(results)


def test_repeated_runs_report_median_and_spread(tmp_path):
    """``--repeat N``: every figure is the median of the runs, with min .. max, and each run's
    load average (the protocol benchmark alone, its local rows only: no Spark, a few seconds)."""
    local_only = ProtocolConfig(channel_counts=(64,), batches=3, warmup=1, steady_after=0,
                                plan_batches=1, dynamodb_retentions=(), wire_channels=(),
                                wire_delay_channels=(), wire_sequential_channels=())
    preset = dataclasses.replace(PRESETS["smoke"], protocol=local_only)
    runs = [summary(run_suite(preset, only=("protocol",), workdir=tmp_path / str(i),
                              log=lambda message: None)) for i in range(3)]
    combined = combine(runs)
    values = sorted(r["protocol_ms_per_batch_64ch"] for r in runs)
    spread = combined["spread"]["protocol_ms_per_batch_64ch"]
    assert (spread["min"], spread["max"]) == (values[0], values[-1])
    assert combined["protocol_ms_per_batch_64ch"] == pytest.approx(values[1], abs=1e-3)
    assert [r["load_avg_start"] for r in combined["runs"]] == [r["load_avg_start"] for r in runs]
    assert combined["repeat"] == 3 and "min .. max" in format_table(combined)


def test_cli_rejects_an_unknown_benchmark(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "nonsense"])
    assert "unknown benchmark" in capsys.readouterr().err
