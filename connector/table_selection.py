"""Which tables a multi-table query reads and with which options (driver, at ``load()``).

``option("tables", "orders_*")`` with ``exclude`` selects tables by ``fnmatch`` globs
(``TableSelection``); ``MultiTableOptions`` validates every option of such a query once, on the
driver when ``load()`` is called, and builds each table's own ``SourceOptions`` (the shared
options, and over them the ones ``tables.options`` sets for that table). The query itself is
``connector.multiplex``; docs/multi-table.md and docs/options.md describe the options.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

from cdc_common.backoff import RestartPolicy, parse_backoff
from connector import spark_compat as compat
from connector.errors import OptionError
from connector.options import SourceOptions

#: the options of a multi-table query, beside the single-table ones (docs/multi-table.md)
TABLES, EXCLUDE, REFRESH = "tables", "exclude", "tables.refreshIntervalMs"
TABLE_OPTIONS = "tables.options"
MAX_PARTITIONS = "tables.maxPartitions"
#: a table failing with a retryable error is tried again on this backoff, this many times in a
#: row (``cdc_common.backoff``; unset: forever)
RETRY_BACKOFF, MAX_RETRIES = "tables.retryBackoff", "tables.maxRetries"
MULTI_OPTIONS = (TABLES, EXCLUDE, REFRESH, TABLE_OPTIONS, MAX_PARTITIONS, RETRY_BACKOFF,
                 MAX_RETRIES)
#: the options ``tables.options`` may set for one table: how its rows are read (and its
#: attribute columns' types, ``catalog``), and its read limits (a trigger's and a channel's)
PER_TABLE_OPTIONS = ("schema.change.behavior", "snapshot.op", "maxOffsetsPerTrigger",
                     "maxBytesPerTrigger", "maxOffsetsPerChannel", "catalog")
_PER_TABLE_NAMES = frozenset(o.lower() for o in PER_TABLE_OPTIONS)
_PER_TABLE_ALLOWED = ("a JSON object {table: {option: value}} of the options "
                      + ", ".join(PER_TABLE_OPTIONS)
                      + ', e.g. {"orders": {"schema.change.behavior": "exception"}}')
DEFAULT_REFRESH_MS = 10_000


def is_multi_table(options: Mapping[str, str]) -> bool:
    """Does Spark's option map select tables with ``tables`` (any key case)?"""
    return any(key.lower() == TABLES for key in options)


@dataclass(frozen=True)
class TableSelection:
    """Which tables a query reads: names matching one of ``include``'s globs and none of
    ``exclude``'s (``fnmatch`` globs, case-sensitive, on whole table names)."""

    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, tables: str, exclude: str | None = None) -> TableSelection:
        """From the comma-separated option values; ``OptionError`` on an empty pattern."""
        return cls(_patterns(TABLES, tables), _patterns(EXCLUDE, exclude) if exclude else ())

    def matches(self, name: str) -> bool:
        return (any(fnmatchcase(name, p) for p in self.include)
                and not any(fnmatchcase(name, p) for p in self.exclude))

    def select(self, names: Sequence[str]) -> list[str]:
        return sorted(n for n in names if self.matches(n))


def _patterns(option: str, value: str) -> tuple[str, ...]:
    patterns = tuple(p.strip() for p in value.split(","))
    if not value.strip() or any(not p for p in patterns):
        raise OptionError(option=option, value=value, problem="holds an empty pattern",
                          allowed="comma-separated table names or globs, e.g. orders_*,users")
    return patterns


@dataclass(frozen=True)
class MultiTableOptions:
    """The validated options of a multi-table query (driver, at ``load()``): the selection, how
    often tables are listed again, every other option, which applies to each table alike, and
    the options of ``tables.options`` for the tables it names (``for_table`` builds one
    table's ``SourceOptions``)."""

    selection: TableSelection
    refresh_s: float
    #: Spark's options without the multi-table ones: each table's query options but its name
    shared: tuple[tuple[str, str], ...]
    #: table -> its own options (``tables.options``), over ``shared``
    per_table: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    #: the query's own meta table when it is in the instance the tables are listed from
    #: (``own_meta_table``): never selected
    meta_table: str | None = None
    #: the most Spark partitions a batch is read in (``tables.maxPartitions``; ``deal``)
    max_partitions: int = dataclasses.field(default_factory=lambda: default_max_partitions())
    #: when a table failing with a retryable error is tried again (``tables.retryBackoff``,
    #: ``tables.maxRetries``)
    retry: RestartPolicy = RestartPolicy()

    @classmethod
    def from_spark(cls, options: Mapping[str, str]) -> MultiTableOptions:
        by_lower = {k.lower(): (k, v) for k, v in options.items()}
        if "table.name" in by_lower:
            raise OptionError(option="table.name", value=by_lower["table.name"][1],
                              problem=f"cannot be given with '{TABLES}'",
                              allowed="either table.name (one table) or tables (a selection)")
        refresh = by_lower.get(REFRESH.lower(), (REFRESH, str(DEFAULT_REFRESH_MS)))[1]
        if not refresh.strip().isdigit():
            raise OptionError(option=REFRESH, value=refresh, problem="is not an integer",
                              allowed="an integer >= 0 (milliseconds)")
        excluded = by_lower.get(EXCLUDE, (EXCLUDE, None))[1]
        per_table = by_lower.get(TABLE_OPTIONS.lower())
        max_partitions = by_lower.get(MAX_PARTITIONS.lower())
        retry = _retry_policy(by_lower.get(RETRY_BACKOFF.lower(), (None, None))[1],
                              by_lower.get(MAX_RETRIES.lower(), (None, None))[1])
        built = cls(TableSelection.parse(by_lower[TABLES][1], excluded),
                    int(refresh) / 1000.0,
                    tuple(sorted((k, v) for k, v in options.items()
                                 if k.lower() not in {o.lower() for o in MULTI_OPTIONS})),
                    _per_table_options(per_table[1]) if per_table else (),
                    max_partitions=(_positive(MAX_PARTITIONS, max_partitions[1])
                                    if max_partitions else default_max_partitions()),
                    retry=retry)
        # every other option is checked now, at load()
        meta_table = own_meta_table(built.common_options())
        for table, _ in built.per_table:
            built.for_table(table)  # and each table's own
        return dataclasses.replace(built, meta_table=meta_table)

    def own_options(self, table: str) -> dict[str, str]:
        """The options ``tables.options`` sets for ``table`` (names lower-cased)."""
        return dict(dict(self.per_table).get(table, ()))

    def default_read_limit(self) -> Any:
        """``getDefaultReadLimit``'s answer: the first limit configured, the shared options'
        first, then each table's own, so that Spark passes ``ReadAllAvailable`` only when no
        table has a limit (or for Trigger.Once)."""
        first = compat.default_read_limit(self.common_options())
        for table, _ in self.per_table:
            if not compat.passed_limit(first).all_available:
                break
            first = compat.default_read_limit(self.for_table(table))
        return first

    def common_options(self) -> SourceOptions:
        """The options every table shares (endpoint, meta store, credentials, the shared read
        options), as a table without options of its own in ``tables.options`` gets them: what
        the query, its planner and its listener use where no one table is meant."""
        return self.for_table("placeholder")

    def for_table(self, table: str) -> SourceOptions:
        """One table's options (``OptionError`` as a single-table query would raise it)."""
        own = self.own_options(table)
        shared = {k: v for k, v in self.shared if k.lower() not in own}
        return SourceOptions.from_spark({**shared, **own, "table.name": table})


def _positive(option: str, value: str, minimum: int = 1) -> int:
    """An integer >= ``minimum``, parsed as leniently as every other integer option
    (docs/options.md: ``" 7 "``, ``"1_000"``, ``"5.0"``); ``OptionError`` naming ``option``
    otherwise."""
    from pydantic import Field, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(Annotated[int, Field(ge=minimum)]).validate_python(value))
    except ValidationError:
        raise OptionError(option=option, value=value, problem=f"is not an integer >= {minimum}",
                          allowed=f"an integer >= {minimum}, e.g. 8") from None


def _retry_policy(backoff: str | None, max_retries: str | None) -> RestartPolicy:
    """``tables.retryBackoff`` (``FIRST[:MAX]`` seconds) and ``tables.maxRetries`` (an
    integer >= 0; unset: forever) as a policy; ``OptionError`` naming the option."""
    first, cap = RestartPolicy().first_s, RestartPolicy().max_s
    if backoff is not None:
        try:
            first, cap = parse_backoff(backoff)
        except ValueError:
            raise OptionError(option=RETRY_BACKOFF, value=backoff,
                              problem="is not FIRST[:MAX] seconds with 0 < FIRST <= MAX",
                              allowed="e.g. 1:60 (the default), 5, 0.5:30") from None
    limit = None if max_retries is None else _positive(MAX_RETRIES, max_retries, minimum=0)
    return RestartPolicy(first, cap, limit)


def _per_table_options(value: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """``tables.options`` parsed: table -> its options (names lower-cased), sorted;
    ``OptionError`` naming ``tables.options`` for anything but an object of objects of
    strings of ``PER_TABLE_OPTIONS``."""
    def refuse(problem: str) -> OptionError:
        return OptionError(option=TABLE_OPTIONS, value=value, problem=problem,
                           allowed=_PER_TABLE_ALLOWED)

    try:
        parsed = json.loads(value)
    except ValueError:
        raise refuse("is not JSON") from None
    if not isinstance(parsed, dict):
        raise refuse("is not a JSON object")
    tables = []
    for table, options in sorted(parsed.items()):
        if not isinstance(options, dict) or not all(isinstance(v, str)
                                                    for v in options.values()):
            raise refuse(f"gives table {table!r} no object of strings")
        unknown = sorted(k for k in options if k.lower() not in _PER_TABLE_NAMES)
        if unknown:
            raise refuse(f"sets {unknown[0]!r} for table {table!r}, which is set for every "
                         "table alike")
        tables.append((table, tuple(sorted((k.lower(), v) for k, v in options.items()))))
    return tuple(tables)


def own_meta_table(options: SourceOptions) -> str | None:
    """The table of the query's meta store when it lives in the instance whose tables the
    query lists (a Tablestore endpoint's default, ``checkpoint.table``, or a ``tablestore://``
    ``meta.store`` naming that instance; a ``dynamodb://`` one in a DynamoDB Streams
    endpoint's region), else None. A pattern may match it
    (``tables=t*`` and ``tablestore_cdc_meta``), but it is never read: its changes are the
    query's own checkpoints, so each batch would make the next one."""
    meta = urlsplit(options.meta_store)
    if meta.scheme == "dynamodb" and options.endpoint.scheme == "dynamodb-streams":
        # a dynamodb://TABLE meta store in the streams' region
        from connector.tunnel.dynamodb_streams.aws import parse_uri

        region = parse_qs(meta.query).get("region", [None])[0]
        same = region is None or region == parse_uri(options.endpoint.uri).region
        return meta.netloc or None if same else None
    instance = getattr(options.endpoint, "instance", None)
    if meta.scheme != "tablestore" or instance is None or meta.netloc != instance:
        return None
    return meta.path.strip("/") or None


def default_max_partitions() -> int:
    """``tables.maxPartitions``' default: two per core of the machine that plans (the
    driver's; in local mode the executors' too)."""
    return 2 * (os.cpu_count() or 1)
