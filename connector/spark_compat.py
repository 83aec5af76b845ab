"""What the installed PySpark offers the stream reader, decided once by feature probes.

The source supports PySpark ``SUPPORTED_PYSPARK`` (pyproject.toml pins the same range). Python
streaming data sources exist from 4.0 on; PySpark 4.2 added three things the reader uses where
they are there (docs/operations.md#spark-versions has the table, feature x version):

- admission control: Spark passes ``latestOffset(start, limit)`` the start of the next batch and
  the read limit from ``getDefaultReadLimit`` (``pyspark.sql.streaming.datasource``). PySpark 4.0
  and 4.1 call ``latestOffset()`` with neither: the reader applies ``maxOffsetsPerTrigger``
  itself (same caps, same fair split) and takes the start from Spark's other calls
  (``BatchStartTracker``);
- ``reportLatestOffset``: the tunnel's lag in Spark's own progress report. Without it the lag is
  still in ``tablestore-cdc meta lag``, the progress feed and the dashboard, which ask the tunnel;
- ``SupportsTriggerAvailableNow``: without it Spark runs a ``Trigger.AvailableNow`` query as one
  batch (its single-batch fallback) and stops.

One helper changed its signature in 4.2 as well: ``to_arrow_schema`` takes ``timezone=``
where 4.0 and 4.1 take ``timestamp_utc=`` (``arrow_schema``).

Imported by ``connector.source`` wherever that runs (the user's driver, Spark's planning process
on the driver, executors). Importing it beside an unsupported PySpark raises
``UnsupportedSparkError``, one line naming the supported range. Each degradation is logged once
per planning process (``log_degradations_once``), when the stream reader opens its protocol.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connector.errors import SparkCallOrderError, UnsupportedSparkError

#: the PySpark versions this package supports (the pin in pyproject.toml says the same)
SUPPORTED_PYSPARK = ">=4.0,<4.4"
#: the first version past the range: no probe can tell what a future release changed
_FIRST_UNSUPPORTED = (4, 4)


def check_supported(version: str, has_stream_reader: bool) -> None:
    """Refuse a PySpark outside ``SUPPORTED_PYSPARK``: one without Python streaming data sources
    (older than 4.0, told by a probe) or one newer than the range (told by its version)."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    too_new = numbers is None or (int(numbers[1]), int(numbers[2])) >= _FIRST_UNSUPPORTED
    if not has_stream_reader or too_new:
        raise UnsupportedSparkError(supported=SUPPORTED_PYSPARK, found=version)


def _installed_pyspark() -> tuple[str, bool]:
    """The installed PySpark's version, and whether it has Python streaming data sources."""
    try:
        import pyspark
    except ImportError:
        return "none", False
    try:
        from pyspark.sql.datasource import DataSourceStreamReader  # noqa: F401
    except ImportError:
        return pyspark.__version__, False
    return pyspark.__version__, True


check_supported(*_installed_pyspark())

from pyspark.sql.datasource import DataSourceStreamReader  # noqa: E402 - after the check
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

try:  # PySpark 4.2+: admission control and Trigger.AvailableNow for Python stream readers
    from pyspark.sql.streaming import datasource as _streaming_datasource
except ImportError:  # PySpark 4.0, 4.1
    _streaming_datasource = None  # type: ignore[assignment]

if _streaming_datasource is not None and hasattr(_streaming_datasource,
                                                 "SupportsTriggerAvailableNow"):
    SupportsTriggerAvailableNow = _streaming_datasource.SupportsTriggerAvailableNow
else:
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """A stand-in where PySpark has none, so the reader's class is the same on every
        version; PySpark 4.0 and 4.1 never call ``prepareForTriggerAvailableNow``."""

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's API name
            raise NotImplementedError


@dataclass(frozen=True)
class SparkFeatures:
    """What the installed PySpark calls on a Python stream reader."""

    version: str
    #: ``latestOffset(start, limit)`` and ``getDefaultReadLimit`` (4.2+)
    admission_control: bool
    #: ``reportLatestOffset`` for ``StreamingQueryProgress.sources[].latestOffset`` (4.2+)
    latest_offset_report: bool
    #: ``prepareForTriggerAvailableNow`` for ``Trigger.AvailableNow`` (4.2+)
    available_now: bool

    def degradations(self) -> list[str]:
        """One sentence per missing feature: what the source does instead."""
        v = f"PySpark {self.version}"
        found = []
        if not self.admission_control:
            found.append(
                f"{v} passes Python sources no read limit and no batch start (admission "
                "control needs 4.2): the source applies maxOffsetsPerTrigger and "
                "maxOffsetsPerChannel itself, split the same way, and takes each batch's start "
                "from Spark's own calls")
        if not self.latest_offset_report:
            found.append(
                f"{v} does not ask Python sources for a latest-offset report (needs 4.2): "
                "Spark's progress shows the batch's end as latestOffset, without the lag; "
                "`tablestore-cdc meta lag`, the progress feed and the dashboard show it")
        if not self.available_now:
            found.append(
                f"{v} has no Trigger.AvailableNow for Python sources (needs 4.2): Spark runs "
                "such a query as one batch, bounded by maxOffsetsPerChannel and "
                "maxOffsetsPerTrigger, and stops; run it again to read on")
        return found


def probe() -> SparkFeatures:
    """Ask the installed PySpark what it offers (its classes and signatures, not its version)."""
    import pyspark

    module = _streaming_datasource
    takes_start = "start" in inspect.signature(DataSourceStreamReader.latestOffset).parameters
    return SparkFeatures(
        version=pyspark.__version__,
        admission_control=module is not None and hasattr(module, "ReadMaxRows") and takes_start,
        latest_offset_report=hasattr(DataSourceStreamReader, "reportLatestOffset"),
        available_now=module is not None and hasattr(module, "SupportsTriggerAvailableNow"),
    )


FEATURES = probe()


def default_read_limit(options: Any) -> Any:
    """``getDefaultReadLimit``'s answer (PySpark 4.2+ only asks): one limit, PySpark having no
    composite one -- ``maxOffsetsPerTrigger``, else ``maxBytesPerTrigger``, else
    ``minOffsetsPerTrigger`` -- so Spark passes back something other than ``ReadAllAvailable``
    whenever a limit is configured; ``latestOffset`` then applies every configured limit
    (``connector.planning.read_limits.trigger_limits``). ``options``: ``SourceOptions``."""
    module = _streaming_datasource
    assert module is not None, "only PySpark 4.2+ asks for a read limit"
    if options.max_offsets_per_trigger is not None:
        return module.ReadMaxRows(options.max_offsets_per_trigger)
    if options.max_bytes_per_trigger is not None:
        return module.ReadMaxBytes(options.max_bytes_per_trigger)
    if options.min_offsets_per_trigger is not None:
        return module.ReadMinRows(options.min_offsets_per_trigger)
    return module.ReadAllAvailable()


@dataclass(frozen=True)
class PassedLimit:
    """What a read limit Spark passed to ``latestOffset`` says (``None``: not of that kind)."""

    all_available: bool = False
    max_rows: int | None = None
    max_bytes: int | None = None
    min_rows: int | None = None


def passed_limit(limit: Any) -> PassedLimit:
    """The read limit Spark passed to ``latestOffset`` (PySpark 4.2+), as plain values."""
    module = _streaming_datasource
    if module is None or limit is None:
        return PassedLimit()
    return PassedLimit(
        all_available=isinstance(limit, module.ReadAllAvailable),
        max_rows=int(limit.max_rows) if isinstance(limit, module.ReadMaxRows) else None,
        max_bytes=int(limit.max_bytes) if isinstance(limit, module.ReadMaxBytes) else None,
        min_rows=int(limit.min_rows) if isinstance(limit, module.ReadMinRows) else None,
    )


def arrow_schema(schema: Any) -> Any:
    """The Arrow schema PySpark checks a reader's batches against (timestamps in UTC)."""
    if "timezone" in inspect.signature(to_arrow_schema).parameters:  # PySpark 4.2+
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]  # 4.0, 4.1


_logged = False


def log_degradations_once(log: logging.Logger, features: SparkFeatures = FEATURES) -> None:
    """Log each degradation once per process (Spark's planning process, at a query's start)."""
    global _logged
    if _logged:
        return
    _logged = True
    for sentence in features.degradations():
        log.warning("%s (docs/operations.md#spark-versions)", sentence)


def _uuid(offset: Any) -> Any:
    """What identifies an offset: a table's UUID, or a selection's whole offset (per table)."""
    return offset.get("uuid", offset) if isinstance(offset, dict) else offset


class BatchStartTracker:
    """Where the next batch starts, for a PySpark that calls ``latestOffset()`` without it.

    The next batch starts where Spark's offset log ends, and PySpark 4.0 and 4.1 say where that
    is in their other calls, all made in this planning process on the driver (measured by
    tracing every call on both; docs/operations.md#spark-versions):

    - every batch is planned with ``partitions(start, end)`` before the next ``latestOffset()``;
    - a restart on a checkpoint with batches first calls ``partitions(E, E)``, E the newest
      offset of the log (Spark's ``setLatestSeenOffset``), then runs that batch again if its
      commit log lacks it;
    - a new checkpoint starts with ``latestOffset()``, then ``initialOffset()`` and
      ``partitions(initial, end)``.

    So before the first ``partitions`` call the log is empty and the start is the initial
    offset, and that first call must confirm it. Any other order (Spark's internal AvailableNow
    wrapper asks for a batch before telling where the log ends) raises ``SparkCallOrderError``:
    the start of a batch is never guessed. Not used on PySpark 4.2+, which passes the start.
    """

    def __init__(self, version: str) -> None:
        self.version = version
        self._log_end: dict | None = None  # the newest end Spark planned: where its log ends
        self._assumed: dict | None = None  # the initial offset, before Spark confirmed it

    def start(self, initial_offset: Callable[[], dict]) -> dict:
        """The start of the batch ``latestOffset()`` is asked for."""
        if self._log_end is not None:
            return self._log_end
        if self._assumed is not None:
            raise SparkCallOrderError(version=self.version, detail="latestOffset() was called "
                                      "again before any batch was planned")
        self._assumed = initial_offset()
        return self._assumed

    def planned(self, start: dict, end: dict) -> None:
        """Spark's ``partitions(start, end)``: its offset log now ends at ``end``."""
        if self._assumed is not None and _uuid(start) != _uuid(self._assumed):
            raise SparkCallOrderError(
                version=self.version, detail=f"a batch was asked for from the initial offset "
                f"{_uuid(self._assumed)}, then the log turned out to end at {_uuid(start)}")
        self._assumed = None
        self._log_end = end


__all__ = ["FEATURES", "SUPPORTED_PYSPARK", "BatchStartTracker", "SparkFeatures",
           "SupportsTriggerAvailableNow", "arrow_schema", "check_supported", "default_read_limit",
           "log_degradations_once", "passed_limit", "probe", "PassedLimit"]
