"""The source flags ``replicate`` and ``reconcile`` share: ``--store`` / ``--endpoint`` and
``--option KEY=VALUE``, turned into the reader's ``endpoint`` option and extra options (CLI
process). A bad combination ends the command with one ``error:`` line (exit 2). And
``flags_named``: an apply-sink option error of ``replicate`` (one table or ``--tables``) names
the flag the user gave."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tablestore_cdc.commands.errors import fail


def source_endpoint(store: Path | None, endpoint: str | None) -> str:
    """The reader's endpoint: ``--endpoint`` as given, or ``local://`` of ``--store``."""
    if (store is None) == (endpoint is None):
        fail("give exactly one of --store or --endpoint")
    if store is not None:
        if not store.exists():
            fail(f"store {store} does not exist")
        return f"local://{store.resolve()}"
    assert endpoint is not None
    return endpoint


#: the reader's options the commands set from flags of their own: one place for each, so no
#: part of a command reads the selection one way and another part the other way
_FLAG_OPTIONS = {"endpoint": "--store or --endpoint", "table.name": "--table",
                 "tables": "--tables or --table", "exclude": "--exclude",
                 "tunnel.name": "--tunnel"}


def reader_options(option: list[str] | None) -> dict[str, str]:
    """``--option KEY=VALUE`` flags as the reader's extra options; a key the command has a
    flag for (``_FLAG_OPTIONS``, any case: Spark's options are case-insensitive) is refused."""
    extra = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--option {item!r}: expected KEY=VALUE")
        if key.strip().lower() in _FLAG_OPTIONS:
            fail(f"--option {key}=...: give it as {_FLAG_OPTIONS[key.strip().lower()]}")
        extra[key] = value
    return extra


#: the apply sink's arguments -> the flags of ``replicate`` that set them
_FLAGS = {"schema_drift": "--schema-drift", "soft_delete_column": "--soft-delete-column",
          "scd": "--scd", "adopt_target": "--adopt-target", "target": "--target"}


@contextmanager
def flags_named() -> Iterator[None]:
    """An option error of the apply sink names the flag the user gave, not the sink's Python
    argument (``schema_drift`` -> ``--schema-drift``)."""
    from tablestore_cdc.lakehouse.errors import ApplyOptionError

    try:
        yield
    except ApplyOptionError as exc:
        option = exc.fields.get("option")
        if option not in _FLAGS:
            raise
        raise type(exc)(**{**exc.fields, "option": _FLAGS[option]}) from exc
