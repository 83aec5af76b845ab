"""https to Tablestore: which CA bundle verifies the server, and what a TLS failure means.

Both Tablestore clients of the product use it: the Tunnel wire client
(``connector.tunnel.tablestore.transport``) and the Tablestore meta store
(``meta_store.tablestore``, through the official SDK). They verify the server's certificate
and host name always; the CA bundle that does it is, first found:

1. the one given explicitly: the source option ``ssl.ca.bundle``, which reaches both clients
   as the ``ca_bundle`` parameter of their URIs (a file path, never a secret);
2. ``REQUESTS_CA_BUNDLE`` (the requests library's variable), then ``SSL_CERT_FILE``
   (OpenSSL's), from the environment of the process opening the client;
3. none: the client's default trust store (the Tunnel client: the system's; the SDK: certifi).

A certificate the bundle does not trust, a certificate for another host name, a server that
does not speak TLS on the port: each is a configuration error, reported at once in one line
naming the endpoint and what to fix (``tls_problem``), never retried as if the service were
down.
"""

from __future__ import annotations

import os
import ssl

#: environment variables naming a CA bundle, in the order they are consulted
CA_BUNDLE_ENV = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
#: how a user supplies the bundle, for messages
CA_BUNDLE_HINT = "the ssl.ca.bundle option (or REQUESTS_CA_BUNDLE)"

# OpenSSL's verify codes for "the certificate names another host / IP address"
_HOST_MISMATCH = {62, 64}


def ca_bundle(explicit: str | None = None) -> str | None:
    """The CA bundle path to verify with: ``explicit``, else the environment's, else None."""
    return ca_bundle_origin(explicit)[0]


def ca_bundle_origin(explicit: str | None = None) -> tuple[str | None, str]:
    """``(path, where it came from)``: ``explicit`` ("given"), else the first environment
    variable of ``CA_BUNDLE_ENV`` set (its name), else ``(None, "none")``."""
    if explicit:
        return explicit, "given"
    for name in CA_BUNDLE_ENV:
        value = os.environ.get(name)
        if value:
            return value, name
    return None, "none"


def ca_bundle_problem(path: str) -> str | None:
    """Why ``path`` cannot serve as a CA bundle (``None`` when it can): it must be a readable
    file of PEM certificates."""
    if not os.path.isfile(path):
        return f"no file at {path}"
    try:
        context = ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        return f"{path} is not a PEM CA bundle ({exc})"
    if not context.get_ca_certs():
        return f"{path} holds no CA certificate"
    return None


def _ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind an exception (urllib3 wraps it once or twice)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        reason = getattr(exc, "reason", None)
        exc = reason if isinstance(reason, BaseException) else (exc.__cause__
                                                                 or exc.__context__)
        seen += 1
    return None


def tls_problem(exc: BaseException, endpoint: str) -> str | None:
    """One line saying what is wrong with ``endpoint``'s TLS and what to fix, when ``exc`` is a
    TLS failure; ``None`` when it is not one (a network error, to be retried)."""
    err = _ssl_error(exc)
    if err is None:
        return None
    if isinstance(err, ssl.SSLCertVerificationError):
        detail = err.verify_message or err.reason or str(err)
        if err.verify_code in _HOST_MISMATCH:
            return (f"{endpoint}: the server's certificate is not valid for this host name "
                    f"({detail}); use a host name the certificate names in the endpoint, or "
                    "have a certificate issued for this one")
        return (f"{endpoint}: the server's certificate is not trusted ({detail}); set "
                f"{CA_BUNDLE_HINT} to the CA bundle that signed it")
    reason = err.reason or str(err)
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE",
                  "PACKET_LENGTH_TOO_LONG"):
        return (f"{endpoint}: the server does not speak TLS on this port ({reason}); use "
                "http:// for a plain-HTTP endpoint, or the server's https port")
    return (f"{endpoint}: the TLS handshake failed ({reason}); check that the server offers "
            "TLS 1.2 or later and that the endpoint is its https address")


__all__ = ["CA_BUNDLE_ENV", "CA_BUNDLE_HINT", "ca_bundle", "ca_bundle_origin",
           "ca_bundle_problem", "tls_problem"]
