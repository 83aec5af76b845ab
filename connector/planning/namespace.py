"""The namespace's own record in the meta table: the tunnel it reads and its initial offsets.

A namespace (``connector.identity``: the service, table and tunnel a query reads) keeps one
description row in the meta table (``set_namespace_info``). ``NamespaceRecord`` is opened when
a query binds (``connector.planning.binding``) in Spark's planning process on the driver; it

- binds the namespace to its tunnel: a namespace with committed batches is bound to the tunnel
  id it recorded, so a tunnel deleted (and perhaps created again under the same name) is refused
  instead of read from positions that mean nothing to it; an expired tunnel under
  ``onDataLoss=resnapshot`` is replaced instead (``connector.planning.expiry``);
- keeps the generations of initial offsets: ``initialOffset`` must return the same UUID every
  time until batch 0 of a query commits (Spark calls it again after every restart until then),
  and a later query (a new checkpoint directory) must start a new generation from the tunnel's
  pushed checkpoints. The row's ``committed_generation`` is a hint; the meta rows decide.
"""

from __future__ import annotations

from connector.errors import OptionError, TunnelGoneError, TunnelReplacedError, UnknownTunnelError
from connector.options import SourceOptions
from connector.planning.expiry import (
    EXPIRED_TUNNEL_ID,
    ExpiredTunnel,
    replace_expired_tunnel,
    replaces_expired,
)
from connector.planning.offsets import initial_uuid
from connector.tunnel import TunnelInfo, TunnelService
from meta_store import BatchRecord, BatchState, MetaStore


class NamespaceRecord:
    """The tunnel binding and the generation marker of one namespace (driver only).

    Two steps, so that every refusal comes before anything is created (``StreamProtocol``):
    ``check`` only reads (the tunnel as it is, the binding the meta table recorded), ``bind``
    writes (creates a missing tunnel, records the binding)."""

    def __init__(self, options: SourceOptions, namespace: str, tunnel: TunnelService,
                 meta: MetaStore | None) -> None:
        self.namespace = namespace
        self._options = options
        self._tunnel = tunnel
        self._meta = meta  # None: no meta store yet (a new query's, created by ``bind``)
        self._recorded = (meta.get_namespace_info(namespace) if meta is not None else None) or {}
        self._current: TunnelInfo | None = None
        self.tunnel_id = ""
        #: the tunnel was created by this process for this query (nobody consumed it)
        self.created_tunnel = False
        self._info: dict[str, str] = dict(self._recorded)

    def check(self) -> None:
        """Refuse, reading only, a binding that cannot be made: the tunnel the namespace's
        committed batches were read from was deleted (``TunnelGoneError``) or replaced
        (``TunnelReplacedError``), or it exists with another ``tunnel.type``."""
        o = self._options
        try:
            self._current = self._tunnel.describe_tunnel(o.table_name, o.named_tunnel).tunnel
        except UnknownTunnelError:
            self._current = None
        recorded_id = self._recorded.get("tunnel_id")
        current = self._current
        if recorded_id and (current is None or current.tunnel_id != recorded_id) \
                and not self._replacing_expired:
            if self._has_committed():
                fields = {"table": o.table_name, "tunnel": o.named_tunnel,
                          "namespace": self.namespace, "recorded_id": recorded_id}
                if current is None:
                    raise TunnelGoneError(**fields)
                raise TunnelReplacedError(**fields, current_id=current.tunnel_id)
        if current is not None:
            self._check_type(current)
            self.tunnel_id = current.tunnel_id  # (initial_uuid works before bind)

    def bind(self, meta: MetaStore) -> None:
        """After ``check``: bind the namespace to the tunnel, creating it when missing (a
        namespace with nothing committed, or none yet), and record the binding in ``meta``."""
        o = self._options
        self._meta = meta
        info = self._current
        if replaces_expired(o, info) or (info is None and self._replacing_expired):
            info = replace_expired_tunnel(o, self.namespace, self._tunnel, meta, info, self._info)
            self.created_tunnel = True
        if info is None:
            self.created_tunnel = True
            start_at_us = (o.starting_timestamp * 1000 if o.starting_timestamp is not None
                           else None)
            info = self._tunnel.ensure_tunnel(o.table_name, o.named_tunnel, o.tunnel_type,
                                              o.starting_position, start_at_us)
        self._check_type(info)
        self.tunnel_id = info.tunnel_id
        self._info = {
            **self._info,
            "endpoint": o.safe_endpoint, "table": o.table_name,
            "tunnel": o.named_tunnel, "tunnel_id": self.tunnel_id,
        }
        if self._recorded.get("tunnel_id") != self.tunnel_id:
            self._info.pop("committed_generation", None)  # generations of another tunnel
        if self._info != self._recorded:
            meta.set_namespace_info(self.namespace, self._info)

    @property
    def _replacing_expired(self) -> bool:
        """Was the replacement of the recorded tunnel after its expiry begun (and perhaps
        interrupted after its deletion)? ``bind`` then finishes it."""
        recorded_id = self._recorded.get("tunnel_id")
        return bool(recorded_id) and recorded_id == self._recorded.get(EXPIRED_TUNNEL_ID)

    @property
    def expired_tunnel(self) -> ExpiredTunnel | None:
        """The expired tunnel this namespace's tunnel replaced, if any."""
        return ExpiredTunnel.of(self._info)

    def _check_type(self, info: TunnelInfo) -> None:
        o = self._options
        if info.tunnel_type is not o.tunnel_type:
            raise OptionError(option="tunnel.type", value=o.tunnel_type.value,
                              problem=f"tunnel {o.named_tunnel!r} already exists with type "
                              f"{info.tunnel_type.value}",
                              allowed=f"{info.tunnel_type.value}, or another tunnel.name")

    def _has_committed(self) -> bool:
        """Does the namespace hold a committed batch (an initial batch does not count)?"""
        if self._meta is None:
            return False
        return any(b.prev_uuid is not None and b.state.rank >= BatchState.COMMITTED.rank
                   for b in self._meta.list_batches(self.namespace))

    # --- generations of initial offsets ---------------------------------------------------------

    def initial_uuid(self, *, read_only: bool = False) -> str:
        """The UUID of the initial offset a query gets now: that of the open generation.
        ``read_only``: do not rewrite a marker that is behind (a check before binding)."""
        return self._initial_uuid(self._open_generation(read_only))

    def _initial_uuid(self, generation: int) -> str:
        return initial_uuid(self.namespace, self.tunnel_id, generation)

    @property
    def _marked_generation(self) -> int:
        """The generation after the newest one recorded as used in the namespace info (a
        hint: ``_open_generation`` checks it against the meta rows)."""
        return int(self._info.get("committed_generation", "-1")) + 1

    def _open_generation(self, read_only: bool = False) -> int:
        """The first generation whose initial batch has no committed successor in the meta
        table, from the recorded marker on. Derived from the rows, so a lost marker write
        cannot hand a new query an initial offset an earlier query already committed after;
        the marker is rewritten (idempotently) when the rows show it is behind."""
        children: dict[str, list[BatchRecord]] = {}
        assert self._meta is not None, "initial_uuid needs bind() first"
        for b in self._meta.list_batches(self.namespace):
            if b.prev_uuid is not None:
                children.setdefault(b.prev_uuid, []).append(b)
        generation = self._marked_generation
        while any(c.state.rank >= BatchState.COMMITTED.rank
                  for c in children.get(self._initial_uuid(generation), ())):
            generation += 1
        if generation != self._marked_generation and not read_only:
            self._record_generation(generation - 1)
        return generation

    def note_committed(self, batch: BatchRecord) -> None:
        """Called for every batch as it is committed: once a batch 0 (the successor of the
        marked generation's initial batch) commits, that generation is used. The marker is a
        hint (``initial_uuid`` derives the generation from the rows), so a lost write here costs
        nothing but a look at the rows."""
        generation = self._marked_generation
        if batch.prev_uuid == self._initial_uuid(generation):
            self._record_generation(generation)

    def _record_generation(self, generation: int) -> None:
        if int(self._info.get("committed_generation", "-1")) < generation:
            self._info["committed_generation"] = str(generation)
            assert self._meta is not None  # bound
            self._meta.set_namespace_info(self.namespace, self._info)
