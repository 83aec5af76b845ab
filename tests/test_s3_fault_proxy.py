"""The S3 fault proxy (``testkit.s3_faults``) carries what Hadoop's S3A sends and reads, on a
moto server on 127.0.0.1: a HEAD's answer keeps the object's ``Content-Length`` (S3A takes a
file's length from it), an upload with ``Expect: 100-continue`` is told to go on and lands
whole, a ``503 SlowDown`` to a HEAD has no body (the next answer on the connection is read
intact), and a checkpoint file's copy reset after it landed is counted as the ambiguous
checkpoint, under the prefix it was made in."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import boto3
import pytest

from testkit.aws import new_s3_bucket
from testkit.s3_faults import AMBIGUOUS_CHECKPOINT, SLOW_DOWN, S3FaultProxy


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(moto_endpoint, rate=0.0, checkpoint_every=2) as started:
        yield started


def _raw(proxy: S3FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    """The head of the next answer on ``sock``, its blank line included."""
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, data
        data += chunk
    return data


def test_a_head_keeps_the_objects_length(proxy: S3FaultProxy, moto_endpoint: str) -> None:
    bucket = new_s3_bucket(moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint).put_object(Bucket=bucket, Key="k",
                                                              Body=b"x" * 904)
    head = boto3.client("s3", endpoint_url=proxy.url).head_object(Bucket=bucket, Key="k")
    assert head["ContentLength"] == 904


def test_an_upload_expecting_100_continue_lands_whole(proxy: S3FaultProxy,
                                                      moto_endpoint: str) -> None:
    bucket = new_s3_bucket(moto_endpoint)
    with _raw(proxy) as sock:
        sock.sendall(f"PUT /{bucket}/k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())
        assert _answer(sock).startswith(b"HTTP/1.1 100 ")  # before any byte of the body
        sock.sendall(b"hello")
        assert _answer(sock).startswith(b"HTTP/1.1 200 ")
    body = boto3.client("s3", endpoint_url=moto_endpoint).get_object(Bucket=bucket, Key="k")
    assert body["Body"].read() == b"hello"


def test_a_slow_down_to_a_head_has_no_body(proxy: S3FaultProxy, moto_endpoint: str) -> None:
    bucket = new_s3_bucket(moto_endpoint)
    head = f"HEAD /{bucket}/k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    with _raw(proxy) as sock:
        proxy.rate = 1.0  # the first fault a HEAD gets is SlowDown
        sock.sendall(head)
        assert _answer(sock).startswith(b"HTTP/1.1 503 ")
        proxy.clear()
        sock.sendall(head)  # the same connection: its next answer (moto's) starts at once
        assert _answer(sock).startswith(b"HTTP/1.1 ")  # not with a stray <?xml of the 503
    assert proxy.counts()[SLOW_DOWN] == 1


def test_a_checkpoint_files_copy_reset_after_it_landed_is_counted_under_its_prefix(
        proxy: S3FaultProxy, moto_endpoint: str) -> None:
    bucket = new_s3_bucket(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=proxy.url)
    for n in (0, 1):  # the second copy is reset after moto applied it; boto3 copies again
        s3.put_object(Bucket=bucket, Key=f"state/offsets/.{n}.tmp", Body=b"v1")
        s3.copy_object(Bucket=bucket, Key=f"state/offsets/{n}",
                       CopySource={"Bucket": bucket, "Key": f"state/offsets/.{n}.tmp"})
    assert proxy.checkpoints == 3
    assert proxy.counts(under=f"/{bucket}/state/")[AMBIGUOUS_CHECKPOINT] == 1
    assert proxy.counts(under=f"/{bucket}/lake/")[AMBIGUOUS_CHECKPOINT] == 0
    assert s3.get_object(Bucket=bucket, Key="state/offsets/1")["Body"].read() == b"v1"
