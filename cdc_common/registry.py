"""Backends chosen by URI scheme, imported lazily (fsspec's ``registry.known_implementations``).

A registry maps a scheme to the dotted path of the backend class (``"module:Class"``) and the
``pip install`` line that brings what the backend needs. Its module is imported only when a URI
of that scheme is opened, so an optional SDK (boto3, tablestore, protobuf) is needed only by the
processes that use it, and ``import connector`` never loads one (tests/test_import_isolation.py).

Two registries use this, each with its own table and its own typed error:
``connector.tunnel.TUNNEL_BACKENDS`` (``OptionError`` naming ``endpoint``) and
``meta_store.META_BACKENDS`` (``MetaStoreUriError``). Called on the driver, on executors and by
the CLI, wherever a URI is opened.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cdc_common.uris import redact_uri

#: the install hint of a backend that needs nothing beyond the base install
INCLUDED = "included"


@dataclass(frozen=True)
class Backend:
    """Where a backend class lives and how to install what it needs."""

    #: ``"package.module:Class"``
    target: str
    #: the ``pip install ...`` line that brings its dependencies, or ``INCLUDED``
    install: str = INCLUDED
    #: the URI form this backend takes, for messages and docs (``local:///abs/path/store.db``)
    form: str = ""
    #: ``"package.module:attribute"``: what the backend knows about its URIs beyond opening
    #: them (a tunnel backend's endpoint rules, ``connector.tunnel.endpoint``); "" for none
    rules: str = ""


#: ``refuse(shown_uri, problem, allowed)`` builds the registry owner's typed error
Refuse = Callable[[str, str, str], Exception]


class BackendRegistry(Mapping[str, Backend]):
    """scheme -> ``Backend``; ``load(uri)`` returns the class for the URI's scheme.

    A read-only mapping, so callers list the schemes (``sorted(registry)``) or look one up."""

    def __init__(self, backends: Mapping[str, Backend], refuse: Refuse) -> None:
        self._backends = dict(backends)
        self._refuse = refuse

    def __getitem__(self, scheme: str) -> Backend:
        return self._backends[scheme]

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def __len__(self) -> int:
        return len(self._backends)

    def forms(self) -> str:
        """Every scheme with its URI form (``local:///abs/path/store.db, http://...``), for
        the ``allowed`` part of an error and for the docs."""
        return ", ".join(backend.form or f"{scheme}://..." for scheme, backend
                         in self._backends.items())

    def load(self, uri: str) -> Any:
        """The backend class for ``uri``'s scheme, its module imported now. An unknown scheme,
        or a backend whose dependencies are not installed, raises the owner's error naming the
        URI (secrets removed) and the schemes or the install line that fix it."""
        backend = self._backend(uri)
        return self._import(uri, backend, backend.target)

    def rules(self, uri: str) -> Any | None:
        """The ``rules`` object of ``uri``'s backend, its module imported now (``None`` when the
        backend names none); refused as ``load`` refuses."""
        backend = self._backend(uri)
        return self._import(uri, backend, backend.rules) if backend.rules else None

    def _backend(self, uri: str) -> Backend:
        try:
            scheme = urlsplit(uri).scheme
        except ValueError:
            scheme = ""
        backend = self._backends.get(scheme)
        if backend is None:
            raise self._refuse(redact_uri(uri), f"unsupported scheme {scheme!r}",
                               ", ".join(f"{s}://..." for s in sorted(self._backends)))
        return backend

    def _import(self, uri: str, backend: Backend, target: str) -> Any:
        module_name, _, name = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # an optional SDK is missing
            raise self._refuse(redact_uri(uri), f"backend unavailable ({exc})",
                               backend.install) from exc
        return getattr(module, name)
