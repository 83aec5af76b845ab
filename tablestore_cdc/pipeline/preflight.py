"""What ``replicate`` checks before its first batch (CLI process, driver, before Spark starts).

``check_before_start`` is called by ``tablestore-cdc replicate`` (``commands/replicate.py``,
``--table`` and ``--tables`` alike): each refusal is a typed error the CLI prints as one
``error:`` line, and nothing has been written anywhere (no output directory, no tunnel, no
meta store). In order:

1. the output directory is not another running job's (its lock, read only:
   ``job_lock.JobAlreadyRunningError``, exit 4; an output in object storage has no lock:
   step 7 stands for it), nor, for ``--tables``, an earlier version's
   single-table output (``upgrade.SingleTableOutputError``: ``--table`` upgrades it);
2. the target's URI (a scheme it knows, an absolute path, an Iceberg ``?table=``) and its
   ``{table}`` (one literal target for ``--table``);
3. the reader's options (``MultiTableOptions``);
4. the endpoint, once, under the first-contact rule (``cdc_common.first_contact``): a wrong
   host, port or scheme is a configuration error here, not an outage retried for ever; the
   table exists, or the selection matches a table now (``NoTablesError``; ``allow_empty``:
   a warning);
5. the tunnel type (``--initial``, ``initial_tunnel_type``): the snapshot-then-stream tunnel
   for a new tunnel, an existing tunnel's own type kept;
6. an output directory moved or copied from another one names no target under the old one
   (``relocation.MovedTargetError``: it did not move with it);
7. no live job of another output holds a table's lease in the meta store
   (``connector.planning.lease``): ``SourceHeldError``, exit 4, naming its host, pid and since;
   for an output in object storage, no live job of the same output either (its checkpoint
   would make the second job look like the first's restart to the lease);
8. each table's target, read only (``ApplySink.check_target``: another job's table, a foreign
   table without ``--adopt-target``).

A Python package an extra brings that is not installed ends in ``MissingExtraError`` naming
the extra, whichever step imported it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cdc_common.errors import CdcError
from cdc_common.first_contact import query_start
from cdc_common.uris import redact_uri
from connector.errors import OptionError, UnknownTunnelError
from tablestore_cdc.lease_holder import holder_alive
from tablestore_cdc.pipeline.output import JobOutput
from tablestore_cdc.pipeline.queries import ApplySettings, checkpoint_query_id, open_table_sink
from tablestore_cdc.pipeline.upgrade import SingleTableOutputError, single_table_layout

#: ``--initial``: what a new job delivers first
INITIAL_SNAPSHOT, INITIAL_NONE = "snapshot", "none"
INITIAL_CHOICES = (INITIAL_SNAPSHOT, INITIAL_NONE)
_TUNNEL_TYPE_OF = {INITIAL_SNAPSHOT: "BaseAndStream", INITIAL_NONE: "Stream"}
NONE_WARNING = "--initial none: only the changes the tunnel still retains are delivered"
SNAPSHOT_LINE = ("--initial snapshot: a new tunnel delivers every row of the table first, then "
                 "the changes after it")
#: a module an extra brings -> the extra (pyproject's optional dependencies)
EXTRA_OF = {"pyiceberg": "lakehouse", "cachetools": "lakehouse", "sqlalchemy": "lakehouse",
            "tablestore": "tablestore", "google": "tablestore", "urllib3": "tablestore",
            "httptools": "tablestore", "boto3": "dynamodb", "botocore": "dynamodb"}


class NoTablesError(CdcError):
    """``--tables`` matches no table of the endpoint now."""

    template = ("--tables {tables!r}{excluded} matches no table at {endpoint} now ({count} "
                "table(s) there): check the pattern, or give --allow-empty to start anyway and "
                "pick the tables up when they are created")


class SourceHeldError(CdcError):
    """A live job with another output directory holds a table's lease (exit 4)."""

    exit_code = 4
    template = ("table {table!r} is already replicated through tunnel {tunnel!r} by another "
                "job (host {host}, pid {pid}, since {since}{where}): it was left alone; stop "
                "it first, or give this job another --tunnel")


class MissingExtraError(CdcError, ImportError):
    """A package of an extra is not installed."""

    template = ("{what} needs the Python package {module!r}, which is not installed: "
                "pip install 'tablestore-cdc[{extra}]'")


@dataclass(frozen=True)
class JobPlan:
    """What ``replicate`` was asked (flags, resolved by the CLI)."""

    endpoint: str
    output: JobOutput
    tunnel: str
    #: the reader's options (``--option`` and those the flags set)
    options: dict[str, str]
    #: a table's apply settings, its target still a template with ``{table}``
    apply_of: Callable[[str], ApplySettings]
    #: the selection (``--tables``, or the one table of ``--table``)
    tables: str
    exclude: str | None = None
    #: ``--table``: the one table must exist now (``UnknownTableError``)
    one_table: bool = False
    initial: str = INITIAL_SNAPSHOT
    #: was ``--initial`` given on the command line (else its default)?
    initial_given: bool = False
    allow_empty: bool = False


@dataclass
class Checked:
    """What ``check_before_start`` found: the tables captured now, the reader's options with
    ``tunnel.type`` decided, and the lines to say at start (warnings, the tunnel type)."""

    tables: list[str]
    options: dict[str, str]
    lines: list[str] = field(default_factory=list)


def check_before_start(plan: JobPlan) -> Checked:
    """Every check of the module docstring, in its order (CLI process, before the output
    lock and Spark); raises the first refusal, having written nothing."""
    with named_extras():
        if plan.output.local is not None:
            _output_not_running(plan.output.local)
            if not plan.one_table and single_table_layout(plan.output.local):
                raise SingleTableOutputError(output=str(plan.output))
        template = plan.apply_of("{table}")
        check_target_uri(template.target, dict(template.target_options))
        # the apply flags (ApplyOptionError), as the job opens the sink
        open_table_sink(template, "{table}", redact_uri(plan.endpoint))
        from tablestore_cdc.pipeline.multi_table import check_target_template

        check_target_template(template.target, plan.tables)
        source = _source_options(plan)
        with query_start(), _tunnel_service(source) as tunnel:
            names, lines = _tables(plan, source, tunnel)
            tunnel_type, more = initial_tunnel_type(plan, _tunnel_types(tunnel, names,
                                                                        plan.tunnel))
        lines += more
        _moved_targets(plan, template.target, names)
        options = {**{k: v for k, v in plan.options.items() if k.lower() != "tunnel.type"},
                   "tunnel.type": tunnel_type}
        _leases_free(plan, names, options)
        for name in names:
            _target_free(plan, name)
    return Checked(names, options, lines)


def initial_tunnel_type(plan: JobPlan, existing: dict[str, str]) -> tuple[str, list[str]]:
    """The ``tunnel.type`` the job's source gets, and the lines that say why. ``existing``:
    table -> the type of its tunnel of this name, where it exists already.

    ``--option tunnel.type`` wins (a ``--initial`` given too that says otherwise is refused);
    a ``startingPosition`` or ``startingTimestamp`` option without ``--initial`` means the
    stream (they say where it starts); DynamoDB Streams has no base data (the stream, said;
    ``--initial snapshot`` given is refused). An existing tunnel keeps its type: its
    checkpoints are the job's (a job created before ``--initial`` existed goes on with its
    ``Stream`` tunnel); tunnels of both types are refused, as the source would."""
    given = {key.lower(): value for key, value in plan.options.items()}
    asked = _TUNNEL_TYPE_OF[plan.initial]
    lines: list[str] = []
    if "tunnel.type" in given:
        chosen = given["tunnel.type"]
        if plan.initial_given and chosen.strip().lower() != asked.lower():
            raise OptionError(option="--initial", value=plan.initial,
                              problem=f"conflicts with --option tunnel.type={chosen}",
                              allowed="one of them, or both saying the same")
    elif not plan.initial_given and ({"startingposition", "startingtimestamp"} & set(given)):
        chosen = "Stream"  # the options say where the stream starts
    elif urlsplit(plan.endpoint).scheme == "dynamodb-streams":
        if plan.initial_given and plan.initial == INITIAL_SNAPSHOT:
            raise OptionError(option="--initial", value=plan.initial,
                              problem="DynamoDB Streams has no base data to snapshot",
                              allowed="none")
        chosen = "Stream"
    else:
        chosen = asked
    kinds = sorted(set(existing.values()))
    if len(kinds) > 1:
        held = ", ".join(f"{t} ({k})" for t, k in sorted(existing.items()))
        raise OptionError(option="tunnel.type", value=chosen,
                          problem=f"tunnels named {plan.tunnel!r} exist with both types: "
                          f"{held}", allowed="--option tunnel.type=TYPE for the tables of "
                          "that type, or another --tunnel")
    if kinds and kinds[0].lower() != chosen.strip().lower():
        if "tunnel.type" in given:
            raise OptionError(option="tunnel.type", value=chosen,
                              problem=f"tunnel {plan.tunnel!r} already exists with type "
                              f"{kinds[0]}", allowed=f"{kinds[0]}, or another --tunnel")
        lines.append(f"tunnel {plan.tunnel!r} exists as {kinds[0]}: kept, with its "
                     f"checkpoints (--initial {plan.initial} applies to a new tunnel)")
        chosen = kinds[0]
    if chosen.strip().lower() == "stream":
        lines.append(NONE_WARNING)
    elif not kinds:
        lines.append(SNAPSHOT_LINE)
    return chosen, lines


def check_target_uri(target: str, target_options: dict[str, str] | None = None) -> None:
    """Refuse a target URI ``open_apply_sink`` would refuse (``TargetUriError``), with its
    ``target_options``, and a scheme it does not know before its path is looked at
    (``detla://`` is a typo, not a relative path); opens nothing. ``{table}`` stands for a
    table name."""
    from tablestore_cdc.lakehouse import open_apply_sink
    from tablestore_cdc.lakehouse.errors import TargetUriError

    uri = target.replace("{table}", "table")
    try:
        open_apply_sink(uri, target_options=target_options)
    except TargetUriError as exc:  # shown as given, {table} and all
        raise TargetUriError(**{**exc.fields, "uri": redact_uri(target)}) from None


@contextmanager
def named_extras() -> Iterator[None]:
    """A package of an extra missing inside: ``MissingExtraError`` naming the extra, not
    Python's "No module named ..." (a module no extra brings is raised as it is)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        extra = EXTRA_OF.get(module)
        if extra is None:
            raise
        what = {"lakehouse": "the Iceberg target", "tablestore": "a Tablestore endpoint",
                "dynamodb": "DynamoDB"}[extra]
        raise MissingExtraError(what=what, module=module, extra=extra) from None


def _output_not_running(output: Path) -> None:
    """``JobAlreadyRunningError`` if a live job holds ``output``'s lock (read only: the lock
    is taken, and the directory created, after every check)."""
    import fcntl

    from tablestore_cdc.pipeline.job_lock import LOCK_NAME, JobAlreadyRunningError, lock_holder

    path = output / LOCK_NAME
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobAlreadyRunningError(output=str(output), **lock_holder(handle.read())
                                         ) from None


def _source_options(plan: JobPlan) -> Any:
    """The reader's options validated (``OptionError``): the selection's
    ``MultiTableOptions``, as the job's query parses them (``multi_table.selection_options``)."""
    from tablestore_cdc.pipeline.multi_table import selection_options

    return selection_options(plan.endpoint, plan.tables, plan.exclude, plan.tunnel,
                             plan.options)


def _tunnel_service(source: Any) -> Any:
    """The tunnel service of the selection's endpoint (a context manager)."""
    from connector.tunnel import open_tunnel_service

    return open_tunnel_service(source.common_options().endpoint)


def _tables(plan: JobPlan, source: Any, tunnel: Any) -> tuple[list[str], list[str]]:
    """The tables the job captures now (the endpoint's first answer), and a warning line."""
    if plan.one_table:
        tunnel.table_schema(plan.tables)  # UnknownTableError
        return [plan.tables], []
    present = [n for n in tunnel.list_tables() if n != source.meta_table]
    names = source.selection.select(present)
    if names:
        return list(names), []
    error = NoTablesError(tables=plan.tables, endpoint=redact_uri(plan.endpoint),
                          excluded=f" (except {plan.exclude})" if plan.exclude else "",
                          count=len(present))
    if not plan.allow_empty:
        raise error
    return [], [f"warning: {error}".split(": check the pattern")[0]
                + ": started anyway (--allow-empty); tables are picked up when created"]


def _tunnel_types(tunnel: Any, tables: list[str], name: str) -> dict[str, str]:
    """table -> the type of its tunnel ``name``, for the tables where it exists."""
    types = {}
    for table in tables:
        with suppress(UnknownTunnelError):
            types[table] = tunnel.describe_tunnel(table, name).tunnel.tunnel_type.value
    return types


def _leases_free(plan: JobPlan, tables: list[str], options: dict[str, str]) -> None:
    """``SourceHeldError`` for the first table whose lease a live job of another output holds
    (read only: a meta store that does not exist yet holds none). A holder that no longer
    runs on this host is left to the source (it takes over its own earlier process's lease,
    or waits for the expiry)."""
    from meta_store import open_meta_store
    from meta_store.errors import MetaTableMissingError
    from tablestore_cdc.table_status import load_table_status

    if not tables:
        return
    source = _source_options(dataclasses.replace(plan, options=options))
    first = source.for_table(tables[0])
    try:
        with query_start(), open_meta_store(first.meta_store, first.meta_store_credentials,
                                            create=False) as meta:
            for table in tables:
                identity = source.for_table(table).source_identity
                lease = meta.get_lease(identity)
                if (lease is None or not lease.live(time.time())
                        or holder_alive(lease.owner) is False):  # dead on this host
                    continue
                status = load_table_status(meta, identity)
                job = status.job if status is not None else None
                if job == str(plan.output) and not plan.output.remote:
                    continue  # this job's earlier run: its lock is free, the source decides
                raise _held(plan, table, lease, job)
    except MetaTableMissingError:
        return


def _moved_targets(plan: JobPlan, template: str, tables: list[str]) -> None:
    """An output moved or copied from another directory (``relocation.moved_from``): no
    target may still lie under the old one (``relocation.MovedTargetError``)."""
    from tablestore_cdc.pipeline.relocation import check_targets, moved_from

    if plan.output.local is None:
        return  # a prefix in object storage is not relocated
    old = moved_from(plan.output.local)
    if old is not None:
        check_targets(plan.output.local, old,
                      [template, *(plan.apply_of(t).target for t in tables)])


def _held(plan: JobPlan, table: str, lease: Any, job: str | None) -> SourceHeldError:
    """The refusal naming the holder: the other job's own lock (host, pid, since) when its
    output directory is readable here, else the lease's owner (its planning process) and the
    lease's last renewal."""
    from tablestore_cdc.pipeline.job_lock import LOCK_NAME, lock_holder

    host, _, rest = lease.owner.partition("/")
    renewed = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(lease.renewed_at))
    holder = {"host": host, "pid": rest.partition("/")[0],
              "since": f"at least {renewed}, its lease's last renewal"}
    if job is not None and "://" not in job:  # a local output: its lock file says more
        with suppress(OSError):
            holder = lock_holder((Path(job) / LOCK_NAME).read_text(encoding="utf-8"))
    return SourceHeldError(table=table, tunnel=plan.tunnel, where=f", output {job}" if job
                           else "", **holder)


def _target_free(plan: JobPlan, table: str) -> None:
    """``table``'s target, read only: another job's table or a foreign one is refused."""
    open_table_sink(plan.apply_of(table), table, redact_uri(plan.endpoint)).check_target(
        checkpoint_query_id(plan.output))


__all__ = ["INITIAL_CHOICES", "NONE_WARNING", "SNAPSHOT_LINE", "Checked", "JobPlan",
           "MissingExtraError", "NoTablesError", "SourceHeldError", "check_before_start",
           "check_target_uri", "initial_tunnel_type", "named_extras"]
