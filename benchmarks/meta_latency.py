"""Latency of the executor's meta-store calls: ``put_end_checkpoint`` and ``get_end_checkpoint``.

Every ``read()`` on an executor claims its channel's end (one put-if-absent) before handing out
rows, and a replay first looks the end up (one get); these two calls sit on the critical path
of every partition. Run from the repository root::

    python -m benchmarks.meta_latency [--ops 500] [--backends sqlite,dynamodb,tablestore]

- ``sqlite``: a temp file (WAL, ``synchronous=FULL``: each claim is an fsync'd commit);
- ``dynamodb``: a moto server started on 127.0.0.1 on a free port (fake credentials; this
  measures the client, HTTP and moto, not AWS: real DynamoDB adds network round trips of
  typically 2-10 ms in-region);
- ``tablestore``: the project's Tablestore emulator (``tablestore-cdc emulator``) in a child
  process on 127.0.0.1, reached through the official SDK over HTTP (fake credentials; this
  measures the SDK, HTTP and the emulator over a SQLite file, not the service).

Prints p50/p99/mean in milliseconds per operation: a new claim, the same claim again (a
replay: idempotent put that finds the stored row), and a get.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meta_store import open_meta_store
from meta_store.base import EndCheckpoint, MetaStore
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.waiting import wait_until

NAMESPACE = "bench;table=orders;tunnel=t1"


def _end(channel: int) -> EndCheckpoint:
    return EndCheckpoint(channel_id=f"ch-{channel:05d}", start_token=f"tok-{channel}-0",
                         token=f"tok-{channel}-1", sequence_number=channel + 1, records=100,
                         attempt="bench/1/task-0", written_at=time.time())


def _timed(n: int, op: Callable[[int], object]) -> list[float]:
    samples = []
    for i in range(n):
        started = time.perf_counter()
        op(i)
        samples.append((time.perf_counter() - started) * 1000.0)
    return samples


def measure(store: MetaStore, ops: int) -> dict[str, list[float]]:
    """put (new claim), put again (replay of the same claim), get; ``ops`` of each."""
    batch = str(uuid.uuid4())
    for i in range(10):  # warm up connections and caches
        store.put_end_checkpoint(NAMESPACE, "warm-up", _end(i))
        store.get_end_checkpoint(NAMESPACE, "warm-up", f"ch-{i:05d}")
    ends = [_end(i) for i in range(ops)]
    return {
        "put_end_checkpoint (new)": _timed(
            ops, lambda i: store.put_end_checkpoint(NAMESPACE, batch, ends[i])),
        "put_end_checkpoint (replay)": _timed(
            ops, lambda i: store.put_end_checkpoint(NAMESPACE, batch, ends[i])),
        "get_end_checkpoint": _timed(
            ops, lambda i: store.get_end_checkpoint(NAMESPACE, batch, ends[i].channel_id)),
    }


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@contextmanager
def sqlite_uri() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        yield f"sqlite://{tmp}/meta.db"


@contextmanager
def moto_uri() -> Iterator[str]:
    """A moto server on 127.0.0.1 (a child process) and a URI for a fresh table on it."""
    for key, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ[key] = value  # never send real credentials to a local fake
    os.environ.pop("AWS_SESSION_TOKEN", None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return False
        return True

    try:
        wait_until(f"the moto server to listen on port {port}", listening, timeout=30,
                   interval=0.05, process=proc)
        yield (f"dynamodb://cdc-bench?region=us-east-1&endpoint_url=http://127.0.0.1:{port}"
               "&create_table=true")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def tablestore_uri() -> Iterator[str]:
    """The Tablestore emulator in a child process and a URI for a fresh table on it."""
    os.environ["ALIBABA_CLOUD_ACCESS_KEY_ID"] = KEY_ID  # never real credentials to a fake
    os.environ["ALIBABA_CLOUD_ACCESS_KEY_SECRET"] = SECRET
    os.environ.pop("ALIBABA_CLOUD_SECURITY_TOKEN", None)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tablestore_cdc", "emulator", "--store", f"{tmp}/emu.db",
             "--instance", INSTANCE, "--access-key-id", KEY_ID, "--access-key-secret", SECRET],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if not line.startswith("listening on "):
                raise RuntimeError(f"the emulator did not start (printed {line!r})")
            url = line.removeprefix("listening on ")
            yield f"tablestore://{INSTANCE}/cdc_bench?endpoint={url}&create_table=true"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


BACKENDS = {"sqlite": ("SQLite (temp file)", sqlite_uri),
            "dynamodb": ("DynamoDB (moto server)", moto_uri),
            "tablestore": ("Tablestore (emulator)", tablestore_uri)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=500, help="operations per measurement")
    parser.add_argument("--backends", default="sqlite,dynamodb,tablestore",
                        help="comma-separated: " + ", ".join(BACKENDS))
    args = parser.parse_args(argv)
    rows = []
    for name in args.backends.split(","):
        label, uri_factory = BACKENDS[name.strip()]
        with uri_factory() as uri, open_meta_store(uri) as store:
            for op, samples in measure(store, args.ops).items():
                rows.append((label, op, len(samples), _percentile(samples, 0.5),
                             _percentile(samples, 0.99), statistics.fmean(samples)))
    header = (f"{'backend':<24} {'operation':<28} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}"
              f" {'mean ms':>8}")
    print(header)
    print("-" * len(header))
    for label, op, n, p50, p99, mean in rows:
        print(f"{label:<24} {op:<28} {n:>5} {p50:>8.2f} {p99:>8.2f} {mean:>8.2f}")


if __name__ == "__main__":
    main()
