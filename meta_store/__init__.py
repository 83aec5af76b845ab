"""Meta-table backends, chosen by URI scheme.

- ``sqlite:///abs/path/meta.db`` — embedded default (one machine; WAL, multi-process safe);
- ``dynamodb://TABLE?region=...&endpoint_url=...&create_table=true`` — a shared service for
  clusters (``pip install '.[dynamodb]'``);
- ``tablestore://INSTANCE/TABLE?endpoint=https://...&create_table=true`` — a Tablestore table
  (or the local emulator, ``endpoint=http://127.0.0.1:PORT``) (``pip install '.[tablestore]'``).

Backends are imported lazily so boto3 is only needed for ``dynamodb://`` and the tablestore SDK
only for ``tablestore://``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from urllib.parse import urlsplit

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

#: scheme -> (dotted path of the backend class, how to install what it needs)
META_BACKENDS: dict[str, tuple[str, str]] = {
    "sqlite": ("meta_store.sqlite:SqliteMetaStore", "included"),
    "dynamodb": ("meta_store.dynamodb:DynamoDbMetaStore", "pip install 'tablestore-cdc[dynamodb]'"),
    "tablestore": ("meta_store.tablestore:TablestoreMetaStore",
                   "pip install 'tablestore-cdc[tablestore]'"),
}


def open_meta_store(uri: str, credentials: Mapping[str, str] | None = None) -> MetaStore:
    """Open the meta store at ``uri`` (driver, executors, CLI).

    ``credentials`` (``access_key_id``, ``access_key_secret``, optional ``security_token``)
    are for backends that take them from the caller rather than the URI, which never holds a
    secret: the Tablestore backend (else it reads ``ALIBABA_CLOUD_*``). Other backends use their
    own credential chains and refuse them."""
    scheme = urlsplit(uri).scheme
    if scheme not in META_BACKENDS:
        raise MetaStoreUriError(
            uri=uri, reason=f"unsupported scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in sorted(META_BACKENDS)),
        )
    target, install_hint = META_BACKENDS[scheme]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MetaStoreUriError(
            uri=uri, reason=f"backend unavailable ({exc}); {install_hint}"
        ) from exc
    backend = getattr(module, class_name)
    if credentials:
        if scheme != "tablestore":
            raise MetaStoreUriError(
                uri=uri, reason=f"a {scheme}:// meta store takes no credentials from the source's "
                "options (it uses its own credential chain)")
        return backend.from_uri(uri, **credentials)
    return backend.from_uri(uri)


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
