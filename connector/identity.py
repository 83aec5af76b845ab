"""The source identity: which service, table and tunnel a query reads (driver).

A Spark checkpoint location and a meta-store namespace are bound to the source a query reads.
The binding is the **service's** identity, not the spelling of its URL: a Tablestore instance
has a public and a VPC endpoint, the emulator answers on ``localhost`` and on ``127.0.0.1``, a
DynamoDB Streams endpoint may carry retry parameters; a job moved between spellings keeps its
checkpoint. What names the service is each tunnel backend's ``service_of``:

=====================  =================  ==============================================
endpoint scheme        kind               service
=====================  =================  ==============================================
``http``, ``https``    ``tablestore``     the instance
``local``              ``local``          the store file's absolute path, normalised
``dynamodb-streams``   ``dynamodb-streams`` the region and the checkpoint table
=====================  =================  ==============================================

With ``table.name`` and ``tunnel.name`` (the tunnel's id is recorded in the namespace and
checked on every start: ``connector.planning.namespace``) it forms ``SourceIdentity``, whose
text ``<kind>:<service>#<table>#<tunnel>`` (``%`` and ``#`` inside a part percent-encoded) is
the meta-store namespace of a new query and the ``source`` of every offset it writes:
``tablestore:myinst#orders#t1``, ``local:/data/store.db#orders#t1``,
``dynamodb-streams:eu-west-1/cdc-tunnels#orders#t1``.

Earlier versions used the endpoint's shown form instead, ``<redacted endpoint>#<table>#<tunnel>``
(the *legacy* form; it always holds ``://``, the new one never does). What they wrote keeps
working without a migration: an offset's source in either form is parsed back into an identity
and compared with the query's (``namespace_of_offset``), and the namespace a checkpoint's
batches live in is the source its offsets name, so a query resuming a legacy checkpoint keeps
using the legacy namespace (and keeps writing that source). A new query whose namespace is
still empty while the legacy namespace of its own spelling holds rows continues the legacy one
(``StreamProtocol``), so an upgrade changes no initial offset.

Who calls it: ``SourceOptions`` (``identity``, ``legacy_namespace``) and ``StreamProtocol``
(which namespace an offset from Spark's log belongs to), in the driver's planning process.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from connector.errors import CdcError, CheckpointMismatchError
from connector.tunnel import TUNNEL_BACKENDS

#: endpoint scheme -> the kind of service (the Tablestore backend serves http and https)
KINDS = {"http": "tablestore", "https": "tablestore"}
#: what the service of each kind is called in a message, and the option that names it
_SERVICE_WORDS = {
    "tablestore": ("Tablestore instance", "endpoint / instance.name"),
    "local": ("store file", "endpoint"),
    "dynamodb-streams": ("region and checkpoint table", "endpoint"),
}


def _encode(part: str) -> str:
    return part.replace("%", "%25").replace("#", "%23")


@dataclass(frozen=True)
class SourceIdentity:
    """Which source a query reads: the kind and name of the service, the table, the tunnel."""

    kind: str
    service: str
    table: str
    tunnel: str

    @property
    def namespace(self) -> str:
        """The text form: the meta-store namespace of a new query, the offsets' ``source``."""
        return (f"{self.kind}:{_encode(self.service)}#{_encode(self.table)}"
                f"#{_encode(self.tunnel)}")

    def changes_from(self, earlier: SourceIdentity) -> tuple[str, str] | None:
        """``(what changed, what to do)`` going from ``earlier`` to this identity, in words;
        ``None`` when they are the same source."""
        if earlier == self:
            return None
        changed: list[str] = []
        options: list[str] = []
        if earlier.kind != self.kind:
            changed.append(f"another kind of tunnel service ({earlier.kind}, now {self.kind})")
            options.append("endpoint")
        elif earlier.service != self.service:
            word, option = _SERVICE_WORDS.get(self.kind, ("service", "endpoint"))
            changed.append(f"another {word} ({earlier.service!r}, now {self.service!r})")
            options.append(option)
        if earlier.table != self.table:
            changed.append(f"another table ({earlier.table!r}, now {self.table!r})")
            options.append("table.name")
        if earlier.tunnel != self.tunnel:
            changed.append(f"another tunnel ({earlier.tunnel!r}, now {self.tunnel!r})")
            options.append("tunnel.name")
        remedy = (f"to resume this checkpoint, set {' and '.join(options)} back to what it "
                  "was; to read the new source, use a new checkpoint location (it starts from "
                  "the tunnel's pushed checkpoints)")
        return "; ".join(changed), remedy


def _service(endpoint: str) -> tuple[str, str]:
    """``(kind, service)`` of an endpoint (secrets may be removed already)."""
    scheme = urlsplit(endpoint).scheme
    backend = TUNNEL_BACKENDS.load(endpoint)
    return KINDS.get(scheme, scheme), str(backend.service_of(endpoint))


def identity_of(endpoint: str, table: str, tunnel: str) -> SourceIdentity:
    """The identity of a query reading ``table`` through ``tunnel`` at ``endpoint``."""
    kind, service = _service(endpoint)
    return SourceIdentity(kind, service, table, tunnel)


def legacy_namespace(safe_endpoint: str, table: str, tunnel: str) -> str:
    """The namespace earlier versions gave the same query: its endpoint's shown form (secrets
    removed, ``cdc_common.uris.redact_uri``), table and tunnel. Byte for byte as they wrote it
    (tests/test_uri_pins.py): it finds their rows."""
    return f"{safe_endpoint}#{table}#{tunnel}"


def is_legacy(source: str) -> bool:
    """Is ``source`` (an offset's source, a namespace) of the legacy form?"""
    return "://" in source.partition("#")[0]


def parse_source(source: str, ours: SourceIdentity | None = None) -> SourceIdentity:
    """The identity an offset's ``source`` (or a namespace) names, in either form.
    ``ValueError`` when it is neither. A legacy form's table and tunnel are split at the first
    ``#`` after the endpoint unless they are ``ours`` exactly (names holding ``#``)."""
    if is_legacy(source):
        endpoint, _, rest = source.partition("#")
        try:
            kind, service = _service(endpoint)
        except (CdcError, ValueError) as exc:
            raise ValueError(f"its endpoint cannot be read: {exc}") from None
        if ours is not None and rest == f"{ours.table}#{ours.tunnel}":
            table, tunnel = ours.table, ours.tunnel
        else:
            table, sep, tunnel = rest.partition("#")
            if not sep:
                raise ValueError("it names no table and tunnel")
        return SourceIdentity(kind, service, table, tunnel)
    head, *names = source.split("#")
    kind, sep, service = head.partition(":")
    if not sep or len(names) != 2 or not kind:
        raise ValueError("not <kind>:<service>#<table>#<tunnel>")
    return SourceIdentity(kind, unquote(service), unquote(names[0]), unquote(names[1]))


def namespace_of_offset(found: object, ours: SourceIdentity) -> str:
    """The namespace the batches of an offset from Spark's log live in: the ``source`` it
    names, once that names the same source as the query (either form; any spelling of the
    service). ``CheckpointMismatchError`` saying what changed otherwise."""
    if found == ours.namespace:
        return found
    if not isinstance(found, str):
        raise CheckpointMismatchError(expected=ours.namespace, found=found,
                                      change="the offset's source is not a text",
                                      remedy="use the checkpoint location this query wrote, "
                                      "or a new one")
    try:
        earlier = parse_source(found, ours)
    except ValueError as exc:
        raise CheckpointMismatchError(expected=ours.namespace, found=found,
                                      change=f"its source cannot be read ({exc})",
                                      remedy="use the checkpoint location this query wrote, "
                                      "or a new one") from None
    difference = ours.changes_from(earlier)
    if difference is not None:
        change, remedy = difference
        raise CheckpointMismatchError(expected=ours.namespace, found=found, change=change,
                                      remedy=remedy)
    return found


__all__ = ["SourceIdentity", "identity_of", "is_legacy", "legacy_namespace",
           "namespace_of_offset", "parse_source"]
