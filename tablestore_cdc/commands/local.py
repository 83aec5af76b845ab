"""``tablestore-cdc local ...``: create, write to and inspect an embedded local store.

Mounted by ``tablestore_cdc/commands/app.py``. STORE is a filesystem path to the SQLite file; only
``create-table`` creates it. Bad input ends with a one-line ``error: ...`` on stderr and exit
code 2 (no traceback): every ``CdcError`` is reported that way. A file that is not a local
store (another SQLite database such as a meta store, or not a database at all) is refused
before anything opens it, so no command ever writes into someone else's file; the read-only
commands (``tables``, ``channels``, ``tunnels``) never write at all.

Examples::

    tablestore-cdc local create-table /tmp/s.db orders --pk id:INTEGER --col name:STRING
    tablestore-cdc local write /tmp/s.db orders --count 10000 --seed 7 --rate 500
    tablestore-cdc local split /tmp/s.db orders ch-0001
    tablestore-cdc local channels /tmp/s.db orders --json
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from connector.tunnel.base import ChannelStatus, TableSchema
from connector.tunnel.local.rows import WriteOp
from connector.tunnel.local.schema import TABLES as STORE_TABLES
from connector.tunnel.local.store import LocalTablestore
from connector.tunnel.local.values import COLUMN_TYPES
from tablestore_cdc.commands.errors import fail, reported_errors

app = typer.Typer(
    help="The embedded local table store: tables, sample writes, channels, tunnels.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

StoreArg = Annotated[Path, typer.Argument(help="Path of the store's SQLite file.")]
TableArg = Annotated[str, typer.Argument(help="Table name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

SQLITE_HEADER = b"SQLite format 3\x00"

#: Writes at or above this count show a progress bar (on a terminal).
PROGRESS_THRESHOLD = 2000


def _sqlite_tables(path: Path) -> set[str] | None:
    """The table names of the SQLite file at ``path``, read without writing a byte (a
    read-only connection); ``None`` when it is not an SQLite database."""
    with open(path, "rb") as f:
        if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            return None
    # immutable=1 creates no -wal/-shm files; a schema still only in the WAL needs mode=ro
    wal = Path(f"{path}-wal")
    modes = ["immutable=1"] + (["mode=ro"] if wal.exists() and wal.stat().st_size else [])
    tables: set[str] = set()
    for mode in modes:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError:
            return None
        finally:
            conn.close()
        if tables:
            break
    return tables


def check_store_file(store: Path) -> None:
    """Refuse (one line, exit 2) an existing non-empty file that is not a local store. Also
    the ``emulator`` command's check of ``--store`` (tablestore_cdc/commands/emulator.py)."""
    try:
        tables = _sqlite_tables(store)
    except OSError as exc:
        fail(f"cannot read {store}: {exc.strerror or exc}")
    if tables is None:
        fail(f"{store} is not a local store: not an SQLite database")
    if tables and not tables & STORE_TABLES:
        shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
        fail(f"{store} is not a local store: an SQLite database of something else "
             f"(tables {shown}); pass the store file, not the meta store or another database")


def _open(store: Path) -> LocalTablestore:
    """Open an existing store; a missing file or a file that is not a store is refused."""
    if not store.is_file() or store.stat().st_size == 0:
        fail(
            f"no local store at {store}; create it with "
            f"`tablestore-cdc local create-table {store} TABLE --pk id:INTEGER`"
        )
    check_store_file(store)
    return LocalTablestore(store, create=False)


def _parse_specs(option: str, specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, typ = spec.partition(":")
        if not sep or not name or typ.upper() not in COLUMN_TYPES:
            fail(
                f"{option} {spec!r}: expected NAME:TYPE with TYPE one of {', '.join(COLUMN_TYPES)}"
            )
        out.append((name, typ.upper()))
    return out


def _parse_value(option: str, text: str, typ: str | None) -> Any:
    """A command-line value for a column of type ``typ`` (``None``: undeclared, inferred)."""
    if typ is None:
        for conv in (int, float):
            try:
                return conv(text)
            except ValueError:
                pass
        return {"true": True, "false": False}.get(text.lower(), text)
    try:
        if typ == "INTEGER":
            return int(text)
        if typ == "DOUBLE":
            return float(text)
        if typ == "BOOLEAN":
            return {"true": True, "false": False}[text.lower()]
        if typ == "BINARY":
            return (
                base64.b64decode(text[4:], validate=True)
                if text.startswith("b64:")
                else text.encode("utf-8")
            )
        return text
    except (ValueError, KeyError):
        fail(f"{option}: {text!r} is not a valid {typ}")


def _parse_assignments(option: str, items: list[str], types: dict[str, str]) -> dict[str, Any]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            fail(f"{option} {item!r}: expected NAME=VALUE")
        out[name] = _parse_value(f"{option} {name}", text, types.get(name))
    return out


@app.command("create-table")
def create_table(
    store: StoreArg,
    table: TableArg,
    pk: Annotated[list[str], typer.Option("--pk", help="Key column NAME:TYPE (repeat).")],
    col: Annotated[
        list[str] | None, typer.Option("--col", help="Column NAME:TYPE (repeat).")
    ] = None,
    channels: Annotated[int, typer.Option(help="Number of channels (key ranges).")] = 4,
) -> None:
    """Create TABLE in STORE (the file is created if missing)."""
    keys, cols = _parse_specs("--pk", pk), _parse_specs("--col", col or [])
    if store.is_file() and store.stat().st_size > 0:
        check_store_file(store)
    with reported_errors():
        store.parent.mkdir(parents=True, exist_ok=True)
        with LocalTablestore(store) as s:
            s.create_table(table, keys, cols, channels=channels)
    typer.echo(f"created table {table} in {store} with {channels} channel(s)")


def _key_values(schema: TableSchema, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, c in enumerate(schema.primary_key):
        v = i if n == 0 else i % 7  # extra key columns vary too, still unique per i
        out[c.name] = {"INTEGER": v, "STRING": f"key-{v:05d}", "BINARY": f"key-{v}".encode()}[
            c.type
        ]
    return out


def _random_value(rng: random.Random, typ: str) -> Any:
    if typ == "INTEGER":
        return rng.randint(0, 1_000_000)
    if typ == "DOUBLE":
        return round(rng.uniform(0, 1000), 3)
    if typ == "BOOLEAN":
        return rng.random() < 0.5
    if typ == "BINARY":
        return rng.randbytes(8)
    return rng.choice(["alpha", "bravo", "charlie", "delta", "echo"]) + f"-{rng.randint(0, 999)}"


def random_ops(schema: TableSchema, count: int, seed: int, keys: int) -> Iterator[WriteOp]:
    """``count`` random writes over ``keys`` keys: ~50% puts, 35% updates, 15% deletes.

    Deterministic for a seed. Tables without declared attribute columns get a ``value`` column.
    """
    rng = random.Random(seed)
    cols = [(c.name, c.type) for c in schema.columns] or [("value", "INTEGER")]
    for _ in range(count):
        pk = _key_values(schema, rng.randrange(keys))
        roll = rng.random()
        if roll < 0.5:
            yield "put", pk, {n: _random_value(rng, t) for n, t in cols}
        elif roll < 0.85:
            chosen = rng.sample(cols, rng.randint(1, len(cols)))
            yield "update", pk, {n: _random_value(rng, t) for n, t in chosen}
        else:
            yield "delete", pk, None


@app.command()
def write(
    store: StoreArg,
    table: TableArg,
    count: Annotated[int, typer.Option(help="How many changes to write.", min=1)] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same writes).")] = 0,
    rate: Annotated[float | None, typer.Option(help="Changes per second (default: max).")] = None,
    keys: Annotated[int, typer.Option(help="How many distinct keys to write to.", min=1)] = 200,
) -> None:
    """Write random sample inserts, updates and deletes to TABLE, one transaction each."""
    if rate is not None and rate <= 0:
        fail(f"--rate must be positive, got {rate}")
    s = _open(store)
    counts = {"put": 0, "update": 0, "delete": 0}
    err = Console(stderr=True)
    show = count >= PROGRESS_THRESHOLD and err.is_terminal
    with (
        reported_errors(),
        s,
        Progress(
            TextColumn("writing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            disable=not show,
            transient=True,
        ) as progress,
    ):
        task = progress.add_task("write", total=count)
        schema = s.table_schema(table)
        start = time.monotonic()
        for n, (kind, pk, cols) in enumerate(random_ops(schema, count, seed, keys), start=1):
            s.batch_write(table, [(kind, pk, cols)])
            counts[kind] += 1
            progress.advance(task)
            if rate is not None:
                ahead = start + n / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        elapsed = time.monotonic() - start
    typer.echo(
        f"wrote {count} changes to {table} ({counts['put']} put, {counts['update']} update, "
        f"{counts['delete']} delete) in {elapsed:.2f} s: {count / max(elapsed, 1e-9):.0f} "
        "changes/s"
    )


@app.command()
def put(
    store: StoreArg,
    table: TableArg,
    pk: Annotated[list[str], typer.Option("--pk", help="Key column NAME=VALUE (repeat).")],
    col: Annotated[
        list[str] | None, typer.Option("--col", help="Column NAME=VALUE (repeat).")
    ] = None,
) -> None:
    """Put one row (BINARY values: text, or b64:BASE64)."""
    with reported_errors(), _open(store) as s:
        schema = s.table_schema(table)
        types = {c.name: c.type for c in (*schema.primary_key, *schema.columns)}
        key = _parse_assignments("--pk", pk, types)
        s.put_row(table, key, _parse_assignments("--col", col or [], types))
    typer.echo(f"put {key} into {table}")


@app.command()
def split(store: StoreArg, table: TableArg, channel: str) -> None:
    """Split an open CHANNEL of TABLE into two children."""
    with reported_errors(), _open(store) as s:
        a, b = s.split_channel(table, channel)
    typer.echo(f"split {channel} into {a} and {b}")


@app.command()
def merge(store: StoreArg, table: TableArg, a: str, b: str) -> None:
    """Merge two adjacent open channels A and B of TABLE into one child."""
    with reported_errors(), _open(store) as s:
        child = s.merge_channels(table, a, b)
    typer.echo(f"merged {a} and {b} into {child}")


@app.command()
def trim(
    store: StoreArg,
    table: TableArg,
    keep_last: Annotated[int | None, typer.Option(help="Keep the newest N per channel.")] = None,
    older_than: Annotated[
        float | None, typer.Option(help="Trim changes older than S seconds.")
    ] = None,
) -> None:
    """Trim TABLE's change history (as a service's retention would)."""
    with reported_errors(), _open(store) as s:
        n = s.trim_history(table, keep_last=keep_last, older_than_s=older_than)
    typer.echo(f"trimmed {n} change(s) from {table}")


@app.command()
def tables(store: StoreArg, as_json: JsonOpt = False) -> None:
    """List the tables of STORE."""
    with reported_errors(), _open(store) as s:
        rows = [
            {"table": t, "channels": len(s.list_channels(t)), "rows": s.count_rows(t)}
            for t in s.list_tables()
        ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    out = Table("table", "channels", "rows", title=str(store))
    for r in rows:
        out.add_row(str(r["table"]), str(r["channels"]), str(r["rows"]))
    Console().print(out)


@app.command()
def channels(store: StoreArg, table: TableArg, as_json: JsonOpt = False) -> None:
    """List TABLE's channels (closed ones too) with lineage, key range and head sequence."""
    with reported_errors(), _open(store) as s:
        rows = s.list_channels(table)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    out = Table(
        "channel",
        "parents",
        "key range (hex)",
        "state",
        "head seq",
        "trimmed to",
        title=f"{table} channels",
    )
    for r in rows:
        out.add_row(
            r.channel_id,
            ", ".join(r.parent_ids) or "-",
            f"{r.range_lo:08x}-{r.range_hi:08x}",
            "closed" if r.closed else "open",
            str(r.head_seq),
            str(r.trimmed_upto),
        )
    Console(width=max(100, Console().width)).print(out)


@app.command()
def tunnels(
    store: StoreArg,
    table: Annotated[str | None, typer.Argument(help="Only this table's tunnels.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List tunnels with their channels' status (per tunnel)."""
    from connector.tunnel.local import LocalTunnelService

    with reported_errors(), LocalTunnelService(_open(store)) as svc:
        found: list[dict[str, Any]] = []
        for info in svc.list_tunnels(table):
            desc = svc.describe_tunnel(info.table_name, info.tunnel_name)
            found.append(
                {
                    "tunnel_name": info.tunnel_name,
                    "tunnel_id": info.tunnel_id,
                    "table": info.table_name,
                    "tunnel_type": info.tunnel_type.value,
                    "start_position": info.start_position.value,
                    "created_at": info.created_at,
                    "channels": [
                        {
                            "channel_id": c.channel_id,
                            "status": c.status.value,
                            "channel_type": c.channel_type.value,
                            "parent_ids": list(c.parent_ids),
                        }
                        for c in desc.channels
                    ],
                }
            )
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    out = Table("tunnel", "table", "type", "start", "created", "channels", "id", title="tunnels")
    for t in found:
        statuses = [c["status"] for c in t["channels"]]
        summary = " ".join(
            f"{s.value}:{statuses.count(s.value)}" for s in ChannelStatus if s.value in statuses
        )
        created = dt.datetime.fromtimestamp(t["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
        out.add_row(
            t["tunnel_name"],
            t["table"],
            t["tunnel_type"],
            t["start_position"],
            created,
            summary,
            t["tunnel_id"],
        )
    Console(width=max(120, Console().width)).print(out)


if __name__ == "__main__":  # pragma: no cover
    app(sys.argv[1:])
