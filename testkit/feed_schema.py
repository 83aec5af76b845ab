"""The feed's published JSON schema (docs/progress-feed.schema.json) as the tests check it:
``feed_validator("snapshot")`` validates one ``$defs`` object, strictly (every object that lists
properties refuses others: the feed may only carry documented fields, while the published
schema stays open for consumers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "docs" / "progress-feed.schema.json"


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists properties."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def load_feed_schema() -> dict[str, Any]:
    """The published schema, itself checked against JSON Schema 2020-12."""
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def feed_validator(schema: dict[str, Any], definition: str | None = None
                   ) -> jsonschema.Draft202012Validator:
    """A strict validator of ``schema``'s ``$defs/definition`` (None: a batch record)."""
    tight = strict(schema)
    registry = Registry().with_resource(tight["$id"], Resource.from_contents(tight))
    ref = tight["$id"] + (f"#/$defs/{definition}" if definition else "")
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=registry)
