"""The apply on Spark's own MERGE (``--engine spark``): a micro-batch of changes merged into a
Delta table by delta-spark or into an Iceberg table by Iceberg's ``SparkCatalog``.

The embedded sinks (``delta.py``, ``iceberg.py``) collect a batch to Arrow on the driver and
commit it there; this one never collects: the driver only plans one ``MERGE INTO`` statement
(plus, when needed, a ``CREATE TABLE`` or ``ALTER TABLE ... ADD COLUMNS``) and Spark's executors
rank the changes, join them with the table and rewrite its files. For tables or batches larger
than one driver holds.

Same rules as the embedded path (plan.py), row for row: each key's last change in the batch
wins, changes ordered by ``_sequence`` within a channel and a key's channels by the commit time
of their first change, then of their last, then by channel id; SCD type 1 with hard deletes or,
with ``soft_delete_column``, soft deletes (a deleted key keeps its last image of the batch,
flagged; with none in the batch only the flag is set); SCD type 2 (``_versions``: one MERGE
closes each touched key's open version and inserts the batch's versions). Values in
``_extra`` (attributes the reader's schema does not declare) are refused
(``SparkEngineError``) rather than dropped: this engine applies declared columns; a declared
column the table lacks is added (``ALTER TABLE ... ADD COLUMNS``).

Exactly once across replays, with the same records the embedded sinks write, so either engine
reads the other's: Delta, the ``txn`` action (session settings ``spark.databricks.delta.write.
txnAppId`` / ``txnVersion``: Delta skips a MERGE whose version it already holds); Iceberg, the
snapshot summary's ``tablestore-cdc.query-id`` / ``tablestore-cdc.batch-id`` (session settings
``spark.sql.iceberg.snapshot-property.*``), checked before the MERGE. The table carries the same
ownership marker (ownership.py) in its properties, checked before every batch.

``replicate --engine spark`` writes local Delta tables and the embedded sink's Iceberg tables
(``open_spark_merge_sink``, ``replicate_conf``). The jars: ``coordinate`` names the delta-spark
or Iceberg runtime released for the running Spark's minor (``PACKAGES``), ``session_conf`` the
settings a session needs, ``check_engine`` refuses a session whose jars are absent or built for
another Spark; ``python -m tablestore_cdc.lakehouse.spark_merge fetch`` resolves them once
(``make``'s jar step).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tablestore_cdc.lakehouse.changes import META_COLUMNS, NO_TIME
from tablestore_cdc.lakehouse.errors import ApplyOptionError, ChangeBatchError, LakehouseError
from tablestore_cdc.lakehouse.iceberg import BATCH_ID_PROPERTY as ICEBERG_BATCH_ID
from tablestore_cdc.lakehouse.iceberg import QUERY_ID_PROPERTY as ICEBERG_QUERY_ID
from tablestore_cdc.lakehouse.ownership import Marker, claim
from tablestore_cdc.lakehouse.plan import END_AT, START_AT, ApplyOptions, key_columns_of
from tablestore_cdc.lakehouse.sink import ApplyResult, query_id_of

DELTA, ICEBERG = "delta", "iceberg"
FORMATS = (DELTA, ICEBERG)
DELTA_TXN_APP = "spark.databricks.delta.write.txnAppId"
DELTA_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
ICEBERG_SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
#: the JDBC driver Iceberg's ``JdbcCatalog`` opens an ``iceberg:///WAREHOUSE`` catalog with
SQLITE_JDBC = "org.xerial:sqlite-jdbc:3.54.1.0"
#: the Spark catalog of ``iceberg:///WAREHOUSE?table=`` targets, named as the embedded sink's
#: pyiceberg SQL catalog: ``JdbcCatalog`` reads the rows (``catalog_name``) of its own name
ICEBERG_CATALOG = "tablestore_cdc"


@dataclass(frozen=True)
class Released:
    """The newest jars released for one Spark minor (None: none released)."""

    delta: str | None
    iceberg: str | None


#: per Spark minor, the newest delta-spark (``io.delta:delta-spark_2.13``) and Iceberg runtime
#: (``org.apache.iceberg:iceberg-spark-runtime-<minor>_2.13``) on Maven Central, read from their
#: metadata and poms (docs/lakehouse.md, "Spark's own MERGE")
PACKAGES: dict[tuple[int, int], Released] = {
    (4, 0): Released(delta="4.0.1", iceberg="1.11.0"),
    (4, 1): Released(delta="4.3.1", iceberg="1.12.0"),
    (4, 2): Released(delta="4.4.0", iceberg=None),
    (4, 3): Released(delta=None, iceberg=None),
}

#: column names Iceberg's Spark runtime reserves for metadata columns: a table with one of
#: them cannot be read by Spark ("Table column names conflict with names reserved")
ICEBERG_RESERVED = ("_file", "_pos", "_deleted", "_spec_id", "_partition", "_row_id",
                    "_last_updated_sequence_number")

EXTENSIONS = {DELTA: "io.delta.sql.DeltaSparkSessionExtension",
              ICEBERG: "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"}


class SparkEngineError(LakehouseError):
    """The Spark engine cannot run here: its jars are absent, built for another Spark, or the
    batch needs what this engine does not do."""

    template = "the Spark engine {problem}: {remedy}"


def _minor(spark_version: str) -> tuple[int, int]:
    major, minor = spark_version.split(".")[:2]
    return int(major), int(minor)


def coordinate(fmt: str, spark_version: str) -> str:
    """The Maven coordinate of ``fmt``'s jar for this Spark (``SparkEngineError``: none)."""
    if fmt not in FORMATS:
        raise ApplyOptionError(option="format", value=fmt, problem="unknown table format",
                               allowed="delta or iceberg")
    minor = _minor(spark_version)
    released = PACKAGES.get(minor, Released(None, None))
    version = getattr(released, fmt)
    if version is None:
        have = ", ".join(f"{a}.{b}" for (a, b), r in sorted(PACKAGES.items())
                         if getattr(r, fmt))
        raise SparkEngineError(
            problem=f"has no {fmt} jar released for Spark {minor[0]}.{minor[1]}",
            remedy=f"run it on a PySpark of {have}, or use --engine embedded")
    if fmt == DELTA:
        return f"io.delta:delta-spark_2.13:{version}"
    return f"org.apache.iceberg:iceberg-spark-runtime-{minor[0]}.{minor[1]}_2.13:{version}"


def session_conf(formats: Sequence[str], spark_version: str, *, warehouse: str | None = None,
                 catalog: str = "lake") -> dict[str, str]:
    """The Spark settings of a session that runs the Spark engine for ``formats`` (driver,
    before the session starts: the jars and extensions are fixed for the JVM's life). Iceberg
    tables live in catalog ``catalog``, a Hadoop catalog on ``warehouse``."""
    conf = {"spark.jars.packages": ",".join(coordinate(f, spark_version) for f in formats),
            "spark.sql.extensions": ",".join(EXTENSIONS[f] for f in formats)}
    if DELTA in formats:
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if ICEBERG in formats:
        conf[f"spark.sql.catalog.{catalog}"] = "org.apache.iceberg.spark.SparkCatalog"
        if warehouse is not None:
            conf[f"spark.sql.catalog.{catalog}.type"] = "hadoop"
            conf[f"spark.sql.catalog.{catalog}.warehouse"] = warehouse
    return conf


def check_engine(spark: Any, fmt: str) -> None:
    """Refuse a session that cannot run ``fmt``'s MERGE (driver, once, before the first batch):
    the extension's class is not loaded, or the jars named in ``spark.jars.packages`` are not
    the ones released for this Spark (they fail mid-MERGE with a ``NoSuchMethodError``)."""
    wanted = coordinate(fmt, spark.version)
    packages = spark.conf.get("spark.jars.packages", "") or ""
    group_artifact = wanted.rsplit(":", 1)[0].split("-runtime-")[0]
    named = [p for p in packages.split(",") if p.startswith(group_artifact)]
    if named and wanted not in named:
        raise SparkEngineError(problem=f"got {named[0]} on Spark {spark.version}",
                               remedy=f"it needs --packages {wanted}")
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName(EXTENSIONS[fmt], True, False)
    except Exception as exc:
        raise SparkEngineError(
            problem=f"needs {wanted} for Spark {spark.version} (class not found "
                    f"{EXTENSIONS[fmt]})", remedy=f"--packages {wanted}") from exc


def sqlite_catalog_conf(warehouse: str, catalog_db: str | None = None) -> dict[str, str]:
    """The Spark settings of catalog ``ICEBERG_CATALOG``: Iceberg's ``JdbcCatalog`` on the
    SQLite file the embedded sink's pyiceberg SQL catalog keeps (``iceberg.
    sqlite_catalog_properties``: ``<warehouse>/catalog.db`` unless ``catalog_db``), so both
    engines read and write the same tables of an ``iceberg:///WAREHOUSE?table=`` target.
    Schema version V1: Spark looks a missing table up as a view too, which the catalog's
    first schema refuses; V1 adds a column ``iceberg_type`` pyiceberg leaves alone."""
    db = catalog_db or f"{warehouse.rstrip('/')}/catalog.db"
    prefix = f"spark.sql.catalog.{ICEBERG_CATALOG}"
    return {prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            f"{prefix}.jdbc.schema-version": "V1",
            f"{prefix}.uri": f"jdbc:sqlite:{db}", f"{prefix}.warehouse": f"file://{warehouse}"}


class SparkMergeSink:
    """The ``foreachBatch`` function of the Spark engine (driver; the MERGE runs on the
    executors). ``target``: a Delta table's path or URI, or an Iceberg table as
    ``catalog.namespace.table`` in the session's ``SparkCatalog``. Options as the embedded
    sinks' (sink.py): ``key_columns``, ``scd`` (1), ``soft_delete_column``, ``app_id``,
    ``source``, ``adopt_target``; ``catalog_conf``: the Spark settings of the Iceberg
    table's catalog (``sqlite_catalog_conf``), set on each batch's session where it has none
    (a session holding other values for them is refused: one warehouse per session)."""

    def __init__(self, target: str, *, format: str = DELTA,
                 key_columns: Sequence[str] | None = None, scd: int = 1,
                 soft_delete_column: str | None = None, app_id: str | None = None,
                 source: str | None = None, adopt_target: bool = False,
                 catalog_conf: dict[str, str] | None = None) -> None:
        if format not in FORMATS:
            raise ApplyOptionError(option="format", value=format, problem="unknown format",
                                   allowed="delta or iceberg")
        # the embedded sinks' checks of scd and soft_delete_column (keys come with the batch)
        ApplyOptions(key_columns=tuple(key_columns or ("<key>",)), scd=scd,
                     soft_delete_column=soft_delete_column)
        if format == ICEBERG and soft_delete_column in ICEBERG_RESERVED:
            raise ApplyOptionError(option="soft_delete_column", value=soft_delete_column,
                                   problem="Iceberg's Spark runtime reserves the name for a "
                                   "metadata column (Spark could not read the table)",
                                   allowed="another name, e.g. is_deleted")
        self.target, self.format, self.scd = target, format, scd
        self.key_columns = tuple(key_columns) if key_columns else None
        self.soft_delete_column = soft_delete_column
        self.app_id, self.source, self.adopt_target = app_id, source or "", adopt_target
        self.catalog_conf = dict(catalog_conf or {})
        self.last_result: ApplyResult | None = None
        self._checked = False
        #: the session of the last batch (``committed_batch`` of an Iceberg table reads it)
        self._spark: Any = None
        #: set by ``start_pipeline`` like the embedded sinks'; this engine does no maintenance
        self.upkeep: Any = None

    def __str__(self) -> str:
        return self.target

    def __call__(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` function (driver)."""
        self.apply(df, self.app_id or query_id_of(df, batch_id), batch_id)

    # --- one batch ---------------------------------------------------------------------------

    def apply(self, df: Any, app_id: str, batch_id: int) -> ApplyResult:
        """Merge one batch (a Spark DataFrame of the source's change schema) exactly once."""
        spark = self._spark = df.sparkSession
        if not self._checked:
            check_engine(spark, self.format)
        self._use_catalog(spark)  # each batch: a restarted query's session is a new copy
        self._checked = True
        keys = self.key_columns or key_columns_of(df.schema)
        if not keys:
            raise ApplyOptionError(option="key_columns", value=None,
                                   problem="the batch's schema marks no key column",
                                   allowed="key_columns=[...] given to the sink")
        for name in (*keys, "_op", "_channel_id", "_sequence", "_commit_ts"):
            if name not in df.columns:
                raise ChangeBatchError(column=name)
        marker = Marker(self.source, app_id, keys)
        df = df.persist()
        try:
            if "_extra" in df.columns and df.where("_extra IS NOT NULL").limit(1).count():
                raise SparkEngineError(
                    problem=f"applies declared columns only, and batch {batch_id} carries "
                            "attributes in _extra", remedy="declare them in the reader's "
                            "schema, or use --engine embedded (schema drift)")
            values = [c for c in df.columns if c not in META_COLUMNS and c not in keys]
            exists = self._prepare(spark, df, keys, values, marker)
            if exists:
                recorded = self.committed_batch(app_id, spark)
                if recorded is not None and recorded >= batch_id:
                    result = ApplyResult(batch_id=batch_id, committed=False,
                                         version=self._version(spark))
                    self.last_result = result
                    return result
            before = self._version(spark)
            if self.scd == 2:
                if df.where("_commit_ts IS NULL").limit(1).count():
                    raise ChangeBatchError(column="_commit_ts (null: SCD type 2 needs it)")
                self._merge(spark, _versions(df, keys, values), keys, values, app_id, batch_id)
            else:
                self._merge(spark, _last_changes(df, keys, values, self.soft_delete_column),
                            keys, values, app_id, batch_id)
            after = self._version(spark)
            result = ApplyResult(batch_id=batch_id, committed=after != before,
                                 changes=df.count(), version=after)
        finally:
            df.unpersist()
        self.last_result = result
        return result

    def _use_catalog(self, spark: Any) -> None:
        """The Iceberg catalog's settings on the batch's session (``catalog_conf``; driver)."""
        for key, value in self.catalog_conf.items():
            have = spark.conf.get(key, None)
            if have is None:
                spark.conf.set(key, value)
            elif have != value:
                raise SparkEngineError(
                    problem=f"writes one Iceberg warehouse per session, and {key} is {have} "
                            f"(not {value}, for {self.target})",
                    remedy="give the job's Iceberg targets one iceberg:///WAREHOUSE")
        if self.catalog_conf and not self._checked:
            uri = self.catalog_conf[f"spark.sql.catalog.{ICEBERG_CATALOG}.uri"]
            # the SQLite file's directory (the embedded sink makes it too)
            os.makedirs(os.path.dirname(uri.removeprefix("jdbc:sqlite:")), exist_ok=True)
            try:  # else Iceberg fails in the MERGE: "No suitable driver found"
                spark._jvm.org.apache.spark.util.Utils.classForName("org.sqlite.JDBC", True,
                                                                    False)
            except Exception as exc:
                raise SparkEngineError(problem=f"needs {SQLITE_JDBC} for {self.target} "
                                       "(class not found org.sqlite.JDBC)",
                                       remedy=f"--packages {SQLITE_JDBC}") from exc

    def _table_sql(self) -> str:
        if self.format == DELTA:
            return f"delta.`{self.target}`"
        return ".".join(_quote(p) for p in self.target.split("."))

    def _prepare(self, spark: Any, df: Any, keys: Sequence[str], values: Sequence[str],
                 marker: Marker) -> bool:
        """Create the table with the marker, or check whose it is and add the batch's declared
        columns it lacks (driver). True when the table existed."""
        properties = self.target_properties(spark)
        types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        flag = [self.soft_delete_column] if self.soft_delete_column else []
        props = ", ".join(f"'{k}' = '{_literal(v)}'" for k, v in marker.properties().items())
        if properties is None:
            columns = [f"{_quote(k)} {types[k]} NOT NULL" for k in keys]
            columns += [f"{_quote(v)} {types[v]}" for v in values]
            columns += [f"{_quote(c)} boolean" for c in flag]
            if self.scd == 2:
                columns += [f"{_quote(START_AT)} timestamp", f"{_quote(END_AT)} timestamp"]
            using = "delta" if self.format == DELTA else "iceberg"
            namespace = self.target.split(".")[:-1]
            if self.format == ICEBERG and len(namespace) > 1:  # catalog.namespace: made once
                spark.sql("CREATE NAMESPACE IF NOT EXISTS "
                          + ".".join(_quote(p) for p in namespace))
            spark.sql(f"CREATE TABLE IF NOT EXISTS {self._table_sql()} ({', '.join(columns)}) "
                      f"USING {using} TBLPROPERTIES ({props})")
            return False
        written = self.committed_batch(marker.job, spark) is not None
        import pyarrow as pa

        if claim(self.target, properties, pa.schema([]), pa.schema([]), marker,
                 self.adopt_target, written):
            spark.sql(f"ALTER TABLE {self._table_sql()} SET TBLPROPERTIES ({props})")
        have = set(spark.table(self._table_sql()).columns)
        missing = [c for c in (*values, *flag) if c not in have]
        if missing:
            added = ", ".join(f"{_quote(c)} {types.get(c, 'boolean')}" for c in missing)
            spark.sql(f"ALTER TABLE {self._table_sql()} ADD COLUMNS ({added})")
        return True

    def _merge(self, spark: Any, source: Any, keys: Sequence[str], values: Sequence[str],
               app_id: str, batch_id: int) -> None:
        """One MERGE INTO with this batch's exactly-once record (driver plans, executors run)."""
        view = f"tablestore_cdc_changes_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        flag = self.soft_delete_column
        columns = [*keys, *values, *([flag] if flag else [])]
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in keys)
        if self.scd == 2:
            statement = _scd2_statement(self._table_sql(), view, keys, values)
        else:
            statement = self._scd1_statement(view, on, columns, values)
        self._run(spark, statement, view, app_id, batch_id)

    def _scd1_statement(self, view: str, on: str, columns: Sequence[str],
                        values: Sequence[str]) -> str:
        flag = self.soft_delete_column
        update = ", ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in (*values,
                                                                       *([flag] if flag else [])))
        inserted = ", ".join(_quote(c) for c in columns)
        inserted_values = ", ".join(f"s.{_quote(c)}" for c in columns)
        clauses = ["WHEN MATCHED AND s.__action = 'delete' THEN DELETE"]
        if flag:
            clauses.append(f"WHEN MATCHED AND s.__action = 'flag' THEN UPDATE SET "
                           f"t.{_quote(flag)} = true")
        if update:
            clauses.append(f"WHEN MATCHED AND s.__action = 'upsert' THEN UPDATE SET {update}")
        clauses.append(f"WHEN NOT MATCHED AND s.__action = 'upsert' THEN INSERT ({inserted}) "
                       f"VALUES ({inserted_values})")
        return f"MERGE INTO {self._table_sql()} t USING {view} s ON {on} " + " ".join(clauses)

    def _run(self, spark: Any, statement: str, view: str, app_id: str, batch_id: int) -> None:
        """The MERGE with this batch's exactly-once record in the session's settings."""
        settings = ({DELTA_TXN_APP: app_id, DELTA_TXN_VERSION: str(batch_id)}
                    if self.format == DELTA else
                    {ICEBERG_SNAPSHOT_PROPERTY + ICEBERG_QUERY_ID: app_id,
                     ICEBERG_SNAPSHOT_PROPERTY + ICEBERG_BATCH_ID: str(batch_id)})
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            spark.sql(statement)
        finally:  # the settings stay on the session: cleared before any other write
            for key in settings:
                spark.conf.unset(key)
            spark.catalog.dropTempView(view)

    # --- what the table records ----------------------------------------------------------------

    def target_properties(self, spark: Any) -> dict[str, str] | None:
        """The table's properties (None: no table yet)."""
        if self.format == DELTA:
            from delta.tables import DeltaTable

            if not DeltaTable.isDeltaTable(spark, self.target):
                return None
            detail = DeltaTable.forPath(spark, self.target).detail().collect()[0]
            return dict(detail["properties"] or {})
        if not spark.catalog.tableExists(self.target):
            return None
        rows = spark.sql(f"SHOW TBLPROPERTIES {self._table_sql()}").collect()
        return {r["key"]: r["value"] for r in rows}

    def committed_batch(self, app_id: str, spark: Any = None) -> int | None:
        """The highest batch id of ``app_id`` the table records (None: none; the Delta table
        is read by delta-rs, the Iceberg one through ``spark`` or the last batch's session)."""
        if self.format == DELTA:
            import deltalake

            try:
                return deltalake.DeltaTable(self.target).transaction_version(app_id)
            except deltalake.exceptions.TableNotFoundError:
                return None
        spark = spark or self._spark
        if spark is None or not spark.catalog.tableExists(self.target):
            return None
        rows = spark.sql(
            f"SELECT max(cast(summary['{ICEBERG_BATCH_ID}'] AS bigint)) AS b FROM "
            f"{self._table_sql()}.snapshots WHERE summary['{ICEBERG_QUERY_ID}'] = "
            f"'{_literal(app_id)}'").collect()
        value = rows[0]["b"]
        return None if value is None else int(value)

    def _version(self, spark: Any) -> int | None:
        """The Delta version or Iceberg snapshot id the table is at."""
        if self.format == DELTA:
            import deltalake

            return int(deltalake.DeltaTable(self.target).version())
        rows = spark.sql(f"SELECT snapshot_id FROM {self._table_sql()}.snapshots ORDER BY "
                         "committed_at DESC LIMIT 1").collect()
        return int(rows[0]["snapshot_id"]) if rows else None


def open_spark_merge_sink(uri: str, **options: Any) -> SparkMergeSink:
    """The Spark engine's sink for a ``replicate --target`` (driver): a local Delta table,
    ``delta:///abs/path``, or an Iceberg table of the embedded SQLite catalog,
    ``iceberg:///abs/warehouse?table=NAMESPACE.TABLE[&catalog_db=/abs/catalog.db]`` (the
    embedded sink's form and table, through ``sqlite_catalog_conf``); ``TargetUriError`` for
    another form. Opened by ``replicate_conf`` before Spark starts, to check the form (a
    selection's template included), and by ``pipeline.multi_table.MultiTableApply`` for each
    table at its first batch. ``options``: ``SparkMergeSink``'s."""
    from urllib.parse import parse_qs, urlsplit

    from tablestore_cdc.lakehouse.errors import TargetUriError

    parts = urlsplit(uri)
    local = not parts.netloc and parts.path.startswith("/")
    if parts.scheme == "delta" and local and not parts.query:
        return SparkMergeSink(parts.path, format=DELTA, **options)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    table, catalog_db = query.pop("table", ""), query.pop("catalog_db", None)
    names = table.split(".")
    # one warehouse for every table of a template (replicate_conf checks one per job)
    if (parts.scheme == "iceberg" and local and not query and len(names) > 1 and all(names)
            and "{table}" not in parts.path + (catalog_db or "")
            and (catalog_db is None or catalog_db.startswith("/"))):
        return SparkMergeSink(f"{ICEBERG_CATALOG}.{table}", format=ICEBERG,
                              catalog_conf=sqlite_catalog_conf(parts.path, catalog_db),
                              **options)
    raise TargetUriError(uri=uri, problem="the Spark engine of replicate writes a local "
                         "Delta table or an Iceberg table of the embedded SQLite catalog",
                         allowed="delta:///abs/path or iceberg:///abs/warehouse?table="
                         "NAMESPACE.TABLE (--tables: delta:///abs/path/{table}, table=NS."
                         "{table}) with --engine spark")


def replicate_conf(uris: str | Sequence[str], spark_version: str | None = None
                   ) -> dict[str, str]:
    """The settings ``replicate --engine spark`` starts its session with (driver, before
    Spark starts): the jars of the formats its targets need (and the SQLite JDBC driver and
    catalog ``ICEBERG_CATALOG`` for Iceberg ones). ``SparkEngineError`` in one line when the
    installed PySpark (or ``spark_version``) has no jar of a needed format released, or the
    Iceberg targets name more than one warehouse; ``TargetUriError`` for a target this engine
    does not write. ``uris``: the job's target or a selection's template (``delta:///abs/
    lake/{table}``), and each target a table's own settings give (``replicate --config``)."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    sinks = [open_spark_merge_sink(uri, key_columns=["<key>"])
             for uri in ([uris] if isinstance(uris, str) else uris)]
    formats = [f for f in FORMATS if any(s.format == f for s in sinks)]
    catalogs = sorted({tuple(sorted(s.catalog_conf.items())) for s in sinks if s.catalog_conf})
    if len(catalogs) > 1:
        warehouses = ", ".join(dict(c)[f"spark.sql.catalog.{ICEBERG_CATALOG}.warehouse"]
                               for c in catalogs)
        raise SparkEngineError(problem=f"writes one Iceberg warehouse per job, and the "
                               f"targets name {len(catalogs)} ({warehouses})",
                               remedy="give the Iceberg targets one iceberg:///WAREHOUSE "
                               "(and catalog_db), or use --engine embedded")
    conf = session_conf(formats, spark_version, catalog=ICEBERG_CATALOG)
    if catalogs:
        conf["spark.jars.packages"] += "," + SQLITE_JDBC
        conf.update(dict(catalogs[0]))
    return conf


def _channel_times(df: Any, keys: Sequence[str]) -> Any:
    """``df`` with ``__first`` and ``__last``: the commit times of the first and last change
    of each key's channel (the order of a key's channels, plan.py)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ts = F.coalesce(F.unix_micros(F.col("_commit_ts")), F.lit(NO_TIME))
    per_channel = Window.partitionBy(*keys, "_channel_id")
    return (df.withColumn("__ts", ts)
            .withColumn("__first", F.min_by("__ts", "_sequence").over(per_channel))
            .withColumn("__last", F.max_by("__ts", "_sequence").over(per_channel)))


def _last_changes(df: Any, keys: Sequence[str], values: Sequence[str],
                  flag: str | None) -> Any:
    """Each key's last change of the batch as one source row of the MERGE, with ``__action``:
    ``upsert`` (its image; soft deletes: a deleted key's last image, flagged), ``delete``, or
    ``flag`` (soft delete of a key with no image in the batch). Spark, on the executors."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ranked = _channel_times(df, keys)
    order = F.struct("__first", "__last", "_channel_id", "_sequence")
    per_key = Window.partitionBy(*keys)
    live = F.col("_op") != "DELETE"
    ranked = ranked.withColumn("__order", order).withColumn(
        "__final", F.max("__order").over(per_key))
    if flag:
        image = F.struct(*[F.col(v).alias(v) for v in values]) if values else F.lit(True)
        ranked = ranked.withColumn("__image", F.max_by(
            F.when(live, image), F.when(live, F.col("__order"))).over(per_key))
    last = ranked.where(F.col("__order") == F.col("__final"))
    if not flag:
        action = F.when(live, "upsert").otherwise("delete")
        return last.select(*keys, *values, action.alias("__action"))
    has_image = F.col("__image").isNotNull()
    chosen = [F.when(live, F.col(v)).otherwise(F.col("__image")[v]).alias(v) for v in values]
    action = (F.when(live, "upsert").when(has_image, "upsert").otherwise("flag"))
    return last.select(*keys, *chosen, (~live).alias(flag), action.alias("__action"))


def _versions(df: Any, keys: Sequence[str], values: Sequence[str]) -> Any:
    """SCD type 2 (plan.reduce_scd2): the MERGE's source rows: each key's close row (its
    ``__merge`` flag true, ``__close_at`` the commit time of its first change here, which ends
    the table's open version) and every change that is not a DELETE as a new version, valid
    from its commit time to the next change's (null for the key's last). Spark, on the
    executors."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ordered = Window.partitionBy(*keys).orderBy("__first", "__last", "_channel_id", "_sequence")
    rows = (_channel_times(df, keys)
            .withColumn("__rank", F.row_number().over(ordered))
            .withColumn("__next", F.lead("_commit_ts").over(ordered)))
    versions = rows.where(F.col("_op") != "DELETE").select(
        *keys, *values, F.col("_commit_ts").alias(START_AT), F.col("__next").alias(END_AT),
        F.lit(False).alias("__merge"), F.lit(None).cast("timestamp").alias("__close_at"))
    closes = rows.where(F.col("__rank") == 1).select(
        *keys, *[F.lit(None).cast(df.schema[v].dataType).alias(v) for v in values],
        F.lit(None).cast("timestamp").alias(START_AT), F.lit(None).cast("timestamp").alias(END_AT),
        F.lit(True).alias("__merge"), F.col("_commit_ts").alias("__close_at"))
    return closes.unionByName(versions)


def _scd2_statement(table: str, view: str, keys: Sequence[str], values: Sequence[str]) -> str:
    """Close rows match the key's open version and end it; versions never match (the
    ``__merge`` flag is false) and are inserted."""
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in keys)
    columns = [*keys, *values, START_AT, END_AT]
    return (f"MERGE INTO {table} t USING {view} s ON s.__merge AND {on} AND "
            f"t.{_quote(END_AT)} IS NULL "
            f"WHEN MATCHED THEN UPDATE SET t.{_quote(END_AT)} = s.__close_at "
            f"WHEN NOT MATCHED AND NOT s.__merge THEN INSERT "
            f"({', '.join(_quote(c) for c in columns)}) "
            f"VALUES ({', '.join('s.' + _quote(c) for c in columns)})")


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def fetch(formats: Sequence[str] = FORMATS) -> None:
    """Resolve the jars of ``formats`` for the installed PySpark into Spark's Ivy cache (a local
    session started and stopped; the jars are downloaded on the first run only; Iceberg's
    with the SQLite JDBC driver, ``SQLITE_JDBC``). A format with
    no jar released for this Spark is named and left out."""
    import pyspark
    from pyspark.sql import SparkSession

    available = []
    for fmt in formats:
        try:
            coordinate(fmt, pyspark.__version__)
            available.append(fmt)
        except SparkEngineError as exc:
            print(f"skipped: {exc}", file=sys.stderr)
    if not available:
        return
    conf = session_conf(available, pyspark.__version__)
    if ICEBERG in available:  # replicate's iceberg:/// targets open their catalog with it
        conf["spark.jars.packages"] += "," + SQLITE_JDBC
    spark = (SparkSession.builder.master("local[1]")
             .config(map={"spark.ui.enabled": "false", **conf}).getOrCreate())
    try:
        for fmt in available:
            check_engine(spark, fmt)
            print(f"{fmt}: {coordinate(fmt, spark.version)} on Spark {spark.version}")
    finally:
        spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["fetch"]:
        sys.exit("usage: python -m tablestore_cdc.lakehouse.spark_merge fetch [delta|iceberg...]")
    try:
        fetch(sys.argv[2:] or FORMATS)
    except LakehouseError as exc:
        sys.exit(f"error: {exc}")
