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

Each table reads with the query's options (``connector.table_selection``: the selection and
the options, checked at ``load()``); ``tables.options`` sets, for the tables it names,
their own ``schema.change.behavior``, ``snapshot.op`` and read limits (a JSON object ``{table:
{option: value}}``; a JSON value, since Spark lower-cases option keys and table names are
case-sensitive). Each table's protocol applies its own limits (its options'); the first
limit set anywhere is Spark's default read limit, so that Spark never passes
``ReadAllAvailable`` where a table has a limit. A table's read places a value of another type
than its column by its ``schema.change.behavior`` and marks its base-data rows by its
``snapshot.op`` through the single-table query's own read (``connector.reader.read_rows``),
then its rows are written in the one schema of every table (``connector.generic_rows``); a
refusal
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
table is doing (``connector.table_state.TableState``; in Spark's progress report as its text,
``reportLatestOffset``).

Idle cost: a round of ``latestOffset`` asks every table's protocol (its meta-store reads), so
a query whose tables are all idle would ask them all at every trigger (Spark's default trigger
plans again ~10 ms after an empty round). When a round finds nothing new in any table and no
table joins, the next rounds answer the start unchanged without asking any table for a while
that doubles from ``IDLE_BACKOFF_FIRST_S`` up to ``IDLE_BACKOFF_MAX_S``; the first round that
finds a change resets it, so a query under writes plans as often as before. Where the
backend answers one question for every table (the local store's ``change_mark``), that mark
is read at most every ``MARK_READ_EVERY_S`` while waiting and a changed one ends the wait
at once (the cap is then ``IDLE_MARKED_MAX_S``): a write waits no longer than before. A
waiting round holds its answer up to ``IDLE_ANSWER_MAX_S`` meanwhile, so Spark's polls at
rest cost two round trips a second, not ten. An answer equal to the start is "nothing new"
to Spark: offsets, plans and commits keep their meaning. A table's lag
(``reportLatestOffset``) is measured again only when its position moved (its start, or what
its latest offset found); an unmoved table's last figures are reported again.

Where each piece runs: ``MultiTableOptions`` on the driver when ``load()`` is called;
``MultiTableStreamReader`` in Spark's planning process (driver); its ``read`` on executors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from cdc_common.errors import CdcError
from cdc_common.schema_change import DEFAULT_POLICY
from connector import generic_rows
from connector import spark_compat as compat
from connector.clients import Clients
from connector.crash_hook import crash_point
from connector.errors import OptionError, SourceInUseError
from connector.partition import ChannelPartition
from connector.planning.read_limits import trigger_limits
from connector.reader import read_rows
from connector.schema import RecordBatchBuilder, output_schema
from connector.table_selection import TABLES, MultiTableOptions
from connector.table_state import FINAL, PAUSED, State, TableState
from connector.tunnel.base import ColumnSpec, TableSchema

log = logging.getLogger("connector.multiplex")

#: a table whose lease another process holds is tried again after this long (seconds)
LEASE_RETRY_S = 10.0
#: after an empty round, the tables are not asked again for this long, doubled after each
#: further empty round up to the cap (seconds): the longest a write waits for its batch when
#: every table was idle, against the planning loop's cost at rest (module docstring)
IDLE_BACKOFF_FIRST_S = 0.05
IDLE_BACKOFF_MAX_S = 1.0
#: the cap where the backend answers one question for every table (``change_mark``, the local
#: store: one SQLite query, asked at most every ``MARK_READ_EVERY_S``): a changed mark ends
#: the wait at once, so the wait only bounds how late a trim or a lost lease is noticed
IDLE_MARKED_MAX_S = 10.0
#: how often a waiting query reads the store's change mark: a write waits up to this long
#: more for its batch
MARK_READ_EVERY_S = 0.1
#: how long a waiting round holds its answer (reading the mark meanwhile) before it answers
#: "nothing new": Spark asks again ~10 ms after that answer, and each answer costs the JVM and
#: the planning process a round trip with every table's offset and report (at 1,000 tables,
#: answering every ``MARK_READ_EVERY_S`` kept the planning process at 0.13 core); a write is
#: still seen at the next mark read, and a query's stop waits at most this long
IDLE_ANSWER_MAX_S = 0.5

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


class MultiTableStreamReader(DataSourceStreamReader, compat.SupportsTriggerAvailableNow):
    """Spark's handle on a multi-table query (module docstring). PySpark 4.2+ passes the
    start and the read limit to ``latestOffset``; on 4.0 and 4.1 the start is taken from
    Spark's own calls (``spark_compat.BatchStartTracker``, as the one-table source does) and
    the limits are the configured ones.

    ``clients``: the seam that opens every table's clients in the planning process (its
    fault hook, and its clock, by which a restarting table's next try is timed); None: the
    environment's, as in production. Executors read through their own pool.
    ``idle_backoff_max_s``: the idle backoff's cap (``connector.source`` passes
    ``IDLE_BACKOFF_MAX_S``; 0, the default, turns it off); ``idle_pause``: how a waiting round
    sleeps (``time.sleep`` there; None: it answers at once)."""

    def __init__(self, options: MultiTableOptions, clients: Clients | None = None, *,
                 idle_backoff_max_s: float = 0.0,
                 idle_pause: Callable[[float], None] | None = None) -> None:
        self.options = options
        #: 0 (a test's reader, driven call by call): every round asks every table
        self.idle_backoff_max_s = idle_backoff_max_s
        #: Spark asks again ~10 ms after an empty answer, so each answer waits up to
        #: ``MARK_READ_EVERY_S`` (no longer than the wait, nor the next change-mark read)
        self._idle_pause = idle_pause
        self._clients = clients
        #: where the next batch starts on a PySpark that does not pass it (4.0, 4.1)
        self._starts = (None if compat.FEATURES.admission_control
                        else compat.BatchStartTracker(compat.FEATURES.version))
        self._protocols: dict[str, Any] = {}
        self._schemas: dict[str, TableSchema] = {}
        self._admin: Any = None  # the tunnel client that lists tables (planning process)
        self._listed: list[str] = []
        self._listed_at = float("-inf")
        #: table -> its state (``connector.table_state``; ``_stop`` says which a failure
        #: gives) (planning process)
        self.table_states: dict[str, TableState] = {}
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
        #: the idle backoff (module docstring): the current wait, and until when (``_now``)
        #: the tables are not asked; ``rounds``: the rounds that asked them (planning process)
        self.idle_wait = 0.0
        self._idle_until = float("-inf")
        self.rounds = 0
        #: the store's change mark at the last round that asked the tables (None: the backend
        #: has none), and when it is read next while waiting
        self._idle_mark: Any = None
        self._mark_at = float("-inf")
        #: tables whose position moved in the last round, and each table's last lag figures
        self._moved: set[str] = set()
        self._lag: dict[str, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # live clients never travel to executors
        state.update(_protocols={}, _admin=None, _reporters={}, _lease_retry_at={},
                     _clients=None, _retry_at={}, _moved=set(), _lag={}, _idle_pause=None)
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
                    self.options.common_options().endpoint)
            self._listed = self.options.selection.select(
                [n for n in self._admin.list_tables() if n != self.options.meta_table])
            self._listed_at = now
        return self._listed

    def _protocol(self, table: str, *, must: bool = False) -> Any:
        """The table's protocol, opened on first use; None for a stopped table, and for one
        waiting for its lease or restarting until its next try. ``must``: a logged batch
        reads the table, so it is tried now and an error opening it is raised (the query
        fails, and the job's restart replays the batch)."""
        if self._state(table) in FINAL:
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
            self.table_states.setdefault(table, TableState(State.STREAMING))
            if self._available_now:
                protocol.prepare_available_now()
        return self._protocols[table]

    def _state(self, table: str) -> State | None:
        """``table``'s state's name (None: not opened yet)."""
        known = self.table_states.get(table)
        return None if known is None else known.state

    def _stop(self, table: str, reason: BaseException | State) -> None:
        """Stop reading ``table`` (its offset frozen, the other tables go on; module docstring),
        or only pause it: ``waiting`` for a lease another process holds (``SourceInUseError``,
        tried again after ``LEASE_RETRY_S``: the holder may be this query's own killed process,
        or a lease about to expire), ``restarting`` after a retryable error (tried again on
        ``options.retry``'s backoff, the error raised once that gives up)."""
        from connector.errors import EndpointUnreachableError, UnknownTableError

        self._close(table, self._protocols.pop(table, None))
        self._reporters.pop(table, None)
        if isinstance(reason, CdcError) and (reason.retryable or (
                self._reached and isinstance(reason, EndpointUnreachableError))):
            attempt = self._attempts.get(table, 0) + 1
            self._attempts[table] = attempt
            if self.options.retry.gives_up(attempt):
                log.warning("table %s: %d retryable failures in a row (tables.maxRetries): "
                            "the query fails", table, attempt)
                raise reason
            delay = self.options.retry.delay(attempt)
            self._retry_at[table] = self._now() + delay
            first_line = (str(reason).splitlines() or [type(reason).__name__])[0]
            self.table_states[table] = TableState.restarting(first_line, attempt, delay)
            log.warning("table %s restarting (attempt %d, next in %.1f s): %s; the other "
                        "tables go on", table, attempt, delay, first_line)
            return
        if isinstance(reason, SourceInUseError):
            state = TableState(State.WAITING, str(reason))
            self._lease_retry_at[table] = time.monotonic() + LEASE_RETRY_S
        else:
            state = (TableState(State.DROPPED)
                     if isinstance(reason, UnknownTableError) or reason is State.DROPPED
                     else TableState(State.FAILED, f"{type(reason).__name__}: {reason}"))
        if self.table_states.get(table) != state:
            log.warning("table %s stopped (%s); the other tables go on", table,
                        state.label())
        self.table_states[table] = state

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
        state = self._state(table)
        if state in PAUSED:
            if state is State.RESTARTING:
                log.warning("table %s answers again: streaming from where it stopped", table)
            self.table_states[table] = TableState(State.STREAMING)  # its lease is ours now
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
        return {"tables": {table: initial for table in self.listed_tables()
                           if (initial := self._initial_offset(table)) is not None}}

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
            if self._starts is None:  # (4.2+ always passes it)
                raise OptionError(option=TABLES, value=",".join(self.options.selection.include),
                                  problem="Spark asked for a batch without its start",
                                  allowed="a PySpark of 4.0 to 4.3")
            compat.log_degradations_once(log)
            start = self._starts.start(self.initialOffset)
        if not self._available_now and self._waiting() and not self._woken_while_held():
            # backing off after an empty round: nothing new, no table asked
            self._moved = set()
            return {"tables": dict(sorted(_tables_of(start).items()))}
        mark = self._change_mark() if self.idle_backoff_max_s > 0 else None
        self.rounds += 1
        passed = compat.passed_limit(limit)
        listed = set(self.listed_tables())
        moved: set[str] = set()
        ends: dict[str, dict] = {}
        asked = 0  # tables whose latest_offset ran (a crash point between two of them)
        for table, offset in sorted(_tables_of(start).items()):
            ends[table] = offset
            if table not in listed:
                self._stop(table, State.DROPPED)
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
                start_uuid = protocol.uuid_of(offset)
                if ends[table] != offset or self._last_starts.get(table) != start_uuid:
                    moved.add(table)
                self._last_starts[table] = start_uuid
                self._answered(table)
            except CdcError as exc:
                self._stop(table, exc)
        for table in sorted(listed - set(ends)):  # new: joins with its initial offset
            initial = self._initial_offset(table)
            if initial is not None:
                ends[table] = initial
                self.table_states[table] = TableState(State.NEW)
                log.info("table %s joins the query", table)
                moved.add(table)
        self._moved = moved
        self._back_off(found=any(ends[t] != o for t, o in _tables_of(start).items())
                       or len(ends) != len(_tables_of(start)), mark=mark)
        return {"tables": ends}

    def _waiting(self) -> bool:
        """Within the idle backoff's wait, and (where the backend has one) the store's change
        mark not moved since the last round that asked the tables."""
        now = self._now()
        if now >= self._idle_until:
            return False
        if self._idle_mark is None or now < self._mark_at:
            return True
        self._mark_at = now + MARK_READ_EVERY_S
        return self._change_mark() == self._idle_mark

    def _woken_while_held(self) -> bool:
        """While waiting (``_waiting``), hold the answer up to ``IDLE_ANSWER_MAX_S``, reading
        the change mark every ``MARK_READ_EVERY_S``: True when the wait ended meanwhile (the
        mark moved, or the backoff's wait passed), so this round asks the tables; False
        when the held time passed with nothing new (Spark asks again ~10 ms later). Without a
        pause (a test's reader, driven call by call) it answers at once."""
        if self._idle_pause is None:
            return False
        held_until = self._now() + IDLE_ANSWER_MAX_S
        while True:
            mark_at = self._mark_at if self._idle_mark is not None else held_until
            until = min(self._idle_until, mark_at, held_until)
            self._idle_pause(max(0.0, until - self._now()))
            if self._now() >= held_until:
                return False
            if not self._waiting():
                return True

    def _change_mark(self) -> Any:
        """The backend's one answer for every table (``change_mark``); None where it has
        none or the question failed (the wait is then only the backoff's)."""
        ask = getattr(self._admin, "change_mark", None)
        if ask is None:
            return None
        try:
            return ask()
        except Exception as exc:  # noqa: BLE001 - the rounds ask the tables themselves
            log.debug("cannot read the store's change mark: %s", exc)
            return None

    def _back_off(self, found: bool, mark: Any) -> None:
        """After a round that asked the tables (``mark``: the store's change mark read before
        it): a change found (or a table joined) resets the idle backoff; an empty round
        doubles it, up to ``idle_backoff_max_s`` (``IDLE_MARKED_MAX_S`` with a mark)."""
        if found or self.idle_backoff_max_s <= 0:
            self.idle_wait, self._idle_until, self._idle_mark = 0.0, float("-inf"), None
            return
        cap = self.idle_backoff_max_s if mark is None else IDLE_MARKED_MAX_S
        self.idle_wait = min(cap, max(IDLE_BACKOFF_FIRST_S, 2 * self.idle_wait))
        self._idle_until = self._now() + self.idle_wait
        self._idle_mark, self._mark_at = mark, self._now() + MARK_READ_EVERY_S

    def reportLatestOffset(self) -> dict:  # noqa: N802 - Spark's API name
        """Each table's state and its lag (records and seconds behind the head; ``exact``
        false when they are lower bounds, ``None`` before a measurement), and the share of its
        base data read while it snapshots (``snapshot``), in
        ``lastProgress.sources[0].latestOffset``. Each table's lag is measured as a
        single-table query's (``connector.latest_offset_report``: again when its batch start
        moved, else cached for a while; never failing the query), and only for a table whose
        position moved in the last round: an unmoved one's last figures are kept."""
        from connector.latest_offset_report import LatestOffsetReporter

        lag: dict[str, dict[str, Any]] = {}
        for table, protocol in sorted(self._protocols.items()):
            if table in self._lag and table not in self._moved and table in self._reporters:
                lag[table] = self._lag[table]  # not moved: nothing new to measure
                continue
            if table not in self._reporters:
                self._reporters[table] = LatestOffsetReporter(protocol)
            reporter = self._reporters[table]
            measured = reporter.measurements
            report = reporter.report(self._last_starts.get(table)) or {}
            lag[table] = {"recordsBehind": report.get("recordsBehindLatest"),
                          "secondsBehind": report.get("secondsBehindLatest"),
                          "exact": report.get("lagExact", False)}
            if report:
                self._lag[table] = lag[table]
            if reporter.measurements != measured and table not in self._snapshot_done:
                self._measure_snapshot(table, protocol)  # as often as the lag
        snapshots = {table: self._snapshot_percent[table] for table in sorted(self._protocols)
                     if table in self._snapshot_percent}
        return {"tables": {table: state.to_text()
                           for table, state in sorted(self.table_states.items())}, "lag": lag,
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
        if self._starts is not None:
            self._starts.planned(start, end)
        starts = _tables_of(start)
        reads: list[TableChannel] = []
        for table, end_offset in sorted(_tables_of(end).items()):
            start_offset = starts.get(table)
            if start_offset is None or start_offset == end_offset:
                continue  # joined with this batch, or stopped: nothing to read
            protocol = self._protocol(table)
            if protocol is None and self._state(table) in PAUSED:
                # a logged batch reads it: try it now (refused: the query fails on
                # SourceInUseError or the retryable error, and the job's restart tries again)
                protocol = self._protocol(table, must=True)
            if protocol is None and self._state(table) is State.DROPPED:
                # dropped after Spark logged this batch: its rows went with it; its target
                # keeps what was applied, and its offset stays frozen from here on
                log.warning("table %s was dropped after batch planning began: not read", table)
                continue
            if protocol is None:
                raise OptionError(option=TABLES, value=table, problem="a logged batch reads "
                                  f"it but it is {self.table_states[table].label()}",
                                  allowed="restore the table, or a new checkpoint directory")
            if reads:
                crash_point("between_table_plans")  # an earlier table's batch is planned
            schema, options = self._schemas[table], protocol.options
            reads += [TableChannel(table, p, schema.primary_key, schema.columns,
                                   options.schema_change_behavior, options.snapshot_op)
                      for p in protocol.plan(start_offset, end_offset)]
            self.table_states[table] = TableState(State.STREAMING)
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
    """One table's channel of a batch as generic rows (executor): the single-table read
    (``connector.reader.read_rows``, its end claimed before any row is yielded, so a refusal
    replays this batch exactly) with the table's own policies, then encoded
    (``connector.generic_rows``)."""
    schema = output_schema(TableSchema(read.table, read.key_columns, read.columns))
    builder = RecordBatchBuilder(schema, policy=read.policy, table=read.table)
    for rows in read_rows(read.channel, builder, read.snapshot_op):
        yield generic_rows.encode(rows, read.table, read.key_columns, read.columns)


def _tables_of(offset: dict) -> dict[str, dict]:
    """The per-table offsets of a composite offset from Spark's log."""
    tables = offset.get("tables") if isinstance(offset, dict) else None
    if not isinstance(tables, dict):
        raise OptionError(option=TABLES, value=str(offset)[:200],
                          problem="the checkpoint's offset is not a multi-table offset",
                          allowed="a checkpoint directory of a multi-table query")
    return tables
