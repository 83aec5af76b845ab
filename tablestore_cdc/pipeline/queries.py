"""What the queries ``multi_table.start_pipeline`` starts share (driver): the apply settings, a
table's apply sink and re-snapshot target, the checkpoint's query id, the progress listener.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc_common.errors import CdcError
from tablestore_cdc.lakehouse.upkeep import MaintenancePolicy, Upkeep
from tablestore_cdc.reconcile.source import SourceSpec
from tablestore_cdc.resnapshot.hook import RepairTarget


@dataclass(frozen=True)
class ApplySettings:
    """Where and how the second query applies the changes (``--target``, ``--scd``, ...)."""

    target: str
    scd: int = 1
    schema_drift: str = "lenient"
    soft_delete_column: str | None = None
    adopt_target: bool = False
    #: ``--target-option KEY=VALUE`` pairs: delta-rs storage options or Iceberg catalog
    #: properties (``tablestore_cdc.lakehouse.target``)
    target_options: tuple[tuple[str, str], ...] = ()
    #: the job's own maintenance of its targets between batches (``lakehouse.upkeep``;
    #: ``replicate --maintenance off``: ``MaintenancePolicy.off()``)
    maintenance: MaintenancePolicy = field(default_factory=MaintenancePolicy)
    #: ``replicate --engine``: embedded (the sinks of ``lakehouse.delta``/``iceberg``, on the
    #: driver) or spark (``lakehouse.spark_merge``: Spark's own MERGE, on the executors)
    engine: str = "embedded"

    def upkeep(self) -> Upkeep | None:
        """A target's maintenance schedule (one per table), None when it is off."""
        return Upkeep(self.maintenance) if self.maintenance.enabled else None


def open_table_sink(apply: ApplySettings, table: str, source: str,
                    key_columns: tuple[str, ...] | None = None, opener: Any = None) -> Any:
    """``table``'s embedded apply sink as ``apply`` says (``lakehouse.open_apply_sink``, or a
    test's ``opener``), for the apply (``MultiTableApply.sink``) and the checks before the
    start (``preflight``); driver. ``source``: the endpoint as shown, the target's marker
    names ``<source>#<table>``. Opens nothing yet."""
    from tablestore_cdc.lakehouse import open_apply_sink

    return (opener or open_apply_sink)(
        apply.target.replace("{table}", table), key_columns=key_columns, scd=apply.scd,
        schema_drift=apply.schema_drift, soft_delete_column=apply.soft_delete_column,
        source=f"{source}#{table}", adopt_target=apply.adopt_target,
        target_options=dict(apply.target_options))


def repair_target(sink: Any, spec: SourceSpec, apply: ApplySettings,
                  key_columns: tuple[str, ...] | None = None) -> RepairTarget:
    """Where a table's re-snapshot reads (``spec``) and writes: its apply ``sink``, opened with
    ``apply`` (the table's target, soft delete column, ``--target-option``s), its target's
    ``key_columns`` when overridden."""
    return RepairTarget(spec, sink, apply.target.replace("{table}", spec.table),
                        apply.soft_delete_column, dict(apply.target_options), key_columns)


#: ``replicate --cycle``: ``two``, a change-log query then an apply query reading its files
#: back; ``one``, one query whose batch writes the change log and applies it
CYCLES = ("one", "two")
#: each cycle's checkpoints under ``_checkpoints/``: the query whose batches the targets
#: record, and the query that reads the source
APPLY_CHECKPOINT = {"one": "replicate", "two": "apply"}
SOURCE_CHECKPOINT = {"one": "replicate", "two": "changelog"}


class CycleMismatchError(CdcError):
    """``--cycle`` names another pipeline than the one the output's checkpoints hold."""

    exit_code = 2
    template = ("{output} holds the checkpoints of the {recorded}-cycle pipeline, so it "
                "cannot go on with --cycle {given}: leave --cycle out (or give "
                "--cycle {recorded}) to resume it, or start a new --output")


def recorded_cycle(output: Any) -> str | None:
    """The cycle whose checkpoints ``output`` (a ``JobOutput`` or a local path) holds, None
    for a new output (driver, before the queries start)."""
    from tablestore_cdc.pipeline.output import JobOutput

    out = JobOutput.of(output)
    for cycle in CYCLES:
        if out.read_bytes("_checkpoints", SOURCE_CHECKPOINT[cycle], "metadata") is not None:
            return cycle
    return None


def choose_cycle(output: Any, given: str | None) -> str:
    """The cycle a job of ``output`` runs: the one its checkpoints hold (an output written
    before ``--cycle`` existed holds the two-cycle ones), else ``given``, else ``one``;
    ``CycleMismatchError`` when ``given`` is not the one recorded."""
    recorded = recorded_cycle(output)
    if given is not None and recorded is not None and given != recorded:
        raise CycleMismatchError(output=str(output), recorded=recorded, given=given)
    return recorded or given or "one"


def checkpoint_query_id(output: Any) -> str | None:
    """The id of the query whose batches the targets record (the apply query, or the
    one-cycle query), which Spark keeps in its checkpoint (``_checkpoints/<query>/
    metadata``) under ``output`` (a ``JobOutput`` or a local path), or None."""
    from tablestore_cdc.pipeline.output import JobOutput

    out = JobOutput.of(output)
    for name in APPLY_CHECKPOINT.values():
        try:
            data = out.read_bytes("_checkpoints", name, "metadata")
            if data is not None:
                return str(json.loads(data.decode().splitlines()[0])["id"])
        except (OSError, ValueError, KeyError, IndexError):
            return None
    return None


def attach_listener(spark: Any, source: Any) -> Any:
    """A ``ProgressListener`` on ``spark`` (driver, by ``multi_table.start_pipeline``), so the
    dashboard, ``meta show`` and ``progress`` know Spark's batch ids and rates and see the
    query stop: ``source`` is the selection's ``MultiTableOptions``; each selected table's
    namespace is recorded as ``for_table`` names it (a table created later included)."""
    from tablestore_cdc.listener import ProgressListener

    options = source.common_options()  # the tables share one meta store
    listener = ProgressListener(options.meta_store, namespaces=_selected_namespaces(source),
                                credentials=options.meta_store_credentials)
    spark.streams.addListener(listener)
    return listener


def _selected_namespaces(source: Any) -> Callable[[str, str | None], bool]:
    """Whether a (namespace, table) of a multi-table query's progress is one of ``source``'s
    (a ``MultiTableOptions``): a table it selects, in the namespace its own options name
    (or their legacy form). Runs on the listener's thread; each table's answer is kept."""
    known: dict[str, frozenset[str]] = {}

    def accepts(namespace: str, table: str | None) -> bool:
        if table is None:
            return False
        if table not in known:
            try:
                own = source.for_table(table) if source.selection.matches(table) else None
            except CdcError:  # (its options do not parse: no query of it reports)
                own = None
            known[table] = (frozenset() if own is None
                            else frozenset({own.source_identity, own.legacy_namespace}))
        return namespace in known[table]

    return accepts
