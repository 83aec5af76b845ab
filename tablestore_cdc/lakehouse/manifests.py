"""An Iceberg manifest's entries read once per process, not three times a batch (driver).

In each of the Iceberg sink's row-changing batches pyiceberg reads the entries of every
manifest of the table's current snapshot three times: the batch's scan plan
(``iceberg._held_files``), the overwrite's search for the entries of the files it replaces, and
its rewrite of the manifests that held them (pyiceberg's ``_OverwriteFiles``). Each read opens
the Avro file and resolves its schema anew, about 2 ms a manifest: a quarter of a batch
(docs/performance.md). A manifest file is written once, under a name of its own, and never
changed, so its entries are the same at every read.

``reuse_entries(table)``, which ``IcebergApplySink`` calls before its scan plan, gives each
manifest of the table's current snapshot a reader that answers from one process-wide cache of
entries by manifest path, least recently used out first, bounded at ``MAX_CACHED_ENTRIES``
entries (about 2.5 KB each for a table of ten columns).

Why the answers are the ones pyiceberg would read (pyiceberg 0.12):

- the manifest objects are pyiceberg's own, shared in the process by path
  (``pyiceberg.manifest._manifest_cache``), so the reader set on one serves every later read of
  that manifest: the scan plan's, the overwrite's and the manifest merge's, all of which call
  ``ManifestFile.fetch_manifest_entry``;
- an entry inherits its manifest's sequence numbers when it is read: only manifests a committed
  snapshot lists get the reader, never one a commit has written and not yet numbered;
- nothing in pyiceberg changes an entry once read (a new snapshot's manifests are written from
  copies, ``ManifestEntry.from_args``), and each call gets a list of its own.

Without pyiceberg's manifest cache (its ``manifest-cache-size`` set to 0), or with a pyiceberg
whose manifests take no attribute, no entry is reused and every read is pyiceberg's own.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

#: the entries the process keeps, over every manifest and table: beyond it the least recently
#: used manifests' entries are dropped (and read again when asked for)
MAX_CACHED_ENTRIES = 50_000

_lock = threading.Lock()


@functools.cache
def _cache() -> Any:
    """The cache of entries by manifest path (``cachetools``, which pyiceberg brings), made at
    first use: a manifest weighs its number of entries."""
    from cachetools import LRUCache

    return LRUCache(maxsize=MAX_CACHED_ENTRIES, getsizeof=len)


def reuse_entries(table: Any) -> None:
    """Give every manifest of ``table``'s current snapshot (``pyiceberg.table.Table``) the
    reader that answers from the cache; manifests that already have it are left as they are."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        attributes = getattr(manifest, "__dict__", None)
        if attributes is not None and "fetch_manifest_entry" not in attributes:
            attributes["fetch_manifest_entry"] = functools.partial(_fetch, manifest)


def _fetch(manifest: Any, io: Any, discard_deleted: bool = True) -> list[Any]:
    """``ManifestFile.fetch_manifest_entry`` from the cache: every entry read once (the deleted
    ones too), the live ones picked at each call when ``discard_deleted``."""
    from pyiceberg.manifest import ManifestEntryStatus

    path = manifest.manifest_path
    with _lock:
        entries = _cache().get(path)
    if entries is None:
        entries = tuple(type(manifest).fetch_manifest_entry(manifest, io, discard_deleted=False))
        if len(entries) <= MAX_CACHED_ENTRIES:
            with _lock:
                _cache()[path] = entries
    if not discard_deleted:
        return list(entries)
    return [entry for entry in entries if entry.status != ManifestEntryStatus.DELETED]
