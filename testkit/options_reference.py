"""The generated parts of docs/options.md: the option table and the error samples.

Both come from the definitions, so they cannot drift from the code: the table from ``OPTIONS``
and the ``SourceOptions`` fields (connector/options.py: name, type, default, what is allowed,
what it means), the error samples from really raising each error and rendering its message.
Each generated part sits in docs/options.md between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->``; everything around them is hand-written and kept as it is.

    python -m testkit.options_reference --write docs/options.md   # rewrite the parts
    python -m testkit.options_reference --check docs/options.md   # exit 1 if they differ

tests/test_options_reference.py fails when the file differs from what this renders. Run by
developers and that test, never by the source: test support, not installed with the product.
"""

from __future__ import annotations

import argparse
import enum
import re
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Iterator, Set
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from connector.errors import CdcError
from connector.options import OPTIONS, SourceOptions

#: the command that rewrites the generated parts (named by the drift test's failure)
WRITE_COMMAND = "python -m testkit.options_reference --write docs/options.md"
#: where a temporary directory stands in the rendered samples (the real one differs per run)
SAMPLE_DIR = "/data"
_TYPE_NAMES = {str: "string", int: "integer", bool: "boolean"}
_MARKERS = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)"
                      r"(<!-- END generated: (?P=name) -->)", re.DOTALL)


def _type_name(annotation: Any) -> str:
    """``int | None`` -> integer; an enum -> enum; str/int/bool by name."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "enum"
    if annotation in _TYPE_NAMES:
        return _TYPE_NAMES[annotation]
    raise ValueError(f"no type name for {annotation!r}: give the option's OptionSpec a type")


def _default_text(value: Any) -> str:
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower-cased, punctuation other than - and _ dropped."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def option_table(headings: Set[str] = frozenset()) -> str:
    """The reference table in Markdown. An option whose name is a heading of the page
    (``### `name```) links to it."""
    rows = ["| option | type | default | allowed values | meaning |",
            "| --- | --- | --- | --- | --- |"]
    fields = SourceOptions.model_fields
    for name, spec in OPTIONS.items():
        field = fields[spec.field]
        shown = f"[`{name}`](#{_anchor(name)})" if name in headings else f"`{name}`"
        kind = spec.type or _type_name(field.annotation)
        default = spec.default or _default_text(field.default)
        cells = [shown, kind, default, spec.allowed, spec.meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _samples(workdir: Path) -> Iterator[Callable[[], Any]]:
    """Calls that each raise one user-facing error, as a reader meets them."""
    from connector.local import LocalTablestore
    from connector.tunnel import open_tunnel_service
    from meta_store import open_meta_store

    local = {"endpoint": "local:///data/store.db", "table.name": "orders",
             "tunnel.name": "orders-to-lake"}

    def load(**options: str) -> Callable[[], Any]:
        return lambda: SourceOptions.from_spark(options)

    yield load(**local, maxoffsetperchannel="5")  # an unknown option, with a did-you-mean
    yield load(**{"table.name": "orders", "tunnel.name": "orders-to-lake"})  # a missing one
    yield load(**local, path="/x")
    yield load(**local, commitInterval="0")
    yield load(**local, maxOffsetsPerChannel="abc")
    yield load(**local, failOnDataLoss="yes")
    yield load(**local, startingPosition="beginning")
    yield load(**{**local, "tunnel.type": "base"})
    yield load(**{**local, "endpoint": "local://data/store.db"})
    yield load(**{**local, "endpoint": "htp://127.0.0.1:38421"})  # a mistyped scheme
    yield load(**{**local, "endpoint": "127.0.0.1:38421"})  # a host and port, no scheme
    yield load(**{**local, "meta.store": "sqlite://[::1]:99999/meta.db"})  # unparseable
    yield load(**{**local, "tunnel.name": "orders\udcff"})  # not text: a lone surrogate
    yield load(**local, catalog="[" * 5_000)  # JSON nested past the recursion limit
    yield load(**{**local, "access.key.id": "LTAI-example"})
    yield load(**{**local, "endpoint": "http://127.0.0.1:8080"})
    yield load(**{**local, "endpoint": "dynamodb-streams://orders?checkpoint_table=cdc"})
    missing = workdir / "missing.db"
    yield lambda: open_tunnel_service(f"local://{missing}")  # at load(): the store must exist
    with LocalTablestore(workdir / "orders.db") as store:
        store.create_table("orders", primary_key=[("id", "INTEGER")])

    def unknown_table() -> None:  # at load(): the table must exist
        with open_tunnel_service(f"local://{workdir}/orders.db") as service:
            service.table_schema("nope")

    yield unknown_table
    yield lambda: open_meta_store("sqlite://relative/meta.db")  # at query start


def error_samples() -> str:
    """Each sample's error as the last line of its traceback shows it."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp).resolve()
        for call in _samples(workdir):
            try:
                call()
            except CdcError as exc:
                kind = type(exc)
                lines.append(f"{kind.__module__}.{kind.__qualname__}: "
                             + str(exc).replace(str(workdir), SAMPLE_DIR))
            else:
                raise AssertionError(f"sample {len(lines) + 1} raised nothing")
    return "```\n" + "\n".join(lines) + "\n```\n"


def render(page: str) -> str:
    """``page`` with every generated part rendered anew; the text around them unchanged."""
    headings = set(re.findall(r"^### `([^`]+)`$", page, re.MULTILINE))
    parts = {"option-table": lambda: option_table(headings), "error-samples": error_samples}

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in parts:
            raise ValueError(f"unknown generated part {name!r}; known: {', '.join(parts)}")
        return match.group(1) + parts[name]() + match.group(4)

    rendered, count = _MARKERS.subn(replace, page)
    if count == 0:
        raise ValueError("no '<!-- BEGIN generated: NAME -->' markers in the page")
    return rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="FILE", type=Path, help="rewrite the parts in FILE")
    action.add_argument("--check", metavar="FILE", type=Path,
                        help="exit 1 if FILE's parts differ from the definitions")
    args = parser.parse_args(argv)
    path: Path = args.write or args.check
    page = path.read_text()
    rendered = render(page)
    if args.write:
        if rendered != page:
            path.write_text(rendered)
        print(f"{path}: {'rewritten' if rendered != page else 'up to date'}")
        return 0
    if rendered != page:
        print(f"{path} differs from the option definitions; run: {WRITE_COMMAND}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
