"""The Tablestore wire path: PlainBuffer decode rate, our side alone, throughput over the emulator.

Four figures (docs/performance.md, docs/tablestore.md):

- ``decode``: records per second per core that the client's ``read_page`` path turns from
  ReadRecords answers' bytes (500 records each, PlainBuffer with sequence info, as the emulator
  encodes the benchmark table's changes) into page batches -- the compiled scan and decoder
  when they are built (``read_answer``, ``records.decode_columns``), and the protobuf parse with
  the pure-Python fallback in the same run; the details also give the rate through protobuf
  ``Record`` objects, through the product's ``Record`` objects (the default adapter) and on
  records with a before-image (the JSON text columns).
  CPU time of this one thread (``time.thread_time``), so other load on the machine does not
  count; the best of three passes.
- ``throughput``: records per second from ``format("tablestore")`` over
  ``http://`` -- the emulator in its own process (``tablestore-cdc emulator``) serving a
  pre-filled store -- into Spark's ``noop`` sink, against the trivial Python source with the same
  rows, channels and partitions (``benchmarks.trivial_source``), side by side in the same session.
  The meta store is SQLite (this measures the tunnel's wire path, not the meta table's).
  Both queries run with ``Trigger.AvailableNow`` (``benchmarks.throughput.run_noop``): the same
  trigger and batch structure for both sources; the rate is rows / the summed
  ``triggerExecution`` of the batches that carried rows, as in ``benchmarks.throughput``.
  (Before AvailableNow reached the wire backend these runs used a processing-time trigger,
  whose first batch also carried the Python planning worker's start: ~0.3 s that the trivial
  source's AvailableNow run spends before its first batch.)
- ``client_throughput``: the same query over ``benchmarks.wire_server --replay`` -- the same
  store's ReadRecords answers encoded once (during a warm-up run, not counted) and then served
  from memory by a lean server in its own process -- against the trivial source, side by side in
  the same session: what the client, the source and Spark cost, without the emulator's encoder
  (``replayed`` / ``encoded``: the measured runs' ReadRecords answers served from memory or
  encoded anew; the latter should be 0).
- ``client_cpu``: without Spark, this process reads every channel through the client's
  ``read_page`` over the replay server, as the reader does (pages of ``reader.PAGE_SIZE``, the
  same caps): CPU seconds of this process (every thread: the prefetch included) per record, and
  the wall-clock rate; best of three passes. ``prefetch_off_*``: the same with the client's
  prefetch switched off.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    INSTANCE,
    KEY_ID,
    SECRET,
    TABLE,
    EmulatorProcess,
    create_bench_table,
    fill,
    median,
)
from benchmarks.throughput import _trivial, before_share, register_trivial, run_noop
from benchmarks.wire_server import WireServerProcess
from connector.local import LocalTablestore


@dataclass(frozen=True)
class WireConfig:
    records: int = 200_000
    channels: int = 4
    decode_records: int = 50_000
    repeats: int = 2


def decode_rate(records: int, workdir: Path) -> dict[str, Any]:
    """Decode ``records`` wire records (one thread); records per CPU-second.

    The records are the benchmark table's changes as the emulator encodes them (PlainBuffer
    with sequence info), sent in ReadRecords answers of 500 (the service's page size);
    each figure starts from an answer's bytes:

    ``records_per_cpu_s``: what the client's ``read_page`` does -- ``read_answer`` (the compiled
    scan, when it is built) and ``records.decode_columns`` into the page batch (the compiled
    decoder reading the records from the answer's bytes; ``decoder`` says which ran);
    ``records_per_cpu_s_python``: the same answers where the extension is not built (the
    protobuf parse and the pure-Python decoder, the fallback), in the same run;
    ``protobuf_records_per_cpu_s``: the protobuf parse and the compiled decoder reading the
    ``Record`` objects (the read path before the scan); ``records_path_per_cpu_s``: through
    ``Record`` objects (``decode_page`` + ``records_to_page``, the default adapter), for
    comparison; ``decode_page_per_cpu_s``: ``Record`` objects only. The benchmark table's
    changes carry no before-image and only declared columns; ``json_*`` repeat the two page
    decoders on the same records each given a before-image with an undeclared column
    (``_before`` JSON text on every row, ``_extra`` on the updates, whose after-image merges
    the before-image). CPU time of this one thread (``time.thread_time``), so other load on
    the machine does not count; the best of three passes."""
    from connector.tunnel.page import PageLayout, records_to_page
    from connector.tunnel.tablestore import messages as m
    from connector.tunnel.tablestore.columnar import compiled_available
    from connector.tunnel.tablestore.plainbuffer import Cell, CellOp, Row, encode_row
    from connector.tunnel.tablestore.read_answer import read_answer
    from connector.tunnel.tablestore.records import (
        decode_columns,
        decode_columns_python,
        decode_page,
    )
    from tablestore_emulator.tunnel_api import encode_record

    workdir.mkdir(parents=True, exist_ok=True)
    store = LocalTablestore(workdir / "decode.db")
    create_bench_table(store, 1)
    fill(store, records)
    wire = [encode_record(r, base=False) for r in store.change_log(TABLE)]
    layout = PageLayout.of_table(store.table_schema(TABLE))
    store.close()
    page = 500  # the service's page size

    def answers(of: list[Any]) -> list[bytes]:
        return [m.ReadRecordsResponse(records=of[lo:lo + page], next_token="t")
                .SerializeToString() for lo in range(0, len(of), page)]

    def best_of_three(decode: Any, bodies: list[bytes]) -> float:
        best = float("inf")
        for _ in range(3):
            began = time.thread_time()
            for body in bodies:
                decode(body)
            best = min(best, time.thread_time() - began)
        return best

    def objects_of(body: bytes) -> Any:
        return read_answer(body, scan=False).records

    def read_page_path(body: bytes) -> Any:  # as the client's read_page decodes an answer
        return decode_columns(read_answer(body, scan=True).records, "ch", "t", None, layout)

    def fallback(body: bytes) -> Any:  # the same where the extension is not built
        return decode_columns_python(objects_of(body), "ch", "t", None, layout)

    plain = answers(wire)
    columns = best_of_three(read_page_path, plain)
    python = best_of_three(fallback, plain)
    protobuf = best_of_three(
        lambda b: decode_columns(objects_of(b), "ch", "t", None, layout), plain)
    via_records = best_of_three(
        lambda b: records_to_page(decode_page(objects_of(b), "ch", "t", None), layout), plain)
    objects = best_of_three(lambda b: decode_page(objects_of(b), "ch", "t", None), plain)

    # the JSON writers' share: a before-image of three values, one of them undeclared
    with_json = []
    for i, w in enumerate(wire):
        r = type(w)()
        r.CopyFrom(w)
        r.origin_record = encode_row(Row((), (
            Cell("name", f"old-name-{i:08d}", CellOp.PUT, 1), Cell("qty", i - 1, CellOp.PUT, 1),
            Cell("score", i / 7, CellOp.PUT, 1))))
        with_json.append(r)
    json_bodies = answers(with_json)
    json_columns = best_of_three(read_page_path, json_bodies)
    json_python = best_of_three(fallback, json_bodies)
    payload = sum(len(w.record) + len(w.origin_record) for w in wire)
    return {"records": len(wire), "decoder": "compiled" if compiled_available() else "python",
            "records_per_cpu_s": len(wire) / columns,
            "records_per_cpu_s_python": len(wire) / python,
            "protobuf_records_per_cpu_s": len(wire) / protobuf,
            "records_path_per_cpu_s": len(wire) / via_records,
            "decode_page_per_cpu_s": len(wire) / objects,
            "json_records_per_cpu_s": len(wire) / json_columns,
            "json_records_per_cpu_s_python": len(wire) / json_python,
            "bytes_per_record": payload / len(wire), "cpu_s": columns}


def client_cpu(url: str, cap: int, prefetch: bool = True, passes: int = 3) -> dict[str, Any]:
    """Read every channel of a fresh tunnel from its start up to ``cap`` records with
    ``read_page`` (no Spark, no meta store): CPU of this process per record, best of
    ``passes``; see the module docstring."""
    from connector.reader import PAGE_SIZE
    from connector.tunnel.page import PageLayout
    from connector.tunnel.tablestore.client import TablestoreTunnelService

    query = f"instance={INSTANCE}&access_key_id={KEY_ID}&access_key_secret={SECRET}"
    tunnel = TablestoreTunnelService.from_uri(
        f"{url}?{query}" + ("" if prefetch else "&prefetch=false"))
    try:
        info = tunnel.create_tunnel(TABLE, f"client-{uuid.uuid4().hex[:8]}")
        layout = PageLayout.of_table(tunnel.table_schema(TABLE))
        channels = [c.channel_id for c in tunnel.describe_tunnel(TABLE, info.tunnel_name).channels]
        starts = {ch: tunnel.get_checkpoint(info.tunnel_id, ch).token for ch in channels}
        best: tuple[float, float, int] = (float("inf"), 0.0, 0)
        for _ in range(passes):
            cpu, wall = time.process_time(), time.perf_counter()
            records = 0
            for ch in channels:
                token, count = starts[ch], 0
                while count < cap:
                    page = tunnel.read_page(info.tunnel_id, ch, token,
                                            min(PAGE_SIZE, cap - count), layout)
                    count += page.count
                    token = page.next_token
                    if token == "finished" or not page.may_more:
                        break
                records += count
            spent = (time.process_time() - cpu, time.perf_counter() - wall, records)
            best = min(best, spent)
    finally:
        tunnel.close()
    cpu_s, wall_s, records = best
    return {"records": records, "us_per_record": cpu_s / records * 1e6,
            "rows_s": records / wall_s, "prefetch": prefetch}


def _wire_df(spark: Any, url: str, meta: Path, max_per_channel: int) -> Any:
    return (spark.readStream.format("tablestore").option("endpoint", url)
            .option("instance.name", INSTANCE).option("access.key.id", KEY_ID)
            .option("access.key.secret", SECRET).option("table.name", TABLE)
            .option("tunnel.name", f"bench-{uuid.uuid4().hex[:8]}")
            .option("meta.store", f"sqlite://{meta}")
            .option("maxOffsetsPerChannel", str(max_per_channel)).load())


def run(spark: Any, config: WireConfig, workdir: Path) -> dict[str, Any]:
    """Both figures (see the module docstring)."""
    register_trivial(spark)
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"decode": decode_rate(config.decode_records, workdir / "decode")}
    store_path = workdir / "wire.db"
    store = LocalTablestore(store_path)
    create_bench_table(store, config.channels)
    fill(store, config.records)
    channel_rows = [c.head_seq for c in store.list_channels(TABLE)]
    share = before_share(store)
    store.close()
    expected, cap = sum(channel_rows), max(channel_rows)
    shutil.copy(store_path, workdir / "replay.db")  # the replay server's own copy
    emulator = EmulatorProcess(store_path, workdir / "emulator.log")
    replay = WireServerProcess(workdir / "replay.db", workdir / "replay.log", INSTANCE, KEY_ID,
                               SECRET, replay=True)
    try:
        # warm-up, not counted: Python workers import the wire client, the JVM its row path;
        # the replay server encodes every ReadRecords answer the measured runs will ask for
        run_noop(spark, _wire_df(spark, emulator.url, workdir / "warm-meta.db", cap),
                 workdir / "ckpt-warm-wire")
        run_noop(spark, _wire_df(spark, replay.url, workdir / "warm-meta-c.db", cap),
                 workdir / "ckpt-warm-client")
        run_noop(spark, _trivial(spark, channel_rows, cap, share), workdir / "ckpt-warm")
        out["client_cpu"] = client_cpu(replay.url, cap)
        out["client_cpu"]["prefetch_off"] = client_cpu(replay.url, cap, prefetch=False)
        kept = replay.stats()
        runs: dict[str, list[dict[str, Any]]] = {"trivial": [], "wire": [], "client": []}
        for i in range(config.repeats):
            runs["trivial"].append(run_noop(spark, _trivial(spark, channel_rows, cap, share),
                                            workdir / f"ckpt-t{i}"))
            runs["client"].append(run_noop(
                spark, _wire_df(spark, replay.url, workdir / f"meta-c{i}.db", cap),
                workdir / f"ckpt-c{i}"))
            runs["wire"].append(run_noop(
                spark, _wire_df(spark, emulator.url, workdir / f"meta-{i}.db", cap),
                workdir / f"ckpt-w{i}"))
        served = replay.stats()
        for name, results in runs.items():
            for r in results:
                if r["rows"] != expected:
                    raise RuntimeError(f"{name} delivered {r['rows']} rows, expected {expected}")
    finally:
        emulator.stop()
        replay.stop()
    wire, trivial, client = (median([r["rows_s"] for r in runs[k]])
                             for k in ("wire", "trivial", "client"))
    out["client_throughput"] = {
        "records": expected, "channels": config.channels, "ratio": client / trivial,
        "client_rows_s": client, "trivial_rows_s": trivial,
        "client_runs_rows_s": [round(r["rows_s"]) for r in runs["client"]],
        "client_batch_ms": runs["client"][0]["batch_ms"],
        "trivial_batch_ms": runs["trivial"][0]["batch_ms"],
        "replayed": served["replayed"] - kept["replayed"],
        "encoded": served["encoded"] - kept["encoded"],
    }
    out["throughput"] = {
        "records": expected, "channels": config.channels, "ratio": wire / trivial,
        "wire_rows_s": wire, "trivial_rows_s": trivial,
        "wire_runs_rows_s": [round(r["rows_s"]) for r in runs["wire"]],
        "trivial_runs_rows_s": [round(r["rows_s"]) for r in runs["trivial"]],
        "wire_batch_ms": runs["wire"][0]["batch_ms"],
        "cpu_count": os.cpu_count(),
    }
    return out
