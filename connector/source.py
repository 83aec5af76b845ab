"""The Spark data source ``format("tablestore")`` (PySpark Python Data Source API).

Where each piece runs:
- ``TablestoreDataSource`` is built on the driver when ``load()`` is called; it validates the
  options (``SourceOptions``) and derives the output schema from the table's declared schema.
- ``TablestoreStreamReader`` lives in Spark's planning process on the driver, where Spark calls
  ``initialOffset``, ``latestOffset``, ``partitions``, ``commit`` and
  ``prepareForTriggerAvailableNow``; it delegates them to ``StreamProtocol``. Spark calls
  ``reportLatestOffset`` there too, for its progress report
  (``connector.latest_offset_report``). Spark pickles the reader to executors to call ``read``,
  so it holds no live client when pickled.
- ``read`` runs on executors and delegates to ``connector.reader.read_rows``, the read a
  multi-table query's tables go through too.

PySpark 4.0 and 4.1 call less of this (no read limit, no start in ``latestOffset``, no
``reportLatestOffset``, no AvailableNow): ``connector.spark_compat`` says what the installed
PySpark offers, and the reader degrades there as it describes.
- ``spark.read.format("tablestore")`` (a bounded batch read of a time range) gets a
  ``connector.range_read.TablestoreRangeReader`` from ``TablestoreDataSource.reader``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from connector import spark_compat as compat  # first: refuses an unsupported PySpark

# isort: split
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from cdc_common.first_contact import query_start
from connector.clients import Clients
from connector.errors import OptionError
from connector.generic_rows import MULTI_TABLE_SCHEMA
from connector.multiplex import IDLE_BACKOFF_MAX_S, MultiTableStreamReader
from connector.options import SourceOptions
from connector.partition import ChannelPartition
from connector.planning.read_limits import TriggerLimits, trigger_limits
from connector.reader import read_rows
from connector.schema import RecordBatchBuilder, check_user_schema, output_schema
from connector.table_selection import MultiTableOptions, is_multi_table

log = logging.getLogger("connector.source")


class TablestoreDataSource(DataSource):
    """``spark.readStream.format("tablestore")``: every change of a table, exactly once."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        #: ``tables`` selects several tables into one query (``connector.multiplex``)
        self.multi_table: Any = None
        if is_multi_table(options):
            self.multi_table = MultiTableOptions.from_spark(options)
            return
        self.source_options = SourceOptions.from_spark(options)

    @classmethod
    def name(cls) -> str:
        return "tablestore"

    def schema(self) -> StructType:
        """Called on the driver when no ``.schema(...)`` was given: the query's first contact
        with its tunnel service (an endpoint that does not answer fails at once). A multi-table
        query's schema is the same for every table (``connector.multiplex``)."""
        if self.multi_table is not None:
            return MULTI_TABLE_SCHEMA
        with query_start(), Clients().tunnel(self.source_options.endpoint) as tunnel:
            table = tunnel.table_schema(self.source_options.table_name)
            return output_schema(self.source_options.declared_schema(table),
                                 self.source_options.before_format)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.multi_table is not None:
            return MultiTableStreamReader(self.multi_table, idle_backoff_max_s=IDLE_BACKOFF_MAX_S,
                                          idle_pause=time.sleep)
        self.source_options.check_for_stream()
        return TablestoreStreamReader(self.source_options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        """``spark.read.format("tablestore")``: the changes committed in
        ``[startingTimestamp, endingTimestamp)`` (``connector.range_read``)."""
        from connector.range_read import TablestoreRangeReader

        if self.multi_table is not None:
            raise OptionError(option="tables", value=None, problem="applies to a streaming "
                              "query (readStream) only", allowed="table.name for spark.read")
        self.source_options.check_for_batch()
        return TablestoreRangeReader(self.source_options, schema)


class TablestoreStreamReader(DataSourceStreamReader, compat.SupportsTriggerAvailableNow):
    """Spark's handle on one query; see ``connector.protocol`` for the protocol itself."""

    def __init__(self, options: SourceOptions, schema: StructType,
                 features: compat.SparkFeatures = compat.FEATURES) -> None:
        """``features``: what the installed PySpark calls (tests pass an older PySpark's)."""
        self.options = options
        self.schema = schema
        self._protocol: Any = None  # opened on first use in the planning process
        self._reporter: Any = None  # connector.latest_offset_report's, same process
        self._last_start: str | None = None  # start UUID of the batch latestOffset last saw
        #: PySpark 4.0/4.1 do not pass latestOffset its start: learned from their other calls
        self._starts = (None if features.admission_control
                        else compat.BatchStartTracker(features.version))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_protocol"] = None  # live clients never travel to executors
        state["_reporter"] = None
        return state

    @property
    def protocol(self) -> Any:
        if self._protocol is None:
            from connector.protocol import StreamProtocol

            protocol = StreamProtocol(self.options)  # binds at its first offset call
            with query_start():  # the planning process's first contact with the service
                table = protocol.tunnel.table_schema(self.options.table_name)
            before = self.options.before_format
            if self.schema != output_schema(table, before):
                check_user_schema(self.schema, table, before)
            self._protocol = protocol
            compat.log_degradations_once(log)
        return self._protocol

    # --- driver (planning process) --------------------------------------------------------

    def initialOffset(self) -> dict:
        return self.protocol.initial_offset()

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's API name (PySpark 4.2+)
        """One limit (PySpark has no composite one): the most telling configured, so Spark
        passes back something other than ``ReadAllAvailable``; ``latestOffset`` then applies
        every configured limit (``connector.planning.read_limits``)."""
        return compat.default_read_limit(self.options)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """PySpark 4.2+ passes the start and the read limit. PySpark 4.0/4.1 pass neither: the
        start is where Spark's offset log ends (``spark_compat.BatchStartTracker``) and the
        limits are the configured ones, as ``getDefaultReadLimit`` would have given them."""
        if start is None and self._starts is not None:
            start = self._starts.start(self.protocol.initial_offset)
            limits = trigger_limits(self.options, all_available=False)
        else:
            limits = self._limits(limit)
        end = self.protocol.latest_offset(start, limits)
        self._last_start = self.protocol.uuid_of(start)
        return end

    def _limits(self, limit: Any) -> TriggerLimits:
        """What Spark passed, as the limits this trigger applies: none for
        ``ReadAllAvailable`` (Trigger.Once), else every configured limit."""
        passed = compat.passed_limit(limit)
        return trigger_limits(self.options, all_available=passed.all_available,
                              max_rows=passed.max_rows, max_bytes=passed.max_bytes,
                              min_rows=passed.min_rows)

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 - Spark's API name
        """Called by Spark after ``latestOffset`` for ``lastProgress.sources[].latestOffset``:
        per-channel heads and records/seconds behind (``connector.latest_offset_report``;
        cached)."""
        if self._reporter is None:
            from connector.latest_offset_report import LatestOffsetReporter

            self._reporter = LatestOffsetReporter(self.protocol)
        return self._reporter.report(self._last_start)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if self._starts is not None:
            self._starts.planned(start, end)
        return self.protocol.plan(start, end)

    def commit(self, end: dict) -> None:
        self.protocol.commit(end)

    def prepareForTriggerAvailableNow(self) -> None:
        self.protocol.prepare_available_now()

    def stop(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None
            self._reporter = None

    # --- executors ----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's rows (executor), through the read both stream readers share
        (``connector.reader.read_rows``: the end claimed before any row is yielded)."""
        assert isinstance(partition, ChannelPartition)
        builder = RecordBatchBuilder(self.schema, policy=self.options.schema_change_behavior,
                                     table=self.options.table_name)
        yield from read_rows(partition, builder, self.options.snapshot_op)


def is_connect_session(spark: Any) -> bool:
    """True for a Spark Connect client session (``SparkSession.builder.remote("sc://...")``).

    Decided by the session's own type, not by ``pyspark.sql.utils.is_remote()``, which reports
    the process's mode: a process may hold a classic session while that flag is set.
    """
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def register(spark: Any) -> None:
    """Register ``format("tablestore")`` on ``spark``: a classic session (driver) or a Spark
    Connect client session.

    Classic: also points Python workers at this interpreter when the user has not chosen one
    (``PYSPARK_PYTHON``): workers must import this package, which a different interpreter may
    not have. Connect: the client only sends the source class (by reference: module and name);
    the server's driver and workers run it with the server's Python, which the server's owner
    sets (``PYSPARK_PYTHON`` when starting the server; docs/connect.md). A Connect session has
    no ``sparkContext``, and nothing here touches the client's interpreter settings.
    """
    if not is_connect_session(spark):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        context = spark.sparkContext
        if getattr(context, "pythonExec", None) in (None, "python3", "python"):
            context.pythonExec = os.environ["PYSPARK_PYTHON"]
    spark.dataSource.register(TablestoreDataSource)
