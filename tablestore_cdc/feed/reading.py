"""How the feed and the inspection commands read a meta store.

Opened without creating anything (``open_existing_meta_store``), read so that one corrupt row
does not hide the rest (``InspectedStore``), the namespace resolved (``resolve_namespace``) and a
batch found by a UUID prefix (``find_batch``). The errors an operator's request can end in
(``InspectionError``) are here too. Used by ``tablestore-cdc meta ...``, ``tablestore-cdc
progress`` and the dashboard, in an operator's shell or a sidecar; never by the protocol, which
must stop on a corrupt row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connector.errors import (
    CorruptMetaRecordError,
    MetaStoreError,
    MetaTableMissingError,
    UnknownBatchError,
)
from meta_store import BatchRecord, BatchState, EndCheckpoint, MetaStore, open_meta_store
from meta_store.base import chain_order
from meta_store.errors import MetaStoreAbsentError
from tablestore_cdc.query_record import QUERY_RECORD_PREFIX
from tablestore_cdc.table_status import TABLE_STATUS_PREFIX

#: the shortest UUID prefix ``find_batch`` accepts
MIN_PREFIX = 4


# --- errors ---------------------------------------------------------------------------------------


class InspectionError(MetaStoreError):
    """A request of the inspection CLI / feed / dashboard cannot be answered (bad namespace,
    ambiguous UUID prefix, ...). The CLI prints it on one line and exits with code 2."""

    template = "{detail}"


class MetaStoreNotFoundError(InspectionError):
    template = (
        "no meta store at {path}: the file does not exist (inspection never creates one); "
        "check --meta"
    )


# --- opening and resolving ------------------------------------------------------------------------


def open_existing_meta_store(uri: str) -> MetaStore:
    """Open the meta store at ``uri`` for inspection without creating anything
    (``open_meta_store(create=False)``): a SQLite path that does not exist is refused (opening
    it would create an empty store), and a DynamoDB or Tablestore URI's ``create_table=true``
    is dropped (a missing table is reported, not created). Other errors are the backend's
    ``CdcError``s."""
    try:
        return open_meta_store(uri, create=False)
    except MetaStoreAbsentError as exc:
        raise MetaStoreNotFoundError(path=exc.fields.get("table")) from None
    except MetaTableMissingError as exc:
        raise missing_table(exc) from None


def missing_table(exc: MetaTableMissingError) -> InspectionError:
    """The backend's "table missing" error without its hint to pass ``create_table=true``,
    which inspection ignores (a backend may find out at open or at the first read)."""
    return InspectionError(detail=f"meta table {exc.fields.get('table')!r} does not exist at "
                           f"{exc.fields.get('location')}; inspection never creates it "
                           "(create_table=true is ignored): check --meta")


class InspectedStore:
    """A meta store as the inspection tools read it: one corrupt row does not hide the rest.

    Wraps an open ``MetaStore`` (CLI, dashboard). ``list_namespaces``, ``list_batches``,
    ``get_end_checkpoints``, ``latest_committed`` and ``get_namespace_info`` skip a row that
    does not decode and note it in ``corrupt`` (key -> reason, as ``CorruptMetaRecordError``
    names them); every other attribute is the store's own. The skipping relies on the backends
    decoding row by row in ``_decode_namespace`` / ``_decode_batch`` / ``_decode_end``: for one
    call, the wrapped instance's decoder returns a marker instead of raising (a backend without
    them fails on the row as before). Never used by the protocol, which must stop on a corrupt
    row.
    """

    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self.corrupt: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _note(self, exc: CorruptMetaRecordError) -> None:
        key = str(exc.fields.get("key", "?"))
        self.corrupt.setdefault(key, str(exc.fields.get("reason", exc)))

    def _skipping(self, decoder: str, call: Callable[[], list[Any]]) -> list[Any]:
        decode = getattr(type(self.store), decoder, None)
        if decode is None:
            return call()

        def tolerant(*args: Any) -> Any:
            try:
                return decode(self.store, *args)
            except CorruptMetaRecordError as exc:
                self._note(exc)
                return _SKIPPED

        self.store.__dict__[decoder] = tolerant
        try:
            return [x for x in call() if x is not _SKIPPED]
        finally:
            del self.store.__dict__[decoder]

    def list_batches(self, namespace: str) -> list[BatchRecord]:
        store: Any = self.store
        return chain_order(self._skipping("_decode_batch",
                                          lambda: store._list_batches(namespace)))

    def get_end_checkpoints(self, namespace: str, uuid: str) -> dict[str, EndCheckpoint]:
        store: Any = self.store
        ends = self._skipping("_decode_end", lambda: store._list_ends(namespace, uuid))
        return {e.channel_id: e for e in ends}

    def list_namespaces(self) -> list[str]:
        return self._skipping("_decode_namespace", self.store.list_namespaces)

    def latest_committed(self, namespace: str) -> BatchRecord | None:
        committed = [b for b in self.list_batches(namespace)
                     if b.state.rank >= BatchState.COMMITTED.rank]
        return committed[-1] if committed else None

    def get_namespace_info(self, namespace: str) -> dict[str, str] | None:
        try:
            return self.store.get_namespace_info(namespace)
        except CorruptMetaRecordError as exc:
            key = str(exc.fields.get("key", f"{namespace}/info"))
            self.corrupt.setdefault(key, corrupt_info_message(namespace))
            return None

    def corrupt_records(self) -> list[dict[str, str]]:
        """What was skipped so far, as ``{"key", "reason"}`` (the ``corrupt`` field of
        ``meta batches --json`` and ``meta export``)."""
        return [{"key": k, "reason": v} for k, v in sorted(self.corrupt.items())]


#: what a tolerant decoder returns for a corrupt row
_SKIPPED = object()


def corrupt_info_message(namespace: str) -> str:
    return (f"the info record of namespace {namespace!r} is corrupt (not a JSON object of "
            "strings): its endpoint, table and tunnel are unknown")


def user_namespaces(store: MetaStore) -> list[str]:
    """The store's source namespaces (the companion namespaces of query records and table
    statuses hidden), sorted."""
    try:
        names = store.list_namespaces()  # the first read of every inspection command
    except MetaTableMissingError as exc:
        raise missing_table(exc) from None
    return [ns for ns in names if not ns.startswith((QUERY_RECORD_PREFIX, TABLE_STATUS_PREFIX))]


def resolve_namespace(store: MetaStore, namespace: str | None) -> str:
    """``namespace`` if the store has it; with ``None`` the store's only namespace. Raises
    ``InspectionError`` listing the namespaces there are."""
    known = user_namespaces(store)
    if namespace is not None:
        if namespace in known:
            return namespace
        listing = ", ".join(repr(n) for n in known) or "none"
        raise InspectionError(detail=f"no namespace {namespace!r} in meta store {store.uri} "
                              f"(namespaces: {listing})")
    if not known:
        raise InspectionError(detail=f"meta store {store.uri} has no namespace yet (no query "
                              "has run against it)")
    if len(known) > 1:
        raise InspectionError(detail=f"meta store {store.uri} has {len(known)} namespaces; "
                              "choose one with --namespace: " + ", ".join(repr(n) for n in known))
    return known[0]


def find_batch(store: MetaStore, namespace: str, uuid: str) -> BatchRecord:
    """The batch with UUID ``uuid`` or the only one whose UUID starts with it (at least 4
    characters). ``UnknownBatchError`` naming it when there is none."""
    batch = store.find_batch(namespace, uuid)
    if batch is not None:
        return batch
    matches = [b for b in store.list_batches(namespace) if b.uuid.startswith(uuid)]
    if len(uuid) >= MIN_PREFIX and len(matches) == 1:
        return matches[0]
    if len(uuid) >= 4 and len(matches) > 1:
        raise InspectionError(detail=f"UUID prefix {uuid!r} matches {len(matches)} batches: "
                              + ", ".join(b.uuid for b in matches))
    if len(uuid) < MIN_PREFIX:
        raise InspectionError(detail=f"UUID prefix {uuid!r} is too short: give the whole UUID "
                              f"or at least {MIN_PREFIX} characters of it")
    raise UnknownBatchError(uuid=uuid, namespace=namespace)
