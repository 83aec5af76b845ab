"""What a failed query failed with, and whether restarting it can help (driver).

A streaming query that fails hands the driver a ``StreamingQueryException`` whose text holds
the Python traceback of wherever the error was raised: Spark's planning process (the source's
``latestOffset``, ``partitions``, ``commit``), a Python worker on an executor (``read``), or
the driver's ``foreachBatch`` (the apply sink). The product's own error is the last traceback
line of the form ``package.module.SomeError: message``; ``query_failure`` finds it, maps it
back to its class (every ``CdcError`` subclass the process has imported, by its module and
name) and says what the job (``tablestore_cdc.pipeline.job``) does with it:

- ``RETRYABLE``: the class says ``retryable`` (an outage, throttling, a meta store or tunnel
  that does not answer, after the query's own per-call retries gave up), or the endpoint gave
  no answer at a restart of a job that has reached it before (at a job's first start the same
  error means a wrong endpoint); also a Python worker that died (killed by the system): the
  query is restarted from its checkpoint, with nothing lost and nothing doubled.
- ``IN_USE``: another query holds the source's lease (``SourceInUseError``).
- ``CONFIGURATION``: any other product error (a refused option, bad credentials, a missing
  table, a target that refuses a change under its drift policy): restarting would fail the
  same way; the job ends with one line.
- ``FATAL``: what no restart and no option fixes without a look: changes lost to retention
  (``DataLossError``), a replay that did not reproduce a recorded batch, a checkpoint behind
  the meta table, a corrupt meta row, and an error that is not the product's (a bug, Spark's
  own failure): the job ends with one line and the trace in its log file.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from enum import Enum

from connector.errors import (
    CdcError,
    CheckpointBehindMetaError,
    CorruptMetaRecordError,
    DataLossError,
    EndpointUnreachableError,
    ReplayDivergedError,
    SourceInUseError,
)


class FailureKind(Enum):
    RETRYABLE = "retryable"
    IN_USE = "in-use"
    CONFIGURATION = "configuration"
    FATAL = "fatal"


#: product errors that need an operator's look (never retried, not a configuration matter)
_FATAL: tuple[type[CdcError], ...] = (DataLossError, ReplayDivergedError,
                                      CheckpointBehindMetaError, CorruptMetaRecordError)
#: a traceback's last line: ``package.module.Name: message`` (the error a frame raised)
_RAISED = re.compile(r"^(?P<module>[a-z_][\w]*(?:\.[a-z_][\w]*)+)\.(?P<name>[A-Z]\w*)"
                     r"(?::\s?(?P<message>.*))?$", re.MULTILINE)
#: a failed table's reason: ``[batch N: ]ErrorName: message``
_TABLE_REASON = re.compile(r"^(?:batch \d+: )?(?P<name>[A-Z]\w*): (?P<message>.*)$", re.DOTALL)
#: Spark's words for a Python worker that died under it (killed, out of memory)
_WORKER_DIED = ("Python worker exited unexpectedly", "Python worker failed to connect back")


@dataclass(frozen=True)
class QueryFailure:
    """A failed query's error: its kind, the product's class name (``None`` when the error is
    not the product's) and one line saying what happened."""

    kind: FailureKind
    error: str | None
    message: str

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.RETRYABLE

    def line(self) -> str:
        """``SomeError: message`` (or the message alone for an error not the product's)."""
        return f"{self.error}: {self.message}" if self.error else self.message


def query_failure(text: str, *, reached_before: bool) -> QueryFailure:
    """The failure a query's exception text (``str(query.exception())``) describes.
    ``reached_before``: the job has had a query running before (an endpoint that does not
    answer now is an outage, not a wrong endpoint)."""
    found = _last_product_error(text)
    if found is None:
        first = _first_line(text)
        if any(words in text for words in _WORKER_DIED):
            return QueryFailure(FailureKind.RETRYABLE, None, first)
        return QueryFailure(FailureKind.FATAL, None, first)
    cls, message = found
    return QueryFailure(error_kind(cls, reached_before=reached_before), cls.__name__, message)


def table_failure(reason: str) -> QueryFailure:
    """The failure a failed table's reason describes (``connector.table_state``: the source's
    ``ErrorName: message``, the apply's ``batch N: ErrorName: message``), for a job whose every
    table failed (``multi_table.Pipeline.selection_failure``); an error that is not the
    product's is fatal."""
    found = _TABLE_REASON.match(reason)
    cls = None if found is None else _product_class_named(found.group("name"))
    if found is None or cls is None:
        return QueryFailure(FailureKind.FATAL, None, _first_line(reason))
    return QueryFailure(error_kind(cls, reached_before=True), cls.__name__,
                        _first_line(found.group("message")))


def _product_class_named(name: str, root: type[CdcError] = CdcError) -> type[CdcError] | None:
    """The imported ``CdcError`` subclass called ``name`` (the class itself included)."""
    if root.__name__ == name:
        return root
    found = (_product_class_named(name, sub) for sub in root.__subclasses__())
    return next((cls for cls in found if cls is not None), None)


def error_kind(cls: type[CdcError], *, reached_before: bool) -> FailureKind:
    """What the job does with an error of class ``cls`` (see the module docstring); also for
    an error raised in the job's own process (before or between queries)."""
    if cls.retryable or (reached_before and issubclass(cls, EndpointUnreachableError)):
        return FailureKind.RETRYABLE
    if issubclass(cls, SourceInUseError):
        return FailureKind.IN_USE
    if issubclass(cls, _FATAL):
        return FailureKind.FATAL
    return FailureKind.CONFIGURATION


def _last_product_error(text: str) -> tuple[type[CdcError], str] | None:
    """The last product error a traceback in ``text`` raised, with its message's first line."""
    for match in reversed(list(_RAISED.finditer(text))):
        cls = _product_class(match.group("module"), match.group("name"))
        if cls is not None:
            return cls, (match.group("message") or "").strip()
    return None


def _product_class(module: str, name: str) -> type[CdcError] | None:
    """The ``CdcError`` subclass ``module.name``, imported if it is the product's and not yet
    imported here (an error of a backend this process has not loaded)."""
    if module.split(".")[0] not in ("connector", "meta_store", "cdc_common", "tablestore_cdc",
                                    "tablestore_emulator"):
        return None
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, CdcError) else None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:500] if lines else "(no message)"
