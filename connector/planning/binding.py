"""Binding a query to its meta store, namespace, tunnel and lease: every refusal first (driver).

``StreamProtocol`` binds lazily, at the first call that needs it, in one of two ways:

- ``bind_new_query`` -- ``initialOffset`` (a query without a checkpoint, or one restarted before
  its batch 0 committed);
- ``bind_restart`` -- ``latestOffset`` / ``partitions`` / ``commit`` handed an offset from
  Spark's log (a query restarted on its checkpoint).

Either way the checks come **before anything is created** -- no tunnel, no meta namespace, no
meta-store file or table, no lease row -- and in the order that names the actual problem:

1. (restart) the offset's source against the query's (``connector.identity``): another
   service, table or tunnel is refused saying which; another spelling of the same service is
   the same source, and the namespace the checkpoint's batches are in is the one it names;
2. the meta store, opened without creating it: a restart whose namespace it does not hold was
   written with another meta store (``CheckpointMetaStoreError``, naming the one the offsets
   recorded);
3. the tunnel and the recorded binding, read only (``NamespaceRecord.check``): a tunnel
   deleted or replaced under committed batches, a ``tunnel.type`` that differs;
4. the lease (``connector.planning.lease``): another live query on the source.

Then it creates what is missing: the meta store (SQLite file, DynamoDB or Tablestore table),
the lease, the tunnel, the namespace description. The meta store is opened through the seam
(``connector.clients``: retried). Every call runs inside
``cdc_common.first_contact.query_start``: an endpoint that gives no answer is a configuration
error, reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc_common.first_contact import query_start
from cdc_common.uris import redact_uri
from connector.clients import Clients
from connector.errors import CheckpointMetaStoreError, MetaTableMissingError
from connector.identity import SourceIdentity
from connector.options import SourceOptions
from connector.planning.lease import QueryLease, on_the_holders_line
from connector.planning.namespace import NamespaceRecord
from connector.planning.offsets import offset_namespace
from connector.planning.pushes import CheckpointPushes
from connector.planning.tracker import ChannelTracker
from connector.tunnel import TunnelService
from meta_store import MetaStore


@dataclass
class Binding:
    """What a bound query plans with: its namespace and the pieces working in it."""

    namespace: str
    meta: MetaStore
    record: NamespaceRecord
    tracker: ChannelTracker
    pushes: CheckpointPushes
    lease: QueryLease

    @property
    def tunnel_id(self) -> str:
        return self.record.tunnel_id


def shown_meta_store(options: SourceOptions) -> str:
    """The meta store as offsets record it and errors show it (secrets removed)."""
    return redact_uri(options.meta_store)


def _open_meta(options: SourceOptions, clients: Clients, create: bool) -> MetaStore:
    return clients.meta_store(options.meta_store, options.meta_store_credentials, create=create)


def _existing_meta(options: SourceOptions, clients: Clients, probe: str) -> MetaStore | None:
    """The meta store if it exists, opened without creating it (one read of namespace
    ``probe``: a DynamoDB or Tablestore table says it is missing only when asked); None when
    it does not exist."""
    try:
        store = _open_meta(options, clients, create=False)
    except MetaTableMissingError:
        return None
    try:
        store.get_namespace_info(probe)
    except MetaTableMissingError:
        store.close()
        return None
    except BaseException:
        store.close()
        raise
    return store


def _meta_holds(meta: MetaStore | None, namespace: str, uuid: str | None) -> bool:
    """Does ``meta`` hold ``namespace`` (its description, or the batch ``uuid``)?"""
    if meta is None:
        return False
    return (meta.get_namespace_info(namespace) is not None
            or (uuid is not None and meta.find_batch(namespace, uuid) is not None))


def bind_new_query(options: SourceOptions, identity: SourceIdentity, tunnel: TunnelService,
                   clients: Clients) -> Binding:
    """Bind a query that asks for its initial offset. Its namespace is the identity's, unless
    that is empty while the legacy namespace of the same endpoint spelling holds rows (a query
    of an earlier version: its generations of initial offsets go on)."""
    with query_start():
        existing = _existing_meta(options, clients, identity.namespace)
        namespace = identity.namespace
        if (not _meta_holds(existing, namespace, None)
                and _meta_holds(existing, options.legacy_namespace, None)):
            namespace = options.legacy_namespace
        return _bind(options, identity, tunnel, clients, namespace, existing, restart_from=None)


def bind_restart(options: SourceOptions, identity: SourceIdentity, tunnel: TunnelService,
                 offset: Any, clients: Clients) -> Binding:
    """Bind a query restarted on its checkpoint: ``offset`` is from Spark's log. Its source
    must be this query's (``CheckpointMismatchError`` saying what changed), and the meta
    store must hold its namespace (``CheckpointMetaStoreError`` naming the meta store the
    checkpoint was written with)."""
    namespace = offset_namespace(offset, identity)  # 1. before any request
    uuid = offset.get("uuid") if isinstance(offset.get("uuid"), str) else None
    with query_start():
        existing = _existing_meta(options, clients, namespace)
        if not _meta_holds(existing, namespace, uuid):
            raise _other_meta_store(options, namespace, offset.get("metaStore"),
                                    exists=existing is not None)
        return _bind(options, identity, tunnel, clients, namespace, existing, restart_from=uuid)


def _other_meta_store(options: SourceOptions, namespace: str, recorded: Any,
                      exists: bool) -> CheckpointMetaStoreError:
    current = shown_meta_store(options)
    if isinstance(recorded, str) and recorded != current:
        why = (f"the checkpoint was written with meta store {recorded!r}; set meta.store back "
               "to it (its default follows the endpoint), or use a new checkpoint location")
    else:
        where = "" if exists else " (it does not exist yet: nothing was created)"
        why = ("the checkpoint was written with another meta store" + where + ", or the "
               "namespace was deleted from it; set meta.store to the meta store the query "
               "used before, or use a new checkpoint location (it starts from the tunnel's "
               "pushed checkpoints)")
    return CheckpointMetaStoreError(namespace=namespace, current=current, why=why)


def _bind(options: SourceOptions, identity: SourceIdentity, tunnel: TunnelService,
          clients: Clients, namespace: str, existing: MetaStore | None,
          restart_from: str | None) -> Binding:
    """Steps 3 and 4 of the module docstring, then the writes."""
    record = NamespaceRecord(options, namespace, tunnel, existing)
    record.check()
    defer_lease = False
    if existing is not None and restart_from is None:
        # a new query: refuse a live second one before creating anything (a restart's
        # first write is the lease itself, which may take over its earlier process's)
        holder = existing.get_lease(identity.namespace)
        probe = QueryLease(existing, identity)
        if probe.held_by_another(holder):
            assert holder is not None
            defer_lease = bool(record.tunnel_id) and on_the_holders_line(
                existing, namespace, record.initial_uuid(read_only=True), holder)
            if not defer_lease:
                probe.refuse_if_held(holder)
    meta = existing if existing is not None else _open_meta(options, clients, create=True)
    lease = QueryLease(meta, identity)
    if defer_lease:
        lease.defer(namespace)
    else:
        lease.take(namespace, restart_from)
    try:
        record.bind(meta)
        tracker = ChannelTracker(tunnel, options, record.tunnel_id)
        pushes = CheckpointPushes(meta, tunnel, namespace, record.tunnel_id,
                                  options.commit_interval)
    except BaseException:
        lease.release()
        raise
    return Binding(namespace, meta, record, tracker, pushes, lease)
