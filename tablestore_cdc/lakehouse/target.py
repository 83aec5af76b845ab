"""``--target`` URIs: which table a change stream is applied into (driver).

- ``delta:///abs/path/to/table``: a Delta table in a local directory (created on the first
  batch);
- ``iceberg:///abs/warehouse?table=NAMESPACE.TABLE``: an Iceberg table in pyiceberg's SQL catalog
  on the SQLite file ``<warehouse>/catalog.db``, its files under the warehouse directory;
  ``&catalog_db=/abs/other.db`` puts the catalog elsewhere. Namespace and table are created on
  the first batch.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from tablestore_cdc.lakehouse.errors import TargetUriError
from tablestore_cdc.lakehouse.sink import ApplySink

FORMS = "delta:///abs/path or iceberg:///abs/warehouse?table=namespace.table"


def open_apply_sink(uri: str, **options: Any) -> ApplySink:
    """The sink for ``uri`` with ``options`` (``key_columns``, ``scd``, ``schema_drift``,
    ``soft_delete_column``, ``app_id``, ``widen_to_string``, ``source``, ``adopt_target``,
    ``executor_write_rows``: ``sink.ApplySink``)."""
    parts = urlsplit(uri)
    if parts.netloc or not parts.path.startswith("/"):
        raise TargetUriError(uri=uri, problem="the path must be absolute (three slashes)",
                             allowed=FORMS)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if parts.scheme == "delta":
        if query:
            raise TargetUriError(uri=uri, problem=f"unknown parameter(s) {sorted(query)}",
                                 allowed=FORMS)
        from tablestore_cdc.lakehouse.delta import DeltaApplySink

        return DeltaApplySink(parts.path, **options)
    if parts.scheme == "iceberg":
        table = query.pop("table", "")
        catalog_db = query.pop("catalog_db", None)
        if query:
            raise TargetUriError(uri=uri, problem=f"unknown parameter(s) {sorted(query)}",
                                 allowed=FORMS + " (and &catalog_db=/abs/catalog.db)")
        if table.count(".") < 1 or not all(table.split(".")):
            raise TargetUriError(uri=uri, problem="table=NAMESPACE.TABLE is required",
                                 allowed=FORMS)
        from tablestore_cdc.lakehouse.iceberg import IcebergApplySink, sqlite_catalog_properties

        return IcebergApplySink(sqlite_catalog_properties(parts.path, catalog_db), table,
                                **options)
    raise TargetUriError(uri=uri, problem=f"unknown scheme {parts.scheme!r}", allowed=FORMS)
