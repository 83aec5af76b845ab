"""Backend URIs: which query keys are secrets, how a URI is shown, how its query is validated.

Every backend is opened by a URI (``local:///...``, ``https://...?instance=...``,
``dynamodb-streams://...``, ``sqlite:///...``, ``dynamodb://...``, ``tablestore://...``). The
URIs travel in Spark options, plans and input partitions, and a form of them reaches logs, error
messages, exports and the meta store. What is written once here:

- **One rule for secrets** (``SECRET_KEY``, ``is_secret_key``): a query key that contains
  ``secret``, ``password``, ``passwd``, ``token``, ``credential``, ``key``, ``session``,
  ``signature`` or ``auth`` (any case) names a secret; so does the user info of a URL
  (``scheme://user:password@host``), in the URI itself or in a query value.
- **One redaction** (``redact_uri``): the form of a URI that may be shown or stored. It drops the
  user info (not an Azure URI's container, ``abfss://CONTAINER@ACCOUNT``) and every secret
  query pair, and hides (``***``) a value that is a URL with user info; a backend that knows
  its keys also hides the values of any other key. It is the
  meta-store namespace's endpoint (``connector.options.SourceOptions.source_identity``), so its
  output for the URIs in use must never change: ``tests/test_uri_pins.py`` pins it.
- **Spark's redaction** (``SPARK_SECRET_REGEX`` and the two beside it): the same rule as the
  Java regexes ``connector.spark.local_session`` gives Spark, so its UI, event log and plans
  hide what this module hides (its words narrowed where Spark would hide harmless values).
- **A query validated by a pydantic model** (``UriQuery``, ``parse_query``): each backend
  declares its query keys as the fields of a ``UriQuery`` subclass; ``parse_query`` refuses
  unknown keys (with a did-you-mean), keys given twice or empty, and turns a validation error
  into the backend's own typed error, naming the key, the value (secrets hidden) and what is
  allowed.

Called wherever a URI is parsed or shown: on the driver (options, planning), on executors
(opening clients inside ``read()``) and by the CLI. Nothing here imports a cloud SDK.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection
from typing import Annotated, Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

#: A query key naming a secret (the one rule: options, tunnels and meta stores all use it).
SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|key|session|signature|auth",
                        re.IGNORECASE)
#: What a hidden value is shown as.
MASK = "***"
#: A Tablestore instance name (the ``INSTANCE`` of ``tablestore://INSTANCE/TABLE``, a Tablestore
#: endpoint's ``instance``): a letter, then letters, digits or ``-``.
TABLESTORE_INSTANCE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")


def tablestore_instance(endpoint: str, given: str | None = None) -> str | None:
    """The Tablestore instance an ``http(s)://`` endpoint reaches: ``given`` (the source's
    ``instance.name``), else the endpoint's ``?instance=``, else the first label of a service
    host name (``INSTANCE.REGION.ots.aliyuncs.com``, public or VPC); None when none names it.
    Options, the Tunnel client, the source identity and the CLI all ask here."""
    if given:
        return given
    parts = urlsplit(endpoint)
    named = dict(parse_qsl(parts.query)).get("instance")
    if named:
        return named
    host = parts.hostname or ""
    if host.endswith(".aliyuncs.com") and host.count(".") >= 3:
        return host.split(".", 1)[0]
    return None


def is_secret_key(key: str) -> bool:
    """Does the query key ``key`` name a secret (``SECRET_KEY``)?"""
    return SECRET_KEY.search(key) is not None


def has_user_info(value: str) -> bool:
    """Could ``value`` be a URL carrying user info (``scheme://user:password@host``)? Any ``@``
    after ``://`` counts: a password holding ``/`` or ``?`` would end the host part early for
    ``urlsplit``, and hiding a harmless value costs less than showing a password."""
    return "@" in value.partition("://")[2]


def _hidden(key: str, value: str, known_keys: Collection[str] | None) -> bool:
    return (is_secret_key(key) or has_user_info(value)
            or (known_keys is not None and key not in known_keys))


def shown_value(key: str, value: str, known_keys: Collection[str] | None = None) -> str:
    """A query value as a message may show it: ``***`` when the key is a secret, the value a URL
    with user info, or (when ``known_keys`` is given) the key one the backend does not know."""
    return MASK if _hidden(key, value, known_keys) else value


#: query keys that say how to reach a service, not which service it is: left out of every shown
#: and stored form (the CA bundle's path of an https endpoint, ``cdc_common.tls``; whether a
#: Tablestore client reads ahead, the ``read.prefetch`` option)
TRANSPORT_KEYS = frozenset({"ca_bundle", "prefetch"})
#: object stores whose URIs name the container where user info would be
#: (``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/path``): ``redact_uri`` keeps it
CONTAINER_AT_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})
#: an Azure Blob Storage container's name
AZURE_CONTAINER = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")

#: The one rule as Spark's redaction takes it (Java regexes; ``connector.spark.local_session``
#: sets them, so the Spark UI, its REST API, the event log and ``explain()`` never show a
#: secret). ``spark.redaction.regex`` and ``spark.sql.redaction.options.regex``: a Spark
#: property or a data source option whose key *or value* matches is shown as
#: ``*********(redacted)``: a key naming a secret (Spark's own default,
#: ``secret|password|token|access[.]?key|credential``, is inside it) or a value that is a URL
#: with user info (``has_user_info``); the options' regex keeps Spark's default for them too
#: (``url``). Narrower than ``SECRET_KEY`` where its words also name harmless things: Spark
#: matches values as well as keys, and ``SHOW TBLPROPERTIES`` -- which the Spark engine reads a
#: target's marker with (``tablestore-cdc.key-columns``, a source path) -- is redacted the same
#: way, so ``key``, ``session`` and ``auth`` count only in the forms that name a secret
#: (``access.key``, ``accessKeyId``, ``account.key``, ``private.key``, ``authorization``, a
#: session's ``token``).
SPARK_SECRET_REGEX = (r"(?i)secret|password|passwd|token|credential|signature|authorization"
                      r"|(?:access|account|private|api|encryption)[._-]?key|fs\.azure\.sas"
                      r"|://[^\s/]*@")
SPARK_OPTIONS_REGEX = rf"{SPARK_SECRET_REGEX}|url"
#: ``spark.sql.redaction.string.regex``: the parts of a plan's text that are cut out (a path
#: or URI in a plan is not an option): a URL's user info and a query pair whose key names a
#: secret, e.g. ``s3a://AKIA:pw@bucket`` -> ``s3a*********(redacted)bucket``.
SPARK_STRING_REGEX = (rf"(?i)://[^\s/@]*@|[?&][^=&\s]*(?:{SECRET_KEY.pattern})[^=&\s]*"
                      r"=[^&\s,;)\]]*")


def redact_uri(uri: str, known_keys: Collection[str] | None = None) -> str:
    """``uri`` as it may be shown, logged or stored: ``scheme://host[:port]/path?query``.

    The user info (not an Azure URI's container: ``CONTAINER_AT_SCHEMES``) and the fragment
    are dropped, and so is every query pair whose key is a
    secret (``is_secret_key``) or says how to reach the service rather than which one it is
    (``TRANSPORT_KEYS``: moving a CA bundle must not change a namespace); a value that is a URL
    with user info becomes ``***``, and so does the value of any key outside ``known_keys`` when
    the caller gives them (a backend's message about its own URI). Every other pair is kept
    exactly as written (percent-encoding included), in order. Not ``urlunsplit``: it would turn
    ``local:///abs`` into ``local:/abs``.

    The meta-store namespace is built from this (``SourceOptions.source_identity``): the output
    for a URI in use must stay byte-identical (``tests/test_uri_pins.py``).
    """
    try:
        parts = urlsplit(uri)
    except ValueError:  # e.g. an unclosed IPv6 bracket: show nothing of it
        scheme = uri.partition(":")[0]
        return f"{scheme if scheme.isalnum() else '?'}://<unparseable URI>"
    user_info, _, netloc = parts.netloc.rpartition("@")
    if _is_container(parts.scheme, user_info):  # abfss://CONTAINER@ACCOUNT/...: no secret
        netloc = f"{user_info}@{netloc}"
    shown = []
    for pair in parts.query.split("&"):
        if not pair:
            continue
        raw_key, _, raw_value = pair.partition("=")
        key, value = unquote_plus(raw_key), unquote_plus(raw_value)
        if is_secret_key(key) or key in TRANSPORT_KEYS:
            continue
        if _hidden(key, value, known_keys):
            pair = f"{raw_key}={MASK}"
        shown.append(pair)
    return _head(uri, parts.scheme, netloc, parts.path) + (f"?{'&'.join(shown)}" if shown else "")


def _is_container(scheme: str, user_info: str) -> bool:
    """Is ``user_info`` the container of an Azure URI (``abfss://CONTAINER@ACCOUNT...``, also
    ``delta+abfss://``): a scheme of ``CONTAINER_AT_SCHEMES`` and a container's name (3 to 63
    lower-case letters, digits and ``-``), with no password?"""
    return (scheme.rpartition("+")[2].lower() in CONTAINER_AT_SCHEMES
            and AZURE_CONTAINER.fullmatch(user_info) is not None)


def _head(uri: str, scheme: str, netloc: str, path: str) -> str:
    """``scheme://netloc/path``. The ``//`` is always there before a host, an absolute or an
    empty path, as the namespace has always had it (``local:/abs`` is shown as ``local:///abs``,
    ``dynamodb-streams:?q`` as ``dynamodb-streams://?q``); only a relative path keeps the form
    it was written in (``sqlite:relative.db``, ``meta.db``), which no backend accepts."""
    slashes = uri[len(scheme) + 1 if scheme else 0:].startswith("//")
    if scheme and (slashes or netloc or not path or path.startswith("/")):
        return f"{scheme}://{netloc}{path}"
    if scheme:
        return f"{scheme}:{path}"
    return f"//{netloc}{path}" if slashes else path


# --- query models ---------------------------------------------------------------------------


def _true_or_false(value: Any) -> Any:
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("must be true or false")
    return value


def _http_endpoint(value: str, *, origin_only: bool) -> str:
    if has_user_info(value):
        raise ValueError("must not carry user info: credentials are not accepted in the URI")
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if ok and origin_only:
        ok = parts.path in ("", "/") and not parts.query and not parts.fragment
    if not ok:
        raise ValueError("must be http(s)://host[:port]"
                         + (" with no path or query" if origin_only else ""))
    return value


#: ``true`` or ``false``, any case (nothing else: no ``1``, ``yes``, ``on``)
UriBool = Annotated[bool, BeforeValidator(_true_or_false)]
#: ``http(s)://host[:port][/path]`` without user info (an AWS ``endpoint_url``)
HttpEndpoint = Annotated[str, AfterValidator(lambda v: _http_endpoint(v, origin_only=False))]
#: ``http(s)://host[:port]`` and nothing after it but ``/`` (a Tablestore endpoint)
HttpOrigin = Annotated[str, AfterValidator(lambda v: _http_endpoint(v, origin_only=True))]


class UriQuery(BaseModel):
    """The query of one backend's URI: a field per allowed key, validated by ``parse_query``.

    A field's ``description`` says what is allowed (``Field(8, ge=1, le=50, description="an
    integer from 1 to 50")``); an error names it. A validator of a subclass raises ``ValueError``
    with a phrase that follows the key (``"must be http(s)://host[:port]"``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: where credentials go instead of the URI (ends the error about a secret-looking key)
    credentials_hint: ClassVar[str] = "pass credentials the way the backend's documentation says"


Q = TypeVar("Q", bound=UriQuery)


def parse_query(query: str, model: type[Q], refuse: Callable[[str], Exception]) -> Q:
    """Validate the query string ``query`` of a backend URI into ``model``.

    ``refuse(reason)`` builds the backend's typed error (``MetaStoreUriError`` for a meta store,
    ``OptionError`` naming ``endpoint`` for a tunnel); it is raised for a key the model does not
    have (a secret-looking one is called a credential, any other gets a did-you-mean), a key
    given twice or with an empty value, and the first value the model refuses."""
    fields = model.model_fields
    raw: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in fields:
            if is_secret_key(key):
                raise refuse(f"parameter {key!r} looks like a credential; credentials are not "
                              "accepted in the URI (it is shown in logs and Spark plans); "
                              f"{model.credentials_hint}")
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise refuse(f"unknown parameter {key!r}; {hint}allowed: {', '.join(fields)}")
        if key in raw:
            raise refuse(f"parameter {key!r} given twice")
        if not value:
            raise refuse(f"parameter {key!r} is empty")
        raw[key] = value
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise refuse(_problem(model, exc.errors()[0], raw)) from None


def _problem(model: type[UriQuery], error: Any, raw: dict[str, str]) -> str:
    key = str(error["loc"][0]) if error["loc"] else "?"
    field = model.model_fields.get(key)
    allowed = field.description if field is not None else None
    if error["type"] == "missing":
        return f"parameter {key!r} is required" + (f": {allowed}" if allowed else "")
    if error["type"] == "value_error":  # the model's own check: its phrase follows the key
        problem = str(error["msg"]).removeprefix("Value error, ")
    else:
        problem = f"must be {allowed}" if allowed else str(error["msg"]).lower()
    return f"{key} {problem}, got {shown_value(key, raw.get(key, ''))!r}"
