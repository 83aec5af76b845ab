"""The whole benchmark suite: presets, one run of every benchmark, the summary and its targets.

``run_suite(preset)`` runs, in this order: the driver protocol (no Spark), then in one local
SparkSession (``local[2]``) throughput, commit interval and freshness, then (session stopped, so
it does not compete for the cores) recovery in separate runner processes. ``summary`` flattens
the results into the documented JSON keys; ``TARGETS`` says which keys have targets. Figures are
measured every run, never stored here.
"""

from __future__ import annotations

import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.apply_engines import ApplyEnginesConfig
from benchmarks.commit_interval import CommitIntervalConfig
from benchmarks.common import load_average, machine_facts, median
from benchmarks.freshness import FreshnessConfig
from benchmarks.lakehouse_apply import LakehouseApplyConfig
from benchmarks.memory import MemoryConfig
from benchmarks.protocol import ProtocolConfig
from benchmarks.reconcile import ReconcileConfig
from benchmarks.recovery import RecoveryConfig
from benchmarks.replicate import ReplicateConfig
from benchmarks.replicate_e2e import ReplicateE2EConfig
from benchmarks.throughput import ThroughputConfig
from benchmarks.wire import WireConfig

BENCHMARKS = ("protocol", "memory", "throughput", "commit_interval", "freshness", "recovery",
              "wire", "lakehouse_apply", "reconcile", "replicate", "replicate_emulator",
              "replicate_e2e", "apply_engines")


@dataclass(frozen=True)
class Preset:
    name: str
    protocol: ProtocolConfig
    throughput: ThroughputConfig
    commit_interval: CommitIntervalConfig
    freshness: FreshnessConfig
    recovery: RecoveryConfig
    memory: MemoryConfig = MemoryConfig()
    wire: WireConfig = WireConfig()
    lakehouse_apply: LakehouseApplyConfig = LakehouseApplyConfig()
    reconcile: ReconcileConfig = ReconcileConfig()
    replicate: ReplicateConfig = ReplicateConfig()
    #: the same over the Tablestore wire, from the emulator
    replicate_emulator: ReplicateConfig = ReplicateConfig(backend="emulator")
    replicate_e2e: ReplicateE2EConfig = ReplicateE2EConfig()
    #: the embedded apply against the Spark engine, each in a process of its own
    apply_engines: ApplyEnginesConfig = ApplyEnginesConfig()
    extra: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    # the smallest configuration of everything: for the smoke test, not for figures
    "smoke": Preset(
        "smoke",
        ProtocolConfig(batches=2, warmup=1, steady_after=4, plan_batches=1, wire_batches=2,
                       wire_channels=(16,), wire_delay_channels=(16,),
                       wire_sequential_channels=(16,), idle_triggers=2),
        ThroughputConfig(records=8_000, repeats=1, default_options=False),
        CommitIntervalConfig(batches=2, max_per_channel=20),
        FreshnessConfig(seconds=2.0, writes_per_second=5.0),
        RecoveryConfig(trials=1, max_per_channel=100, batches_before_kill=1),
        MemoryConfig(records=20_000),
        WireConfig(records=4_000, decode_records=4_000, repeats=1),
        LakehouseApplyConfig(sizes=(2_000, 4_000), load_batch=1_000, batches=2,
                             batch_size=500, hot_keys=1_000),
        reconcile=ReconcileConfig(rows=20_000),
        replicate=ReplicateConfig(tables=2, idle_s=2.0, freshness_writes=2, refresh_ms=1_000),
        replicate_emulator=ReplicateConfig(tables=2, idle_s=2.0, freshness_writes=2,
                                           refresh_ms=1_000, backend="emulator"),
        replicate_e2e=ReplicateE2EConfig(records=44_000, keys=2_000, rounds=1),  # two batches
        apply_engines=ApplyEnginesConfig(sizes=(4_000,), load_batch=2_000, batches=1,
                                         spread_batches=1, batch_size=500, hot_keys=1_000),
    ),
    # under 10 minutes on 2 cores
    "quick": Preset(
        "quick",
        ProtocolConfig(batches=10, warmup=2, plan_batches=3),  # steady: after 102 batches
        ThroughputConfig(records=1_000_000, repeats=2),
        CommitIntervalConfig(batches=30, max_per_channel=50),
        FreshnessConfig(seconds=20.0, writes_per_second=10.0),
        RecoveryConfig(trials=1),
        replicate=ReplicateConfig(tables=20, idle_s=15.0, freshness_writes=10),
        replicate_emulator=ReplicateConfig(tables=10, idle_s=15.0, freshness_writes=10,
                                           backend="emulator"),
        apply_engines=ApplyEnginesConfig(cluster_master="local-cluster[3,1,1024]"),
    ),
    "full": Preset(
        "full",
        ProtocolConfig(batches=20, warmup=2, plan_batches=5, plan_steady_after=102),
        ThroughputConfig(records=2_000_000, repeats=3),
        CommitIntervalConfig(batches=60, max_per_channel=50, repeats=2),
        FreshnessConfig(seconds=60.0, writes_per_second=20.0),
        RecoveryConfig(trials=3),
        lakehouse_apply=LakehouseApplyConfig(sizes=(100_000, 1_000_000, 10_000_000),
                                             load_batch=100_000),
        apply_engines=ApplyEnginesConfig(sizes=(1_000_000, 10_000_000), load_batch=500_000,
                                         batches=4, spread_batches=4, batch_size=50_000,
                                         hot_keys=200_000),
    ),
}

#: key -> (comparison, bound, unit): the targets of issues 8 and 12
TARGETS: dict[str, tuple[str, float, str]] = {
    "throughput_ratio": (">=", 0.5, ""),
    "throughput_ratio_default_options": (">=", 0.85, ""),
    "memory_peak_over_arrow": ("<=", 2.5, "x"),
    "memory_wire_peak_over_arrow": ("<=", 2.5, "x"),
    "protocol_ms_per_batch_64ch": ("<=", 30.0, "ms"),
    "protocol_ms_per_batch_256ch": ("<=", 80.0, "ms"),
    "protocol_ms_per_batch_1000ch": ("<=", 250.0, "ms"),
    "plan_ms_1000ch": ("<=", 1000.0, "ms"),
    "freshness_p50_ms": ("<=", 1500.0, "ms"),
    "wire_decode_records_per_cpu_s": (">=", 1_000_000.0, ""),
    "wire_client_throughput_ratio": (">=", 0.5, ""),
    "wire_client_us_per_record": ("<=", 3.0, "us"),
    "wire_protocol_ms_per_batch_256ch": ("<=", 80.0, "ms"),
    "wire_protocol_delay_ratio_ms_per_batch_256ch": ("<=", 3.0, "x"),
    # issue 39, at 1M rows (the largest size of the preset up to 1M)
    "lakehouse_apply_ratio": (">=", 0.3, ""),
    "lakehouse_first_load_ratio": (">=", 0.8, ""),
    "lakehouse_growth": ("<=", 2.0, "x"),
    "lakehouse_iceberg_over_delta": ("<=", 2.0, "x"),
    # issue 41: one million rows compared in at most 60 s
    "reconcile_rows_s": (">=", 1_000_000 / 60, ""),
    # issue 40: many tables in one application (100 in the full preset)
    "replicate_peak_rss_mb": ("<=", 6144.0, "MB"),
    "replicate_idle_cpu_cores": ("<=", 0.5, ""),
    "replicate_freshness_p50_ms": ("<=", 5000.0, "ms"),
    "replicate_new_table_s": ("<=", 30.0, "s"),
    "replicate_emulator_peak_rss_mb": ("<=", 6144.0, "MB"),
    "replicate_emulator_idle_cpu_cores": ("<=", 0.5, ""),
    "replicate_emulator_freshness_p50_ms": ("<=", 5000.0, "ms"),
    "replicate_emulator_new_table_s": ("<=", 30.0, "s"),
    # issues 39 and 55: the whole command into Delta against the source's own rate, each in
    # a new process started alike
    "replicate_e2e_ratio": (">=", 0.6, ""),
}


def run_suite(preset: Preset, spark: Any = None, only: tuple[str, ...] = BENCHMARKS,
              workdir: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmarks named in ``only``; returns the raw results with machine facts.

    ``spark``: an existing session to use (kept running); otherwise one is started and stopped.
    """
    from benchmarks import (
        commit_interval,
        freshness,
        lakehouse_apply,
        memory,
        protocol,
        reconcile,
        recovery,
        throughput,
        wire,
    )

    began = time.monotonic()
    results: dict[str, Any] = {"preset": preset.name, "machine": machine_facts(),
                               "load_avg_start": load_average()}
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="tablestore-bench-")) if workdir is None else workdir
    try:
        if "protocol" in only:
            log("protocol: driving StreamProtocol directly ...")
            results["protocol"] = protocol.run(preset.protocol, root / "protocol")
        if "lakehouse_apply" in only:
            log("lakehouse_apply: first loads and change streams into Delta and Iceberg vs "
                "plain appends, per target size ...")
            results["lakehouse_apply"] = lakehouse_apply.run(preset.lakehouse_apply,
                                                             root / "lakehouse_apply", log=log)
        if "apply_engines" in only:
            from benchmarks import apply_engines

            log("apply_engines: the embedded apply and the Spark engine, each in a process of "
                "its own, on the same batches ...")
            results["apply_engines"] = apply_engines.run(preset.apply_engines,
                                                         root / "apply_engines", log=log)
        if "reconcile" in only:
            log(f"reconcile: an equal pair of {preset.reconcile.rows:,} rows (embedded store, "
                "Delta) compared ...")
            results["reconcile"] = reconcile.run(preset.reconcile, root / "reconcile")
        if "memory" in only:
            log(f"memory: one Python process reads a {preset.memory.records:,}-record "
                "partition ...")
            results["memory"] = memory.run(preset.memory, root / "memory")
        spark_needed = [b for b in ("throughput", "commit_interval", "freshness", "wire",
                                    "replicate_e2e") if b in only]
        if spark_needed:
            session = spark
            if session is None:
                from connector.spark import local_session

                log("starting a local[2] SparkSession ...")
                session = local_session("tablestore-cdc-benchmarks", master="local[2]")
            try:
                if "throughput" in only:
                    log("throughput: tablestore vs trivial source into noop ...")
                    results["throughput"] = throughput.run(session, preset.throughput,
                                                           root / "throughput")
                if "commit_interval" in only:
                    log("commit_interval: small batches, commitInterval 1/10/50 ...")
                    results["commit_interval"] = commit_interval.run(
                        session, preset.commit_interval, root / "commit_interval")
                if "freshness" in only:
                    log("freshness: stamped writes into a foreachBatch sink ...")
                    results["freshness"] = freshness.run(session, preset.freshness,
                                                         root / "freshness")
                if "wire" in only:
                    log("wire: PlainBuffer decode rate; tablestore over the emulator vs "
                        "trivial source ...")
                    results["wire"] = wire.run(session, preset.wire, root / "wire")
                if "replicate_e2e" in only:
                    from benchmarks import replicate_e2e

                    log(f"replicate_e2e: {preset.replicate_e2e.records:,} changes, the source "
                        "into noop, then replicate --once into Delta ...")
                    results["replicate_e2e"] = replicate_e2e.run(
                        session, preset.replicate_e2e, root / "replicate_e2e", log=log)
            finally:
                if spark is None:
                    session.stop()
        for name in ("replicate", "replicate_emulator"):
            if name in only:
                config: ReplicateConfig = getattr(preset, name)
                log(f"{name}: {config.tables} tables x {config.channels} channels in one "
                    f"application ({config.backend}) ...")
                from benchmarks import replicate

                results[name] = replicate.run(config, root / name, log=log)
        if "recovery" in only:
            log("recovery: SIGKILL the driver tree, restart ...")
            results["recovery"] = recovery.run(preset.recovery, root / "recovery")
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    results["load_avg_end"] = load_average()
    results["duration_s"] = round(time.monotonic() - began, 1)
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The flat, documented keys (plus the raw results under their benchmark names)."""
    out: dict[str, Any] = {"preset": results["preset"], "machine": results["machine"],
                           "load_avg_start": results["load_avg_start"],
                           "load_avg_end": results["load_avg_end"],
                           "duration_s": results["duration_s"],
                           "python_implementation": platform.python_implementation()}
    if "throughput" in results:
        t = results["throughput"]
        out["throughput_ratio"] = round(t["read_path"]["ratio"], 3)
        out["throughput_tablestore_rows_s"] = round(t["read_path"]["tablestore_rows_s"])
        out["throughput_trivial_rows_s"] = round(t["read_path"]["trivial_rows_s"])
        if "default_options" in t:
            out["throughput_ratio_default_options"] = round(t["default_options"]["ratio"], 3)
    if "protocol" in results:
        from benchmarks.protocol import headline

        for key, value in results["protocol"].items():
            if key.startswith("wire_"):  # the tunnel over the wire: wire_protocol_*
                rest = key.removeprefix("wire_")
                out[f"wire_protocol_ms_per_batch_{rest}"] = headline(value)["total_ms"]
                out[f"wire_protocol_tunnel_calls_per_batch_{rest}"] = \
                    headline(value)["tunnel_calls_per_batch"]
                if "idle_ms" in value:
                    out[f"wire_protocol_idle_ms_{rest}"] = value["idle_ms"]
                continue
            out[f"protocol_ms_per_batch_{key}"] = headline(value)["total_ms"]
        out["plan_ms_1000ch"] = headline(results["protocol"]["1000ch"])["plan_ms"]
        for key in [k for k in out if k.startswith(("wire_protocol_ms_", "wire_protocol_idle_"))
                    and "_delay" in k]:
            plain_key = re.sub(r"_delay[0-9.]+ms", "", key)
            if out.get(plain_key):  # how much a round trip per request adds: overlap or sum
                ratio_key = plain_key.replace("wire_protocol_", "wire_protocol_delay_ratio_", 1)
                out[ratio_key] = round(out[key] / out[plain_key], 2)
    if "memory" in results:
        m = results["memory"]
        out["memory_peak_rss_mb"] = m["peak_rss_mb"]
        out["memory_arrow_mb"] = m["arrow_mb"]
        out["memory_peak_over_arrow"] = m["peak_over_arrow"]
        if "wire" in m:
            out["memory_wire_peak_rss_mb"] = m["wire"]["peak_rss_mb"]
            out["memory_wire_arrow_mb"] = m["wire"]["arrow_mb"]
            out["memory_wire_peak_over_arrow"] = m["wire"]["peak_over_arrow"]
    if "freshness" in results:
        out["freshness_p50_ms"] = results["freshness"]["p50_ms"]
        out["freshness_p99_ms"] = results["freshness"]["p99_ms"]
    if "commit_interval" in results:
        out["commit_interval"] = results["commit_interval"]["records_s"]
    if "wire" in results:
        w = results["wire"]
        out["wire_decode_records_per_cpu_s"] = round(w["decode"]["records_per_cpu_s"])
        out["wire_decode_records_per_cpu_s_python"] = round(
            w["decode"]["records_per_cpu_s_python"])
        out["wire_throughput_ratio"] = round(w["throughput"]["ratio"], 3)
        out["wire_throughput_rows_s"] = round(w["throughput"]["wire_rows_s"])
        out["wire_client_throughput_ratio"] = round(w["client_throughput"]["ratio"], 3)
        out["wire_client_rows_s"] = round(w["client_throughput"]["client_rows_s"])
        out["wire_client_us_per_record"] = round(w["client_cpu"]["us_per_record"], 2)
        out["wire_client_us_per_record_prefetch_off"] = round(
            w["client_cpu"]["prefetch_off"]["us_per_record"], 2)
    if "lakehouse_apply" in results:
        out.update(lakehouse_summary(results["lakehouse_apply"]))
    if "apply_engines" in results:
        from benchmarks.apply_engines import summary as engines_summary

        out.update(engines_summary(results["apply_engines"]))
    for name in ("replicate", "replicate_emulator", "replicate_e2e"):
        if name in results:
            out.update({k: v for k, v in results[name].items() if k.startswith("replicate_")})
    if "reconcile" in results:
        r = results["reconcile"]
        out["reconcile_rows_s"] = round(r["rows_s"])
        out["reconcile_seconds"] = round(r["seconds"], 2)
        out["reconcile_rows"] = r["rows"]
    if "recovery" in results:
        out["recovery_s"] = results["recovery"]["recovery_s"]
        out["recovery_rereads"] = results["recovery"]["rereads"]
    out["targets"] = _targets(out)
    out["details"] = {k: results[k] for k in BENCHMARKS if k in results}
    return out


def lakehouse_summary(details: dict[str, Any]) -> dict[str, Any]:
    """``lakehouse_<format>_scd<n>_<size>_<figure>`` for every run, and the headline figures
    the targets read: Delta SCD 1 at the largest size up to 1M rows (apply and first-load
    ratios, the first load's in CPU time and over an append of the rows it writes), its
    per-batch growth, and Iceberg's per-batch time (and CPU time) over Delta's there."""
    out: dict[str, Any] = {}
    for name, figures in details.items():
        if isinstance(figures, dict):
            for key in ("apply_ratio", "first_load_ratio", "first_load_ratio_cpu",
                        "first_load_ratio_written",
                        "per_batch_s", "per_batch_cpu_s", "apply_changes_s",
                        "first_load_rows_s"):
                value = figures[key]
                out[f"lakehouse_{name}_{key}"] = round(value) if key.endswith("rows_s") or (
                    key == "apply_changes_s") else round(value, 4)
        else:
            out[f"lakehouse_{name}"] = round(figures, 3)
    sizes = sorted({f["rows"] for f in details.values() if isinstance(f, dict)})
    headline = max([s for s in sizes if s <= 1_000_000] or sizes)
    delta = details.get(f"delta_scd1_{headline}")
    if delta is not None:
        out["lakehouse_apply_ratio"] = round(delta["apply_ratio"], 4)
        out["lakehouse_first_load_ratio"] = round(delta["first_load_ratio"], 4)
        out["lakehouse_first_load_ratio_cpu"] = round(delta["first_load_ratio_cpu"], 4)
        out["lakehouse_first_load_ratio_written"] = round(delta["first_load_ratio_written"], 4)
        out["lakehouse_growth"] = round(details["delta_scd1_growth"], 3)
        iceberg = details.get(f"iceberg_scd1_{headline}")
        if iceberg is not None:
            out["lakehouse_iceberg_over_delta"] = round(
                iceberg["per_batch_s"] / delta["per_batch_s"], 3)
            out["lakehouse_iceberg_over_delta_cpu"] = round(
                iceberg["per_batch_cpu_s"] / delta["per_batch_cpu_s"], 3)
    return out


def _targets(out: dict[str, Any]) -> dict[str, Any]:
    return {
        key: {"target": f"{op} {bound:g}{unit}", "value": out[key],
              "met": out[key] >= bound if op == ">=" else out[key] <= bound}
        for key, (op, bound, unit) in TARGETS.items() if key in out
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary of ``--repeat N`` runs (each a ``summary``): every figure is the median of
    the runs, ``spread`` holds min / median / max / values per figure, ``runs`` the load average
    at each run's start and end, so a noisy run can be told from a regression."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = dict(runs[0])
    spread: dict[str, Any] = {}

    def stats(values: list[float]) -> dict[str, Any]:
        med = median(values)
        return {"min": min(values), "median": round(med, 3), "max": max(values),
                "values": values}

    skip = {"duration_s"}
    for key, value in runs[0].items():
        if key in skip:
            continue
        if _is_number(value) and all(_is_number(r.get(key)) for r in runs):
            spread[key] = stats([r[key] for r in runs])
            out[key] = spread[key]["median"]
        elif key == "commit_interval":
            out[key] = {}
            for interval in value:
                values = [r[key][interval] for r in runs if interval in r.get(key, {})]
                spread[f"commit_interval {interval} (records/s)"] = stats(values)
                out[key][interval] = round(median(values))
    out["spread"] = spread
    out["repeat"] = len(runs)
    out["runs"] = [{"load_avg_start": r["load_avg_start"], "load_avg_end": r["load_avg_end"],
                    "duration_s": r["duration_s"]} for r in runs]
    out["load_avg_start"], out["load_avg_end"] = runs[0]["load_avg_start"], runs[-1]["load_avg_end"]
    out["duration_s"] = round(sum(r["duration_s"] for r in runs), 1)
    out["targets"] = _targets(out)
    out["details"] = [r["details"] for r in runs]
    return out


def format_table(s: dict[str, Any]) -> str:
    """The printed table: every summary figure, its target and whether it is met."""
    rows: list[tuple[str, str, str, str, str]] = []
    spread = s.get("spread", {})

    def add(key: str, value: Any, fmt: str = "{:,.1f}") -> None:
        target = s["targets"].get(key)
        low_high = ""
        if key in spread:
            low_high = f"{fmt.format(spread[key]['min'])} .. {fmt.format(spread[key]['max'])}"
        rows.append((key, fmt.format(value), low_high, target["target"] if target else "",
                     ("met" if target["met"] else "MISSED") if target else ""))

    for key in ("throughput_ratio", "throughput_ratio_default_options"):
        if key in s:
            add(key, s[key], "{:.3f}")
    for key in ("throughput_tablestore_rows_s", "throughput_trivial_rows_s"):
        if key in s:
            add(key, s[key], "{:,.0f}")
    for key in sorted((k for k in s if k.startswith("protocol_ms_per_batch_")),
                      key=lambda k: int(k.rsplit("_", 1)[1].removesuffix("ch"))):
        add(key, s[key])
    for key in sorted(k for k in s if k.startswith("wire_protocol_")):
        add(key, s[key], "{:.2f}" if "_ratio_" in key else "{:.1f}")
    for key in ("memory_peak_rss_mb", "memory_arrow_mb", "memory_wire_peak_rss_mb",
                "memory_wire_arrow_mb"):
        if key in s:
            add(key, s[key])
    for key in ("memory_peak_over_arrow", "memory_wire_peak_over_arrow"):
        if key in s:
            add(key, s[key], "{:.2f}")
    for key in ("plan_ms_1000ch", "freshness_p50_ms", "freshness_p99_ms", "recovery_s"):
        if key in s:
            add(key, s[key])
    if "recovery_rereads" in s:
        add("recovery_rereads", s["recovery_rereads"], "{:,}")
    for interval, rate in s.get("commit_interval", {}).items():
        add(f"commit_interval {interval} (records/s)", rate, "{:,.0f}")
    for key in ("wire_throughput_ratio", "wire_client_throughput_ratio"):
        if key in s:
            add(key, s[key], "{:.3f}")
    for key in ("wire_throughput_rows_s", "wire_client_rows_s", "wire_decode_records_per_cpu_s",
                "wire_decode_records_per_cpu_s_python"):
        if key in s:
            add(key, s[key], "{:,.0f}")
    for key in sorted(k for k in s if k.startswith("lakehouse_")):
        add(key, s[key], "{:,.0f}" if key.endswith("_s") and not key.endswith(
            ("per_batch_s", "per_batch_cpu_s")) else "{:.3f}")
    for key in (k for k in s if k.startswith("apply_engines_")):  # in the order measured
        if key.endswith("_load_avg"):
            rows.append((key, " ".join(f"{x:g}" for x in s[key]), "", "", ""))
        elif key.endswith("_error"):
            rows.append((key, "failed", "", "", ""))
        else:
            add(key, s[key], "{:,.0f}" if key.endswith(("rows_s", "changes_s", "_mb"))
                and "_over_" not in key else "{:.3f}")
    if "reconcile_rows_s" in s:
        add("reconcile_rows_s", s["reconcile_rows_s"], "{:,.0f}")
    if "reconcile_seconds" in s:
        add("reconcile_seconds", s["reconcile_seconds"], "{:.1f}")
    for key in ("wire_client_us_per_record", "wire_client_us_per_record_prefetch_off"):
        if key in s:
            add(key, s[key], "{:.2f}")
    for key in (k for k in s if k.startswith("replicate_")):  # in the order measured
        add(key, s[key], "{:.3f}" if key.endswith(("_cores", "_ratio")) else "{:,.1f}")
    width = max(len(r[0]) for r in rows)
    span = max([len(r[2]) for r in rows] + [len("min .. max")]) if spread else 0
    value_head = "median" if spread else "value"
    head = f"{'figure':<{width}}  {value_head:>12}  "
    head += f"{'min .. max':<{span}}  " if spread else ""
    lines = [head + f"{'target':<10}  status", "-" * (width + 34 + (span + 2 if spread else 0))]
    for k, v, lh, t, m in rows:
        mid = f"{lh:<{span}}  " if spread else ""
        lines.append(f"{k:<{width}}  {v:>12}  {mid}{t:<10}  {m}")
    m = s["machine"]
    lines.append(f"machine: {m['cores']} cores, Python {m['python']}, PySpark {m['pyspark']}, "
                 f"load avg {s['load_avg_start']} -> {s['load_avg_end']}; "
                 f"preset {s['preset']}, {s['duration_s']:.0f} s")
    for i, run in enumerate(s.get("runs", []), 1):
        lines.append(f"  run {i}: load avg {run['load_avg_start']} -> {run['load_avg_end']}, "
                     f"{run['duration_s']:.0f} s")
    return "\n".join(lines)
