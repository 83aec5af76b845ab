"""Where the tunnel's head is, for Spark's own progress report (``reportLatestOffset``).

Spark (PySpark >= 4.2) calls ``DataSourceStreamReader.reportLatestOffset()`` in the planning
process on the driver once per trigger, right after ``latestOffset``, and puts the returned dict
in ``StreamingQueryProgress.sources[i].latestOffset`` — the field monitoring systems already
read. ``TablestoreStreamReader.reportLatestOffset`` delegates to ``LatestOffsetReporter.report``
here, which returns::

    {"source": "<namespace>", "measuredAt": "2026-01-01T00:00:00.000Z",
     "channels": {"ch-0001": {"head": "00000000000000000412", "recordsBehind": 12,
                              "secondsBehind": 0.8, "exact": true}, ...},
     "channelCount": 3, "recordsBehindLatest": 37, "secondsBehindLatest": 1.4,
     "lagExact": true}

Lag is measured from where the batch being planned *starts* (the positions after the previous
batch): ``recordsBehindLatest`` counts what this batch and later ones still have to read. It
plays the part of the Kafka source's ``*OffsetsBehindLatest`` metrics (docs/inspection.md).
The lag figures are always numbers: where a backend can only count part of a channel (more
than one read ahead of the position, a Tablestore child waiting for its parents, a trimmed
position) its figures are lower bounds, said by ``"exact": false`` and ``"lagExact": false``
(``connector.tunnel.types.ChannelLag``). ``head`` is ``null`` where the backend reports no
heads (Tablestore); the whole report is ``None`` (Spark shows ``latestOffset: null``) when the
backend can tell neither heads nor lag.

Cost and freshness. The lag is measured again whenever the batch start moved: one ``lag`` call
for the whole tunnel per batch (the embedded store: one SQLite transaction; Tablestore: one
DescribeTunnel and one ReadRecords per readable channel; DynamoDB Streams: one
GetShardIterator and GetRecords per shard). Back-to-back batches (Trigger.AvailableNow, a busy
query) thus each get the figure of their own start -- reusing a figure measured at an earlier
start reported records already read. (Subtracting what the batches in between read instead
would save that call but needs their end checkpoints from the meta table, and would miss the
records written meanwhile.) While the start stays (an idle query's triggers), and for the heads
(``head_sequences``, which reads every shard to its tip on DynamoDB Streams), a measurement is
reused until ``REFRESH_FACTOR`` times its own duration has passed (at least ``MIN_REFRESH_S``,
at most ``MAX_REFRESH_S``): a tunnel whose lag takes 2 s to measure is asked at most every
40 s while a local one is asked every second. A failure to measure never fails the query: it is
logged once and the last report is kept.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("connector.latest_offset_report")

#: a measurement is reused for REFRESH_FACTOR x its own duration (clamped to the bounds below)
REFRESH_FACTOR = 20.0
MIN_REFRESH_S = 1.0
MAX_REFRESH_S = 60.0


def _iso(epoch: float) -> str:
    """Spark's own timestamp format in progress reports (UTC, milliseconds, ``Z``)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class LatestOffsetReporter:
    """Builds (and caches) the ``latestOffset`` report of one query. Lives beside
    ``StreamProtocol`` in the planning process on the driver; never pickled.

    ``protocol`` is a ``connector.protocol.StreamProtocol``: only its public ``tunnel``,
    ``tunnel_id``, ``namespace`` and ``positions_after`` are used.
    """

    def __init__(self, protocol: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.protocol = protocol
        self.clock = clock
        self._report: dict[str, Any] | None = None
        #: the batch start ``_report`` was measured from
        self._start: str | None = None
        #: the heads of the last full measurement, reused when only the start moved
        self._heads: dict[str, str] | None = None
        self._next_refresh = 0.0
        self._failed = False
        self.measurements = 0

    def report(self, start_uuid: str | None) -> dict[str, Any] | None:
        """The report for a batch starting at ``start_uuid`` (``None``: before any batch; lag is
        then measured from the tunnel's pushed checkpoints). Measured again when the start
        moved (the lag only) or the last measurement is due (module docstring)."""
        now = self.clock()
        due = now >= self._next_refresh
        if self._report is not None and not due and start_uuid == self._start:
            return self._report
        try:
            report = self._measure(start_uuid, heads_too=due or self._report is None)
        except Exception as exc:  # monitoring must never fail the query
            if not self._failed:
                log.warning("cannot measure the tunnel's head for Spark's progress: %s", exc)
            self._failed = True
            self._next_refresh = now + MAX_REFRESH_S
            return self._report
        self._failed = False
        if due:
            took = self.clock() - now
            self._next_refresh = now + min(MAX_REFRESH_S, max(MIN_REFRESH_S,
                                                              REFRESH_FACTOR * took))
        self._report, self._start = report, start_uuid
        self.measurements += 1
        return report

    def _measure(self, start_uuid: str | None, heads_too: bool) -> dict[str, Any] | None:
        protocol = self.protocol
        tokens: dict[str, str] = {}
        if start_uuid is not None:
            tokens = {ch: p.token for ch, p in protocol.positions_after(start_uuid).items()}
        if heads_too:
            self._heads = protocol.tunnel.head_sequences(protocol.tunnel_id)
        heads = self._heads
        lag = protocol.tunnel.lag(protocol.tunnel_id, tokens)
        if heads is None and lag is None:
            return None
        # channels still to read: lag leaves out TERMINATED ones; without lag, every head
        ids = sorted(lag) if lag is not None else sorted(heads or {})
        channels: dict[str, dict[str, Any]] = {}
        for ch in ids:
            entry = lag.get(ch) if lag is not None else None
            channels[ch] = {
                "head": (heads or {}).get(ch),
                "recordsBehind": entry.records_behind if entry is not None else None,
                "secondsBehind": round(entry.seconds_behind, 3) if entry is not None else None,
                "exact": entry.exact if entry is not None else False,
            }
        report: dict[str, Any] = {
            "source": protocol.namespace,
            "measuredAt": _iso(time.time()),
            "channels": channels,
            "channelCount": len(channels),
            "recordsBehindLatest": None, "secondsBehindLatest": None, "lagExact": False,
        }
        if lag is not None:
            report["recordsBehindLatest"] = sum(e.records_behind for e in lag.values())
            report["secondsBehindLatest"] = round(
                max((e.seconds_behind for e in lag.values()), default=0.0), 3)
            report["lagExact"] = all(e.exact for e in lag.values())
        return report


__all__ = ["LatestOffsetReporter"]
