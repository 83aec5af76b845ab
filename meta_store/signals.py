"""Re-snapshot signals: requests that the running apply job repair its target from the source
(``tablestore_cdc.resnapshot``), kept in the meta table.

One document per source identity (the namespace of the query the signal is for), stored with
``MetaStore.swap_document`` under ``resnapshot/<namespace>``: a JSON object
``{"signals": [Signal, ...]}``, oldest first. Every change is a compare-and-set of the whole
document (``SignalBoard.update``), so the command that adds a signal and the job that marks it
running or done never lose each other's write. Done and failed signals beyond ``KEEP_FINISHED``
are dropped, oldest first, so the document stays small (a DynamoDB item holds 400 KB).

Who writes what: ``tablestore-cdc resnapshot`` and the source's ``onDataLoss=resnapshot`` add
pending signals (``add``); the apply job's driver takes the oldest pending (or running, after a
crash) one, moves it to running with its progress, then done with its counts or failed with a
reason (``update``); ``resnapshot --list`` and the feed read them (``signals``).
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meta_store.base import MetaStore
from meta_store.errors import CorruptMetaRecordError, TransientMetaStoreError

#: finished (done or failed) signals kept in the document
KEEP_FINISHED = 20
#: compare-and-set rounds before a busy document is given up on (transient)
_ROUNDS = 20


class SignalState(str, enum.Enum):  # noqa: UP042 - keep str() as is for callers
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Signal(BaseModel):
    """One re-snapshot request and how it went."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    table: str
    #: the first key column's range, ``from`` inclusive, ``to`` exclusive (None: unbounded)
    key_from: int | float | str | None = None
    key_to: int | float | str | None = None
    state: SignalState = SignalState.PENDING
    #: who asked: ``command`` (``tablestore-cdc resnapshot``) or ``data-loss`` (the source)
    origin: str = "command"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    #: the repair's progress, 0 to 100, while running
    percent: float | None = None
    #: done: upserts, deletes, in_flight (differences left to the stream), differences
    counts: dict[str, int] = Field(default_factory=dict)
    #: done: how the in-flight position was found (or why not); failed: why
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.state in (SignalState.DONE, SignalState.FAILED)

    def describe(self) -> str:
        """One line for ``resnapshot --list`` and the log."""
        span = ""
        if self.key_from is not None or self.key_to is not None:
            span = f" [{_shown(self.key_from)}, {_shown(self.key_to)})"
        state = self.state.value
        if self.state is SignalState.RUNNING and self.percent is not None:
            state = f"running {self.percent:.0f} %"
        if self.counts:
            state += " (" + ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) + ")"
        if self.note:
            state += f": {self.note}"
        return f"{self.id}  {self.table}{span}  {self.origin}  {state}"


def _shown(value: Any) -> str:
    return "-" if value is None else repr(value)


class SignalBoard:
    """The signals of one source identity in one meta store (module docstring)."""

    def __init__(self, store: MetaStore, namespace: str) -> None:
        self.store, self.namespace = store, namespace
        self.key = f"resnapshot/{namespace}"

    def _read(self) -> tuple[str | None, list[Signal]]:
        raw = self.store.get_document(self.key)
        if raw is None:
            return None, []
        try:
            signals = [Signal.model_validate(s) for s in _Document.model_validate_json(raw).signals]
        except ValidationError as exc:
            raise CorruptMetaRecordError(store=self.store.uri, key=self.key,
                                         reason=str(exc).splitlines()[0]) from None
        return raw, signals

    def signals(self) -> list[Signal]:
        """Every signal kept, oldest first."""
        return self._read()[1]

    def update(self, change: Callable[[list[Signal]], list[Signal]]) -> list[Signal]:
        """Replace the signals with ``change(signals)``, compare-and-set; returns them."""
        for _ in range(_ROUNDS):
            raw, signals = self._read()
            changed = _trimmed(change(list(signals)))
            new = _Document(signals=[s.model_dump(mode="json") for s in changed])
            if self.store.swap_document(self.key, raw, new.model_dump_json()):
                return changed
        raise TransientMetaStoreError(
            detail=f"{self.store.uri}: the signals of {self.namespace!r} changed {_ROUNDS} "
                   "times in a row")

    def add(self, signal: Signal) -> Signal:
        """Add a pending signal; one for the same table and range already pending is kept
        instead (a source that loses data twice before the repair asks once)."""
        def same(s: Signal) -> bool:
            return s.state is SignalState.PENDING and (s.table, s.key_from, s.key_to) == (
                signal.table, signal.key_from, signal.key_to)

        kept = self.update(lambda signals: signals if any(map(same, signals))
                           else [*signals, signal])
        return next((s for s in kept if same(s)), signal)

    def next_due(self) -> Signal | None:
        """The oldest signal still to run: a running one (its job died during it), else the
        oldest pending one."""
        signals = self.signals()
        return next((s for s in signals if s.state is SignalState.RUNNING),
                    next((s for s in signals if s.state is SignalState.PENDING), None))

    def set(self, signal_id: str, **fields: Any) -> Signal | None:
        """Change one signal's fields (``updated_at`` set to now); None if it is gone."""
        kept = self.update(lambda signals: [
            s.model_copy(update={**fields, "updated_at": time.time()}) if s.id == signal_id
            else s for s in signals])
        return next((s for s in kept if s.id == signal_id), None)


class _Document(BaseModel):
    model_config = ConfigDict(extra="ignore")

    signals: list[dict[str, Any]]


def _trimmed(signals: list[Signal]) -> list[Signal]:
    """``signals`` without the oldest finished ones beyond ``KEEP_FINISHED``."""
    finished = [s.id for s in signals if s.finished]
    dropped = set(finished[:max(0, len(finished) - KEEP_FINISHED)])
    return [s for s in signals if s.id not in dropped]
