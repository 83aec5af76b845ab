"""Driver-side protocol cost per batch: meta-store and tunnel calls for planning and commit.

What is measured: ``connector.protocol.StreamProtocol`` driven directly, without Spark, in the
order Spark calls it for every micro-batch::

    latest_offset(start)      # GetOffset: catch-up commit, has_new_data, mint the end UUID
    commit(end of previous)   # Commit: mark committed, push checkpoints, retention GC
    plan(start, end)          # GetBatch: positions, channel refresh, manifest write
    read_partition(p) for p   # executors' work: NOT timed, but real (claims every end)

on an embedded store (``local://``, SQLite meta store beside it, the defaults) with ``N``
channels and ``records_per_channel`` new records written to every channel before each batch, so
every batch reads, claims and pushes every channel. ``channelRefreshIntervalMs=0``: every batch
refreshes the channel list from the tunnel (the default refreshes at most once a second, so this
is the conservative case). Figures are medians of ``latest_offset + commit + plan`` wall time in
milliseconds over ``batches`` batches (``total_cpu_ms``: the driver process's CPU time for the
same calls; the rest of the wall time is waiting for fsyncs or for a core), taken twice in one
run:

- ``young``: right after the first ``warmup`` batches (batch 0 reads every channel's checkpoint
  from the tunnel), while the meta table holds only a few batches;
- ``steady``: after ``steady_after`` batches, once the meta table holds as many batches as
  retention keeps (``metaRetentionBatches``, default 100): a long-running query. This is the
  headline figure, as several meta-store calls list the retained batches.

``plan_ms_1000ch`` is the median ``plan`` time alone over 1,000 channels, measured the same way.

``wire_16ch`` / ``wire_64ch`` / ``wire_256ch``: the same loop with the tunnel over the wire --
the Tablestore client against the emulator's routes served by ``benchmarks.wire_server`` in a
process of its own on 127.0.0.1 (so the driver's threads do not share a GIL with the server) --
and the SQLite meta store, so the figures are the driver's tunnel protocol cost:
``tunnel_calls_per_batch`` (requests the driver sent during ``latest_offset + commit + plan``,
executors' reads excluded) and ``calls_by_path`` (the same, per RPC, summed over the window).
Every batch reads and pushes every channel's checkpoint, so this shows what the pushes cost
(one Checkpoint per channel once the client knows the stored sequence number; a GetCheckpoint
first for a channel it has not seen). These rows are measured in the ``young`` window only:
the meta store's retention cost is the local rows' subject. ``idle_ms`` / ``idle_calls``:
afterwards, the median of ``latest_offset`` calls with nothing new (an idle trigger: one
DescribeTunnel and a one-record read per channel). ``wire_*_delay2ms``: the same with every
response sent 2 ms after its request arrived (``--delay-ms``), as over a network with that
round trip: calls that overlap cost it once, calls in a row once each.

``dynamodb_keep10_64ch`` / ``dynamodb_keep100_64ch``: the same loop at 64 channels with the meta
store on DynamoDB (a moto server on 127.0.0.1, ``benchmarks.meta_latency.moto_uri``) and
``metaRetentionBatches`` 10 / 100, steady once that many batches are retained. Every DynamoDB
request of the driver's store asks for ``ReturnConsumedCapacity=TOTAL`` (a botocore hook on its
client) and ``rcu_per_batch`` / ``wcu_per_batch`` are the capacity units it consumed per batch,
averaged over the window (retention runs every ``metaRetentionBatches // 10`` commits, so a
window of 10 batches holds its share). Executors' claims (one ``PutItem`` per channel and batch,
their own clients) are not in these figures. moto computes capacity units as DynamoDB does (item
size in 4 KB read / 1 KB write units); the milliseconds are moto's, not DynamoDB's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    TABLE,
    create_bench_table,
    keys_per_channel,
    median,
    percentile,
)
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.tunnel.tablestore.client import DRIVER_CONCURRENCY, TablestoreTunnelService
from testkit.emulator import INSTANCE, KEY_ID, SECRET, SOURCE_OPTIONS
from testkit.partition_reads import read_partition

#: by then the meta table holds all it keeps: ``metaRetentionBatches`` (default 100) committed
#: batches, the one in flight and the initial one
STEADY_AFTER = 102


@dataclass(frozen=True)
class ProtocolConfig:
    channel_counts: tuple[int, ...] = (1, 16, 64, 256)
    batches: int = 10
    warmup: int = 2
    #: measure the steady state after this many batches (0: only the young figures)
    steady_after: int = STEADY_AFTER
    records_per_channel: int = 3
    plan_channels: int = 1000
    plan_batches: int = 3
    plan_steady_after: int = 0
    #: ``metaRetentionBatches`` values measured with the meta store on DynamoDB (moto server)
    dynamodb_retentions: tuple[int, ...] = (10, 100)
    dynamodb_channels: int = 64
    #: channel counts measured with the tunnel over the wire (the emulator's routes)
    wire_channels: tuple[int, ...] = (16, 64, 256)
    #: batches measured per wire row (each reads every channel over the wire: slow to set up)
    wire_batches: int = 5
    #: ... and again with this delay per request (ms), at these channel counts
    wire_delay_ms: float = 2.0
    wire_delay_channels: tuple[int, ...] = (64, 256)
    #: ... and with the driver's calls one after another (``concurrent_calls`` 1: the code
    #: before they overlapped), with and without the delay, at these channel counts
    wire_sequential_channels: tuple[int, ...] = (256,)
    #: idle triggers measured after the wire rows' batches
    idle_triggers: int = 5


#: DynamoDB operations that report consumed capacity, and which kind of units they consume
_CAPACITY_OPS = {"GetItem": "read", "Query": "read", "Scan": "read", "BatchGetItem": "read",
                 "PutItem": "write", "UpdateItem": "write", "DeleteItem": "write",
                 "BatchWriteItem": "write"}


def count_capacity(client: Any) -> dict[str, float]:
    """Make every request of the boto3 DynamoDB ``client`` return its consumed capacity, and
    sum it: the returned dict's ``read`` / ``write`` grow as requests complete."""
    totals = {"read": 0.0, "write": 0.0}

    def ask(params: dict[str, Any], **_: Any) -> None:
        params["ReturnConsumedCapacity"] = "TOTAL"

    def add(kind: str) -> Any:
        def after(parsed: dict[str, Any], **_: Any) -> None:
            consumed = parsed.get("ConsumedCapacity") or []
            for entry in consumed if isinstance(consumed, list) else [consumed]:
                totals[kind] += float(entry.get("CapacityUnits") or 0.0)
        return after

    for operation, kind in _CAPACITY_OPS.items():
        client.meta.events.register(f"provide-client-params.dynamodb.{operation}", ask)
        client.meta.events.register(f"after-call.dynamodb.{operation}", add(kind))
    return totals


#: set to a directory to profile the wire rows' server (cProfile stats per row, for
#: docs/performance.md)
PROFILE_ENV = "TABLESTORE_CDC_BENCH_PROFILE"


class _WireTunnel:
    """The emulator's routes on the bench store in a process of their own
    (``benchmarks.wire_server``), every request counted by path: the wire variant's tunnel."""

    def __init__(self, path: Path, delay_ms: float) -> None:
        from benchmarks.wire_server import WireServerProcess

        profile = os.environ.get(PROFILE_ENV)  # a directory: the server's cProfile stats
        self.server = WireServerProcess(
            path, path.with_suffix(".server.log"), INSTANCE, KEY_ID, SECRET,
            delay_ms=delay_ms,
            profile=Path(profile) / f"{path.stem}-server.prof" if profile else None)

    @property
    def calls(self) -> dict[str, int]:
        return dict(self.server.stats()["calls"])

    def options(self) -> dict[str, str]:
        return {"endpoint": self.server.url, **SOURCE_OPTIONS}


def measure(channels: int, batches: int, warmup: int, records_per_channel: int,
            workdir: Path, steady_after: int = 0, meta_store: str | None = None,
            retention: int | None = None, wire: bool = False, delay_ms: float = 0.0,
            idle_triggers: int = 0, sequential: bool = False) -> dict[str, Any]:
    """Run the batches over ``channels`` channels; per-phase medians in ms for the ``young``
    window (after ``warmup`` batches) and, if ``steady_after``, the ``steady`` one. With a
    DynamoDB ``meta_store`` URI, also the capacity units its driver requests consumed. With
    ``wire``, the tunnel is the emulator over HTTP (``delay_ms`` per request) and the driver's
    tunnel calls are counted; then ``idle_triggers`` idle ``latest_offset`` calls are timed.
    ``sequential``: the Tablestore client's ``concurrent_calls`` is 1 for this run."""
    workdir.mkdir(parents=True, exist_ok=True)
    suffix = (("-" + str(retention) if retention else "") + ("-wire" if wire else "")
              + (f"-delay{delay_ms:g}" if delay_ms else "") + ("-seq" if sequential else ""))
    path = workdir / f"protocol-{channels}ch{suffix}.db"
    store = LocalTablestore(path)
    create_bench_table(store, channels)
    keys = [k for ks in keys_per_channel(channels, records_per_channel) for k in ks]
    spark_options = {
        "endpoint": f"local://{path}", "table.name": TABLE, "tunnel.name": "bench",
        "channelRefreshIntervalMs": "0",
    }
    emulator = _WireTunnel(path, delay_ms) if wire else None
    if emulator is not None:
        spark_options.update(emulator.options())
        spark_options["meta.store"] = f"sqlite://{workdir}/protocol-{channels}ch{suffix}.meta.db"
    if meta_store:
        spark_options["meta.store"] = meta_store
    if retention:
        spark_options["metaRetentionBatches"] = str(retention)
    options = SourceOptions.from_spark(spark_options)
    windows = {"young": range(warmup, warmup + batches)}
    if steady_after:
        windows["steady"] = range(max(steady_after, warmup + batches),
                                  max(steady_after, warmup + batches) + batches)
    total_batches = max(w.stop for w in windows.values())
    if sequential:  # pushes and probes one after another (until the finally below)
        TablestoreTunnelService.concurrent_calls = 1
    protocol = StreamProtocol(options)
    schema = store.table_schema(TABLE)
    capacity = None
    if options.meta_store.startswith("dynamodb://"):
        capacity = count_capacity(protocol.meta.wrapped.client)  # type: ignore[attr-defined]
    phases = ("latest_offset", "commit", "plan", "total", "total_cpu", "rcu", "wcu")
    samples: dict[str, dict[str, list[float]]] = {w: {n: [] for n in phases} for w in windows}
    calls: dict[str, dict[str, int]] = {w: {} for w in windows}
    first_plan_ms = 0.0
    read = 0
    try:
        start = protocol.initial_offset()
        previous_end: dict | None = None
        for batch in range(total_batches):
            store.batch_write(TABLE, [("put", {"id": k}, {"name": f"b{batch}", "qty": batch})
                                      for k in keys])
            r0, w0 = (capacity["read"], capacity["write"]) if capacity else (0.0, 0.0)
            calls0 = emulator.calls if emulator is not None else {}
            c0, t0 = time.process_time(), time.perf_counter()
            end = protocol.latest_offset(start, None)
            t1 = time.perf_counter()
            if previous_end is not None:
                protocol.commit(previous_end)
            t2 = time.perf_counter()
            partitions = protocol.plan(start, end)
            t3, c3 = time.perf_counter(), time.process_time()
            rcu, wcu = ((capacity["read"] - r0, capacity["write"] - w0) if capacity
                        else (0.0, 0.0))
            batch_calls = ({r: n - calls0.get(r, 0) for r, n in emulator.calls.items()
                            if n != calls0.get(r, 0)} if emulator is not None else {})
            if end == start or len(partitions) != channels:
                raise RuntimeError(f"batch {batch}: {len(partitions)} partitions planned, "
                                   f"expected {channels}")
            # executors (untimed); the schema given, as the source's reader has it
            read += sum(len(read_partition(p, schema)) for p in partitions)
            if batch == 0:
                first_plan_ms = (t3 - t2) * 1000
            for window, span in windows.items():
                if batch in span:
                    for name, seconds in zip(phases[:5], (t1 - t0, t2 - t1, t3 - t2, t3 - t0,
                                                          c3 - c0), strict=True):
                        samples[window][name].append(seconds * 1000)
                    samples[window]["rcu"].append(rcu)
                    samples[window]["wcu"].append(wcu)
                    for route, n in batch_calls.items():
                        calls[window][route] = calls[window].get(route, 0) + n
            previous_end, start = end, end
        if emulator is not None and idle_triggers:
            protocol.commit(previous_end)  # everything read and pushed: nothing is new
            idle_ms, idle_calls = [], []
            for _ in range(idle_triggers):
                calls0 = emulator.calls
                t0 = time.perf_counter()
                if protocol.latest_offset(start, None) != start:
                    raise RuntimeError("an idle trigger planned a batch")
                idle_ms.append((time.perf_counter() - t0) * 1000)
                idle_calls.append(sum(emulator.calls.values()) - sum(calls0.values()))
    finally:
        TablestoreTunnelService.concurrent_calls = DRIVER_CONCURRENCY
        protocol.close()
        if emulator is not None:
            emulator.server.stop()
        store.close()
    if read != total_batches * len(keys):
        raise RuntimeError(f"read {read} records, expected {total_batches * len(keys)}")
    out: dict[str, Any] = {"first_plan_ms": round(first_plan_ms, 2), "batches": batches}
    for window, by_phase in samples.items():
        out[window] = {f"{k}_ms": round(median(by_phase[k]), 2) for k in phases[:5]}
        out[window]["total_p90_ms"] = round(percentile(by_phase["total"], 0.9), 2)
        out[window]["after_batches"] = windows[window].start
        if capacity is not None:  # means: retention's listing comes every few batches
            for kind in ("rcu", "wcu"):
                out[window][f"{kind}_per_batch"] = round(sum(by_phase[kind]) / batches, 2)
                out[window][f"{kind}_max"] = round(max(by_phase[kind]), 2)
        if emulator is not None:
            out[window]["tunnel_calls_per_batch"] = round(sum(calls[window].values()) / batches,
                                                          2)
            out[window]["calls_by_path"] = dict(sorted(calls[window].items()))
    if emulator is not None and idle_triggers:
        out["idle_ms"] = round(median(idle_ms), 2)
        out["idle_calls"] = median(idle_calls)
    return out


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The steady-state figures when measured, else the young ones."""
    return result.get("steady", result["young"])


def run(config: ProtocolConfig, workdir: Path) -> dict[str, Any]:
    """Every channel count of ``config``, then the 1,000-channel planning figure."""
    out: dict[str, Any] = {}
    for channels in config.channel_counts:
        out[f"{channels}ch"] = measure(channels, config.batches, config.warmup,
                                       config.records_per_channel, workdir,
                                       config.steady_after)
    out[f"{config.plan_channels}ch"] = measure(config.plan_channels, config.plan_batches, 1,
                                               config.records_per_channel, workdir,
                                               config.plan_steady_after)
    for channels in config.wire_channels:
        out[f"wire_{channels}ch"] = measure(channels, config.wire_batches, config.warmup,
                                            config.records_per_channel, workdir, wire=True,
                                            idle_triggers=config.idle_triggers)
    delays = (0.0, config.wire_delay_ms) if config.wire_delay_ms else (0.0,)
    for sequential in (False, True):
        for delay in delays:
            for channels in (config.wire_sequential_channels if sequential else
                             config.wire_channels if not delay else config.wire_delay_channels):
                if not delay and not sequential:
                    continue  # measured above
                name = (f"wire_{channels}ch" + (f"_delay{delay:g}ms" if delay else "")
                        + ("_sequential" if sequential else ""))
                out[name] = measure(channels, config.wire_batches, config.warmup,
                                    config.records_per_channel, workdir, wire=True,
                                    delay_ms=delay, idle_triggers=config.idle_triggers,
                                    sequential=sequential)
    # only the retentions the preset's steady window reaches (none in the smoke preset)
    retentions = [k for k in config.dynamodb_retentions if k + 2 <= config.steady_after]
    if retentions:
        from benchmarks.meta_latency import moto_uri

        for keep in retentions:
            with moto_uri() as uri:  # a fresh moto server: nothing left from the last one
                out[f"dynamodb_keep{keep}_{config.dynamodb_channels}ch"] = measure(
                    config.dynamodb_channels, config.batches, config.warmup,
                    config.records_per_channel, workdir, steady_after=keep + 2,
                    meta_store=uri, retention=keep)
    return out
