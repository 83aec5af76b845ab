"""A fault proxy for S3 in tests: between a job (delta-rs, pyarrow, Hadoop's S3A) and moto's S3
server, loopback only.

``S3FaultProxy(moto_url).start()`` listens on 127.0.0.1 on a free port; the job's
``AWS_ENDPOINT_URL`` names its ``url``. Every request is forwarded to moto over one upstream
connection per client connection, and a seeded share ``rate`` of them (the test's process
decides; the job sees only the wire) misbehaves the way S3 and the network between do:

=====================  ====================================================================
``slow_down``          answered ``503 SlowDown`` with S3's XML error body, never forwarded
                       (S3 throttling a prefix)
``reset_before``       the client's connection reset (RST); moto never sees the request
``reset_after_put``    a PUT forwarded, applied by moto, then the client's connection reset
                       instead of the answer: the write landed, the client cannot know
``stall_after_put``    a PUT forwarded, applied by moto, then no answer until the client
                       gives up (its ``timeout``) or ``STALL_S`` passed; only as the
                       ``commit_every`` fault (``commit_fault``)
=====================  ====================================================================

The kinds are taken in turn among those that fit the request (``reset_after_put`` fits a PUT
only). A ``reset_after_put`` of a Delta commit (a PUT of ``_delta_log/<version>.json`` with
``If-None-Match``) is the **ambiguous commit**, counted under ``ambiguous_commit`` as well;
``commit_every=n`` also makes every n-th commit PUT one (a short run's few commits might
otherwise miss it), or a ``stall_after_put`` with ``commit_fault=STALL_AFTER_PUT`` (also an
ambiguous commit). A ``reset_after_put`` of a Spark checkpoint file (``offsets/N``,
``commits/N``, ``_spark_metadata/N``: S3A writes each to a temporary name and copies it there,
a PUT with ``x-amz-copy-source``) is an **ambiguous checkpoint** (``ambiguous_checkpoint``);
``checkpoint_every=n`` makes every n-th such PUT one. ``down(seconds)``: every request is
reset before it is forwarded for that long (an outage longer than the client's retries of a
commit). ``counts()``: the faults by
kind; ``counts(under="/BUCKET/PREFIX/")``: those of the requests under a prefix (the job's
own state apart from its targets); ``requests``: requests seen.

Clients that send ``Expect: 100-continue`` (S3A's uploads, in the SDK's ``aws-chunked``
encoding) are told ``100 Continue`` by the proxy and their request is forwarded whole
(``testkit.fault_proxy``); a fault is decided once the body is in.

Runs an asyncio loop in a daemon thread of the test's process. Only 127.0.0.1 is listened on
or connected to.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

from testkit.fault_proxy import LOOPBACK, LoopbackServer, Upstream, _abort, _Message

SLOW_DOWN = "slow_down"
RESET_BEFORE = "reset_before"
RESET_AFTER_PUT = "reset_after_put"
STALL_AFTER_PUT = "stall_after_put"
AMBIGUOUS_COMMIT = "ambiguous_commit"
AMBIGUOUS_CHECKPOINT = "ambiguous_checkpoint"
KINDS = (SLOW_DOWN, RESET_BEFORE, RESET_AFTER_PUT)
#: how long a stalled answer is held at most when the client never gives up (seconds)
STALL_S = 120.0
#: a Delta commit's object: ``<table>/_delta_log/<20 digits>.json``
COMMIT_PATH = re.compile(r"/_delta_log/\d{20}\.json(\?|$)")
#: a Spark checkpoint file, where S3A's rename copies it: ``.../offsets/7``
CHECKPOINT_PATH = re.compile(r"/(offsets|commits|_spark_metadata)/\d+(\.compact)?(\?|$)")
SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message>"
                  b"<RequestId>FAULTPROXY</RequestId></Error>")


class S3FaultProxy(LoopbackServer):
    """The proxy (module docstring). ``start()`` returns it listening; ``stop()``."""

    thread_name = "s3-fault-proxy"

    def __init__(self, upstream_url: str, *, rate: float = 0.05, seed: int = 0,
                 commit_every: int | None = None, commit_fault: str = RESET_AFTER_PUT,
                 checkpoint_every: int | None = None) -> None:
        if commit_fault not in (RESET_AFTER_PUT, STALL_AFTER_PUT):
            raise ValueError(f"commit_fault: {RESET_AFTER_PUT} or {STALL_AFTER_PUT}")
        parts = urlsplit(upstream_url)
        if parts.hostname not in (LOOPBACK, "localhost") or parts.port is None:
            raise ValueError("the S3 fault proxy only forwards to a loopback host:port")
        super().__init__()
        self.upstream = (LOOPBACK, parts.port)
        self.rate, self.commit_every, self.commit_fault = rate, commit_every, commit_fault
        self.checkpoint_every = checkpoint_every
        self.requests = 0
        self.commits = 0  # commit PUTs seen
        self.checkpoints = 0  # checkpoint file PUTs seen
        self._faults: list[tuple[str, str]] = []  # (kind, path) of every fault
        self._rng = random.Random(seed)
        self._turn = 0
        self._down_until = 0.0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def counts(self, under: str = "") -> dict[str, int]:
        """Faults injected by kind (every kind present, 0 when none), ``ambiguous_commit``
        and ``ambiguous_checkpoint`` among them; ``under``: of the request paths starting so
        only."""
        with self._lock:
            counts = Counter(kind for kind, path in self._faults if path.startswith(under))
            return {kind: counts[kind] for kind in
                    (*KINDS, STALL_AFTER_PUT, AMBIGUOUS_COMMIT, AMBIGUOUS_CHECKPOINT)}

    def clear(self) -> None:
        """Let everything through from now on."""
        with self._lock:
            self.rate, self.commit_every, self._down_until = 0.0, None, 0.0
            self.checkpoint_every = None

    def down(self, seconds: float) -> None:
        """Reset every request before it is forwarded for the next ``seconds``."""
        with self._lock:
            self._down_until = time.monotonic() + seconds

    def _decide(self, method: str, path: str, headers: dict[str, str]) -> str | None:
        commit = (method == "PUT" and "if-none-match" in headers
                  and COMMIT_PATH.search(path) is not None)
        checkpoint = (method == "PUT" and "x-amz-copy-source" in headers
                      and CHECKPOINT_PATH.search(path) is not None)
        with self._lock:
            self.requests += 1
            kind = RESET_BEFORE if time.monotonic() < self._down_until else None
            if commit:
                self.commits += 1
                if (kind is None and self.commit_every
                        and self.commits % self.commit_every == 0):
                    kind = self.commit_fault
            if checkpoint:
                self.checkpoints += 1
                if (kind is None and self.checkpoint_every
                        and self.checkpoints % self.checkpoint_every == 0):
                    kind = RESET_AFTER_PUT
            if kind is None and self.rate and self._rng.random() < self.rate:
                fitting = KINDS if method == "PUT" else (SLOW_DOWN, RESET_BEFORE)
                kind = fitting[self._turn % len(fitting)]
                self._turn += 1
            if kind is not None:
                self._faults.append((kind, path))
                if commit and kind in (RESET_AFTER_PUT, STALL_AFTER_PUT):
                    self._faults.append((AMBIGUOUS_COMMIT, path))
                if checkpoint and kind == RESET_AFTER_PUT:
                    self._faults.append((AMBIGUOUS_CHECKPOINT, path))
            return kind

    # --- one client connection (the loop's thread) --------------------------------------------

    async def _answer(self, request: _Message, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, upstream: Upstream) -> bool:
        method, path = (request.start.split(" ") + ["", ""])[:2]
        kind = self._decide(method, path, request.headers)
        if kind == RESET_BEFORE:
            _abort(writer)
            return False
        if kind == SLOW_DOWN:  # no body after a HEAD's answer: the client would read it as
            # the start of the next answer on the connection
            body = b"" if method == "HEAD" else SLOW_DOWN_BODY
            writer.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(SLOW_DOWN_BODY), body))
            await writer.drain()
            return True
        response = await upstream.forward(request, method)
        if response is None:
            _abort(writer)  # moto dropped it: so does the proxy
            return False
        if kind == RESET_AFTER_PUT:  # applied by moto; the client never hears
            _abort(writer)
            return False
        if kind == STALL_AFTER_PUT:  # applied; silent until the client gives up
            try:
                await asyncio.wait_for(reader.read(1), STALL_S)
            except (TimeoutError, ConnectionError):
                pass
            _abort(writer)
            return False
        writer.write(response.encode())
        await writer.drain()
        if response.headers.get("connection", "").lower() == "close":
            writer.close()
            return False
        return True
