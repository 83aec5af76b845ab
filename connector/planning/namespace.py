"""The namespace's own record in the meta table: the tunnel it reads and its initial offsets.

A namespace (the source identity: endpoint, table, tunnel) keeps one description row in the
meta table (``set_namespace_info``). ``NamespaceRecord`` is opened by ``StreamProtocol`` in
Spark's planning process on the driver; it

- binds the namespace to its tunnel: a namespace with committed batches is bound to the tunnel
  id it recorded, so a tunnel deleted (and perhaps created again under the same name) is refused
  instead of read from positions that mean nothing to it;
- keeps the generations of initial offsets: ``initialOffset`` must return the same UUID every
  time until batch 0 of a query commits (Spark calls it again after every restart until then),
  and a later query (a new checkpoint directory) must start a new generation from the tunnel's
  pushed checkpoints. The row's ``committed_generation`` is a hint; the meta rows decide.
"""

from __future__ import annotations

from connector.errors import OptionError, TunnelGoneError, TunnelReplacedError, UnknownTunnelError
from connector.options import SourceOptions
from connector.planning.offsets import initial_uuid
from connector.tunnel import TunnelInfo, TunnelService
from meta_store import BatchRecord, BatchState, MetaStore


class NamespaceRecord:
    """The tunnel binding and the generation marker of one namespace (driver only)."""

    def __init__(self, options: SourceOptions, tunnel: TunnelService, meta: MetaStore) -> None:
        self.namespace = options.source_identity
        self._meta = meta
        #: the tunnel was created by this process for this query (nobody consumed it)
        self.created_tunnel = False
        recorded = meta.get_namespace_info(self.namespace) or {}
        info = self._bind_tunnel(options, tunnel, recorded.get("tunnel_id"))
        if info.tunnel_type is not options.tunnel_type:
            raise OptionError(option="tunnel.type", value=options.tunnel_type.value,
                              problem=f"tunnel {options.tunnel_name!r} already exists with type "
                              f"{info.tunnel_type.value}",
                              allowed=f"{info.tunnel_type.value}, or another tunnel.name")
        self.tunnel_id = info.tunnel_id
        self._info = {
            **recorded,
            "endpoint": options.safe_endpoint, "table": options.table_name,
            "tunnel": options.tunnel_name, "tunnel_id": self.tunnel_id,
        }
        if recorded.get("tunnel_id") != self.tunnel_id:
            self._info.pop("committed_generation", None)  # generations of another tunnel
        if self._info != recorded:
            meta.set_namespace_info(self.namespace, self._info)

    def _bind_tunnel(self, o: SourceOptions, tunnel: TunnelService,
                     recorded_id: str | None) -> TunnelInfo:
        """The tunnel this namespace reads, checked against the id the meta table recorded.

        A namespace with committed batches is bound to its tunnel id: if the tunnel was deleted
        (and perhaps created again under the same name), its positions mean nothing to the
        current tunnel, so the query is refused (``TunnelReplacedError``/``TunnelGoneError``)
        and no tunnel is created. A namespace with nothing committed binds to the tunnel as it
        is, creating it when missing."""
        try:
            current: TunnelInfo | None = tunnel.describe_tunnel(o.table_name,
                                                                o.tunnel_name).tunnel
        except UnknownTunnelError:
            current = None
        if recorded_id and (current is None or current.tunnel_id != recorded_id):
            if self._has_committed():
                fields = {"table": o.table_name, "tunnel": o.tunnel_name,
                          "namespace": self.namespace, "recorded_id": recorded_id}
                if current is None:
                    raise TunnelGoneError(**fields)
                raise TunnelReplacedError(**fields, current_id=current.tunnel_id)
        if current is not None:
            return current
        self.created_tunnel = True
        start_at_us = o.starting_timestamp * 1000 if o.starting_timestamp is not None else None
        return tunnel.ensure_tunnel(o.table_name, o.tunnel_name, o.tunnel_type,
                                    o.starting_position, start_at_us)

    def _has_committed(self) -> bool:
        """Does the namespace hold a committed batch (an initial batch does not count)?"""
        return any(b.prev_uuid is not None and b.state.rank >= BatchState.COMMITTED.rank
                   for b in self._meta.list_batches(self.namespace))

    # --- generations of initial offsets ---------------------------------------------------------

    def initial_uuid(self) -> str:
        """The UUID of the initial offset a query gets now: that of the open generation."""
        return self._initial_uuid(self._open_generation())

    def _initial_uuid(self, generation: int) -> str:
        return initial_uuid(self.namespace, self.tunnel_id, generation)

    @property
    def _marked_generation(self) -> int:
        """The generation after the newest one recorded as used in the namespace info (a
        hint: ``_open_generation`` checks it against the meta rows)."""
        return int(self._info.get("committed_generation", "-1")) + 1

    def _open_generation(self) -> int:
        """The first generation whose initial batch has no committed successor in the meta
        table, from the recorded marker on. Derived from the rows, so a lost marker write
        cannot hand a new query an initial offset an earlier query already committed after;
        the marker is rewritten (idempotently) when the rows show it is behind."""
        children: dict[str, list[BatchRecord]] = {}
        for b in self._meta.list_batches(self.namespace):
            if b.prev_uuid is not None:
                children.setdefault(b.prev_uuid, []).append(b)
        generation = self._marked_generation
        while any(c.state.rank >= BatchState.COMMITTED.rank
                  for c in children.get(self._initial_uuid(generation), ())):
            generation += 1
        if generation != self._marked_generation:
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
            self._meta.set_namespace_info(self.namespace, self._info)
