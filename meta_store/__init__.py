"""Meta-table backends, chosen by URI scheme, and the URI steps their ``from_uri`` share.

- ``sqlite:///abs/path/meta.db`` — embedded default (one machine; WAL, multi-process safe);
- ``dynamodb://TABLE?region=...&endpoint_url=...&create_table=true`` — a shared service;
- ``tablestore://INSTANCE/TABLE?endpoint=https://...&create_table=true`` — a Tablestore table
  (or the local emulator, ``endpoint=http://127.0.0.1:PORT``).

Backends are imported lazily (``cdc_common.registry``): boto3 is needed only for ``dynamodb://``
and the tablestore SDK only for ``tablestore://``; a missing one is refused with the
``pip install`` line that brings it (``META_BACKENDS``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from cdc_common.registry import Backend, BackendRegistry
from cdc_common.uris import UriQuery, redact_uri
from meta_store.base import BatchRecord as BatchRecord
from meta_store.base import BatchState as BatchState
from meta_store.base import ChannelStart as ChannelStart
from meta_store.base import EndCheckpoint as EndCheckpoint
from meta_store.base import Lease as Lease
from meta_store.base import Manifest as Manifest
from meta_store.base import MetaStore as MetaStore
from meta_store.base import chain_order as chain_order
from meta_store.errors import MetaStoreAbsentError, MetaStoreUriError

#: scheme -> the meta-store backend class and how to install what it needs
META_BACKENDS = BackendRegistry(
    {
        "sqlite": Backend("meta_store.sqlite:SqliteMetaStore"),
        "dynamodb": Backend("meta_store.dynamodb:DynamoDbMetaStore",
                            "pip install 'tablestore-cdc[dynamodb]'"),
        "tablestore": Backend("meta_store.tablestore:TablestoreMetaStore",
                              "pip install 'tablestore-cdc[tablestore]'"),
    },
    refuse=lambda uri, problem, allowed: MetaStoreUriError(uri=uri, reason=f"{problem}; "
                                                           f"use {allowed}"),
)


def open_meta_store(uri: str, credentials: Mapping[str, str] | None = None, *,
                    create: bool = True) -> MetaStore:
    """Open the meta store at ``uri`` (driver, executors, CLI).

    ``credentials`` (``access_key_id``, ``access_key_secret``, optional ``security_token``)
    are for backends that take them from the caller rather than the URI, which never holds a
    secret: the Tablestore backend (else it reads ``ALIBABA_CLOUD_*``). Other backends use their
    own credential chains and refuse them.

    ``create=False`` opens without creating anything (a query checking a restart before it
    writes, the inspection tools): a SQLite file that does not exist raises
    ``MetaStoreAbsentError`` instead of being created, and a DynamoDB or Tablestore URI's
    ``create_table=true`` is ignored (a missing table raises ``MetaTableMissingError``, at open
    or at the first request)."""
    if not create:
        uri = _without_creating(uri)
    backend = META_BACKENDS.load(uri)
    scheme = urlsplit(uri).scheme
    if credentials and scheme != "tablestore":
        raise MetaStoreUriError(
            uri=redact_uri(uri), reason=f"a {scheme}:// meta store takes no credentials from "
            "the source's options (it uses its own credential chain)")
    store: MetaStore = backend.from_uri(uri, **(credentials or {}))
    return store


def _without_creating(uri: str) -> str:
    """``uri`` as it opens without creating: ``MetaStoreAbsentError`` for a SQLite path that
    does not exist; ``create_table`` dropped from a DynamoDB or Tablestore URI."""
    parts = urlsplit(uri)
    if parts.scheme == "sqlite" and not parts.netloc:
        path = unquote(parts.path)
        if path and os.path.isabs(path) and not os.path.exists(path):
            raise MetaStoreAbsentError(table=path, location="this file system")
    if parts.scheme in ("dynamodb", "tablestore") and parts.query:
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                 if k != "create_table"]
        uri = urlunsplit(parts._replace(query=urlencode(query)))
    return uri


def split_store_uri(uri: str, scheme: str, query: type[UriQuery], *, user_info: bool = False
                    ) -> tuple[SplitResult, Callable[[str], MetaStoreUriError]]:
    """The first steps of each backend's ``from_uri`` (driver, executors, CLI): ``uri`` split,
    its scheme checked and (unless ``user_info``: the backend refuses a host itself) no
    credentials before ``@``; with ``refuse(reason)``, the error naming ``uri`` with its
    secrets hidden."""
    shown = redact_uri(uri, query.model_fields)

    def refuse(reason: str) -> MetaStoreUriError:
        return MetaStoreUriError(uri=shown, reason=reason)

    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if parts.scheme != scheme:
        raise refuse(f"not a {scheme}:// URI")
    if "@" in parts.netloc and not user_info:
        raise refuse(f"credentials are not accepted in the URI; {query.credentials_hint}")
    return parts, refuse


def query_text(query: UriQuery) -> str:
    """The parameters of ``query`` that are not their defaults, as a store's ``uri`` shows
    them after its ``?`` (none: no ``?``)."""
    given = {name: "true" if value is True else value for name, value in query
             if value != type(query).model_fields[name].default}
    return "?" + urlencode(given, safe="/:") if given else ""

