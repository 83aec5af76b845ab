"""An expired tunnel under ``onDataLoss=resnapshot`` (driver, while a query binds).

A Tablestore tunnel whose change log passed the stream's retention is expired: the service
shows ``TunnelInfo.expired`` and answers every call on it with ``OTSTunnelExpired``
(``TunnelExpiredError``). Nothing more can be read from it. Under ``onDataLoss=fail`` (the
default) that error stops the query, as before. Under ``resnapshot``,
``NamespaceRecord.bind`` calls ``replace_expired_tunnel``, which

1. records a resnapshot signal for the table (origin ``data-loss``), so the ``replicate`` job
   repairs the target from the table's current rows (``tablestore_cdc.resnapshot``);
2. notes in the namespace's record the expired tunnel's id and every batch planned on it, before
   touching the tunnel, so a restart after a crash in between finishes the same replacement;
3. deletes the expired tunnel and creates it again under its name, starting at its newest
   change (``LATEST``: the repair reads every row the new tunnel does not carry).

The positions after a noted batch are the old tunnel's, meaningless to the new one: the next
batch starts from the new tunnel's channels instead (``StreamProtocol._after`` asks
``ExpiredTunnel.planned_on``), a noted batch Spark replays is replayed empty
(``StreamProtocol.plan``), and the noted batches' ends are never pushed to the new tunnel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from connector.options import DataLossPolicy, SourceOptions
from connector.tunnel import StartPosition, TunnelInfo, TunnelService
from meta_store import MetaStore
from meta_store.signals import Signal, SignalBoard

log = logging.getLogger("connector.planning")

#: the namespace record's keys: the expired tunnel's id, the batches planned on it
EXPIRED_TUNNEL_ID = "expired_tunnel_id"
EXPIRED_TUNNEL_BATCHES = "expired_tunnel_batches"


@dataclass(frozen=True)
class ExpiredTunnel:
    """What a namespace's record says of the tunnel it replaced after its expiry."""

    tunnel_id: str
    batches: frozenset[str]

    @classmethod
    def of(cls, info: dict[str, str]) -> ExpiredTunnel | None:
        tunnel_id = info.get(EXPIRED_TUNNEL_ID)
        if not tunnel_id:
            return None
        return cls(tunnel_id, frozenset(info.get(EXPIRED_TUNNEL_BATCHES, "").split()))

    def planned_on(self, batch_uuid: str) -> bool:
        """Was batch ``batch_uuid`` planned on the expired tunnel (its positions are that
        tunnel's)?"""
        return batch_uuid in self.batches


def replaces_expired(options: SourceOptions, current: TunnelInfo | None) -> bool:
    """Is ``current`` an expired tunnel this query replaces (``onDataLoss=resnapshot``)?"""
    return (current is not None and current.expired
            and options.on_data_loss is DataLossPolicy.RESNAPSHOT)


def replace_expired_tunnel(options: SourceOptions, namespace: str, tunnel: TunnelService,
                           meta: MetaStore, expired: TunnelInfo | None,
                           info: dict[str, str]) -> TunnelInfo:
    """Record the signal, note the replacement in ``info`` (written to the meta table at once)
    and replace the tunnel; returns the new one. ``expired``: the expired tunnel, or None when
    a replacement interrupted after its deletion is finished (``info`` notes it already)."""
    table, name = options.table_name, options.named_tunnel
    if expired is not None:
        note = (f"tunnel {name!r} ({expired.tunnel_id}) expired: its change log passed the "
                "stream's retention")
        signal = SignalBoard(meta, namespace).add(Signal(table=table, origin="data-loss",
                                                         note=note))
        log.warning("%s; resnapshot %s of table %s recorded (onDataLoss=resnapshot), the tunnel "
                    "is created again and the replicate job repairs the target from the source",
                    note, signal.id, table)
        info[EXPIRED_TUNNEL_ID] = expired.tunnel_id
        info[EXPIRED_TUNNEL_BATCHES] = " ".join(b.uuid for b in meta.list_batches(namespace))
        meta.set_namespace_info(namespace, info)
        # their ends are positions of the expired tunnel: never pushed to the new one
        meta.mark_pushed(namespace, [b.uuid for b in meta.committed_not_pushed(namespace)])
        tunnel.delete_tunnel(table, name)
    return tunnel.ensure_tunnel(table, name, options.tunnel_type, StartPosition.LATEST)
