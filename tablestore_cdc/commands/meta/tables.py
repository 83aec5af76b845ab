"""``tablestore-cdc meta tables``: every table the replication jobs of a meta store have
recorded (``TableStatus``, written by each job's driver: ``tablestore_cdc.table_status``), one
table per job: ``job`` (the output directory), ``selection`` (the ``--tables`` patterns, or
``--table``), ``state``, ``target`` (the URI the table is applied into, redacted of secrets:
what ``reconcile`` and ``resnapshot`` read) and the figures. Prints the ``table_status`` of the
feed's ``/api/sources`` document (``feed.snapshot.sources_summary``), as the dashboard and the
Prometheus metrics show it; ``meta show --namespace NS`` drills into one table.
"""

from __future__ import annotations

import time
from typing import Any

from tablestore_cdc.commands.meta import common
from tablestore_cdc.feed.snapshot import sources_summary


def tables(meta: common.MetaOpt, as_json: common.JsonOpt = False) -> None:
    """List every table replicated by the jobs of the meta store: state, lag in records and
    seconds, rows/s, last commit, target and its version, last schema change."""
    with common.inspected_store(meta) as store:
        rows = [{**s["table_status"], "namespace": s["namespace"]}
                for s in sources_summary(store)["sources"] if s["table_status"]]
        rows.sort(key=lambda r: (r["job"], r["table"]))
        if as_json:
            common.print_json({"meta_uri": store.uri, "tables": rows})
            return
        console = common.stdout_console()
        if not rows:
            console.print("no replication job has recorded its tables in this store "
                          "(replicate --table and --tables write them)")
            return
        now = time.time()
        for job in sorted({r["job"] for r in rows}):
            mine = [r for r in rows if r["job"] == job]
            table = common.compact_table(f"tables {mine[0]['selection']} -> {job}",
                                         "drill into one: meta show --namespace NAMESPACE")
            for col in ("table", "state", "lag records", "lag s", "rows/s", "last commit",
                        "target", "target version", "last schema change", "namespace"):
                table.add_column(col, overflow="fold", no_wrap=col == "namespace",
                                 justify="left" if col in ("table", "state", "target",
                                                           "namespace") else "right")
            for r in mine:
                state = r["label"] + (f" (not updated for {r['age_s']:.0f} s)"
                                      if r["stale"] else "")
                table.add_row(r["table"], state, _shown(r["records_behind"]),
                              _shown(r["seconds_behind"]), _shown(r["rows_per_second"]),
                              _age(r["last_commit"], now), _shown(r["target"]),
                              _shown(r["target_version"]),
                              _schema_change(r, now), r["namespace"])
            console.print(table)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _schema_change(row: dict[str, Any], now: float) -> str:
    """``batch 3: add column colour string (12 s ago, version 5)``, or ``-``."""
    change = row.get("last_schema_change")
    if change is None:
        return "-"
    return (f"{change} ({_age(row.get('last_schema_change_at'), now)}, version "
            f"{_shown(row.get('last_schema_change_version'))})")


def _age(at: float | None, now: float) -> str:
    return "-" if at is None else f"{max(0.0, now - at):.0f} s ago"
