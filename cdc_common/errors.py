"""The root of the product's typed errors (botocore's style).

Every error is raised with keyword fields only (``UnknownBatchError(uuid=..., namespace=...)``)
and renders its message from the class's ``template``. Errors raised on executors travel back to
the driver by pickling; ``__reduce__`` rebuilds them from their fields, so they keep their type
and fields on the way.

The subclasses live with the layer that raises them: ``meta_store.errors`` (meta store) and
``connector.errors`` (options, tunnels, protocol). Both re-export ``CdcError``, so callers keep
importing every error from ``connector.errors`` (or ``meta_store.errors`` below the connector).
"""

from __future__ import annotations

from typing import Any, ClassVar


def _rebuild(cls: type[CdcError], fields: dict[str, Any]) -> CdcError:
    return cls(**fields)


class CdcError(Exception):
    """Root of every error this product raises on purpose."""

    template: ClassVar[str] = "{detail}"
    #: True when retrying the same call later may succeed (throttling, a service restart).
    retryable: ClassVar[bool] = False

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)
        try:
            message = self.template.format(**fields)
        except (KeyError, IndexError):  # a field missing from the call: still say something
            message = f"{self.template} {fields}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.fields))

    def __str__(self) -> str:
        # The rendered message as is: KeyError (a base of the Unknown*Error classes) would
        # otherwise quote it like a repr.
        return str(self.args[0]) if self.args else ""
