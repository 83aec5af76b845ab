"""Meta-table backends, chosen by URI scheme.

- ``sqlite:///abs/path/meta.db`` — embedded default (one machine; WAL, multi-process safe);
- ``dynamodb://TABLE?region=...&endpoint_url=...&create_table=true`` — a shared service for
  clusters (``pip install '.[dynamodb]'``);
- ``tablestore://INSTANCE/TABLE?endpoint=https://...&create_table=true`` — a Tablestore table
  (or the local emulator, ``endpoint=http://127.0.0.1:PORT``) (``pip install '.[tablestore]'``).

Backends are imported lazily (``cdc_common.registry``) so boto3 is only needed for
``dynamodb://`` and the tablestore SDK only for ``tablestore://``; a missing one is refused with
the ``pip install`` line that brings it.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from cdc_common.registry import Backend, BackendRegistry
from cdc_common.uris import redact_uri
from meta_store.base import (
    BatchRecord,
    BatchState,
    ChannelStart,
    EndCheckpoint,
    Manifest,
    MetaStore,
    chain_order,
)
from meta_store.errors import MetaStoreUriError

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


def open_meta_store(uri: str, credentials: Mapping[str, str] | None = None) -> MetaStore:
    """Open the meta store at ``uri`` (driver, executors, CLI).

    ``credentials`` (``access_key_id``, ``access_key_secret``, optional ``security_token``)
    are for backends that take them from the caller rather than the URI, which never holds a
    secret: the Tablestore backend (else it reads ``ALIBABA_CLOUD_*``). Other backends use their
    own credential chains and refuse them."""
    backend = META_BACKENDS.load(uri)
    if credentials:
        scheme = urlsplit(uri).scheme
        if scheme != "tablestore":
            raise MetaStoreUriError(
                uri=redact_uri(uri), reason=f"a {scheme}:// meta store takes no credentials from "
                "the source's options (it uses its own credential chain)")
        store: MetaStore = backend.from_uri(uri, **credentials)
    else:
        store = backend.from_uri(uri)
    return store


__all__ = [
    "META_BACKENDS",
    "BatchRecord",
    "BatchState",
    "ChannelStart",
    "EndCheckpoint",
    "Manifest",
    "MetaStore",
    "chain_order",
    "open_meta_store",
]
