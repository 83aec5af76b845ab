"""Several tables in one streaming query: ``format("tablestore").option("tables", "orders_*")``.

Why one query for many tables (docs/multi-table.md): every streaming query of a Python data
source costs a Python planning process on the driver and a planning loop; a hundred of them do
not fit a small machine. Here one query reads every selected table, and each table keeps its own
protocol exactly as a single-table query has it (``connector.protocol.StreamProtocol``: its own
tunnel, meta namespace, UUID offsets and lease). The query's offset is a composite
``{"tables": {table: that table's offset}}``; ``latestOffset``, ``partitions`` and ``commit``
delegate to each table's protocol, and a Spark partition reads several (table, channel)
pairs one after another: a batch's channel reads are dealt into at most
``tables.maxPartitions`` partitions (``deal``), each read keeping its own claim.

Each table reads with the query's options; ``tables.options`` sets, for the tables it names,
their own ``schema.change.behavior``, ``snapshot.op`` and read limits (a JSON object ``{table:
{option: value}}``; a JSON value, since Spark lower-cases option keys and table names are
case-sensitive). Each table's protocol applies its own limits (its options'); the first
limit set anywhere is Spark's default read limit, so that Spark never passes
``ReadAllAvailable`` where a table has a limit. A table's read places a value of another type
than its column by its ``schema.change.behavior`` and marks its base-data rows by its
``snapshot.op``, as a single-table query (``connector.source``); a refusal
(``SchemaChangeError``) fails the query, after the batch's end is claimed, so a restart with
another policy replays the batch exactly.

Tables come and go: the selection is listed again at most every ``tables.refreshIntervalMs``.
A new table joins a batch with its initial offset (nothing of it is read in that batch) and is
read from the next one on, from its tunnel's start (its existing rows, then its changes). A
table that is no longer listed, or whose protocol fails, is *stopped*: its offset is carried
unchanged from batch to batch (frozen), it is not planned, and the others go on; a restart
tries it again. A table whose protocol fails with a *retryable* error (``CdcError.retryable``:
the source or the meta store unreachable, throttled, a 5xx) is not stopped but *restarting*: its
protocol is closed, its offset stays frozen, and it is opened and asked again after a capped
exponential backoff (``cdc_common.backoff``, the job's own rule; ``tables.retryBackoff``,
``tables.maxRetries``: forever by default), whichever step the error came from (opening it,
``latestOffset``, ``commit``); once the service answers it resumes exactly where it stopped.
Only a configuration or data error leaves a table ``failed``. ``table_states`` says what each
table is doing (also in Spark's progress report, ``reportLatestOffset``).

Where each piece runs: ``MultiTableOptions`` on the driver when ``load()`` is called;
``MultiTableStreamReader`` in Spark's planning process (driver); its ``read`` on executors.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from cdc_common.backoff import RestartPolicy, parse_backoff
from cdc_common.errors import CdcError
from cdc_common.schema_change import DEFAULT_POLICY
from connector import spark_compat as compat
from connector.clients import Clients, executor_clients
from connector.crash_hook import crash_point
from connector.errors import OptionError, SourceInUseError
from connector.options import SourceOptions
from connector.partition import ChannelPartition
from connector.planning.read_limits import trigger_limits
from connector.reader import claim_and_read
from connector.schema import (
    METADATA_FIELDS,
    READ_OP,
    RecordBatchBuilder,
    constant_strings,
    mark_snapshot_reads,
    output_schema,
)
from connector.tunnel.base import ColumnSpec, TableSchema

log = logging.getLogger("connector.multiplex")

#: the options of a multi-table query, beside the single-table ones (docs/multi-table.md)
TABLES, EXCLUDE, REFRESH = "tables", "exclude", "tables.refreshIntervalMs"
TABLE_OPTIONS = "tables.options"
MAX_PARTITIONS = "tables.maxPartitions"
#: a table failing with a retryable error is tried again on this backoff, this many times in a
#: row (``cdc_common.backoff``; unset: forever)
RETRY_BACKOFF, MAX_RETRIES = "tables.retryBackoff", "tables.maxRetries"
MULTI_OPTIONS = (TABLES, EXCLUDE, REFRESH, TABLE_OPTIONS, MAX_PARTITIONS, RETRY_BACKOFF,
                 MAX_RETRIES)
#: the options ``tables.options`` may set for one table: how its rows are read (and its
#: attribute columns' types, ``catalog``), and its read limits (a trigger's and a channel's)
PER_TABLE_OPTIONS = ("schema.change.behavior", "snapshot.op", "maxOffsetsPerTrigger",
                     "maxBytesPerTrigger", "maxOffsetsPerChannel", "catalog")
_PER_TABLE_NAMES = frozenset(o.lower() for o in PER_TABLE_OPTIONS)
_PER_TABLE_ALLOWED = ("a JSON object {table: {option: value}} of the options "
                      + ", ".join(PER_TABLE_OPTIONS)
                      + ', e.g. {"orders": {"schema.change.behavior": "exception"}}')
DEFAULT_REFRESH_MS = 10_000
#: a table whose lease another process holds is tried again after this long (seconds)
LEASE_RETRY_S = 10.0

#: the output of a multi-table query: the same for every table (docs/multi-table.md)
MULTI_TABLE_SCHEMA = StructType([
    StructField("_table", StringType(), False),
    StructField("_key", StringType(), False),
    StructField("_row", StringType(), True),
    StructField("_schema", StringType(), False),
    *METADATA_FIELDS,
])


def is_multi_table(options: Mapping[str, str]) -> bool:
    """Does Spark's option map select tables with ``tables`` (any key case)?"""
    return any(key.lower() == TABLES for key in options)


@dataclass(frozen=True)
class TableSelection:
    """Which tables a query reads: names matching one of ``include``'s globs and none of
    ``exclude``'s (``fnmatch`` globs, case-sensitive, on whole table names)."""

    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, tables: str, exclude: str | None = None) -> TableSelection:
        """From the comma-separated option values; ``OptionError`` on an empty pattern."""
        return cls(_patterns(TABLES, tables), _patterns(EXCLUDE, exclude) if exclude else ())

    def matches(self, name: str) -> bool:
        return (any(fnmatchcase(name, p) for p in self.include)
                and not any(fnmatchcase(name, p) for p in self.exclude))

    def select(self, names: Sequence[str]) -> list[str]:
        return sorted(n for n in names if self.matches(n))


def _patterns(option: str, value: str) -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in value.split(","))
    if not value.strip() or any(not p for p in patterns):
        raise OptionError(option=option, value=value, problem="holds an empty pattern",
                          allowed="comma-separated table names or globs, e.g. orders_*,users")
    return patterns


@dataclass(frozen=True)
class MultiTableOptions:
    """The validated options of a multi-table query (driver, at ``load()``): the selection, how
    often tables are listed again, every other option, which applies to each table alike, and
    the options of ``tables.options`` for the tables it names (``for_table`` builds one
    table's ``SourceOptions``)."""

    selection: TableSelection
    refresh_s: float
    #: Spark's options without the multi-table ones: each table's query options but its name
    shared: tuple[tuple[str, str], ...]
    #: table -> its own options (``tables.options``), over ``shared``
    per_table: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    #: the query's own meta table when it is in the instance the tables are listed from
    #: (``own_meta_table``): never selected
    meta_table: str | None = None
    #: the most Spark partitions a batch is read in (``tables.maxPartitions``; ``deal``)
    max_partitions: int = dataclasses.field(default_factory=lambda: default_max_partitions())
    #: when a table failing with a retryable error is tried again (``tables.retryBackoff``,
    #: ``tables.maxRetries``)
    retry: RestartPolicy = RestartPolicy()

    @classmethod
    def from_spark(cls, options: Mapping[str, str]) -> MultiTableOptions:
        by_lower = {k.lower(): (k, v) for k, v in options.items()}
        if "table.name" in by_lower:
            raise OptionError(option="table.name", value=by_lower["table.name"][1],
                              problem=f"cannot be given with '{TABLES}'",
                              allowed="either table.name (one table) or tables (a selection)")
        refresh = by_lower.get(REFRESH.lower(), (REFRESH, str(DEFAULT_REFRESH_MS)))[1]
        if not refresh.strip().isdigit():
            raise OptionError(option=REFRESH, value=refresh, problem="is not an integer",
                              allowed="an integer >= 0 (milliseconds)")
        excluded = by_lower.get(EXCLUDE, (EXCLUDE, None))[1]
        per_table = by_lower.get(TABLE_OPTIONS.lower())
        max_partitions = by_lower.get(MAX_PARTITIONS.lower())
        retry = _retry_policy(by_lower.get(RETRY_BACKOFF.lower(), (None, None))[1],
                              by_lower.get(MAX_RETRIES.lower(), (None, None))[1])
        built = cls(TableSelection.parse(by_lower[TABLES][1], excluded),
                    int(refresh) / 1000.0,
                    tuple(sorted((k, v) for k, v in options.items()
                                 if k.lower() not in {o.lower() for o in MULTI_OPTIONS})),
                    _per_table_options(per_table[1]) if per_table else (),
                    max_partitions=(_positive(MAX_PARTITIONS, max_partitions[1])
                                    if max_partitions else default_max_partitions()),
                    retry=retry)
        # every other option is checked now, at load()
        meta_table = own_meta_table(built.for_table("placeholder"))
        for table, _ in built.per_table:
            built.for_table(table)  # and each table's own
        return dataclasses.replace(built, meta_table=meta_table)

    def own_options(self, table: str) -> dict[str, str]:
        """The options ``tables.options`` sets for ``table`` (names lower-cased)."""
        return dict(dict(self.per_table).get(table, ()))

    def default_read_limit(self) -> Any:
        """``getDefaultReadLimit``'s answer: the first limit configured, the shared options'
        first, then each table's own, so that Spark passes ``ReadAllAvailable`` only when no
        table has a limit (or for Trigger.Once)."""
        first = compat.default_read_limit(self.for_table("placeholder"))
        for table, _ in self.per_table:
            if not compat.passed_limit(first).all_available:
                break
            first = compat.default_read_limit(self.for_table(table))
        return first

    def for_table(self, table: str) -> SourceOptions:
        """One table's options (``OptionError`` as a single-table query would raise it)."""
        own = self.own_options(table)
        shared = {k: v for k, v in self.shared if k.lower() not in own}
        return SourceOptions.from_spark({**shared, **own, "table.name": table})


def _positive(option: str, value: str, minimum: int = 1) -> int:
    """An integer >= ``minimum``, parsed as leniently as every other integer option
    (docs/options.md: ``" 7 "``, ``"1_000"``, ``"5.0"``); ``OptionError`` naming ``option``
    otherwise."""
    from pydantic import Field, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(Annotated[int, Field(ge=minimum)]).validate_python(value))
    except ValidationError:
        raise OptionError(option=option, value=value, problem=f"is not an integer >= {minimum}",
                          allowed=f"an integer >= {minimum}, e.g. 8") from None


def _retry_policy(backoff: str | None, max_retries: str | None) -> RestartPolicy:
    """``tables.retryBackoff`` (``FIRST[:MAX]`` seconds) and ``tables.maxRetries`` (an
    integer >= 0; unset: forever) as a policy; ``OptionError`` naming the option."""
    first, cap = RestartPolicy().first_s, RestartPolicy().max_s
    if backoff is not None:
        try:
            first, cap = parse_backoff(backoff)
        except ValueError:
            raise OptionError(option=RETRY_BACKOFF, value=backoff,
                              problem="is not FIRST[:MAX] seconds with 0 < FIRST <= MAX",
                              allowed="e.g. 1:60 (the default), 5, 0.5:30") from None
    limit = None if max_retries is None else _positive(MAX_RETRIES, max_retries, minimum=0)
    return RestartPolicy(first, cap, limit)


def _per_table_options(value: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """``tables.options`` parsed: table -> its options (names lower-cased), sorted;
    ``OptionError`` naming ``tables.options`` for anything but an object of objects of
    strings of ``PER_TABLE_OPTIONS``."""
    def refuse(problem: str) -> OptionError:
        return OptionError(option=TABLE_OPTIONS, value=value, problem=problem,
                           allowed=_PER_TABLE_ALLOWED)

    try:
        parsed = json.loads(value)
    except ValueError:
        raise refuse("is not JSON") from None
    if not isinstance(parsed, dict):
        raise refuse("is not a JSON object")
    tables = []
    for table, options in sorted(parsed.items()):
        if not isinstance(options, dict) or not all(isinstance(v, str)
                                                    for v in options.values()):
            raise refuse(f"gives table {table!r} no object of strings")
        unknown = sorted(k for k in options if k.lower() not in _PER_TABLE_NAMES)
        if unknown:
            raise refuse(f"sets {unknown[0]!r} for table {table!r}, which is set for every "
                         "table alike")
        tables.append((table, tuple(sorted((k.lower(), v) for k, v in options.items()))))
    return tuple(tables)


def own_meta_table(options: SourceOptions) -> str | None:
    """The table of the query's meta store when it lives in the instance whose tables the
    query lists (a Tablestore endpoint's default, ``checkpoint.table``, or a ``tablestore://``
    ``meta.store`` naming that instance; a ``dynamodb://`` one in a DynamoDB Streams
    endpoint's region), else None. A pattern may match it
    (``tables=t*`` and ``tablestore_cdc_meta``), but it is never read: its changes are the
    query's own checkpoints, so each batch would make the next one."""
    meta = urlsplit(options.meta_store)
    if meta.scheme == "dynamodb" and options.endpoint.scheme == "dynamodb-streams":
        # a dynamodb://TABLE meta store in the streams' region
        from connector.tunnel.dynamodb_streams.aws import parse_uri

        region = parse_qs(meta.query).get("region", [None])[0]
        same = region is None or region == parse_uri(options.endpoint.uri).region
        return meta.netloc or None if same else None
    instance = getattr(options.endpoint, "instance", None)
    if meta.scheme != "tablestore" or instance is None or meta.netloc != instance:
        return None
    return meta.path.strip("/") or None


@dataclass(frozen=True)
class TableChannel:
    """One channel of one table in one batch (built on the driver, read on an executor):
    the channel's partition, the table's declared columns, to write the generic rows, and how
    its rows are read (the table's ``schema.change.behavior`` and ``snapshot.op``)."""

    table: str
    channel: ChannelPartition
    key_columns: tuple[ColumnSpec, ...]
    columns: tuple[ColumnSpec, ...]
    policy: str = DEFAULT_POLICY
    snapshot_op: str = "PUT"


@dataclass(frozen=True)
class MultiTablePartition(InputPartition):
    """One Spark partition of a multi-table batch (built on the driver by ``partitions``, read
    on an executor by ``read``): the (table, channel) reads dealt to it, read one after
    another. Each keeps its own claim, so grouping changes nothing of what is read."""

    reads: tuple[TableChannel, ...]

    @property
    def tables(self) -> set[str]:
        return {r.table for r in self.reads}


def deal(reads: Sequence[TableChannel], max_partitions: int) -> list[MultiTablePartition]:
    """``reads`` dealt round-robin into at most ``max_partitions`` partitions (driver), in
    (table, channel) order: a table's channels land in different partitions, so a busy table
    is still read in parallel, while a hundred quiet tables cost a handful of tasks instead
    of one each (a task's start costs more than reading a few records)."""
    count = min(len(reads), max_partitions)
    return [MultiTablePartition(tuple(reads[i::count])) for i in range(count)]


def default_max_partitions() -> int:
    """``tables.maxPartitions``' default: two per core of the machine that plans (the
    driver's; in local mode the executors' too)."""
    return 2 * (os.cpu_count() or 1)


class MultiTableStreamReader(DataSourceStreamReader, compat.SupportsTriggerAvailableNow):
    """Spark's handle on a multi-table query (module docstring). Needs PySpark 4.2+ (the
    start and the read limit passed to ``latestOffset``).

    ``clients``: the seam that opens every table's clients in the planning process (its
    fault hook, and its clock, by which a restarting table's next try is timed); None: the
    environment's, as in production. Executors read through their own pool."""

    def __init__(self, options: MultiTableOptions, clients: Clients | None = None) -> None:
        self.options = options
        self._clients = clients
        self._protocols: dict[str, Any] = {}
        self._schemas: dict[str, TableSchema] = {}
        self._admin: Any = None  # the tunnel client that lists tables (planning process)
        self._listed: list[str] = []
        self._listed_at = float("-inf")
        #: table -> "streaming", "new", "dropped", "failed: <reason>", "waiting: <reason>"
        #: (its lease held by another process: tried again, ``LEASE_RETRY_S``),
        #: "restarting: <reason> (attempt n, next in s)" (a retryable error: tried again on
        #: ``options.retry``'s backoff) (planning process)
        self.table_states: dict[str, str] = {}
        self._lease_retry_at: dict[str, float] = {}
        #: a restarting table's retryable failures in a row, and when (``_now``) it is tried
        #: again
        self._attempts: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        #: a table's protocol answered once: the query has reached its services, so an
        #: endpoint that gives no answer at all is an outage from now on, not a wrong URL
        #: (``cdc_common.first_contact``; the job's rule, ``pipeline.failures``)
        self._reached = False
        #: table -> the start UUID of the batch latestOffset last saw, and its lag reporter
        self._last_starts: dict[str, str] = {}
        self._reporters: dict[str, Any] = {}
        #: Trigger.AvailableNow: the tables are listed once and each reads to its bound
        self._available_now = False
        #: table -> the share of its base data read, while it snapshots (planning process)
        self._snapshot_percent: dict[str, float] = {}
        self._snapshot_done: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # live clients never travel to executors
        state.update(_protocols={}, _admin=None, _reporters={}, _lease_retry_at={},
                     _clients=None, _retry_at={})
        return state

    def _now(self) -> float:
        """The seam's clock (seconds; a test's fake one moves only when told)."""
        return (self._clients or Clients()).clock()

    # --- tables (planning process) ----------------------------------------------------------

    def listed_tables(self) -> list[str]:
        """The selected tables, listed again once ``tables.refreshIntervalMs`` passed."""
        now = time.monotonic()
        if self._available_now and self._listed_at > float("-inf"):
            return self._listed  # a run that ends: no table joins once it has begun
        if now - self._listed_at >= self.options.refresh_s:
            if self._admin is None:
                self._admin = (self._clients or Clients()).tunnel(
                    self.options.for_table("placeholder").endpoint)
            self._listed = self.options.selection.select(
                [n for n in self._admin.list_tables() if n != self.options.meta_table])
            self._listed_at = now
        return self._listed

    def _protocol(self, table: str, *, must: bool = False) -> Any:
        """The table's protocol, opened on first use; None for a stopped table, and for one
        waiting for its lease or restarting until its next try. ``must``: a logged batch
        reads the table, so it is tried now and an error opening it is raised (the query
        fails, and the job's restart replays the batch)."""
        if self.table_states.get(table, "").startswith(("dropped", "failed")):
            return None
        if must:
            self._lease_retry_at.pop(table, None)
            self._retry_at.pop(table, None)
        if time.monotonic() < self._lease_retry_at.get(table, float("-inf")):
            return None
        if table in self._retry_at and self._now() < self._retry_at[table]:
            return None
        if table not in self._protocols:
            from connector.protocol import StreamProtocol

            protocol = None
            try:
                protocol = StreamProtocol(self.options.for_table(table), self._clients)
                declared = protocol.options.declared_schema(protocol.tunnel.table_schema(table))
            except CdcError as exc:
                if protocol is not None:
                    self._close(table, protocol)
                if must:
                    raise
                self._stop(table, exc)
                return None
            self._protocols[table], self._schemas[table] = protocol, declared
            self.table_states.setdefault(table, "streaming")
            if self._available_now:
                protocol.prepare_available_now()
        return self._protocols[table]

    def _stop(self, table: str, reason: BaseException | str) -> None:
        """Stop reading ``table``: its offset stays frozen, the other tables go on. A lease
        held by another process (``SourceInUseError``) only pauses it: it is tried again
        after ``LEASE_RETRY_S`` (the holder may be this query's own killed process, taken
        over once another table proves it, or a lease about to expire). A retryable error
        only pauses it too (``restarting``): it is tried again on ``options.retry``'s
        backoff; when the policy gives up, the error is raised (the query fails, and the
        job's restart policy takes over)."""
        from connector.errors import EndpointUnreachableError, UnknownTableError

        if isinstance(reason, CdcError) and (reason.retryable or (
                self._reached and isinstance(reason, EndpointUnreachableError))):
            attempt = self._attempts.get(table, 0) + 1
            self._attempts[table] = attempt
            self._close(table, self._protocols.pop(table, None))
            self._reporters.pop(table, None)
            if self.options.retry.gives_up(attempt):
                log.warning("table %s: %d retryable failures in a row (tables.maxRetries): "
                            "the query fails", table, attempt)
                raise reason
            delay = self.options.retry.delay(attempt)
            self._retry_at[table] = self._now() + delay
            first_line = (str(reason).splitlines() or [type(reason).__name__])[0]
            self.table_states[table] = (f"restarting: {first_line} (attempt {attempt}, "
                                        f"next in {delay:.1f} s)")
            log.warning("table %s restarting (attempt %d, next in %.1f s): %s; the other "
                        "tables go on", table, attempt, delay, first_line)
            return
        if isinstance(reason, SourceInUseError):
            state = f"waiting: {reason}"
            self._lease_retry_at[table] = time.monotonic() + LEASE_RETRY_S
        else:
            state = ("dropped" if isinstance(reason, UnknownTableError) or reason == "dropped"
                     else f"failed: {reason}")
        if self.table_states.get(table) != state:
            log.warning("table %s stopped (%s); the other tables go on", table, state)
        self.table_states[table] = state
        self._close(table, self._protocols.pop(table, None))
        self._reporters.pop(table, None)

    @staticmethod
    def _close(table: str, protocol: Any) -> None:
        """Close a table's protocol; an error (the service it lost) is only logged."""
        if protocol is not None:
            try:
                protocol.close()
            except CdcError as exc:
                log.debug("closing table %s: %s", table, exc)

    def _answered(self, table: str) -> None:
        """``table``'s protocol answered ``latestOffset``: a table waiting for its lease or
        restarting after a retryable error streams again (its offset moves from where it
        stopped), and its next failure counts from one."""
        self._reached = True
        self._attempts.pop(table, None)
        self._retry_at.pop(table, None)
        state = self.table_states.get(table, "")
        if state.startswith(("waiting", "restarting")):
            if state.startswith("restarting"):
                log.warning("table %s answers again: streaming from where it stopped", table)
            self.table_states[table] = "streaming"  # its lease is this query's now
            self._lease_retry_at.pop(table, None)

    # --- driver (planning process) ----------------------------------------------------------

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's API name
        """Trigger.AvailableNow (``replicate --once``): every table listed at the run's first
        call reads the changes committed by the time its protocol opens, then the run ends;
        a table created meanwhile joins the next run."""
        self._available_now = True
        for protocol in self._protocols.values():
            protocol.prepare_available_now()

    def initialOffset(self) -> dict:
        offsets = {}
        for table in self.listed_tables():
            initial = self._initial_offset(table)
            if initial is not None:
                offsets[table] = initial
        return {"tables": offsets}

    def _initial_offset(self, table: str) -> dict | None:
        """``table``'s initial offset; None when it cannot be read (stopped and reported, as
        a table without a stream or a permission: the other tables go on). A retryable error
        (an outage) is raised: the query's restart tries every table again."""
        protocol = self._protocol(table)
        if protocol is None:
            return None
        try:
            offset: dict = protocol.initial_offset()
        except CdcError as exc:
            if exc.retryable:
                raise
            self._stop(table, exc)
            return None
        self._answered(table)
        return offset

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's API name (PySpark 4.2+)
        return self.options.default_read_limit()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        if start is None:
            raise OptionError(option=TABLES, value=",".join(self.options.selection.include),
                              problem="needs PySpark 4.2 or later (found "
                              f"{compat.FEATURES.version})",
                              allowed="one query per table (table.name) on this PySpark")
        passed = compat.passed_limit(limit)
        listed = set(self.listed_tables())
        ends: dict[str, dict] = {}
        asked = 0  # tables whose latest_offset ran (a crash point between two of them)
        for table, offset in sorted(_tables_of(start).items()):
            ends[table] = offset
            if table not in listed:
                self._stop(table, "dropped")
                continue
            protocol = self._protocol(table)
            if protocol is None:
                continue
            if asked:
                crash_point("between_table_offsets")
            asked += 1
            try:
                # every limit the table's options configure (the shared ones, its own over
                # them), none for ReadAllAvailable (Trigger.Once); what Spark passes otherwise
                # is default_read_limit's, made from these same options
                ends[table] = protocol.latest_offset(offset, trigger_limits(
                    protocol.options, all_available=passed.all_available))
                self._last_starts[table] = protocol.uuid_of(offset)
                self._answered(table)
            except CdcError as exc:
                self._stop(table, exc)
        for table in sorted(listed - set(ends)):  # new: joins with its initial offset
            initial = self._initial_offset(table)
            if initial is not None:
                ends[table] = initial
                self.table_states[table] = "new"
                log.info("table %s joins the query", table)
        return {"tables": ends}

    def reportLatestOffset(self) -> dict:  # noqa: N802 - Spark's API name
        """Each table's state and its lag (records and seconds behind the head; ``exact``
        false when they are lower bounds, ``None`` before a measurement), and the share of its
        base data read while it snapshots (``snapshot``), in
        ``lastProgress.sources[0].latestOffset``. Each table's lag is measured as a
        single-table query's (``connector.latest_offset_report``: again when its batch start
        moved, else cached for a while; never failing the query)."""
        from connector.latest_offset_report import LatestOffsetReporter

        lag: dict[str, dict[str, Any]] = {}
        snapshots: dict[str, float] = {}
        for table, protocol in sorted(self._protocols.items()):
            if table not in self._reporters:
                self._reporters[table] = LatestOffsetReporter(protocol)
            reporter = self._reporters[table]
            measured = reporter.measurements
            report = reporter.report(self._last_starts.get(table)) or {}
            lag[table] = {"recordsBehind": report.get("recordsBehindLatest"),
                          "secondsBehind": report.get("secondsBehindLatest"),
                          "exact": report.get("lagExact", False)}
            if reporter.measurements != measured and table not in self._snapshot_done:
                self._measure_snapshot(table, protocol)  # as often as the lag
            if table in self._snapshot_percent:
                snapshots[table] = self._snapshot_percent[table]
        return {"tables": dict(sorted(self.table_states.items())), "lag": lag,
                "snapshot": snapshots}

    def _measure_snapshot(self, table: str, protocol: Any) -> None:
        """How much of ``table``'s base data is read (a BaseAndStream tunnel): the share of
        its base-data channels that are done (TERMINATED for this tunnel). A table whose
        tunnel has none, or has read them all, is not asked again. Never fails the query."""
        from connector.tunnel.types import ChannelStatus, ChannelType

        try:
            channels = protocol.tunnel.describe_tunnel(
                table, protocol.options.named_tunnel).channels
        except Exception as exc:  # noqa: BLE001 - monitoring never fails the query
            log.debug("cannot describe table %s's tunnel: %s", table, exc)
            return
        base = [c for c in channels if c.channel_type is ChannelType.BASE_DATA]
        done = sum(1 for c in base if c.status is ChannelStatus.TERMINATED)
        if not base or done == len(base):
            self._snapshot_done.add(table)
            self._snapshot_percent.pop(table, None)
        else:
            self._snapshot_percent[table] = round(100.0 * done / len(base), 1)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        starts = _tables_of(start)
        reads: list[TableChannel] = []
        for table, end_offset in sorted(_tables_of(end).items()):
            start_offset = starts.get(table)
            if start_offset is None or start_offset == end_offset:
                continue  # joined with this batch, or stopped: nothing to read
            protocol = self._protocol(table)
            if protocol is None and self.table_states.get(table, "").startswith(
                    ("waiting", "restarting")):
                # a logged batch reads it: try it now (refused: the query fails on
                # SourceInUseError or the retryable error, and the job's restart tries again)
                protocol = self._protocol(table, must=True)
            if protocol is None and self.table_states.get(table) == "dropped":
                # dropped after Spark logged this batch: its rows went with it; its target
                # keeps what was applied, and its offset stays frozen from here on
                log.warning("table %s was dropped after batch planning began: not read", table)
                continue
            if protocol is None:
                raise OptionError(option=TABLES, value=table, problem="a logged batch reads "
                                  f"it but it is {self.table_states[table]}",
                                  allowed="restore the table, or a new checkpoint directory")
            if reads:
                crash_point("between_table_plans")  # an earlier table's batch is planned
            schema, options = self._schemas[table], protocol.options
            reads += [TableChannel(table, p, schema.primary_key, schema.columns,
                                   options.schema_change_behavior, options.snapshot_op)
                      for p in protocol.plan(start_offset, end_offset)]
            self.table_states[table] = "streaming"
        return deal(reads, self.options.max_partitions)

    def commit(self, end: dict) -> None:
        committed = 0  # tables whose commit ran (a crash point between two of them)
        for table, offset in sorted(_tables_of(end).items()):
            protocol = self._protocol(table)
            if protocol is None:
                continue
            if committed:
                crash_point("between_table_commits")
            committed += 1
            try:
                protocol.commit(offset)
            except CdcError as exc:
                self._stop(table, exc)

    def stop(self) -> None:
        for table in list(self._protocols):
            self._close(table, self._protocols.pop(table))
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # --- executors ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of each (table, channel) dealt to ``partition``, one read after another."""
        assert isinstance(partition, MultiTablePartition)
        for table_channel in partition.reads:
            yield from _read_channel(table_channel)


def _read_channel(read: TableChannel) -> Iterator[pa.RecordBatch]:
    """One table's channel of a batch as generic rows (executor)."""
    schema = output_schema(TableSchema(read.table, read.key_columns, read.columns))
    builder = RecordBatchBuilder(schema, policy=read.policy, table=read.table)
    channel = read.channel
    # snapshot.op=READ: the backend tells base-data rows from the channel and the rows
    snapshots = (executor_clients().reader(channel.endpoint)
                 if read.snapshot_op == READ_OP else None)
    # the channel's end is claimed before any of its rows is yielded: a refusal replays this
    # batch exactly
    for page in claim_and_read(channel, builder.layout).batches():
        rows = builder.project(page, channel.channel_id)
        if snapshots is not None:
            rows = mark_snapshot_reads(rows, snapshots.snapshot_rows(
                channel.channel_id, page.column("_sequence")))
        yield generic_rows(rows, read)


def _tables_of(offset: dict) -> dict[str, dict]:
    """The per-table offsets of a composite offset from Spark's log."""
    tables = offset.get("tables") if isinstance(offset, dict) else None
    if not isinstance(tables, dict):
        raise OptionError(option=TABLES, value=str(offset)[:200],
                          problem="the checkpoint's offset is not a multi-table offset",
                          allowed="a checkpoint directory of a multi-table query")
    return tables


def generic_rows(typed: pa.RecordBatch, read: TableChannel) -> pa.RecordBatch:
    """One table's output rows in the multi-table schema (executor): the key and the row's
    declared columns as JSON objects, binary values in base64, and the table's declared
    columns (``_schema``), with which the apply types them again
    (``tablestore_cdc.pipeline.multi_table.typed_changes``) even after the table is dropped."""
    keys = [c.name for c in read.key_columns]
    names = [c.name for c in read.columns]
    key_rows = typed.select(keys).to_pylist()
    value_rows = typed.select(names).to_pylist() if names else [{}] * typed.num_rows
    ops = typed.column("_op").to_pylist()
    key_json = [_dumps(k) for k in key_rows]
    row_json = [None if op == "DELETE" else _dumps(v) for op, v in zip(ops, value_rows,
                                                                       strict=True)]
    n = typed.num_rows
    declared = json.dumps({"key": [[c.name, c.type] for c in read.key_columns],
                           "columns": [[c.name, c.type] for c in read.columns]},
                          separators=(",", ":"))
    arrays = [constant_strings(read.table, n), pa.array(key_json, pa.string()),
              pa.array(row_json, pa.string()), constant_strings(declared, n)]
    arrays += [typed.column(f.name) for f in METADATA_FIELDS]
    return pa.RecordBatch.from_arrays(arrays, schema=compat.arrow_schema(MULTI_TABLE_SCHEMA))


def _dumps(values: dict[str, Any]) -> str:
    return json.dumps({k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v
                       for k, v in values.items()}, separators=(",", ":"))
