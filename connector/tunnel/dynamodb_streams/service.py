"""DynamoDB Streams as a tunnel service: shards are channels, ``ParentShardId`` is lineage.

Open with ``open_tunnel_service("dynamodb-streams://?checkpoint_table=...&region=...")`` (URI:
``connector.tunnel.dynamodb_streams.aws``). The mapping (docs/dynamodb.md has the whole story):

- **channels**: every shard ``DescribeStream`` lists (all pages). A shard is closed once it has
  an ``EndingSequenceNumber``; for one tunnel it is
  TERMINATED when its FINISHED checkpoint is pushed, WAIT while its parent is listed and not
  TERMINATED, else OPEN. A parent no longer listed was trimmed by retention and counts as
  finished (as KCL does with a missing parent lease).
- **tunnels and checkpoints**: rows of the checkpoint table (``checkpoints.CheckpointTable``).
  A LATEST tunnel fixes its start when created: each open shard's position is its newest
  record now (found by reading the shard once; Streams cannot say it otherwise) and each closed
  shard is FINISHED. Fixing it then keeps every later read of the tunnel deterministic.
- **reading**: a token (``codec``) names a position; every ``read_records`` gets a fresh
  iterator for it, so the 15-minute iterator expiry only matters inside one call (then the
  iterator is fetched again from the last record read). ``GetRecords`` pages are at most 1,000
  records; a null ``NextShardIterator`` means the closed shard is read to its end: FINISHED.
  ``TrimmedDataAccessException`` becomes ``TrimmedDataError`` whose ``resume_token`` is the
  oldest record held now (the reader honours ``failOnDataLoss``).

Who calls what: the driver's planning process calls the tunnel, checkpoint and progress methods;
each executor opens its own instance inside ``read()`` and calls ``read_records`` (one
``GetItem`` on the checkpoint table, one ``GetShardIterator`` and one or more ``GetRecords``
per call; the first read of a child shard also one ``GetItem`` to check its parent).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from connector.errors import (
    ChannelNotReadableError,
    InvalidCheckpointError,
    MalformedTokenError,
    OptionError,
    StreamNotEnabledError,
    TrimmedDataError,
    TunnelExistsError,
    TunnelRequestError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelInfo,
    ChannelLag,
    ChannelStatus,
    Checkpoint,
    ColumnSpec,
    ReadResult,
    Record,
    StartPosition,
    TableSchema,
    TunnelDescription,
    TunnelInfo,
    TunnelService,
    TunnelType,
)
from connector.tunnel.dynamodb_streams import codec
from connector.tunnel.dynamodb_streams.aws import AwsError, call, clients, parse_uri, service_name
from connector.tunnel.dynamodb_streams.checkpoints import CheckpointTable

if TYPE_CHECKING:
    from connector.tunnel.page import Page, PageLayout

log = logging.getLogger(__name__)

#: GetRecords' own cap on records per call
MAX_PAGE = 1000
#: records ``lag`` reads ahead per shard to count them (beyond: a lower bound)
LAG_COUNT_RECORDS = MAX_PAGE
#: DescribeStream's cap on shards per page
DESCRIBE_PAGE = 100
#: times an expired iterator is fetched again within one read
EXPIRED_RETRIES = 3
_KEY_TYPES = {"S": "STRING", "N": "DOUBLE", "B": "BINARY"}


@dataclass(frozen=True)
class Shard:
    shard_id: str
    parent_id: str | None
    starting_sequence_number: str
    ending_sequence_number: str | None

    @property
    def closed(self) -> bool:
        return self.ending_sequence_number is not None


class DynamoDbStreamsTunnelService(TunnelService):
    """The tunnel interface over DynamoDB Streams (see the module docstring). One instance per
    process and thread; cheap to open (no request unless ``create_table=true``, once per
    process)."""

    #: ``ApproximateCreationDateTime`` is rounded down to the second
    commit_time_granularity_us = 1_000_000

    def __init__(self, uri: str) -> None:
        self.config = parse_uri(uri)
        self.uri = self.config.uri
        self._ddb, self._streams = clients(self.config)
        self.checkpoints = CheckpointTable(self._ddb, self.config.checkpoint_table, self.uri,
                                           self.config.endpoint_url, self.config.create_table)
        self._numbers: codec.NumberMode = (
            "decimal" if self.config.numbers == "decimal" else "double")
        self._arns: dict[str, str] = {}
        self._shards: dict[str, dict[str, Shard]] = {}  # table -> shard id -> shard
        #: the positions of the last ``has_new_data`` that found nothing, and until when that
        #: answer stands (``poll_interval_ms``); a checkpoint push ends it early
        self._quiet: tuple[Any, float] | None = None

    @classmethod
    def service_of(cls, uri: str) -> str:
        """``REGION/CHECKPOINT_TABLE`` (``aws.service_name``)."""
        return service_name(parse_uri(uri))

    @classmethod
    def from_uri(cls, uri: str) -> DynamoDbStreamsTunnelService:
        return cls(uri)

    @property
    def clients(self) -> tuple[Any, Any]:
        """The boto3 ``(dynamodb, dynamodbstreams)`` clients (for tests' botocore hooks)."""
        return self._ddb, self._streams

    # --- the stream ---------------------------------------------------------------------

    def _check_table(self, table: str) -> None:
        if self.config.table is not None and table != self.config.table:
            raise OptionError(option="table.name", value=table,
                              problem="the endpoint URI names another table",
                              allowed=self.config.table)

    def list_tables(self) -> list[str]:
        """The region's tables (``ListTables``, every page), sorted, without this endpoint's
        checkpoint table; only the table the URI names, when it names one (driver: a
        multi-table query's selection). A table without a stream is listed too: the query
        reports it failed with ``StreamNotEnabledError``, which says how to enable one."""
        if self.config.table is not None:
            return [self.config.table]
        names: list[str] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = call(self.uri, "ListTables", self._ddb.list_tables, **kwargs)
            names.extend(page.get("TableNames") or [])
            last = page.get("LastEvaluatedTableName")
            if not last:
                break
            kwargs = {"ExclusiveStartTableName": last}
        return sorted(n for n in set(names) if n != self.config.checkpoint_table)

    def _describe_table(self, table: str) -> dict[str, Any]:
        self._check_table(table)
        try:
            out: dict[str, Any] = call(self.uri, "DescribeTable", self._ddb.describe_table,
                                       TableName=table)["Table"]
        except AwsError as exc:
            if exc.code == "ResourceNotFoundException":
                raise UnknownTableError(table=table, endpoint=self.uri) from None
            raise
        return out

    def _arn(self, table: str) -> str:
        if table not in self._arns:
            desc = self._describe_table(table)
            spec = desc.get("StreamSpecification") or {}
            arn = desc.get("LatestStreamArn")
            if not arn or not spec.get("StreamEnabled", True):
                raise StreamNotEnabledError(
                    table=table, endpoint=self.uri,
                    hint="enable it with StreamSpecification={StreamEnabled: true, "
                    "StreamViewType: NEW_AND_OLD_IMAGES}")
            self._arns[table] = arn
        return self._arns[table]

    def _refresh_shards(self, table: str) -> dict[str, Shard]:
        """Every shard of the table's stream, all ``DescribeStream`` pages (driver mostly)."""
        arn = self._arn(table)
        shards: dict[str, Shard] = {}
        kwargs: dict[str, Any] = {"StreamArn": arn, "Limit": DESCRIBE_PAGE}
        while True:
            try:
                desc = call(self.uri, "DescribeStream", self._streams.describe_stream,
                            **kwargs)["StreamDescription"]
            except AwsError as exc:
                if exc.code == "ResourceNotFoundException":  # the stream was replaced
                    self._arns.pop(table, None)
                    raise UnknownTableError(table=table, endpoint=self.uri) from None
                raise
            for s in desc.get("Shards", []):
                rng = s.get("SequenceNumberRange", {})
                shards[s["ShardId"]] = Shard(s["ShardId"], s.get("ParentShardId"),
                                             rng.get("StartingSequenceNumber", "0"),
                                             rng.get("EndingSequenceNumber"))
            last = desc.get("LastEvaluatedShardId")
            if not last:
                break
            kwargs["ExclusiveStartShardId"] = last
        self._shards[table] = shards
        return shards

    def _shard(self, table: str, shard_id: str, tunnel_id: str, fresh: bool = False) -> Shard:
        """One shard, from the cache unless missing there (or ``fresh``)."""
        cached = self._shards.get(table)
        if fresh or cached is None or shard_id not in cached:
            cached = self._refresh_shards(table)
        if shard_id not in cached:
            raise UnknownChannelError(channel_id=shard_id, tunnel_id=tunnel_id)
        return cached[shard_id]

    # --- statuses -----------------------------------------------------------------------

    @staticmethod
    def _status(shard: Shard, shards: Mapping[str, Shard],
                stored: Mapping[str, Checkpoint]) -> ChannelStatus:
        own = stored.get(shard.shard_id)
        if own is not None and own.finished:
            return ChannelStatus.TERMINATED
        parent = shard.parent_id
        if parent and parent in shards:
            done = stored.get(parent)
            if done is None or not done.finished:
                return ChannelStatus.WAIT
        return ChannelStatus.OPEN

    @staticmethod
    def _start(shard: Shard) -> str:
        return codec.start_token(shard.shard_id, shard.starting_sequence_number, shard.parent_id)

    def _tunnel(self, tunnel_id: str) -> TunnelInfo:
        info = self.checkpoints.tunnel_by_id(tunnel_id)
        if info is None:
            raise UnknownTunnelError(tunnel=tunnel_id, table="(by id)")
        return info

    # --- tunnels (driver) -----------------------------------------------------------------

    def _create_tunnel(self, table: str, tunnel_name: str, tunnel_type: TunnelType,
                       start_position: StartPosition, start_at_us: int | None) -> TunnelInfo:
        """Create a tunnel (driver). A LATEST tunnel's start is fixed here: see the module
        docstring. BaseAndStream is refused: DynamoDB Streams has no base data.
        ``start_at_us``: Streams has no iterator at a time (``AT_TIMESTAMP`` is Kinesis'), so
        the tunnel starts EARLIEST and the reader passes over the records whose approximate
        creation time is before the instant."""
        self._check_table(table)
        if tunnel_type is not TunnelType.STREAM:
            raise OptionError(option="tunnel.type", value=str(tunnel_type),
                              problem="DynamoDB Streams has no base data to snapshot",
                              allowed="Stream")
        self._arn(table)  # UnknownTableError / StreamNotEnabledError first
        if self.checkpoints.tunnel_by_name(table, tunnel_name) is not None:
            raise TunnelExistsError(tunnel=tunnel_name, table=table)
        info = TunnelInfo(uuid.uuid4().hex, tunnel_name, table, TunnelType.STREAM,
                          start_position, time.time())
        if info.start_position is StartPosition.LATEST:
            # pins first, under the new id: a crash before the tunnel row leaves only
            # unreachable rows behind
            for shard in self._refresh_shards(table).values():
                if shard.closed:
                    pin = Checkpoint(FINISHED, 0)
                else:
                    pin = Checkpoint(self._tip(table, shard), 0)
                self.checkpoints.put_checkpoint(info.tunnel_id, shard.shard_id, pin)
        self.checkpoints.create_tunnel(info)
        log.info("created tunnel %s (%s) on %s, start %s", tunnel_name, info.tunnel_id, table,
                 info.start_position.value)
        return info

    def _tip(self, table: str, shard: Shard) -> str:
        """The token after the shard's newest record now (its start when it has none). Records
        already trimmed are skipped: they are older than the tunnel anyway."""
        token = self._start(shard)
        while True:
            try:
                result = self._read(table, shard.shard_id, "", token, MAX_PAGE)
            except TrimmedDataError as lost:
                token = lost.resume_token
                if token == FINISHED:  # the shard aged out meanwhile
                    return token
                continue
            if result.records:
                token = codec.after_token(shard.shard_id,
                                          str(int(result.records[-1].sequence)))
            if not result.records or result.next_token == FINISHED:
                # closed meanwhile: stay before the end so a read reaches FINISHED itself
                return token

    def describe_tunnel(self, table: str, tunnel_name: str) -> TunnelDescription:
        """The tunnel and every shard of the stream with its status for this tunnel (driver):
        one ``GetItem``, one ``Query`` and all ``DescribeStream`` pages."""
        self._check_table(table)
        info = self.checkpoints.tunnel_by_name(table, tunnel_name)
        if info is None:
            raise UnknownTunnelError(tunnel=tunnel_name, table=table)
        shards = self._refresh_shards(table)
        stored, _ = self.checkpoints.checkpoints(info.tunnel_id)
        channels = tuple(
            ChannelInfo(s.shard_id, self._status(s, shards, stored),
                        parent_ids=(s.parent_id,) if s.parent_id else ())
            for s in shards.values()
        )
        return TunnelDescription(info, channels)

    def list_tunnels(self, table: str | None = None) -> list[TunnelInfo]:
        return self.checkpoints.list_tunnels(table)

    def delete_tunnel(self, table: str, tunnel_name: str) -> None:
        info = self.checkpoints.tunnel_by_name(table, tunnel_name)
        if info is None:
            raise UnknownTunnelError(tunnel=tunnel_name, table=table)
        self.checkpoints.delete_tunnel(info)

    def table_schema(self, table: str) -> TableSchema:
        """The key schema from ``DescribeTable`` (S -> STRING, N -> DOUBLE, B -> BINARY); no
        attribute columns: DynamoDB declares none (declare them with ``.schema(...)``)."""
        desc = self._describe_table(table)
        types = {a["AttributeName"]: a["AttributeType"]
                 for a in desc.get("AttributeDefinitions", [])}
        order = sorted(desc["KeySchema"], key=lambda k: k["KeyType"] != "HASH")
        return TableSchema(table, tuple(ColumnSpec(k["AttributeName"],
                                                   _KEY_TYPES[types[k["AttributeName"]]])
                                        for k in order))

    # --- checkpoints (driver) -------------------------------------------------------------

    def _own_position(self, tunnel: TunnelInfo, channel_id: str, token: str) -> codec.Position:
        """Decode ``token`` and check it names ``channel_id`` (an unknown channel first)."""
        pos = codec.parse_token(token, channel_id)
        if pos.shard_id != channel_id:
            self._shard(tunnel.table_name, channel_id, tunnel.tunnel_id)
            raise MalformedTokenError(channel_id=channel_id, token=token,
                                      reason=f"the token is shard {pos.shard_id}'s")
        return pos

    def get_checkpoint(self, tunnel_id: str, channel_id: str) -> Checkpoint:
        tunnel = self._tunnel(tunnel_id)
        stored = self.checkpoints.checkpoint(tunnel_id, channel_id)
        if stored is not None:
            return stored
        shard = self._shard(tunnel.table_name, channel_id, tunnel_id)
        return Checkpoint(self._start(shard), 0)

    def checkpoint(self, tunnel_id: str, channel_id: str, checkpoint: Checkpoint) -> None:
        """Push a checkpoint (driver, the source's commit). Checks: the token is this shard's;
        FINISHED only for a closed, readable shard a read of this tunnel finished, and nothing
        else once FINISHED; the sequence number never goes down (``StaleCheckpointError``)."""
        tunnel = self._tunnel(tunnel_id)
        seqno = checkpoint.sequence_number

        def invalid(reason: str) -> InvalidCheckpointError:
            return InvalidCheckpointError(channel_id=channel_id, tunnel_id=tunnel_id,
                                          reason=reason)

        if not checkpoint.sequence_is_valid:
            raise invalid(f"sequence number must be a non-negative integer, got {seqno!r}")
        if not checkpoint.finished:
            # no listing needed: a position of a shard that has since aged out is still stored
            self._own_position(tunnel, channel_id, checkpoint.token)
        stored = self.checkpoints.checkpoint(tunnel_id, channel_id)
        if stored is not None and stored.finished:
            if not checkpoint.finished:
                raise invalid("the shard is already finished for this tunnel; only FINISHED "
                              "may be pushed again")
        elif checkpoint.finished:
            shard = self._shard(tunnel.table_name, channel_id, tunnel_id)
            if not shard.closed:
                shard = self._shard(tunnel.table_name, channel_id, tunnel_id, fresh=True)
            if not shard.closed:
                raise invalid("FINISHED pushed for a shard that is still open")
            shards = self._shards[tunnel.table_name]
            all_stored, ended = self.checkpoints.checkpoints(tunnel_id)
            if self._status(shard, shards, all_stored) is ChannelStatus.WAIT:
                raise invalid("FINISHED pushed for a shard in WAIT (its parent is not "
                              "finished for this tunnel)")
            if channel_id not in ended:
                raise invalid("FINISHED pushed but no read of this tunnel reached the "
                              "shard's end")
        self.checkpoints.put_checkpoint(tunnel_id, channel_id, checkpoint)
        self._quiet = None  # a FINISHED push may have released children

    # --- data (executors) -------------------------------------------------------------------

    def read_records(self, tunnel_id: str, channel_id: str, token: str, limit: int,
                     afters: list[str] | None = None) -> ReadResult:
        """Read up to ``limit`` records after ``token`` (executor). Never waits for new data.
        ``afters`` (``read_page``'s) gets the token after each record read.

        A child shard not read before (a start token naming its parent) is checked for WAIT:
        one ``GetItem`` (plus a ``DescribeStream`` only when the parent is not finished for this
        tunnel, to see whether it aged out); a shard no longer listed
        whose position is not FINISHED lost its remaining records to retention
        (``TrimmedDataError`` with ``resume_token`` FINISHED)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        tunnel = self._tunnel(tunnel_id)
        if token == FINISHED:
            return ReadResult([], FINISHED, False)
        pos = self._own_position(tunnel, channel_id, token)
        if pos.kind == "S" and pos.parent_id:  # first read of a child: is its parent done?
            parent = self.checkpoints.checkpoint(tunnel_id, pos.parent_id)
            if parent is None or not parent.finished:
                # not finished for this tunnel: readable only if the parent aged out
                shards = self._refresh_shards(tunnel.table_name)
                if pos.parent_id in shards:
                    raise ChannelNotReadableError(channel_id=channel_id, tunnel_id=tunnel_id,
                                                  status=ChannelStatus.WAIT.value)
        result = self._read(tunnel.table_name, channel_id, tunnel_id, token, limit, afters)
        if result.next_token == FINISHED:
            self.checkpoints.mark_end(tunnel_id, channel_id)
        return result

    def read_page(self, tunnel_id: str, channel_id: str, token: str, limit: int,
                  layout: PageLayout) -> Page:
        """``read_records`` as one columnar page (executor, ``connector.reader``), with numbers
        shaped for the layout's column types (``codec.fit_records``); the token after its
        ``n``-th record is the one after that record's sequence number."""
        from connector.tunnel.page import Page, records_to_page

        afters: list[str] = []
        result = self.read_records(tunnel_id, channel_id, token, limit, afters)
        records = codec.fit_records(result.records, layout.columns, self._numbers)
        return Page(records_to_page(records, layout, token=token), result.next_token,
                    result.may_more, tokens=lambda n: afters[n - 1])

    def _read(self, table: str, shard_id: str, tunnel_id: str, token: str,
              limit: int, afters: list[str] | None = None) -> ReadResult:
        """``GetShardIterator`` for ``token``, then ``GetRecords`` until ``limit`` records, an
        empty page (caught up) or a null next iterator (FINISHED); ``afters`` (when given)
        gets the token after each record."""
        pos = codec.parse_token(token, shard_id)
        records: list[Record] = []
        iterator = self._iterator(table, shard_id, tunnel_id, pos)
        last = token
        expired = 0
        while len(records) < limit:
            try:
                out = call(self.uri, "GetRecords", self._streams.get_records,
                           ShardIterator=iterator, Limit=min(MAX_PAGE, limit - len(records)))
            except AwsError as exc:
                if exc.code == "ExpiredIteratorException" and expired < EXPIRED_RETRIES:
                    expired += 1  # re-get from the last record read
                    iterator = self._iterator(table, shard_id, tunnel_id,
                                              codec.parse_token(last, shard_id))
                    continue
                if exc.code == "TrimmedDataAccessException" and records:
                    break  # hand out what was read; the next read raises
                raise self._mapped(exc, table, shard_id, tunnel_id, pos) from None
            page = out.get("Records", [])
            for raw in page:
                records.append(codec.decode_record(raw, shard_id, last, self._numbers))
                last = codec.after_token(shard_id, str(raw["dynamodb"]["SequenceNumber"]))
                if afters is not None:
                    afters.append(last)
            iterator = out.get("NextShardIterator")
            if not iterator:
                return ReadResult(records, FINISHED, False)
            if not page:
                return ReadResult(records, last, False)
        return ReadResult(records, last, True)

    def _iterator(self, table: str, shard_id: str, tunnel_id: str, pos: codec.Position) -> str:
        try:
            out = call(self.uri, "GetShardIterator", self._streams.get_shard_iterator,
                       StreamArn=self._arn(table), ShardId=shard_id, **pos.iterator_args())
        except AwsError as exc:
            raise self._mapped(exc, table, shard_id, tunnel_id, pos) from None
        iterator: str = out["ShardIterator"]
        return iterator

    def _mapped(self, exc: AwsError, table: str, shard_id: str, tunnel_id: str,
                pos: codec.Position) -> Exception:
        if exc.code == "TrimmedDataAccessException":
            return TrimmedDataError(
                channel_id=shard_id, tunnel_id=tunnel_id,
                requested=f"{'after ' if pos.kind == 'A' else ''}{pos.sequence_number}",
                earliest="the oldest record held now", lost="an unknown number of",
                resume_token=codec.horizon_token(shard_id))
        if exc.code == "ResourceNotFoundException":
            # the shard aged out of the stream whole: nothing after this position is held
            return TrimmedDataError(
                channel_id=shard_id, tunnel_id=tunnel_id, requested=pos.sequence_number,
                earliest="none (the shard is no longer in the stream)",
                lost="an unknown number of", resume_token=FINISHED)
        return TunnelRequestError(endpoint=self.uri, operation="DynamoDB Streams",
                                  reason=str(exc))

    # --- progress (driver) ----------------------------------------------------------------

    def has_new_data(self, tunnel_id: str, positions: Mapping[str, str]) -> bool:
        """Would reading return something (driver, ``latestOffset``)? True for an OPEN shard
        missing from ``positions``, a closed OPEN shard not at FINISHED, or an OPEN shard with a
        record after its position (one ``GetShardIterator`` + ``GetRecords(Limit=1)`` each).

        A "no" stands for ``poll_interval_ms`` while the positions stay the same and nothing is
        pushed, so an idle query does not probe every shard on each of Spark's polls."""
        key = (tunnel_id, frozenset(positions.items()))
        if self._quiet is not None and self._quiet[0] == key \
                and time.monotonic() < self._quiet[1]:
            return False
        tunnel = self._tunnel(tunnel_id)
        shards = self._refresh_shards(tunnel.table_name)
        stored, _ = self.checkpoints.checkpoints(tunnel_id)
        for shard in shards.values():
            if self._status(shard, shards, stored) is not ChannelStatus.OPEN:
                continue
            token = positions.get(shard.shard_id)
            if token is None:
                return True
            if token == FINISHED:
                continue
            if shard.closed:
                return True
            try:
                probe = self._read(tunnel.table_name, shard.shard_id, tunnel_id, token, 1)
            except TrimmedDataError:
                return True  # reading will report the loss
            if probe.records or probe.next_token == FINISHED:
                return True
        self._quiet = (key, time.monotonic() + self.config.poll_interval_ms / 1000)
        return False

    def head_sequences(self, tunnel_id: str) -> dict[str, str]:
        """Per shard, the ``Record.sequence`` of its newest record now ("" when none is held
        after the tunnel's pushed position). Driver, ``prepareForTriggerAvailableNow``.

        Streams cannot say where a shard ends without reading it, so this reads every shard not
        TERMINATED from the tunnel's pushed checkpoint to its tip, once per AvailableNow run."""
        tunnel = self._tunnel(tunnel_id)
        shards = self._refresh_shards(tunnel.table_name)
        stored, _ = self.checkpoints.checkpoints(tunnel_id)
        out: dict[str, str] = {}
        for shard in shards.values():
            sid = shard.shard_id
            cp = stored.get(sid)
            if cp is not None and cp.finished:
                out[sid] = ""
                continue
            token = cp.token if cp is not None else self._start(shard)
            pos = codec.parse_token(token, sid)
            newest = codec.padded(pos.sequence_number) if pos.kind == "A" else ""
            while token != FINISHED:
                try:
                    result = self._read(tunnel.table_name, sid, tunnel_id, token, MAX_PAGE)
                except TrimmedDataError as lost:
                    token = lost.resume_token
                    continue
                if result.records:
                    newest = result.records[-1].sequence
                token = result.next_token
                if not result.records:
                    break
            out[sid] = newest
        return out

    def lag(self, tunnel_id: str, positions: Mapping[str, str]) -> dict[str, ChannelLag]:
        """Per shard not TERMINATED (a child waiting for its parent included: Streams serves
        it): records behind and the age of the oldest unread one (0.0 when caught up).
        Position = ``positions`` or the stored checkpoint. Streams cannot count without
        reading, so each shard is read from its position up to ``LAG_COUNT_RECORDS`` records
        (one ``GetShardIterator`` and, unless pages are cut at 1 MB, one ``GetRecords`` per
        shard): the count is exact when the tip comes first, else a lower bound (``exact``
        false); a trimmed position counts 0, a lower bound. Driver: CLI, dashboard, Spark's
        progress report, and the planner when a per-trigger row limit is set."""
        tunnel = self._tunnel(tunnel_id)
        shards = self._refresh_shards(tunnel.table_name)
        stored, _ = self.checkpoints.checkpoints(tunnel_id)
        now_us = time.time_ns() // 1000
        out: dict[str, ChannelLag] = {}
        for shard in shards.values():
            if self._status(shard, shards, stored) is ChannelStatus.TERMINATED:
                continue
            sid = shard.shard_id
            token = positions.get(sid) or (stored[sid].token if sid in stored else
                                           self._start(shard))
            if token == FINISHED:
                out[sid] = ChannelLag(sid, 0, 0.0)
                continue
            try:
                ahead = self._read(tunnel.table_name, sid, tunnel_id, token, LAG_COUNT_RECORDS)
            except TrimmedDataError:
                out[sid] = ChannelLag.nothing_readable(sid)
                continue
            age = (max(0.0, (now_us - ahead.records[0].commit_ts_us) / 1e6) if ahead.records
                   else 0.0)
            out[sid] = ChannelLag(sid, len(ahead.records), age, exact=not ahead.may_more)
        return out

    def close(self) -> None:
        """Nothing to release: boto3 clients close their pools when collected."""
