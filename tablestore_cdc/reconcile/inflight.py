"""Which differences are still in flight: the source row changed after the position of the
change stream the target is known to hold.

The target names the newest batch its apply query committed and when, and when the same query
committed the batch before (``target.AppliedBatch``). The apply query's batch ``T`` was planned
after its batch ``T - 1`` finished, so after that previous commit: every change the source
query had committed to the change log by then is in the target's version ``T``. (``replicate``
applies from the change log that the source query writes; a source batch's changes are in the
change log before the source query commits it in the meta table. A query that applies in its
own ``foreachBatch`` commits a batch to the meta table after the target, so the same holds.)
The meta table's newest source batch committed by that time (``BatchRecord.committed_at``) and
its end checkpoints are thus a position, per channel, that the target holds: the **applied
position**. It trails the target's newest batch by up to one apply batch.

A difference is IN-FLIGHT when its key has a change after the applied position: the stream will
still apply it, or has applied it since the position (the target may hold it already). Those
changes are read from the tunnel after the scan of the source, read-only (ReadRecords; the
embedded store and the emulator record that a read reached a closed channel's end, as any read
does), so every change the scan could have seen is among them. A key with no such change was
equal at the applied position on both sides: a difference there is not in flight.

When the position cannot be known (no apply batch in the target, no meta table, the change log
trimmed past it, a channel that stays in WAIT), no difference is labelled in flight and the
report says why. Called in the CLI's process by ``tablestore_cdc.reconcile.run``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc_common.uris import redact_uri
from connector.clients import Clients
from connector.errors import CdcError, ChannelNotReadableError, TrimmedDataError
from connector.options import SourceOptions
from connector.planning.positions import Position, positions_after_batch
from connector.tunnel import FINISHED, ChannelStatus, TunnelService
from meta_store import BatchRecord, BatchState, MetaStore
from meta_store.errors import MetaTableMissingError
from tablestore_cdc.reconcile.compare import Progress
from tablestore_cdc.reconcile.layout import Key
from tablestore_cdc.reconcile.target import AppliedBatch

#: records asked per read
READ_LIMIT = 1000
#: empty reads in a row after which a channel counts as read to its head (a backend may say
#: "maybe more" with nothing to give yet)
EMPTY_READS = 3
#: how long a channel in WAIT (its parent not finished yet for the tunnel) is waited for
WAIT_DEADLINE_S = 60.0


@dataclass
class InFlight:
    """The keys among the differences changed after the applied position."""

    determined: bool
    #: how the position was found, or why it could not be
    note: str
    changed: set[Key] = field(default_factory=set)
    #: the applied position, for the report (meta batch, apply batch, records read after it)
    position: dict[str, Any] = field(default_factory=dict)
    #: undetermined because a channel stayed in WAIT: the stream had not read its parent to
    #: the end (a later look, once the stream went on, may determine it)
    waiting: bool = False


def in_flight_keys(options: SourceOptions, applied: AppliedBatch | None, keys: Iterable[Key],
                   progress: Progress | None = None, wait_s: float = WAIT_DEADLINE_S
                   ) -> InFlight:
    """The keys of ``keys`` with a change after the applied position (module docstring);
    ``wait_s``: how long a channel in WAIT is waited for (0: not at all, when the caller
    holds up the stream that would finish its parent)."""
    wanted = set(keys)
    if applied is None:
        return InFlight(False, "the target names no batch of an apply query, so how far the "
                        "stream applied it is unknown")
    try:
        meta = Clients().meta_store(options.meta_store, options.meta_store_credentials,
                                    create=False)
    except MetaTableMissingError:
        return InFlight(False, f"no meta table ({redact_uri(options.meta_store)}): the "
                        "stream has not run")
    try:
        return _in_flight(options, meta, applied, wanted, progress or Progress(), wait_s)
    except MetaTableMissingError:
        return InFlight(False, "the meta table does not exist: the stream has not run")
    finally:
        meta.close()


def _in_flight(options: SourceOptions, meta: MetaStore, applied: AppliedBatch,
               wanted: set[Key], progress: Progress, wait_s: float) -> InFlight:
    with Clients().tunnel(options.endpoint) as tunnel:
        options = options.resolved(tunnel)  # a tunnel.id names the tunnel.name given
        # the channels and their checkpoints first, the batches after: a channel the stream
        # has read by the time the batches are listed is in a batch's manifest, and one it had
        # not read then has a checkpoint taken before any read of it (not past changes the
        # target lacks, as a checkpoint taken after the listing could be)
        description = tunnel.describe_tunnel(options.table_name, options.named_tunnel)
        tunnel_id = description.tunnel.tunnel_id
        unread = {channel.channel_id: tunnel.get_checkpoint(tunnel_id, channel.channel_id).token
                  for channel in description.channels
                  if channel.status is not ChannelStatus.TERMINATED}
        found = _batches_after_position(options, meta, applied)
        if isinstance(found, InFlight):
            return found
        frontier, position = found
        tokens = {c: p.token for c, p in frontier.items() if not p.finished}
        tokens.update((c, token) for c, token in unread.items() if c not in frontier)
        return _read_after(tunnel, tunnel_id, tokens, wanted, options, position, progress,
                           wait_s)


def _batches_after_position(options: SourceOptions, meta: MetaStore, applied: AppliedBatch
                            ) -> tuple[dict[str, Position], dict[str, Any]] | InFlight:
    """The applied position per channel (module docstring) and how it was found, from the
    meta table's batches; an ``InFlight`` saying why when it cannot be known."""
    chain: list[BatchRecord] = []
    for namespace in (options.source_identity, options.legacy_namespace):
        chain = meta.list_batches(namespace)
        if chain:
            break
    if not chain:
        return InFlight(False, f"the meta table holds no batch of {options.source_identity}")
    cutoff = applied.previous_committed_at
    held = [i for i, b in enumerate(chain)
            if b.state.rank >= BatchState.COMMITTED.rank and b.committed_at is not None
            and cutoff is not None and b.committed_at <= cutoff]
    position: dict[str, Any] = {"apply_query": applied.app_id, "apply_batch": applied.batch_id}
    if held:
        index = held[-1]
        batch = chain[index]
        frontier = positions_after_batch(batch, meta.get_end_checkpoints(
            namespace, batch.uuid))
        position["source_batch"] = batch.uuid
        position["spark_batch"] = batch.spark_batch_id
    elif chain[0].prev_uuid is not None:
        return InFlight(False, "the meta table no longer holds the batches before the target's "
                        "applied position (retention): it is unknown")
    else:
        index = -1
        frontier = {}
        position["source_batch"] = None  # nothing known applied: from the stream's start
    for later in chain[index + 1:]:  # channels first read after the position: from their start
        for start in later.manifest.channels if later.manifest else ():
            frontier.setdefault(start.channel_id, Position.at_start(start))
    return frontier, position


def _read_after(tunnel: TunnelService, tunnel_id: str, tokens: dict[str, str],
                wanted: set[Key], options: SourceOptions, position: dict[str, Any],
                progress: Progress, wait_s: float) -> InFlight:
    """Read every channel from its token to its head; the wanted keys met on the way."""
    key_columns = [c.name for c in tunnel.table_schema(options.table_name).primary_key]
    changed: set[Key] = set()
    records = 0
    pending = dict(tokens)
    deadline = time.monotonic() + wait_s
    progress.begin("changes after the applied position", None)
    try:
        while pending:
            waiting = {}
            for channel_id, token in pending.items():
                try:
                    empty = 0  # reads in a row that returned nothing (a head still moving)
                    while empty < EMPTY_READS:
                        result = tunnel.read_records(tunnel_id, channel_id, token, READ_LIMIT)
                        empty = 0 if result.records else empty + 1
                        for record in result.records:
                            key = tuple(record.primary_key[k] for k in key_columns)
                            if key in wanted:
                                changed.add(key)
                        records += len(result.records)
                        progress.advance(len(result.records))
                        token = result.next_token
                        if token == FINISHED or not (result.records or result.may_more):
                            break
                except ChannelNotReadableError:
                    waiting[channel_id] = token  # its parent is not finished yet: later
                except TrimmedDataError as exc:
                    return InFlight(False, f"the change log after the applied position is "
                                    f"trimmed ({exc})", position=position)
            if waiting and time.monotonic() >= deadline:
                return InFlight(False, f"channel(s) {sorted(waiting)} stayed in WAIT (a parent "
                                "not finished for the tunnel: is the stream running?)",
                                position=position, waiting=True)
            if waiting:
                time.sleep(1.0)
            pending = waiting
    except CdcError as exc:
        return InFlight(False, f"the change stream could not be read: {exc}",
                        position=position)
    finally:
        progress.end()
    position["records_after"] = records
    return InFlight(True, "changes after the applied position read from the tunnel",
                    changed, position)
