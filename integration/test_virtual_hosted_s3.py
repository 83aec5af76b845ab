"""Virtual-hosted addressing, as Alibaba Cloud OSS requires it (docs/lakehouse.md's OSS recipe):
one ``AWS_ENDPOINT_URL`` without the bucket and ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`` serve
the ``delta+s3://`` target (delta-rs), the job's own files (``--output s3://``, pyarrow) and
boto3 alike.

In a network namespace whose hosts file (``/etc/netns/NAME/hosts``, which ``ip netns exec``
mounts over ``/etc/hosts``) names only ``BUCKET.s3.amazonaws.com`` (127.0.0.1), a moto S3
server on that namespace's loopback: a request in path style (to ``s3.amazonaws.com``) cannot
even resolve its host, so every request that succeeds was addressed to the bucket's own host.
moto takes the bucket from such a host. Needs root (skipped otherwise, as the other namespace
tests are)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("deltalake")

from integration.netfaults import netns  # noqa: E402
from testkit.processes import REPO  # noqa: E402

BUCKET = "osslake"

_INNER = r"""
import json, os, sys
from testkit.aws import AWS_TEST_ENV, start_moto_server
os.environ.update(AWS_TEST_ENV)
proc, url = start_moto_server()
endpoint = "http://s3.amazonaws.com:" + url.rsplit(":", 1)[1]  # the service, not the bucket
os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
                   "AWS_REGION": "us-east-1"})
import boto3
from botocore.config import Config
s3 = boto3.client("s3", config=Config(s3={"addressing_style": "virtual"}))
bucket = sys.argv[1]
s3.create_bucket(Bucket=bucket)
from deltalake import DeltaTable
from tablestore_cdc.lakehouse.target import open_apply_sink
from tablestore_cdc.pipeline.output import JobOutput
from testkit.lakehouse import batch, change
sink = open_apply_sink(f"delta+s3://{bucket}/lake/orders", key_columns=["id"])
sink.apply(batch(*(change("PUT", "c", i, 1, i, f"n{i}", i) for i in range(20))), "q", 0)
sink.apply(batch(change("UPDATE", "c", 20, 2, 3, "three", 33),
                 change("DELETE", "c", 21, 2, 4)), "q", 1)
rows = DeltaTable(f"s3://{bucket}/lake/orders",
                  storage_options=sink.storage_options).to_pyarrow_table().to_pylist()
state = JobOutput.parse(f"s3://{bucket}/state")
state.write_bytes(b"batch 7: refused", "_tables", "t.failed")
keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
print(json.dumps({"rows": sorted([r["id"], r["name"]] for r in rows), "keys": keys,
                  "failed": state.read_bytes("_tables", "t.failed").decode(),
                  "options": sink.storage_options}))
proc.kill()
"""


@pytest.mark.slow
def test_one_endpoint_without_the_bucket_serves_delta_rs_pyarrow_and_boto3_virtual_hosted(
        tmp_path: Path) -> None:
    reason = netns.unavailable()  # probed here, not at collection: it makes a namespace
    if reason:
        pytest.skip(reason)
    name = f"cdcvh{uuid.uuid4().hex[:8]}"
    hosts = Path("/etc/netns") / name
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        hosts.mkdir(parents=True)
        (hosts / "hosts").write_text(f"127.0.0.1 localhost\n127.0.0.1 {BUCKET}.s3.amazonaws.com\n")
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
                       check=True, timeout=30)
        done = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", _INNER, BUCKET], cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
            timeout=180)
    finally:
        subprocess.run(["ip", "netns", "del", name], timeout=30)
        shutil.rmtree(hosts, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = sorted([i, "three" if i == 3 else f"n{i}"] for i in range(20) if i != 4)
    assert result["rows"] == expected
    assert result["failed"] == "batch 7: refused"
    assert "state/_tables/t.failed" in result["keys"]
    assert any(k.startswith("lake/orders/_delta_log/") for k in result["keys"])
    # delta-rs was given the bucket's own endpoint (its object_store adds no bucket itself)
    endpoint = result["options"]["AWS_ENDPOINT_URL"]
    assert endpoint.startswith(f"http://{BUCKET}.s3.amazonaws.com:"), result["options"]
